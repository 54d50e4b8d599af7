"""Benchmark: a colocated job relocated off a cordoned node, with slow rank starts (issue 30).

``make bench-relocation``: on a local KWOK cluster of its own, the job of
e2e/test_relocation.py's cordon test (3 workers all on one node, min-replicas 1, drain
15 s, the mock Horovod driver as a local process through e2e.harness.ElasticRun) is
relocated by ``kubectl cordon`` of the node that holds every worker, until every
replacement holds a joined rank and the old workers are gone from the API (or the driver
exits, or ``--timeout`` passes). The cordon comes once the job trains in a steady state:
past the reset bound of its start (35 s after its last rank started), which a controller
without the commit marker waits out before it changes the host list. Each row runs on a
fresh namespace and controller:

* this checkout's controller, ranks taking 2 s and 20 s from their start to joining
  (``--rank-start-seconds``), each with the training's commit hook (the marker that tells
  the controller a reset has ended) and without it (the controller waits out the reset
  bound: the Gloo timeout + 5 s after the latest new rank's start);
* the peer: the controller of ``--baseline`` (bc8de50, the revision before issue 30, which
  took a remote shell that ran 5 s as a rank that had joined), exported to a temporary
  directory and run the same way, at 20 s without the hook and with it (its kubexec.sh
  does not report the marker, so the two differ only by chance).

Per row, in seconds from the cordon: the first replacement rank running, every
replacement rank joined, the last old host unlisted, the old workers deleted; and, from
the driver's record since the cordon, failures (``rank_failed``), blacklists
(``host_blacklisted``), host updates lost in a reset (``hosts_update_lost``) and whether
the job ended (``driver_exit``, the MPIJob Failed). Every row's timeline, controller log
and driver record stay in bench/out/relocation/<run>/.

    python -m bench.relocation [--repeat N] [--baseline REF] [--kubeconfig FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster import cluster_up, free_port, kubectl_binary, machine
from e2e.harness import EXIT_ANNOTATION, ElasticRun, Step, report, seconds
from e2e.mockhorovod import events as ev
from e2e.test_relocation import (
    WORKERS,
    colocation_node,
    relocated,
    start_job,
)
from mpijob_elastic.core import names
from mpijob_elastic.core.hosts.host_rules import reset_bound
from mpijob_elastic.core.spec.model import DEFAULT_GLOO_TIMEOUT_SECONDS
from tests.cluster import ROOT, Cluster

CRD = ROOT / "config" / "crd" / "kubeflow.org_mpijobs.yaml"
CLUSTER = "mpijob-elastic-bench-relocation"
BASELINE = "bc8de50"
MIN_REPLICAS = 1
# After the end: a failure's blacklist comes at the driver's next commit (1 s).
SETTLE = 3.0
# The cordon comes once the job trains in a steady state: past the reset bound of its
# start (the Gloo timeout + 5 s after its last rank started, with a margin), which a
# controller without the commit marker waits out before any host-list change.
STEADY = reset_bound(DEFAULT_GLOO_TIMEOUT_SECONDS).total_seconds() + 2.0


@dataclass(frozen=True)
class Variant:
    rank_start: float
    hook: bool
    # None: this checkout's controller; else the git revision whose controller runs.
    revision: str | None = None

    @property
    def tag(self) -> str:
        who = self.revision or "new"
        return f"{who}-{self.rank_start:g}s-{'hook' if self.hook else 'nohook'}"


def variants(baseline: str) -> list[Variant]:
    return [
        Variant(2, True),
        Variant(2, False),
        Variant(20, True),
        Variant(20, False),
        Variant(20, False, baseline),
        Variant(20, True, baseline),
    ]


def checkout() -> str:
    """The revision this checkout's controller runs: HEAD, and whether the controller's
    files differ from it (others may edit the same checkout meanwhile)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "mpijob_elastic"], capture_output=True, text=True
    )
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


@dataclass
class Row:
    variant: Variant
    # The revision whose controller ran (this checkout's at the row's start).
    revision: str = ""
    first_rank: float | None = None
    joined: float | None = None
    unlisted: float | None = None
    deleted: float | None = None
    gone: float | None = None
    failures: int = 0
    blacklists: int = 0
    lost: int = 0
    # Failure events before the cordon (the start), which should be none.
    before: int = 0
    ended: str = "no"
    fatal: list[str] = field(default_factory=list)
    error: str = ""
    timeline: str = ""


