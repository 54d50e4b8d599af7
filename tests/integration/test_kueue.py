"""Issue 23 on the real local cluster with a real Kueue (tests/kueue.py): a `kubeflow.org/v1`
MPIJob labelled for a Kueue queue is held until Kueue admits the Workload this controller
writes for it, runs on the admitted flavor's nodes at the admitted size, and gives its quota
back only once its pods are gone."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle.notices import parse_notice
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.times import parse_time
from tests import hostile
from tests.cluster import ROOT, Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job
from tests.integration.test_rbac_proof import RunAs, run_as  # noqa: F401 (a fixture)
from tests.manifests import AdmissionPolicy, mpijob

# The first test runs before the session's Kueue is started (tests run in file order; the
# `kueue` fixture is session-wide and installs Kueue's API): it checks the cluster without it.
pytestmark = pytest.mark.usefixtures("crd")

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
CHECKPOINT = 3


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

    def summary(self, job: Job) -> list[str]:
        """The job's Workloads, one line each, for a failing test's message."""
        lines = []
        for w in self.workloads(job):
            status = w.get("status") or {}
            conds = ",".join(
                f"{c['type']}={c['status']}/{c.get('reason')}"
                for c in status.get("conditions") or []
            )
            sets = {p["name"]: p["count"] for p in w["spec"]["podSets"]}
            psa = [
                (a["name"], a.get("count"))
                for a in (status.get("admission") or {}).get("podSetAssignments") or []
            ]
            lines.append(f"{w['metadata']['name']} {sets} admission={psa} {conds}")
        return lines

    def delete(self) -> None:
        for kind in ("clusterqueues", "resourceflavors"):
            self.cluster.raw("DELETE", f"{KUEUE}/{kind}/{self.name}")


@pytest.fixture
def queues(cluster: Cluster, namespace: str) -> Any:
    made = Queues(cluster, namespace, gpus=6)
    yield made
    made.delete()


def gpu_job(
    name: str, workers: int, priority: str = "low", drain: str | None = None, **kw: Any
) -> dict[str, Any]:
    """An MPIJob for LocalQueue `gpus`, each worker asking for one GPU."""
    manifest = mpijob(name, workers, **kw)
    # An eviction is stopped a checkpoint window after it (the notice first).
    manifest["metadata"]["annotations"][names.ANN_CHECKPOINT_SECONDS] = str(CHECKPOINT)
    if drain is not None:
        manifest["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = drain
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


class Eviction:
    """Samples of an evicted job until its pods are gone: whether its Workloads held their
    admission while any pod was there, and the notice each pod carried, before and once
    it was being deleted."""

    def __init__(self, queues: Queues, job: Job, window: int = CHECKPOINT) -> None:
        self.queues, self.job, self.window = queues, job, window
        self.reserved: list[bool] = []
        # A sample where every pod carried the job-stopping notice and none was deleted.
        self.noticed_before_deletes = False
        # Pods seen being deleted without the notice.
        self.unnoticed: set[str] = set()
        self.started = time.monotonic()
        self.noticed_after: float | None = None
        self.deleted_after: float | None = None
        self.deleted_at: datetime | None = None
        # The notice's deadline: the end of the checkpoint window.
        self.deadline: datetime | None = None
        # When Kueue evicted the job's Workload (its Evicted condition, whole seconds).
        self.evicted: datetime | None = None
        # The evicted job's pods, as the first sample found them.
        self.uids: set[str] | None = None
        # Each pod's notice at the last sample.
        self.last: dict[str, bool] = {}

    def gone(self) -> bool:
        # The Workloads first: pods seen after them were there when they were read.
        workloads = self.queues.workloads(self.job)
        held = any((w.get("status") or {}).get("admission") is not None for w in workloads)
        for w in workloads:
            for c in (w.get("status") or {}).get("conditions") or []:
                if (c["type"], c["status"]) == ("Evicted", "True") and self.evicted is None:
                    self.evicted = parse_time(c.get("lastTransitionTime"))
        pods = {**self.job.pods(), **self.job.pods(names.ROLE_LAUNCHER)}
        if self.uids is None:
            self.uids = {p["metadata"]["uid"] for p in pods.values()}
        # The pods of the job readmitted since (same names, new UIDs) are not these.
        pods = {n: p for n, p in pods.items() if p["metadata"]["uid"] in self.uids}
        noticed = {name: _queue_evicted(pod) is not None for name, pod in pods.items()}
        for pod in pods.values():
            self.deadline = self.deadline or _queue_evicted(pod)
        deleting = {n for n, p in pods.items() if p["metadata"].get("deletionTimestamp")}
        # A pod gone since the last sample (KWOK removes one at once) was deleted as it was
        # then; one being deleted, as it is now.
        vanished = {n: was for n, was in self.last.items() if n not in pods}
        for name, was in [*vanished.items(), *((n, noticed[n]) for n in deleting)]:
            if not was:
                self.unnoticed.add(name)
        if (vanished or deleting) and self.deleted_after is None:
            self.deleted_after = time.monotonic() - self.started
            self.deleted_at = datetime.now(UTC)
        self.last = noticed
        if not pods:
            return True
        self.reserved.append(held)
        if all(noticed.values()) and not deleting and not vanished:
            self.noticed_before_deletes = True
            if self.noticed_after is None:
                self.noticed_after = time.monotonic() - self.started
        return False

    def check(self) -> None:
        # Kueue counted the quota in use while any pod was there.
        assert self.reserved
        assert all(self.reserved), self.reserved
        assert self.noticed_before_deletes, "every pod noticed before any was deleted"
        assert not self.unnoticed, self.unnoticed
        # Deleted at the deadline the notice gave, not before, and that deadline a whole
        # window after Kueue's eviction (the test's own clock starts only once it saw the
        # eviction, which may be seconds late on a loaded machine).
        assert self.deleted_at is not None
        assert self.deadline is not None
        assert self.deleted_at >= self.deadline, (self.deleted_at, self.deadline)
        assert self.evicted is not None
        window = timedelta(seconds=self.window)
        assert self.deadline >= self.evicted + window, (self.deadline, self.evicted)

    def figures(self) -> str:
        return (
            f"notice seen after {self.noticed_after or 0:.1f}s, "
            f"first delete seen after {self.deleted_after or 0:.1f}s"
        )


def _queue_evicted(pod: dict[str, Any]) -> datetime | None:
    """The deadline of the job-stopping notice of a Kueue eviction the pod carries."""
    found = parse_notice((pod["metadata"].get("annotations") or {}).get(names.ANN_NOTICE))
    if found is None or (found[0], found[2]) != ("job-stopping", "queue-evicted"):
        return None
    return found[1]


def admitted(workload: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Admitted" and c["status"] == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def live_workers(job: Job) -> list[str]:
    return sorted(n for n, p in job.pods().items() if not p["metadata"].get("deletionTimestamp"))


def test_kueue_absent_a_queue_labelled_job_is_held_and_told_why(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    groups = cluster.raw("GET", "/apis") or {}
    assert "kueue.x-k8s.io" not in [g["name"] for g in groups.get("groups") or []], (
        "run this test before the session's Kueue starts"
    )
    start_controller(namespace)
    job = Job(cluster, namespace, "queued")
    job.create(gpu_job(job.name, 2))
    wait_for(lambda: reason(job, "QueueAdmitted") == "KueueNotInstalled", 30, "the condition")
    # Events are recorded in the background, after the status (machinery/events.py).
    wait_for(
        lambda: ("Warning", "KueueNotInstalled") in [(t, r) for t, r, _ in job.events()],
        30,
        "the Warning Event",
    )
    suspended = job.condition("Suspended")
    assert suspended is not None
    assert suspended["status"] == "True"
    time.sleep(1)
    assert job.pods() == {}
    assert job.pods(names.ROLE_LAUNCHER) == {}
    # An unlabelled job beside it runs as ever.
    other = Job(cluster, namespace, "plain")
    other.create(mpijob(other.name, 2))
    other.wait_hosts(2)


@pytest.mark.usefixtures("kueue")
def test_kueue_not_granted_a_queue_labelled_job_is_held_and_told_why(
    cluster: Cluster,
    namespace: str,
    run_as: RunAs,  # noqa: F811 (the fixture imported above)
) -> None:
    """The controller as a ServiceAccount with the shipped roles but not
    config/rbac/kueue.yaml: it runs, and tells queue-labelled jobs why they wait."""
    controller = run_as(None)
    wait_for(lambda: "caches synced" in controller.logs(), 120, "the controller's caches")
    assert "Kueue's API is served but not granted" in controller.logs()
    job = Job(cluster, namespace, "queued")
    job.create(gpu_job(job.name, 2))
    wait_for(lambda: reason(job, "QueueAdmitted") == "KueueNotPermitted", 30, "the condition")
    assert "config/rbac/kueue.yaml" in (job.condition("QueueAdmitted") or {})["message"]
    job.wait_event("KueueNotPermitted", "Warning")
    assert job.pods() == {}
    other = Job(cluster, namespace, "plain")
    other.create(mpijob(other.name, 2))
    other.wait_hosts(2)


@pytest.mark.usefixtures("kueue")
def test_kueue_a_workload_the_server_refuses_is_reported_as_every_refused_write(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """The Workload is one of the job's writes (core/write_order.py): the API server's
    refusal reaches the job as WriteRefused and its Warning Event, quoting the server; the
    queue condition says why the job waits. Fixed, the Workload is made and both clear."""
    start_controller(namespace)
    job = Job(cluster, namespace, "refused")
    manifest = gpu_job(job.name, 2)
    # A valid label value, but no LocalQueue name: the Workload CRD's schema refuses it.
    manifest["metadata"]["labels"][kueue.QUEUE_LABEL] = "Bad_Queue"
    job.create(manifest)
    wait_for(lambda: reason(job, "WriteRefused") == "Invalid", 30, "the refusal reported")
    message = (job.condition("WriteRefused") or {})["message"]
    assert message.startswith(f"create Workload {kueue.workload_name(job.get())}: "), message
    assert "spec.queueName" in message, message
    assert reason(job, "QueueAdmitted") == "WorkloadRefused"
    wait_for(
        lambda: ("Warning", "WriteRefused", message) in job.events(), 30, "the refusal's Event"
    )
    assert queues.workloads(job) == []
    assert job.pods() == {}
    job.patch({"metadata": {"labels": {kueue.QUEUE_LABEL: "gpus"}}})
    wait_for(lambda: queues.workloads(job), 30, "the job's Workload")
    wait_for(lambda: reason(job, "WriteRefused") == "WritesAccepted", 30, "the refusal cleared")
    assert reason(job, "QueueAdmitted") != "WorkloadRefused"


@pytest.mark.usefixtures("kueue")
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
    # What Kueue's waitForPodsReady (on in tests/kueue.py, 60 s) waits for.
    wait_for(
        lambda: any(
            c["type"] == "PodsReady" and c["status"] == "True"
            for c in (queues.workloads(job)[0].get("status") or {}).get("conditions") or []
        ),
        60,
        "PodsReady",
    )

    # Kueue evicts the Workload (here: deactivated, as `kubectl patch` of spec.active does).
    name = workload["metadata"]["name"]
    cluster.raw(
        "PATCH", f"{KUEUE}/namespaces/{namespace}/workloads/{name}", {"spec": {"active": False}}
    )
    eviction = Eviction(queues, job)
    wait_for(eviction.gone, 60, "the evicted job's pods gone")
    stopped = time.monotonic() - eviction.started
    # The job-stopping notice (queue-evicted) on every pod, a checkpoint window before the
    # deletes; the Workload kept its admission, so Kueue counted the quota in use, while
    # any pod was there.
    eviction.check()
    print(f"FIGURE deactivated: {eviction.figures()}, pods gone after {stopped:.1f}s")
    wait_for(lambda: queues.gpus_used() == 0, 30, "quota released")
    # Kueue writes the ClusterQueue's usage and the Workload's status apart, in no fixed
    # order (seen: the usage at 0 a moment before the Workload's admission was cleared).
    wait_for(
        lambda: (queues.workloads(job)[0].get("status") or {}).get("admission") is None,
        30,
        "the Workload's admission cleared",
    )
    wait_for(lambda: reason(job, "QueueAdmitted") == "Evicted", 30, "QueueAdmitted=Evicted")


@pytest.mark.usefixtures("kueue")
def test_kueue_an_admitted_jobs_launcher_is_made_with_its_workers_and_waits_in_its_pod(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Kueue's waitForPodsReady counts every pod of the job from its admission: with the
    kubectl delivery init container, which waits inside the pod, the launcher does not wait
    for its workers to run before it is made (docs/scheduling.md, "Kueue")."""
    start_controller(namespace, args=("--kubectl-delivery", "init-container"))
    job = Job(cluster, namespace, "early")
    manifest = gpu_job(job.name, 2)
    # Workers no node takes: admitted, made, never running.
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["nodeSelector"] = {"example.com/no-such-pool": "x"}
    job.create(manifest)
    wait_for(lambda: any(map(admitted, queues.workloads(job))), 30, "Workload admitted")
    launcher = names.launcher_name(job.name)
    wait_for(lambda: job.pods(names.ROLE_LAUNCHER).get(launcher), 30, "the launcher made")
    workers = job.pods()
    assert len(workers) == 2
    assert all((p.get("status") or {}).get("phase") == "Pending" for p in workers.values())
    (delivery,) = job.pods(names.ROLE_LAUNCHER)[launcher]["spec"]["initContainers"]
    assert {"name": "MIN_WORKERS", "value": "2"} in delivery["env"]
    assert job.hosts() == []


