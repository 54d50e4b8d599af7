"""Benchmark: what an idle fleet costs, and how fast one edit lands in it (issue 20 §3).

N jobs of W workers are created and left to run; nothing changes. Over a window of its own
clock the benchmark takes the CPU time of the controller and of the API server (both local
processes on the KWOK cluster) and the exec requests the API server counted
(``apiserver_request_total`` with ``subresource="exec"``, from its /metrics), in up to
three phases on the same fleet and cluster, with the controller's RSS at each window's end:

1. our controller (this checkout), then, still idle, one job's Worker replicas edited
   ``--edits`` times (up, down, ...): each edit's answer → its ``discover_hosts.sh`` listing
   the new count, read from a watch;
2. no controller at all: what the fleet itself costs the API server; then our controller
   again, restarted, once it has settled;
3. with ``--baseline REF`` (e.g. main), the controller of that git revision, exported to a
   temporary directory and run the same way, once it has settled on the same fleet.

    python -m bench.idle [--jobs 1000] [--workers 8] [--window 60] [--baseline main]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from kubernetes_asyncio import config as kube_config

from bench.cluster import (
    ROOT,
    Controller,
    cluster,
    cpu_seconds,
    install_crd,
    job_manifest,
    kubectl_binary,
    machine,
    revision_tree,
    rss_mb,
    sh,
)
from bench.fleet import Fleet, Job, bounded, percentile, slim, wait_for, watching
from mpijob_elastic.core import names
from mpijob_elastic.machinery.kube import Kube


def apiserver_pid(kubeconfig: str) -> int:
    """The local kube-apiserver serving ``kubeconfig``: the one whose secure port it names."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    port = urlparse(config["clusters"][0]["cluster"]["server"]).port
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"kube-apiserver") and f"--secure-port={port}".encode() in argv:
                return int(proc.name)
    raise RuntimeError(f"no local kube-apiserver on port {port}")


