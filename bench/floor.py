"""Benchmark: the cluster's floor: plain pods created to Running and deleted to gone.

What the cluster itself takes for a given number of pods with no controller in the way:
``count`` plain pods (one busybox container, no owner) created by a client with 32
requests in flight, timed from the first create to the last pod Running (KWOK marks a
scheduled pod Running), then deleted the same way (default grace period: KWOK removes a
deleted pod at once, as a kubelet does one whose containers exit on SIGTERM), timed from
the first delete to the last pod gone; pods per second both ways. The client is asyncio,
one connection pool, with a semaphore of 32: the asyncio form of a 32-thread client, each
slot one request at a time, the issue's "client with 32 threads".

Both moments come from a watch on the pods (the project's informer), on the same clock as
the requests, so the figures compare with a controller's as the benchmark sees them.
``bench/mass.py`` runs it on its own cluster just before each mass change, with as many
pods as the change touches, and before an evicted loss also ``evicted``: as many plain pods
on nodes of their own, tainted NoExecute, timed from the taint to the last pod gone (the
cluster's taint eviction, kube-controller-manager's, with no controller in the way). Alone
it runs on the given cluster or on a fresh local KWOK one with fake nodes for the pods.

    python -m bench.floor [--pods 1000] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config

from bench.cluster import cluster, kubectl_binary, machine, sh
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import MERGE_PATCH, RESOURCES, Kube

Obj = dict[str, Any]

# The client: 32 threads, here 32 requests in flight on one event loop.
CONCURRENCY = 32
LABEL = "mpijob-elastic.io/bench-floor"
LIMIT_SECONDS = 600.0


def pod_manifest(
    name: str, namespace: str, run: str, node_selector: Mapping[str, str] | None = None
) -> Obj:
    """A plain pod: what a worker pod is to the cluster, without its controller."""
    spec: Obj = {"containers": [{"name": "main", "image": "busybox"}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {LABEL: run}},
        "spec": spec,
    }


def _slim(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
        },
        "status": {"phase": (obj.get("status") or {}).get("phase")},
    }


@dataclass
class Watched:
    """Per pod name: when the watch first saw it Running, and when it saw it gone."""

    running: dict[str, float] = field(default_factory=dict)
    gone: dict[str, float] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)

    def on_event(self, type_: str, pod: Obj) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        if type_ == "DELETED":
            self.gone.setdefault(name, now)
            return
        self.uids[name] = pod["metadata"]["uid"]
        if (pod.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(name, now)


async def _all(what: str, done: Any) -> None:
    deadline = time.monotonic() + LIMIT_SECONDS
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"floor: timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def bounded(calls: list[Any], concurrency: int = CONCURRENCY) -> None:
    """Runs the calls, at most ``concurrency`` at once: a client of that many threads."""
    slots = asyncio.Semaphore(concurrency)

    async def one(call: Any) -> None:
        async with slots:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


@contextlib.asynccontextmanager
async def _watching(
    api: kube_client.ApiClient, namespace: str
) -> AsyncIterator[tuple[str, Watched]]:
    """A fresh run's label value and the watch of its pods, synced."""
    run = f"f{os.getpid()}-{time.monotonic_ns() % 10**8}"
    seen = Watched()
    informer = Informer(
        api,
        *RESOURCES["Pod"],
        seen.on_event,
        namespace=namespace,
        label_selector=f"{LABEL}={run}",
        transform=_slim,
    )
    informer.start()
    try:
        await informer.synced.wait()
        yield run, seen
    finally:
        await informer.stop()


async def _up(
    kube: Kube,
    namespace: str,
    run: str,
    seen: Watched,
    selectors: list[Mapping[str, str] | None],
    concurrency: int,
) -> tuple[list[str], float, float, list[float]]:
    """One plain pod per selector, created to Running: their names, the first create's
    moment, the time the creates took to send, and each pod's time to Running, sorted."""
    names = [f"floor-{run}-{i}" for i in range(len(selectors))]
    t0 = time.monotonic()
    await bounded(
        [
            lambda n=n, sel=sel: kube.create(pod_manifest(n, namespace, run, sel))
            for n, sel in zip(names, selectors, strict=True)
        ],
        concurrency,
    )
    sent = time.monotonic() - t0
    await _all("Running", lambda: all(n in seen.running for n in names))
    return names, t0, sent, sorted(seen.running[n] - t0 for n in names)


