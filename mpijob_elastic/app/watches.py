"""What the controller watches: the label selectors of its caches, and the caches by kind
and namespace (docs/design.md, "What the caches hold")."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.observe import HANDOVER_KINDS
from mpijob_elastic.core.objects import podgroups
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import RESOURCES, ApiError, Kube

log = logging.getLogger("mpijob_elastic.app.watches")

# Children are all labelled with the job's name; watching only those keeps the caches to
# the objects this controller can own, not every pod in the cluster.
CHILD_SELECTOR = f"{names.LABEL_GROUP}={names.GROUP},{names.LABEL_JOB}"
CHILD_KINDS = ("Pod", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget")
# Children that training-operator 1.9 made carry its labels, not the v1 ones, until their
# hand-over (handover.py) merges ours in. A label selector cannot say "either set", so a
# second cache per kind watches training-operator's, without the v1 job label: disjoint
# from the main caches, so nothing is held twice, and a child moves from one to the
# other when it is relabelled. Training-operator labels the launcher's ServiceAccount,
# Role, RoleBinding and the ConfigMap only `app=<job>`, which many unrelated objects carry,
# so these caches keep metadata alone: a claim is a patch and needs no more.
HANDOVER_SELECTORS = {
    kind: (
        f"{names.LABEL_TO_OPERATOR}={names.TO_OPERATOR},!{names.LABEL_JOB}"
        if kind == "Pod"
        else f"{names.LABEL_APP},!{names.LABEL_JOB}"
    )
    for kind in HANDOVER_KINDS
}
# The gang scheduler's PodGroups are watched whole, not by our labels: training-operator
# 1.9's carry none, and a job it ran keeps its PodGroup when this controller takes over
# (docs/handover.md), which the job's ownerReference, not a label, ties to it. There is one
# per gang-scheduled job, so the cache stays small.
POD_GROUP_SELECTOR = None
# Where an orphan names the job it may belong to.
JOB_LABELS = (names.LABEL_JOB, names.LABEL_TO_JOB, names.LABEL_APP)
# Cached kinds without a namespace, which a namespace field selector does not apply to.
CLUSTER_SCOPED = frozenset({"Node", "ResourceFlavor", "WorkloadPriorityClass"})


class Caches:
    """One informer per kind and watched namespace (``None``: all namespaces)."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str | None, Informer]] = {}

    def add(self, kind: str, namespace: str | None, informer: Informer) -> None:
        self.by_kind.setdefault(kind, {})[namespace] = informer

    def all(self) -> list[Informer]:
        return [i for group in self.by_kind.values() for i in group.values()]

    def skip(self, namespaces: Sequence[str]) -> None:
        """The caches of every namespace list and watch nothing in ``namespaces``: what the
        controller is to leave alone never reaches a reconcile (before they start)."""
        if not namespaces:
            return
        fields = ",".join(f"metadata.namespace!={ns}" for ns in namespaces)
        for kind, group in self.by_kind.items():
            if kind not in CLUSTER_SCOPED and None in group:
                group[None].narrow(fields)

    def pick(self, kind: str, namespace: str) -> Informer | None:
        group = self.by_kind.get(kind, {})
        return group.get(None) or group.get(namespace)


def resources(settings: Settings) -> Mapping[str, tuple[str, str]]:
    """RESOURCES, and the PodGroup of the gang scheduler the settings name."""
    gang = podgroups.gang(settings)
    if gang is None:
        return RESOURCES
    return {**RESOURCES, podgroups.KIND: (f"/apis/{gang.api_version}", "podgroups")}


async def pod_groups_served(kube: Kube, settings: Settings) -> bool:
    """Whether the gang scheduler's PodGroup is served. Without its CRD the PodGroups are
    not watched (a watch of it would never sync and hold every job up): each job's
    PodGroup create is refused instead, and that reaches the job as ``WriteRefused``
    with its Event, and no pod is made (write_order.py)."""
    gang = podgroups.gang(settings)
    if gang is None:
        return False
    try:
        found = await kube.discover(f"/apis/{gang.api_version}")
    except ApiError as err:
        if not err.not_found:
            raise
        found = {}
    if any(r.get("name") == "podgroups" for r in found.get("resources") or []):
        return True
    log.error(
        "the gang scheduler's PodGroup is not served: install its CRD and restart the "
        "controller; until then every job's PodGroup create is refused and no pod is made",
        extra={"apiVersion": gang.api_version, "gang_scheduler": settings.gang_scheduler_name},
    )
    return False