def exec_requests(k: list[str]) -> float:
    """Exec requests the API server has answered since it started."""
    total = 0.0
    for line in sh(*k, "get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_request_total{") and 'subresource="exec"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def window(
    seconds: float, k: list[str], apiserver: int, controller: int | None
) -> dict[str, Any]:
    """CPU shares and exec rate over ``seconds`` of nothing happening."""
    execs, api0 = exec_requests(k), cpu_seconds(apiserver)
    ctl0 = cpu_seconds(controller) if controller else 0.0
    start = time.monotonic()
    await asyncio.sleep(seconds)
    took = time.monotonic() - start
    result = {
        "apiserver_core": round((cpu_seconds(apiserver) - api0) / took, 3),
        "exec_per_s": round((exec_requests(k) - execs) / took, 2),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    if controller:
        result["controller_core"] = round((cpu_seconds(controller) - ctl0) / took, 3)
        result["controller_rss_mb"] = round(rss_mb(controller), 1)
    return result


async def settle(fleet: Fleet, seconds: float = 10.0, limit: float = 600.0) -> None:
    """Until no watched object has changed for ``seconds``."""

    def quiet() -> bool:
        last = fleet.changes[-1][0] if fleet.changes else 0.0
        return time.monotonic() - last >= seconds

    with contextlib.suppress(TimeoutError):
        await wait_for(quiet, limit, "quiet")


async def edits(kube: Kube, fleet: Fleet, namespace: str, count: int, workers: int) -> list[float]:
    """One job's replicas edited ``count`` times: each edit's answer → its host list right."""
    job = fleet.jobs["job-0"]
    lags: list[float] = []
    for n in range(count):
        job.want = workers + 1 if n % 2 == 0 else workers
        job.edited, job.rescaled = None, None
        patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": job.want}}}}
        await kube.patch(names.KIND, namespace, job.name, patch)
        job.edited = time.monotonic()
        fleet.check(job)
        await wait_for(lambda: job.rescaled is not None, 60, "the edit listed")
        assert job.rescaled is not None
        lags.append(job.rescaled - job.edited)
        await asyncio.sleep(0.5)
    return lags


async def measure(kubeconfig: str, namespace: str, args: argparse.Namespace) -> dict[str, Any]:
    k = [kubectl_binary(), "--kubeconfig", kubeconfig]
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    kube = Kube(api)
    fleet = Fleet()
    informers = watching(api, fleet.handler, namespace, slim, ("Pod", "ConfigMap", "MPIJob"))
    apiserver = apiserver_pid(kubeconfig)
    result: dict[str, Any] = {"jobs": args.jobs, "workers": args.workers, **machine()}
    controller = Controller(kubeconfig, namespaces=namespace)
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        controller.start()
        await controller.ready()
        w = args.workers
        for i in range(args.jobs):
            fleet.jobs[f"job-{i}"] = Job(f"job-{i}", w)

        async def create(job: Job) -> None:
            manifest = job_manifest(job.name, w, max_workers=w + 1, min_workers=1)
            manifest["metadata"]["namespace"] = namespace
            await kube.create(manifest)

        await bounded([lambda j=j: create(j) for j in fleet.jobs.values()])
        await wait_for(
            lambda: all(j.converged is not None for j in fleet.jobs.values()), 3600, "converged"
        )
        await settle(fleet)
        result["ours"] = await window(args.window, k, apiserver, controller.pid)
        print(json.dumps(result), flush=True)
        lags = await edits(kube, fleet, namespace, args.edits, w)
        ms = sorted(float(round(1000 * lag)) for lag in lags)
        result["edit_ms"] = {"p50": ms[len(ms) // 2], "p99": percentile(ms, 0.99), "max": ms[-1]}
        await settle(fleet)
        controller.stop()
        result["none"] = await window(args.window, k, apiserver, None)
        print(json.dumps(result), flush=True)
        # Ours again, after the fleet's own idle: the first window follows convergence,
        # whose after-effects (garbage collector, etcd) may still load the API server.
        controller = Controller(kubeconfig, namespaces=namespace)
        controller.start()
        await controller.ready()
        await settle(fleet)
        result["ours_again"] = await window(args.window, k, apiserver, controller.pid)
        controller.stop()
        if args.baseline:
            controller = Controller(kubeconfig, namespaces=namespace, root=args.baseline_root)
            controller.start()
            await controller.ready()
            await settle(fleet)
            result["baseline"] = {
                "ref": args.baseline,
                **await window(args.window, k, apiserver, controller.pid),
            }
            controller.stop()
    finally:
        controller.stop()
        for informer in informers:
            await informer.stop()
        await api.close()
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    pods = args.jobs * (args.workers + 2) + 100
    with cluster(args.kubeconfig, pods) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        namespace = f"bench-idle-{os.getpid()}"
        sh(*k, "create", "namespace", namespace)
        try:
            # The older controller, as a plain tree of that revision's files.
            with revision_tree(args.baseline) as tree:
                args.baseline_root = tree
                return asyncio.run(measure(config, namespace, args))
        finally:
            if args.kubeconfig is not None:
                sh(*k, "delete", "namespace", namespace, "--wait=false")


def table(r: dict[str, Any]) -> str:
    phases = [("this controller", r["ours"]), ("no controller", r["none"])]
    if "ours_again" in r:
        phases.append(("this controller, restarted", r["ours_again"]))
    if "baseline" in r:
        phases.insert(0, (f"before ({r['baseline']['ref']})", r["baseline"]))
    lines = [
        f"Idle fleet, {r['jobs']} jobs x {r['workers']} workers, measured {r['date']}",
        "",
        "| | controller CPU | controller RSS | exec/s | API server CPU | load (1, 5, 15 min) |",
        "|---|---|---|---|---|---|",
    ]
    for label, p in phases:
        rss = f"{p['controller_rss_mb']} MB" if "controller_rss_mb" in p else "-"
        lines.append(
            f"| {label} | {p.get('controller_core', '-')} core | {rss} | {p['exec_per_s']} |"
            f" {p['apiserver_core']} core | {p['load']} |"
        )
    e = r["edit_ms"]
    lines += [
        "",
        f"One job's replicas edited while the fleet idles: edit → discover_hosts.sh, p50"
        f" {e['p50']} ms, p99 {e['p99']} ms, max {e['max']} ms.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--baseline", help="a git revision whose controller to measure too")
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/out/idle.md")
    args = parser.parse_args()
    result = run(args)
    text = table(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
