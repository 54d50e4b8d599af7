"""Kueue seen from outside, pure (core/queueing/figures.py) and as /metrics serves it
(machinery/metrics.py): the wait for admission, evictions by reason, the workers above the
admission. The Workloads are rendered by kueue.py, as the controller writes them, with the
status Kueue gives them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import figures, kueue
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.machinery import metrics
from tests.metric_names import family, total
from tests.unit.simulation import make_job

CREATED = "2026-12-01T10:00:00Z"
WAIT = family(metrics.ADMISSION_WAIT_SECONDS)
EVICTIONS = total(metrics.EVICTIONS)
ABOVE = "mpijob_elastic_queue_workers_above_admission"


def queued_job(name: str = "job", replicas: int = 4) -> dict[str, Any]:
    job = make_job(replicas, name=name)
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q"}
    return job


def condition(type_: str, status: str = "True", reason: str = "R", at: Any = None) -> Any:
    found: dict[str, Any] = {"type": type_, "status": status, "reason": reason}
    if at is not None:
        found["lastTransitionTime"] = at
    return found


def workload(
    job: Mapping[str, Any],
    *,
    admitted: int | None = None,
    at: Any = "2026-12-01T10:01:30Z",
    conditions: Iterable[Any] = (),
    index: int = 0,
    replaces: str = "",
) -> dict[str, Any]:
    """The job's Workload as the API server holds it: created at CREATED, and if
    ``admitted``, admitted with that many workers at ``at``."""
    w = kueue.render_workload(job, Queue(True, slices=True), 4, index, replaces)
    w["metadata"].update(uid=f"wl-{index}", resourceVersion="7", creationTimestamp=CREATED)
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admitted is not None:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "launcher", "count": 1},
                {"name": "worker", "count": admitted},
            ],
        }
        status["conditions"] += [
            condition("QuotaReserved", reason="QuotaReserved", at=at),
            condition("Admitted", reason="Admitted", at=at),
        ]
    w["status"] = status
    return w


def pod(
    name: str, role: str = names.ROLE_WORKER, phase: str = "Running", terminating: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {names.LABEL_ROLE: role}}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T10:05:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def workers(n: int) -> list[dict[str, Any]]:
    return [pod(f"job-worker-{i}") for i in range(n)]


# -- the wait for admission ------------------------------------------------------------------


def test_the_wait_is_from_the_workloads_creation_to_kueues_admitted_condition() -> None:
    job = queued_job()
    assert figures.admission_wait(workload(job, admitted=4)) == 90.0
    assert figures.admission_wait(workload(job)) is None  # waiting still
    refused = workload(job, conditions=[condition("Admitted", "False", at="2026-12-01T10:02:00Z")])
    assert figures.admission_wait(refused) is None
    # Two clocks: an admission stamped before the creation reads as no wait, not less.
    assert figures.admission_wait(workload(job, admitted=4, at="2026-12-01T09:59:59Z")) == 0.0


@pytest.mark.parametrize(
    "at",
    [None, "", "yesterday", 1764583290, "10000-01-01T00:00:00Z", "2026-13-01T00:00:00Z", ["x"]],
)
def test_an_unreadable_admission_time_is_no_wait_never_an_exception(at: Any) -> None:
    w = workload(queued_job(), admitted=4, at=at)
    assert figures.admission_wait(w) is None
    w["metadata"]["creationTimestamp"] = at
    assert figures.admission_wait(w) is None


def test_a_slice_that_grows_a_running_job_waits_apart() -> None:
    job = queued_job()
    assert figures.admission(workload(job)) == figures.START
    grown = workload(job, index=1, replaces=f"ns/{kueue.workload_name(job)}")
    assert figures.admission(grown) == figures.GROWTH


def test_the_wait_is_observed_at_the_write_that_marks_the_workload_pods_ready_once() -> None:
    job = queued_job()
    before = workload(job, admitted=4)
    after = workload(job, admitted=4, conditions=[condition("PodsReady", reason="Started")])
    assert figures.pods_ready_turned(before, after)
    # The next writes (Finished, an eviction's release) carry PodsReady on: not again.
    assert not figures.pods_ready_turned(after, after)
    assert not figures.pods_ready_turned(before, before)
    assert not figures.pods_ready_turned(before, {**after, "kind": "Pod"})

    count = REGISTRY.get_sample_value(f"{WAIT}_count", {"admission": "start"}) or 0.0
    total_ = REGISTRY.get_sample_value(f"{WAIT}_sum", {"admission": "start"}) or 0.0
    metrics.workload_status_written(before, after)
    metrics.workload_status_written(after, after)
    assert REGISTRY.get_sample_value(f"{WAIT}_count", {"admission": "start"}) == count + 1
    assert REGISTRY.get_sample_value(f"{WAIT}_sum", {"admission": "start"}) == total_ + 90.0
    # Every kind of admission is served from the start, so a rate sees the first one.
    assert REGISTRY.get_sample_value(f"{WAIT}_count", {"admission": "growth"}) is not None


# -- evictions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "counted"),
    [
        ("Preempted", "Preempted"),
        ("PodsReadyTimeout", "PodsReadyTimeout"),
        ("Deactivated", "Deactivated"),
        ("DeactivatedDueToAdmissionCheck", "Deactivated"),
        ("NodeFailures", "NodeFailures"),
        ("InactiveWorkload", figures.OTHER),  # v1beta1's name, not v1beta2's
        ("DueTo", figures.OTHER),
        ("PreemptedDueToX", figures.OTHER),  # only a deactivation carries a cause
        ("x" * 5000, figures.OTHER),
        (7, figures.OTHER),
        (None, figures.OTHER),
    ],
)
def test_an_eviction_is_counted_by_the_reason_kueue_names_and_nothing_else(
    reason: Any, counted: str
) -> None:
    evicted = workload(queued_job(), admitted=4, conditions=[condition("Evicted", reason=reason)])
    assert figures.eviction_reason(evicted) == counted


def test_no_eviction_reads_as_other() -> None:
    job = queued_job()
    assert figures.eviction_reason(workload(job, admitted=4)) == figures.OTHER
    assert figures.eviction_reason(None) == figures.OTHER
    assert figures.evicted_reason(None) == figures.OTHER
    assert figures.evicted_reason(Queue(installed=False)) == figures.OTHER
    assert figures.evicted_reason(Queue(True, [])) == figures.OTHER


def queue_admitted(reason: str | None) -> dict[str, Any]:
    """A job's status whose QueueAdmitted condition has this reason (None: no such condition)."""
    if reason is None:
        return {"conditions": [condition("Created", reason="MPIJobCreated")]}
    status = "True" if reason == "Admitted" else "False"
    return {"conditions": [condition("QueueAdmitted", status, reason)]}


