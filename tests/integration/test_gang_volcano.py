"""Volcano's PodGroup on the real local cluster (issue 23).

Volcano's Go modules cannot be fetched on this machine, so Volcano's scheduler and
controllers do not run here: the API server holds Volcano's PodGroup CRD, written from
Volcano's published schema (config/gang/volcano-podgroup-crd.yaml), and these tests check
that the controller's PodGroups are accepted by it, owned by their jobs, kept in step with
``min-replicas``, dropped on suspend, and that the pods carry what Volcano reads. The
PodGroup's shape against training-operator 1.9's is byte-compared in
tests/unit/test_gang_podgroups.py. Without the CRD the job says so and makes no pod.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import podgroups
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.gang import VOLCANO_CRD, install_crd
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")
CRD_NAME = "podgroups.scheduling.volcano.sh"
ARGS = ("--gang-scheduler-name", "volcano")


def _pod_group(cluster: Cluster, job: Job) -> dict[str, Any] | None:
    return cluster.raw(
        "GET",
        f"/apis/{podgroups.VOLCANO_API_VERSION}/namespaces/{job.ns}/podgroups/{job.name}",
    )


def _enqueue(cluster: Cluster, job: Job) -> None:
    """What Volcano's enqueue action does once the gang fits its queue: the PodGroup's
    phase becomes Inqueue (its CRD has no status subresource)."""
    path = f"/apis/{podgroups.VOLCANO_API_VERSION}/namespaces/{job.ns}/podgroups/{job.name}"
    cluster.raw("PATCH", path, {"status": {"phase": "Inqueue"}})


def _job(name: str) -> dict[str, Any]:
    manifest = elastic_job(name, 3, min_replicas="2", max_replicas="4")
    manifest["spec"]["runPolicy"] = {
        "schedulingPolicy": {"queue": "research", "priorityClass": "high"}
    }
    for role, replica in manifest["spec"]["mpiReplicaSpecs"].items():
        gpus = {"nvidia.com/gpu": "1"} if role == "Worker" else {}
        replica["template"] = {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {
                            "requests": {"cpu": "250m", "memory": "1Gi", **gpus},
                            "limits": gpus,
                        },
                    }
                ]
            }
        }
    return manifest


def test_gang_volcano_without_its_crd_the_job_says_so_and_makes_no_pod(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    try:
        controller = start_controller(namespace, args=ARGS)
        job = Job(cluster, namespace, "no-crd")
        job.create(_job(job.name))

        def refused() -> bool:
            cond = job.condition("WriteRefused") or {}
            return cond.get("status") == "True"

        wait_for(refused, 30, "WriteRefused")
        cond = job.condition("WriteRefused") or {}
        assert cond["message"].startswith("create PodGroup no-crd: "), cond
        assert "PodGroup CRD is not installed" in cond["message"], cond
        job.wait_event("WriteRefused", text="PodGroup CRD is not installed")
        # The gang is written before its pods: without it, none is made.
        time.sleep(3)
        assert job.pods() == {}
        assert job.pods(names.ROLE_LAUNCHER) == {}
        assert "PodGroup is not served" in controller.logs()
        assert controller.proc is not None
        assert controller.proc.poll() is None
    finally:
        install_crd(cluster, VOLCANO_CRD, CRD_NAME, CRD_NAME)


def test_gang_volcano_pod_group_is_accepted_and_kept_in_step(
    cluster: Cluster, namespace: str, volcano_crd: str, start_controller: StartController
) -> None:
    start_controller(namespace, args=ARGS)
    job = Job(cluster, namespace, "volcano")
    job.create(_job(job.name))
    wait_for(lambda: _pod_group(cluster, job), 30, "the PodGroup")
    group = _pod_group(cluster, job)
    assert group is not None
    uid = job.get()["metadata"]["uid"]
    assert group["spec"] == {
        "minMember": 3,
        "queue": "research",
        "priorityClassName": "high",
        "minResources": {"cpu": "750m", "memory": "3Gi", "nvidia.com/gpu": "2"},
    }
    assert group["metadata"]["ownerReferences"] == [
        {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": job.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    # The job's own annotations, copied as training-operator copies them.
    assert group["metadata"]["annotations"][names.ANN_MIN_REPLICAS] == "2"
    # No pod before Volcano admits the gang, as training-operator makes none.
    time.sleep(3)
    assert job.pods() == {}
    assert job.pods(names.ROLE_LAUNCHER) == {}
    _enqueue(cluster, job)
    # The pods name their gang and task for Volcano, and its scheduler.
    wait_for(lambda: len(job.pods()) == 3 and job.pods(names.ROLE_LAUNCHER), 30, "the pods")
    for role, pods in (
        (names.ROLE_WORKER, job.pods()),
        (names.ROLE_LAUNCHER, job.pods(names.ROLE_LAUNCHER)),
    ):
        for pod in pods.values():
            assert pod["spec"]["schedulerName"] == "volcano"
            annotations = pod["metadata"]["annotations"]
            assert annotations[podgroups.VOLCANO_GROUP_ANNOTATION] == job.name
            assert annotations[podgroups.VOLCANO_TASK_ANNOTATION] == role
    # No Volcano scheduler runs here: the pods wait unscheduled, and nothing is reported
    # as ignored.
    assert (job.condition("Unsupported") or {}).get("status") != "True"

    # A new minimum reaches the PodGroup (training-operator's never changes after a scale).
    changed = time.monotonic()
    cluster.kubectl(
        "annotate",
        "--overwrite",
        names.PLURAL,
        job.name,
        "-n",
        namespace,
        f"{names.ANN_MIN_REPLICAS}=3",
    )
    wait_for(
        lambda: ((_pod_group(cluster, job) or {}).get("spec") or {}).get("minMember") == 4,
        30,
        "minMember 4",
    )
    in_step = time.monotonic() - changed
    group = _pod_group(cluster, job)
    assert group is not None
    assert group["spec"]["minResources"] == {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": "3"}
    print(f"FIGURE min-replicas 2 -> 3: PodGroup minMember 3 -> 4 in {in_step:.2f}s")

    # Suspended: the PodGroup goes with the pods; resumed: it is back.
    job.patch({"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: _pod_group(cluster, job) is None, 30, "the PodGroup deleted")
    wait_for(lambda: job.pods() == {}, 30, "the pods deleted")
    job.patch({"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: _pod_group(cluster, job) is not None, 30, "the PodGroup back")
    _enqueue(cluster, job)
    wait_for(lambda: len(job.pods()) == 3, 30, "the pods back")


def test_gang_a_pod_group_training_operator_made_is_taken_over_and_kept_in_step(
    cluster: Cluster, namespace: str, volcano_crd: str, start_controller: StartController
) -> None:
    """A job training-operator 1.9 ran has its PodGroup already, without any label: it is
    the job's own (its controller ownerReference says so), updated in place, not made
    again."""
    job = Job(cluster, namespace, "taken-over")
    job.create(_job(job.name))
    uid = job.get()["metadata"]["uid"]
    owner = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    cluster.apply(
        {
            "apiVersion": podgroups.VOLCANO_API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": job.name, "ownerReferences": [owner]},
            # What training-operator writes for the job's 3 workers and launcher.
            "spec": {"minMember": 4, "queue": "team-queue", "minResources": {}},
            "status": {"phase": "Running"},
        },
        namespace,
    )
    before = _pod_group(cluster, job)
    assert before is not None
    start_controller(namespace, args=ARGS)
    wait_for(
        lambda: ((_pod_group(cluster, job) or {}).get("spec") or {}).get("minMember") == 3,
        30,
        "the PodGroup updated to the job's minimum",
    )
    after = _pod_group(cluster, job)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    # Its queue is kept, as training-operator keeps an existing PodGroup's queue.
    assert after["spec"]["queue"] == "team-queue"
    wait_for(lambda: len(job.pods()) == 3, 30, "the pods")
    assert (job.condition("WriteRefused") or {}).get("status") != "True"
