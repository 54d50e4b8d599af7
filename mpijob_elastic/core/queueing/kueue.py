"""Kueue admission for MPIJobs labelled ``kueue.x-k8s.io/queue-name`` (docs/scheduling.md,
"Kueue").

Kueue admits ``kubeflow.org/v1`` MPIJobs through its external-framework contract: the
job's controller (this one) creates the Workload Kueue queues and keeps it in step, starts
the job once Kueue admits the Workload, stops it when Kueue evicts the Workload and then
gives the quota back by clearing the admission, and marks the Workload finished with the
job. Kueue itself only reserves quota and evicts.

The rest of the core sees the job through ``gate``: held (``runPolicy.suspend``) until
admitted and while evicted, at the admitted worker count once admitted, its pods on the
admitted flavor's nodes. An evicted Workload that still holds its quota keeps the job
running as admitted: run_policy.py stops it, after the notice and the checkpoint window
(notices.queue_evicted), and only then does kueue_writes.py give the quota back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from mpijob_elastic.core import names, numbers
from mpijob_elastic.core.actions import Refusal
from mpijob_elastic.core.queueing import charges
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.times import parse_time

Obj = dict[str, Any]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's WorkloadPriorityClass for the job, as Kueue's own integrations read it.
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
API_VERSION = "kueue.x-k8s.io/v1beta2"
WORKLOAD = "Workload"
# What Kueue's own integrations label their Workloads with.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Kueue's pod-set names for an MPIJob (as its v2beta1 integration names them).
LAUNCHER, WORKER = "launcher", "worker"
# Kueue's annotations of workload slices (ElasticJobsViaWorkloadSlices).
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
REPLACEMENT_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
# Which of the job's Workloads this is, 0 for the first: names them, orders them
# (creationTimestamp has whole seconds).
SLICE_ANNOTATION = names.ANN_WORKLOAD_SLICE
# Kueue's own finalizer, which its jobframework puts on every Workload it creates: here it
# keeps a deleted Workload, and the quota Kueue counts for it, until the job's last pod is
# gone (kueue_writes.released).
FINALIZER = "kueue.x-k8s.io/resource-in-use"
# The LocalQueue Kueue's LocalQueueDefaulting gives a job without the queue label.
DEFAULT_LOCAL_QUEUE = "default"


@dataclass(frozen=True)
class Queue:
    """What the caches hold of Kueue for one queue-labelled job."""

    # Kueue's API is served (its CRDs are installed).
    installed: bool
    # The Workloads the job controls.
    workloads: Sequence[Mapping[str, Any]] = ()
    # ResourceFlavor name -> its spec.
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # WorkloadPriorityClass name -> its value.
    priorities: Mapping[str, int] = field(default_factory=dict)
    # Kueue runs with ElasticJobsViaWorkloadSlices: an elastic job grows by workload
    # slices and shrinks its Workload in place (kueue_writes.py); without it, it is
    # admitted once, from min-replicas up, by partial admission.
    slices: bool = False
    # Kueue's API is served but this controller may not use it: why (the grants missing).
    denied: str = ""
    # The LocalQueue of a job without the queue label, when Kueue manages such jobs
    # (--kueue-manage-jobs-without-queue-name); None: such a job is not Kueue's.
    unlabelled: str | None = None


@dataclass(frozen=True)
class Standing:
    """Where the job stands in Kueue, for its condition: (True if admitted, reason, why)."""

    admitted: bool
    reason: str
    message: str
    # When Kueue evicted the job's Workload, while that still holds its quota: the job
    # stops one checkpoint window after it (run_policy.py).
    evicted_at: datetime | None = None


def _map(value: Any) -> Mapping[str, Any]:
    """A mapping, or an empty one where the job has something else (an invalid spec,
    which parse.py reports; nothing here may raise on it)."""
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def queue_name(job: Mapping[str, Any]) -> str | None:
    name = _map(_map(job.get("metadata")).get("labels")).get(QUEUE_LABEL)
    return name if isinstance(name, str) and name else None


def unlabelled_queue(settings: Settings) -> str | None:
    """The LocalQueue of a job without the queue label (Queue.unlabelled)."""
    return DEFAULT_LOCAL_QUEUE if settings.kueue_manage_jobs_without_queue_name else None


def local_queue(job: Mapping[str, Any], unlabelled: str | None) -> str | None:
    """The LocalQueue the job waits in: its label's, else ``unlabelled`` (Queue's); None:
    the job is not Kueue's."""
    return queue_name(job) or unlabelled


def queued(job: Mapping[str, Any], queue: Queue | None) -> Queue | None:
    """``queue`` if the job is Kueue's, else None: what the rest of the core reads."""
    return queue if queue is not None and local_queue(job, queue.unlabelled) else None


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(_map(obj.get("metadata")).get("deletionTimestamp"))


