"""Benchmark: a Kueue admission wave, and the eviction of it, beside the cluster's floor.

Issue 33's third mass change ("Kueue admits or evicts a wave"). N MPIJobs of W workers
(min W/2, max W), each labelled for a LocalQueue whose ClusterQueue has no quota yet, wait
as Workloads Kueue cannot admit. Kueue (built by hack/build-kueue.sh, run as the tests run
it: tests/kueue.py, workload slices on, but with Kueue's default PodsReady timeout, 5 min)
and our controller (with the install's default kubectl delivery, an init container, so an
admitted job's launcher is made with its workers; KWOK plays no init container) run as
processes against the local KWOK cluster, on the pool of fake nodes bench/mass.py uses.
Then:

1. **Floor** (``bench/floor.py``): N(W+1) plain pods, the wave's pod count, created by the
   32-request client to Running (``up``) and deleted to gone (``down``).
2. **Admission wave**: the ClusterQueue's quota raised to what every job asks, one patch;
   per job, the patch's answer → Kueue admitted its Workload (Kueue's share) → its host
   list right (bench/mass.py's "right": W workers listed, each alive, and its launcher).
3. **Eviction wave**: the ClusterQueue stopped (``stopPolicy: HoldAndDrain``): Kueue
   evicts every admitted Workload; per job, the patch's answer → its last pod gone. The
   jobs ask for no checkpoint window (``checkpoint-seconds: 0``; 60 s by default): the
   notice still comes before the deletes, and nothing else waits by design.

The goals are bench/mass.py's: per job p50 and max at most 1.5 times the floor (``up`` for
the admission, ``down`` for the eviction: Kueue's own admission time is in the job's
figure, not in the floor's); fair: max at most 1.5 times p50. Writes per job are counted
as bench/mass.py counts them, from the patch until the namespace was quiet.

    python -m bench.wave [--jobs 100] [--workers 8] [--kubeconfig PATH]
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from bench import floor
from bench.cluster import (
    ClusterCost,
    Controller,
    cluster,
    install_crd,
    job_manifest,
    kubectl_binary,
    machine,
    sh,
)
from bench.fleet import bounded, sizes_main, sizes_table, wait_for, watching
from bench.mass import (
    CHANGE_LIMIT,
    POOL,
    POOL_LABEL,
    SELECTOR,
    Job,
    Mass,
    floor_with_events,
    p50_max,
    per_job,
    pod_events,
    pool_nodes,
    ratios,
    slim,
)
from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import MERGE_PATCH, RESOURCES, Kube
from tests.cluster import Cluster
from tests.kueue import KueueRunner

Obj = dict[str, Any]

QUEUE = "bench-wave"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
# The controller's Workloads are named mpijob-<job>-<uid[:5]>[-<slice>].
_WORKLOAD_JOB = re.compile(r"^mpijob-(job-\d+)-")


class Admissions:
    """The jobs whose Workload the watch has seen, and when each was first seen admitted."""

    def __init__(self) -> None:
        self.queued: set[str] = set()
        self.admitted: dict[str, float] = {}
        # Evicted for not running all their pods within Kueue's PodsReady timeout.
        self.pods_ready_timeouts: set[str] = set()
        # When each job's Workload was last seen turn Evicted.
        self.evicted: dict[str, float] = {}
        # When each job's Workload was first seen PodsReady (our controller writes it).
        self.ready: dict[str, float] = {}
        # When each job was first seen evicted for its pods not ready in time.
        self.timed_out: dict[str, float] = {}

    def on_workload(self, type_: str, obj: Obj) -> None:
        match = _WORKLOAD_JOB.match(obj["metadata"]["name"])
        if match is None or type_ == "DELETED":
            return
        self.queued.add(match.group(1))
        admitted = kueue.condition(obj, "Admitted")
        if admitted is not None and admitted.get("status") == "True":
            self.admitted.setdefault(match.group(1), time.monotonic())
        ready = kueue.condition(obj, "PodsReady")
        if ready is not None and ready.get("status") == "True":
            self.ready.setdefault(match.group(1), time.monotonic())
        evicted = kueue.condition(obj, "Evicted")
        if evicted is None or evicted.get("status") != "True":
            self.evicted.pop(match.group(1), None)
            return
        self.evicted.setdefault(match.group(1), time.monotonic())
        if evicted.get("reason") == "PodsReadyTimeout":
            self.pods_ready_timeouts.add(match.group(1))
            self.timed_out.setdefault(match.group(1), time.monotonic())

    def ready_lags(self, jobs: dict[str, Job]) -> dict[str, str]:
        """Per job, its Workload admitted → PodsReady; its host list first right →
        PodsReady (our share); and, of the jobs Kueue evicted for their pods not ready,
        admitted → that eviction, and how many had their host list right before it."""
        admitted_ready = [self.ready[j] - at for j, at in self.admitted.items() if j in self.ready]
        right_ready = [
            self.ready[j] - done
            for j, job in jobs.items()
            if j in self.ready and (done := job.done) is not None
        ]
        out = {
            "admitted_to_ready_s": p50_max(admitted_ready) if admitted_ready else "-",
            "right_to_ready_s": p50_max(right_ready) if right_ready else "-",
        }
        timed = [t - self.admitted[j] for j, t in self.timed_out.items() if j in self.admitted]
        if timed:
            out["admitted_to_timeout_s"] = p50_max(timed)
            out["right_before_timeout"] = str(
                sum(
                    1
                    for j, t in self.timed_out.items()
                    if (done := jobs[j].done) is not None and done < t
                )
            )
        return out


def queues(k: list[str], namespace: str) -> None:
    """A ResourceFlavor on the pool's nodes, the ClusterQueue with no quota, the LocalQueue."""
    objects: list[Obj] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": QUEUE},
            "spec": {"nodeLabels": {POOL_LABEL: POOL}},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": QUEUE, "resources": [{"name": "cpu", "nominalQuota": "0"}]}
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": QUEUE},
        },
    ]
    sh(
        *k,
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )


def queued_job(name: str, namespace: str, workers: int) -> Obj:
    """An elastic job of one CPU a pod, for the LocalQueue, on the pool."""
    manifest = job_manifest(name, workers, max_workers=workers, min_workers=workers // 2)
    manifest["metadata"]["namespace"] = namespace
    manifest["metadata"]["labels"] = {kueue.QUEUE_LABEL: QUEUE}
    manifest["metadata"]["annotations"][names.ANN_CHECKPOINT_SECONDS] = "0"
    for role in manifest["spec"]["mpiReplicaSpecs"].values():
        spec = role["template"]["spec"]
        spec["nodeSelector"] = dict(SELECTOR)
        spec["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    return manifest


async def _quota(kube: Kube, patch: Obj) -> float:
    """Patches the ClusterQueue; the time its answer came."""
    await kube.request("PATCH", f"{KUEUE_API}/clusterqueues/{QUEUE}", patch, MERGE_PATCH)
    return time.monotonic()


def _lags(start: float, ends: dict[str, float | None]) -> list[float]:
    return [end - start for end in ends.values() if end is not None]


async def measure(kubeconfig: str, namespace: str, jobs: int, workers: int) -> dict[str, Any]:
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    kube = Kube(api)
    mass = Mass()
    admissions = Admissions()
    informers = watching(api, mass.handler, namespace, slim)
    informers.append(
        Informer(api, *RESOURCES["Workload"], admissions.on_workload, namespace=namespace)
    )
    # The install's default kubectl delivery, under which a queued job's launcher is made
    # with its workers (docs/scheduling.md). KWOK plays no init container: the launcher
    # runs at once, where a kubelet would hold it until its workers are listed.
    controller = Controller(kubeconfig, kubectl_delivery="init-container")
    pods = jobs * (workers + 1)
    result: dict[str, Any] = {"jobs": jobs, "workers": workers, "pods": pods, **machine()}
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        controller.start()
        await controller.ready()
        for i in range(jobs):
            mass.jobs[f"job-{i}"] = Job(f"job-{i}", workers, namespace)
        await bounded(
            [lambda j=j: kube.create(queued_job(j, namespace, workers)) for j in mass.jobs]
        )
        await wait_for(lambda: len(admissions.queued) == jobs, CHANGE_LIMIT, "every Workload")
        await mass.quiet()
        base = await floor_with_events(api, namespace, mass, pods, ClusterCost(kubeconfig))

        # The wave: room for every job at once.
        t0 = await _quota(
            kube,
            {
                "spec": {
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [
                                {
                                    "name": QUEUE,
                                    "resources": [{"name": "cpu", "nominalQuota": str(pods)}],
                                }
                            ],
                        }
                    ]
                }
            },
        )
        for job in mass.jobs.values():
            job.started = t0
            mass.check(job, t0)
        await wait_for(
            lambda: all(j.done is not None for j in mass.jobs.values()), CHANGE_LIMIT, "admission"
        )
        end = await mass.quiet()
        admitted = _lags(t0, dict(admissions.admitted))
        lags = _lags(t0, {j.name: j.done for j in mass.jobs.values()})
        names_ = list(mass.jobs)
        result["admission"] = {
            "floor": base,
            "kueue_admitted_p50_max_s": p50_max(admitted),
            **ratios(lags, base["up_s"]),
            "writes_per_job": per_job(mass.writes(t0, end + 1, names_), jobs),
            "pod_writes": mass.pod_writes(t0, end + 1, mass.jobs.values(), set()),
            "pods_ready_timeouts": len(admissions.pods_ready_timeouts),
            "pods_ready": admissions.ready_lags(mass.jobs),
        }

        # The eviction: Kueue drains the ClusterQueue. A job's end: its last pod gone.
        held = {j.name: mass.pod_uids([j]) for j in mass.jobs.values()}
        t1 = await _quota(kube, {"spec": {"stopPolicy": "HoldAndDrain"}})
        await wait_for(
            lambda: all(not j.pods for j in mass.jobs.values()), CHANGE_LIMIT, "eviction"
        )
        end = await mass.quiet()
        gone = {job: max(mass.gone[uid] for uid in uids) for job, uids in held.items() if uids}
        lags = [at - t1 for at in gone.values()]
        evicted = {j: t for j, t in admissions.evicted.items() if t >= t1}
        ours = [gone[j] - evicted[j] for j in gone if j in evicted]
        result["eviction"] = {
            "kueue_evicted_p50_max_s": p50_max(_lags(t1, dict(evicted))),
            "controller_share_p50_max_s": p50_max(ours),
            **ratios(lags, base["down_s"]),
            "writes_per_job": per_job(mass.writes(t1, end + 1, names_), jobs),
        }
        result["failed_jobs"] = sum(1 for j in mass.jobs.values() if j.failed)
    finally:
        controller.stop()
        for informer in informers:
            await informer.stop()
        await api.close()
    result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return result


