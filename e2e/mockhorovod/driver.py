"""The mock elastic driver: what ``horovodrun -np N --min-np A --max-np B
--host-discovery-script /etc/mpi/discover_hosts.sh ...`` does about hosts, and nothing else.

Real Horovod decides three things from the launcher's files, and those are what the
controller can get right or wrong, so the mock copies them:

* which hosts exist: it runs the discovery script about once a second and parses
  ``host:slots`` lines; a failure of the first call fails the job, later failures keep the
  last known host set;
* how it reaches a host: ``<rsh-agent> <host> <quoted command>`` through ``/bin/sh -c``,
  exactly the string ``horovod.runner.util.remote.get_remote_command`` builds for
  ``/etc/mpi/kubexec.sh``;
* what a host's disappearance means, decided at the job's commits (Horovod's rendezvous
  barrier), every ``--commit-interval`` seconds: a host that leaves the discovery output
  keeps its ranks until the next commit, where they are unassigned (rank -1) and exit 134
  on their own, an exit the driver ignores because the host has no assignment; a rank that
  dies while its host still has an assignment is a failure at once, and its host is
  blacklisted by name at the next commit, for the rest of the job (or for a cooldown, with
  ``--blacklist-cooldown-range``); new hosts get ranks at the next commit; a rank that exits
  0 is a success and ends the job at the next commit.

It differs from Horovod where a test instrument must: the discovery script gets a timeout
of its own (Horovod has none and would just hang), and every decision is written as one
JSON line (see README.md) so the end-to-end suite can assert on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from e2e.mockhorovod import RANK_STARTED_MARKER, REMOVED_MARK, RESET_FILE_SUFFIX
from e2e.mockhorovod import events as ev
from e2e.mockhorovod.checkpoint import Checkpoint, notice_path
from e2e.mockhorovod.hook import COMMITTED_MARKER

DEFAULT_DISCOVERY_SCRIPT = "/etc/mpi/discover_hosts.sh"
DEFAULT_RSH_AGENT = "/etc/mpi/kubexec.sh"
REPO_ROOT = Path(__file__).resolve().parents[2]

# Horovod 0.28's bounds for --blacklist-cooldown-range (runner/elastic/discovery.py).
COOLDOWN_LOWER_BOUND = 1
COOLDOWN_UPPER_BOUND = 3600

DEFAULT_RANK_COMMAND = "cd {repo} && exec {python} -m e2e.mockhorovod.rank {rank_args}"
# A file each rank creates where it runs and watches: the driver lets the rank go (Horovod's
# hosts-updated notice at the next commit) by removing it through the remote shell, because
# ending the remote shell (`kubectl exec`) does not end the command in a real container.
# Removing, not creating, so a notice that arrives after the rank has gone leaves nothing.
DEFAULT_RANK_ALIVE_FILE = "/tmp/mockhorovod-rank-{rank_id}"
RANK_COMMAND_FIELDS = (
    "host",
    "rank_id",
    "local_rank",
    "driver_pid",
    "stop_file",
    "python",
    "repo",
    "rank_args",
)

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2

# Horovod's defaults for HOROVOD_GLOO_TIMEOUT_SECONDS and HOROVOD_START_TIMEOUT.
DEFAULT_GLOO_TIMEOUT = 30.0
DEFAULT_START_TIMEOUT = 30.0
# How long a rank takes from its start to hvd.init returned (import torch, CUDA, the data
# set): 10-60 s on a GPU node; short by default so the suite stays quick, but never 0, so a
# controller that takes a running remote shell for a joined rank is caught.
DEFAULT_RANK_START_SECONDS = 2.0
RANK_START_ENV = "MOCKHOROVOD_RANK_START_SECONDS"
# Without --network-interface, horovodrun's elastic start waits for this many hosts: it
# finds the common interfaces host to host (runner/launch.py, _get_min_start_hosts).
MIN_START_HOSTS_WITHOUT_NIC = 2
# What the interface probe runs on each host, through the remote shell: a short-lived shell
# that is not a rank (Horovod's task service, which ends once the driver has its answer).
PROBE_MARKER = "mockhorovod-probe"
PROBE_COMMAND = f"echo {PROBE_MARKER} && sleep 1"
# The stop reasons with which horovodrun exits 0: the training finished by itself.
CLEAN_STOPS = frozenset({"stop_file", "run_seconds", "sigint"})
NO_PREVIOUS_HOSTS = "No hosts from previous set remaining, unable to broadcast state."

# How much of a rank's stderr an event carries: enough for kubectl's one-line refusal and
# the rank's own last words, not a whole log.
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 2000


# How kubectl exec reports the remote command's exit: a real kubelet makes kubectl print
# this and exit with the same code; KWOK's local exec makes kubectl exit 1 with an internal
# error that ends in "exit status N". Either way Horovod's log would name the remote code.
_REMOTE_EXIT_PATTERNS = (
    re.compile(r"command terminated with exit code (\d+)"),
    re.compile(r"error executing command in container:.*exit status (\d+)"),
)


def remote_exit_code(stderr: str) -> int | None:
    """The remote command's exit code as kubectl reported it on stderr, if it did."""
    found: int | None = None
    for line in stderr.splitlines():
        for pattern in _REMOTE_EXIT_PATTERNS:
            match = pattern.search(line)
            if match:
                found = int(match.group(1))
    return found


class DiscoveryError(Exception):
    """The discovery script failed, hung, or printed something Horovod could not parse."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        stderr: str = "",
        timeout: bool = False,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr
        self.timeout = timeout


class ConfigError(Exception):
    """Command-line values that horovodrun itself would refuse."""


def parse_discovery_output(output: str, slots_per_host: int | None) -> dict[str, int]:
    """Parses ``host:slots`` lines into an ordered ``{host: slots}``.

    Horovod treats the output as a set, so duplicates are harmless when they agree. A line
    without ``:slots`` takes ``--slots-per-host``; without that flag it is an error here,
    where Horovod would silently give the host ``None`` slots and break later.
    """
    hosts: dict[str, int] = {}
    for raw in output.splitlines():
        line = raw.strip()
        if not line:
            continue
        if ":" in line:
            host, _, slots_text = line.partition(":")
            host = host.strip()
            try:
                slots = int(slots_text.strip())
            except ValueError:
                raise DiscoveryError(f"bad slots in discovery line {line!r}") from None
            if slots < 0:
                raise DiscoveryError(f"negative slots in discovery line {line!r}")
        elif slots_per_host is not None:
            host, slots = line, slots_per_host
        else:
            raise DiscoveryError(f"discovery line {line!r} has no ':slots' and no --slots-per-host")
        if not host or any(c.isspace() for c in host):
            raise DiscoveryError(f"bad host name in discovery line {line!r}")
        if host in hosts and hosts[host] != slots:
            raise DiscoveryError(f"host {host!r} listed with {hosts[host]} and {slots} slots")
        hosts[host] = slots
    return hosts


def cooldown_seconds(lower: int, upper: int, count: int) -> float:
    """Horovod's cooldown for a host's ``count``-th blacklisting: doubling, with jitter,
    clamped to the given range."""
    delay = lower * (1 << count) + random.uniform(0, 1) * lower
    return float(max(lower, min(upper, delay)))


def exit_status(returncode: int) -> tuple[int, int | None]:
    """A shell-style exit code and the signal, from asyncio's returncode (negative when a
    signal ended the process), so a SIGKILL reads as 137 like kubectl reports it."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def render_rank_command(template: str, values: dict[str, str], rank_args: list[str]) -> str:
    """Fills the ``--rank-command`` template; every value is shell-quoted on the way in,
    because host names come from a file the controller writes."""
    quoted = {key: shlex.quote(value) for key, value in values.items()}
    quoted["rank_args"] = shlex.join(rank_args)
    return template.format_map(quoted)


