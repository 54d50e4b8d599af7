"""Start-up checks: the controller holds every permission it uses, and the installed
``mpijobs.kubeflow.org`` is the v1 CRD.

Without them a missing verb shows only when a job first needs it, and a cluster whose
MPIJob CRD is MPI Operator v2's would leave the job cache failing to list, forever, with
nothing but 404s in the log. Each problem found is logged as an error saying what to do and
keeps ``/readyz`` failing; the controller still runs, doing what it may (a job that then
needs a missing verb gets a condition quoting the 403), and looks again every
``RECHECK_SECONDS``, so a fixed role or CRD makes it ready without a restart.

Neither check needs a grant of its own: every authenticated user may create
SelfSubjectAccessReviews (``system:basic-user``) and read API discovery
(``system:discovery``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from mpijob_elastic.core import names
from mpijob_elastic.machinery.kube import ApiError, Kube

RECHECK_SECONDS = 30.0
REVIEWS_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
V2 = "v2beta1"
# Reviews in flight at once: about what one namespace needs.
REVIEW_BATCH = 40


@dataclass(frozen=True)
class Permission:
    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    # Cluster-scoped (nodes): checked once, not per namespace.
    cluster_scoped: bool = False
    # One object only (the leader election's Lease).
    name: str = ""

    def describe(self, namespace: str) -> str:
        resource = self.resource + (f"/{self.subresource}" if self.subresource else "")
        if self.group:
            resource += f".{self.group}"
        where = (
            ""
            if self.cluster_scoped
            else f" in namespace {namespace}"
            if namespace
            else " in all namespaces"
        )
        return f"{self.verb} {resource}{f' {self.name}' if self.name else ''}{where}"


def _each(group: str, resources: Sequence[str], verbs: Sequence[str]) -> list[Permission]:
    return [Permission(v, r, group) for r in resources for v in verbs]


RBAC: Final = "rbac.authorization.k8s.io"
# Every verb the shipped ClusterRoles grant, each for the reason docs/rbac.md gives;
# tests/integration/test_rbac_proof.py removes each in turn.
REQUIRED: Final[tuple[Permission, ...]] = (
    *_each(names.GROUP, ["mpijobs"], ["list", "watch", "delete"]),
    Permission("patch", "mpijobs", names.GROUP, "status"),
    Permission("update", "mpijobs", names.GROUP, "finalizers"),
    *_each("", ["pods"], ["get", "list", "watch", "create", "delete", "patch"]),
    Permission("get", "pods", "", "exec"),
    Permission("create", "pods", "", "exec"),
    *_each("", ["configmaps"], ["get", "list", "watch", "create", "update", "patch"]),
    *_each("", ["serviceaccounts"], ["list", "watch", "create", "update", "patch"]),
    *_each(RBAC, ["roles", "rolebindings"], ["list", "watch", "create", "update", "patch"]),
    *_each("policy", ["poddisruptionbudgets"], ["list", "watch", "create", "update", "delete"]),
    Permission("create", "events"),
    Permission("list", "nodes", cluster_scoped=True),
    Permission("watch", "nodes", cluster_scoped=True),
)


# Reading the scheduler's Preempted Events, to name a preempted worker's preemptor
# (app/preemptions.py): granted by the shipped ClusterRole, but not required: without them
# the controller runs as before and its Events say so, so they are asked for apart, by
# the cache they serve, and do not make the controller unready.
SCHEDULER_EVENTS: Final[tuple[Permission, ...]] = (
    Permission("list", "events"),
    Permission("watch", "events"),
)


def review(permission: Permission, namespace: str) -> dict[str, Any]:
    """The SelfSubjectAccessReview asking whether we may do this ("" namespace: in all)."""
    attributes = {
        "verb": permission.verb,
        "group": permission.group,
        "resource": permission.resource,
        "subresource": permission.subresource,
    }
    if not permission.cluster_scoped and namespace:
        attributes["namespace"] = namespace
    if permission.name:
        attributes["name"] = permission.name
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


def lease_permissions(name: str) -> list[Permission]:
    """What leader election does with its Lease (config/rbac/leader_election.yaml): create
    it once, then read and renew that one."""
    group = "coordination.k8s.io"
    return [
        Permission("create", "leases", group),
        Permission("get", "leases", group, name=name),
        Permission("update", "leases", group, name=name),
    ]


# What serving /metrics behind the API server's authentication takes
# (config/rbac/metrics_auth.yaml, app/metrics_guard.py): ask who a scraper's token is, and
# whether they may get /metrics. Both are cluster-scoped.
METRICS_AUTH: Final[tuple[Permission, ...]] = (
    Permission("create", "tokenreviews", "authentication.k8s.io", cluster_scoped=True),
    Permission("create", "subjectaccessreviews", "authorization.k8s.io", cluster_scoped=True),
)


def pod_group_permissions(group: str) -> list[Permission]:
    """What a gang scheduler's PodGroups take (``group``: its API group, docs/rbac.md)."""
    return _each(group, ["podgroups"], ["list", "watch", "create", "update", "delete"])


