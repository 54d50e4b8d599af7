"""Benchmark: how long from a worker pod reaching Running to its line in discover_hosts.sh.

Both moments are taken on this process's clock, from two watch streams (pods and the
job's ConfigMap) read through the project's own informer, so the figure includes the
controller's watch delay, its reconcile and its write, plus our own watch delay (which is
the same for both streams). Runs on the local KWOK cluster, or on the cluster named by
MPIJOB_ELASTIC_KUBECONFIG.

    python -m bench.propagation [--rounds N] [--burst N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config

from mpijob_elastic import names
from mpijob_elastic.informer import Informer

ROOT = Path(__file__).resolve().parent.parent


def sh(*args: str, input: str | None = None) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, input=input).stdout


async def ash(*args: str, input: str | None = None) -> None:
    """kubectl without blocking the loop, whose informers are timing events meanwhile."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate(input.encode() if input else None)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: {err.decode()}")


def job_manifest(name: str, workers: int, max_workers: int) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "annotations": {
                names.ANN_MIN_REPLICAS: "1",
                names.ANN_MAX_REPLICAS: str(max_workers),
                names.ANN_DRAIN_SECONDS: "0",
            },
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": template},
                "Worker": {"replicas": workers, "template": template},
            }
        },
    }


class Timeline:
    """When each worker was first seen Running, and first seen in discover_hosts.sh."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.running: dict[str, float] = {}
        self.listed: dict[str, float] = {}

    def on_pod(self, _type: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod.get("status", {}).get("phase") == "Running" and "-worker-" in name:
            self.running.setdefault(name, time.monotonic())

    def on_config(self, _type: str, cm: dict[str, Any]) -> None:
        if cm["metadata"]["name"] != names.config_map_name(self.job):
            return
        script = (cm.get("data") or {}).get(names.DISCOVER_HOSTS, "")
        now = time.monotonic()
        for line in script.splitlines():
            if line.startswith("echo "):
                self.listed.setdefault(line.split()[1].split(":")[0], now)

    def delays(self, pods: list[str]) -> list[float]:
        return [self.listed[p] - self.running[p] for p in pods]


async def wait(predicate: Any, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step timed out")
        await asyncio.sleep(0.01)


def summary(label: str, values: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values)
    return {
        "case": label,
        "workers": len(ms),
        "median_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
        "max_ms": round(ms[-1], 1),
    }


async def bench(
    kubeconfig: str, k: list[str], namespace: str, rounds: int, burst: int
) -> list[dict[str, Any]]:
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    timeline = Timeline("bench")
    selector = f"{names.LABEL_JOB}=bench"
    informers = [
        Informer(
            api, "/api/v1", "pods", timeline.on_pod, namespace=namespace, label_selector=selector
        ),
        Informer(
            api,
            "/api/v1",
            "configmaps",
            timeline.on_config,
            namespace=namespace,
            label_selector=selector,
        ),
    ]
    results = []
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        max_workers = max(rounds + 1, burst)
        await ash(
            *k,
            "create",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(job_manifest("bench", 1, max_workers)),
        )
        await wait(lambda: "bench-worker-0" in timeline.listed)

        # One worker at a time, as an autoscaler adding capacity would.
        for n in range(2, rounds + 2):
            await ash(*k, "scale", "-n", namespace, "mpijob/bench", f"--replicas={n}")
            await wait(lambda n=n: f"bench-worker-{n - 1}" in timeline.listed)
        results.append(
            summary(
                "one worker added at a time",
                timeline.delays([f"bench-worker-{i}" for i in range(1, rounds + 1)]),
            )
        )

        # Back to 1, then a burst: many pods turn Running within moments of each other.
        await ash(*k, "scale", "-n", namespace, "mpijob/bench", "--replicas=1")
        await wait(
            lambda: (
                not [
                    p
                    for p in informers[0].list()
                    if p["metadata"]["name"] != "bench-worker-0"
                    and "-worker-" in p["metadata"]["name"]
                ]
            )
        )
        for i in range(1, burst):
            timeline.running.pop(f"bench-worker-{i}", None)
            timeline.listed.pop(f"bench-worker-{i}", None)
        await ash(*k, "scale", "-n", namespace, "mpijob/bench", f"--replicas={burst}")
        await wait(lambda: all(f"bench-worker-{i}" in timeline.listed for i in range(burst)))
        results.append(
            summary(
                f"burst of {burst - 1} workers at once",
                timeline.delays([f"bench-worker-{i}" for i in range(1, burst)]),
            )
        )
    finally:
        for informer in informers:
            await informer.stop()
        await api.close()
    return results


def run(kubeconfig: str, kubectl: str, rounds: int, burst: int) -> list[dict[str, Any]]:
    namespace = f"bench-{os.getpid()}"
    k = [kubectl, "--kubeconfig", kubeconfig]
    sh(*k, "apply", "-f", str(ROOT / "config/crd/kubeflow.org_mpijobs.yaml"))
    sh(*k, "wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
    sh(*k, "create", "namespace", namespace)
    controller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpijob_elastic.cli",
            "run",
            "--kubeconfig",
            kubeconfig,
            "--namespaces",
            namespace,
            "--kubectl-delivery",
            "none",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    try:
        return asyncio.run(bench(kubeconfig, k, namespace, rounds, burst))
    finally:
        controller.terminate()
        controller.wait(10)
        sh(*k, "delete", "namespace", namespace, "--wait=false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=50)
    args = parser.parse_args()
    bin_dir = sh(str(ROOT / "hack/build-binaries.sh")).strip()
    kubeconfig = os.environ.get("MPIJOB_ELASTIC_KUBECONFIG")
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER="mpijob-elastic-bench")
    started = kubeconfig is None
    if kubeconfig is None:
        up = [str(ROOT / "hack/cluster-up.sh")]
        out = subprocess.run(up, env=env, check=True, capture_output=True, text=True).stdout
        kubeconfig = out.strip().splitlines()[-1]
    try:
        results = run(kubeconfig, f"{bin_dir}/kubectl", args.rounds, args.burst)
    finally:
        if started:
            subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)
    print(f"{'case':40} {'workers':>7} {'median':>9} {'p95':>9} {'max':>9}")
    for r in results:
        times = "".join(f"{r[k]:>7}ms" for k in ("median_ms", "p95_ms", "max_ms"))
        print(f"{r['case']:40} {r['workers']:>7}  {times}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
