"""Benchmark: how long a job goes without a controller when the leader of two goes away.

Two controllers run with ``--leader-elect`` (client-go's timings unless told otherwise)
against the local KWOK cluster, or the cluster named by MPIJOB_ELASTIC_KUBECONFIG. Each
round signals the leader (SIGKILL: it vanishes and its Lease must expire; SIGTERM: it
releases the Lease) and at once scales a job, so the new leader has a write to make. Two
figures per round, from the controllers' own JSON logs (one machine, one clock):

* take-over: the signal -> the standby logs "became the leader";
* first write: the signal -> the new leader's first write (the scaled job's new worker).

The signalled process is started again as the new standby before the next round.

    python -m bench.failover [--rounds N] [--lease-duration S --renew-deadline S --retry-period S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster import install_crd
from mpijob_elastic.core import names

ROOT = Path(__file__).resolve().parent.parent
JOB = "failover"


def sh(*args: str, input: str | None = None) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, input=input).stdout


def wait(predicate: Callable[[], Any], limit: float, what: str) -> Any:
    deadline = time.monotonic() + limit
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {limit:g}s")
        time.sleep(0.05)
    return value


@dataclass
class Controller:
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0

    def start(self) -> None:
        # A log per start, kept: a restarted process must not show its earlier leadership.
        self.starts += 1
        self.log = self.log.with_name(f"{self.log.name.split('.')[0]}.{self.starts}.log")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait(lambda: self.first("waiting to lead") is not None, 120, "cache sync")

    def entries(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def first(self, msg: str, since: float = 0.0, path: str = "") -> dict[str, Any] | None:
        return next(
            (
                e
                for e in self.entries()
                if e.get("msg") == msg and e["ts"] >= since and path in str(e.get("path", ""))
            ),
            None,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def controller_argv(kubeconfig: str, namespace: str, timing_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mpijob_elastic.app.cli",
        "run",
        "--kubeconfig",
        kubeconfig,
        "--namespaces",
        namespace,
        "--kubectl-delivery",
        "none",
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "--leader-elect",
        "--leader-elect-resource-namespace",
        namespace,
        *timing_args,
    ]


def job_manifest(workers: int) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": JOB,
            "annotations": {
                names.ANN_MIN_REPLICAS: "1",
                names.ANN_MAX_REPLICAS: "8",
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


def hand_over(
    leader: Controller, standby: Controller, mode: str, k: list[str], namespace: str, workers: int
) -> tuple[float, float]:
    """Signal the leader, scale the job; seconds to the take-over and to the first write."""
    assert leader.proc is not None
    signalled = time.time()
    leader.proc.send_signal(signal.SIGKILL if mode == "SIGKILL" else signal.SIGTERM)
    scaled = 3 if workers == 2 else 2
    sh(*k, "scale", "-n", namespace, f"mpijob/{JOB}", f"--replicas={scaled}")
    led = wait(lambda: standby.first("became the leader", signalled), 120, "a take-over")
    wrote = wait(lambda: standby.first("api write", signalled, path="/pods"), 60, "a write")
    return led["ts"] - signalled, wrote["ts"] - signalled


def run(kubeconfig: str, kubectl: str, rounds: int, timing_args: list[str]) -> dict[str, Any]:
    namespace = f"bench-failover-{os.getpid()}"
    k = [kubectl, "--kubeconfig", kubeconfig]
    install_crd(k)
    sh(*k, "create", "namespace", namespace)
    sh(*k, "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=60s")
    logs = Path(tempfile.mkdtemp(prefix="failover-"))
    argv = controller_argv(kubeconfig, namespace, timing_args)
    procs = [Controller(argv, logs / f"controller-{i}.log") for i in range(2)]
    figures: dict[str, list[tuple[float, float]]] = {"SIGKILL": [], "SIGTERM": []}
    exits: list[int | None] = []
    try:
        for proc in procs:
            proc.start()
        sh(*k, "create", "-n", namespace, "-f", "-", input=json.dumps(job_manifest(2)))
        workers = 2
        for n in range(2 * rounds):
            mode = "SIGKILL" if n % 2 == 0 else "SIGTERM"
            leader = wait(
                lambda: next((p for p in procs if p.first("became the leader")), None),
                60,
                "a leader",
            )
            (standby,) = [p for p in procs if p is not leader]
            # Both settled: the standby waits, the leader has written all it had to.
            time.sleep(3)
            led, wrote = hand_over(leader, standby, mode, k, namespace, workers)
            workers = 3 if workers == 2 else 2
            assert leader.proc is not None
            exits.append(leader.proc.wait(30))
            figures[mode].append((led, wrote))
            print(f"{mode}: took over {led:5.2f}s, first write {wrote:5.2f}s after the signal")
            leader.start()  # the next standby
    finally:
        for proc in procs:
            proc.stop()
        sh(*k, "delete", "namespace", namespace, "--wait=false")
    return {
        "logs": str(logs),
        "load_average": os.getloadavg(),
        "exit_codes": exits,
        **{
            mode: {
                "take_over_s": summary([f[0] for f in values]),
                "first_write_s": summary([f[1] for f in values]),
            }
            for mode, values in figures.items()
        },
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each signal")
    parser.add_argument("--lease-duration", type=float)
    parser.add_argument("--renew-deadline", type=float)
    parser.add_argument("--retry-period", type=float)
    args = parser.parse_args()
    timing_args = [
        f"--leader-elect-{flag.replace('_', '-')}={value:g}"
        for flag in ("lease_duration", "renew_deadline", "retry_period")
        if (value := getattr(args, flag)) is not None
    ]
    bin_dir = sh(str(ROOT / "hack/build-binaries.sh")).strip()
    kubeconfig = os.environ.get("MPIJOB_ELASTIC_KUBECONFIG")
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER="mpijob-elastic-bench-failover")
    started = kubeconfig is None
    if kubeconfig is None:
        up = [str(ROOT / "hack/cluster-up.sh")]
        out = subprocess.run(up, env=env, check=True, capture_output=True, text=True).stdout
        kubeconfig = out.strip().splitlines()[-1]
    try:
        result = run(kubeconfig, f"{bin_dir}/kubectl", args.rounds, timing_args)
    finally:
        if started:
            subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)
    print(json.dumps(result))
    print(f"controller logs: {result['logs']}")


if __name__ == "__main__":
    main()