def run(kubeconfig: str | None, jobs: int, workers: int) -> dict[str, Any]:
    """One size on the given cluster (which must run KWOK), or on a fresh local one."""
    with cluster(kubeconfig) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        # Room for the wave and a floor of its size at once.
        pool_nodes(k, 10, -(-2 * jobs * (workers + 1) // 10) + 110)
        install_crd(k)
        # Kueue's own default PodsReady timeout: the tests' 15 s evicted 79 of 100 jobs of
        # the wave and made their pods again (2026-12-06 15:10), the floor itself taking 16 s.
        runner = KueueRunner(
            Cluster(config, k[0]), Path(tempfile.mkdtemp(prefix="bench-wave-")), "5m"
        )
        try:
            runner.ensure(slices=True)
            namespace = f"bench-wave-{os.getpid()}"
            sh(*k, "create", "namespace", namespace)
            floor.wait_default_service_account(k, namespace)
            queues(k, namespace)
            return asyncio.run(measure(config, namespace, jobs, workers))
        finally:
            runner.stop()


ROWS: list[tuple[str, Any]] = [
    ("jobs x workers; pods", lambda r: f"{r['jobs']} x {r['workers']}; {r['pods']}"),
    (
        "floor (32 requests in flight)",
        lambda r: (
            f"up {r['admission']['floor']['up_s']} s, down {r['admission']['floor']['down_s']} s"
        ),
    ),
    (
        "admission: quota raised → Workload admitted, p50 / max (Kueue's share)",
        lambda r: f"{r['admission']['kueue_admitted_p50_max_s']} s",
    ),
    (
        "eviction: queue stopped → Workload evicted, p50 / max (Kueue's share)",
        lambda r: f"{r['eviction'].get('kueue_evicted_p50_max_s', '-')} s",
    ),
    (
        "eviction: Workload evicted → the job's last pod gone, p50 / max (ours)",
        lambda r: f"{r['eviction'].get('controller_share_p50_max_s', '-')} s",
    ),
    *[
        (f"{what}: per job, p50 / p99 / max", lambda r, k=key: _three(r[k]))
        for key, what in (
            ("admission", "admission → host list right"),
            ("eviction", "eviction → pods gone"),
        )
    ],
    *[
        (f"{key}: p50 / floor; max / floor; max / p50 (goals ≤ 1.5)", lambda r, k=key: _goals(r[k]))
        for key in ("admission", "eviction")
    ],
    *[
        (f"{key}: writes per job", lambda r, k=key: _writes(r[k]))
        for key in ("admission", "eviction")
    ],
    (
        "admission: Pod events per pod that left / new / kept",
        lambda r: pod_events(r["admission"]),
    ),
    (
        "admission: jobs Kueue evicted for their pods not ready in time",
        lambda r: str(r["admission"].get("pods_ready_timeouts", "-")),
    ),
    (
        "admission: per job, Workload admitted → PodsReady; host list right → PodsReady, p50 / max",
        lambda r: "{admitted_to_ready_s} s; {right_to_ready_s} s".format(
            **r["admission"]["pods_ready"]
        ),
    ),
    (
        "admission: jobs evicted for their pods not ready: admitted → evicted, p50 / max; "
        "of them, host list right before",
        lambda r: (
            "{admitted_to_timeout_s} s; {right_before_timeout}".format(
                **r["admission"]["pods_ready"]
            )
            if "admitted_to_timeout_s" in r["admission"]["pods_ready"]
            else "-"
        ),
    ),
    ("jobs failed", lambda r: str(r["failed_jobs"])),
    ("load average before / after", lambda r: f"{r['load']} / {r['load_after']}"),
]


def _three(change: dict[str, Any]) -> str:
    return f"{change['p50_s']} / {change['p99_s']} / {change['max_s']} s"


def _goals(change: dict[str, Any]) -> str:
    return "; ".join(
        f"{change[k]} {'✓' if change[k] <= 1.5 else '✗'}"
        for k in ("p50_x_floor", "max_x_floor", "max_x_p50")
    )


def _writes(change: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in change["writes_per_job"].items()) or "0"


def table(results: list[dict[str, Any]]) -> str:
    return sizes_table(ROWS, results)


def main() -> None:
    sizes_main(__doc__ or "", run, table)


if __name__ == "__main__":
    main()
