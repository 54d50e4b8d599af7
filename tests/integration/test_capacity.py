"""Elastic by capacity on the real local cluster (issue 21, docs/capacity.md): the real
kube-scheduler places, refuses and preempts the workers on a KWOK node of 8 GPUs that only
these tests use. Two opportunistic jobs split the idle GPUs as documented; a job without
the annotation stays at its Worker replicas. The job's Preempted Event names the pod of
higher priority, from the scheduler's own Event. (The preemption by a higher-priority workload,
judged from the mock Horovod driver, is e2e/test_capacity.py.)"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster, fake_gpu_node
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")

NODE = "kwok-capacity"
TAINT = "example.com/capacity"
GPUS = 8
ARGS = ("--growth-backoff-max-seconds", "20")


@pytest.fixture
def gpu_node(cluster: Cluster) -> Iterator[str]:
    """A fake node with 8 GPUs, tainted so that only the tests' workers go there."""
    cluster.kubectl("apply", "-f", str(ROOT / "config" / "default" / "priority_class.yaml"))
    cluster.apply(fake_gpu_node(NODE, GPUS, TAINT))
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=60s")
    yield NODE
    cluster.kubectl("delete", "node", NODE, "--wait=false", check=False)


def gpu_job(name: str, workers: int, maximum: int, grows: bool = True) -> dict[str, Any]:
    """Workers of one GPU each on the test's node; the launcher anywhere else."""
    manifest = elastic_job(name, workers, min_replicas="1", max_replicas=str(maximum))
    if grows:
        manifest["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]
    # The manifest's roles share one template: the launcher keeps its own, without GPUs.
    worker["template"] = copy.deepcopy(worker["template"])
    spec = worker["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    spec["tolerations"] = [{"key": TAINT, "operator": "Exists"}]
    for container in spec["containers"]:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return manifest


def elastic(job: Job) -> dict[str, Any]:
    return dict(job.get().get("status", {}).get("elastic") or {})


def opportunistic_pods(job: Job) -> list[dict[str, Any]]:
    return [
        p
        for p in job.pods().values()
        if (p["metadata"].get("labels") or {}).get(names.LABEL_OPPORTUNISTIC) == "true"
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_two_opportunistic_jobs_split_the_idle_gpus(
    cluster: Cluster, namespace: str, gpu_node: str, start_controller: StartController
) -> None:
    start_controller(namespace, args=ARGS)
    first, second = Job(cluster, namespace, "early"), Job(cluster, namespace, "late")
    first.create(gpu_job(first.name, 1, GPUS))
    # Alone, the first job takes every idle GPU: 1 baseline worker and 7 opportunistic.
    first.wait_hosts(GPUS, timeout=90)
    wait_for(lambda: elastic(first).get("opportunistic") == GPUS - 1, 20, "7 opportunistic")
    pods = opportunistic_pods(first)
    assert {p["spec"].get("priorityClassName") for p in pods} == {"mpijob-elastic-opportunistic"}
    assert {p["spec"].get("priority") for p in pods} == {-100}
    budget = cluster.raw(
        "GET",
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/"
        f"{names.disruption_budget_name(first.name)}",
    )
    assert budget is not None
    assert budget["spec"]["selector"]["matchExpressions"] == [
        {"key": names.LABEL_OPPORTUNISTIC, "operator": "DoesNotExist"}
    ]
    # A newcomer at the same priority: its baseline worker preempts an opportunistic one
    # of the first job, then the first gives workers back one at a time until the two
    # hold opportunistic counts at most one apart: 6 places above the baselines, 3 each.
    second.create(gpu_job(second.name, 1, GPUS))

    def split() -> tuple[int, int] | None:
        counts = (elastic(first).get("opportunistic"), elastic(second).get("opportunistic"))
        listed = len(first.hosts()) + len(second.hosts())
        return counts if counts == (3, 3) and listed == GPUS else None

    wait_for(split, 180, "a 3/3 split of the 6 idle GPUs")
    for reason in ("Grew", "Preempted", "FairShare"):
        first.wait_event(reason)
    # The scheduler's own Preempted Event on the victim names the newcomer's baseline
    # worker (its opportunistic ones never preempt); the job's Event passes the name on.
    preempted = [m for _, r, m in first.events() if r == "Preempted"]
    assert len(preempted) == 1, preempted
    assert f"preempted by {namespace}/{second.name}-worker-0;" in preempted[0], preempted
    second.wait_event("Grew")
    # It stays split: neither job grows into the other's share.
    time.sleep(10)
    counts = (elastic(first).get("opportunistic"), elastic(second).get("opportunistic"))
    assert counts == (3, 3)


def test_a_forged_growth_state_holds_no_job_back(
    cluster: Cluster, namespace: str, gpu_node: str, start_controller: StartController
) -> None:
    """Issue 31 §3: the fair split reads a growth state only from a ConfigMap its job
    controls. A tenant's ConfigMaps named as jobs' ConfigMaps, labelled as ours or as
    training-operator's, say a job with no opportunistic worker has been refused since
    2099: read, they would hold every opportunistic job to one worker above that."""
    hungry = "0 1 2099-01-01T00:00:00.000000Z 2099-01-01T00:00:00.000000Z refused"
    for name, labels in (
        ("ghost", names.object_labels("ghost", None)),
        ("phantom", {names.LABEL_APP: "phantom"}),
    ):
        forged = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": names.config_map_name(name),
                "labels": labels,
                "annotations": {names.ANN_GROWTH: hungry},
            },
        }
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(forged))
    start_controller(namespace, args=ARGS)
    job = Job(cluster, namespace, "alone")
    job.create(gpu_job(job.name, 1, GPUS))
    job.wait_hosts(GPUS, timeout=90)
    wait_for(lambda: elastic(job).get("opportunistic") == GPUS - 1, 20, "7 opportunistic")
    assert [r for _, r, _ in job.events() if r == "FairShare"] == []