def workload_name(job: Mapping[str, Any], index: int = 0) -> str:
    meta = job["metadata"]
    base = f"mpijob-{meta['name'][:200]}-{str(meta['uid'])[:5]}"
    return f"{base}-{index}" if index else base


def slice_index(workload: Mapping[str, Any]) -> int:
    return _int((workload["metadata"].get("annotations") or {}).get(SLICE_ANNOTATION), 0)


def condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    c = condition(obj, type_)
    return c is not None and c.get("status") == "True"


def _unfinished(queue: Queue) -> list[Mapping[str, Any]]:
    """Newest first. A Workload being deleted counts for nothing here: it only holds the
    quota until the job's pods are gone (kueue_writes.released)."""
    return sorted(
        (w for w in queue.workloads if not is_true(w, "Finished") and not deleting(w)),
        key=slice_index,
        reverse=True,
    )


def reserved(workload: Mapping[str, Any]) -> bool:
    return (workload.get("status") or {}).get("admission") is not None


def current(queue: Queue) -> Mapping[str, Any] | None:
    """The job's Workload in force: the newest unfinished one holding quota; else the
    slice that one replaces, while Kueue has finished it and not yet admitted its
    replacement (Kueue does these one after the other, and the job must not stop in
    between); else the newest unfinished one. A slice asking to replace it is ``pending``."""
    live = _unfinished(queue)
    held = next((w for w in live if reserved(w)), None)
    if held is not None or not live:
        return held
    # Only for a slice never admitted yet: one that was, and lost its quota since (an
    # eviction), has left the slice it replaced behind for good.
    replaced = _replaced(live[0], queue) if condition(live[0], "Admitted") is None else None
    return replaced if replaced is not None and reserved(replaced) else live[0]


def _replaced(workload: Mapping[str, Any], queue: Queue) -> Mapping[str, Any] | None:
    """The slice a slice names as the one it replaces, once Kueue finished it for that."""
    key = (workload["metadata"].get("annotations") or {}).get(REPLACEMENT_ANNOTATION)
    for w in queue.workloads:
        meta = w["metadata"]
        finished_as = (condition(w, "Finished") or {}).get("reason")
        if f"{meta['namespace']}/{meta['name']}" == key and finished_as == "WorkloadSliceReplaced":
            return w
    return None


def pending(queue: Queue) -> list[Mapping[str, Any]]:
    """Unfinished Workloads newer than the one in force, holding no quota: slices asking
    to replace it."""
    now = current(queue)
    top = slice_index(now) if now is not None else -1
    return [w for w in _unfinished(queue) if slice_index(w) > top and not reserved(w)]


def admitted_workers(workload: Mapping[str, Any]) -> int | None:
    """The workers Kueue admitted: the assignment's count, or the Workload's own count once
    it was shrunk in place below that (ElasticJobsViaWorkloadSlices)."""
    assigned = _assignments(workload).get(WORKER)
    if assigned is None:
        return None
    spec: Mapping[str, Any] = next(
        (p for p in (workload.get("spec") or {}).get("podSets") or [] if p.get("name") == WORKER),
        {},
    )
    count = _int(assigned.get("count"), _int(spec.get("count"), 0))
    return min(count, _int(spec.get("count"), count))


def overcharged(job: Mapping[str, Any], workload: Mapping[str, Any]) -> str:
    """What the job's pods would now request beyond what ``workload`` charges for them
    (charges.py), as ``role: resource wanted > charged``; "" if nothing. Its templates may
    have been edited since the Workload was written, and a Workload the controller did not
    write may charge less: either way Kueue never admitted the difference."""
    sets = {
        p.get("name"): _map(p.get("template"))
        for p in _list(_map(workload.get("spec")).get("podSets"))
        if isinstance(p, Mapping)
    }
    found = [
        f"{pod_set}: {what}"
        for role, pod_set in (("Launcher", LAUNCHER), ("Worker", WORKER))
        for what in charges.beyond(
            charges.pod_charge(_template(job, role)), charges.pod_charge(sets.get(pod_set, {}))
        )
    ]
    return ", ".join(found)


def elastic(job: Mapping[str, Any], queue: Queue) -> bool:
    """The job grows and shrinks by workload slices."""
    low = min_replicas(job)
    return queue.slices and low is not None and low < max_replicas(job)


