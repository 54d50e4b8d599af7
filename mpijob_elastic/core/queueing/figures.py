"""Kueue seen from outside: what ``/metrics`` tells of queued jobs (docs/operations.md,
"Kueue seen from outside"), read from the Workloads and pods as the caches hold them.

Each figure is read where the controller is sure to meet it once: the wait for admission
at the write that marks a Workload ``PodsReady`` (never turned back), an eviction at the
job's status write that turns ``QueueAdmitted`` to ``Evicted`` (machinery/metrics.py), the
workers above the admission at each scrape. Whatever a Workload holds reads as a value or
as nothing, never raises: others write Workloads too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import (
    REPLACEMENT_ANNOTATION,
    WORKLOAD,
    Queue,
    admitted_workers,
    current,
)
from mpijob_elastic.core.times import parse_time

# Why Kueue evicts a Workload, as v1beta2 names it in the Evicted condition's reason
# (kueue.x-k8s.io/v1beta2 workload_types.go). A deactivation may carry its cause after
# "DueTo" (DeactivatedDueToAdmissionCheck, ...; Kueue's workload.ReasonWithCause, for a
# deactivation only): counted as Deactivated.
DEACTIVATED: Final = "Deactivated"
EVICTION_REASONS: Final = (
    "Preempted",
    "PodsReadyTimeout",
    "AdmissionCheck",
    "ClusterQueueStopped",
    "LocalQueueStopped",
    "NodeFailures",
    DEACTIVATED,
    "EvictedOnManagerCluster",
)
# Any other reason, or none: the label's values stay these nine, whoever wrote it.
OTHER: Final = "Other"
# A Workload that starts the job, and a slice that grows a running job by replacing the
# one in force (ElasticJobsViaWorkloadSlices): the second waits while the job trains.
START, GROWTH = "start", "growth"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    found = _map(_map(obj).get("status")).get("conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def _true(obj: Mapping[str, Any] | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in _conditions(obj))


def pods_ready_turned(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    """A write of a Workload's status turned its ``PodsReady`` condition True: ``before``
    is the Workload as the write was planned from, ``after`` the server's answer."""
    return (
        _map(after).get("kind") == WORKLOAD
        and _true(after, "PodsReady")
        and not _true(before, "PodsReady")
    )


def admission_wait(workload: Mapping[str, Any]) -> float | None:
    """Seconds from the Workload's creation to Kueue's ``Admitted`` condition turning True;
    None while it is not admitted or either time is unreadable. Both are whole seconds
    (the API's), from two clocks: never below 0."""
    admitted = next(
        (c for c in _conditions(workload) if c.get("type") == "Admitted"),
        None,
    )
    if admitted is None or admitted.get("status") != "True":
        return None
    created = parse_time(_map(_map(workload).get("metadata")).get("creationTimestamp"))
    since = parse_time(admitted.get("lastTransitionTime"))
    if created is None or since is None:
        return None
    return max(0.0, (since - created).total_seconds())


def admission(workload: Mapping[str, Any]) -> str:
    """``growth`` for a slice that replaces the Workload in force, else ``start``."""
    annotations = _map(_map(_map(workload).get("metadata")).get("annotations"))
    return GROWTH if annotations.get(REPLACEMENT_ANNOTATION) else START


def eviction_reason(workload: Mapping[str, Any] | None) -> str:
    """Why Kueue evicted the Workload, one of ``EVICTION_REASONS`` or ``OTHER``."""
    evicted = next((c for c in _conditions(workload) if c.get("type") == "Evicted"), None)
    reason = _map(evicted).get("reason")
    if not isinstance(reason, str):
        return OTHER
    if reason in EVICTION_REASONS:
        return reason
    return DEACTIVATED if reason.startswith(f"{DEACTIVATED}DueTo") else OTHER


def evicted_reason(queue: Queue | None) -> str:
    """The reason of the eviction of the job's Workload in force (``OTHER`` if none is)."""
    if queue is None or not queue.installed:
        return OTHER
    return eviction_reason(current(queue))


def live_workers(pods: Iterable[Mapping[str, Any]]) -> int:
    """The job's worker pods that hold their resources: not terminating, not finished."""
    return sum(
        1
        for pod in pods
        if _map(_map(pod.get("metadata")).get("labels")).get(names.LABEL_ROLE) == names.ROLE_WORKER
        and not _map(pod.get("metadata")).get("deletionTimestamp")
        and _map(pod.get("status")).get("phase") not in ("Succeeded", "Failed")
    )


def workers_above_admission(
    job: Mapping[str, Any], queue: Queue, pods: Iterable[Mapping[str, Any]]
) -> int:
    """How many of the job's live workers run beyond what Kueue admitted (the rule of
    ``kueue.gate``): all of them when the job may run nothing. Must stay 0."""
    workload = kueue.running_under(job, queue)
    admitted = (admitted_workers(workload) or 0) if workload is not None else 0
    return max(0, live_workers(pods) - admitted)