def test_a_job_without_the_annotation_stays_at_its_replicas(
    cluster: Cluster, namespace: str, gpu_node: str, start_controller: StartController
) -> None:
    start_controller(namespace, args=ARGS)
    job = Job(cluster, namespace, "fixed")
    job.create(gpu_job(job.name, 2, GPUS, grows=False))
    job.wait_hosts(2)
    # Room for 6 more for as long as a growing job takes to fill it (about 10 s here).
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(lambda: len(job.pods()) > 3, 15, "growth")
    assert job.hosts() == [f"{job.name}-worker-0:1", f"{job.name}-worker-1:1"]
    assert opportunistic_pods(job) == []
    assert "opportunistic" not in elastic(job)
    cm = cluster.raw(
        "GET", f"/api/v1/namespaces/{namespace}/configmaps/{names.config_map_name(job.name)}"
    )
    assert names.ANN_GROWTH not in ((cm or {}).get("metadata", {}).get("annotations") or {})
    assert all("priorityClassName" not in p["spec"] for p in job.pods().values())


def test_a_node_that_turns_ready_ends_a_hungry_jobs_pause(
    cluster: Cluster, namespace: str, gpu_node: str, start_controller: StartController
) -> None:
    # Every new node starts tainted node.kubernetes.io/not-ready (the API server's
    # admission) until its kubelet reports Ready: a probe at its creation is refused, and
    # a refusal pauses growth. The node's room counts from the moment the taint goes.
    start_controller(namespace, args=("--growth-backoff-max-seconds", "300"))
    job = Job(cluster, namespace, "ready")
    manifest = gpu_job(job.name, 1, 3)
    pool = {"capacity-pool": namespace}
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = pool
    cluster.kubectl("label", "node", gpu_node, f"capacity-pool={namespace}")
    late = f"kwok-capacity-{namespace}"
    # The test's node has one GPU for this job: a pod of priority 0 (above the probes,
    # never preempted by them) holds the others.
    holder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holder"},
        "spec": {
            "nodeSelector": pool,
            "tolerations": [{"key": TAINT, "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": str(GPUS - 1)}},
                }
            ],
        },
    }
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(holder))
        job.create(manifest)
        job.wait_hosts(1, timeout=60)
        wait_for(lambda: "GrowthBackedOff" in {r for _, r, _ in job.events()}, 60, "a refusal")
        added = time.monotonic()
        cluster.apply(fake_gpu_node(late, 2, TAINT, pool))
        wait_for(lambda: len(job.hosts()) == 3, 60, "the job on the new node's GPUs")
        # A wake at the node's creation meets its taint (KWOK's kubelet reports Ready
        # a moment later): a refused probe, and a pause of 20 s from then (the second
        # refusal). Woken when the taint goes, the job grows at once.
        grew = time.monotonic() - added
        assert grew < 10, f"grew {grew:.1f}s after the node was added"
        backed_off = [m for _, r, m in job.events() if r == "GrowthBackedOff"]
        assert not any("not-ready" in m for m in backed_off), backed_off
    finally:
        cluster.kubectl("delete", "node", late, "--wait=false", check=False)
        cluster.kubectl("label", "node", gpu_node, "capacity-pool-", check=False)
