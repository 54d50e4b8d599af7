"""What a launcher that floods the controller's exec read costs its memory (issue 31).

Where a launcher's remote shells report nothing, a scale-in's drain reads the launcher's
process list by exec (core/inputs/ranks.py, ``PROBE_COMMAND``), at most once a second, for
the whole drain. The command runs in the user's image, which may print anything: here its
``cat`` prints ``--gigabytes`` GB of NULs at each read. On KWOK an exec runs on this
machine; hack/kwok/exec.yaml gives this bench's launcher pod (``flood-launcher`` in
``bench-exec-flood``) a PATH that finds the bench's ``cat`` first. So the flood is the local
KWOK cluster's alone: on another cluster the launcher's ``cat`` is its image's.

For each controller measured (this checkout, and with ``--baseline REF`` that revision's):
start it on the namespace, run a job of 3 workers until its launcher runs, read its RSS,
scale the job to 1 with a 60 s drain, read the RSS every half second for ``--seconds``,
and count the reads the launcher served.

    python -m bench.exec_flood [--gigabytes 1] [--seconds 30] [--baseline REF]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
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
    job_manifest,
    kubectl_binary,
    machine,
    revision_tree,
    rss_mb,
    sh,
)
from mpijob_elastic.core import names

# Named in hack/kwok/exec.yaml, which KWOK reads when the cluster starts.
NAMESPACE = "bench-exec-flood"
JOB = "flood"
TOOLS = Path("/tmp/mpijob-elastic-bench-flood")
CALLS = TOOLS / "calls"
# Long enough that the drain outlasts the measurement: reads go on throughout.
DRAIN_SECONDS = "60"


def install_cat(gigabytes: float) -> None:
    """The launcher image's ``cat``: counts its call, then prints without end in sight."""
    TOOLS.mkdir(exist_ok=True)
    cat = TOOLS / "cat"
    cat.write_text(
        f"#!/bin/sh\necho read >> {CALLS}\nexec head -c {int(gigabytes * 1e9)} /dev/zero\n"
    )
    cat.chmod(0o755)


async def wait(what: str, done: Any, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def measure(kubeconfig: str, k: list[str], root: Path, seconds: int) -> dict[str, float]:
    controller = Controller(kubeconfig, namespaces=NAMESPACE, root=root)
    controller.start()
    try:
        await controller.ready()
        job = job_manifest(JOB, 3, 3)
        job["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = DRAIN_SECONDS
        sh(*k, "apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(job))
        launcher = names.launcher_name(JOB)

        def running() -> bool:
            phase = sh(*k, "get", "pod", "-n", NAMESPACE, launcher, "-o",
                       "jsonpath={.status.phase}", "--ignore-not-found")  # fmt: skip
            return phase == "Running"

        await wait("the launcher running", running)
        await asyncio.sleep(3)
        before = rss_mb(controller.pid)
        CALLS.write_text("")
        scale_in = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 1}}}}
        sh(*k, "patch", "mpijob", JOB, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(scale_in))
        peak = before
        for _ in range(seconds * 2):
            await asyncio.sleep(0.5)
            peak = max(peak, rss_mb(controller.pid))
        after = rss_mb(controller.pid)
        return {
            "reads": len(CALLS.read_text().splitlines()),
            "rss_before_mb": round(before, 1),
            "rss_peak_mb": round(peak, 1),
            "rss_after_mb": round(after, 1),
            "grew_mb": round(peak - before, 1),
        }
    finally:
        controller.stop()
        sh(*k, "delete", "mpijob", JOB, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
        await wait(
            "the job's pods gone", lambda: not sh(*k, "get", "pods", "-n", NAMESPACE, "-o", "name")
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": machine(),
        "gigabytes": args.gigabytes,
        "seconds": args.seconds,
    }
    install_cat(args.gigabytes)
    try:
        with cluster(args.kubeconfig) as config:
            k = [kubectl_binary(), "--kubeconfig", config]
            install_crd(k)
            if sh(*k, "get", "namespace", NAMESPACE, "--ignore-not-found") == "":
                sh(*k, "create", "namespace", NAMESPACE)
            result["ours"] = asyncio.run(measure(config, k, ROOT, args.seconds))
            if args.baseline:
                with revision_tree(args.baseline) as tree:
                    result["baseline"] = {
                        "ref": args.baseline,
                        **asyncio.run(measure(config, k, tree, args.seconds)),
                    }
    finally:
        shutil.rmtree(TOOLS, ignore_errors=True)
    return result


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    rows = [
        f"a launcher whose process list is {r['gigabytes']:g} GB, read by a scale-in's drain "
        f"for {r['seconds']} s ({m['date']}, {m['cpus']} CPUs, load {m['load']})",
        "| controller | reads | RSS before | peak | after | grew (peak) |",
        "|---|---|---|---|---|---|",
    ]
    for name, x in beside_baseline(r):
        rows.append(
            f"| {name} | {x['reads']} | {x['rss_before_mb']} MB | {x['rss_peak_mb']} MB | "
            f"{x['rss_after_mb']} MB | {x['grew_mb']} MB |"
        )
    return "\n".join(rows)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--seconds", type=int, default=30)


def main() -> None:
    bench_main(__doc__, options, run, table)


if __name__ == "__main__":
    main()
