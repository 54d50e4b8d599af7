"""Kueue admission for MPIJobs labelled ``kueue.x-k8s.io/queue-name`` (docs/scheduling.md,
"Kueue").

Kueue admits ``kubeflow.org/v1`` MPIJobs through its external-framework contract: the
job's controller (this one) creates the Workload Kueue queues and keeps it in step, starts
the job once Kueue admits the Workload, stops it when Kueue evicts the Workload and then
gives the quota back by clearing the admission, and marks the Workload finished with the
job. Kueue itself only reserves quota and evicts.

The rest of the core sees the job through ``gate``: held (``runPolicy.suspend``) until
admitted and while evicted, at the admitted worker count once admitted, its pods on the
admitted flavor's nodes. So Kueue's eviction goes through the job's own graceful suspend.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob_elastic.core import names

Obj = dict[str, Any]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's WorkloadPriorityClass for the job, as Kueue's own integrations read it.
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
API_VERSION = "kueue.x-k8s.io/v1beta2"
# What Kueue's own integrations label their Workloads with.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# Kueue's pod-set names for an MPIJob (as its v2beta1 integration names them).
LAUNCHER, WORKER = "launcher", "worker"


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


@dataclass(frozen=True)
class Standing:
    """Where the job stands in Kueue, for its condition: (True if admitted, reason, why)."""

    admitted: bool
    reason: str
    message: str


@dataclass(frozen=True)
class WorkloadWrite:
    """A write of the job's Workload: ``create``, or a merge ``patch_status`` carrying
    the observed resourceVersion (a stale view is refused with 409 and planned again)."""

    verb: str
    obj: Obj


def queue_name(job: Mapping[str, Any]) -> str | None:
    name = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return name if isinstance(name, str) and name else None


def workload_name(job: Mapping[str, Any]) -> str:
    meta = job["metadata"]
    return f"mpijob-{meta['name'][:200]}-{str(meta['uid'])[:5]}"


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def _true(obj: Mapping[str, Any], type_: str) -> bool:
    c = _condition(obj, type_)
    return c is not None and c.get("status") == "True"


def current(queue: Queue) -> Mapping[str, Any] | None:
    """The job's Workload that is not finished (the newest, if there were more)."""
    live = [w for w in queue.workloads if not _true(w, "Finished")]
    return (
        max(live, key=lambda w: str(w["metadata"].get("creationTimestamp", ""))) if live else None
    )