def running_admitted(cluster: Cluster, namespace: str, queues: Queues, name: str) -> Job:
    """A job of 2 workers of one GPU each, admitted and listed."""
    job = Job(cluster, namespace, name)
    job.create(gpu_job(job.name, 2))
    wait_for(lambda: any(map(admitted, queues.workloads(job))), 30, "Workload admitted")
    job.wait_hosts(2)
    return job


@pytest.mark.usefixtures("kueue")
def test_kueue_evicts_a_job_whose_tenant_wrote_what_once_froze_it(
    cluster: Cluster,
    namespace: str,
    queues: Queues,
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    # Issue 31: a launcher's report with a start in the year 10000 (and one of 20 digits),
    # and a state annotation of 5000 digits, each raised in every turn before its writes, so
    # a Kueue eviction never stopped the job while it kept its quota. Written with the
    # tenant's rights: the launcher's patch on <job>-ranks, anyone's on <job>-config.
    start_controller(namespace)
    job = running_admitted(cluster, namespace, queues, "frozen")
    hostile.report_out_of_range(cluster, namespace, job.name, tmp_path)
    hostile.state_of_5000_digits(cluster, namespace, job.name)
    (workload,) = queues.workloads(job)
    name = workload["metadata"]["name"]
    cluster.raw(
        "PATCH", f"{KUEUE}/namespaces/{namespace}/workloads/{name}", {"spec": {"active": False}}
    )
    eviction = Eviction(queues, job)
    wait_for(eviction.gone, 60, "the evicted job's pods gone")
    eviction.check()
    wait_for(lambda: reason(job, "QueueAdmitted") == "Evicted", 30, "QueueAdmitted=Evicted")
    assert (job.condition("TurnFailed") or {}).get("status") != "True"


@pytest.mark.usefixtures("kueue")
def test_kueue_a_job_edited_to_ask_for_more_than_admitted_is_stopped_and_queued_again(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    # Issue 32: the templates edited after admission ran at the new requests, above what
    # Kueue charged (the ClusterQueue counted 2 GPUs while the pods asked for 4).
    start_controller(namespace)
    job = running_admitted(cluster, namespace, queues, "edited")
    (first,) = queues.workloads(job)
    # KWOK removes a deleted pod at once: a finalizer keeps each terminating, to be read.
    held = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    for name in held:
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        cluster.raw("PATCH", path, {"metadata": {"finalizers": ["example.com/hold"]}})
    worker = job.get()["spec"]["mpiReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    container["resources"] = {"requests": {"cpu": "1", GPU: "2"}, "limits": {GPU: "2"}}
    job.patch({"spec": {"mpiReplicaSpecs": {"Worker": {"template": worker["template"]}}}})
    wait_for(lambda: reason(job, "QueueAdmitted") == "WorkloadOutdated", 30, "WorkloadOutdated")
    # Every pod told why before it went; none at the new requests meanwhile.
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in job.pods().values()),
        30,
        "every worker deleted",
    )
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    assert set(pods) == set(held)
    for name, pod in pods.items():
        found = parse_notice((pod["metadata"].get("annotations") or {}).get(names.ANN_NOTICE))
        assert found is not None, pod["metadata"]
        assert found[2] == "queue-requeued", found
        assert pod["spec"]["containers"][0]["resources"].get("limits", {}).get(GPU, "1") == "1"
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        cluster.raw("PATCH", path, {"metadata": {"finalizers": None}})

    # Requeued under a new Workload that charges the new requests, admitted (4 of 6 GPUs),
    # and run at them.
    def second() -> dict[str, Any] | None:
        return next(
            (
                w
                for w in queues.workloads(job)
                if w["metadata"]["uid"] != first["metadata"]["uid"] and admitted(w)
            ),
            None,
        )

    wait_for(second, 60, "a new Workload admitted")
    assert all(w["metadata"]["uid"] != first["metadata"]["uid"] for w in queues.workloads(job))
    job.wait_hosts(2, timeout=60)
    for pod in job.pods().values():
        assert pod["spec"]["containers"][0]["resources"]["limits"][GPU] == "2"
    wait_for(lambda: queues.gpus_used() == 4, 30, "4 GPUs reserved")


def workers_of(workload: dict[str, Any]) -> int:
    return int(next(p["count"] for p in workload["spec"]["podSets"] if p["name"] == "worker"))


def reason(job: Job, type_: str) -> str:
    return str((job.condition(type_) or {}).get("reason", ""))


def running_pods(job: Job) -> dict[str, str]:
    """The job's pods (launcher and workers) by name, with their UIDs."""
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    return {n: p["metadata"]["uid"] for n, p in pods.items()}


def in_force(queues: Queues, job: Job) -> dict[str, Any] | None:
    """The job's admitted, unfinished Workload."""
    return next(
        (
            w
            for w in queues.workloads(job)
            if admitted(w)
            and not any(
                c["type"] == "Finished" and c["status"] == "True"
                for c in (w.get("status") or {}).get("conditions") or []
            )
        ),
        None,
    )


@pytest.mark.usefixtures("kueue")
def test_kueue_partial_admission_admits_at_min_replicas(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Without workload slices an elastic job is admitted once, at what fits from
    min-replicas up."""
    start_controller(namespace)
    holder = Job(cluster, namespace, "holder")
    holder.create(gpu_job(holder.name, 4))
    holder.wait_hosts(4)
    job = Job(cluster, namespace, "partial")
    job.create(gpu_job(job.name, 6, min_replicas="2", max_replicas="6"))
    wait_for(lambda: in_force(queues, job), 30, "partial admission")
    (workload,) = queues.workloads(job)
    worker_set = next(p for p in workload["spec"]["podSets"] if p["name"] == "worker")
    assert (worker_set["count"], worker_set["minCount"]) == (6, 2)
    job.wait_hosts(2)
    wait_for(lambda: queues.gpus_used() == 6, 30, "6 GPUs reserved")
    time.sleep(2)
    assert len(live_workers(job)) == 2


def shrink_to_two(queues: Queues, first: Job) -> None:
    """The first is asked down to 2 (an autoscaler's edit): workers 2 and 3 leave the host
    list, then go; its Workload keeps counting 4 workers until they are gone, and only
    then asks for 2, which Kueue takes as the quota given back."""
    samples: list[tuple[int, int, int]] = []

    def shrunk() -> bool:
        wl = in_force(queues, first) or {}
        samples.append((len(first.hosts()), len(first.pods()), workers_of(wl) if wl else -1))
        return samples[-1] == (2, 2, 2)

    first.set_workers(2)
    wait_for(shrunk, 60, "the first shrunk to 2 and its Workload with it")
    # Hosts leave first, pods next, the Workload's count last.
    assert all(listed <= pods <= counted for listed, pods, counted in samples), samples
    assert any(listed < pods for listed, pods, _ in samples), samples
    wait_for(lambda: queues.gpus_used() == 4, 30, "4 GPUs reserved after the shrink")


@pytest.mark.usefixtures("kueue")
def test_kueue_elastic_jobs_admitted_at_min_grow_and_give_way_gracefully(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    start_controller(namespace, args=("--kueue-workload-slices",))
    first, second = Job(cluster, namespace, "first"), Job(cluster, namespace, "second")
    for job in (first, second):
        job.create(gpu_job(job.name, 2, min_replicas="2", max_replicas="6", drain="2"))
    for job in (first, second):
        job.wait_hosts(2)
        (workload,) = queues.workloads(job)
        assert workers_of(workload) == 2
        assert workload["metadata"]["annotations"][kueue.ELASTIC_ANNOTATION] == "true"
    wait_for(lambda: queues.gpus_used() == 4, 30, "4 GPUs reserved")
    # Kueue preempts the most recently admitted first, by a time in whole seconds, ties by
    # UID: the first's slices must come in a later second than the second's admission (in
    # the same one, under load, Kueue once preempted the second).
    (workload,) = queues.workloads(second)
    reserved = kueue.condition(workload, "QuotaReserved") or {}
    at = parse_time(reserved.get("lastTransitionTime"))
    assert at is not None, reserved
    wait_for(lambda: datetime.now(UTC) >= at + timedelta(seconds=1), 5, "a second later")

    # The first asks for 6: it grows by slices into the 2 GPUs left, and asks on for more.
    before = running_pods(first)
    asked = time.monotonic()
    first.set_workers(6)
    first.wait_hosts(4, timeout=60)
    grown = time.monotonic() - asked
    # Grown in place: the launcher and the first two workers are the same pods.
    after = running_pods(first)
    assert {n: after.get(n) for n in before} == before
    wait_for(lambda: queues.gpus_used() == 6, 30, "6 GPUs reserved")
    assert workers_of(in_force(queues, first) or {}) == 4
    replaced = [
        w
        for w in queues.workloads(first)
        if any(
            c["type"] == "Finished" and c["reason"] == "WorkloadSliceReplaced"
            for c in (w.get("status") or {}).get("conditions") or []
        )
    ]
    assert len(replaced) == 2, [w["metadata"]["name"] for w in queues.workloads(first)]
    time.sleep(2)
    assert len(live_workers(first)) == 4
    assert queues.gpus_used() == 6

    # A higher-priority job: Kueue preempts the first (its slice was admitted last) whole;
    # it stops through its graceful suspend, and its quota is given back only once its
    # pods are gone; it comes back at its minimum, where the quota lets it.
    urgent = Job(cluster, namespace, "urgent")
    urgent.create(gpu_job(urgent.name, 2, priority="high"))
    wait_for(lambda: reason(first, "QueueAdmitted") == "Evicted", 30, "first evicted")
    eviction = Eviction(queues, first)
    wait_for(eviction.gone, 60, "the first's pods gone")
    eviction.check()
    print(f"FIGURE preempted: {eviction.figures()}")
    urgent.wait_hosts(2, timeout=60)
    first.wait_hosts(2, timeout=60)
    assert len(live_workers(second)) == 2
    wait_for(lambda: queues.gpus_used() == 6, 30, "6 GPUs reserved")
    assert workers_of(in_force(queues, first) or {}) == 2

    # The urgent job ends (its launcher exits 0): the controller finishes its Workload, and
    # the first grows into the quota that frees.
    before = running_pods(first)
    launcher = names.launcher_name(urgent.name)
    wait_for(
        lambda: (
            (urgent.pods(names.ROLE_LAUNCHER).get(launcher) or {}).get("status", {}).get("phase")
            == "Running"
        ),
        30,
        "the urgent job's launcher running",
    )
    freed = time.monotonic()
    urgent.cluster.kubectl(
        "annotate", "pod", names.launcher_name(urgent.name), "-n", namespace,
        "kwok.mpijob-elastic.io/exit-code=0",
    )  # fmt: skip
    try:
        first.wait_hosts(4, timeout=60)
    except AssertionError as err:
        raise AssertionError(
            f"{err}\n"
            + "\n".join([*queues.summary(first), *queues.summary(urgent)])
            + f"\nurgent: {urgent.get().get('status')}"
        ) from None
    regrown = time.monotonic() - freed
    after = running_pods(first)
    assert {n: after.get(n) for n in before} == before
    wait_for(lambda: queues.gpus_used() == 6, 30, "6 GPUs reserved")
    shrink_to_two(queues, first)
    for job in (first, second):
        failed = job.condition("Failed")
        assert failed is None or failed["status"] != "True", failed
    print(f"kueue: grown 2->4 in {grown:.1f}s; regrown 2->4 in {regrown:.1f}s after quota freed")


def gpus_requested(cluster: Cluster, namespace: str) -> int:
    """The GPUs the namespace's pods request that Kueue must have charged: every pod not
    ended, terminating ones included (they hold their devices until they are gone)."""
    listed = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods") or {}
    return sum(
        int(c.get("resources", {}).get("requests", {}).get(GPU, "0"))
        for p in listed.get("items") or []
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        for c in p["spec"]["containers"]
    )


def gpus_charged(cluster: Cluster, namespace: str) -> int:
    """The GPUs Kueue reserved for the namespace's Workloads: what their admissions charge
    (written with the admission, before any pod may run; the ClusterQueue's own count is
    written a moment later, in no fixed order with the pods)."""
    listed = cluster.raw("GET", f"{KUEUE}/namespaces/{namespace}/workloads") or {}
    return sum(
        int(a.get("resourceUsage", {}).get(GPU, "0"))
        for w in listed.get("items") or []
        if not any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (w.get("status") or {}).get("conditions") or []
        )
        for a in ((w.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    )


class Charged:
    """Samples of the namespace's pods against what Kueue charged: a sample where the pods
    request more GPUs than the Workloads' admissions charged both just before and just
    after (either order of a write and its count would pass) is a run beyond the
    admission."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace
        self.beyond: list[tuple[int, int]] = []
        self.samples = 0

    def sample(self) -> None:
        before = gpus_charged(self.cluster, self.ns)
        requested = gpus_requested(self.cluster, self.ns)
        counted = max(before, gpus_charged(self.cluster, self.ns))
        self.samples += 1
        if requested > counted:
            self.beyond.append((requested, counted))

    def during(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sample()
            time.sleep(0.2)

    def until(self, done: Any, timeout: float, what: str) -> None:
        def sampled() -> Any:
            self.sample()
            return done()

        wait_for(sampled, timeout, what)


@pytest.mark.usefixtures("kueue")
def test_kueue_a_deleted_job_keeps_its_quota_until_its_last_pod_is_gone(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Issue 32: deleting a job freed its quota at once (the garbage collector deleted its
    Workload) while its pods still ran out their grace period."""
    start_controller(namespace)
    job = running_admitted(cluster, namespace, queues, "deleted")
    uid = job.get()["metadata"]["uid"]
    (workload,) = queues.workloads(job)
    assert kueue.FINALIZER in workload["metadata"]["finalizers"]
    name = workload["metadata"]["name"]
    # KWOK removes a deleted pod at once: a finalizer stands in for a long grace period.
    held = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    for pod in held:
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        cluster.raw("PATCH", path, {"metadata": {"finalizers": ["example.com/hold"]}})
    wait_for(lambda: queues.gpus_used() == 2, 30, "2 GPUs reserved")
    charged = Charged(cluster, namespace)
    cluster.kubectl("delete", names.PLURAL, job.name, "-n", namespace, "--wait=false")
    wl_path = f"{KUEUE}/namespaces/{namespace}/workloads/{name}"

    def pods_deleting() -> bool:
        pods = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods") or {}
        return all(p["metadata"].get("deletionTimestamp") for p in pods.get("items") or [])

    charged.until(pods_deleting, 60, "the garbage collector deleting the job's pods")
    # The pods terminate: the Workload stays, deleted, and Kueue counts their GPUs.
    charged.during(5)
    assert charged.beyond == [], charged.beyond
    assert queues.gpus_used() == 2
    assert (cluster.raw("GET", wl_path) or {}).get("metadata", {}).get("deletionTimestamp")
    for pod in held:
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        cluster.raw("PATCH", path, {"metadata": {"finalizers": None}})
    charged.until(lambda: cluster.raw("GET", wl_path) is None, 60, "the Workload gone")
    wait_for(lambda: queues.gpus_used() == 0, 30, "the quota given back")
    assert charged.beyond == [], charged.beyond
    print(f"FIGURE deleted job: {charged.samples} samples, none beyond the charge (uid {uid})")


@pytest.mark.usefixtures("kueue")
def test_kueue_a_workload_the_controller_did_not_write_admits_no_more_than_it_charges(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Issue 32: a tenant allowed to create Workloads wrote one owned by its job, for 6
    workers charging no GPU; Kueue admitted it, the controller took it as the job's
    admission, and the job then ran 6 workers of one GPU each on a charge of 2."""
    start_controller(namespace)
    job = running_admitted(cluster, namespace, queues, "forged")
    (ours,) = queues.workloads(job)
    forged = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "forged",
            "namespace": namespace,
            "labels": dict(ours["metadata"]["labels"]),
            "annotations": {kueue.SLICE_ANNOTATION: "9"},
            "ownerReferences": ours["metadata"]["ownerReferences"],
        },
        "spec": {
            "queueName": "gpus",
            "podSets": [
                {"name": p["name"], "count": 6 if p["name"] == "worker" else 1, "template": {
                    "spec": {"containers": [{"name": "main", "image": "busybox",
                                             "resources": {"requests": {"cpu": "1"}}}]}}}
                for p in ours["spec"]["podSets"]
            ],
        },
    }  # fmt: skip
    cluster.raw("POST", f"{KUEUE}/namespaces/{namespace}/workloads", forged)
    charged = Charged(cluster, namespace)
    wl_path = f"{KUEUE}/namespaces/{namespace}/workloads/forged"

    def forged_admitted() -> bool:
        # The controller may take the forged one down within a second of its admission,
        # quicker than a poll on a loaded machine comes round; Kueue's Event stays.
        if admitted(cluster.raw("GET", wl_path) or {"status": {}}):
            return True
        selector = "involvedObject.kind=Workload,involvedObject.name=forged,reason=Admitted"
        events = cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", selector, "-o", "json"
        )
        return bool(json.loads(events.stdout)["items"])

    charged.until(forged_admitted, 30, "forged admitted")
    job.set_workers(6)
    # The job stops and is queued again under a Workload of its own, for 6 GPUs: it never
    # runs on the forged one's charge.
    charged.until(
        lambda: (
            reason(job, "QueueAdmitted") == "Admitted"
            and len(live_workers(job)) == 6
            and cluster.raw("GET", wl_path) is None
        ),
        90,
        "the job running 6 workers under its own Workload",
    )
    charged.during(3)
    assert charged.beyond == [], charged.beyond
    (own,) = queues.workloads(job)
    assert own["metadata"]["uid"] != ours["metadata"]["uid"]
    assert workers_of(own) == 6
    assert queues.gpus_used() == 6
    print(f"FIGURE forged Workload: {charged.samples} samples, none beyond the charge")


@pytest.mark.usefixtures("kueue")
def test_kueue_an_opportunistic_queued_job_runs_only_what_kueue_admitted(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Issue 32: opportunistic growth added workers above the admission, at the job's
    PriorityClass, that the ClusterQueue never saw."""
    cluster.kubectl("apply", "-f", str(ROOT / "config" / "default" / "priority_class.yaml"))
    start_controller(namespace)
    job = Job(cluster, namespace, "grower")
    manifest = gpu_job(job.name, 2, min_replicas="1", max_replicas="6")
    manifest["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    job.create(manifest)
    charged = Charged(cluster, namespace)
    charged.until(lambda: len(live_workers(job)) == 2, 60, "the job at its 2 admitted workers")
    wait_for(lambda: reason(job, "SpecWarnings") != "", 30, "SpecWarnings")
    assert "ignored for a job queued in Kueue without workload slices" in (
        job.condition("SpecWarnings") or {}
    ).get("message", "")
    # 4 of the ClusterQueue's GPUs stay idle: growth would take them within seconds.
    charged.during(10)
    assert charged.beyond == [], charged.beyond
    assert len(live_workers(job)) == 2
    assert queues.gpus_used() == 2


@pytest.mark.usefixtures("kueue")
def test_kueue_an_opportunistic_job_grows_through_kueue_by_workload_slices(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """With workload slices the opportunistic job asks Kueue for its maximum, a slice at a
    time: it takes the idle quota, each worker charged before it runs."""
    start_controller(namespace, args=("--kueue-workload-slices",))
    job = Job(cluster, namespace, "sliced")
    manifest = gpu_job(job.name, 2, min_replicas="1", max_replicas="6")
    manifest["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    job.create(manifest)
    charged = Charged(cluster, namespace)
    charged.until(lambda: len(live_workers(job)) == 6, 90, "the job grown to its maximum")
    wait_for(lambda: queues.gpus_used() == 6, 30, "6 GPUs reserved")
    assert charged.beyond == [], charged.beyond
    assert (job.condition("SpecWarnings") or {}).get("status") != "True"
    print(f"FIGURE opportunistic by slices: {charged.samples} samples, none beyond the charge")


@pytest.mark.usefixtures("kueue")
def test_kueue_a_job_without_the_queue_label_waits_in_the_default_local_queue(
    cluster: Cluster, namespace: str, queues: Queues, start_controller: StartController
) -> None:
    """Issue 32: with Kueue's manageJobsWithoutQueueName, a job without the queue label ran
    uncharged: Kueue leaves an external framework's jobs to their controller."""
    start_controller(namespace, args=("--kueue-manage-jobs-without-queue-name",))
    job = Job(cluster, namespace, "unlabelled")
    manifest = gpu_job(job.name, 2)
    manifest["metadata"]["labels"].pop(kueue.QUEUE_LABEL)
    job.create(manifest)
    charged = Charged(cluster, namespace)
    # No LocalQueue "default" yet: Kueue admits nothing, and the job waits.
    charged.until(lambda: queues.workloads(job), 30, "the job's Workload")
    (workload,) = queues.workloads(job)
    assert workload["spec"]["queueName"] == kueue.DEFAULT_LOCAL_QUEUE
    charged.during(5)
    assert job.pods() == {}
    assert job.pods(names.ROLE_LAUNCHER) == {}
    assert reason(job, "QueueAdmitted") == "Pending"
    cluster.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": kueue.DEFAULT_LOCAL_QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": queues.name},
        }
    )
    charged.until(lambda: len(live_workers(job)) == 2, 60, "the job admitted and running")
    wait_for(lambda: queues.gpus_used() == 2, 30, "2 GPUs reserved")
    assert charged.beyond == [], charged.beyond


