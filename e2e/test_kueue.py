"""End to end: an elastic job under Kueue with workload slices (issue 23 §2,
docs/scheduling.md "Kueue"), judged from the launcher's side by the mock Horovod driver.

A ClusterQueue with quota for 6 GPUs; a fixed job of 4 workers holds 4 of them. The elastic
job (min 2, max 6, asking for 6) is admitted at its minimum and runs at 2. The fixed job
ends: its quota frees and the elastic job grows, one slice at a time, to 6. Asked down to 3,
it drains and gives the quota back once the workers are gone. These scale changes are
graceful: no failure, no blacklist in the driver's record. Then a higher-priority job of 4
workers is admitted: Kueue evicts whole Workloads, so the elastic job gets the
`job-stopping` notice (cause `queue-evicted`) on every pod, its checkpoint window, and then
stops whole (its driver ends with the launcher); it is requeued at its minimum and comes
back beside the higher-priority job.

KWOK only (the driver a local process, Kueue a local process: tests/kueue.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.harness import EXIT_ANNOTATION, ElasticRun
from e2e.mockhorovod import events as ev
from e2e.test_relocation import nothing_fatal
from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle.notices import parse_notice
from mpijob_elastic.core.queueing import kueue
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for
from tests.integration.test_controller import Job
from tests.integration.test_kueue import GPU, Eviction, Queues, gpu_job, workers_of
from tests.kueue import Kueue
from tests.manifests import AdmissionPolicy, create_namespace

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
MINIMUM, MAXIMUM, QUOTA, CHECKPOINT = 2, 6, 6, 5
DRIVER_ARGS = ("-np", str(MINIMUM), "--min-np", str(MINIMUM), "--max-np", str(MAXIMUM))
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"

pytestmark = pytest.mark.usefixtures("crd")


@pytest.fixture(scope="module")
def e2e_namespace(
    cluster: Cluster, admission_policy: AdmissionPolicy, kueue: Kueue
) -> Iterator[str]:
    name = create_namespace(cluster, admission_policy.namespace_labels)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def controller(
    cluster: Cluster, e2e_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    # Started after Kueue (the e2e_namespace fixture needs it): it looks for its API once.
    proc = ControllerProcess(
        cluster,
        (e2e_namespace,),
        tmp_path_factory.mktemp("controller") / "controller.log",
        args=("--kueue-workload-slices",),
    )
    proc.start()
    yield proc
    proc.stop()


def elastic_job(name: str) -> dict[str, Any]:
    """The sample, labelled for the queue, bounds 2..6, asking for 6, a GPU a worker."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["name"] = name
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "gpus", kueue.PRIORITY_LABEL: "low"}
    job["metadata"]["annotations"].update(
        {
            names.ANN_MIN_REPLICAS: str(MINIMUM),
            names.ANN_MAX_REPLICAS: str(MAXIMUM),
            names.ANN_DRAIN_SECONDS: "15",
            names.ANN_CHECKPOINT_SECONDS: str(CHECKPOINT),
        }
    )
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replicas"] = MAXIMUM
    for container in specs["Worker"]["template"]["spec"]["containers"]:
        container["resources"] = {"requests": {"cpu": "1"}, "limits": {GPU: "1"}}
    for container in specs["Launcher"]["template"]["spec"]["containers"]:
        container["resources"] = {"requests": {"cpu": "1"}}
    return job


def graceful(run: ElasticRun, until: float) -> None:
    """No failure, blacklist or driver exit in the driver's record before ``until``."""
    bad = [
        e
        for e in run.driver_events(*ev.FAILURE_EVENTS, *ev.FATAL_EVENTS, ev.DRIVER_EXIT)
        if e["ts"] < until
    ]
    assert bad == [], bad


def launcher_running(job: Job) -> bool:
    launcher = job.pods(names.ROLE_LAUNCHER).get(names.launcher_name(job.name)) or {}
    return (launcher.get("status") or {}).get("phase") == "Running" and not launcher[
        "metadata"
    ].get("deletionTimestamp")


def in_force(queues: Queues, job: Job) -> dict[str, Any] | None:
    """The job's admitted, unfinished Workload."""
    for w in queues.workloads(job):
        conds = {c["type"]: c["status"] for c in (w.get("status") or {}).get("conditions") or []}
        if conds.get("Admitted") == "True" and conds.get("Finished") != "True":
            return w
    return None