def remote_shell_command(rsh_agent: str, host: str, command: str) -> str:
    """The string Horovod's gloo runner hands to ``/bin/sh -c`` for a remote slot.

    Horovod quotes the whole remote command into one word; kubexec.sh joins its arguments
    with ``"$*"`` and hands them to ``/bin/sh -c`` in the pod, so the command survives the
    trip byte for byte.
    """
    return f"{shlex.quote(rsh_agent)} {shlex.quote(host)} {shlex.quote(command)}"


@dataclass(frozen=True)
class DriverConfig:
    """Everything the driver needs; built from the command line by :func:`parse_args`."""

    np: int
    min_np: int
    max_np: int | None = None
    discovery_script: str = DEFAULT_DISCOVERY_SCRIPT
    slots_per_host: int | None = None
    elastic_timeout: float = 600.0
    cooldown_range: tuple[int, int] | None = None
    rsh_agent: str = DEFAULT_RSH_AGENT
    rank_command: str = DEFAULT_RANK_COMMAND
    discovery_interval: float = 1.0
    discovery_timeout: float = 30.0
    run_seconds: float = 0.0
    stop_file: str | None = None
    log_file: str | None = None
    work_dir: str | None = None
    stop_grace: float = 5.0
    commit_interval: float = 1.0
    rank_kubeconfig: str | None = None
    rank_namespace: str | None = None
    rank_kubectl: str | None = None
    rank_poll_interval: float | None = None
    rank_python: str = sys.executable
    rank_repo: str = str(REPO_ROOT)
    rank_alive_file: str = DEFAULT_RANK_ALIVE_FILE
    # Horovod's HOROVOD_GLOO_TIMEOUT_SECONDS: how long the ranks of a reset wait in the new
    # world's rendezvous for every newly started rank before they all abort.
    gloo_timeout: float = DEFAULT_GLOO_TIMEOUT
    # horovodrun's --start-timeout (HOROVOD_START_TIMEOUT): the deadline, from launch, by
    # which every discovered host must have answered the interface probe.
    start_timeout: float = DEFAULT_START_TIMEOUT
    # horovodrun's --network-interface: given, there is no probe and one host is enough.
    network_interface: str | None = None
    # The training's checkpoint and the notice that asks for it (checkpoint.py).
    checkpoint_file: str | None = None
    notice_file: str | None = None
    # Seconds from a rank's start to its joining (hvd.init returned), passed to each rank.
    rank_start_seconds: float = DEFAULT_RANK_START_SECONDS
    # The training uses the controller's commit hook (contrib/mpijob_elastic_notice.py):
    # each rank a reset started prints its marker at the first commit after the reset.
    commit_marker: bool = True
    command: tuple[str, ...] = ()

    def validate(self) -> None:
        """Refuses what horovodrun refuses, plus a rank template that cannot be filled."""
        if self.min_np < 1:
            raise ConfigError("--min-np must be at least 1")
        if self.np < self.min_np:
            raise ConfigError("-np must not be below --min-np")
        if self.max_np is not None and self.max_np < self.np:
            raise ConfigError("--max-np must not be below -np")
        if self.slots_per_host is not None and self.slots_per_host < 1:
            raise ConfigError("--slots-per-host must be at least 1")
        if self.cooldown_range is not None:
            lower, upper = self.cooldown_range
            if not COOLDOWN_LOWER_BOUND <= lower <= upper <= COOLDOWN_UPPER_BOUND:
                raise ConfigError(
                    "--blacklist-cooldown-range needs "
                    f"{COOLDOWN_LOWER_BOUND} <= MIN <= MAX <= {COOLDOWN_UPPER_BOUND}"
                )
        for name in (
            "discovery_interval",
            "discovery_timeout",
            "stop_grace",
            "commit_interval",
            "gloo_timeout",
            "start_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        if not self.rank_start_seconds >= 0:
            raise ConfigError("--rank-start-seconds must not be negative")
        try:
            self.rank_alive_file.format(rank_id="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"--rank-alive-file {self.rank_alive_file!r} cannot be filled: {exc!r}; "
                "its only field is {rank_id}"
            ) from None
        dummy = dict.fromkeys(RANK_COMMAND_FIELDS, "x")
        del dummy["rank_args"]
        try:
            render_rank_command(self.rank_command, dummy, [])
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"--rank-command {self.rank_command!r} cannot be filled: {exc!r}; "
                f"known fields: {', '.join(RANK_COMMAND_FIELDS)}"
            ) from None


@dataclass(eq=False)
class Rank:
    """One slot's process: the remote shell child the driver started for it."""

    host: str
    local_rank: int
    rank_id: str
    stop_file: Path
    alive_file: str
    command: str
    proc: asyncio.subprocess.Process | None = None
    running: bool = False
    # Why the rank lost its assignment (``host_removed``, ``blacklisted``, ``slots_reduced``,
    # ``shutdown``); None while it holds one. Any exit after that is ignored, as in Horovod.
    stopping: str | None = None
    notified: bool = False
    # Its FAILURE was recorded by the driver itself (it timed out in a reset's rendezvous);
    # the exit that follows when the job is stopped says nothing more.
    aborted: bool = False
    # The reset (its commit number; 0: the job's start) that started it.
    reset: int = 0
    # The commit at which the driver asked it for the commit marker (None: not yet).
    marker_commit: int | None = None
    exit_code: int | None = None
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    @property
    def reset_file(self) -> str:
        return self.alive_file + RESET_FILE_SUFFIX

    def stderr_text(self) -> str:
        return "\n".join(self.stderr_tail)[-STDERR_TAIL_CHARS:]


@dataclass(eq=False)
class HostEntry:
    """A host of the current assignment and its assigned ranks by local rank (a rank that
    failed stays here until the reset that follows); ``noticed_gone`` says that discovery no
    longer lists it (the ranks keep their assignment until the next reset). Unassigned
    ranks leave the entry for ``Driver._departing``, so a name listed again gets slots of
    its own at once, as in Horovod, which judges every exit by (host, slot)."""

    ranks: dict[int, Rank] = field(default_factory=dict)
    noticed_gone: bool = False


@dataclass(eq=False)
class ResetWindow:
    """A reset's rendezvous: from the reset until every rank it started has joined
    (``hvd.init`` returned on all of them). Until then the ranks do not commit; a host
    update sent meanwhile is dropped when they replace their message queue; past the Gloo
    timeout every rank aborts."""

    commit: int
    started: float
    deadline: float
    new_ranks: list[Rank]


