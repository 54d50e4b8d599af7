"""The ordered writes that move the observed children to the desired ones.

The order is the safety argument, stated once, here. The shell executes the writes in
this order and stops at the first one refused, so every write may rely on the ones above
it having landed:

1. The ServiceAccount, and the PodDisruptionBudget before any worker it protects exists
   (or the budget's delete, once the job is suspended, finished or no longer elastic).
2. The ConfigMap: victims leave the host lists before anything happens to them; a worker
   is listed only once the Role we wrote grants exec on it (``desired.py``). The ranks
   ConfigMap, created empty; only its existence is ours, its data is the launcher's.
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
7. The launcher, after its workers exist and are granted; the ranks ConfigMap emptied
   first, so no report of an earlier launcher is read as this one's (ranks.py).
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
    Observed,
    Plan,
    Replace,
    WriteStatus,
)
from mpijob_elastic.core.desired import Desired
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


def diff(want: Desired, observed: Observed, now: datetime) -> Plan:
    def ensure(kind: str) -> list[Action]:
        obj = want.objects.get(kind)
        if obj is None or (kind, obj["metadata"]["name"]) in observed.conflicts:
            return []
        action = _ensure(obj, _observed_object(observed, kind), _OWNED_KEYS[kind])
        return [] if action is None else [action]

    writes = ensure("ServiceAccount") + ensure("PodDisruptionBudget") + ensure("ConfigMap")
    ranks = want.ranks
    if (
        ranks is not None
        and observed.ranks_report is None
        and ("ConfigMap", ranks["metadata"]["name"]) not in observed.conflicts
    ):
        writes.append(Create(ranks))
    for kind in want.obsolete:
        gone = _observed_object(observed, kind)
        if gone is not None and not gone["metadata"].get("deletionTimestamp"):
            meta = gone["metadata"]
            writes.append(DeleteObject(kind, meta["name"], str(meta.get("uid", ""))))

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
    if launcher is not None and want.config_hash is not None:
        current = (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)
        if current != want.config_hash:
            writes.append(
                AnnotatePod(
                    launcher["metadata"]["name"],
                    {names.ANN_CONFIG_HASH: want.config_hash},
                    _resource_version(launcher),
                )
            )

    for w in want.workers:
        if w.marked and not w.terminating:
            writes.append(
                AnnotatePod(w.name, {names.ANN_DRAINING_SINCE: None}, _resource_version(w.pod))
            )
    mark = format_precise_time(now)
    for v in want.victims:
        if v.action == "mark":
            writes.append(
                AnnotatePod(
                    v.worker.name, {names.ANN_DRAINING_SINCE: mark}, _resource_version(v.worker.pod)
                )
            )
    writes += [
        DeletePod(v.worker.name, v.worker.uid, v.grace_seconds)
        for v in want.victims
        if v.action == "delete"
    ]

    writes += [DeletePod(w.name, w.uid) for w in want.deletes]
    writes += [Create(pod) for pod in want.new_pods]
    writes += ensure("Role") + ensure("RoleBinding")
    if want.launcher is not None:
        report = observed.ranks_report
        if report is not None and report.get("data"):
            writes.append(Replace({k: v for k, v in report.items() if k != "data"}))
        writes.append(Create(want.launcher))

    if want.delete_job:
        # runPolicy.ttlSecondsAfterFinished: the garbage collector takes the children; a
        # status written after the delete would only fail.
        meta = observed.job["metadata"]
        delete = DeleteObject(names.KIND, str(meta["name"]), str(meta.get("uid", "")))
        return Plan((*writes, delete, *want.events), want.requeue_after, want.probe)
    status = want.status
    if not writes and not observed.conflicts:
        # Nothing left to write means every earlier refusal is behind us.
        builder = StatusBuilder({"status": status}, now)
        if builder.clear(REFUSED, "WritesAccepted", "every write of the last sync went through"):
            status = builder.build()
    if status != (observed.job.get("status") or {}):
        rv = str(observed.job["metadata"].get("resourceVersion", ""))
        writes.append(WriteStatus(status, rv))
    return Plan((*writes, *want.events), want.requeue_after, want.probe)
