"""The writes of a queue-labelled job's Workloads (kueue.py holds what they are and how the
job sees them; docs/scheduling.md, "Kueue").

The job's controller owns its Workloads and keeps them in step, as Kueue's contract for
external frameworks asks: it creates the first one, marks them finished with the job, and
once Kueue evicted one, clears its admission only when the job's last pod is gone, so that
Kueue counts the quota in use until then. With workload slices an elastic job also grows,
one worker at a time, by a new slice that replaces the one in force once Kueue admits it,
and shrinks its Workload in place once the workers it gives back are gone.

Each Workload carries Kueue's own finalizer, as Kueue's jobframework writes it. A Workload
deleted (with the job, by the garbage collector; or by this controller, or a person)
keeps its quota counted by Kueue until the job's last pod is gone; only then is the
finalizer taken off (``released``), for a job already gone too (app/kueue.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import names, numbers
from mpijob_elastic.core.actions import Action, Create, DeleteObject, PatchStatus, Replace
from mpijob_elastic.core.queueing.charges import pod_charge
from mpijob_elastic.core.queueing.kueue import (
    API_VERSION,
    FINALIZER,
    WORKER,
    WORKLOAD,
    Queue,
    admitted_workers,
    condition,
    current,
    deleting,
    elastic,
    finished,
    is_true,
    min_replicas,
    overcharged,
    pending,
    render_workload,
    replicas,
    reserved,
    slice_index,
    wanted,
)

Obj = dict[str, Any]


def workload_writes(
    job: Mapping[str, Any], queue: Queue, pods: Sequence[Mapping[str, Any]], now: str
) -> list[Action]:
    """What the job's Workloads need now (write_order.py's ``Workload`` step, after the
    job's children and before its status). ``job``: with the status this turn writes, so
    that a job that finishes now gives its quota back now; ``pods``: every pod of the job
    the cache holds, terminating ones included; ``now``: RFC 3339, for the conditions
    written. The writes are of distinct Workloads: none relies on another."""
    if not queue.installed:
        return []
    releases = released(queue.workloads, pods)
    workload = current(queue)
    done = finished(job)
    if workload is None:
        # A finished job's Workloads were finished with it; none is made again. One being
        # deleted still holds its name and quota: the next is made once it is gone.
        if done or queue.workloads:
            return list(releases)
        first = min_replicas(job) if elastic(job, queue) else None
        return [Create(render_workload(job, queue, first or replicas(job)))]
    live = _live(job, queue, workload, pods, now, done)
    return [*releases, *live, *_finalized(queue, live)]


def _live(
    job: Mapping[str, Any],
    queue: Queue,
    workload: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: str,
    done: str | None,
) -> list[Action]:
    if done:
        message = f"the MPIJob {done.lower()}"
        return [
            _status_patch(w, [_cond(w, "Finished", True, done, message, now)])
            for w in (workload, *pending(queue))
            if not is_true(w, "Finished")
        ]
    if is_true(workload, "Evicted") or (reserved(workload) and overcharged(job, workload)):
        return _stopped(job, queue, workload, pods, now)
    if not reserved(workload) and not pending(queue):
        return _follow(job, queue, workload)
    if reserved(workload) and is_true(workload, "Admitted"):
        return [*_replaced(queue, workload, now), *_admitted(job, queue, workload, pods, now)]
    return []


def _replaced(queue: Queue, workload: Mapping[str, Any], now: str) -> list[Action]:
    """Each older slice still unfinished once a newer one is admitted: ``Finished``, as
    Kueue's jobframework finishes a job's superseded slices. Kueue finishes the slice an
    admitted one replaces itself, but when its write meets a conflict (this controller
    marking that slice PodsReady at the same moment, say) it leaves that to "the job
    reconciler": without this, the old slice kept its quota, and the job never grew past
    the next step (seen with v0.19.2)."""
    top = slice_index(workload)
    message = "Replaced to accommodate a new workload slice"
    return [
        _status_patch(w, [_cond(w, "Finished", True, "WorkloadSliceReplaced", message, now)])
        for w in queue.workloads
        if slice_index(w) < top and not is_true(w, "Finished") and not deleting(w)
    ]


def _finalized(queue: Queue, writes: Sequence[Action]) -> list[Action]:
    """Kueue's finalizer on each of the job's Workloads that holds quota and lacks it (one
    a controller before it wrote), unless a write of this turn replaces it already: one
    write per object and turn, or the second meets the first's new resourceVersion."""
    touched = {
        w.obj["metadata"]["name"] for w in writes if isinstance(w, Replace | PatchStatus)
    } | {w.name for w in writes if isinstance(w, DeleteObject)}
    return [
        _with_finalizers(w, [*(w["metadata"].get("finalizers") or ()), FINALIZER])
        for w in queue.workloads
        if reserved(w)
        and not deleting(w)
        and not is_true(w, "Finished")
        and FINALIZER not in (w["metadata"].get("finalizers") or ())
        and w["metadata"]["name"] not in touched
    ]


