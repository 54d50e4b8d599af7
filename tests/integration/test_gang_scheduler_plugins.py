"""Gangs of the minimum under the real scheduler-plugins coscheduling scheduler (issue 23):
the job's PodGroup and pods, a scale-in under the gang scheduler that still drains before
it deletes, a deleted pod replaced inside the gang, and a job that grows past its
PodGroup's minMember when room appears (docs/scheduling.md). Two elastic jobs whose
minimums do not both fit on one node never deadlock: e2e/test_gang_kind.py, on KWOK and on
kind."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import podgroups
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.gang import GANG_TAINT, bound, on_node
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")
GPU = "nvidia.com/gpu"


def _gang_job(name: str, node: str, scheduler: str) -> dict[str, Any]:
    """Elastic, 3 to 4 workers of 1 GPU each, wanting 4, as training-operator 1.9's users
    write it for the scheduler-plugins chart's scheduler."""
    manifest = elastic_job(name, 4, drain="5", min_replicas="3", max_replicas="4")
    on_node(manifest, node, 1, scheduler)
    return manifest


def _pod_group(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    return cluster.raw(
        "GET",
        f"/apis/{podgroups.SCHEDULER_PLUGINS_API_VERSION}/namespaces/{ns}/podgroups/{name}",
    )


def _gpus_held(job: Job) -> int:
    return sum(
        int(p["spec"]["containers"][0]["resources"]["requests"].get(GPU, 0))
        for name, p in job.pods().items()
        if name in bound(job.pods()) and not p["metadata"].get("deletionTimestamp")
    )


def _filler_bound(cluster: Cluster, namespace: str) -> bool:
    pod = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods/filler") or {}
    return bool((pod.get("spec") or {}).get("nodeName"))


def test_gang_a_job_under_the_coscheduling_scheduler(
    cluster: Cluster,
    namespace: str,
    scheduler_plugins: str,
    gang_node: str,
    start_controller: StartController,
) -> None:
    start_controller(namespace, args=("--gang-scheduler-name", "scheduler-plugins"))
    job = Job(cluster, namespace, "gang-a")
    job.create(_gang_job(job.name, gang_node, scheduler_plugins))

    # The PodGroup: the minimum and the launcher, owned by the job.
    found = functools.partial(_pod_group, cluster, namespace, job.name)
    wait_for(found, 30, f"{job.name} PodGroup")
    group = _pod_group(cluster, namespace, job.name)
    assert group is not None
    assert group["spec"] == {
        "minMember": 4,
        "minResources": {"cpu": "400m", GPU: "3"},
    }
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("MPIJob", job.name, True)
    wait_for(lambda: len(job.hosts()) == 4, 60, f"{job.name} at 4")
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    assert len(pods) == 5, sorted(pods)
    for pod in pods.values():
        assert pod["metadata"]["labels"][podgroups.SCHEDULER_PLUGINS_LABEL] == job.name
        assert pod["spec"]["schedulerName"] == scheduler_plugins
    assert len(bound(job.pods())) == 4

    # A scale-in under the gang scheduler drains before it deletes, as without one.
    job.set_workers(3)
    job.wait_hosts(3, timeout=20)
    wait_for(lambda: len(job.workers()) == 3, 30, "the drained worker deleted")
    job.wait_event("Draining")
    job.wait_event("WorkerDeleted")
    assert [r for t, r, _ in job.events() if t == "Warning"] == []

    _a_deleted_pod_is_replaced(cluster, namespace, job)
    _grows_past_the_gang_when_room_appears(cluster, namespace, job, gang_node)


def test_a_pod_group_the_job_does_not_control_gets_none_of_its_pods(
    cluster: Cluster,
    namespace: str,
    scheduler_plugins: str,
    gang_node: str,
    start_controller: StartController,
) -> None:
    """Issue 31 §3: pods join a gang by its name alone, and anyone who may create PodGroups
    in the namespace can make one named as a job. The job makes no pod while the name is
    held, says so, and takes the name back once the holder is gone."""
    foreign = {
        "apiVersion": podgroups.SCHEDULER_PLUGINS_API_VERSION,
        "kind": podgroups.KIND,
        "metadata": {"name": "gang-held"},
        "spec": {"minMember": 1},
    }
    cluster.apply(foreign, namespace)
    start_controller(namespace, args=("--gang-scheduler-name", "scheduler-plugins"))
    job = Job(cluster, namespace, "gang-held")
    manifest = elastic_job(job.name, 1, min_replicas="1")
    on_node(manifest, gang_node, 1, scheduler_plugins)
    job.create(manifest)
    message = job.wait_event("WriteRefused", "Warning", f"PodGroup {job.name}")
    assert "no pod is made" in message, message
    assert (job.condition("WriteRefused") or {}).get("reason") == "AlreadyExists"
    time.sleep(3)
    assert (job.pods(), job.pods(names.ROLE_LAUNCHER)) == ({}, {})
    assert "ownerReferences" not in (_pod_group(cluster, namespace, job.name) or {})["metadata"]

    # Its owner removes it: the job makes its own, then its pods.
    cluster.kubectl(
        "delete",
        f"podgroups.{podgroups.SCHEDULER_PLUGINS_API_VERSION.split('/')[0]}",
        job.name,
        "-n",
        namespace,
    )
    wait_for(lambda: len(job.hosts()) == 1, 60, f"{job.name} at 1")
    group = _pod_group(cluster, namespace, job.name)
    assert group is not None
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("MPIJob", job.name)
    wait_for(
        lambda: (job.condition("WriteRefused") or {}).get("status") == "False",
        30,
        "WriteRefused False",
    )


def _a_deleted_pod_is_replaced(cluster: Cluster, namespace: str, waiting: Job) -> None:
    # A pod the scheduler's preemption (or Volcano's reclaim) deletes is a pod deleted like
    # any other (docs/membership.md): it leaves discover_hosts.sh at once, its name is
    # retired (its ranks may have died listed, and Horovod blacklists such a name), and a
    # replacement under another name takes its place, inside the gang.
    victim = names.worker_name(waiting.name, 0)
    assert f"{victim}:1" in waiting.hosts()
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

    def replaced() -> bool:
        listed = waiting.hosts()
        return len(listed) == 3 and f"{victim}:1" not in listed

    wait_for(replaced, 60, f"{victim} replaced")
    waiting.wait_event("WorkerRetired", text=victim)


def _grows_past_the_gang_when_room_appears(
    cluster: Cluster, namespace: str, waiting: Job, gang_node: str
) -> None:
    # Grown past the gang pod by pod: at 3 workers (its minMember with the launcher) and
    # the node's last GPU taken by another pod, the job asks for 4; the 4th worker waits
    # alone (the gang is already in place) and runs as soon as the GPU is free.
    filler = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "filler"},
        "spec": {
            "nodeSelector": {GANG_TAINT: gang_node},
            "tolerations": [{"key": GANG_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}},
                }
            ],
        },
    }
    cluster.apply(filler, namespace)
    wait_for(lambda: _filler_bound(cluster, namespace), 30, "the filler on the last GPU")
    waiting.set_workers(4)

    def refused() -> list[str]:
        return [
            name
            for name, p in waiting.pods().items()
            if any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        ]

    # The scheduler has tried the 4th worker and found no room: it is not listed.
    (fourth,) = wait_for(refused, 30, "the 4th worker refused by the scheduler")
    assert len(waiting.hosts()) == 3, waiting.hosts()
    assert f"{fourth}:1" not in waiting.hosts()
    cluster.kubectl("delete", "pod", "filler", "-n", namespace, "--grace-period=0", "--force")
    freed = time.monotonic()
    wait_for(lambda: len(waiting.hosts()) == 4, 60, f"{waiting.name} grown to 4")
    print(
        f"FIGURE GPU freed -> {waiting.name} grown 3 -> 4 listed: {time.monotonic() - freed:.2f}s"
    )
