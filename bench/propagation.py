"""Benchmark: how long from a worker pod reaching Running to its line in discover_hosts.sh.

Both moments are taken on this process's clock, from two watch streams (pods and the
job's ConfigMap) read through the project's own informer, so the figure includes the
controller's watch delay, its reconcile and its write, plus our own watch delay (which is
the same for both streams). Runs on the local KWOK cluster, or on the cluster named by
MPIJOB_ELASTIC_KUBECONFIG (or --kubeconfig); pods are found by name, so another
controller's can be timed too.

    python -m bench.propagation [--rounds N] [--bursts 50,200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from kubernetes_asyncio import config as kube_config

from bench.cluster import (
    Controller,
    ash,
    cluster,
    install_crd,
    job_manifest,
    kubectl_binary,
    sh,
)
from mpijob_elastic.core import names
from mpijob_elastic.machinery.informer import Informer


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
    kubeconfig: str, k: list[str], namespace: str, rounds: int, bursts: list[int]
) -> list[dict[str, Any]]:
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    timeline = Timeline("bench")
    # By name, not by label: training-operator's pods carry other labels than ours.
    informers = [
        Informer(api, "/api/v1", "pods", timeline.on_pod, namespace=namespace),
        Informer(
            api,
            "/api/v1",
            "configmaps",
            timeline.on_config,
            namespace=namespace,
        ),
    ]
    results = []
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        max_workers = max(rounds + 1, *bursts)
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
        for burst in bursts:
            await ash(*k, "scale", "-n", namespace, "mpijob/bench", "--replicas=1")
            await wait(
                lambda: (
                    not [
                        p
                        for p in informers[0].list()
                        if p["metadata"]["name"] != "bench-worker-0"
                        and "-worker-" in p["metadata"]["name"]
                    ]
                ),
                limit=300,
            )
            for i in range(1, burst):
                timeline.running.pop(f"bench-worker-{i}", None)
                timeline.listed.pop(f"bench-worker-{i}", None)
            await ash(*k, "scale", "-n", namespace, "mpijob/bench", f"--replicas={burst}")
            await wait(
                lambda burst=burst: all(
                    f"bench-worker-{i}" in timeline.listed for i in range(burst)
                ),
                limit=300,
            )
            results.append(
                summary(
                    f"burst 1 → {burst}",
                    timeline.delays([f"bench-worker-{i}" for i in range(1, burst)]),
                )
            )
    finally:
        for informer in informers:
            await informer.stop()
        await api.close()
    return results


def run(kubeconfig: str | None, rounds: int, bursts: list[int]) -> list[dict[str, Any]]:
    """The cases on the given cluster, or on a fresh local one."""
    with cluster(kubeconfig, pods=max(bursts) + 50) as config:
        namespace = f"bench-{os.getpid()}"
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        sh(*k, "create", "namespace", namespace)
        controller = Controller(config, namespaces=namespace)
        controller.start()
        try:
            return asyncio.run(bench(config, k, namespace, rounds, bursts))
        finally:
            controller.stop()
            sh(*k, "delete", "namespace", namespace, "--wait=false")


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| case | workers | median | p95 | max |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['case']} | {r['workers']} | {r['median_ms']} ms | {r['p95_ms']} ms"
            f" | {r['max_ms']} ms |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--bursts", default="50,200", help="comma-separated burst sizes")
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    args = parser.parse_args()
    bursts = [int(b) for b in args.bursts.split(",")]
    results = run(args.kubeconfig, args.rounds, bursts)
    print(table(results))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
