"""The ordered writes that move the observed children to the desired ones.

The order is the safety argument, stated once, here. The shell executes the writes in
this order and stops at the first one refused, so every write may rely on the ones above
it having landed:

1. The ServiceAccount, and the PodDisruptionBudget before any worker it protects exists
   (or the budget's delete, once the job is suspended, finished or no longer elastic).
2. The ConfigMap: victims leave the host lists before anything happens to them; a worker
   is listed only once the Role we wrote grants exec on it (``desired.py``).
3. The launcher's config-hash annotation: its kubelet refreshes the mounted files now.
4. Drain marks cleared on workers the job keeps; then marks on victims whose drain starts
   (after the host-list write, so a mark never predates the list that dropped them),
   and deletes of victims whose drain is over.
5. Deletes of retired and failed workers to replace (or of a finished job's pods), then
   creates of missing workers. The ConfigMap above carries the retired indexes, so a
   restart between these writes cannot hand a retired name out again.
6. The Role: exec on the job's workers, new ones only once their creates went through,
   so a name that someone else's pod holds (a create answered 409) is never granted. A
   new worker cannot be listed before this write: it is not running yet, and step 2
   lists only granted workers. Then the RoleBinding: a controller without the ``bind``
   verb (ours) may bind only a Role that exists, whose rules it holds itself; the API
   server answers 404 for a RoleBinding to a Role not there yet.
7. The launcher, after its workers exist and are granted.
8. The status, then Events.

Only drift is written: a settled job yields no writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    Action,
    AnnotatePod,
    Create,
    DeleteObject,
    DeletePod,
    Emit,
    Observed,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.desired import Desired
from mpijob_elastic.core.reports import REFUSAL_EVENTS
from mpijob_elastic.core.status import REFUSED, StatusBuilder
from mpijob_elastic.core.times import format_precise_time

Obj = dict[str, Any]

# The keys of each kind that are ours to keep in step; anything else on the object
# (another controller's labels, the server's fields) is left alone.
_OWNED_KEYS = {
    "ServiceAccount": (),
    "Role": ("rules",),
    "RoleBinding": ("subjects", "roleRef"),
    "ConfigMap": ("data",),
    "PodDisruptionBudget": ("spec",),
}


# Annotations that are ours to set and to remove; any other is left as it is.
_OWNED_ANNOTATIONS = (
    names.ANN_RETIRED_WORKERS,
    names.ANN_SCALE_OUT_BACKOFF,
    names.ANN_BELOW_MIN_SINCE,
    names.ANN_SUSPENDED,
    names.ANN_LAUNCHER_RESTARTS,
    names.ANN_WORKER_FAILURES,
)


def _ensure(desired: Obj, observed: Mapping[str, Any] | None, keys: Sequence[str]) -> Action | None:
    """Create the object, or replace it if any of ``keys``, our labels or our annotations
    drifted."""
    if observed is None:
        return Create(desired)
    meta = observed["metadata"]
    # Our labels and annotations are merged in; others' are left as they are.
    others = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _OWNED_ANNOTATIONS
    }
    merged = {
        "labels": {**(meta.get("labels") or {}), **desired["metadata"]["labels"]},
        "annotations": {**others, **(desired["metadata"].get("annotations") or {})},
    }
    drifted = any(observed.get(k) != desired.get(k) for k in keys) or any(
        (meta.get(field) or {}) != value for field, value in merged.items()
    )
    if not drifted:
        return None
    updated = {**observed, **{k: desired[k] for k in keys}}
    updated["metadata"] = {**meta, **merged}
    return Replace(updated)


def _observed_object(observed: Observed, kind: str) -> Mapping[str, Any] | None:
    return {
        "ServiceAccount": observed.service_account,
        "Role": observed.role,
        "RoleBinding": observed.role_binding,
        "ConfigMap": observed.config_map,
        "PodDisruptionBudget": observed.disruption_budget,
    }[kind]


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _holder_labels(want: Desired, observed: Observed) -> dict[str, dict[str, str | None]]:
    """The rank-holder label to set or remove, per worker whose label is not as wanted
    (the PodDisruptionBudget counts only labelled workers). Terminating pods are left
    alone: the budget does not count them anyway."""
    if not want.objects:
        return {}  # frozen or finished: nothing of the job's children changes
    changes: dict[str, dict[str, str | None]] = {}
    going = {w.uid for w in want.deletes} | {
        v.worker.uid for v in want.victims if v.action == "delete"
    }
    for pod in observed.pods:
        meta = pod["metadata"]
        name = meta["name"]
        if (
            meta.get("deletionTimestamp")
            or meta.get("uid") in observed.deleting
            or meta.get("uid") in going
            or (meta.get("labels") or {}).get(names.LABEL_ROLE) != names.ROLE_WORKER
        ):
            continue
        has = (meta.get("labels") or {}).get(names.LABEL_HOLDS_RANKS) == "true"
        if has != (name in want.rank_holders):
            changes[name] = {names.LABEL_HOLDS_RANKS: "true" if not has else None}
    return changes


def _obsolete(want: Desired, observed: Observed) -> list[Action]:
    """Deletes of the children the job must no longer have."""
    writes: list[Action] = []
    for kind in want.obsolete:
        gone = _observed_object(observed, kind)
        if gone is not None and not gone["metadata"].get("deletionTimestamp"):
            meta = gone["metadata"]
            writes.append(DeleteObject(kind, meta["name"], str(meta.get("uid", ""))))
    return writes


def _refresh_launcher(want: Desired, observed: Observed) -> list[Action]:
    """The launcher's config-hash annotation, when its host lists changed: the annotation
    change makes its mounted files refresh in well under a second (ranks.py)."""
    job_name = str(observed.job["metadata"]["name"])
    launcher = next(
        (
            p
            for p in observed.pods
            if p["metadata"]["name"] == names.launcher_name(job_name)
            and not p["metadata"].get("deletionTimestamp")
        ),
        None,
    )
    if launcher is None or want.config_hash is None:
        return []
    current = (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)
    if current == want.config_hash:
        return []
    return [
        AnnotatePod(
            launcher["metadata"]["name"],
            {names.ANN_CONFIG_HASH: want.config_hash},
            _resource_version(launcher),
        )
    ]


def _pod_marks(want: Desired, observed: Observed, now: datetime) -> list[Action]:
    """The workers' drain marks to set or clear, and their rank-holder labels (in the
    same patch where a worker gets both)."""
    labels = _holder_labels(want, observed)
    writes: list[Action] = []
    for w in want.workers:
        if w.marked and not w.terminating:
            writes.append(
                AnnotatePod(
                    w.name,
                    {names.ANN_DRAINING_SINCE: None},
                    _resource_version(w.pod),
                    labels.pop(w.name, {}),
                )
            )
    mark = format_precise_time(now)
    for v in want.victims:
        if v.action == "mark":
            writes.append(
                AnnotatePod(
                    v.worker.name,
                    {names.ANN_DRAINING_SINCE: mark},
                    _resource_version(v.worker.pod),
                    labels.pop(v.worker.name, {}),
                )
            )
    pods = {p["metadata"]["name"]: p for p in observed.pods}
    return writes + [
        AnnotatePod(name, {}, _resource_version(pods[name]), change)
        for name, change in sorted(labels.items())
    ]


def diff(want: Desired, observed: Observed, now: datetime) -> Writes:
    def ensure(kind: str) -> list[Action]:
        obj = want.objects.get(kind)
        if obj is None or (kind, obj["metadata"]["name"]) in observed.conflicts:
            return []
        action = _ensure(obj, _observed_object(observed, kind), _OWNED_KEYS[kind])
        return [] if action is None else [action]

    writes = ensure("ServiceAccount") + ensure("PodDisruptionBudget") + ensure("ConfigMap")
    writes += _obsolete(want, observed)
    writes += _refresh_launcher(want, observed)

    writes += _pod_marks(want, observed, now)
    writes += [
        DeletePod(v.worker.name, v.worker.uid, v.grace_seconds)
        for v in want.victims
        if v.action == "delete"
    ]

    writes += [DeletePod(w.name, w.uid) for w in want.deletes]
    writes += [Create(pod) for pod in want.new_pods]
    writes += ensure("Role") + ensure("RoleBinding")
    if want.launcher is not None:
        writes.append(Create(want.launcher))

    rv = str(observed.job["metadata"].get("resourceVersion", ""))
    changed = want.status != (observed.job.get("status") or {})
    on_refusal: tuple[WriteStatus | Emit, ...] = (
        *([WriteStatus(want.status, rv)] if changed else []),
        *(e for e in want.events if e.reason in REFUSAL_EVENTS),
    )
    if want.delete_job:
        # runPolicy.ttlSecondsAfterFinished: the garbage collector takes the children; a
        # status written after the delete would only fail (unless the delete is refused).
        meta = observed.job["metadata"]
        delete = DeleteObject(names.KIND, str(meta["name"]), str(meta.get("uid", "")))
        actions = (*writes, delete, *want.events)
        return Writes(actions, want.requeue_after, want.probe, on_refusal)
    status = want.status
    if not writes and not observed.conflicts:
        # Nothing left to write means every earlier refusal is behind us.
        builder = StatusBuilder({"status": status}, now)
        if builder.clear(REFUSED, "WritesAccepted", "every write of the last sync went through"):
            status = builder.build()
    if status != (observed.job.get("status") or {}):
        writes.append(WriteStatus(status, rv))
    return Writes((*writes, *want.events), want.requeue_after, want.probe, on_refusal)