async def measure(
    api: kube_client.ApiClient,
    namespace: str,
    count: int,
    *,
    node_selector: Mapping[str, str] | None = None,
    concurrency: int = CONCURRENCY,
) -> dict[str, Any]:
    """Creates ``count`` plain pods to Running, then deletes them to gone; the times.

    ``up_s``: first create sent → last pod Running; ``down_s``: first delete sent → last
    pod gone; ``up_half_s``: first create → half of the pods Running."""
    kube = Kube(api)
    async with _watching(api, namespace) as (run, seen):
        selectors = [node_selector] * count
        names, t0, sent, up = await _up(kube, namespace, run, seen, selectors, concurrency)
        t1 = time.monotonic()
        await bounded(
            [lambda n=n: kube.delete("Pod", namespace, n, seen.uids[n]) for n in names],
            concurrency,
        )
        await _all("gone", lambda: all(n in seen.gone for n in names))
        down = sorted(seen.gone[n] - t1 for n in names)
    up_s, down_s = up[-1], down[-1]
    return {
        # On the caller's clock (time.monotonic), for counting what the watches saw.
        "marks": {"created": t0, "deleted": t1, "ended": time.monotonic()},
        "pods": count,
        "concurrency": concurrency,
        "creates_sent_s": round(sent, 2),
        "up_s": round(up_s, 2),
        "up_half_s": round(statistics.median(up), 2),
        "up_pods_per_s": round(count / up_s, 1),
        "down_s": round(down_s, 2),
        "down_pods_per_s": round(count / down_s, 1),
    }


async def evicted(
    api: kube_client.ApiClient,
    namespace: str,
    count: int,
    nodes: Sequence[str],
    taint_key: str,
    *,
    concurrency: int = CONCURRENCY,
) -> dict[str, Any]:
    """The cluster's own eviction: ``count`` plain pods created to Running on ``nodes``
    (pinned by hostname, spread evenly), then the nodes tainted ``NoExecute``: the
    cluster's taint eviction (kube-controller-manager) marks each pod DisruptionTarget and
    deletes it, with no controller in the way. ``evict_s``: the taint → the last pod gone.
    The taint is taken off again, for the next use of the nodes."""
    kube = Kube(api)
    selectors: list[Mapping[str, str] | None] = [
        {"kubernetes.io/hostname": nodes[i % len(nodes)]} for i in range(count)
    ]

    async def taint(taints: list[Obj]) -> None:
        await asyncio.gather(
            *(
                kube.request(
                    "PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": taints}}, MERGE_PATCH
                )
                for n in nodes
            )
        )

    async with _watching(api, namespace) as (run, seen):
        names, _, _, up = await _up(kube, namespace, run, seen, selectors, concurrency)
        t1 = time.monotonic()
        await taint([{"key": taint_key, "effect": "NoExecute"}])
        try:
            await _all("evicted", lambda: all(n in seen.gone for n in names))
        finally:
            await taint([])
        gone = sorted(seen.gone[n] - t1 for n in names)
    return {
        "pods": count,
        "nodes": len(nodes),
        "up_s": round(up[-1], 2),
        "evict_first_s": round(gone[0], 2),
        "evict_half_s": round(statistics.median(gone), 2),
        "evict_s": round(gone[-1], 2),
        "evict_pods_per_s": round(count / gone[-1], 1),
    }


def describe(f: Mapping[str, Any]) -> str:
    return (
        f"{f['pods']} pods, {f['concurrency']} requests in flight: up {f['up_s']} s"
        f" ({f['up_pods_per_s']} pods/s, half by {f['up_half_s']} s), down {f['down_s']} s"
        f" ({f['down_pods_per_s']} pods/s)"
    )


async def _alone(kubeconfig: str, namespace: str, count: int) -> dict[str, Any]:
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    try:
        return await measure(api, namespace, count)
    finally:
        await api.close()


def wait_default_service_account(kubectl: list[str], namespace: str, limit: float = 90) -> None:
    """Pods are refused until the controller-manager made the namespace's ServiceAccount."""
    deadline = time.monotonic() + limit
    while True:
        try:
            sh(*kubectl, "-n", namespace, "get", "serviceaccount", "default")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    args = parser.parse_args()
    result: dict[str, Any] = machine()
    with cluster(args.kubeconfig, args.pods + 100) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        namespace = f"bench-floor-{os.getpid()}"
        sh(*k, "create", "namespace", namespace)
        wait_default_service_account(k, namespace)
        try:
            result |= asyncio.run(_alone(config, namespace, args.pods))
        finally:
            sh(*k, "delete", "namespace", namespace, "--wait=false")
    result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    result.pop("marks", None)
    print(json.dumps(result))
    print(describe(result))


if __name__ == "__main__":
    main()
