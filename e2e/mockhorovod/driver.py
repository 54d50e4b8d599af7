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

This module is the process shell: it runs the discovery script, the probe, the ranks'
remote shells and the commit clock, writes the files and the event lines, and feeds what it
sees into the state core (elastic.py), whose decisions it carries out (effects.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from e2e.mockhorovod import RANK_STARTED_MARKER, RESET_FILE_SUFFIX
from e2e.mockhorovod import events as ev
from e2e.mockhorovod.checkpoint import Checkpoint, notice_path
from e2e.mockhorovod.cli import parse_args
from e2e.mockhorovod.config import ConfigError, DriverConfig
from e2e.mockhorovod.discovery import DiscoveryError, parse_discovery_output
from e2e.mockhorovod.effects import (
    AskMarker,
    Effect,
    Emit,
    Note,
    Notify,
    Probe,
    SignalRank,
    StartRank,
    StopJob,
    WriteStopFile,
)
from e2e.mockhorovod.elastic import EXIT_FATAL, ElasticDriver
from e2e.mockhorovod.hook import COMMITTED_MARKER
from e2e.mockhorovod.remote import (
    PROBE_COMMAND,
    PROBE_MARKER,
    exit_status,
    remote_exit_code,
    remote_shell_command,
    render_rank_command,
)
from e2e.mockhorovod.world import Rank

EXIT_USAGE = 2

# How much of a rank's stderr an event carries: enough for kubectl's one-line refusal and
# the rank's own last words, not a whole log.
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 2000


@dataclass(eq=False)
class RankProcess:
    """One rank's remote shell child, and the files it reads where it runs."""

    rank: Rank
    stop_file: Path
    alive_file: str
    command: str
    proc: asyncio.subprocess.Process | None = None
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))

    @property
    def reset_file(self) -> str:
        return self.alive_file + RESET_FILE_SUFFIX

    def stderr_text(self) -> str:
        return "\n".join(self.stderr_tail)[-STDERR_TAIL_CHARS:]


