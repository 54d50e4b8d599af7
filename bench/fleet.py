"""Benchmark: a fleet of elastic MPIJobs, from first create to steady state and a mass rescale.

N jobs of W workers are created at once in a namespace of their own. The benchmark watches
that namespace (pods, ConfigMaps, ServiceAccounts, Roles, RoleBindings, PDBs, Events and
the MPIJobs) and takes, on its own clock:

* per job, first create → converged: every worker listed in ``discover_hosts.sh`` (read
  from the ``<job>-config`` ConfigMap) and the launcher pod created;
* the controller's RSS after convergence and its CPU time per job (``/proc/<pid>``);
* cache sync after a restart: process start → first ``/readyz`` 200 (our controller only);
* writes in steady state and after a restart: every ADDED/MODIFIED/DELETED event seen on
  the watches in a window (nothing should change once everything runs);
* a mass rescale: half the jobs W → W/2 and half W → 3W/2 at once (500 jobs when N ≥ 500),
  per job the time from its edit's answer to its ``discover_hosts.sh`` listing the new
  count, and the events per second the API server delivered meanwhile.

Pods are told apart by either label set, ours (``mpi-job-name``/``mpi-job-role``) or
training-operator's (``training.kubeflow.org/job-name``/``replica-type``), so the same
benchmark measures another controller on the same cluster: give ``--controller-pid`` (or
0 for none) and it creates the jobs and watches, without starting ours.

    python -m bench.fleet [--jobs N] [--workers W] [--kubeconfig PATH] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from bench.cluster import (
    Controller,
    cluster,
    cpu_seconds,
    install_crd,
    job_manifest,
    kubectl_binary,
    machine,
    rss_mb,
    sh,
)
from mpijob_elastic.app import preemptions
from mpijob_elastic.core import names
from mpijob_elastic.machinery.informer import WATCH_TIMEOUT_SECONDS, Informer
from mpijob_elastic.machinery.kube import RESOURCES, Kube

Obj = dict[str, Any]

WATCHED = (
    "Pod",
    "ConfigMap",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "Event",
    "MPIJob",
)


def watching(
    api: Any,
    handler: Callable[[str], Any],
    namespace: str,
    transform: Callable[[Obj], Obj],
    kinds: tuple[str, ...] = WATCHED,
) -> list[Informer]:
    """An informer per kind of ``kinds`` in ``namespace``, ``handler(kind)`` its handler,
    ``transform`` what the benchmark keeps of each object.
    Events get no bookmarks (the API server keeps no watch cache of them): their watches
    end at the server's timeout the controller uses, below the informer's idle bound, not
    cut as dead with a warning every 65 s."""
    return [
        Informer(
            api,
            *RESOURCES[kind],
            handler(kind),
            namespace=namespace,
            transform=transform,
            watch_timeout_seconds=preemptions.WATCH_SECONDS
            if kind == "Event"
            else WATCH_TIMEOUT_SECONDS,
        )
        for kind in kinds
    ]


# Requests the benchmark has in flight at once when it creates or edits jobs: enough to
# load the API server, few enough not to be what limits it on a small machine.
CLIENT_CONCURRENCY = 50
SETTLE_LIMIT_SECONDS = 300.0


def _job_of(labels: dict[str, str]) -> str | None:
    return labels.get(names.LABEL_JOB) or labels.get(names.LABEL_TO_JOB)


def _role_of(labels: dict[str, str]) -> str | None:
    return labels.get(names.LABEL_ROLE) or labels.get(names.LABEL_TO_REPLICA_TYPE)


def listed_hosts(script: str) -> int:
    """How many hosts a ``discover_hosts.sh`` prints (``echo <host>[:<slots>]`` lines)."""
    return sum(1 for line in script.splitlines() if line.startswith("echo "))


def slim(obj: Obj) -> Obj:
    """What the benchmark reads of an object, and what its cache needs to index it."""
    meta = obj["metadata"]
    kept: Obj = {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences")
            if k in meta
        }
    }
    script = (obj.get("data") or {}).get(names.DISCOVER_HOSTS)
    if script is not None:
        kept["data"] = {names.DISCOVER_HOSTS: script}
    return kept


@dataclass
class Job:
    name: str
    want: int
    hosts: int = 0
    launcher: bool = False
    converged: float | None = None
    edited: float | None = None
    rescaled: float | None = None


@dataclass
class Fleet:
    """The benchmark's view of its jobs, and every change it saw, timestamped."""

    jobs: dict[str, Job] = field(default_factory=dict)
    changes: list[tuple[float, str]] = field(default_factory=list)

    def handler(self, kind: str) -> Any:
        def on_event(type_: str, obj: Obj) -> None:
            self.changes.append((time.monotonic(), kind))
            if kind == "Pod":
                self._on_pod(type_, obj)
            elif kind == "ConfigMap":
                self._on_config(type_, obj)

        return on_event

    def _on_pod(self, type_: str, pod: Obj) -> None:
        labels = pod["metadata"].get("labels") or {}
        job = self.jobs.get(_job_of(labels) or "")
        if job is not None and _role_of(labels) == names.ROLE_LAUNCHER:
            job.launcher = type_ != "DELETED"
            self.check(job)

    def _on_config(self, type_: str, cm: Obj) -> None:
        name = cm["metadata"]["name"]
        job = self.jobs.get(name.removesuffix("-config")) if name.endswith("-config") else None
        if job is not None:
            script = "" if type_ == "DELETED" else (cm.get("data") or {}).get(names.DISCOVER_HOSTS)
            job.hosts = listed_hosts(script or "")
            self.check(job)

    def check(self, job: Job) -> None:
        now = time.monotonic()
        if job.hosts != job.want:
            return
        if job.converged is None and job.launcher:
            job.converged = now
        if job.edited is not None and job.rescaled is None:
            job.rescaled = now

    def writes(self, start: float, end: float) -> Counter[str]:
        return Counter(kind for t, kind in self.changes if start <= t < end)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_for(predicate: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def bounded(calls: list[Any]) -> None:
    """Runs the calls, at most CLIENT_CONCURRENCY at once."""
    slots = asyncio.Semaphore(CLIENT_CONCURRENCY)

    async def one(call: Any) -> None:
        async with slots:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


@dataclass
class Options:
    jobs: int = 100
    workers: int = 8
    steady_seconds: float = 30.0
    settle_seconds: float = 10.0
    rescale_jobs: int = 500
    converge_limit: float = 1800.0
    # None: start our controller; 0: measure without one of ours; >0: the controller's PID.
    controller_pid: int | None = None


async def measure(kubeconfig: str, namespace: str, opts: Options) -> dict[str, Any]:
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    kube = Kube(api)
    fleet = Fleet()
    informers = watching(api, fleet.handler, namespace, slim)
    controller: Controller | None = None
    result: dict[str, Any] = {"jobs": opts.jobs, "workers": opts.workers, **machine()}
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        pid = opts.controller_pid
        if pid is None:
            controller = Controller(kubeconfig)
            controller.start()
            await controller.ready()
            pid = controller.pid

        converged_at = await _first_create(kube, namespace, fleet, opts, pid, result)
        await _settle(fleet, opts, pid, converged_at, result)
        await _steady(fleet, opts, pid, converged_at, result)
        if controller is not None:
            pid = await _restart(controller, fleet, opts, result)
        await _rescale(kube, namespace, fleet, opts, pid, result)
    finally:
        if controller is not None:
            controller.stop()
        for informer in informers:
            await informer.stop()
        await api.close()
    return result


async def _first_create(
    kube: Kube, namespace: str, fleet: Fleet, opts: Options, pid: int, result: dict[str, Any]
) -> float:
    """First create -> every job converged; when the last one did."""
    w = opts.workers
    for i in range(opts.jobs):
        fleet.jobs[f"job-{i}"] = Job(f"job-{i}", w)
    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.monotonic()

    async def create(job: Job) -> None:
        manifest = job_manifest(job.name, w, max_workers=w + w // 2, min_workers=w // 2)
        manifest["metadata"]["namespace"] = namespace
        await kube.create(manifest)

    await bounded([lambda j=j: create(j) for j in fleet.jobs.values()])
    result["create_s"] = round(time.monotonic() - t0, 1)
    await wait_for(
        lambda: all(j.converged is not None for j in fleet.jobs.values()),
        opts.converge_limit,
        "convergence",
    )
    done = [j.converged - t0 for j in fleet.jobs.values() if j.converged is not None]
    converged_at = time.monotonic()
    if pid:
        result["cpu_ms_per_job"] = round(1000 * (cpu_seconds(pid) - cpu0) / opts.jobs, 1)
    result["converge_p50_s"] = round(statistics.median(done), 1)
    result["converge_p90_s"] = round(percentile(done, 0.9), 1)
    result["converge_max_s"] = round(max(done), 1)
    # Goal 5: the median job long before the last one; the share done by the median.
    result["converged_by_half_time"] = sum(1 for d in done if d <= max(done) / 2)
    return converged_at


async def _settle(
    fleet: Fleet, opts: Options, pid: int, converged_at: float, result: dict[str, Any]
) -> None:
    """Steady state begins once nothing has changed for settle_seconds: the launchers
    start running and the jobs' status says so after the convergence."""

    def quiet() -> bool:
        last = fleet.changes[-1][0] if fleet.changes else 0.0
        return time.monotonic() - last >= opts.settle_seconds

    # A controller that never goes quiet is measured anyway, after SETTLE_LIMIT.
    with contextlib.suppress(TimeoutError):
        await wait_for(quiet, SETTLE_LIMIT_SECONDS, "quiet")
    result["settle_s"] = round(time.monotonic() - converged_at - opts.settle_seconds, 1)
    if pid:
        result["rss_mb"] = round(rss_mb(pid), 1)


async def _steady(
    fleet: Fleet, opts: Options, pid: int, converged_at: float, result: dict[str, Any]
) -> None:
    start = time.monotonic()
    cpu0 = cpu_seconds(pid) if pid else 0.0
    await asyncio.sleep(opts.steady_seconds)
    if pid:
        # Nothing changes: no reconcile is due (the launchers report rank ends, ranks.py).
        result["steady_cpu_share"] = round((cpu_seconds(pid) - cpu0) / opts.steady_seconds, 3)
    result["steady_writes"] = dict(fleet.writes(start, time.monotonic()))
    result["settle_writes"] = dict(fleet.writes(converged_at, start))


async def _restart(
    controller: Controller, fleet: Fleet, opts: Options, result: dict[str, Any]
) -> int:
    """Restart: cache sync and writes; the new controller's PID."""
    controller.stop()
    start = time.monotonic()
    controller.start()
    result["sync_s"] = round(await controller.ready(), 2)
    pid = controller.pid
    await asyncio.sleep(opts.steady_seconds)
    result["restart_writes"] = dict(fleet.writes(start, time.monotonic()))
    result["rss_restart_mb"] = round(rss_mb(pid), 1)
    return pid


async def _rescale(
    kube: Kube, namespace: str, fleet: Fleet, opts: Options, pid: int, result: dict[str, Any]
) -> None:
    """Mass rescale."""
    w = opts.workers
    edited = list(fleet.jobs.values())[: min(opts.rescale_jobs, opts.jobs)]
    for n, job in enumerate(edited):
        job.want = w // 2 if n % 2 == 0 else w + w // 2

    async def edit(job: Job) -> None:
        patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": job.want}}}}
        await kube.patch(names.KIND, namespace, job.name, patch)
        job.edited = time.monotonic()
        fleet.check(job)

    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.monotonic()
    await bounded([lambda j=j: edit(j) for j in edited])
    await wait_for(
        lambda: all(j.rescaled is not None for j in edited), opts.converge_limit, "rescale"
    )
    t1 = time.monotonic()
    lags = [j.rescaled - j.edited for j in edited if j.rescaled and j.edited]
    result["rescale_jobs"] = len(edited)
    result["rescale_edits_s"] = round(max(j.edited or 0 for j in edited) - t0, 1)
    result["rescale_p50_s"] = round(statistics.median(lags), 2)
    result["rescale_p99_s"] = round(percentile(lags, 0.99), 2)
    result["rescale_max_s"] = round(max(lags), 2)
    result["rescale_all_s"] = round(t1 - t0, 1)
    seen = [t for t, _ in fleet.changes if t0 <= t < t1]
    result["rescale_events_per_s"] = round(len(seen) / max(t1 - t0, 1e-9))
    per_second = Counter(int(t - t0) for t in seen)
    result["rescale_events_peak_per_s"] = max(per_second.values(), default=0)
    if pid:
        result["rescale_cpu_share"] = round((cpu_seconds(pid) - cpu0) / (t1 - t0), 2)
    result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(kubeconfig: str | None, opts: Options) -> dict[str, Any]:
    """One size on the given cluster, or on a fresh local one sized for it."""

    pods = opts.jobs * (opts.workers * 3 // 2 + 1) + 100
    with cluster(kubeconfig, pods) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        namespace = f"bench-fleet-{os.getpid()}"
        sh(*k, "create", "namespace", namespace)
        try:
            return asyncio.run(measure(config, namespace, opts))
        finally:
            # A given cluster is someone's: leave it as found (the local one goes anyway).
            if kubeconfig is not None:
                sh(*k, "delete", "namespace", namespace, "--wait=false")


def _writes(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "-"
    total = sum(counts.values())
    return str(total) + (f" ({', '.join(f'{k} {v}' for k, v in counts.items())})" if total else "")


ROWS: list[tuple[str, Any]] = [
    ("jobs x workers", lambda r: f"{r['jobs']} x {r['workers']}"),
    (
        "first create → converged, p50 / p90 / max",
        lambda r: f"{r['converge_p50_s']} / {r['converge_p90_s']} / {r['converge_max_s']} s",
    ),
    ("jobs converged by half the last one's time", lambda r: f"{r['converged_by_half_time']}"),
    ("controller CPU per job to converge", lambda r: f"{r.get('cpu_ms_per_job', '-')} ms"),
    ("converged → last change before 10 s without any", lambda r: f"{r.get('settle_s', '-')} s"),
    ("controller RSS after convergence", lambda r: f"{r.get('rss_mb', '-')} MB"),
    ("cache sync after restart (start → /readyz)", lambda r: f"{r.get('sync_s', '-')} s"),
    ("controller RSS after restart", lambda r: f"{r.get('rss_restart_mb', '-')} MB"),
    ("controller CPU in steady state", lambda r: f"{r.get('steady_cpu_share', '-')} core"),
    ("writes in steady state (30 s)", lambda r: _writes(r.get("steady_writes"))),
    ("writes after a restart (start → ready + 30 s)", lambda r: _writes(r.get("restart_writes"))),
    (
        "mass rescale: jobs edited at once (half ↓, half ↑)",
        lambda r: f"{r['rescale_jobs']} (edits sent in {r['rescale_edits_s']} s)",
    ),
    (
        "edit → host list right, p50 / p99 / max",
        lambda r: f"{r['rescale_p50_s']} / {r['rescale_p99_s']} / {r['rescale_max_s']} s",
    ),
    ("first edit → all host lists right", lambda r: f"{r['rescale_all_s']} s"),
    (
        "API events seen during the rescale, mean / peak",
        lambda r: f"{r['rescale_events_per_s']} / {r['rescale_events_peak_per_s']} per s",
    ),
    ("controller CPU during the rescale", lambda r: f"{r.get('rescale_cpu_share', '-')} core"),
    ("load average before / after", lambda r: f"{r['load']} / {r['load_after']}"),
]


def sizes_table(rows: list[tuple[str, Any]], results: list[dict[str, Any]]) -> str:
    """A column per fleet size, a line per row: (label, the cell from one size's result)."""
    lines = [
        "| | " + " | ".join(f"{r['jobs']} jobs" for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines) + "\n"


def sizes_main(
    doc: str,
    run: Callable[[str | None, int, int], dict[str, Any]],
    table: Callable[[list[dict[str, Any]]], str],
) -> None:
    """A benchmark's command line that runs ``run(kubeconfig, jobs, workers)`` for each
    size in --jobs, prints each result as JSON and then the table of them all."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--jobs", default="100", help="comma-separated sizes, e.g. 100,1000")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    args = parser.parse_args()
    results = []
    for size in (int(s) for s in args.jobs.split(",")):
        results.append(run(args.kubeconfig, size, args.workers))
        print(json.dumps(results[-1]), flush=True)
    print(table(results))


def table(results: list[dict[str, Any]]) -> str:
    return sizes_table(ROWS, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="100", help="comma-separated sizes, e.g. 100,300,1000")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--controller-pid", type=int, default=None)
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    parser.add_argument("--rescale-jobs", type=int, default=500)
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    args = parser.parse_args()
    results = []
    for size in (int(s) for s in args.jobs.split(",")):
        opts = Options(
            jobs=size,
            workers=args.workers,
            steady_seconds=args.steady_seconds,
            rescale_jobs=args.rescale_jobs,
            controller_pid=args.controller_pid,
        )
        results.append(run(args.kubeconfig, opts))
        print(json.dumps(results[-1]), flush=True)
    text = table(results)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