class ControllerRun:
    """A controller as a child process, of this checkout or of an exported revision, its
    log (JSON) in the row's directory."""

    def __init__(self, kubeconfig: str, namespace: str, root: Path, log: Path) -> None:
        self.port = free_port()
        command = [
            sys.executable, "-m", "mpijob_elastic.app.cli", "run", "--kubeconfig", kubeconfig,
            "--namespaces", namespace, "--kubectl-delivery", "none", "--log-format", "json",
            "--health-port", str(self.port),
        ]  # fmt: skip
        with log.open("ab") as out:
            self.proc = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT)

    def ready(self, limit: float = 120) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError("controller not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def since(run: ElasticRun, step: Step, *kinds: str) -> list[dict[str, Any]]:
    return [e for e in run.driver_events(*kinds) if e["ts"] >= step.started]


def gone(run: ElasticRun, step: Step, old: set[str]) -> bool:
    removed = {e["pod"] for e in run.volume_events("pod_removed") if e["ts"] >= step.started}
    return old <= removed


def figures(run: ElasticRun, step: Step, old: set[str], row: Row, done: set[str] | None) -> None:
    """The row's figures from the driver's and the kubelet stand-in's records, each None
    (never) where its moment did not come."""
    t0 = step.started
    new_ranks = [e for e in since(run, step, ev.RANK_RUNNING) if e["host"] not in old]
    row.first_rank = min((e["ts"] - t0 for e in new_ranks), default=None)
    firsts: dict[str, float] = {}
    for e in new_ranks:
        firsts.setdefault(e["host"], e["ts"] - t0)
    if done is not None:
        # The moment the last host of the relocated list got its rank.
        row.joined = max(firsts[h] for h in done)
    elif len(firsts) >= WORKERS:
        # Never relocated (the job ended, or the timeout): when WORKERS new hosts had ranks.
        row.joined = sorted(firsts.values())[WORKERS - 1]
    discoveries = since(run, step, ev.DISCOVERY)
    unlisted = [
        min((e["ts"] - t0 for e in discoveries if h not in e["hosts"]), default=None) for h in old
    ]
    row.unlisted = None if None in unlisted else max(u for u in unlisted if u is not None)
    moves = run.moves(step, {w: "" for w in old})
    deleted = [m.deleted for m in moves]
    row.deleted = None if None in deleted else max(d for d in deleted if d is not None)
    removed = [m.gone for m in moves]
    row.gone = None if None in removed else max(g for g in removed if g is not None)
    row.failures = len(since(run, step, ev.RANK_FAILED))
    row.blacklists = len(since(run, step, ev.HOST_BLACKLISTED))
    row.lost = len(since(run, step, ev.HOSTS_UPDATE_LOST))
    row.before = len([e for e in run.driver_events(*ev.FAILURE_EVENTS) if e["ts"] < step.started])
    # The events that end the job; a lost update has a column of its own.
    ending = ev.FATAL_EVENTS - {ev.HOSTS_UPDATE_LOST}
    row.fatal = sorted({e["event"] for e in since(run, step, *ending)})
    row.timeline = (
        f"TIMELINE: {step.label} at +0.00s -> first replacement rank {seconds(row.first_rank)}"
        f" -> every replacement rank joined {seconds(row.joined)} -> last old host unlisted "
        f"{seconds(row.unlisted)} -> old workers deleted {seconds(row.deleted)} (gone from the "
        f"API {seconds(row.gone)})"
    )


def job_failed(run: ElasticRun) -> bool:
    job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
    return any(
        c["type"] == "Failed" and c["status"] == "True"
        for c in job.get("status", {}).get("conditions", [])
    )


def relocate(
    cluster: Cluster,
    kubeconfig: str,
    variant: Variant,
    root: Path,
    out: Path,
    timeout: float,
    index: int,
) -> Row:
    row = Row(variant)
    workdir = out / f"{index}-{variant.tag}"
    workdir.mkdir(parents=True, exist_ok=True)
    namespace = f"bench-reloc-{os.getpid()}-{index}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=60s"
    )
    row.revision = variant.revision or checkout()
    controller = ControllerRun(kubeconfig, namespace, root, workdir / "controller.log")
    node = colocation_node(cluster)
    run: ElasticRun | None = None
    try:
        controller.ready()
        run = start_job(
            cluster, namespace, workdir, "colocated", node, MIN_REPLICAS,
            marker=variant.hook, rank_start_seconds=variant.rank_start,
        )  # fmt: skip
        started = max(e["ts"] for e in run.driver_events(ev.RANK_STARTED))
        time.sleep(max(0.0, started + STEADY - time.time()))
        old = set(run.discovered())
        step = run.begin(f"kubectl cordon {node}: {', '.join(sorted(old))} on it")
        cluster.kubectl("cordon", node)
        deadline = time.time() + timeout
        done: set[str] | None = None
        while time.time() < deadline:
            if run.driver_events(ev.DRIVER_EXIT):
                break
            done = done or relocated(run, old)
            if done and gone(run, step, old):
                break
            time.sleep(0.5)
        else:
            row.error = f"not relocated in {timeout:g} s"
        time.sleep(SETTLE)
        exits = run.driver_events(ev.DRIVER_EXIT)
        if exits:
            code = int(exits[-1]["exit_code"])
            # The launcher pod ends as the kubelet would end it, with the driver's code.
            run.kubectl(
                "annotate", "pod", names.launcher_name(run.job), f"{EXIT_ANNOTATION}={code}"
            )
            time.sleep(5)
            row.ended = f"driver exit {code}" + (", job Failed" if job_failed(run) else "")
        elif job_failed(run):
            row.ended = "job Failed"
        figures(run, step, old, row, done)
        step.lines.append(row.timeline)
        print(f"FIGURE {variant.tag}: {row.timeline}", flush=True)
    except Exception as e:  # a row that breaks is reported, the others still run
        row.error = f"{type(e).__name__}: {e}"
        print(f"row {variant.tag} broke: {row.error}", file=sys.stderr, flush=True)
    finally:
        cluster.kubectl("uncordon", node, check=False)
        if run is not None:
            run.close()
            report(run, variant.tag, out)
        controller.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    return row