class Driver:
    """The driver's processes and files on one asyncio loop, around its state core.

    Every call into the core happens between awaits, and the core's effects are carried
    out as it hands them over, so the core never sees a half-applied change.
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
        self._stop_event = asyncio.Event()
        self._checkpoint: Checkpoint | None = None
        # The step the run started from (a checkpoint), before its own commits.
        self._step_base = 0
        self._probe: asyncio.Task[None] | None = None
        self._procs: dict[Rank, RankProcess] = {}
        self._rank_tasks: set[asyncio.Task[None]] = set()
        self._killers: set[asyncio.Task[None]] = set()
        self._notices: set[asyncio.Task[None]] = set()
        self.core = ElasticDriver(config, self._carry_out, clock=time.time)

    @property
    def commits(self) -> int:
        """How many commits the job has made (every tick of the commit clock once started)."""
        return self.core.commits

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

    def _carry_out(self, effect: Effect) -> None:
        """Does what the core decided, at once (the core waits for nothing)."""
        match effect:
            case Emit(event, fields):
                self.emit(event, **fields)
            case Note(text):
                self._say(text)
            case Probe(hosts, remaining):
                self._probe = asyncio.create_task(self._probe_hosts(list(hosts), remaining))
            case StartRank(rank):
                self._start_rank(rank)
            case WriteStopFile(rank, content):
                self._write_stop_file(self._procs[rank], content)
            case Notify(rank):
                command = f"rm -f {shlex.quote(self._procs[rank].alive_file)}"
                self._run_notice(rank, command, "notify the rank")
            case AskMarker(rank):
                self._ask_for_marker(self._procs[rank])
            case SignalRank(rank, delay):
                if self._procs[rank].proc is not None:
                    self._schedule_signal(self._procs[rank], delay)
            case StopJob():
                self._stop_event.set()

    # -- lifecycle --------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Asks the run loop to stop the ranks and exit (SIGTERM, SIGINT, tests)."""
        self.core.request_stop(reason)

    async def run(self) -> int:
        """Runs until the job ends; returns the process exit code."""
        cfg = self.config
        self.core.begin()
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
                **self.core.summary(),
                step=self._step_base + self.core.commits,
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

    def _stop_file_present(self) -> bool:
        # Looked for only while no stop is known: the first reason is the one reported.
        stop_file = self.config.stop_file
        return self.core.stop_reason is None and bool(stop_file and os.path.exists(stop_file))

    async def _loop(self) -> tuple[int, str]:
        cfg = self.config
        core = self.core
        while True:
            ending = core.finish(self._stop_file_present())
            if ending is not None:
                return ending
            try:
                hosts = await self._discover()
            except DiscoveryError as exc:
                if core.discovery_failed(str(exc), exc.exit_code, exc.stderr, exc.timeout):
                    return EXIT_FATAL, "discovery_failed"
            else:
                if hosts is None:
                    continue  # a stop arrived during discovery; the loop top handles it
                core.discovered(hosts)
            if core.check_slots():
                return EXIT_FATAL, "elastic_timeout"
            core.start_job()
            wait = cfg.discovery_interval
            if cfg.run_seconds > 0:
                wait = min(wait, max(0.0, core.launched + cfg.run_seconds - time.time()))
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

    # -- start ------------------------------------------------------------------------

    async def _probe_hosts(self, hosts: list[str], remaining: float) -> None:
        results = await asyncio.gather(*(self._probe_host(host, remaining) for host in hosts))
        failed = [host for host, ok in zip(hosts, results, strict=True) if not ok]
        self.core.probe_finished(hosts, failed)

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

    # -- commits ----------------------------------------------------------------------

    async def _commit_clock(self) -> None:
        """The job's commits, one every ``--commit-interval`` on the loop's clock."""
        interval = self.config.commit_interval
        loop = asyncio.get_running_loop()
        origin = loop.time()
        tick = 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, origin + tick * interval - loop.time()))
            if loop.time() > origin + (tick + 1) * interval:  # fell behind: skip, never burst
                tick = int((loop.time() - origin) // interval)
            self.core.commit()
            self._checkpoint_tick()

    def _checkpoint_tick(self) -> None:
        """Rank 0's notice thread (checkpoint.py): the last commit's step saved while the
        job is stopping."""
        if self._checkpoint is None:
            return
        step = self._step_base + self.core.commits
        saved = self._checkpoint.tick(step)
        if saved is not None:
            self.emit(ev.CHECKPOINT_SAVED, step=step, cause=saved[0], deadline=saved[1])

    # -- ranks ------------------------------------------------------------------------

    def _rank_args(self, rank: Rank, stop_file: Path, alive_file: str) -> list[str]:
        cfg = self.config
        args = [
            "--host",
            rank.host,
            "--rank-id",
            rank.rank_id,
            "--local-rank",
            str(rank.local_rank),
            "--driver-pid",
            str(os.getpid()),
            "--stop-file",
            str(stop_file),
            "--alive-file",
            alive_file,
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

    def _start_rank(self, rank: Rank) -> None:
        assert self._work_dir is not None
        stop_file = self._work_dir / f"stop-{rank.rank_id}"
        alive_file = self.config.rank_alive_file.format(rank_id=rank.rank_id)
        values = {
            "host": rank.host,
            "rank_id": rank.rank_id,
            "local_rank": str(rank.local_rank),
            "driver_pid": str(os.getpid()),
            "stop_file": str(stop_file),
            "python": self.config.rank_python,
            "repo": self.config.rank_repo,
        }
        command = render_rank_command(
            self.config.rank_command, values, self._rank_args(rank, stop_file, alive_file)
        )
        process = RankProcess(rank, stop_file=stop_file, alive_file=alive_file, command=command)
        self._procs[rank] = process
        task = asyncio.create_task(self._run_rank(process))
        self._rank_tasks.add(task)
        task.add_done_callback(self._rank_tasks.discard)

    async def _run_rank(self, process: RankProcess) -> None:
        rank = process.rank
        shell = remote_shell_command(self.config.rsh_agent, rank.host, process.command)
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
            process.stderr_tail.append(f"cannot start remote shell: {exc}")
            self._exited(process, 127, None)
            return
        process.proc = proc
        self.emit(
            ev.RANK_STARTED,
            host=rank.host,
            rank_id=rank.rank_id,
            local_rank=rank.local_rank,
            pid=proc.pid,
            command=process.command,
        )
        if rank.stopping is not None:  # stopped before it was even spawned
            self._schedule_signal(process, 0.0)
        assert proc.stdout is not None
        assert proc.stderr is not None
        readers = [
            asyncio.create_task(self._read_stdout(rank, proc.stdout)),
            asyncio.create_task(self._read_stderr(process, proc.stderr)),
        ]
        returncode = await proc.wait()
        # A grandchild outside the process group may hold the pipes open; its output is not
        # worth hanging the driver for.
        _, pending = await asyncio.wait(readers, timeout=2.0)
        for reader in pending:
            reader.cancel()
        code, sig = exit_status(returncode)
        self._exited(process, code, sig)

    async def _read_stdout(self, rank: Rank, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            if not rank.running and text.startswith(RANK_STARTED_MARKER):
                self.core.joined(rank)
            elif COMMITTED_MARKER in text:  # as kubexec.sh matches it
                self.core.marker_printed(rank)
            self._say(f"[{rank.host}/{rank.local_rank}] {text}")

    async def _read_stderr(self, process: RankProcess, stream: asyncio.StreamReader) -> None:
        rank = process.rank
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            process.stderr_tail.append(text)
            self._say(f"[{rank.host}/{rank.local_rank}!] {text}")

    def _exited(self, process: RankProcess, rsh_code: int, sig: int | None) -> None:
        stderr = process.stderr_text()
        code = rsh_code
        if rsh_code != 0:
            code = remote_exit_code(stderr) or rsh_code
        self.core.rank_exited(process.rank, code, rsh_code, sig, stderr)
        # The core asks nothing more of a rank that exited: its output is read to the end
        # (or given up) before this.
        del self._procs[process.rank]

    def _write_stop_file(self, process: RankProcess, content: str) -> None:
        # Atomic, so a rank never reads a half-written removal mark as an empty (shutdown)
        # stop file.
        stop_file = process.stop_file
        tmp = stop_file.with_name(stop_file.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(content)
            os.replace(tmp, stop_file)

    def _ask_for_marker(self, process: RankProcess) -> None:
        """Removes the rank's reset file where it runs: here, when the file is (a rank on
        this machine, as on KWOK: its id makes the name unique), else through the remote
        shell, as the removal notice goes (a rank in a real container)."""
        local = Path(process.reset_file)
        if local.exists():
            with contextlib.suppress(OSError):
                local.unlink()
            return
        command = f"rm -f {shlex.quote(process.reset_file)}"
        self._run_notice(process.rank, command, "ask the rank for its commit marker")

    def _run_notice(self, rank: Rank, command: str, what: str) -> None:
        notice = asyncio.create_task(self._remote(rank, command, what))
        self._notices.add(notice)
        notice.add_done_callback(self._notices.discard)

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

    def _schedule_signal(self, process: RankProcess, delay: float) -> None:
        killer = asyncio.create_task(self._signal_rank(process, delay))
        self._killers.add(killer)
        killer.add_done_callback(self._killers.discard)

    async def _signal_rank(self, process: RankProcess, delay: float) -> None:
        for sig, wait in ((signal.SIGTERM, delay), (signal.SIGKILL, self.config.stop_grace)):
            await asyncio.sleep(wait)
            if process.proc is None or process.proc.returncode is not None:
                return
            _signal_group(process.proc, sig)

    async def _stop_all(self, reason: str) -> None:
        for killer in set(self._killers):
            killer.cancel()  # the safety nets of unassigned ranks: all are signalled now
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        self.core.stop_all(reason)
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
