"""Taking over the children another v1 controller made.

Training-operator 1.9 labels a job's children its own way (names.py) and not with the
v1 labels our caches select, so a job it started is invisible to the main caches; a
metadata-only cache per kind finds such objects (app/controller.py). Before anything else of
a job is planned:

each child the job controls (its controller ownerReference carries the job's UID) that
lacks any of our labels gets them merged in (a training-operator child, or one of ours
whose labels someone removed); others' labels are left as they are.

Nothing is adopted. An object the job does not control is never touched, whatever its
name and labels: its name stays taken (docs/design.md). That includes an orphan named
and labelled as one of the job's children: anyone who may create pods or ConfigMaps in
the namespace can make one, and adopted, a pod would enter the host list and the
launcher's exec grant, a ConfigMap would be read for the job's state (docs/handover.md).
Until the claims are written the rest of the plan waits: with part of its children
unseen, a job would, say, rewrite ``discover_hosts.sh`` without workers Horovod is using.
Pods are never restarted: a claim only patches metadata.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Claim, Emit, Phase, Writes
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.workers import worker_index

# Claims one turn may make; the job comes straight back for the rest.
CLAIMS_PER_TURN = 100
_LAUNCHER_OBJECTS = ("ServiceAccount", "Role", "RoleBinding")


def our_labels(job: str, kind: str, name: str) -> dict[str, str] | None:
    """The labels we give the job's child ``kind``/``name``; None: no child of ours is
    named so (a PodDisruptionBudget is not taken over: no other controller makes one)."""
    if kind == "Pod":
        if name == names.launcher_name(job):
            return names.pod_labels(job, names.ROLE_LAUNCHER)
        index = worker_index(job, name)
        return None if index is None else names.pod_labels(job, names.ROLE_WORKER, index)
    if kind in _LAUNCHER_OBJECTS and name == names.launcher_name(job):
        return names.object_labels(job, names.ROLE_LAUNCHER)
    if kind == "ConfigMap" and name == names.config_map_name(job):
        return names.object_labels(job, None)
    return None


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return ref  # type: ignore[no-any-return]
    return None


def _candidates(observed: Observed) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for obj in observed.strays:
        yield str(obj.get("kind", "")), obj
    # Kept by their own objects' plans otherwise (write_order.py); pods have none.
    for pod in observed.pods:
        yield "Pod", pod


def claims(observed: Observed) -> tuple[list[Claim], list[Emit]]:
    """The claims one job makes now, and the Events that announce them."""
    job = observed.job
    meta = job["metadata"]
    if meta.get("deletionTimestamp"):
        return [], []  # the garbage collector is taking the children away
    job_name, job_uid = str(meta["name"]), str(meta["uid"])
    found: list[Claim] = []
    taken_over: list[str] = []
    for kind, obj in _candidates(observed):
        child = obj["metadata"]
        wanted = our_labels(job_name, kind, str(child["name"]))
        if wanted is None or child.get("deletionTimestamp"):
            continue
        labels = child.get("labels") or {}
        controller = controller_of(child)
        if (
            controller is None
            or controller.get("uid") != job_uid
            or all(labels.get(k) == v for k, v in wanted.items())
        ):
            continue
        if names.LABEL_JOB not in labels:
            taken_over.append(f"{kind} {child['name']}")
        found.append(
            Claim(
                kind,
                str(child["name"]),
                str(child.get("uid", "")),
                str(child.get("resourceVersion", "")),
                wanted,
            )
        )
    found = found[:CLAIMS_PER_TURN]
    claimed = {f"{c.kind} {c.name}" for c in found}
    events: list[Emit] = []
    if taken_over := [t for t in taken_over if t in claimed]:
        events.append(
            Emit(
                "Normal",
                "TakenOver",
                f"took over {', '.join(taken_over)}, which lacked the v1 labels (made by "
                "another controller, such as training-operator): labelled as ours, nothing "
                "restarted",
            )
        )
    return found, events


def claim_writes(observed: Observed) -> Writes | None:
    """The turn's writes if the job has anything to claim; None: plan it as usual."""
    found, events = claims(observed)
    if not found:
        return None
    # Right back: the claimed children are in the main caches now (the writes' results).
    # The claims patch distinct objects, so they go out together.
    phases = (Phase("claims", tuple(found)), Phase("events", tuple(events)))
    return Writes(tuple(p for p in phases if p.writes), requeue_after=0.0)
