"""What every benchmark needs around its measurement: a cluster, a controller, the machine.

The benchmarks measure any cluster given a kubeconfig (``--kubeconfig`` or
MPIJOB_ELASTIC_KUBECONFIG); without one they bring up the local KWOK cluster
``mpijob-elastic-bench`` and take it down afterwards. They start our controller as a
process of their own, or measure one that already runs (another controller, say
training-operator's, given by its PID or not at all).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mpijob_elastic.core import names
from mpijob_elastic.core.outputs import goodput
from tests.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
BENCH_CLUSTER = "mpijob-elastic-bench"
# Pods one fake bench node takes; the test cluster's four nodes take 110 each, too few for
# a thousand jobs of eight workers.
BENCH_NODE_PODS = 1000


def sh(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        args, check=True, capture_output=True, text=True, input=input, env=env
    ).stdout


def install_crd(k: list[str]) -> None:
    """The MPIJob CRD applied with kubectl ``k`` (binary, ``--kubeconfig``, path), and
    Established."""
    sh(*k, "apply", "-f", str(ROOT / "config/crd/kubeflow.org_mpijobs.yaml"))
    Cluster(kubeconfig=k[2], kubectl_path=k[0]).wait_established("mpijobs.kubeflow.org")


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


@functools.cache
def kubectl_binary() -> str:
    return f"{sh(str(ROOT / 'hack/build-binaries.sh')).strip()}/kubectl"


@contextlib.contextmanager
def cluster(kubeconfig: str | None, pods: int = 0) -> Iterator[str]:
    """The kubeconfig to measure: the given one, or the local bench cluster's, started
    here with room for ``pods`` pods and stopped on the way out."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER=BENCH_CLUSTER)
    local = cluster_up(env)
    try:
        if pods:
            add_nodes(local, pods)
        yield local
    finally:
        subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)


def cluster_up(env: dict[str, str]) -> str:
    """The local cluster's kubeconfig. Tried twice: on a loaded machine kwokctl's own 60 s
    wait can run out (it did under a load of 20, ending a run of `make bench` before its
    last size), and a half-made cluster must go before the next try."""
    for attempt in (1, 2):
        up = subprocess.run(
            [str(ROOT / "hack/cluster-up.sh")], capture_output=True, text=True, env=env
        )
        if up.returncode == 0:
            return up.stdout.strip().splitlines()[-1]
        print(f"cluster-up failed (attempt {attempt}):\n{up.stderr}", file=sys.stderr)
        subprocess.run([str(ROOT / "hack/cluster-down.sh")], env=env, check=False)
    raise RuntimeError("the local bench cluster did not come up twice in a row")


def add_nodes(kubeconfig: str, pods: int) -> None:
    """Fake nodes for ``pods`` pods on the local cluster (bench only: tests need four)."""
    count = -(-pods // BENCH_NODE_PODS)
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(BENCH_NODE_PODS)}
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"kwok-bench-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": f"kwok-bench-{i}", "type": "kwok"},
            },
            "status": {"allocatable": capacity, "capacity": capacity},
        }
        for i in range(count)
    ]
    k = [kubectl_binary(), "--kubeconfig", kubeconfig]
    listing = {"apiVersion": "v1", "kind": "List", "items": nodes}
    sh(*k, "apply", "-f", "-", input=json.dumps(listing))
    sh(*k, "wait", "--for=condition=Ready", "node", "--all", "--timeout=300s")