def finished(job: Mapping[str, Any]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def _specs(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(_map(job.get("spec")).get("mpiReplicaSpecs"))


def _template(job: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    return _map(_map(_specs(job).get(role)).get("template"))


def _int(value: Any, default: int) -> int:
    found = numbers.whole(value)
    return default if found is None else found


def _replicas(job: Mapping[str, Any]) -> int:
    return _int(_map(_specs(job).get("Worker")).get("replicas"), 1)


def replicas(job: Mapping[str, Any]) -> int:
    return _replicas(job)


def wanted(job: Mapping[str, Any], queue: Queue) -> int:
    """The workers the job asks Kueue for: its replicas; an opportunistic job that grows by
    workload slices, its maximum, a slice at a time as quota frees (docs/scheduling.md,
    "Quota that holds")."""
    return max_replicas(job) if elastic(job, queue) and names.asks_to_grow(job) else _replicas(job)


def min_replicas(job: Mapping[str, Any]) -> int | None:
    annotations = _map(job["metadata"].get("annotations"))
    if names.ANN_MIN_REPLICAS not in annotations:
        return None
    return _int(annotations[names.ANN_MIN_REPLICAS], _replicas(job))


def max_replicas(job: Mapping[str, Any]) -> int:
    annotations = _map(job["metadata"].get("annotations"))
    return _int(annotations.get(names.ANN_MAX_REPLICAS), _replicas(job))


def _pod_set(name: str, template: Mapping[str, Any], count: int, min_count: int | None) -> Obj:
    meta = _map(template.get("metadata"))
    pod_set: Obj = {
        "name": name,
        "count": count,
        "template": {
            "metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
            "spec": copy.deepcopy(dict(_map(template.get("spec")))),
        },
    }
    if min_count is not None and min_count < count:
        pod_set["minCount"] = min_count
    return pod_set


def render_workload(
    job: Mapping[str, Any], queue: Queue, workers: int, index: int = 0, replaces: str = ""
) -> Obj:
    """A Workload Kueue queues for the job: the launcher and ``workers`` workers as pod
    sets. Without workload slices the workers are admissible from ``min-replicas`` (Kueue's
    partial admission); with them, a slice asks for its exact count, and names the slice it
    ``replaces`` (namespace/name) when it grows the job."""
    meta = job["metadata"]
    pod_sets = [
        _pod_set(LAUNCHER, _template(job, "Launcher"), 1, None),
        _pod_set(
            WORKER,
            _template(job, "Worker"),
            max(workers, 1),
            None if elastic(job, queue) else min_replicas(job),
        ),
    ]
    annotations = {SLICE_ANNOTATION: str(index)}
    if elastic(job, queue):
        annotations[ELASTIC_ANNOTATION] = "true"
    if replaces:
        annotations[REPLACEMENT_ANNOTATION] = replaces
    spec: Obj = {"queueName": local_queue(job, queue.unlabelled), "podSets": pod_sets}
    priority = _map(meta.get("labels")).get(PRIORITY_LABEL)
    if isinstance(priority, str) and priority in queue.priorities:
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": priority,
        }
        spec["priority"] = queue.priorities[priority]
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD,
        "metadata": {
            "name": workload_name(job, index),
            "namespace": meta["namespace"],
            "annotations": annotations,
            "finalizers": [FINALIZER],
            "labels": {
                names.LABEL_GROUP: names.GROUP,
                names.LABEL_JOB: meta["name"],
                JOB_UID_LABEL: str(meta["uid"]),
            },
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def _assignments(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    admission = (workload.get("status") or {}).get("admission") or {}
    return {str(a.get("name")): a for a in admission.get("podSetAssignments") or []}


def _placement(assignment: Mapping[str, Any], queue: Queue) -> tuple[Obj, list[Obj]]:
    """The node labels and tolerations of the flavors a pod set was admitted on."""
    selector: Obj = {}
    tolerations: list[Obj] = []
    for flavor in sorted(set((assignment.get("flavors") or {}).values())):
        spec = queue.flavors.get(flavor) or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [dict(t) for t in spec.get("tolerations") or [] if t not in tolerations]
    return selector, tolerations


def standing(job: Mapping[str, Any], queue: Queue, refused: Refusal | None = None) -> Standing:
    """``refused``: the last write of the job the server refused (the writer's memory)."""
    if refused is not None and refused.kind == WORKLOAD:
        # Reported as every refusal is (WriteRefused, reports.py); here, why the job waits.
        # An eviction stands through it: the refused write may be the one that gives the
        # quota back, and the job must stay stopped meanwhile (the simulation's invariant
        # (k) found a job started again under the quota it was giving back).
        held = current(queue) if queue.installed else None
        message = f"{refused.write}: {refused.message}"
        evicted_at = _evicted_at(held) if held is not None else None
        return Standing(False, "WorkloadRefused", message, evicted_at)
    if queue.denied:
        return Standing(False, "KueueNotPermitted", f"Kueue's API is served, but {queue.denied}")
    if not queue.installed:
        undo = (
            f"remove the {QUEUE_LABEL} label"
            if queue_name(job)
            else "run the controller without --kueue-manage-jobs-without-queue-name"
        )
        return Standing(
            False,
            "KueueNotInstalled",
            f"the job waits in Kueue LocalQueue {local_queue(job, queue.unlabelled)!r} but "
            f"Kueue's API ({API_VERSION}) is not served: install Kueue or {undo}",
        )
    workload = current(queue)
    if workload is None:
        return _unwritten(queue)
    wl = workload["metadata"]["name"]
    holding = reserved(workload) or is_true(workload, "Admitted")
    beyond = overcharged(job, workload) if holding else ""
    if beyond:
        return Standing(
            False,
            "WorkloadOutdated",
            f"the pods would request more than Workload {wl} was admitted for ({beyond}): "
            "the job stops and is queued again with a new Workload",
        )
    if is_true(workload, "Evicted"):
        evicted = condition(workload, "Evicted") or {}
        message = f"Kueue evicted Workload {wl}: {evicted.get('message', '')}"
        return Standing(False, "Evicted", message, _evicted_at(workload))
    if is_true(workload, "Admitted"):
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        count = admitted_workers(workload)
        return Standing(
            True, "Admitted", f"Workload {wl} admitted by ClusterQueue {cq} with {count} workers"
        )
    waits = f"Workload {wl} waits in LocalQueue {local_queue(job, queue.unlabelled)}"
    return Standing(False, "Pending", waits)


def _unwritten(queue: Queue) -> Standing:
    """The job has no Workload in force."""
    going = sorted(w["metadata"]["name"] for w in queue.workloads if deleting(w))
    if going:
        return Standing(
            False,
            "Pending",
            f"Workload {', '.join(going)} is being deleted: it holds its quota until the "
            "job's last pod is gone, then the job is queued again",
        )
    return Standing(False, "Pending", "the job's Workload is being created")


def _evicted_at(workload: Mapping[str, Any]) -> datetime | None:
    """When Kueue evicted the Workload, while it still holds its quota; else None."""
    if not is_true(workload, "Evicted") or not reserved(workload):
        return None
    # The window counts from the condition's time, which the API keeps in whole seconds
    # (rounded down): a second later, so it is never shorter. Unreadable: at once.
    since = parse_time((condition(workload, "Evicted") or {}).get("lastTransitionTime"))
    return since + timedelta(seconds=1) if since else datetime.min.replace(tzinfo=UTC)


def running_under(job: Mapping[str, Any], queue: Queue) -> Mapping[str, Any] | None:
    """The Workload the job may run under now: the one in force, admitted (or evicted but
    still holding its quota: the job runs on, as admitted, until run_policy.py stops it at
    the end of its checkpoint window), and charging at least what its pods would request
    (never more than Kueue admitted, in the eviction's window too; docs/scheduling.md).
    None: the job may run nothing."""
    workload = current(queue) if queue.installed else None
    if workload is None or overcharged(job, workload):
        return None
    evicted = is_true(workload, "Evicted")
    if (is_true(workload, "Admitted") and not evicted) or (evicted and reserved(workload)):
        return workload
    return None


def gate(job: Obj, queue: Queue) -> Obj:
    """The job as the rest of the core sees it: suspended unless admitted (or evicted with
    its quota still held), at the admitted worker count and on the admitted flavors' nodes
    once admitted. A finished job is left as it is."""
    if finished(job):
        return job
    workload = running_under(job, queue)
    gated = copy.deepcopy(dict(job))
    spec = gated.setdefault("spec", {})
    run_policy = spec.setdefault("runPolicy", {}) if isinstance(spec, dict) else None
    if not isinstance(run_policy, dict):
        # Invalid: parse.py freezes the job, which creates nothing.
        return job
    if workload is None:
        run_policy["suspend"] = True
        return gated
    assigned = _assignments(workload)
    for role, pod_set in (("Launcher", LAUNCHER), ("Worker", WORKER)):
        replica = _map(spec.get("mpiReplicaSpecs")).get(role)
        if not isinstance(replica, dict) or pod_set not in assigned:
            continue
        count = admitted_workers(workload)
        if role == "Worker" and isinstance(replica.get("replicas"), int) and count is not None:
            replica["replicas"] = min(wanted(job, queue), count)
        selector, tolerations = _placement(assigned[pod_set], queue)
        template = replica.setdefault("template", {})
        pod_spec = template.setdefault("spec", {}) if isinstance(template, dict) else None
        if not isinstance(pod_spec, dict):
            continue
        if selector:
            pod_spec["nodeSelector"] = {**_map(pod_spec.get("nodeSelector")), **selector}
        if tolerations:
            own = pod_spec.get("tolerations")
            pod_spec["tolerations"] = [*(own if isinstance(own, list) else []), *tolerations]
    return gated