def checks(
    namespaces: Sequence[str],
    lease: tuple[str, str] | None = None,
    metrics: bool = False,
    pod_groups: str | None = None,
) -> list[tuple[Permission, str]]:
    """Each permission in each namespace served ("": all of them), cluster-scoped once, with
    leader election the Lease's (``lease``: its namespace and name), with ``metrics``
    served the reviews that guard them, and under a gang scheduler its PodGroups'
    (``pod_groups``: their API group)."""
    scopes = list(namespaces) or [""]
    required = [*REQUIRED, *(pod_group_permissions(pod_groups) if pod_groups else [])]
    wanted = [(p, "") for p in required if p.cluster_scoped] + [
        (p, ns) for ns in scopes for p in required if not p.cluster_scoped
    ]
    if lease is not None:
        wanted += [(p, lease[0]) for p in lease_permissions(lease[1])]
    if metrics:
        wanted += [(p, "") for p in METRICS_AUTH]
    return wanted


def missing_message(missing: Sequence[str]) -> str:
    return (
        f"missing {len(missing)} permission(s): {'; '.join(missing)}. Apply config/rbac "
        "(or the RoleBindings of config/namespaced for every namespace in --namespaces); "
        "docs/rbac.md says what each is for"
    )


def crd_problem(group: dict[str, Any] | None, v1_resources: Sequence[str]) -> str | None:
    """What is wrong with the served ``kubeflow.org`` API for this controller, if anything.

    ``group`` is the discovery document of ``/apis/kubeflow.org`` (None: not served);
    ``v1_resources`` the resources ``kubeflow.org/v1`` serves. Discovery does not show the
    storage version, but only MPI Operator v2's CRD serves ``v2beta1`` at all.
    """
    crd = f"{names.PLURAL}.{names.GROUP}"
    if group is None:
        return (
            f"the {names.GROUP} API is not served: install the MPIJob CRD "
            "(config/crd, or training-operator's)"
        )
    versions = [v.get("version") for v in group.get("versions") or []]
    if V2 in versions:
        return (
            f"{crd} serves {V2}: that is MPI Operator v2's CRD, and MPI Operator v2 manages "
            "MPIJobs itself. This controller needs the kubeflow.org/v1 CRD (config/crd, or "
            "training-operator's): run it in a cluster without MPI Operator v2, or remove MPI "
            "Operator v2 and install the v1 CRD (docs/rbac.md, 'Beside other operators')"
        )
    if "v1" not in versions or names.PLURAL not in v1_resources:
        return (
            f"{crd} is not served at kubeflow.org/v1 (versions served: "
            f"{', '.join(str(v) for v in versions) or 'none'}): install the v1 CRD (config/crd)"
        )
    return None


class Preflight:
    """Runs the checks; ``problems`` is what they found last."""

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str],
        lease: tuple[str, str] | None = None,
        metrics: bool = False,
        pod_groups: str | None = None,
    ) -> None:
        self.kube = kube
        self.namespaces = tuple(namespaces)
        self.lease = lease
        self.metrics = metrics
        self.pod_groups = pod_groups
        self.problems: list[str] = ["start-up checks have not run yet"]

    async def run(self) -> list[str]:
        try:
            found = await self._missing_permissions()
            crd = await self._crd()
        except Exception as err:  # the next round tries again
            self.problems = [f"start-up checks failed: {err}"]
            return self.problems
        self.problems = [missing_message(found)] if found else []
        if crd is not None:
            self.problems.append(crd)
        return self.problems

    async def _missing_permissions(self) -> list[str]:
        wanted = checks(self.namespaces, self.lease, self.metrics, self.pod_groups)
        answers: list[dict[str, Any]] = []
        # A batch at a time: many namespaces make hundreds of reviews, and all at once they
        # would queue for the write connections longer than a write may wait for one.
        for start in range(0, len(wanted), REVIEW_BATCH):
            answers += await asyncio.gather(
                *(
                    self.kube.request("POST", REVIEWS_PATH, review(p, ns))
                    for p, ns in wanted[start : start + REVIEW_BATCH]
                )
            )
        return [
            p.describe(ns)
            for (p, ns), answer in zip(wanted, answers, strict=True)
            if not (answer.get("status") or {}).get("allowed")
        ]

    async def _crd(self) -> str | None:
        try:
            group = await self.kube.request("GET", f"/apis/{names.GROUP}")
        except ApiError as err:
            if err.not_found:
                return crd_problem(None, [])
            raise
        try:
            v1 = await self.kube.request("GET", f"/apis/{names.GROUP}/v1")
        except ApiError as err:
            if not err.not_found:
                raise
            v1 = {}
        return crd_problem(group, [str(r.get("name")) for r in v1.get("resources") or []])
