"""Pytest fixture that runs the real controller (``mpijob-elastic run``) as a process.

A process, not an in-test task: it is what users deploy, it can be killed mid-drain and
restarted, and its logs are kept per test (printed when a test fails).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import ROOT, Cluster


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


@dataclass
class ControllerProcess:
    cluster: Cluster
    namespaces: tuple[str, ...]
    log_path: Path
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
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
        assert self.proc.poll() is None, f"controller exited:\n{self.logs()}"

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

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
        proc.stop()
        # Shown by pytest only for a failing test.
        print(f"--- controller log ({proc.namespaces}) ---\n{proc.logs()[-20000:]}")


# On KWOK an exec into a launcher pod runs on this machine, so the launcher's remote shells
# are played by local processes whose command line is the one ``kubexec.sh`` has in a real
# launcher (``/bin/sh /etc/mpi/kubexec.sh <worker> <command>``); ending one is a rank that
# left. The controller reads them through the API server's ``pods/exec``, as it would in a
# real cluster. Tests using them give their job a name no other test uses.
class RemoteShells:
    """Stand-ins for the launcher's ``kubexec.sh <worker> ...`` processes."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, worker: str) -> None:
        # argv as the launcher's shell runs kubexec.sh; the script itself is never read.
        code = "import time; time.sleep(600)"
        self.procs[worker] = subprocess.Popen(
            [sys.executable, "-c", code, "/etc/mpi/kubexec.sh", worker, "python train.py"]
        )

    def end(self, worker: str) -> float:
        proc = self.procs.pop(worker)
        proc.kill()
        proc.wait()
        return time.monotonic()

    def close(self) -> None:
        for worker in list(self.procs):
            self.end(worker)


@pytest.fixture
def shells() -> Iterator[RemoteShells]:
    found = RemoteShells()
    yield found
    found.close()
