"""What a tenant's objects cost the controller's memory (issue 31): ConfigMaps carrying
our labels that no job of ours controls.

Anyone who may create ConfigMaps in a served namespace can give them the v1 labels the
child caches select. For each controller measured (this checkout, and with ``--baseline
REF`` that revision's, exported to a temporary directory): start it on a fresh namespace,
read its RSS once it is ready, create ``--count`` ConfigMaps of ``--size-mb`` MB each with
our labels and no owner, let it settle, and read its RSS again.

    python -m bench.foreign [--count 40] [--size-mb 1] [--baseline REF]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.cluster import (
    ROOT,
    Controller,
    bench_main,
    beside_baseline,
    cluster,
    install_crd,
    kubectl_binary,
    machine,
    revision_tree,
    rss_mb,
    sh,
)
from mpijob_elastic.core import names

# How long the controller gets to receive the objects (a watch event each) and let go of
# what it does not keep; RSS is read every second and the last reading reported.
SETTLE_SECONDS = 20


def foreign(index: int, size_mb: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"foreign-{index}",
            "labels": names.object_labels(f"foreign-{index}", None),
        },
        # Under the API server's 1 MiB object limit with the metadata.
        "data": {"blob": "x" * int(size_mb * 1_000_000)},
    }


async def measure(
    kubeconfig: str, k: list[str], root: Path, count: int, size_mb: float
) -> dict[str, float]:
    namespace = f"bench-foreign-{os.getpid()}-{int(time.time())}"
    sh(*k, "create", "namespace", namespace)
    controller = Controller(kubeconfig, namespaces=namespace, root=root)
    try:
        controller.start()
        await controller.ready()
        await asyncio.sleep(3)
        before = rss_mb(controller.pid)
        for i in range(count):
            sh(*k, "create", "-n", namespace, "-f", "-", input=json.dumps(foreign(i, size_mb)))
        peak = after = before
        for _ in range(SETTLE_SECONDS):
            await asyncio.sleep(1)
            after = rss_mb(controller.pid)
            peak = max(peak, after)
        return {
            "rss_before_mb": round(before, 1),
            "rss_after_mb": round(after, 1),
            "rss_peak_mb": round(peak, 1),
            "grew_mb": round(after - before, 1),
        }
    finally:
        controller.stop()
        sh(*k, "delete", "namespace", namespace, "--wait=false")


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine(), "count": args.count, "size_mb": args.size_mb}
    with cluster(args.kubeconfig) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        result["ours"] = asyncio.run(measure(config, k, ROOT, args.count, args.size_mb))
        if args.baseline:
            with revision_tree(args.baseline) as tree:
                result["baseline"] = {
                    "ref": args.baseline,
                    **asyncio.run(measure(config, k, tree, args.count, args.size_mb)),
                }
    return result


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    rows = [
        f"{r['count']} ConfigMaps of {r['size_mb']:g} MB with our labels, no owner "
        f"({m['date']}, {m['cpus']} CPUs, load {m['load']})",
        "| controller | RSS before | RSS after | peak | grew |",
        "|---|---|---|---|---|",
    ]
    for name, x in beside_baseline(r):
        rows.append(
            f"| {name} | {x['rss_before_mb']} MB | {x['rss_after_mb']} MB | "
            f"{x['rss_peak_mb']} MB | {x['grew_mb']} MB |"
        )
    return "\n".join(rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--size-mb", type=float, default=1.0)


def main() -> None:
    bench_main(__doc__, options, run, table)


if __name__ == "__main__":
    main()
