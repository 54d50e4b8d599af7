"""What a job's children are made of, beside its pods (render_pods.py): the launcher's
ServiceAccount, Role and RoleBinding, the ConfigMap, the PodGroup under a gang scheduler,
and the launcher once desired.py decided it is due.

A child name held by an object the job does not control is never granted, written or
waited on: such a ServiceAccount is used as it is, and a launcher whose names someone else
holds is not made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import podgroups, render, render_pods
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.spec.model import JobSpec

Obj = dict[str, Any]


def new_launcher(
    turn: Turn, spec: JobSpec, objects: Mapping[str, Obj], config_hash: str, needed: int
) -> Obj | None:
    """The launcher to create, unless a name it needs is held by someone else."""
    taken = turn.observed.conflicts
    if any((kind, obj["metadata"]["name"]) in taken for kind, obj in objects.items()):
        return None
    if ("Pod", names.launcher_name(spec.name)) in taken:
        return None
    gang = podgroups.gang(turn.settings)
    return render_pods.launcher_pod(spec, turn.settings, config_hash, needed, gang)


def pod_group(turn: Turn, spec: JobSpec, gang: podgroups.Gang) -> Obj:
    """The job's PodGroup; an existing one keeps its annotations (copied from the job
    on create only) and its Volcano queue, as training-operator's sync keeps them."""
    current = turn.observed.pod_group
    meta = turn.job["metadata"]
    labels = meta.get("labels") or {}
    if current is None:
        return podgroups.pod_group(spec, gang, meta.get("annotations") or {}, labels=labels)
    queue = (current.get("spec") or {}).get("queue") if gang.volcano else None
    return podgroups.pod_group(spec, gang, {}, queue if isinstance(queue, str) else None, labels)


def objects(
    turn: Turn,
    spec: JobSpec,
    role_names: Sequence[str],
    data: Mapping[str, str],
    state: Mapping[str, str],
) -> dict[str, Obj]:
    return {
        **service_account(turn, spec),
        # The reports' grant on the job's ranks ConfigMap (ranks.py), never on a name
        # someone else holds: its create comes first (write_order.py), and a refused one
        # stops the turn before this Role is written.
        "Role": render.role(
            spec,
            role_names,
            ranks=("ConfigMap", names.ranks_name(spec.name)) not in turn.observed.conflicts,
        ),
        "RoleBinding": render.role_binding(spec),
        "ConfigMap": render.config_map(spec, data, state),
    }


def service_account(turn: Turn, spec: JobSpec) -> dict[str, Obj]:
    """The launcher's ServiceAccount to create and keep, unless one of that name that the
    job does not control exists: that one is used as it is, never written."""
    observed = turn.observed
    if observed.service_account is None and (
        ("ServiceAccount", spec.service_account) in observed.in_use
    ):
        return {}
    return {"ServiceAccount": render.service_account(spec)}