class Driver:
    """The elastic driver's host bookkeeping, run on one asyncio loop.

    Everything that changes state runs between awaits, so a discovery result and a rank
    exit are never half-applied against each other: a rank exit is judged against the
    host set the driver last saw, as Horovod judges it against its current assignment.
    """

    def __init__(
        self,
        config: DriverConfig,
        *,
        out: TextIO | None = None,
        diag: TextIO | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.config = config
        self._out = out
        self._diag = diag
        self._on_event = on_event
        self._log: TextIO | None = None
        self._work_dir: Path | None = None
        self._own_work_dir = False
        self._t0 = 0.0
        self._stop_event = asyncio.Event()
        self._checkpoint: Checkpoint | None = None
        # The step the run started from (a checkpoint), before its own commits.
        self._step_base = 0
        self._stop_reason: str | None = None
        self._listed: dict[str, int] | None = None
        self._order: list[str] = []
        self._hosts: dict[str, HostEntry] = {}
        self._departing: set[Rank] = set()
        # A host update sent to the coordinator and not yet acted on at a commit.
        self._notice = False
        self._window: ResetWindow | None = None
        # Ranks whose reset has ended and whose first commit has not returned yet: they
        # print the commit marker at the next commit that returns (the hook's).
        self._marker_due: list[Rank] = []
        # Since when a reset waits for --min-np slots (the ranks block in it); its commit.
        self._blocked_since: float | None = None
        self._blocked_commit = 0
        self._probe: asyncio.Task[None] | None = None
        self._hosts_wait_logged = False
        self._success_code = EXIT_OK
        self._blacklist: dict[str, float] = {}
        self._blacklist_counts: dict[str, int] = {}
        self._ever_blacklisted: set[str] = set()
        self._started = False
        self._waiting_logged = False
        self._below_min_since: float | None = None
        self._failures = 0
        self._exec_failures = 0
        self._hosts_removed = 0
        self._ranks_started = 0
        self._commits = 0
        # Recorded at once, acted on at the next commit (Horovod's barrier): failed host ->
        # ids of the ranks that failed there; ids of ranks that exited 0 (SUCCESS).
        self._pending_failures: dict[str, list[str]] = {}
        self._successes: list[str] = []
        self._rank_tasks: set[asyncio.Task[None]] = set()
        self._killers: set[asyncio.Task[None]] = set()
        self._notices: set[asyncio.Task[None]] = set()

    @property
    def commits(self) -> int:
        """How many commits the job has made (every tick of the commit clock once started)."""
        return self._commits

    # -- output -----------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        """Writes one event line to stdout and the log file."""
        record: dict[str, Any] = {"ts": time.time(), "event": event, **fields}
        line = json.dumps(record) + "\n"
        for stream in (self._out, self._log):
            if stream is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                stream.write(line)
                stream.flush()
        if self._on_event is not None:
            self._on_event(record)

    def _say(self, text: str) -> None:
        if self._diag is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._diag.write(f"mockhorovod: {text}\n")
            self._diag.flush()

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Asks the run loop to stop the ranks and exit (SIGTERM, SIGINT, tests)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stop_event.set()

    async def run(self) -> int:
        """Runs until the job ends; returns the process exit code."""
        cfg = self.config
        self._t0 = time.time()
        self._prepare_files()
        self.emit(
            ev.DRIVER_STARTED,
            pid=os.getpid(),
            np=cfg.np,
            min_np=cfg.min_np,
            max_np=cfg.max_np,
            discovery_script=cfg.discovery_script,
            slots_per_host=cfg.slots_per_host,
            elastic_timeout=cfg.elastic_timeout,
            blacklist_cooldown_range=list(cfg.cooldown_range) if cfg.cooldown_range else None,
            rsh_agent=cfg.rsh_agent,
            # Open MPI's spelling; Horovod uses kubexec.sh only when it is exactly this.
            rsh_agent_env=os.environ.get("OMPI_MCA_plm_rsh_agent"),  # noqa: SIM112
            rank_command=cfg.rank_command,
            commit_interval=cfg.commit_interval,
            gloo_timeout=cfg.gloo_timeout,
            start_timeout=cfg.start_timeout,
            network_interface=cfg.network_interface,
            rank_start_seconds=cfg.rank_start_seconds,
            commit_marker=cfg.commit_marker,
            work_dir=str(self._work_dir),
            command=list(cfg.command),
        )
        exit_code = EXIT_FATAL
        reason = "error"
        if cfg.checkpoint_file:
            self._checkpoint = Checkpoint(Path(cfg.checkpoint_file), notice_path(cfg.notice_file))
            self._step_base = self._checkpoint.load()
            self.emit(ev.CHECKPOINT_LOADED, step=self._step_base, path=cfg.checkpoint_file)
        clock = asyncio.create_task(self._commit_clock())
        try:
            exit_code, reason = await self._loop()
        finally:
            clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await clock
            await self._stop_all("shutdown")
            self.emit(
                ev.DRIVER_EXIT,
                exit_code=exit_code,
                reason=reason,
                failures=self._failures,
                exec_failures=self._exec_failures,
                blacklisted=len(self._ever_blacklisted),
                blacklisted_hosts=sorted(self._ever_blacklisted),
                hosts_removed=self._hosts_removed,
                ranks_started=self._ranks_started,
                commits=self._commits,
                step=self._step_base + self._commits,
            )
            if self._own_work_dir and self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
            if self._log is not None:
                self._log.close()
                self._log = None
        return exit_code

    def _prepare_files(self) -> None:
        cfg = self.config
        if cfg.log_file:
            Path(cfg.log_file).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(cfg.log_file, "a", encoding="utf-8")  # noqa: SIM115
        if cfg.work_dir:
            self._work_dir = Path(cfg.work_dir)
            self._work_dir.mkdir(parents=True, exist_ok=True)
        else:
            self._work_dir = Path(tempfile.mkdtemp(prefix="mockhorovod-"))
            self._own_work_dir = True

    def _stop_wanted(self) -> str | None:
        cfg = self.config
        if self._stop_reason is None:
            if cfg.stop_file and os.path.exists(cfg.stop_file):
                self._stop_reason = "stop_file"
            elif cfg.run_seconds > 0 and time.time() - self._t0 >= cfg.run_seconds:
                self._stop_reason = "run_seconds"
        return self._stop_reason

    def _exit_code(self, reason: str) -> int:
        """horovodrun's exit code for a stop: 0 only when the training ended by itself, or a
        SUCCESS with no other rank left to stop; 1 on SIGTERM (an evicted launcher) and for
        every stop the driver decided on an error."""
        if reason in CLEAN_STOPS:
            return EXIT_OK
        if reason == "success":
            return self._success_code
        return EXIT_FATAL

    async def _loop(self) -> tuple[int, str]:
        cfg = self.config
        first = True
        while True:
            reason = self._stop_wanted()
            if reason is not None:
                self.emit(ev.STOP_REQUESTED, reason=reason)
                return self._exit_code(reason), reason
            try:
                hosts = await self._discover()
            except DiscoveryError as exc:
                self.emit(
                    ev.DISCOVERY_FAILED,
                    error=str(exc),
                    exit_code=exc.exit_code,
                    stderr=exc.stderr,
                    timeout=exc.timeout,
                    first=first,
                )
                if first:
                    return EXIT_FATAL, "discovery_failed"
            else:
                if hosts is None:
                    continue  # a stop arrived during discovery; the loop top handles it
                first = False
                self._apply_discovery(hosts)
            if self._check_slots():
                return EXIT_FATAL, "elastic_timeout"
            if not self._started and self._probe is None:
                self._start_job()
            wait = cfg.discovery_interval
            if cfg.run_seconds > 0:
                wait = min(wait, max(0.0, self._t0 + cfg.run_seconds - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), timeout=wait)

    # -- discovery --------------------------------------------------------------------

    async def _discover(self) -> dict[str, int] | None:
        """Runs the discovery script once; None when a stop request cut it short."""
        cfg = self.config
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            cfg.discovery_script,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        run = asyncio.ensure_future(proc.communicate())
        stop = asyncio.ensure_future(self._stop_event.wait())
        done, _ = await asyncio.wait(
            {run, stop}, timeout=cfg.discovery_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        stop.cancel()
        if run not in done:
            _signal_group(proc, signal.SIGKILL)
            # Letting communicate() read to EOF is what closes the subprocess transport;
            # cancelling it early leaves the transport to the garbage collector, which
            # may meet an event loop that is already closed.
            finished, _ = await asyncio.wait({run}, timeout=2.0)
            if not finished:
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
            await proc.wait()
            if self._stop_event.is_set():
                return None
            raise DiscoveryError(
                f"discovery script {cfg.discovery_script} did not finish within "
                f"{cfg.discovery_timeout:g}s",
                timeout=True,
            )
        out, err = run.result()
        stderr = err.decode(errors="replace").strip()[-STDERR_TAIL_CHARS:]
        if proc.returncode != 0:
            code, _ = exit_status(proc.returncode or 0)
            raise DiscoveryError(
                f"discovery script {cfg.discovery_script} exited with code {code}",
                exit_code=code,
                stderr=stderr,
            )
        try:
            return parse_discovery_output(out.decode(errors="replace"), cfg.slots_per_host)
        except DiscoveryError as exc:
            exc.stderr = stderr
            raise

    def _apply_discovery(self, hosts: dict[str, int]) -> None:
        now = time.time()
        if hosts != self._listed:
            self.emit(ev.DISCOVERY, hosts=list(hosts), slots=dict(hosts))
            # Horovod's discovery thread only notes the change; the ranks learn of it at
            # their next commit, and until then they keep their assignment.
            for host, entry in self._hosts.items():
                if host in hosts:
                    entry.noticed_gone = False  # back before the commit: nothing happened
                    continue
                if entry.noticed_gone:
                    continue
                entry.noticed_gone = True
                live = [r for r in entry.ranks.values() if r.alive]
                self.emit(
                    ev.HOST_REMOVED,
                    host=host,
                    # Not graceful when a FAILURE of it is already recorded: the next
                    # commit blacklists it rather than letting its ranks go.
                    graceful=host not in self._pending_failures,
                    ranks=[r.rank_id for r in live],
                )
            # Oldest hosts first, as Horovod orders its assignments, so a newcomer never
            # displaces a host that is already training when --max-np caps the job.
            self._order = [h for h in self._order if h in hosts]
            self._order += [h for h in hosts if h not in self._order]
            self._listed = dict(hosts)
            self._notify_host_changes()
        for host, until in list(self._blacklist.items()):
            if until <= now and host in hosts:
                del self._blacklist[host]
                self.emit(ev.HOST_UNBLACKLISTED, host=host)
                self._notify_host_changes()  # Horovod counts a host back as one added

    def _notify_host_changes(self) -> None:
        """Horovod's ``_notify_workers_host_changes``: one notice per discovery change, sent
        to the coordinator only when the assignment would change (an empty one below
        --min-np). A notice that arrives while the ranks re-rendezvous is lost: they replace
        their message queue once the new world is up, and nothing is sent again. A reset
        that waits for slots reads the hosts afresh when it resumes, so it needs none."""
        if not self._started or self._blocked_since is not None:
            return
        if self._next_assignment_or_none() == self._assignment():
            return
        if self._window is not None:
            self.emit(
                ev.HOSTS_UPDATE_LOST,
                commit=self._window.commit,
                hosts=list(self._listed or {}),
                assigned=sorted(self._hosts),
            )
            self._say("host update arrived during a reset: dropped with the message queue")
            return
        self._notice = True

    def _assignment(self) -> dict[str, int]:
        return {host: len(entry.ranks) for host, entry in self._hosts.items()}

    def _next_assignment(self) -> dict[str, int]:
        """The slots a reset now would assign: usable hosts, oldest first, up to
        --max-np (Horovod's ``get_host_assignments``)."""
        listed = self._listed or {}
        capacity = self.config.max_np if self.config.max_np is not None else math.inf
        assignment: dict[str, int] = {}
        for host in self._usable_hosts():
            want = int(min(listed[host], capacity))
            capacity -= want
            if want > 0:
                assignment[host] = want
        return assignment

    def _next_assignment_or_none(self) -> dict[str, int]:
        if self._available_slots() < self.config.min_np:
            return {}
        return self._next_assignment()

    def _usable_hosts(self) -> list[str]:
        if self._listed is None:
            return []
        now = time.time()
        return [h for h in self._order if h in self._listed and self._blacklist.get(h, 0.0) <= now]

    def _available_slots(self) -> int:
        listed = self._listed or {}
        return sum(listed[h] for h in self._usable_hosts())

    def _min_start_hosts(self) -> int:
        return 1 if self.config.network_interface else MIN_START_HOSTS_WITHOUT_NIC

    def _check_slots(self) -> bool:
        """Tracks the elastic timeout; True when it expired and the job must fail."""
        cfg = self.config
        now = time.time()
        available = self._available_slots()
        if not self._started:
            if self._probe is not None:
                return False  # the start deadline rules from here
            enough_hosts = len(self._usable_hosts()) >= self._min_start_hosts()
            if available >= cfg.np and enough_hosts:
                return False
            if available < cfg.np and not self._waiting_logged:
                self._waiting_logged = True
                self.emit(ev.WAITING_FOR_SLOTS, needed=cfg.np, available=available)
            if available >= cfg.np and not self._hosts_wait_logged:
                self._hosts_wait_logged = True
                self.emit(
                    ev.WAITING_FOR_HOSTS,
                    needed=self._min_start_hosts(),
                    available=len(self._usable_hosts()),
                )
            if now - self._t0 > cfg.elastic_timeout:
                self.emit(
                    ev.ELASTIC_TIMEOUT,
                    phase="start",
                    needed=cfg.np,
                    available=available,
                    waited=now - self._t0,
                )
                return True
            return False
        if available < cfg.min_np:
            if self._below_min_since is None:
                self._below_min_since = now
                self.emit(ev.BELOW_MIN_NP, slots=available, min_np=cfg.min_np)
            elif now - self._below_min_since > cfg.elastic_timeout:
                self.emit(
                    ev.ELASTIC_TIMEOUT,
                    phase="running",
                    needed=cfg.min_np,
                    available=available,
                    waited=now - self._below_min_since,
                )
                return True
        elif self._below_min_since is not None:
            self._below_min_since = None
            self.emit(ev.MIN_NP_RESTORED, slots=available, min_np=cfg.min_np)
        return False

    # -- start ------------------------------------------------------------------------

    def _start_job(self) -> None:
        """Once -np slots (and, without --network-interface, two hosts) exist: the
        interface probe, then the first ranks (no commit to wait for yet)."""
        if self._listed is None:
            return
        usable = self._usable_hosts()
        if self._available_slots() < self.config.np or len(usable) < self._min_start_hosts():
            return
        if self.config.network_interface:
            self._launch()
            return
        self._probe = asyncio.create_task(self._probe_hosts(usable))

    async def _probe_hosts(self, hosts: list[str]) -> None:
        """horovodrun's common-interface detection: a task service on every discovered host,
        through the remote shell, all registered by the start deadline (launch +
        --start-timeout), or the job fails before any rank starts."""
        remaining = self._t0 + self.config.start_timeout - time.time()
        self.emit(ev.PROBE_STARTED, hosts=hosts, remaining=remaining)
        results = await asyncio.gather(*(self._probe_host(host, remaining) for host in hosts))
        failed = [host for host, ok in zip(hosts, results, strict=True) if not ok]
        if failed:
            error = (
                "Timed out waiting for the task services of "
                f"{', '.join(failed)} to register (start timeout "
                f"{self.config.start_timeout:g}s from launch)"
            )
            self._say(error)
            self.emit(ev.START_FAILED, hosts=hosts, failed=failed, error=error)
            self.request_stop("start_failed")
            return
        self.emit(ev.PROBE_DONE, hosts=hosts, seconds=time.time() - self._t0)
        if not self._stop_event.is_set():
            self._launch()

    async def _probe_host(self, host: str, remaining: float) -> bool:
        if remaining <= 0:
            return False
        shell = remote_shell_command(self.config.rsh_agent, host, PROBE_COMMAND)
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            shell,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), remaining)
        except TimeoutError:
            _signal_group(proc, signal.SIGKILL)
            await proc.wait()
            return False
        return proc.returncode == 0 and PROBE_MARKER in out.decode(errors="replace")

    def _launch(self) -> None:
        cfg = self.config
        self._started = True
        assignment = self._next_assignment()
        self.emit(
            ev.JOB_STARTED, np=cfg.np, available=self._available_slots(), hosts=list(assignment)
        )
        started = self._apply_starts(assignment)
        self._open_window(0, started)

    # -- commits and resets -----------------------------------------------------------

    async def _commit_clock(self) -> None:
        """The job's commits: every ``--commit-interval`` the ranks reach ``state.commit()``
        together, which is where Horovod's barrier acts on host updates and failures."""
        interval = self.config.commit_interval
        loop = asyncio.get_running_loop()
        origin = loop.time()
        tick = 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, origin + tick * interval - loop.time()))
            if loop.time() > origin + (tick + 1) * interval:  # fell behind: skip, never burst
                tick = int((loop.time() - origin) // interval)
            self._commit()
            self._checkpoint_tick()

    def _checkpoint_tick(self) -> None:
        """Rank 0's notice thread (checkpoint.py): the last commit's step saved while the
        job is stopping."""
        if self._checkpoint is None:
            return
        step = self._step_base + self._commits
        saved = self._checkpoint.tick(step)
        if saved is not None:
            self.emit(ev.CHECKPOINT_SAVED, step=step, cause=saved[0], deadline=saved[1])

    def _world(self) -> list[Rank]:
        return [rank for entry in self._hosts.values() for rank in entry.ranks.values()]

    def _fail_job(self, reason: str, line: str, **fields: Any) -> None:
        """A stop Horovod decides on an error: horovodrun exits 1."""
        self._say(line)
        self.emit(ev.JOB_FAILED, reason=reason, line=line, **fields)
        self.request_stop(reason)

    def _all_failed(self) -> bool:
        world = self._world()
        failed = {rid for ids in self._pending_failures.values() for rid in ids}
        return bool(world) and all(r.rank_id in failed or r.aborted for r in world)

    def _commit(self) -> None:
        """One tick of the job's commits: a reset when anything is pending; nothing while
        the ranks are in a reset's rendezvous or wait in a reset for slots."""
        if not self._started or self._stop_event.is_set():
            return
        if self._all_failed():
            size = len(self._world())
            self._fail_job("all_failed", f"failure count == {size} -> stop running", size=size)
            return
        if self._window is not None:
            if time.time() >= self._window.deadline:
                self._gloo_abort(self._window)
            return
        if self._blocked_since is not None:
            self._blacklist_pending(self._blocked_commit)
            self._activate(self._blocked_commit)
            return
        self._commits += 1
        commit = self._commits
        reasons = [
            name
            for name, pending in (
                ("failure", self._pending_failures),
                ("success", self._successes),
                ("hosts_updated", self._notice),
            )
            if pending
        ]
        if not reasons:
            self._request_markers(commit)  # this commit returned
            return
        # The commit raises (hosts updated, a failure): no marker; the ranks whose reset
        # ended before it print theirs at the first commit after the reset that follows.
        self._notice = False
        self.emit(ev.RESET, commit=commit, reasons=reasons)
        if self._successes:
            # Any SUCCESS ends the whole job at this barrier; horovodrun exits 1 when it had
            # to stop other ranks that were still training.
            done = set(self._successes)
            others = [r for r in self._world() if r.alive and r.rank_id not in done]
            self._success_code = EXIT_FATAL if others else EXIT_OK
            self._say(f"success count == {len(done)} -> stop running")
            self.request_stop("success")
            return
        world = self._world()
        self._blacklist_pending(commit)
        if world and all(self._blacklist.get(r.host, 0.0) > time.time() for r in world):
            self._fail_job(
                "all_blacklisted",
                f"blacklisted slots count == {len(world)} -> stop running",
                size=len(world),
            )
            return
        self._activate(commit)

    def _blacklist_pending(self, commit: int) -> None:
        failures, self._pending_failures = self._pending_failures, {}
        for host, rank_ids in failures.items():
            self._say(f"blacklist failing host: {host}")
            self._blacklist_host(host, commit, rank_ids)

    def _activate(self, commit: int) -> None:
        """Horovod's ``_activate_workers``: wait for --min-np slots (every rank, removed ones
        included, blocks meanwhile), then the new assignment, which must keep a host of the
        previous one, then the new ranks."""
        available = self._available_slots()
        if available < self.config.min_np:
            if self._blocked_since is None:
                self._blocked_since = time.time()
                self._blocked_commit = commit
                self.emit(
                    ev.RESET_WAITING, commit=commit, slots=available, min_np=self.config.min_np
                )
            return
        self._blocked_since = None
        assignment = self._next_assignment()
        previous = set(self._hosts)
        if previous and not previous & set(assignment):
            self._say(f"RuntimeError: {NO_PREVIOUS_HOSTS}")
            self.emit(
                ev.RESET_FAILED,
                commit=commit,
                error=f"RuntimeError: {NO_PREVIOUS_HOSTS}",
                previous=sorted(previous),
                hosts=list(assignment),
            )
            self._fail_job(
                "no_previous_hosts", "failed to activate new hosts -> stop running", commit=commit
            )
            return
        listed = self._listed or {}
        for host, entry in list(self._hosts.items()):
            keep = assignment.get(host, 0)
            for local_rank, rank in list(entry.ranks.items()):
                if not rank.alive:
                    del entry.ranks[local_rank]  # its failure was dealt with above
                elif local_rank >= keep:
                    if self._blacklist.get(host, 0.0) > time.time():
                        reason = "blacklisted"
                    elif host not in listed:
                        reason = "host_removed"
                    else:
                        reason = "slots_reduced"
                    del entry.ranks[local_rank]
                    self._unassign(rank, reason, commit)
            if host not in assignment:
                del self._hosts[host]
                if host not in listed and self._blacklist.get(host, 0.0) <= time.time():
                    self._hosts_removed += 1
        self._open_window(commit, self._apply_starts(assignment))

    def _open_window(self, commit: int, started: list[Rank]) -> None:
        for rank in started:
            rank.reset = commit
        if not started:
            return
        now = time.time()
        self._window = ResetWindow(
            commit=commit, started=now, deadline=now + self.config.gloo_timeout, new_ranks=started
        )

    def _check_window(self) -> None:
        """Closes the reset's rendezvous once every new rank has joined (and no rank of the
        world failed meanwhile: the others would wait for it in Gloo)."""
        window = self._window
        if window is None or self._pending_failures:
            return
        if all(r.running for r in window.new_ranks):
            self._window = None
            self.emit(
                ev.RESET_COMPLETED,
                commit=window.commit,
                seconds=time.time() - window.started,
                ranks=[r.rank_id for r in window.new_ranks],
            )
            if self.config.commit_marker:
                self._marker_due += window.new_ranks

    def _request_markers(self, commit: int) -> None:
        """A commit returned: each rank whose reset ended since the last commit that
        returned is told, and its hooked ``state.commit()`` prints the marker. Only the new
        ranks are told: the real hook prints on every rank after every reset, but the
        launcher's kubexec.sh reports only the first marker of each remote shell, so the
        others would cost a remote shell each (on a real cluster) for nothing."""
        due, self._marker_due = self._marker_due, []
        ranks = [r for r in due if r.alive and r.stopping is None]
        if not ranks:
            return
        self.emit(
            ev.COMMIT_MARKER_REQUESTED,
            commit=commit,
            resets=sorted({r.reset for r in ranks}),
            ranks=[r.rank_id for r in ranks],
            hosts=[r.host for r in ranks],
        )
        for rank in ranks:
            rank.marker_commit = commit
            self._ask_for_marker(rank)

    def _ask_for_marker(self, rank: Rank) -> None:
        """Removes the rank's reset file where it runs: here, when the file is (a rank on
        this machine, as on KWOK: its id makes the name unique), else through the remote
        shell, as the removal notice goes (a rank in a real container)."""
        local = Path(rank.reset_file)
        if local.exists():
            with contextlib.suppress(OSError):
                local.unlink()
            return
        command = f"rm -f {shlex.quote(rank.reset_file)}"
        what = "ask the rank for its commit marker"
        task = asyncio.create_task(self._remote(rank, command, what))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    def _gloo_abort(self, window: ResetWindow) -> None:
        """The Gloo timeout passed with a new rank missing: every rank of the world aborts
        in ``hvd.init`` while assigned, each a FAILURE, and the driver stops the job."""
        missing = [r.rank_id for r in window.new_ranks if not r.running]
        self.emit(
            ev.GLOO_TIMEOUT,
            commit=window.commit,
            gloo_timeout=self.config.gloo_timeout,
            missing=missing,
        )
        for rank in self._world():
            if not rank.alive or rank.aborted:
                continue
            if any(rank.rank_id in ids for ids in self._pending_failures.values()):
                continue
            rank.aborted = True
            self._failures += 1
            self._say(f"record state: {rank.host}[{rank.local_rank}] = FAILURE")
            self.emit(
                ev.RANK_FAILED,
                host=rank.host,
                rank_id=rank.rank_id,
                local_rank=rank.local_rank,
                exit_code=1,
                rsh_exit_code=None,
                signal=None,
                stderr="Gloo rendezvous timed out waiting for a new rank",
                exec_refused=False,
                listed=rank.host in (self._listed or {}),
                gloo_timeout=True,
            )
        size = len(self._world())
        self._fail_job("all_failed", f"failure count == {size} -> stop running", size=size)

    def _apply_starts(self, assignment: dict[str, int]) -> list[Rank]:
        """Starts a rank on every slot of the assignment that has none."""
        listed = self._listed or {}
        started: list[Rank] = []
        for host, slots in assignment.items():
            entry = self._hosts.get(host)
            new = entry is None
            if entry is None:
                entry = HostEntry()
                self._hosts[host] = entry
            free = [lr for lr in range(slots) if lr not in entry.ranks]
            if new and free:
                self.emit(ev.HOST_ADDED, host=host, slots=listed.get(host), ranks=len(free))
            started += [self._start_rank(host, lr, entry) for lr in free]
        return started

    def _rank_args(self, host: str, local_rank: int, rank_id: str, stop_file: Path) -> list[str]:
        cfg = self.config
        args = [
            "--host",
            host,
            "--rank-id",
            rank_id,
            "--local-rank",
            str(local_rank),
            "--driver-pid",
            str(os.getpid()),
            "--stop-file",
            str(stop_file),
            "--alive-file",
            self.config.rank_alive_file.format(rank_id=rank_id),
            "--commit-interval",
            f"{cfg.commit_interval:g}",
            "--start-seconds",
            f"{cfg.rank_start_seconds:g}",
        ]
        if cfg.rank_kubeconfig:
            args += ["--kubeconfig", cfg.rank_kubeconfig]
        if cfg.rank_namespace:
            args += ["--namespace", cfg.rank_namespace]
        if cfg.rank_kubectl:
            args += ["--kubectl", cfg.rank_kubectl]
        if cfg.rank_poll_interval is not None:
            args += ["--poll-interval", f"{cfg.rank_poll_interval:g}"]
        if cfg.commit_marker:
            args.append("--commit-marker")
        return args

    def _start_rank(self, host: str, local_rank: int, entry: HostEntry) -> Rank:
        assert self._work_dir is not None
        rank_id = uuid.uuid4().hex
        stop_file = self._work_dir / f"stop-{rank_id}"
        values = {
            "host": host,
            "rank_id": rank_id,
            "local_rank": str(local_rank),
            "driver_pid": str(os.getpid()),
            "stop_file": str(stop_file),
            "python": self.config.rank_python,
            "repo": self.config.rank_repo,
        }
        command = render_rank_command(
            self.config.rank_command,
            values,
            self._rank_args(host, local_rank, rank_id, stop_file),
        )
        rank = Rank(
            host=host,
            local_rank=local_rank,
            rank_id=rank_id,
            stop_file=stop_file,
            alive_file=self.config.rank_alive_file.format(rank_id=rank_id),
            command=command,
        )
        entry.ranks[local_rank] = rank
        self._ranks_started += 1
        task = asyncio.create_task(self._run_rank(rank))
        rank.task = task
        self._rank_tasks.add(task)
        task.add_done_callback(self._rank_tasks.discard)
        return rank

    async def _run_rank(self, rank: Rank) -> None:
        shell = remote_shell_command(self.config.rsh_agent, rank.host, rank.command)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                shell,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            rank.stderr_tail.append(f"cannot start remote shell: {exc}")
            self._on_rank_exit(rank, 127, None)
            return
        rank.proc = proc
        self.emit(
            ev.RANK_STARTED,
            host=rank.host,
            rank_id=rank.rank_id,
            local_rank=rank.local_rank,
            pid=proc.pid,
            command=rank.command,
        )
        if rank.stopping is not None:  # stopped before it was even spawned
            self._schedule_signal(rank, 0.0)
        assert proc.stdout is not None
        assert proc.stderr is not None
        readers = [
            asyncio.create_task(self._read_stdout(rank, proc.stdout)),
            asyncio.create_task(self._read_stderr(rank, proc.stderr)),
        ]
        returncode = await proc.wait()
        # A grandchild outside the process group may hold the pipes open; its output is not
        # worth hanging the driver for.
        _, pending = await asyncio.wait(readers, timeout=2.0)
        for reader in pending:
            reader.cancel()
        code, sig = exit_status(returncode)
        self._on_rank_exit(rank, code, sig)

    async def _read_stdout(self, rank: Rank, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            if not rank.running and text.startswith(RANK_STARTED_MARKER):
                rank.running = True
                self.emit(
                    ev.RANK_RUNNING,
                    host=rank.host,
                    rank_id=rank.rank_id,
                    local_rank=rank.local_rank,
                )
                if rank.stopping is not None:
                    self._send_notice(rank)  # unassigned before it was up
                self._check_window()
            elif COMMITTED_MARKER in text:  # as kubexec.sh matches it
                self.emit(
                    ev.COMMIT_MARKER_PRINTED,
                    host=rank.host,
                    rank_id=rank.rank_id,
                    local_rank=rank.local_rank,
                    reset=rank.reset,
                    requested_commit=rank.marker_commit,
                )
            self._say(f"[{rank.host}/{rank.local_rank}] {text}")

    async def _read_stderr(self, rank: Rank, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            rank.stderr_tail.append(text)
            self._say(f"[{rank.host}/{rank.local_rank}!] {text}")

    def _on_rank_exit(self, rank: Rank, rsh_code: int, sig: int | None) -> None:
        rank.exit_code = rsh_code
        self._departing.discard(rank)
        if rank.aborted:
            return  # its FAILURE is already recorded (the Gloo timeout)
        base = {"host": rank.host, "rank_id": rank.rank_id, "local_rank": rank.local_rank}
        code = rsh_code
        if rsh_code != 0:
            code = remote_exit_code(rank.stderr_text()) or rsh_code
        # Horovod judges an exit by (host, slot) at exit time: a rank without an assignment
        # whose host name is assigned that slot again counts as that slot's exit.
        entry = self._hosts.get(rank.host)
        holder = entry.ranks.get(rank.local_rank) if entry is not None else None
        reused = (
            rank.stopping not in (None, "shutdown")
            and holder is not None
            and not self._stop_event.is_set()
        )
        if rank.stopping is not None and not reused:
            # No assignment any more: Horovod ignores the exit, whatever its code (a removed
            # rank aborts with 134). Not a failure, and never a blacklist.
            if code != 0:
                self._say(
                    f"host {rank.host} has no assignment, ignoring exit from "
                    f"local_rank={rank.local_rank} (exit {code})"
                )
            self.emit(
                ev.RANK_STOPPED,
                **base,
                exit_code=code,
                rsh_exit_code=rsh_code,
                reason=rank.stopping,
                ignored=True,
            )
        elif code == 0:
            # An assigned slot finished: SUCCESS, which ends the job at the next commit.
            self._say(f"record state: {rank.host}[{rank.local_rank}] = SUCCESS")
            self._successes.append(rank.rank_id)
            self.emit(ev.RANK_EXITED, **base, exit_code=0, success=True, reused_slot=reused)
        else:
            # Its slot still has an assignment (listed, or gone from discovery but not yet
            # reset without it, or its name assigned again): what Horovod records as
            # FAILURE at once, rolls everyone back for, and blacklists at the next commit.
            self._record_failure(rank, base, code, rsh_code, sig, reused)
        if self._window is not None and self._pending_failures:
            self._say("a rank of the world is gone: the others wait for it in Gloo")

    def _record_failure(
        self,
        rank: Rank,
        base: dict[str, Any],
        code: int,
        rsh_code: int,
        sig: int | None,
        reused: bool,
    ) -> None:
        self._say(f"record state: {rank.host}[{rank.local_rank}] = FAILURE")
        self._failures += 1
        refused = not rank.running
        stderr = rank.stderr_text()
        listed = self._listed is not None and rank.host in self._listed
        self.emit(
            ev.RANK_FAILED,
            **base,
            exit_code=code,
            rsh_exit_code=rsh_code,
            signal=sig,
            stderr=stderr,
            exec_refused=refused,
            listed=listed,
            reused_slot=reused,
        )
        if refused:
            self._exec_failures += 1
            self.emit(ev.EXEC_FAILED, **base, exit_code=code, rsh_exit_code=rsh_code, stderr=stderr)
        self._pending_failures.setdefault(rank.host, []).append(rank.rank_id)

    def _blacklist_host(self, host: str, commit: int, rank_ids: list[str]) -> None:
        """Blacklists a failed host; its ranks lose their assignment at the activation
        that follows, because it is no longer usable."""
        now = time.time()
        if self._blacklist.get(host, 0.0) > now:
            return  # Horovod ignores failures of a host already in its cooldown
        cooldown: float | None = None
        if self.config.cooldown_range is not None:
            count = self._blacklist_counts.get(host, 0) + 1
            self._blacklist_counts[host] = count
            cooldown = cooldown_seconds(*self.config.cooldown_range, count)
            self._blacklist[host] = now + cooldown
        else:
            self._blacklist[host] = math.inf
        self._ever_blacklisted.add(host)
        self.emit(
            ev.HOST_BLACKLISTED,
            host=host,
            cooldown_seconds=cooldown,
            permanent=cooldown is None,
            commit=commit,
            failed_ranks=rank_ids,
            line=f"blacklist failing host: {host}",
        )

    def _unassign(self, rank: Rank, reason: str, commit: int) -> None:
        """Takes a rank's assignment away at a commit (Horovod's rank -1): it learns at its
        own next commit and exits 134 by itself, while its remote shell lives on until then.

        The notice goes both ways a rank can read it: the stop file, with the removal mark
        (a rank on the driver's machine, as on KWOK), and its alive file removed through the
        remote shell (a rank in a real container, which outlives a killed ``kubectl
        exec``). Signals follow only as a safety net, well after the rank's next commit.
        """
        if rank.stopping is not None or not rank.alive:
            return
        rank.stopping = reason
        self._departing.add(rank)
        self.emit(
            ev.RANK_UNASSIGNED,
            host=rank.host,
            rank_id=rank.rank_id,
            local_rank=rank.local_rank,
            reason=reason,
            commit=commit,
        )
        self._write_stop_file(rank, REMOVED_MARK)
        if rank.running:
            self._send_notice(rank)
        if rank.proc is not None:
            self._schedule_signal(rank, self.config.stop_grace + self.config.commit_interval)

    def _write_stop_file(self, rank: Rank, content: str) -> None:
        # Atomic, so a rank never reads a half-written removal mark as an empty (shutdown)
        # stop file.
        tmp = rank.stop_file.with_name(rank.stop_file.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(content)
            os.replace(tmp, rank.stop_file)

    def _send_notice(self, rank: Rank) -> None:
        if rank.notified:
            return
        rank.notified = True
        command = f"rm -f {shlex.quote(rank.alive_file)}"
        notice = asyncio.create_task(self._remote(rank, command, "notify the rank"))
        self._notices.add(notice)
        notice.add_done_callback(self._notices.discard)

    def _stop_rank(self, rank: Rank, reason: str) -> None:
        """Stops a rank at the end of the job: an empty stop file (a local rank exits 0 at
        once), the notice through the remote shell, SIGTERM now and SIGKILL after
        ``--stop-grace``. A rank already unassigned keeps its reason but is hurried too."""
        if not rank.alive:
            return
        if rank.stopping is None:
            rank.stopping = reason
        self._write_stop_file(rank, "")
        if rank.running:
            self._send_notice(rank)
        if rank.proc is not None:
            self._schedule_signal(rank, 0.0)

    async def _remote(self, rank: Rank, command: str, what: str) -> None:
        """Runs a short command where the rank runs, through the remote shell: the removal
        notice (its alive file removed) or the commit notice (its reset file removed).

        Best effort, like the stop file: a refused or failed exec leaves the rank to the
        signals that follow (or without its marker). Bounded by the discovery timeout, as a
        hung exec must not hold the driver's shutdown.
        """
        shell = remote_shell_command(self.config.rsh_agent, rank.host, command)
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                shell,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self._say(f"cannot {what} on {rank.host}: {exc}")
            return
        try:
            await asyncio.wait_for(proc.wait(), self.config.discovery_timeout)
        except TimeoutError:
            self._say(f"{what} on {rank.host}: the remote shell timed out")
        finally:
            if proc.returncode is None:
                _signal_group(proc, signal.SIGKILL)
                await proc.wait()

    def _schedule_signal(self, rank: Rank, delay: float) -> None:
        killer = asyncio.create_task(self._signal_rank(rank, delay))
        self._killers.add(killer)
        killer.add_done_callback(self._killers.discard)

    async def _signal_rank(self, rank: Rank, delay: float) -> None:
        for sig, wait in ((signal.SIGTERM, delay), (signal.SIGKILL, self.config.stop_grace)):
            await asyncio.sleep(wait)
            if rank.proc is None or rank.proc.returncode is not None:
                return
            _signal_group(rank.proc, sig)

    async def _stop_all(self, reason: str) -> None:
        for killer in set(self._killers):
            killer.cancel()  # the safety nets of unassigned ranks: all are signalled now
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        for rank in [*self._world(), *self._departing]:
            self._stop_rank(rank, reason)
        tasks = set(self._rank_tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.stop_grace + 3.0)
            for task in pending:
                task.cancel()
        for killer in set(self._killers):
            killer.cancel()
        if self._notices:
            _, late = await asyncio.wait(set(self._notices), timeout=self.config.stop_grace)
            for notice in late:
                notice.cancel()
            await asyncio.gather(*late, return_exceptions=True)


def _signal_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """Signals the child's whole process group (it leads a session of its own), so the
    shell, kubexec.sh and kubectl go together."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# -- command line ---------------------------------------------------------------------


def _env_seconds(name: str, default: float) -> float:
    """A timeout from Horovod's environment variable, as horovodrun reads it."""
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="horovodrun",
        description=(
            "Mock of Horovod's elastic driver for the mpijob-elastic end-to-end suite: runs "
            "the host discovery script, starts a mock rank per slot through the remote "
            "shell, and writes every membership change as one JSON line."
        ),
    )
    hv = parser.add_argument_group("horovodrun options")
    hv.add_argument("-np", "--num-proc", dest="np", type=int, help="slots to wait for at start")
    hv.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int)
    hv.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int)
    hv.add_argument("--host-discovery-script", default=DEFAULT_DISCOVERY_SCRIPT)
    hv.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int)
    hv.add_argument("--elastic-timeout", type=float, default=600.0)
    hv.add_argument(
        "--blacklist-cooldown-range",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="seconds; without it a failed host is blacklisted for the rest of the job",
    )
    hv.add_argument(
        "--start-timeout",
        type=float,
        default=_env_seconds("HOROVOD_START_TIMEOUT", DEFAULT_START_TIMEOUT),
        help="seconds from launch by which every host must answer the interface probe",
    )
    hv.add_argument(
        "--network-interface",
        "--network-interfaces",
        dest="network_interface",
        help="given, horovodrun skips the interface probe and may start on one host",
    )
    mk = parser.add_argument_group("mock options")
    mk.add_argument(
        "--gloo-timeout-seconds",
        type=float,
        default=_env_seconds("HOROVOD_GLOO_TIMEOUT_SECONDS", DEFAULT_GLOO_TIMEOUT),
        help="how long a reset's ranks wait for every new rank (HOROVOD_GLOO_TIMEOUT_SECONDS)",
    )
    mk.add_argument(
        "--rank-start-seconds",
        type=float,
        default=_env_seconds(RANK_START_ENV, DEFAULT_RANK_START_SECONDS),
        help="how long each rank takes from its start to joining (import torch, hvd.init), "
        f"passed to ranks (default ${RANK_START_ENV}, else {DEFAULT_RANK_START_SECONDS:g})",
    )
    mk.add_argument(
        "--commit-marker",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the training uses the controller's commit hook: each new rank prints its "
        "marker at the first commit after its reset (--no-commit-marker: a training without)",
    )
    mk.add_argument("--rsh-agent", default=DEFAULT_RSH_AGENT)
    mk.add_argument(
        "--rank-command",
        default=DEFAULT_RANK_COMMAND,
        help=(
            "template of the command run on each slot (str.format fields, shell-quoted: "
            + ", ".join("{" + f + "}" for f in RANK_COMMAND_FIELDS)
            + "); literal braces are doubled"
        ),
    )
    mk.add_argument("--rank-python", default=sys.executable, help="fills {python}")
    mk.add_argument("--rank-repo", default=str(REPO_ROOT), help="fills {repo}")
    mk.add_argument(
        "--rank-alive-file",
        default=DEFAULT_RANK_ALIVE_FILE,
        help="file ({rank_id} filled) a rank keeps where it runs; removing it lets it go",
    )
    mk.add_argument("--rank-kubeconfig", help="passed to ranks: enables their pod watch")
    mk.add_argument("--rank-namespace", help="passed to ranks")
    mk.add_argument("--rank-kubectl", help="passed to ranks")
    mk.add_argument("--rank-poll-interval", type=float, help="passed to ranks")
    mk.add_argument("--discovery-interval", type=float, default=1.0)
    mk.add_argument("--discovery-timeout", type=float, default=30.0)
    mk.add_argument("--run-seconds", type=float, default=0.0, help="0 runs until stopped")
    mk.add_argument("--stop-file", help="the job finishes when this file exists")
    mk.add_argument("--log-file", help="also append the event lines here")
    mk.add_argument(
        "--checkpoint-file",
        help="the training's step: resumed from if it exists, saved on a job-stopping notice",
    )
    mk.add_argument(
        "--notice-file", help="the controller's notice (default: $MPIJOB_ELASTIC_NOTICE_FILE)"
    )
    mk.add_argument("--work-dir", help="where per-rank stop files live (default: a temp dir)")
    mk.add_argument("--stop-grace", type=float, default=5.0, help="SIGTERM to SIGKILL, seconds")
    mk.add_argument(
        "--commit-interval",
        type=float,
        default=1.0,
        help="seconds between the job's commits (passed to ranks), where host updates, "
        "failures and successes take effect",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the training command (recorded, not run)"
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> DriverConfig:
    """Builds and validates a config; raises ConfigError for values horovodrun refuses."""
    ns = build_parser().parse_args(argv)
    if ns.np is None and ns.min_np is None:
        raise ConfigError("give -np or --min-np")
    np_ = ns.np if ns.np is not None else ns.min_np
    min_np = ns.min_np if ns.min_np is not None else np_
    cooldown: tuple[int, int] | None = None
    if ns.blacklist_cooldown_range:
        lower, upper = ns.blacklist_cooldown_range
        cooldown = (lower, upper)
    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    config = DriverConfig(
        np=np_,
        min_np=min_np,
        max_np=ns.max_np,
        discovery_script=ns.host_discovery_script,
        slots_per_host=ns.slots_per_host,
        elastic_timeout=ns.elastic_timeout,
        cooldown_range=cooldown,
        rsh_agent=ns.rsh_agent,
        rank_command=ns.rank_command,
        discovery_interval=ns.discovery_interval,
        discovery_timeout=ns.discovery_timeout,
        run_seconds=ns.run_seconds,
        stop_file=ns.stop_file,
        log_file=ns.log_file,
        work_dir=ns.work_dir,
        stop_grace=ns.stop_grace,
        commit_interval=ns.commit_interval,
        rank_kubeconfig=ns.rank_kubeconfig,
        rank_namespace=ns.rank_namespace,
        rank_kubectl=ns.rank_kubectl,
        rank_poll_interval=ns.rank_poll_interval,
        rank_python=ns.rank_python,
        rank_repo=ns.rank_repo,
        rank_alive_file=ns.rank_alive_file,
        gloo_timeout=ns.gloo_timeout_seconds,
        start_timeout=ns.start_timeout,
        network_interface=ns.network_interface,
        checkpoint_file=ns.checkpoint_file,
        notice_file=ns.notice_file,
        rank_start_seconds=ns.rank_start_seconds,
        commit_marker=ns.commit_marker,
        command=tuple(command),
    )
    config.validate()
    return config


async def run_driver(config: DriverConfig) -> int:
    """Runs a driver with stdout events and SIGTERM/SIGINT ending the job cleanly."""
    driver = Driver(config, out=sys.stdout, diag=sys.stderr)
    loop = asyncio.get_running_loop()
    for sig, name in ((signal.SIGTERM, "sigterm"), (signal.SIGINT, "sigint")):
        loop.add_signal_handler(sig, driver.request_stop, name)
    return await driver.run()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
    except ConfigError as exc:
        print(f"horovodrun (mock): {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(run_driver(config))