def released(
    workloads: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> list[Replace]:
    """The finalizer off each deleted Workload of one job that no longer holds quota its
    pods use: none reserved, or none of the pods left but ended ones. ``pods``: the job's,
    terminating ones included."""
    in_use = any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for p in pods)
    return [
        _with_finalizers(w, [f for f in w["metadata"]["finalizers"] if f != FINALIZER])
        for w in workloads
        if deleting(w)
        and FINALIZER in (w["metadata"].get("finalizers") or ())
        and not (reserved(w) and in_use)
    ]


def _with_finalizers(workload: Mapping[str, Any], finalizers: Sequence[str]) -> Replace:
    """The Workload as cached, with these finalizers: a PUT carrying its resourceVersion."""
    meta = {**workload["metadata"], "finalizers": list(finalizers)}
    return Replace({**workload, "apiVersion": API_VERSION, "kind": WORKLOAD, "metadata": meta})


def _admitted(
    job: Mapping[str, Any],
    queue: Queue,
    workload: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: str,
) -> list[Action]:
    """``PodsReady`` once the launcher and the admitted workers first run (what Kueue's
    waitForPodsReady waits for; the job's own scale-out timeout and below-min suspension
    handle later losses, so it is not turned back); then, for an elastic job, its size."""
    if not is_true(workload, "PodsReady") and _started(job, queue, workload, pods):
        message = "the launcher and the admitted workers run"
        return [
            _status_patch(workload, [_cond(workload, "PodsReady", True, "Started", message, now)])
        ]
    return _resize(job, queue, workload, pods) if elastic(job, queue) else []