def evicted_whole(
    run: ElasticRun, queues: Queues, elastic: Job, urgent: Job, workers: int
) -> tuple[Eviction, float]:
    """A higher-priority job of ``workers`` made: Kueue evicts the elastic job's Workload
    whole. Every pod gets the ``queue-evicted`` notice (the launcher's file too) before any
    is deleted; no failure or blacklist before the stop, which is whole (Kueue evicts
    Workloads whole). The eviction's samples, and the seconds to the launcher's delete."""
    evicting = time.time()
    urgent.create(gpu_job(urgent.name, workers, priority="high"))
    wait_for(
        lambda: (elastic.condition("QueueAdmitted") or {}).get("reason") == "Evicted",
        30,
        "the elastic job evicted",
    )
    eviction = Eviction(queues, elastic, CHECKPOINT)
    launcher = names.launcher_name(elastic.name)

    def launcher_deleted() -> bool:
        eviction.gone()
        pod = elastic.pods(names.ROLE_LAUNCHER).get(launcher)
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    wait_for(launcher_deleted, 60, "the launcher deleted after the window")
    stopped_after = time.time() - evicting
    # What the launcher's containers read (the kubelet stand-in's file).
    found = parse_notice(run.notice_file.read_text().strip())
    assert found is not None
    assert (found[0], found[2]) == ("job-stopping", "queue-evicted"), found
    run.close()  # the kubelet's SIGTERM to the driver, with the launcher pod
    wait_for(eviction.gone, 60, "the elastic job's pods gone")
    eviction.check()
    graceful(run, evicting)
    assert run.driver_events(ev.HOST_BLACKLISTED) == []
    return eviction, stopped_after