@pytest.mark.parametrize(
    ("before", "after", "counted"),
    [
        ("Admitted", "Evicted", True),
        ("Pending", "Evicted", True),  # a Workload deactivated while it waits
        (None, "Evicted", True),
        ("Evicted", "Evicted", False),  # the same eviction, a later write (or a new leader)
        ("WorkloadRefused", "Evicted", False),  # counted before the refusal
        ("Evicted", "Pending", False),
        ("Evicted", "Admitted", False),
        ("Pending", "Admitted", False),
    ],
)
def test_an_eviction_is_counted_at_the_status_write_that_turns_queue_admitted_to_evicted(
    before: str | None, after: str, counted: bool
) -> None:
    assert metrics.queue_evicted(queue_admitted(before), queue_admitted(after)) is counted


def test_the_eviction_is_counted_once_by_its_workloads_reason() -> None:
    job = queued_job()
    evicted = workload(
        job, admitted=4, conditions=[condition("Evicted", reason="Preempted", at=CREATED)]
    )
    queues: dict[str, Queue | None] = {job["metadata"]["uid"]: Queue(True, [evicted])}
    reasons = ("Preempted", figures.OTHER)
    before = {r: REGISTRY.get_sample_value(EVICTIONS, {"reason": r}) for r in reasons}
    assert before[figures.OTHER] is not None  # served at 0 from the start
    saved = metrics.QUEUE.queue
    metrics.QUEUE.queue = lambda j: queues.get(j["metadata"]["uid"])
    try:
        metrics.status_written(queue_admitted("Admitted"), queue_admitted("Evicted"), job)
        # Its next writes, and a restarted leader's, plan from Evicted: not again.
        metrics.status_written(queue_admitted("Evicted"), queue_admitted("Evicted"), job)
        # A job whose queue cannot be read is counted all the same, as Other.
        metrics.status_written(queue_admitted("Admitted"), queue_admitted("Evicted"), {})
    finally:
        metrics.QUEUE.queue = saved
    after = {r: REGISTRY.get_sample_value(EVICTIONS, {"reason": r}) for r in reasons}
    assert after == {r: (before[r] or 0.0) + 1 for r in before}


# -- the workers above the admission ---------------------------------------------------------


def test_workers_within_the_admission_are_not_above_it() -> None:
    job = queued_job()
    queue = Queue(True, [workload(job, admitted=3)])
    assert figures.workers_above_admission(job, queue, workers(3)) == 0
    assert figures.workers_above_admission(job, queue, workers(2)) == 0
    assert figures.workers_above_admission(job, queue, workers(5)) == 2


def test_only_live_workers_count() -> None:
    job = queued_job()
    queue = Queue(True, [workload(job, admitted=1)])
    pods = [
        pod("job-launcher", role=names.ROLE_LAUNCHER),
        pod("job-worker-0"),
        pod("job-worker-1", terminating=True),
        pod("job-worker-2", phase="Succeeded"),
        pod("job-worker-3", phase="Failed"),
        pod("job-worker-4", phase="Pending"),  # it holds its requests: it counts
    ]
    assert figures.live_workers(pods) == 2
    assert figures.workers_above_admission(job, queue, pods) == 1


