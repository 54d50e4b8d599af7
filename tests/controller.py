"""Pytest fixture that runs the real controller (``mpijob-elastic run``) as a process.

A process, not an in-test task: it is what users deploy, it can be killed mid-drain and
restarted, and its logs are kept per test (printed when a test fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.formats import COMMITTED_MARKER
from tests.cluster import ROOT, Cluster, delete_namespace

# The shipped ClusterRole that may get /metrics (config/rbac/metrics_reader.yaml).
METRICS_READER = ROOT / "config" / "rbac" / "metrics_reader.yaml"
# Set on a test whose body failed: its controllers' stacks go into their logs.
FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


def scraper_tls() -> ssl.SSLContext:
    """TLS as a scraper of the self-signed /metrics speaks it (the ServiceMonitor's
    ``insecureSkipVerify``): encrypted, the server's certificate not checked."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class ControllerProcess:
    cluster: Cluster
    namespaces: tuple[str, ...]
    log_path: Path
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        offset = self.launch()
        wait_for(
            lambda: (
                "caches synced" in self.log_path.read_text()[offset:]
                or self.proc is None
                or self.proc.poll() is not None
            ),
            # Generous: a loaded machine starts Python slowly, and many namespaces mean many lists.
            timeout=120,
            what="controller caches to sync",
        )
        assert self.proc is not None
        assert self.proc.poll() is None, f"controller exited:\n{self.logs()}"

    def launch(self) -> int:
        """Start the process without waiting for its caches; where its log starts."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpijob_elastic.app.cli",
                "run",
                "--kubeconfig",
                self.cluster.kubeconfig,
                "--namespaces",
                ",".join(self.namespaces),
                "--kubectl-delivery",
                "none",
                "--log-format",
                "json",
                *self.args,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return offset

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
            self.proc.wait()
        else:
            stop_process(self.proc)

    def dump_stacks(self) -> None:
        """Where the process is waiting, into its log (mpijob_elastic/app/stacks.py): its
        threads' stacks and its tasks' awaits, for a test that failed waiting on it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGUSR1)
        self.proc.send_signal(signal.SIGUSR2)
        time.sleep(1)

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def log_entries(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.logs().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries


StartController = Callable[..., ControllerProcess]


@pytest.fixture
def start_controller(
    cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[StartController]:
    """Start a controller watching the given namespaces; stopped after the test."""
    started: list[ControllerProcess] = []

    def start(*namespaces: str, args: tuple[str, ...] = ()) -> ControllerProcess:
        proc = ControllerProcess(
            cluster, namespaces, tmp_path / f"controller-{len(started)}.log", args
        )
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if request.node.stash.get(FAILED, False):
            proc.dump_stacks()
        proc.stop()
        # Shown by pytest only for a failing test.
        print(f"--- controller log ({proc.namespaces}) ---\n{proc.logs()[-60000:]}")


def create_namespaces(cluster: Cluster, count: int) -> list[str]:
    """``count`` fresh namespaces in one request (their default ServiceAccounts follow a
    moment later: ``wait_for_service_accounts``)."""
    made = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in made]
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    cluster.kubectl("create", "-f", "-", input=json.dumps(listed))
    return made


def wait_for_service_accounts(cluster: Cluster, namespaces: list[str]) -> None:
    """Pods need their namespace's default ServiceAccount, which the controller-manager
    adds shortly after the namespace: one list for all of them."""

    def missing() -> set[str]:
        found = cluster.raw("GET", "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault")
        have = {sa["metadata"]["namespace"] for sa in (found or {}).get("items", [])}
        return set(namespaces) - have

    wait_for(lambda: not missing(), 30, f"default ServiceAccounts in {namespaces}")


class SharedController:
    """One controller process for the tests of a module, each test in a namespace of its
    own (``shared_namespace``): the process start and stop, a few seconds each on a loaded
    machine, are paid once per module instead of once per test.

    A controller's namespaces are fixed at its start, so the module's are made up front,
    one for every test of the module that asks for ``shared_namespace``. Should they run
    out (a test asking twice), or the process have died, a new process takes over, watching
    the namespaces still in use and a new batch. Tests that restart, kill or flag their
    controller, read its metrics or its whole log, or change what it reads at its start
    (CRDs, cluster-wide settings) start their own with ``start_controller``."""

    def __init__(
        self, cluster: Cluster, log_dir: Path, wanted: int, args: tuple[str, ...] = ()
    ) -> None:
        self.cluster, self.log_dir, self.args = cluster, log_dir, args
        self.wanted = wanted
        self.free: list[str] = []
        self.in_use: set[str] = set()
        self.proc: ControllerProcess | None = None
        self.starts = 0

    def take(self) -> str:
        """A namespace the running controller watches that no test has used."""
        if not self.free or not self.alive():
            self._restart()
        name = self.free.pop(0)
        self.in_use.add(name)
        self.wanted = max(self.wanted - 1, 0)
        return name

    def release(self, namespace: str) -> None:
        """The test is over: its jobs go first (so the controller does not recreate pods in
        a terminating namespace), then the namespace."""
        self.in_use.discard(namespace)
        with contextlib.suppress(AssertionError):
            self.cluster.raw(
                "DELETE", f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}"
            )
        delete_namespace(self.cluster, namespace)

    def alive(self) -> bool:
        return (
            self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None
        )

    def _restart(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        batch = create_namespaces(self.cluster, max(self.wanted, 1))
        self.free = batch
        self.proc = ControllerProcess(
            self.cluster,
            (*sorted(self.in_use), *batch),
            self.log_dir / f"controller-{self.starts}.log",
            self.args,
        )
        self.starts += 1
        self.proc.start()
        wait_for_service_accounts(self.cluster, batch)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        for namespace in self.free:
            delete_namespace(self.cluster, namespace)


@pytest.fixture(scope="module")
def shared_controller_args() -> tuple[str, ...]:
    """The flags of the module's shared controller; a module overrides this fixture to
    give its own."""
    return ()


@pytest.fixture(scope="module")
def shared_controller(
    cluster: Cluster,
    crd: str,
    shared_controller_args: tuple[str, ...],
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SharedController]:
    """The module's shared controller (``SharedController``), started at the first test
    that asks for a ``shared_namespace``."""
    wanted = sum(
        name in getattr(item, "fixturenames", ())
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        for name in ("shared_namespace", "other_shared_namespace")
    )
    shared = SharedController(
        cluster, tmp_path_factory.mktemp("shared-controller"), wanted, shared_controller_args
    )
    yield shared
    shared.close()


@pytest.fixture
def shared_namespace(
    shared_controller: SharedController, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace that the module's shared controller watches. The controller's log
    of the test's time is printed after it (pytest shows it for a failing test); a
    controller that died during the test fails it."""
    name = shared_controller.take()
    proc = shared_controller.proc
    offset = len(proc.logs()) if proc is not None else 0
    yield name
    if shared_controller.proc is not proc:  # another took over during the test
        offset = 0
    if shared_controller.proc is not None and request.node.stash.get(FAILED, False):
        shared_controller.proc.dump_stacks()
    logs = shared_controller.proc.logs() if shared_controller.proc is not None else ""
    print(f"--- shared controller log from this test on ({name}) ---\n{logs[offset:][-60000:]}")
    shared_controller.release(name)
    assert shared_controller.alive(), f"the shared controller exited:\n{logs[-5000:]}"


@pytest.fixture
def other_shared_namespace(
    shared_namespace: str, shared_controller: SharedController
) -> Iterator[str]:
    """A second namespace of the shared controller, for a test that wants two."""
    name = shared_controller.take()
    yield name
    shared_controller.release(name)


def metrics_reader(cluster: Cluster, namespace: str, account: str) -> str:
    """A token of a new ServiceAccount bound to the shipped metrics-reader ClusterRole, as
    a Prometheus is (a ClusterRoleBinding named after the namespace; the caller deletes it)."""
    cluster.kubectl("apply", "-f", str(METRICS_READER))
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl(
        "create", "clusterrolebinding", f"{namespace}-{account}",
        "--clusterrole=mpijob-elastic-metrics-reader", f"--serviceaccount={namespace}:{account}",
    )  # fmt: skip
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    return token.stdout.strip()


@pytest.fixture
def metrics_token(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A token that may scrape /metrics (the controller serves it to no other)."""
    yield metrics_reader(cluster, namespace, "scraper")
    cluster.kubectl("delete", "clusterrolebinding", f"{namespace}-scraper", check=False)


# The launcher's remote shells, run the way a launcher runs them: the job's own
# ``kubexec.sh`` from its ConfigMap, with a ``kubectl`` that acts as the launcher's
# ServiceAccount (a token of its own, so RBAC is the launcher's), so the reports of each
# shell's start and exit reach the job's ranks ConfigMap as in a real cluster. On KWOK the
# exec into the worker runs the rank here: a sleeping process named after its worker;
# killing it is a rank that died (``kubectl exec`` then ends non-zero and kubexec.sh
# reports it). Tests using them give their job a name no other test uses.
RANK_CODE = "import time; time.sleep(600)"
# A rank of a training with the commit hook (contrib/mpijob_elastic_notice.py): it has
# joined at once, and says so, so the host-list rules need not wait out the reset bound.
HOOKED_RANK_CODE = f'import time; print("{COMMITTED_MARKER}", flush=True); time.sleep(600)'


class RemoteShells:
    """The launcher's ``kubexec.sh <worker> <rank>`` processes, one per worker."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self.reports = ""

    def attach(self, namespace: str, job: str) -> None:
        """Act as ``job``'s launcher: its ServiceAccount, its kubexec.sh."""
        kubeconfig = self.cluster.service_account_kubeconfig(
            namespace, f"{job}-launcher", self.tmp / f"{job}-launcher.kubeconfig"
        )
        bin_dir = self.tmp / "launcher-bin"
        bin_dir.mkdir(exist_ok=True)
        kubectl = bin_dir / "kubectl"
        kubectl.write_text(
            f'#!/bin/sh\nexec {self.cluster.kubectl_path} --kubeconfig {kubeconfig} "$@"\n'
        )
        kubectl.chmod(0o755)
        config = self.cluster.raw("GET", f"/api/v1/namespaces/{namespace}/configmaps/{job}-config")
        assert config is not None
        (self.tmp / "kubexec.sh").write_text(config["data"]["kubexec.sh"])
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self.reports = f"/api/v1/namespaces/{namespace}/configmaps/{names.ranks_name(job)}"

    def _committed(self, worker: str) -> set[str]:
        """The commit reports of the remote shells into ``worker`` (ranks.py's keys)."""
        data = (self.cluster.raw("GET", self.reports) or {}).get("data") or {}
        return {k for k in data if k.startswith(f"{worker}_") and k.endswith("_committed")}

    def start(self, worker: str) -> None:
        """A rank on ``worker``, returned once its commit report has reached the cluster:
        until then the controller counts it as still in its reset (host_rules.py), and a
        test reading the rank-holder labels could catch them on their way."""
        before = self._committed(worker)
        rank = f"exec {sys.executable} -c '{HOOKED_RANK_CODE}' rank-of-{worker}"
        self.procs[worker] = subprocess.Popen(
            ["/bin/sh", str(self.tmp / "kubexec.sh"), worker, rank],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Running once its rank runs here (KWOK's exec is a local process).
        wait_for(lambda: self._ranks(worker), 30, f"the rank on {worker}")
        wait_for(lambda: self._committed(worker) - before, 30, f"the commit report of {worker}")

    def start_silent(self, worker: str) -> None:
        """A remote shell that reports nothing (a launcher whose kubexec.sh predates the
        reports): only its command line, which an exec read of the launcher sees."""
        self.procs[worker] = subprocess.Popen(
            [sys.executable, "-c", RANK_CODE, "/etc/mpi/kubexec.sh", worker, f"rank-of-{worker}"]
        )

    def end(self, worker: str) -> float:
        """The rank on ``worker`` dies; returns when, once its remote shell has ended."""
        for pid in self._ranks(worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ended = time.monotonic()
        self.procs.pop(worker).wait(30)
        return ended

    def close(self) -> None:
        for worker in list(self.procs):
            self.end(worker)

    @staticmethod
    def _ranks(worker: str) -> list[int]:
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"rank-of-{worker}".encode() in argv:
                found.append(int(proc.name))
        return found


@pytest.fixture
def shells(cluster: Cluster, tmp_path: Path) -> Iterator[RemoteShells]:
    found = RemoteShells(cluster, tmp_path)
    yield found
    found.close()
