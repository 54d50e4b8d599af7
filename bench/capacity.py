"""Benchmark: how much idle GPU capacity an opportunistic job harvests (issue 21,
docs/capacity.md), against the same job at a fixed size, on one capacity trace.

The local KWOK cluster gets a pool of fake GPU nodes (2 GPUs each, tainted so that only
the benchmark's workers go there). The job (Worker replicas 2, max-replicas 8, one GPU a
worker) runs the mock Horovod driver as a local process (e2e/harness.py), whose record
says which hosts trained when. A trace, time compressed, changes the capacity: nodes
added, nodes drained and removed, a higher-priority workload (pods at priority 0, above
the opportunistic workers' -100) arriving and leaving. Each trace runs twice in the same
run: ``opportunistic`` (the annotation on) and ``fixed`` (the same job without it).
``scripted`` is a fixed trace; ``random`` is drawn from ``--seed``. The scripted trace runs
a third time, ``opportunistic, ignores SIGTERM``: the worker command ignores SIGTERM, so a
preempted worker holds its GPU for its whole grace period (``SIGTERM_GRACE``, time
compressed), as a real kubelet would keep it (KWOK: the ``pod-delete-ignoring-sigterm``
stage of ``hack/kwok/stages.yaml``); the default command ends its container once its ranks
have left.

Figures per run:

* ``harvest``: GPU-seconds the job trained on (hosts with a running rank, per the driver,
  counted up to what it could use at the moment) over the GPU-seconds it could have used
  (the pool's GPUs less the higher-priority pods', at most max-replicas; a node counts as
  gone from the start of its drain), integrated over the trace;
* the higher-priority pods' wait, creation to Running (polled every 0.1 s);
* churn: worker pods the job created and deleted, per hour of the trace (a watch);
* resets: the driver's resets (host-list changes it acted on) during the trace;
* ``failures`` and ``blacklists`` in the driver's record.

    python -m bench.capacity [--seed N] [--trace both|scripted|random] [--rank-start-seconds S]
        [--kubeconfig FILE]   (make bench-capacity; BENCH_CAPACITY_ARGS passes these)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from bench.cluster import cluster_up, goodput_between, job_seconds, kubectl_binary, machine
from e2e.harness import ElasticRun, mock_driver_args
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster, fake_gpu_node, on_gpu_pool
from tests.controller import wait_for

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
CRD = ROOT / "config" / "crd" / "kubeflow.org_mpijobs.yaml"
PRIORITY_CLASS = ROOT / "config" / "default" / "priority_class.yaml"
CLUSTER = "mpijob-elastic-bench-capacity"
POOL = "bench-gpu"
TAINT = "example.com/bench-gpu"
GPUS_PER_NODE = 2
BASELINE, MAXIMUM = 2, 8
BACKOFF_CAP = 20
# The grace period of the SIGTERM-ignoring variant: Kubernetes' default of 30 s compressed
# like the backoff cap, and shorter than the scripted trace's higher-priority pods stay.
SIGTERM_GRACE = 10
IGNORES_SIGTERM = "kwok.mpijob-elastic.io/ignores-sigterm"
OPPORTUNISTIC, FIXED, NO_TERM = "opportunistic", "fixed", "opportunistic, ignores SIGTERM"
VARIANTS = {OPPORTUNISTIC: "opp", FIXED: "fixed", NO_TERM: "noterm"}  # namespace suffixes
# (seconds into the trace, action, argument): "nodes" sets the pool's size, "high" the
# higher-priority pods (one GPU each).
Trace = list[tuple[float, str, int]]
SCRIPTED: Trace = [
    (0, "nodes", 2),
    (12, "nodes", 4),
    (30, "high", 3),
    (45, "high", 0),
    (55, "nodes", 3),
    (70, "nodes", 4),
    (85, "end", 0),
]


def random_trace(seed: int, length: float = 85, step: float = 12) -> Trace:
    rng = random.Random(seed)
    trace: Trace = [(0, "nodes", 2)]
    t = step
    while t < length:
        if rng.random() < 0.5:
            trace.append((t, "nodes", rng.randint(1, 4)))
        else:
            trace.append((t, "high", rng.randint(0, 4)))
        t += step * rng.uniform(0.7, 1.3)
    trace.append((length, "end", 0))
    return trace


@dataclass
class Pool:
    cluster: Cluster
    nodes: int = 0
    high: dict[str, float] = field(default_factory=dict)  # name -> created (monotonic)
    waits: list[float] = field(default_factory=list)
    namespace: str = ""

    def node_name(self, i: int) -> str:
        return f"{POOL}-{i}"

    def set_nodes(self, n: int) -> None:
        for i in range(self.nodes, n):
            self.cluster.apply(
                fake_gpu_node(self.node_name(i), GPUS_PER_NODE, TAINT, {"pool": POOL})
            )
        for i in range(n, self.nodes):
            # A node that goes away: drained (evictions honour the budgets), then deleted.
            node = self.node_name(i)
            self.cluster.kubectl(
                "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                "--timeout=20s", check=False,
            )  # fmt: skip
            self.cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        self.nodes = n

    def set_high(self, n: int) -> None:
        names_ = sorted(self.high)
        for name in names_[n:]:
            self.cluster.kubectl(
                "delete", "pod", name, "-n", self.namespace, "--grace-period=0", "--force",
                check=False,
            )  # fmt: skip
            del self.high[name]
        for i in range(len(names_), n):
            name = f"high-{time.monotonic_ns()}-{i}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "bench-high"}},
                "spec": {
                    "nodeSelector": {"pool": POOL},
                    "tolerations": [{"key": TAINT, "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
            self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(pod))
            self.high[name] = time.monotonic()

    def poll_high(self, pending: dict[str, float]) -> None:
        out = json.loads(
            self.cluster.kubectl(
                "get", "pods", "-n", self.namespace, "-l", "app=bench-high", "-o", "json"
            ).stdout
        )
        for pod in out["items"]:
            name = pod["metadata"]["name"]
            if name in pending and pod["status"].get("phase") == "Running":
                self.waits.append(time.monotonic() - pending.pop(name))

    def usable(self, nodes: int | None = None) -> int:
        """GPUs the job could use: the pool's, less the higher-priority pods', at most
        max-replicas."""
        count = self.nodes if nodes is None else nodes
        return max(min(count * GPUS_PER_NODE - len(self.high), MAXIMUM), 0)


def job(name: str, grows: bool, ignores_sigterm: bool = False) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["metadata"]["annotations"].update(
        {names.ANN_MAX_REPLICAS: str(MAXIMUM), names.ANN_DRAIN_SECONDS: "15"}
    )
    if grows:
        manifest["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]
    worker["replicas"] = BASELINE
    spec = worker["template"]["spec"]
    on_gpu_pool(spec, {"pool": POOL}, TAINT)
    if ignores_sigterm:
        worker["template"].setdefault("metadata", {})["annotations"] = {IGNORES_SIGTERM: "true"}
        spec["terminationGracePeriodSeconds"] = SIGTERM_GRACE
    return manifest


class Churn:
    """Worker pods of the job created and deleted, from a watch."""

    def __init__(self, kubeconfig: str, namespace: str, job_name: str) -> None:
        self.created = self.deleted = 0
        self._stop = threading.Event()
        api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self._core = client.CoreV1Api(api)
        self._selector = names.selector(job_name, names.ROLE_WORKER)
        self._ns = namespace
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for item in w.stream(  # type: ignore[no-untyped-call]
            self._core.list_namespaced_pod, self._ns, label_selector=self._selector
        ):
            if item["type"] == "ADDED":
                self.created += 1
            elif item["type"] == "DELETED":
                self.deleted += 1
            if self._stop.is_set():
                w.stop()  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        self._stop.set()


def harvest(
    records: list[dict[str, Any]], usable: list[tuple[float, int]], end: float
) -> tuple[float, float]:
    """GPU-seconds trained on usable GPUs, and usable GPU-seconds, from ``usable[0]`` to
    ``end`` (wall clock). ``usable``: (since, GPUs the job could use), in order; a GPU with
    a rank counts only up to what was usable then (a node being drained is gone)."""
    changes = sorted(
        [(r["ts"], "rank", 1 if r["event"] == ev.RANK_RUNNING else -1) for r in records]
        + [(t, "usable", n) for t, n in usable]
    )
    start = usable[0][0]
    ranks, room, last, trained, available = 0, 0, start, 0.0, 0.0
    for ts, kind, value in changes:
        ts = min(max(ts, start), end)
        trained += min(ranks, room) * (ts - last)
        available += room * (ts - last)
        last = ts
        if kind == "rank":
            ranks += value
        else:
            room = value
    trained += min(ranks, room) * (end - last)
    available += room * (end - last)
    return trained, available


@dataclass
class Result:
    trace: str
    variant: str
    harvest: float
    waits: list[float]
    created: int
    deleted: int
    hours: float
    failures: int
    blacklists: int
    resets: int
    # The share of the trace's time the job trained at its target (docs/operations.md,
    # "Goodput"), as the controller counts it; None if it counted none.
    goodput: float | None


def run_trace(
    cluster_: Cluster,
    kubeconfig: str,
    tag: str,
    trace: Trace,
    variant: str,
    workdir: Path,
    rank_start: float,
) -> Result:
    grows = variant != FIXED
    namespace = f"bench-cap-{tag}-{VARIANTS[variant]}"
    cluster_.kubectl("create", "namespace", namespace)
    pool = Pool(cluster_, namespace=namespace)
    pool.set_nodes(trace[0][2])
    run = ElasticRun(
        cluster_,
        namespace,
        job("cap", grows, ignores_sigterm=variant == NO_TERM),
        workdir / namespace,
        driver_args=mock_driver_args(
            ("-np", str(BASELINE), "--min-np", "1", "--max-np", str(MAXIMUM)),
            rank_start_seconds=rank_start,
        ),
    )
    churn = Churn(kubeconfig, namespace, "cap")
    command = [
        sys.executable, "-m", "mpijob_elastic.app.cli", "run", "--kubeconfig", kubeconfig,
        "--namespaces", namespace, "--kubectl-delivery", "none", "--log-level", "warning",
        "--growth-backoff-max-seconds", str(BACKOFF_CAP),
    ]  # fmt: skip
    controller = subprocess.Popen(command, cwd=ROOT)
    try:
        run.submit()
        run.start_launcher(timeout=120)
        # The opportunistic job grows at once: wait for the baseline's ranks at least.
        wait_for(lambda: len(run.ranks_running_on()) >= BASELINE, 120, "ranks on the baseline")
        begin_wall, begin = time.time(), time.monotonic()
        seconds_before = job_seconds(cluster_, namespace, "cap")
        # The baseline's own creates, seen as the watch started, are not churn.
        created, deleted = churn.created, churn.deleted
        usable = [(begin_wall, pool.usable())]
        pending: dict[str, float] = {}
        for at, action, value in trace[1:]:
            while time.monotonic() - begin < at:
                pool.poll_high(pending)
                time.sleep(0.1)
            if action == "nodes":
                # A node going away is gone from its cordon on: record before the drain.
                usable.append((time.time(), pool.usable(min(value, pool.nodes))))
                pool.set_nodes(value)
            elif action == "high":
                before = set(pool.high)
                pool.set_high(value)
                pending.update({n: pool.high[n] for n in pool.high if n not in before})
            else:
                break
            usable.append((time.time(), pool.usable()))
        end_wall = time.time()
        share = goodput_between(seconds_before, job_seconds(cluster_, namespace, "cap"))
        records = run.driver_events(
            ev.RANK_RUNNING, ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_FAILED
        )
        trained, available = harvest(records, usable, end_wall)
        failures = len(run.driver_events(ev.RANK_FAILED, ev.EXEC_FAILED))
        blacklists = len(run.driver_events(ev.HOST_BLACKLISTED))
        resets = sum(begin_wall <= r["ts"] <= end_wall for r in run.driver_events(ev.RESET))
        return Result(
            tag,
            variant,
            trained / available if available else 0.0,
            pool.waits,
            churn.created - created,
            churn.deleted - deleted,
            (time.monotonic() - begin) / 3600,
            failures,
            blacklists,
            resets,
            share,
        )
    finally:
        churn.stop()
        run.close()
        controller.terminate()
        controller.wait(30)
        pool.set_high(0)
        pool.set_nodes(0)
        cluster_.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def table(results: list[Result], host: dict[str, Any]) -> str:
    rows = [
        f"Measured {host['date']} on {host['cpus']} cores, {host['ram_gib']} GiB, load "
        f"{host['load']} (after the run); growth backoff cap {BACKOFF_CAP} s (time "
        "compressed).",
        "",
        "| trace | job | harvest | higher-priority wait p50 / max | churn (creates, deletes "
        "per hour) | goodput | resets | failures | blacklists |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        wait = f"{statistics.median(r.waits):.1f} s / {max(r.waits):.1f} s" if r.waits else "none"
        rows.append(
            f"| {r.trace} | {r.variant} | harvest {r.harvest:.0%} | {wait} | "
            f"{r.created / r.hours:.0f}, {r.deleted / r.hours:.0f} | "
            f"{'-' if r.goodput is None else f'{r.goodput:.0%}'} | {r.resets} | "
            f"failures {r.failures} | "
            f"blacklists {r.blacklists} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="default: a local KWOK cluster of its own")
    parser.add_argument("--seed", type=int, default=21)
    # Ranks that join at once, as in the figures of issue 21: harvest counts the seconds a
    # rank trains, so a slower start lowers it the same for any controller.
    parser.add_argument("--rank-start-seconds", type=float, default=0.0)
    parser.add_argument("--trace", choices=("both", "scripted", "random"), default="both")
    args = parser.parse_args(argv)
    # The random trace's higher-priority pods may never run (seed 21: they do not), so the
    # SIGTERM variant, which is about their wait, runs on the scripted trace only.
    traces: list[tuple[str, Trace, tuple[str, ...]]] = [
        ("scripted", SCRIPTED, (OPPORTUNISTIC, FIXED, NO_TERM)),
        (f"random (seed {args.seed})", random_trace(args.seed), (OPPORTUNISTIC, FIXED)),
    ]
    traces = [t for t in traces if args.trace in ("both", t[0].split()[0])]
    results: list[Result] = []
    # A cluster of its own: other benchmarks share mpijob-elastic-bench.
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER=CLUSTER)
    kubeconfig = args.kubeconfig or cluster_up(env)
    try:
        c = Cluster(kubeconfig, kubectl_binary())
        c.kubectl("apply", "-f", str(PRIORITY_CLASS), "-f", str(CRD))
        c.wait_established("mpijobs.kubeflow.org")
        with tempfile.TemporaryDirectory() as tmp:
            for i, (tag, trace, variants) in enumerate(traces):
                for variant in variants:
                    result = run_trace(
                        c, kubeconfig, str(i), trace, variant, Path(tmp), args.rank_start_seconds
                    )
                    result.trace = tag
                    results.append(result)
                    print(table(results[-1:], machine()).splitlines()[-1], flush=True)
    finally:
        if not args.kubeconfig:
            subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)
    print()
    print(f"ranks join {args.rank_start_seconds:g} s after their start, with the commit hook")
    print(table(results, machine()))


if __name__ == "__main__":
    main()