@pytest.mark.usefixtures("kueue")
def test_kueue_the_queue_label_of_a_running_admitted_job_stays(
    cluster: Cluster,
    namespace: str,
    queues: Queues,
    start_controller: StartController,
    admission_policy: AdmissionPolicy,
) -> None:
    """Issue 32: the queue label removed from a running job took it out of Kueue's path
    (it ran uncapped) while its Workload kept the quota. The shipped policy
    (config/admission/queue-policy.yaml) refuses it while the job runs admitted."""
    for key, value in admission_policy.namespace_labels.items():
        cluster.kubectl("label", "namespace", namespace, f"{key}={value}", "--overwrite")
    start_controller(namespace)
    job = running_admitted(cluster, namespace, queues, "kept")
    unlabel = json.dumps({"metadata": {"labels": {kueue.QUEUE_LABEL: None}}})

    def refused() -> bool:
        answer = cluster.kubectl(
            "patch", names.PLURAL, job.name, "-n", namespace, "--type=merge", "-p", unlabel,
            check=False,
        )  # fmt: skip
        assert answer.returncode != 0, "the label removed from a running admitted job"
        return "mpijob-elastic-queue-label" in answer.stderr

    wait_for(refused, 30, "the policy's refusal")
    assert kueue.queue_name(job.get()) == "gpus"
    charged = Charged(cluster, namespace)
    charged.during(3)
    assert charged.beyond == [], charged.beyond
    # Suspended first, the label may go: the job stops and its quota is given back.
    job.patch({"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: live_workers(job) == [], 30, "the suspended job's workers gone")
    cluster.kubectl("patch", names.PLURAL, job.name, "-n", namespace, "--type=merge", "-p", unlabel)
    assert kueue.queue_name(job.get()) is None