def _started(
    job: Mapping[str, Any],
    queue: Queue,
    workload: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
) -> bool:
    def running(role: str) -> int:
        return sum(
            1
            for p in pods
            if (p["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == role
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"
        )

    admitted = admitted_workers(workload)
    want = min(wanted(job, queue), admitted if admitted is not None else wanted(job, queue))
    return running(names.ROLE_LAUNCHER) >= 1 and running(names.ROLE_WORKER) >= want


def _follow(job: Mapping[str, Any], queue: Queue, workload: Mapping[str, Any]) -> list[Action]:
    """A Workload waiting in the queue follows the job's edits, as Kueue's own integrations
    do; an admitted one changes only as ``_resize`` says. The counts and what one pod of
    each set charges are compared, not the whole templates, which the server may default."""
    first = min_replicas(job) if elastic(job, queue) else replicas(job)
    wanted = render_workload(job, queue, first or replicas(job))["spec"]["podSets"]
    if _counts(workload.get("spec") or {}) == _counts({"podSets": wanted}) and _charges(
        workload.get("spec") or {}
    ) == _charges({"podSets": wanted}):
        return []
    return [_replace_pod_sets(workload, wanted)]


def _stopped(
    job: Mapping[str, Any],
    queue: Queue,
    workload: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    now: str,
) -> list[Action]:
    """Evicted: the job stops (run_policy.py, after its notice and checkpoint window);
    slices asking to grow it are withdrawn; once its last pod is gone an elastic Workload
    asks for min-replicas again, then the admission is cleared, which gives the quota back
    and requeues it. Admitted for less than its pods would now request: the job stops at
    once (kueue.gate), and once its last pod is gone the Workload goes with its quota; the
    next turn writes one for the templates as they are now."""
    writes = [_delete(w) for w in pending(queue)]
    if pods or not reserved(workload):
        return writes
    if overcharged(job, workload):
        # Every one of the job's Workloads, the slices it replaced too: a job with any left
        # is given no new one (``workload_writes``).
        return [_delete(w) for w in queue.workloads]
    low = min_replicas(job)
    if elastic(job, queue) and low is not None and _count(workload) > low:
        return [*writes, _replace(workload, low)]
    evicted = condition(workload, "Evicted") or {}
    reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
    requeue = reason in ("Preempted", "NodeFailures")
    return [
        *writes,
        _status_patch(
            workload,
            [
                _cond(workload, "QuotaReserved", False, "Pending", message, now),
                _cond(workload, "Admitted", False, "NoReservation", "no quota reserved", now),
                _cond(workload, "Requeued", requeue, reason, message, now),
            ],
            admission=None,
        ),
    ]


def _resize(
    job: Mapping[str, Any],
    queue: Queue,
    workload: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
) -> list[Action]:
    """Grow by a slice of one more worker while the job wants more; shrink in place once
    the workers beyond what the job wants are gone."""
    count, want = admitted_workers(workload) or 0, wanted(job, queue)
    waiting = pending(queue)
    if count < want:
        stale = [_delete(w) for w in waiting if _count(w) > want]
        if waiting:
            return stale
        meta = workload["metadata"]
        index = max(slice_index(w) for w in queue.workloads) + 1
        replaces = f"{meta['namespace']}/{meta['name']}"
        return [Create(render_workload(job, queue, count + 1, index, replaces))]
    writes = [_delete(w) for w in waiting]
    workers = sum(
        1
        for p in pods
        if (p["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == names.ROLE_WORKER
    )
    if count > want and workers <= want:
        writes.append(_replace(workload, want))
    return writes


def _counts(spec: Mapping[str, Any]) -> list[tuple[Any, Any, Any]]:
    return [(p.get("name"), p.get("count"), p.get("minCount")) for p in spec.get("podSets") or []]


def _charges(spec: Mapping[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    return [
        (p.get("name"), {k: v.value for k, v in pod_charge(p.get("template") or {}).items()})
        for p in spec.get("podSets") or []
    ]


def _count(workload: Mapping[str, Any]) -> int:
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        if pod_set.get("name") == WORKER:
            return numbers.whole(pod_set.get("count")) or 0
    return 0


def _replace(workload: Mapping[str, Any], workers: int) -> Replace:
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    return _replace_pod_sets(
        workload, [{**p, "count": workers} if p.get("name") == WORKER else p for p in pod_sets]
    )


def _replace_pod_sets(workload: Mapping[str, Any], pod_sets: Sequence[Any]) -> Replace:
    obj: Obj = {**workload, "apiVersion": API_VERSION, "kind": WORKLOAD}
    obj["spec"] = {**(obj.get("spec") or {}), "podSets": list(pod_sets)}
    return Replace(obj)


def _delete(workload: Mapping[str, Any]) -> Action:
    meta = workload["metadata"]
    return DeleteObject(WORKLOAD, meta["name"], meta["uid"])


def _status_patch(
    workload: Mapping[str, Any], conditions: Sequence[Mapping[str, Any]], **fields: Any
) -> PatchStatus:
    meta = workload["metadata"]
    kept = [
        c
        for c in (workload.get("status") or {}).get("conditions") or []
        if c.get("type") not in {c2["type"] for c2 in conditions}
    ]
    return PatchStatus(
        {
            "apiVersion": API_VERSION,
            "kind": WORKLOAD,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "status": {"conditions": [*kept, *conditions], **fields},
        },
    )


def _cond(
    workload: Mapping[str, Any], type_: str, status: bool, reason: str, message: str, now: str
) -> Obj:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "observedGeneration": workload["metadata"].get("generation", 1),
    }