def test_without_a_workload_admitted_every_live_worker_is_above() -> None:
    job = queued_job()
    waiting = Queue(True, [workload(job)])
    assert figures.workers_above_admission(job, waiting, workers(2)) == 2
    assert figures.workers_above_admission(job, Queue(True, []), workers(2)) == 2
    assert figures.workers_above_admission(job, Queue(installed=False), workers(2)) == 2
    finished = workload(job, admitted=4, conditions=[condition("Finished", reason="Succeeded")])
    assert figures.workers_above_admission(job, Queue(True, [finished]), workers(2)) == 2
    assert figures.workers_above_admission(job, waiting, []) == 0


def test_an_eviction_holds_the_admission_until_its_quota_is_given_back() -> None:
    job = queued_job()
    evicted = workload(job, admitted=3, conditions=[condition("Evicted", reason="Preempted")])
    # Still reserved: the job runs on, as admitted, to the end of its checkpoint window.
    assert figures.workers_above_admission(job, Queue(True, [evicted]), workers(3)) == 0
    # The admission cleared (kueue_writes, once the pods are gone): none is admitted.
    del evicted["status"]["admission"]
    assert figures.workers_above_admission(job, Queue(True, [evicted]), workers(3)) == 3


def test_a_workload_shrunk_in_place_admits_its_own_count() -> None:
    job = queued_job()
    shrunk = workload(job, admitted=4)
    for pod_set in shrunk["spec"]["podSets"]:
        if pod_set["name"] == kueue.WORKER:
            pod_set["count"] = 2
    assert figures.workers_above_admission(job, Queue(True, [shrunk]), workers(3)) == 1


@pytest.mark.parametrize("count", ["4", "four", -1, 2**40, None, True, "1" * 5000])
def test_a_count_kueue_did_not_write_is_read_as_a_number_or_none(count: Any) -> None:
    job = queued_job()
    w = workload(job, admitted=4)
    w["status"]["admission"]["podSetAssignments"][1]["count"] = count
    found = figures.workers_above_admission(job, Queue(True, [w]), workers(5))
    assert found in (1, 5)  # 4 admitted, or the Workload's own count of 4, or none


def scraped(
    jobs: list[dict[str, Any]],
    queues: Mapping[str, Queue | None],
    pods: Mapping[str, list[dict[str, Any]]],
) -> dict[tuple[str, str], float]:
    """The per-job gauge of one scrape of these jobs (the collector's callbacks set as the
    controller sets them, to the caches)."""
    collector = metrics._QueueDetails(metrics._JobStates())
    collector._jobs.jobs = lambda: jobs
    collector.queue = lambda job: queues[job["metadata"]["uid"]]
    collector.pods = lambda _ns, uid: pods.get(uid, [])
    (found,) = collector.collect()
    assert found.name == ABOVE
    return {(s.labels["namespace"], s.labels["mpijob"]): s.value for s in found.samples}


def test_the_gauge_is_per_job_kueue_holds_that_is_neither_finished_nor_deleted() -> None:
    fine, above, outside, done, going = (
        queued_job(n) for n in ("fine", "above", "outside", "done", "going")
    )
    done["status"] = {"conditions": [condition("Succeeded")]}
    going["metadata"]["deletionTimestamp"] = "2026-12-01T10:05:00Z"
    queues: dict[str, Queue | None] = {
        "fine-uid": Queue(True, [workload(fine, admitted=2)]),
        "above-uid": Queue(True, [workload(above)]),
        "outside-uid": None,  # not Kueue's
        "done-uid": Queue(True, []),
        "going-uid": Queue(True, []),
    }
    pods = {uid: workers(2) for uid in queues}
    values = scraped([fine, above, outside, done, going], queues, pods)
    ns = fine["metadata"]["namespace"]
    assert values == {(ns, "fine"): 0, (ns, "above"): 2}


def test_a_job_that_names_no_queue_is_kueues_only_where_kueue_gives_it_one() -> None:
    labelled, plain = queued_job("labelled"), make_job(2, name="plain")
    queue = Queue(True, [])
    defaulted = Queue(True, [], unlabelled=kueue.DEFAULT_LOCAL_QUEUE)
    assert kueue.queued(labelled, queue) is queue
    assert kueue.queued(labelled, None) is None
    assert kueue.queued(plain, queue) is None
    assert kueue.queued(plain, defaulted) is defaulted
    values = scraped([labelled, plain], {"labelled-uid": queue, "plain-uid": queue}, {})
    assert set(values) == {(labelled["metadata"]["namespace"], "labelled")}


def test_a_job_whose_reading_raises_costs_only_its_own_series() -> None:
    fine, broken = queued_job("fine"), queued_job("broken")
    del broken["metadata"]["uid"]
    skipped = REGISTRY.get_sample_value(total(metrics.SKIPPED_JOBS)) or 0.0
    queues: dict[str, Queue | None] = {"fine-uid": Queue(True, [workload(fine, admitted=2)])}
    values = scraped([broken, fine], queues, {"fine-uid": workers(3)})
    assert values == {(fine["metadata"]["namespace"], "fine"): 1}
    assert REGISTRY.get_sample_value(total(metrics.SKIPPED_JOBS)) == skipped + 1
