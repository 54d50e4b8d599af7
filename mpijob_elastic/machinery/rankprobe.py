"""The shell's half of ``ranks.py``: the launcher's reports, and exec reads where they
say nothing.

The reports (``pushed``) are read from the cached ranks ConfigMap at each reconcile; what
is kept per job is the last snapshot, so ``lost`` grows across reports as it did across
reads, until the planner has acted on it (``acted_on``).

A plan that has victims in their drain window asks for a read (``Writes.probe``). The read
runs in the background, so a slow or hung exec never holds a reconcile worker; when it
ends, its answer is kept for the job and the job is queued again, and the next plan sees
it in ``Observed.ranks``. A read never fails a reconcile: an error is an answer that says
the signal cannot be read, and the drain falls back to its deadline.

At most ``PROBES_IN_FLIGHT`` reads run at once, for all jobs together. Each read is a
websocket of its own (a TLS handshake, buffers, the launcher's whole process list), and
nothing else bounds how many jobs ask at the same moment: a node drain moves many jobs at
once, and host-list changes held for launchers that report nothing read every second.
Unbounded (under the former rank watch), 1000 jobs made 1001 execs in 26 s, and the memory of
that peak stayed with the process (356.6 MB RSS after convergence, docs/benchmarks.md).
A read that waits longer than ``PROBE_TIMEOUT_SECONDS`` for a slot is dropped without an
answer: the job keeps its previous one (so a loss is still found against the last read
that worked) and asks again when its plan next wants a read, which it has already
scheduled. For a drain that is what an unreadable signal already means, a drain that
ends later, never earlier. And at most ``PROBES_PER_SECOND`` reads start per second, for
all jobs together: a node drain that moves many jobs at once, each with victims the
reports say nothing of, costs the API server a bounded rate of execs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic.core.actions import Probe
from mpijob_elastic.core.inputs.ranks import (
    NO_REMOTE_SHELL,
    PROBE_TIMEOUT_SECONDS,
    RankSnapshot,
    pushed,
    remote_shell_hosts,
)

log = logging.getLogger("mpijob_elastic.machinery.rankprobe")

Key = tuple[str, str]
# (namespace, pod, container) -> the probe command's stdout, within PROBE_TIMEOUT_SECONDS.
Execute = Callable[[str, str, str | None], Awaitable[bytes]]

# Few enough that their buffers stay a few MB.
PROBES_IN_FLIGHT = 32
# A read per job per second for 10 jobs draining at once; beyond that, reads come later.
PROBES_PER_SECOND = 10.0


class RankProbes:
    def __init__(
        self,
        execute: Execute,
        on_answer: Callable[[Key], None],
        *,
        in_flight: int = PROBES_IN_FLIGHT,
        slot_wait: float = PROBE_TIMEOUT_SECONDS,
        per_second: float = PROBES_PER_SECOND,
    ) -> None:
        self._execute = execute
        self._on_answer = on_answer
        self._slots = asyncio.Semaphore(in_flight)
        self._slot_wait = slot_wait
        self._spacing = 1.0 / per_second
        self._pace = asyncio.Lock()
        self._next_start = 0.0
        self._answers: dict[Key, RankSnapshot] = {}
        self._reports: dict[Key, tuple[str, RankSnapshot]] = {}
        self._running: dict[Key, asyncio.Task[None]] = {}

    def answer(self, key: Key) -> RankSnapshot | None:
        return self._answers.get(key)

    def pushed(
        self, key: Key, report: Mapping[str, Any] | None, running: bool, at: datetime
    ) -> RankSnapshot | None:
        """The launcher's reports as of ``at``; None unless its launcher runs."""
        if report is None or not running:
            # A launcher that starts again starts from an emptied report.
            self._reports.pop(key, None)
            return None
        version = str(report["metadata"].get("resourceVersion", ""))
        last = self._reports.get(key)
        if last is not None and last[0] == version:
            return dataclasses.replace(last[1], at=at)
        snapshot = pushed(report.get("data") or {}, at, last[1] if last else None)
        self._reports[key] = (version, snapshot)
        return snapshot

    def acted_on(self, key: Key, snapshot: RankSnapshot | None) -> None:
        """The planner's writes for ``snapshot`` went through: its losses are handled."""
        if snapshot is None or not snapshot.lost:
            return
        current = self._answers.get(key)
        if current is not None:
            self._answers[key] = dataclasses.replace(current, lost=current.lost - snapshot.lost)
        report = self._reports.get(key)
        if report is not None:
            handled = dataclasses.replace(report[1], lost=report[1].lost - snapshot.lost)
            self._reports[key] = (report[0], handled)

    def request(self, key: Key, probe: Probe) -> None:
        """Start a read unless one for this job is under way."""
        if key in self._running:
            return
        task = asyncio.create_task(self._read(key, probe), name=f"rank-probe-{'/'.join(key)}")
        self._running[key] = task
        task.add_done_callback(lambda _t: self._running.pop(key, None))

    def forget(self, key: Key) -> None:
        self._answers.pop(key, None)
        self._reports.pop(key, None)
        task = self._running.pop(key, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, key: Key, probe: Probe) -> None:
        try:
            async with asyncio.timeout(self._slot_wait):
                await self._slots.acquire()
        except TimeoutError:
            log.debug(
                "no free slot for a read of the launcher; the job asks again later",
                extra={"job": "/".join(key), "pod": probe.pod},
            )
            return
        try:
            async with self._pace:
                loop = asyncio.get_running_loop()
                wait = self._next_start - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._next_start = loop.time() + self._spacing
            await self._read_in_slot(key, probe)
        finally:
            self._slots.release()

    async def _read_in_slot(self, key: Key, probe: Probe) -> None:
        # When the read began, not when it was asked for: the drain compares it to its floor.
        at = datetime.now(UTC)
        try:
            # Bounded here too: an executor that ignores its own timeout cannot hang a job.
            output = await asyncio.wait_for(
                self._execute(key[0], probe.pod, probe.container),
                PROBE_TIMEOUT_SECONDS + 1,
            )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure only means: the signal cannot be read now
            snapshot = RankSnapshot(at, None, f"{type(err).__name__}: {err}")
            log.info(
                "cannot read the launcher's remote shells; drains run to their deadline",
                extra={"job": "/".join(key), "pod": probe.pod, "error": snapshot.error},
            )
        else:
            hosts = remote_shell_hosts(output, key[1])
            snapshot = RankSnapshot(at, hosts, "" if hosts is not None else NO_REMOTE_SHELL)
        previous = self._answers.get(key)
        if previous is not None:
            lost = previous.lost
            if previous.hosts and snapshot.hosts:
                # All gone at once is the launcher ending its run, not ranks failing.
                lost |= previous.hosts - snapshot.hosts
            # A host reached in both reads has been reached since the earlier one said.
            since = {
                h: previous.since.get(h, previous.at)
                if previous.hosts and h in previous.hosts
                else at
                for h in snapshot.hosts or ()
            }
            snapshot = dataclasses.replace(snapshot, lost=lost, since=since)
        elif snapshot.hosts:
            snapshot = dataclasses.replace(snapshot, since=dict.fromkeys(snapshot.hosts, at))
        self._answers[key] = snapshot
        self._on_answer(key)
