"""Issue 23 on the real local cluster with a real Kueue (tests/kueue.py): a `kubeflow.org/v1`
MPIJob labelled for a Kueue queue is held until Kueue admits the Workload this controller
writes for it, runs on the admitted flavor's nodes at the admitted size, and gives its quota
back only once its pods are gone."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob_elastic.core import kueue, names
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd", "kueue")

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"


class Queues:
    """A ResourceFlavor, a ClusterQueue with quota for ``gpus`` GPUs and a LocalQueue, all
    named after the test's namespace."""

    def __init__(self, cluster: Cluster, namespace: str, gpus: int) -> None:
        self.cluster, self.ns, self.name = cluster, namespace, namespace
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": self.name},
                "spec": {
                    "nodeLabels": {"type": "kwok"},
                    "tolerations": [
                        {
                            "key": "example.com/gpu-pool",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ],
                },
            }
        )
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": self.name},
                "spec": {
                    "namespaceSelector": {},
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", GPU],
                            "flavors": [
                                {
                                    "name": self.name,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "100"},
                                        {"name": GPU, "nominalQuota": str(gpus)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            }
        )
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "gpus", "namespace": namespace},
                "spec": {"clusterQueue": self.name},
            }
        )
        for priority, value in (("low", 100), ("high", 1000)):
            cluster.apply(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": priority},
                    "value": value,
                }
            )
        wait_for(self._active, 30, "ClusterQueue active")

    def _active(self) -> bool:
        cq = self.cluster.raw("GET", f"{KUEUE}/clusterqueues/{self.name}") or {}
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (cq.get("status") or {}).get("conditions") or []
        )

    def gpus_used(self) -> int:
        """The GPUs the ClusterQueue counts as reserved (status.flavorsReservation)."""
        cq = self.cluster.raw("GET", f"{KUEUE}/clusterqueues/{self.name}") or {}
        for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
            for resource in flavor.get("resources") or []:
                if resource["name"] == GPU:
                    return int(resource["total"])
        return 0

    def workloads(self, job: Job) -> list[dict[str, Any]]:
        listed = self.cluster.raw("GET", f"{KUEUE}/namespaces/{self.ns}/workloads") or {}
        uid = job.get()["metadata"]["uid"]
        return [
            w
            for w in listed.get("items") or []
            if any(r.get("uid") == uid for r in w["metadata"].get("ownerReferences") or [])
        ]

    def delete(self) -> None:
        for kind in ("clusterqueues", "resourceflavors"):
            self.cluster.raw("DELETE", f"{KUEUE}/{kind}/{self.name}")


@pytest.fixture
def queues(cluster: Cluster, namespace: str) -> Any:
    made = Queues(cluster, namespace, gpus=6)
    yield made
    made.delete()


def gpu_job(name: str, workers: int, priority: str = "low", **kw: Any) -> dict[str, Any]:
    """An MPIJob for LocalQueue `gpus`, each worker asking for one GPU."""
    manifest = mpijob(name, workers, **kw)
    manifest["metadata"]["labels"] = {
        kueue.QUEUE_LABEL: "gpus",
        kueue.PRIORITY_LABEL: priority,
    }
    specs = manifest["spec"]["mpiReplicaSpecs"]
    launcher = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
    worker = {
        "name": "main",
        "image": "busybox",
        "resources": {"requests": {"cpu": "1", GPU: "1"}, "limits": {GPU: "1"}},
    }
    specs["Launcher"]["template"] = {"spec": {"containers": [launcher]}}
    specs["Worker"]["template"] = {"spec": {"containers": [worker]}}
    return manifest


def admitted(workload: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Admitted" and c["status"] == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def live_workers(job: Job) -> list[str]:
    return sorted(n for n, p in job.pods().items() if not p["metadata"].get("deletionTimestamp"))


def test_kueue_admits_resumes_on_flavor_and_releases_quota_after_pods(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    start_controller(namespace)
    job = Job(cluster, namespace, "fixed")
    job.create(gpu_job(job.name, 2))
    wait_for(lambda: queues.workloads(job), 30, "the job's Workload")
    (workload,) = queues.workloads(job)
    sets = {p["name"]: p for p in workload["spec"]["podSets"]}
    assert (sets["launcher"]["count"], sets["worker"]["count"]) == (1, 2)
    assert workload["spec"]["priority"] == 100
    assert workload["metadata"]["ownerReferences"][0]["controller"] is True
    wait_for(lambda: admitted(queues.workloads(job)[0]), 30, "Workload admitted")
    job.wait_hosts(2)
    # Kueue writes the ClusterQueue's status a moment after the admission.
    wait_for(lambda: queues.gpus_used() == 2, 30, "2 GPUs reserved")
    for pod in (*job.pods().values(), *job.pods(names.ROLE_LAUNCHER).values()):
        assert pod["spec"]["nodeSelector"] == {"type": "kwok"}
        assert {"key": "example.com/gpu-pool", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "spec"
        ]["tolerations"]
    cond = job.condition("QueueAdmitted")
    assert cond is not None
    assert cond["status"] == "True", cond

    # Kueue evicts the Workload (here: deactivated, as `kubectl patch` of spec.active does).
    name = workload["metadata"]["name"]
    cluster.raw(
        "PATCH", f"{KUEUE}/namespaces/{namespace}/workloads/{name}", {"spec": {"active": False}}
    )
    reserved_while_pods: list[bool] = []

    def stopped() -> bool:
        pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
        if pods:
            (wl,) = queues.workloads(job)
            reserved_while_pods.append((wl.get("status") or {}).get("admission") is not None)
        return not pods

    wait_for(stopped, 60, "the evicted job's pods gone")
    # The Workload kept its admission, so Kueue counted the quota in use, while any pod was
    # there.
    assert reserved_while_pods
    assert all(reserved_while_pods), reserved_while_pods
    wait_for(lambda: queues.gpus_used() == 0, 30, "quota released")
    (workload,) = queues.workloads(job)
    assert (workload.get("status") or {}).get("admission") is None
    cond = job.condition("QueueAdmitted")
    assert cond is not None
    assert cond["reason"] == "Evicted", cond