def _finished(job: Mapping[str, Any]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def _specs(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return (job.get("spec") or {}).get("mpiReplicaSpecs") or {}


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _replicas(job: Mapping[str, Any]) -> int:
    return _int((_specs(job).get("Worker") or {}).get("replicas"), 1)


def _min_replicas(job: Mapping[str, Any]) -> int | None:
    annotations = job["metadata"].get("annotations") or {}
    if names.ANN_MIN_REPLICAS not in annotations:
        return None
    return _int(annotations[names.ANN_MIN_REPLICAS], _replicas(job))


def _pod_set(name: str, template: Mapping[str, Any], count: int, min_count: int | None) -> Obj:
    meta = template.get("metadata") or {}
    pod_set: Obj = {
        "name": name,
        "count": count,
        "template": {
            "metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
            "spec": copy.deepcopy(dict(template.get("spec") or {})),
        },
    }
    if min_count is not None and min_count < count:
        pod_set["minCount"] = min_count
    return pod_set


def render_workload(job: Mapping[str, Any], queue: Queue) -> Obj:
    """The Workload Kueue queues for the job: the launcher and the workers as pod sets,
    the workers admissible from ``min-replicas`` (Kueue's partial admission)."""
    meta = job["metadata"]
    specs = _specs(job)
    pod_sets = [
        _pod_set(LAUNCHER, (specs.get("Launcher") or {}).get("template") or {}, 1, None),
        _pod_set(
            WORKER,
            (specs.get("Worker") or {}).get("template") or {},
            max(_replicas(job), 1),
            _min_replicas(job),
        ),
    ]
    spec: Obj = {"queueName": queue_name(job), "podSets": pod_sets}
    priority = (meta.get("labels") or {}).get(PRIORITY_LABEL)
    if isinstance(priority, str) and priority in queue.priorities:
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": priority,
        }
        spec["priority"] = queue.priorities[priority]
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": meta["namespace"],
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


def standing(job: Mapping[str, Any], queue: Queue) -> Standing:
    if not queue.installed:
        return Standing(
            False,
            "KueueNotInstalled",
            f"the job names Kueue queue {queue_name(job)!r} but Kueue's API "
            f"({API_VERSION}) is not served: install Kueue or remove the {QUEUE_LABEL} label",
        )
    workload = current(queue)
    if workload is None:
        return Standing(False, "Pending", "the job's Workload is being created")
    wl = workload["metadata"]["name"]
    if _true(workload, "Evicted"):
        why = (_condition(workload, "Evicted") or {}).get("message", "")
        return Standing(False, "Evicted", f"Kueue evicted Workload {wl}: {why}")
    if _true(workload, "Admitted"):
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        count = (_assignments(workload).get(WORKER) or {}).get("count")
        return Standing(
            True, "Admitted", f"Workload {wl} admitted by ClusterQueue {cq} with {count} workers"
        )
    return Standing(False, "Pending", f"Workload {wl} waits in LocalQueue {queue_name(job)}")


def gate(job: Obj, queue: Queue) -> Obj:
    """The job as the rest of the core sees it: suspended unless admitted, at the admitted
    worker count and on the admitted flavors' nodes once admitted. A finished job is left
    as it is."""
    if _finished(job):
        return job
    workload = current(queue) if queue.installed else None
    admitted = (
        workload is not None and _true(workload, "Admitted") and not _true(workload, "Evicted")
    )
    gated = copy.deepcopy(dict(job))
    spec = gated.setdefault("spec", {})
    if not admitted or workload is None:
        spec.setdefault("runPolicy", {})["suspend"] = True
        return gated
    assigned = _assignments(workload)
    for role, pod_set in (("Launcher", LAUNCHER), ("Worker", WORKER)):
        replica = (spec.get("mpiReplicaSpecs") or {}).get(role)
        if not isinstance(replica, dict) or pod_set not in assigned:
            continue
        if role == "Worker":
            count = _int(assigned[pod_set].get("count"), _replicas(job))
            replica["replicas"] = min(_replicas(job), count)
        selector, tolerations = _placement(assigned[pod_set], queue)
        pod_spec = replica.setdefault("template", {}).setdefault("spec", {})
        if selector:
            pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **selector}
        if tolerations:
            pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), *tolerations]
    return gated


def _status_patch(
    workload: Mapping[str, Any], conditions: Sequence[Mapping[str, Any]], **fields: Any
) -> WorkloadWrite:
    meta = workload["metadata"]
    kept = [
        c
        for c in (workload.get("status") or {}).get("conditions") or []
        if c.get("type") not in {c2["type"] for c2 in conditions}
    ]
    return WorkloadWrite(
        "patch_status",
        {
            "apiVersion": API_VERSION,
            "kind": "Workload",
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


def workload_writes(
    job: Mapping[str, Any], queue: Queue, pods: Sequence[Mapping[str, Any]], now: str
) -> list[WorkloadWrite]:
    """What the job's Workload needs now: created if missing; once Kueue evicted it, its
    admission cleared when the job's last pod is gone (so Kueue counts the quota in use
    until then); marked finished with the job. ``now``: RFC 3339, for the conditions."""
    if not queue.installed:
        return []
    workload = current(queue)
    finished = _finished(job)
    if workload is None:
        # A finished job's Workload was finished with it; none is made again.
        return (
            []
            if finished or queue.workloads
            else [WorkloadWrite("create", render_workload(job, queue))]
        )
    if finished:
        return [
            _status_patch(
                workload,
                [
                    _cond(
                        workload, "Finished", True, finished, f"the MPIJob {finished.lower()}", now
                    )
                ],
            )
        ]
    evicted = _condition(workload, "Evicted")
    reserved = (workload.get("status") or {}).get("admission") is not None
    if evicted and evicted.get("status") == "True" and reserved and not pods:
        reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
        requeue = reason in ("Preempted", "NodeFailures")
        return [
            _status_patch(
                workload,
                [
                    _cond(workload, "QuotaReserved", False, "Pending", message, now),
                    _cond(
                        workload,
                        "Admitted",
                        False,
                        "NoReservation",
                        "The workload has no reservation",
                        now,
                    ),
                    _cond(workload, "Requeued", requeue, reason, message, now),
                ],
                admission=None,
            )
        ]
    return []