def job_manifest(name: str, workers: int, max_workers: int, min_workers: int = 1) -> dict[str, Any]:
    """An elastic MPIJob of fake pods whose victims leave at once (no drain)."""
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "annotations": {
                names.ANN_MIN_REPLICAS: str(min_workers),
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


def job_seconds(api: Cluster, namespace: str, job: str) -> dict[str, float]:
    """The seconds the job spent in each state so far, as /metrics counts them from its
    status (docs/operations.md, "Goodput")."""
    found = api.raw("GET", f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{job}")
    return goodput.totals(((found or {}).get("status") or {}).get("goodput"), datetime.now(UTC))


def goodput_between(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The share of the time between two ``job_seconds`` readings spent training at the
    job's target; None if no time was counted."""
    spent = {s: after.get(s, 0.0) - before.get(s, 0.0) for s in after}
    total = sum(spent.values())
    return spent.get(goodput.FULL, 0.0) / total if total > 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Controller:
    """Our controller as a child process, with its health port."""

    kubeconfig: str
    namespaces: str = ""
    workers: int | None = None
    # The checkout whose controller runs (bench.idle runs an older revision's too).
    root: Path = ROOT
    # KWOK runs no container: the launcher's init container is neither needed nor played.
    kubectl_delivery: str = "none"
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    started_at: float = 0.0

    def start(self) -> None:
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "mpijob_elastic.app.cli",
            "run",
            "--kubeconfig",
            self.kubeconfig,
            "--kubectl-delivery",
            self.kubectl_delivery,
            "--log-level",
            "warning",
            "--health-port",
            str(self.port),
        ]
        if self.namespaces:
            args += ["--namespaces", self.namespaces]
        if self.workers is not None:
            args += ["--workers", str(self.workers)]
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(args, cwd=self.root)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def ready(self, limit: float = 600) -> float:
        """Seconds from the process start to its first /readyz 200."""
        import aiohttp

        deadline = time.monotonic() + limit
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"controller exited with {self.proc.returncode}")
                with contextlib.suppress(aiohttp.ClientError):
                    url = f"http://127.0.0.1:{self.port}/readyz"
                    async with session.get(url) as response:
                        if response.status == 200:
                            return time.monotonic() - self.started_at
                await asyncio.sleep(0.05)
        raise TimeoutError("controller not ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def revision_tree(ref: str | None) -> Iterator[Path]:
    """A temporary directory holding the files of git revision ``ref`` (empty for None),
    for running an older controller beside this checkout's."""
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tree:
        if ref:
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        yield Path(tree)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The local cluster's processes, by the program they run (the first word of their command
# line); our controller, a python process, by its module.
COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")


def _cluster_processes(kubeconfig: str) -> Iterator[tuple[int, list[str]]]:
    """The processes of the local cluster whose kubeconfig this is, found by its directory
    on their command lines: (pid, command line)."""
    home = str(Path(kubeconfig).resolve().parent)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = [
                w.decode(errors="replace")
                for w in (proc / "cmdline").read_bytes().split(b"\0")
                if w
            ]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if words and any(home in w for w in words):
            yield int(proc.name), words


def component_cpu(kubeconfig: str) -> dict[str, float]:
    """CPU seconds so far of each of the local cluster's processes, by component, and of
    our controller: what a change cost the cluster, beside the controller's own share."""
    found: dict[str, float] = {}
    for pid, words in _cluster_processes(kubeconfig):
        try:
            seconds = cpu_seconds(pid)
        except (OSError, ValueError):
            continue  # gone meanwhile
        name = "controller" if "mpijob_elastic.app.cli" in words else Path(words[0]).name
        name = next((c for c in COMPONENTS if name.startswith(c)), name)
        found[name] = found.get(name, 0.0) + seconds
    return found


def disruption_seconds(kubeconfig: str) -> float | None:
    """Seconds kube-controller-manager's disruption controller (PodDisruptionBudgets) has
    worked so far, from its /metrics (open without credentials: kwokctl allows the path);
    None where its port is not found on this machine."""
    for _, words in _cluster_processes(kubeconfig):
        if not Path(words[0]).name.startswith("kube-controller-manager"):
            continue
        port = next((w.split("=", 1)[1] for w in words if w.startswith("--secure-port=")), None)
        if port is None:
            return None
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/metrics", context=context, timeout=30
        ) as answer:
            text = answer.read().decode()
        prefix = 'workqueue_work_duration_seconds_sum{name="disruption"} '
        return next(
            (float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)),
            0.0,
        )
    return None


@dataclass(frozen=True)
class ClusterCost:
    """What the local cluster's processes spent between two readings, by component."""

    kubeconfig: str

    def read(self) -> dict[str, float]:
        found = component_cpu(self.kubeconfig)
        work = disruption_seconds(self.kubeconfig)
        if work is not None:
            found["disruption controller's syncs (wall s)"] = work
        return found

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.read()
        return {k: round(now[k] - before.get(k, 0.0), 1) for k in sorted(now)}

    def requests(self) -> Counter[str]:
        """What the API server served so far, from its /metrics: requests by verb and
        resource ("POST pods", "PATCH pods/status"), and watch events sent, by kind
        ("watch Pod": one per watcher an object's change reached). Who kept it busy, where
        its CPU seconds alone do not say."""
        text = sh(kubectl_binary(), "--kubeconfig", self.kubeconfig, "get", "--raw", "/metrics")
        found: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                tags = sample.labels
                if sample.name == "apiserver_request_total":
                    sub = f"/{tags['subresource']}" if tags.get("subresource") else ""
                    found[f"{tags.get('verb')} {tags.get('resource')}{sub}"] += int(sample.value)
                elif sample.name == "apiserver_watch_events_total":
                    kind = tags.get("kind") or tags.get("resource")
                    found[f"watch {kind}"] += int(sample.value)
        return found

    def requests_since(self, before: Counter[str], top: int = 20) -> dict[str, int]:
        """The ``top`` most served since ``before`` (``requests``), most first."""
        return dict((self.requests() - before).most_common(top))


def machine() -> dict[str, Any]:
    """Where and when: figures on a shared 2-core machine mean little without the load."""
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": platform.python_version(),
    }


def beside_baseline(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A memory bench's rows: this checkout's figures, then the baseline's if it ran, each
    with its label."""
    rows = [("this checkout", result["ours"])]
    if "baseline" in result:
        rows.append((f"baseline ({result['baseline']['ref']})", result["baseline"]))
    return rows


def bench_main(
    doc: str,
    add: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
) -> None:
    """The command line of a bench beside a baseline revision: its own options (``add``),
    the cluster and the baseline; prints the figures as JSON, then the table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    add(parser)
    parser.add_argument("--baseline", help="a git revision whose controller runs too")
    result = run(parser.parse_args())
    print(json.dumps(result))
    print(table(result))
