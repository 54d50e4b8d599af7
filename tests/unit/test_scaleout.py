"""Scale-out timeout (issue 13, part 2): new workers that do not run are given up, the job
runs below its requested size and says why, and tries again with backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Create, DeletePod
from mpijob_elastic.core.sizing.capacity import Backoff, next_backoff, parse_backoff
from tests.unit.simulation import Cluster, make_job

UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        }
    ],
}


def elastic(replicas: int, timeout: str = "10", **more: str) -> Cluster:
    annotations = {
        names.ANN_MIN_REPLICAS: "1",
        names.ANN_MAX_REPLICAS: "8",
        names.ANN_SCALE_OUT_TIMEOUT: timeout,
        **more,
    }
    c = Cluster(make_job(replicas, annotations=annotations))
    c.converge()
    return c


def created_pods(c: Cluster) -> list[str]:
    return [a.obj["metadata"]["name"] for a in c.plan().of_type(Create) if a.obj["kind"] == "Pod"]


def cm_annotations(c: Cluster) -> dict[str, str]:
    cm = c.get("ConfigMap", "job-config")
    assert cm is not None
    return dict(cm["metadata"].get("annotations") or {})


def scaling(c: Cluster) -> dict[str, str]:
    return next(x for x in c.job["status"]["conditions"] if x["type"] == "Scaling")


def test_backoff_round_trips_and_doubles_up_to_an_hour() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = next_backoff(None, now, 10, "Unschedulable: no GPU")
    assert (first.attempts, first.retry_at) == (1, now + timedelta(seconds=10))
    assert parse_backoff(first.format()) == first
    third = next_backoff(next_backoff(first, now, 10, "x"), now, 10, "x")
    assert third.retry_at == now + timedelta(seconds=40)
    many = Backoff(30, now, "x")
    assert next_backoff(many, now, 600, "x").retry_at == now + timedelta(hours=1)
    assert parse_backoff("junk") is None
    assert parse_backoff(None) is None


def test_a_worker_that_never_runs_is_given_up_and_retried_with_backoff() -> None:
    c = elastic(2)
    c.set_replicas(3)
    c.apply(c.plan())
    c.objects[("Pod", "job-worker-2")]["status"] = dict(UNSCHEDULABLE)
    c.tick(9)
    assert not c.plan().of_type(DeletePod)
    c.tick(1)
    p = c.plan()
    assert [d.name for d in p.of_type(DeletePod)] == ["job-worker-2"]
    assert created_pods(c) == []
    c.apply(p)
    c.finalize_deletions()
    warning = next(e for e in c.events if e.reason == "ScaleOutTimedOut")
    assert "job-worker-2 were not running within 10s" in warning.message
    assert "Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in (
        warning.message
    )
    assert c.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3, "never written back"
    assert cm_annotations(c)[names.ANN_SCALE_OUT_BACKOFF].startswith("1 ")
    cond = scaling(c)
    assert cond["reason"] == "ScaleOutBackoff"
    assert "running 2 of 3 workers" in cond["message"]
    # No new worker until the backoff is over, then one more attempt.
    c.apply(c.plan())
    assert created_pods(c) == []
    c.tick(10)
    assert created_pods(c) == ["job-worker-2"]
    c.apply(c.plan())
    c.objects[("Pod", "job-worker-2")]["status"] = dict(UNSCHEDULABLE)
    c.tick(10)
    c.apply(c.plan())
    assert cm_annotations(c)[names.ANN_SCALE_OUT_BACKOFF].startswith("2 ")
    c.finalize_deletions()
    c.tick(20)
    # Capacity came back: the worker runs, the backoff and its annotation are gone.
    c.converge()
    assert names.ANN_SCALE_OUT_BACKOFF not in cm_annotations(c)
    assert scaling(c)["reason"] == "ScalingComplete"


def test_a_job_without_elastic_bounds_waits_for_its_workers_however_long() -> None:
    c = Cluster(make_job(2, annotations={names.ANN_SCALE_OUT_TIMEOUT: "10"}))
    c.apply(c.plan())
    for name in ("job-worker-0", "job-worker-1"):
        c.objects[("Pod", name)]["status"] = dict(UNSCHEDULABLE)
    c.tick(3600)
    assert not c.plan().of_type(DeletePod)


def test_zero_waits_forever() -> None:
    c = elastic(1, timeout="0")
    c.set_replicas(2)
    c.apply(c.plan())
    c.objects[("Pod", "job-worker-1")]["status"] = dict(UNSCHEDULABLE)
    c.tick(3600)
    assert not c.plan().of_type(DeletePod)
