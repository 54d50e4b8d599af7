"""Capacity on the real local cluster (issue 13): with every node full the scheduler
cannot place a new worker, which is given up after the job's timeout with the scheduler's
own message and tried again once the backoff is over; a node that is cordoned or tainted
as going away has its workers moved off gracefully."""

from __future__ import annotations

import time

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import RemoteShells, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_membership import fill, hosts, running_with_shells, unfill
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd")


@pytest.fixture
def job(cluster: Cluster, shared_namespace: str) -> Job:
    """A job in a namespace of the module's shared controller (tests/controller.py)."""
    return Job(cluster, shared_namespace, "spot")


def test_an_unschedulable_worker_is_given_up_then_tried_again(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 2)
    manifest["metadata"]["annotations"][names.ANN_SCALE_OUT_TIMEOUT] = "3"
    job.create(manifest)
    job.wait_hosts(2)
    new = names.worker_name(job.name, 2)
    try:
        fill(cluster)
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
        assert "were not running within 3s" in job.wait_event("ScaleOutTimedOut")
    finally:
        unfill(cluster)
    # The next attempt, after the 3 s backoff, finds room.
    wait_for(lambda: job.hosts() == hosts(job, 0, 1, 2), 30, "scaled out on the retry")
    retried = time.monotonic() - created
    wait_for(
        lambda: (job.condition("Scaling") or {}).get("reason") == "ScalingComplete",
        10,
        "Scaling complete",
    )
    print(f"FIGURE given up {given_up:.2f}s after create (timeout 3s); running {retried:.2f}s")


@pytest.mark.parametrize("notice", ["cordon", "taint"])
def test_workers_move_off_a_node_that_is_going_away(
    cluster: Cluster, job: Job, shells: RemoteShells, notice: str
) -> None:
    """A node is cordoned (``kubectl drain`` does that first) or tainted as going away:
    the worker there leaves discovery, its replacement starts on another node at once, and
    the old worker goes once its rank left. The job keeps its size throughout."""
    running_with_shells(job, shells, 3)
    victim = names.worker_name(job.name, 1)
    pods = job.pods()
    node = pods[victim]["spec"]["nodeName"]
    # The scheduler may have put more than one worker there: all of them move.
    moving = sorted(n for n, p in pods.items() if p["spec"].get("nodeName") == node)
    staying = sorted(set(pods) - set(moving))
    try:
        started = time.monotonic()
        if notice == "cordon":
            cluster.kubectl("cordon", node)
        else:
            cluster.kubectl("taint", "node", node, "karpenter.sh/disrupted=:NoSchedule")

        ended: dict[str, float] = {}
        ranked: list[str] = []

        # As Horovod would, the test starts a rank on each replacement once it is listed, and
        # lets an unlisted host's ranks go at its reset (host_rules.py: a rank-holder leaves
        # only once a new host holds ranks; one host-list change at a time, so with several
        # workers on the node their replacements may be listed one after the other).
        def moved_out() -> bool:
            listed = [h.rsplit(":", 1)[0] for h in job.hosts()]
            for name in listed:
                if name not in staying + moving + ranked:
                    shells.start(name)
                    ranked.append(name)
            for name in moving:
                if name not in listed and name not in ended:
                    # The worker is still there to let its ranks go.
                    assert name in job.workers(), f"{name} deleted before its rank left"
                    ended[name] = shells.end(name)
            return len(listed) == 3 and not set(moving) & set(listed)

        wait_for(moved_out, 60, f"{moving} replaced in discover_hosts.sh")
        assert len(ranked) == len(moving), (ranked, moving)
        unlisted = time.monotonic() - started
        for name in job.workers():
            if name not in moving:
                assert job.pods()[name]["spec"]["nodeName"] != node
        left = max(ended.values())
        wait_for(lambda: not set(moving) & set(job.workers()), 15, f"{moving} deleted")
        gone = time.monotonic()
    finally:
        if notice == "cordon":
            cluster.kubectl("uncordon", node)
        else:
            cluster.kubectl("taint", "node", node, "karpenter.sh/disrupted-", check=False)
    listed = [h.rsplit(":", 1)[0] for h in job.hosts()]
    assert len(listed) == 3
    assert set(staying) <= set(listed), "a worker on another node was moved"
    print(
        f"FIGURE {notice}: {moving} replaced in discovery {unlisted:.2f}s after the notice; "
        f"deleted {gone - left:.2f}s after their ranks left"
    )


def test_a_job_without_elastic_bounds_stays_on_a_cordoned_node(cluster: Cluster, job: Job) -> None:
    job.create(mpijob(job.name, 2))
    job.wait_hosts(2)
    node = job.pods()[names.worker_name(job.name, 1)]["spec"]["nodeName"]
    uids = job.uids()
    try:
        cluster.kubectl("cordon", node)
        time.sleep(3)
        assert job.uids() == uids
        assert len(job.hosts()) == 2
    finally:
        cluster.kubectl("uncordon", node)
