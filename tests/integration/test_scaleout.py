"""Scale-out timeout on the real local cluster (issue 13, part 2): with every node
cordoned the scheduler cannot place a new worker; it is given up after the job's timeout
with the scheduler's own message, and tried again once the backoff is over."""

from __future__ import annotations

import time

import pytest

from mpijob_elastic import names
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_membership import NODES, hosts

pytestmark = pytest.mark.usefixtures("crd")


@pytest.fixture
def job(cluster: Cluster, namespace: str) -> Job:
    return Job(cluster, namespace, "spot")


def test_an_unschedulable_worker_is_given_up_then_tried_again(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    start_controller(job.ns)
    manifest = elastic_job(job.name, 2)
    manifest["metadata"]["annotations"][names.ANN_SCALE_OUT_TIMEOUT] = "3"
    job.create(manifest)
    job.wait_hosts(2)
    new = names.worker_name(job.name, 2)
    try:
        for node in NODES:
            cluster.kubectl("cordon", node)
        job.set_workers(3)
        wait_for(lambda: new in job.workers(), 10, f"{new} created")
        created = time.monotonic()

        def backing_off() -> bool:
            cond = job.condition("Scaling") or {}
            return cond.get("reason") == "ScaleOutBackoff" and new not in job.workers()

        wait_for(backing_off, 20, "the worker given up")
        given_up = time.monotonic() - created
        cond = job.condition("Scaling") or {}
        assert "running 2 of 3 workers" in cond["message"]
        assert "Unschedulable" in cond["message"], cond["message"]
        assert job.get()["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
        warnings = [m for t, r, m in job.events() if r == "ScaleOutTimedOut"]
        assert warnings
        assert "were not running within 3s" in warnings[0]
    finally:
        for node in NODES:
            cluster.kubectl("uncordon", node)
    # The next attempt, after the 3 s backoff, finds room.
    wait_for(lambda: job.hosts() == hosts(job, 0, 1, 2), 30, "scaled out on the retry")
    retried = time.monotonic() - created
    wait_for(
        lambda: (job.condition("Scaling") or {}).get("reason") == "ScalingComplete",
        10,
        "Scaling complete",
    )
    print(f"FIGURE given up {given_up:.2f}s after create (timeout 3s); running {retried:.2f}s")