def table(rows: list[Row], host: dict[str, Any], load_after: str, wall: float) -> str:
    def s(x: float | None) -> str:
        return "never" if x is None else f"{x:.1f}"

    lines = [
        f"Measured {host['date']} on {host['cpus']} cores, {host['ram_gib']} GiB; load "
        f"average before {host['load']}, after {load_after}; {wall / 60:.1f} min in all. "
        f"{WORKERS} workers on one node, min-replicas {MIN_REPLICAS}, drain 15 s; seconds "
        "from `kubectl cordon` of that node.",
        "",
        "| controller | rank start | commit hook | first replacement rank | every replacement "
        "rank joined | last old host unlisted | old workers deleted | failures | blacklists "
        "| lost host updates | job ended |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r.variant
        ended = r.ended
        if r.fatal:
            ended += f" ({', '.join(r.fatal)})"
        if r.error:
            ended += f"; {r.error}"
        lines.append(
            f"| {r.revision if v.revision else f'this checkout, {r.revision}'} "
            f"| {v.rank_start:g} s | {'yes' if v.hook else 'no'} "
            f"| {s(r.first_rank)} | {s(r.joined)} | {s(r.unlisted)} | {s(r.deleted)} "
            f"| {r.failures} | {r.blacklists} | {r.lost} | {ended} |"
        )
    odd = [r for r in rows if r.before]
    for r in odd:
        lines.append(f"\n{r.variant.tag}: {r.before} failure events before the cordon.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="default: a local KWOK cluster of its own")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each row")
    parser.add_argument("--baseline", default=BASELINE, help="the peer's git revision")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a row may take")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "relocation.md")
    args = parser.parse_args(argv)
    host = machine()
    started = time.monotonic()
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER=CLUSTER)
    kubeconfig = args.kubeconfig or cluster_up(env)
    rows: list[Row] = []
    out = args.out.parent / "relocation" / time.strftime("%Y%m%d-%H%M%S")
    try:
        cluster = Cluster(kubeconfig, kubectl_binary())
        cluster.kubectl("apply", "-f", str(CRD))
        cluster.wait_established("mpijobs.kubeflow.org")
        with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tree:
            # The older controller, as a plain tree of that revision's files (bench.idle).
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            for _ in range(args.repeat):
                for variant in variants(args.baseline):
                    root = Path(tree) if variant.revision else ROOT
                    row = relocate(cluster, kubeconfig, variant, root, out, args.timeout, len(rows))
                    rows.append(row)
                    print(table(rows[-1:], host, "-", 0).splitlines()[-1], flush=True)
    finally:
        if not args.kubeconfig:
            subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)
    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = table(rows, host, load_after, time.monotonic() - started)
    timelines = "\n".join(f"- {r.variant.tag}: {r.timeline or r.error}" for r in rows)
    print(f"\n{text}\n{timelines}\n(records in {out})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    record = {
        "machine": host,
        "load_after": load_after,
        "rows": [asdict(r) for r in rows],
    }
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
