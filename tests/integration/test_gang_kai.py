"""KAI-Scheduler's PodGroup on the real local cluster (issue 32).

KAI's Go module is refused by this machine's Go proxy, so KAI's scheduler, pod grouper and
webhooks do not run here: the API server holds KAI's PodGroup CRD, written from KAI
v0.17.0's published schema (config/gang/kai-podgroup-crd.yaml), and this test checks that
the controller's PodGroup is accepted by it, owned by its job, names the job's queue and
priority class, follows ``min-replicas`` and the queue label without touching the status
KAI writes, and that the pods carry what KAI reads. As under Volcano, the pods name a
scheduler that does not run and wait unscheduled. The shape itself is checked in
tests/unit/test_gang_podgroups.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import podgroups
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")
ARGS = ("--gang-scheduler-name", "kai-scheduler")


def _path(job: Job) -> str:
    return f"/apis/{podgroups.KAI_API_VERSION}/namespaces/{job.ns}/podgroups/{job.name}"


def _spec(cluster: Cluster, job: Job) -> dict[str, Any]:
    return dict(((cluster.raw("GET", _path(job)) or {}).get("spec")) or {})


def _job(name: str) -> dict[str, Any]:
    manifest = elastic_job(name, 3, min_replicas="2", max_replicas="4")
    manifest["metadata"]["labels"] = {podgroups.KAI_QUEUE_LABEL: "research"}
    manifest["spec"]["runPolicy"] = {"schedulingPolicy": {"priorityClass": "train"}}
    return manifest


def test_gang_kai_pod_group_is_accepted_and_kept_in_step(
    cluster: Cluster, namespace: str, kai_crd: str, start_controller: StartController
) -> None:
    start_controller(namespace, args=ARGS)
    job = Job(cluster, namespace, "kai")
    job.create(_job(job.name))
    wait_for(lambda: cluster.raw("GET", _path(job)), 30, "the PodGroup")
    group = cluster.raw("GET", _path(job))
    assert group is not None
    assert group["apiVersion"] == kai_crd
    # As the server stored it, after the CRD's schema pruned and validated it.
    assert group["spec"] == {"minMember": 3, "queue": "research", "priorityClassName": "train"}
    assert group["metadata"]["ownerReferences"] == [
        {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": job.name,
            "uid": job.get()["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert group["metadata"]["annotations"][names.ANN_MIN_REPLICAS] == "2"

    # Nothing waits for KAI to admit the gang: its scheduler holds the pods itself.
    wait_for(lambda: len(job.pods()) == 3 and job.pods(names.ROLE_LAUNCHER), 30, "the pods")
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    for pod in pods.values():
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
        annotations = pod["metadata"]["annotations"]
        assert annotations[podgroups.KAI_GROUP_ANNOTATION] == job.name
        assert annotations[podgroups.KAI_SKIP_PODGROUPER_ANNOTATION] == "true"
    # No KAI scheduler runs here: the pods wait unscheduled, and nothing is reported as
    # ignored.
    time.sleep(3)
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    assert not [n for n, p in pods.items() if p["spec"].get("nodeName")]
    assert (job.condition("Unsupported") or {}).get("status") != "True"

    # What KAI's scheduler reports, written through the status subresource as KAI does.
    reported = {
        "schedulingConditions": [
            {
                "type": "UnschedulableOnNodePool",
                "status": "True",
                "nodePool": "default",
                "transitionID": "0",
                "reasons": [{"reason": "OverLimit", "message": "queue research is full"}],
            }
        ]
    }
    cluster.raw("PATCH", f"{_path(job)}/status", {"status": reported})

    # A new minimum reaches the PodGroup, and KAI's status stays.
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
    wait_for(lambda: _spec(cluster, job).get("minMember") == 4, 30, "minMember 4")
    in_step = time.monotonic() - changed
    group = cluster.raw("GET", _path(job))
    assert group is not None
    assert group["spec"] == {"minMember": 4, "queue": "research", "priorityClassName": "train"}
    assert group["status"] == reported
    print(f"FIGURE min-replicas 2 -> 3: PodGroup minMember 3 -> 4 in {in_step:.2f}s")

    # So does a new queue label.
    cluster.kubectl(
        "label",
        "--overwrite",
        names.PLURAL,
        job.name,
        "-n",
        namespace,
        f"{podgroups.KAI_QUEUE_LABEL}=team-b",
    )
    wait_for(lambda: _spec(cluster, job).get("queue") == "team-b", 30, "queue team-b")

    # Suspended: the PodGroup goes with the pods; resumed: it is back.
    job.patch({"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: cluster.raw("GET", _path(job)) is None, 30, "the PodGroup deleted")
    wait_for(lambda: job.pods() == {}, 30, "the pods deleted")
    job.patch({"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: _spec(cluster, job).get("minMember") == 4, 30, "the PodGroup back")
