"""Kueue seen from outside (docs/operations.md), on the local cluster with a real Kueue
(tests/kueue.py): a queue-labelled job's wait for admission, Kueue's evictions by reason
and the workers above the admission, as the controller's /metrics serves them.

One job is admitted, preempted by a job of higher priority, admitted again once that one
is deactivated, and succeeds: two Workloads waited (each observed once: the first not
again at its second admission nor when it is finished), two evictions with Kueue's
reasons, and never a worker above what Kueue admitted in any scrape on the way. Runs
after tests/integration/test_kueue.py (file order), whose first test needs the cluster
without Kueue's API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import figures
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.machinery import metrics
from tests.cluster import Cluster
from tests.controller import StartController, free_port, wait_for
from tests.integration.test_controller import Job
from tests.integration.test_kueue import KUEUE, Queues, admitted, gpu_job, reason
from tests.integration.test_observability import Scrape
from tests.metric_names import family, total

pytestmark = pytest.mark.usefixtures("crd", "kueue")

WAIT = family(metrics.ADMISSION_WAIT_SECONDS)
EVICTIONS = total(metrics.EVICTIONS)
(ABOVE,) = [f.name for f in metrics.QUEUE.collect()]


@pytest.fixture
def two_gpus(cluster: Cluster, namespace: str) -> Iterator[Queues]:
    """A ClusterQueue with quota for one job of two one-GPU workers."""
    made = Queues(cluster, namespace, gpus=2)
    yield made
    made.delete()


class Watched:
    """Scrapes of one controller; every scrape's workers above the admission are kept."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.above: list[tuple[str, float]] = []

    def scrape(self) -> Scrape:
        found = Scrape(self.port, self.token)
        for sample in found.families[ABOVE].samples:
            self.above.append((sample.labels["mpijob"], sample.value))
        return found

    def waits(self) -> float:
        return self.scrape().value(f"{WAIT}_count", admission=figures.START)

    def evictions(self, why: str) -> float:
        return self.scrape().value(EVICTIONS, reason=why)

    def served_for(self) -> set[str]:
        return {s.labels["mpijob"] for s in self.scrape().families[ABOVE].samples}


def workload(queues: Queues, job: Job) -> dict[str, Any]:
    (found,) = queues.workloads(job)
    return found


def pods_ready(queues: Queues, job: Job) -> bool:
    return any(
        c["type"] == "PodsReady" and c["status"] == "True"
        for c in (workload(queues, job).get("status") or {}).get("conditions") or []
    )


def waited(w: dict[str, Any]) -> float:
    """The Workload's wait as its own times on the server say."""
    (admitted_at,) = [c for c in w["status"]["conditions"] if c["type"] == "Admitted"]
    created = parse_time(w["metadata"]["creationTimestamp"])
    since = parse_time(admitted_at["lastTransitionTime"])
    assert created is not None
    assert since is not None
    return (since - created).total_seconds()


def test_queue_wait_evictions_and_workers_above_admission_on_a_real_kueue(
    cluster: Cluster,
    namespace: str,
    two_gpus: Queues,
    start_controller: StartController,
    metrics_token: str,
) -> None:
    port = free_port()
    start_controller(namespace, args=("--metrics-port", str(port)))
    watched = Watched(port, metrics_token)
    wait_for(lambda: watched.waits() == 0, 30, "/metrics served")
    assert {watched.evictions(r) for r in (*figures.EVICTION_REASONS, figures.OTHER)} == {0}

    # Admitted: its wait observed once its pods run (the PodsReady write), from its
    # Workload's own times.
    first = Job(cluster, namespace, "first")
    first.create(gpu_job(first.name, 2))
    wait_for(lambda: two_gpus.workloads(first), 30, "the first's Workload")
    wait_for(lambda: admitted(workload(two_gpus, first)), 30, "the first admitted")
    first.wait_hosts(2)
    wait_for(lambda: pods_ready(two_gpus, first), 60, "the first's PodsReady")
    wait_for(lambda: watched.waits() == 1, 10, "the first's wait observed")
    first_wait = waited(workload(two_gpus, first))
    scrape = watched.scrape()
    assert scrape.value(f"{WAIT}_sum", admission=figures.START) == first_wait
    assert scrape.value(f"{WAIT}_count", admission=figures.GROWTH) == 0
    assert watched.served_for() == {first.name}

    # Preempted by a job of higher priority: one eviction, Kueue's reason.
    urgent = Job(cluster, namespace, "urgent")
    urgent.create(gpu_job(urgent.name, 2, priority="high"))
    wait_for(lambda: reason(first, "QueueAdmitted") == "Evicted", 30, "the first evicted")
    wait_for(lambda: watched.evictions("Preempted") == 1, 10, "the preemption counted")
    urgent.wait_hosts(2, timeout=60)
    wait_for(lambda: pods_ready(two_gpus, urgent), 60, "the urgent's PodsReady")
    wait_for(lambda: watched.waits() == 2, 10, "the urgent's wait observed")
    assert watched.served_for() == {first.name, urgent.name}

    # Deactivated (`kubectl patch workload ... spec.active=false`): a second eviction, by
    # its own reason; the first is admitted again once the urgent's pods are gone.
    name = workload(two_gpus, urgent)["metadata"]["name"]
    cluster.raw(
        "PATCH", f"{KUEUE}/namespaces/{namespace}/workloads/{name}", {"spec": {"active": False}}
    )
    wait_for(lambda: reason(urgent, "QueueAdmitted") == "Evicted", 30, "the urgent evicted")
    wait_for(lambda: watched.evictions("Deactivated") == 1, 10, "the deactivation counted")
    first.wait_hosts(2, timeout=60)
    wait_for(lambda: reason(first, "QueueAdmitted") == "Admitted", 30, "the first admitted again")

    # It succeeds: the controller marks its Workload Finished, a write that carries the
    # admission and PodsReady on.
    first.cluster.kubectl(
        "annotate", "pod", names.launcher_name(first.name), "-n", namespace,
        "kwok.mpijob-elastic.io/exit-code=0",
    )  # fmt: skip
    wait_for(lambda: reason(first, "Succeeded") == "MPIJobSucceeded", 30, "the first succeeded")
    wait_for(
        lambda: any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in workload(two_gpus, first)["status"]["conditions"]
        ),
        30,
        "the first's Workload finished",
    )
    # A finished job's quota went with it: it has no workers above the admission to show.
    assert watched.served_for() == {urgent.name}

    # Its Workload was observed at its first admission and not again (PodsReady is never
    # turned back); each eviction was counted once, whatever the turns since.
    time.sleep(3)
    scrape = watched.scrape()
    assert scrape.value(f"{WAIT}_count", admission=figures.START) == 2
    assert scrape.value(EVICTIONS, reason="Preempted") == 1
    assert scrape.value(EVICTIONS, reason="Deactivated") == 1
    assert scrape.value(EVICTIONS, reason=figures.OTHER) == 0
    # No scrape on the way saw a worker above what Kueue admitted.
    seen = {job for job, _ in watched.above}
    assert seen == {first.name, urgent.name}
    assert [(job, v) for job, v in watched.above if v != 0] == []
    print(
        f"FIGURE queue: first waited {first_wait:.0f}s, urgent "
        f"{scrape.value(f'{WAIT}_sum', admission=figures.START) - first_wait:.0f}s; "
        f"{len(watched.above)} samples of workers above the admission, all 0"
    )