def test_kueue_elastic_job_grows_shrinks_gracefully_and_stops_whole_on_eviction(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    queues = Queues(cluster, e2e_namespace, gpus=QUOTA)
    blocker = Job(cluster, e2e_namespace, "blocker")
    elastic = Job(cluster, e2e_namespace, "elastic")
    urgent = Job(cluster, e2e_namespace, "urgent")
    run = ElasticRun(
        cluster,
        e2e_namespace,
        elastic_job(elastic.name),
        tmp_path_factory.mktemp("kueue"),
        driver_args=DRIVER_ARGS,
    )
    try:
        # 1. The fixed job holds 4 of the 6 GPUs; the elastic one is admitted at 2.
        blocker.create(gpu_job(blocker.name, 4))
        wait_for(lambda: launcher_running(blocker), 60, "the fixed job running")
        run.submit()
        run.start_launcher()
        run.wait_for_size(MINIMUM, timeout=120)
        wait_for(lambda: queues.gpus_used() == QUOTA, 30, "6 GPUs reserved")
        assert workers_of(in_force(queues, elastic) or {}) == MINIMUM
        time.sleep(3)
        assert len(run.discovered()) == MINIMUM, "no quota, no growth"

        # 2. The fixed job ends: its quota frees, the elastic job grows slice by slice.
        freed = time.monotonic()
        cluster.kubectl(
            "annotate", "pod", names.launcher_name(blocker.name), "-n", e2e_namespace,
            f"{EXIT_ANNOTATION}=0",
        )  # fmt: skip
        # Slice by slice, each admitted by Kueue: longer than 180 s twice at a load of 14-17.
        run.wait_for_size(MAXIMUM, timeout=300)
        grew = time.monotonic() - freed
        wait_for(lambda: queues.gpus_used() == MAXIMUM, 30, "6 GPUs reserved by the job")
        graceful(run, time.time())

        # 3. Asked down to 3: drained, then deleted, then the quota given back.
        asked = time.monotonic()
        elastic.set_workers(3)
        run.wait_for_size(3, timeout=120)
        shrunk = time.monotonic() - asked
        wait_for(lambda: len(elastic.pods()) == 3, 60, "the drained workers deleted")
        wait_for(lambda: queues.gpus_used() == 3, 30, "3 GPUs given back")
        assert workers_of(in_force(queues, elastic) or {}) == 3
        graceful(run, time.time())
        nothing_fatal(run)
        assert run.driver_events(ev.HOST_BLACKLISTED) == []

        # 4. A higher-priority job of 4: Kueue evicts the elastic job's Workload whole.
        eviction, stopped_after = evicted_whole(run, queues, elastic, urgent, 4)

        # 5. Requeued at its minimum: back beside the higher-priority job.
        urgent.wait_hosts(4, timeout=60)
        elastic.wait_hosts(MINIMUM, timeout=120)
        wait_for(lambda: queues.gpus_used() == QUOTA, 30, "6 GPUs reserved")
        print(
            f"\nFIGURE quota freed -> {MAXIMUM} workers with ranks: {grew:.1f}s; shrink to 3 "
            f"(drained): {shrunk:.1f}s; from the Evicted condition seen: {eviction.figures()}; "
            f"launcher deleted {stopped_after:.1f}s after the urgent job's create "
            f"(window {CHECKPOINT}s)"
        )
        print(json.dumps(queues.summary(elastic)))
    finally:
        run.close()
        for job in (blocker, elastic, urgent):
            cluster.kubectl(
                "delete", "mpijob", job.name, "-n", e2e_namespace, "--wait=false", check=False
            )
        queues.delete()


@pytest.fixture
def namespace_without_slices(
    cluster: Cluster, admission_policy: AdmissionPolicy, kueue_without_slices: Kueue
) -> Iterator[str]:
    name = create_namespace(cluster, admission_policy.namespace_labels)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_kueue_without_slices_elastic_job_runs_as_partially_admitted_and_stops_whole(
    cluster: Cluster,
    namespace_without_slices: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Kueue with ElasticJobsViaWorkloadSlices off, the controller without
    --kueue-workload-slices: the elastic job is admitted once, by partial admission, at
    what fits from its minimum up, keeps that size while quota frees, and is stopped whole
    (notice first) when a higher-priority job needs its quota."""
    ns = namespace_without_slices
    controller = ControllerProcess(
        cluster, (ns,), tmp_path_factory.mktemp("controller") / "controller.log"
    )
    controller.start()
    queues = Queues(cluster, ns, gpus=QUOTA)
    blocker, elastic, urgent = (Job(cluster, ns, n) for n in ("blocker", "elastic", "urgent"))
    run = ElasticRun(
        cluster,
        ns,
        elastic_job(elastic.name),
        tmp_path_factory.mktemp("kueue-no-slices"),
        driver_args=DRIVER_ARGS,
    )
    try:
        # 1. 4 of the 6 GPUs held: admitted at 2 of the 6 asked (count 6, minCount 2).
        blocker.create(gpu_job(blocker.name, 4))
        wait_for(lambda: launcher_running(blocker), 60, "the fixed job running")
        run.submit()
        run.start_launcher()
        run.wait_for_size(MINIMUM, timeout=120)
        (workload,) = queues.workloads(elastic)
        worker_set = next(p for p in workload["spec"]["podSets"] if p["name"] == "worker")
        assert (worker_set["count"], worker_set.get("minCount")) == (MAXIMUM, MINIMUM)
        assert kueue.ELASTIC_ANNOTATION not in workload["metadata"].get("annotations", {})
        wait_for(lambda: queues.gpus_used() == QUOTA, 30, "6 GPUs reserved")

        # 2. The fixed job ends: the quota frees, but an admitted Workload keeps its size.
        cluster.kubectl(
            "annotate", "pod", names.launcher_name(blocker.name), "-n", ns,
            f"{EXIT_ANNOTATION}=0",
        )  # fmt: skip
        wait_for(lambda: queues.gpus_used() == MINIMUM, 60, "the fixed job's quota freed")
        time.sleep(5)
        assert len(run.discovered()) == MINIMUM, "no slices, no growth"
        graceful(run, time.time())

        # 3. A higher-priority job of 5: Kueue evicts the elastic job's Workload whole.
        eviction, _ = evicted_whole(run, queues, elastic, urgent, 5)
        # Requeued: 1 GPU is left beside the urgent job, less than its minimum of 2.
        urgent.wait_hosts(5, timeout=60)
        wait_for(
            lambda: all(
                (w.get("status") or {}).get("admission") is None for w in queues.workloads(elastic)
            ),
            60,
            "the elastic job's admission given back",
        )
        time.sleep(3)
        assert elastic.pods() == {}
        assert elastic.pods(names.ROLE_LAUNCHER) == {}
        assert (elastic.condition("QueueAdmitted") or {}).get("status") == "False"
        print(f"\nFIGURE without slices, from the Evicted condition seen: {eviction.figures()}")
    finally:
        run.close()
        controller.stop()
        for job in (blocker, elastic, urgent):
            cluster.kubectl("delete", "mpijob", job.name, "-n", ns, "--wait=false", check=False)
        queues.delete()
