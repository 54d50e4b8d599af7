"""The elastic driver's decisions: Horovod's ``ElasticDriver`` and the state registry of
its workers (runner/elastic/driver.py, registration.py), as a state machine.

It is fed what the process shell (driver.py) saw: a discovery result or failure, the
probe's answers, a rank's start line, marker or exit, a tick of the commit clock, a stop
request. It answers with effects (effects.py): event lines, notes, and what to do to the
ranks' processes and files. It reads time only through the clock it is given, and never
touches a process, a file or the event loop, so its rules can be driven step by step.

Every call runs to its end before the next, so a discovery result and a rank exit are never
half-applied against each other: a rank exit is judged against the host set the driver last
saw, as Horovod judges it against its current assignment.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from e2e.mockhorovod import REMOVED_MARK
from e2e.mockhorovod import events as ev
from e2e.mockhorovod.config import DriverConfig
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
from e2e.mockhorovod.hosts import HostManager
from e2e.mockhorovod.registry import Verdict, WorkerStates, judge_exit
from e2e.mockhorovod.rendezvous import ResetWindow
from e2e.mockhorovod.timeouts import ElasticTimeouts, SlotCheck
from e2e.mockhorovod.world import HostEntry, Rank

EXIT_OK = 0
EXIT_FATAL = 1

# Without --network-interface, horovodrun's elastic start waits for this many hosts: it
# finds the common interfaces host to host (runner/launch.py, _get_min_start_hosts).
MIN_START_HOSTS_WITHOUT_NIC = 2
# The stop reasons with which horovodrun exits 0: the training finished by itself.
CLEAN_STOPS = frozenset({"stop_file", "run_seconds", "sigint"})
NO_PREVIOUS_HOSTS = "No hosts from previous set remaining, unable to broadcast state."


def _new_rank_id() -> str:
    return uuid.uuid4().hex


class ElasticDriver:
    """The driver's state; ``sink`` carries out each effect, ``clock`` is wall time."""

    def __init__(
        self,
        config: DriverConfig,
        sink: Callable[[Effect], None],
        clock: Callable[[], float],
        new_rank_id: Callable[[], str] = _new_rank_id,
    ) -> None:
        self.config = config
        self._sink = sink
        self._clock = clock
        self._new_rank_id = new_rank_id
        self._hosts = HostManager(config.cooldown_range, config.max_np)
        self._timeouts = ElasticTimeouts(config.np, config.min_np, config.elastic_timeout)
        self.launched = 0.0
        self._discovered = False
        # Why the job ends; set by a request (a signal, a decision of the driver's) or when
        # the run loop finds the stop file or --run-seconds. Only a request hurries the
        # loop (StopJob) and counts as the job stopping when an exit is judged.
        self.stop_reason: str | None = None
        self._stop_requested = False
        # The current assignment (what the last reset gave each host), and the ranks that
        # lost theirs and have not exited yet.
        self._assigned: dict[str, HostEntry] = {}
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
        # The probe began: from then on the start deadline, not the elastic timeout, rules
        # the start, and a failed probe is never retried.
        self._probed = False
        self._success_code = EXIT_OK
        self._started = False
        self._failures = 0
        self._exec_failures = 0
        self._hosts_removed = 0
        self._ranks_started = 0
        self._commits = 0
        self._states = WorkerStates()

    @property
    def commits(self) -> int:
        """How many commits the job has made (every tick of the commit clock once started)."""
        return self._commits

    def _emit(self, event: str, **fields: Any) -> None:
        self._sink(Emit(event, fields))

    def _say(self, text: str) -> None:
        self._sink(Note(text))

    def _emit_check(self, check: SlotCheck) -> bool:
        for effect in check.events:
            self._sink(effect)
        return check.expired

    # -- lifecycle --------------------------------------------------------------------

    def begin(self) -> None:
        """The launch: the start's elastic timeout, start deadline and --run-seconds count
        from here."""
        self.launched = self._clock()

    def request_stop(self, reason: str) -> None:
        """Ends the job (SIGTERM, SIGINT, the driver's own decisions, tests)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop_requested = True
        self._sink(StopJob())

    def finish(self, stop_file_present: bool) -> tuple[int, str] | None:
        """(exit code, reason) when the job is to end now, after its ``stop_requested``."""
        cfg = self.config
        if self.stop_reason is None:
            if stop_file_present:
                self.stop_reason = "stop_file"
            elif cfg.run_seconds > 0 and self._clock() - self.launched >= cfg.run_seconds:
                self.stop_reason = "run_seconds"
        reason = self.stop_reason
        if reason is None:
            return None
        self._emit(ev.STOP_REQUESTED, reason=reason)
        return self._exit_code(reason), reason

    def _exit_code(self, reason: str) -> int:
        """horovodrun's exit code for a stop: 0 only when the training ended by itself, or a
        SUCCESS with no other rank left to stop; 1 on SIGTERM (an evicted launcher) and for
        every stop the driver decided on an error."""
        if reason in CLEAN_STOPS:
            return EXIT_OK
        if reason == "success":
            return self._success_code
        return EXIT_FATAL

    def summary(self) -> dict[str, Any]:
        """The counts of ``driver_exit``, in its field order."""
        return {
            "failures": self._failures,
            "exec_failures": self._exec_failures,
            "blacklisted": len(self._hosts.ever_blacklisted),
            "blacklisted_hosts": sorted(self._hosts.ever_blacklisted),
            "hosts_removed": self._hosts_removed,
            "ranks_started": self._ranks_started,
            "commits": self._commits,
        }

    # -- discovery --------------------------------------------------------------------

    def discovery_failed(
        self, error: str, exit_code: int | None, stderr: str, timeout: bool
    ) -> bool:
        """A failed discovery run; True when it is fatal (no discovery has succeeded yet)."""
        first = not self._discovered
        self._emit(
            ev.DISCOVERY_FAILED,
            error=error,
            exit_code=exit_code,
            stderr=stderr,
            timeout=timeout,
            first=first,
        )
        return first

    def discovered(self, hosts: dict[str, int]) -> None:
        self._discovered = True
        now = self._clock()
        if hosts != self._hosts.listed:
            self._emit(ev.DISCOVERY, hosts=list(hosts), slots=dict(hosts))
            # Horovod's discovery thread only notes the change; the ranks learn of it at
            # their next commit, and until then they keep their assignment.
            for host, entry in self._assigned.items():
                if host in hosts:
                    entry.noticed_gone = False  # back before the commit: nothing happened
                    continue
                if entry.noticed_gone:
                    continue
                entry.noticed_gone = True
                live = [r for r in entry.ranks.values() if r.alive]
                self._emit(
                    ev.HOST_REMOVED,
                    host=host,
                    # Not graceful when a FAILURE of it is already recorded: the next
                    # commit blacklists it rather than letting its ranks go.
                    graceful=not self._states.host_failed(host),
                    ranks=[r.rank_id for r in live],
                )
            self._hosts.update(hosts)
            self._notify_host_changes()
        for host in self._hosts.cooled_down(hosts, now):
            self._hosts.unblacklist(host)
            self._emit(ev.HOST_UNBLACKLISTED, host=host)
            self._notify_host_changes()  # Horovod counts a host back as one added

    def _notify_host_changes(self) -> None:
        """Horovod's ``_notify_workers_host_changes``: one notice per discovery change, sent
        to the coordinator only when the assignment would change (an empty one below
        --min-np). A notice that arrives while the ranks re-rendezvous is lost: they replace
        their message queue once the new world is up, and nothing is sent again. A reset
        that waits for slots reads the hosts afresh when it resumes, so it needs none."""
        if not self._started or self._blocked_since is not None:
            return
        now = self._clock()
        if self._hosts.available_slots(now) < self.config.min_np:
            upcoming: dict[str, int] = {}
        else:
            upcoming = self._hosts.assignment(now)
        if upcoming == self._assignment():
            return
        if self._window is not None:
            self._emit(
                ev.HOSTS_UPDATE_LOST,
                commit=self._window.commit,
                hosts=list(self._hosts.listed or {}),
                assigned=sorted(self._assigned),
            )
            self._say("host update arrived during a reset: dropped with the message queue")
            return
        self._notice = True

    def _assignment(self) -> dict[str, int]:
        return {host: len(entry.ranks) for host, entry in self._assigned.items()}

    def _min_start_hosts(self) -> int:
        return 1 if self.config.network_interface else MIN_START_HOSTS_WITHOUT_NIC

    def check_slots(self) -> bool:
        """Tracks the elastic timeout; True when it expired and the job must fail."""
        now = self._clock()
        available = self._hosts.available_slots(now)
        if self._started:
            return self._emit_check(self._timeouts.running(now, available))
        if self._probed:
            return False  # the start deadline rules from here
        hosts = len(self._hosts.usable(now))
        check = self._timeouts.before_start(
            now, self.launched, available, hosts, self._min_start_hosts()
        )
        return self._emit_check(check)

    # -- start ------------------------------------------------------------------------

    def start_job(self) -> None:
        """Once -np slots (and, without --network-interface, two hosts) exist: the
        interface probe, then the first ranks (no commit to wait for yet)."""
        if self._started or self._probed or self._hosts.listed is None:
            return
        now = self._clock()
        usable = self._hosts.usable(now)
        if self._hosts.available_slots(now) < self.config.np:
            return
        if len(usable) < self._min_start_hosts():
            return
        if self.config.network_interface:
            self._launch()
            return
        # horovodrun's common-interface detection: a task service on every discovered
        # host, through the remote shell, all registered by the start deadline (launch +
        # --start-timeout), or the job fails before any rank starts.
        self._probed = True
        remaining = self.launched + self.config.start_timeout - now
        self._emit(ev.PROBE_STARTED, hosts=usable, remaining=remaining)
        self._sink(Probe(tuple(usable), remaining))

    def probe_finished(self, hosts: list[str], failed: list[str]) -> None:
        """The probe's answer: ``failed`` are the hosts that did not answer in time."""
        if failed:
            error = (
                "Timed out waiting for the task services of "
                f"{', '.join(failed)} to register (start timeout "
                f"{self.config.start_timeout:g}s from launch)"
            )
            self._say(error)
            self._emit(ev.START_FAILED, hosts=hosts, failed=failed, error=error)
            self.request_stop("start_failed")
            return
        self._emit(ev.PROBE_DONE, hosts=hosts, seconds=self._clock() - self.launched)
        if not self._stop_requested:
            self._launch()

    def _launch(self) -> None:
        cfg = self.config
        self._started = True
        now = self._clock()
        assignment = self._hosts.assignment(now)
        self._emit(
            ev.JOB_STARTED,
            np=cfg.np,
            available=self._hosts.available_slots(now),
            hosts=list(assignment),
        )
        started = self._apply_starts(assignment)
        self._open_window(0, started)

    # -- commits and resets -----------------------------------------------------------

    def _world(self) -> list[Rank]:
        return [rank for entry in self._assigned.values() for rank in entry.ranks.values()]

    def _fail_job(self, reason: str, line: str, **fields: Any) -> None:
        """A stop Horovod decides on an error: horovodrun exits 1."""
        self._say(line)
        self._emit(ev.JOB_FAILED, reason=reason, line=line, **fields)
        self.request_stop(reason)

    def commit(self) -> None:
        """One tick of the job's commits: every ``--commit-interval`` the ranks reach
        ``state.commit()`` together, which is where Horovod's barrier acts on host updates
        and failures. A reset when anything is pending; nothing while the ranks are in a
        reset's rendezvous or wait in a reset for slots."""
        if not self._started or self._stop_requested:
            return
        if self._states.all_failed(self._world()):
            size = len(self._world())
            self._fail_job("all_failed", f"failure count == {size} -> stop running", size=size)
            return
        if self._window is not None:
            if self._window.expired(self._clock()):
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
                ("failure", self._states.any_failure),
                ("success", self._states.successes),
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
        self._emit(ev.RESET, commit=commit, reasons=reasons)
        if self._states.successes:
            # Any SUCCESS ends the whole job at this barrier; horovodrun exits 1 when it had
            # to stop other ranks that were still training.
            done = set(self._states.successes)
            others = [r for r in self._world() if r.alive and r.rank_id not in done]
            self._success_code = EXIT_FATAL if others else EXIT_OK
            self._say(f"success count == {len(done)} -> stop running")
            self.request_stop("success")
            return
        world = self._world()
        self._blacklist_pending(commit)
        now = self._clock()
        if world and all(self._hosts.is_blacklisted(r.host, now) for r in world):
            self._fail_job(
                "all_blacklisted",
                f"blacklisted slots count == {len(world)} -> stop running",
                size=len(world),
            )
            return
        self._activate(commit)

    def _blacklist_pending(self, commit: int) -> None:
        for host, rank_ids in self._states.take_failures().items():
            self._say(f"blacklist failing host: {host}")
            self._blacklist_host(host, commit, rank_ids)

    def _blacklist_host(self, host: str, commit: int, rank_ids: list[str]) -> None:
        """Blacklists a failed host; its ranks lose their assignment at the activation
        that follows, because it is no longer usable."""
        now = self._clock()
        if self._hosts.is_blacklisted(host, now):
            return  # Horovod ignores failures of a host already in its cooldown
        cooldown = self._hosts.blacklist(host, now)
        self._emit(
            ev.HOST_BLACKLISTED,
            host=host,
            cooldown_seconds=cooldown,
            permanent=cooldown is None,
            commit=commit,
            failed_ranks=rank_ids,
            line=f"blacklist failing host: {host}",
        )

    def _activate(self, commit: int) -> None:
        """Horovod's ``_activate_workers``: wait for --min-np slots (every rank, removed ones
        included, blocks meanwhile), then the new assignment, which must keep a host of the
        previous one, then the new ranks."""
        now = self._clock()
        available = self._hosts.available_slots(now)
        if available < self.config.min_np:
            if self._blocked_since is None:
                self._blocked_since = now
                self._blocked_commit = commit
                self._emit(
                    ev.RESET_WAITING, commit=commit, slots=available, min_np=self.config.min_np
                )
            return
        self._blocked_since = None
        assignment = self._hosts.assignment(now)
        previous = set(self._assigned)
        if previous and not previous & set(assignment):
            self._say(f"RuntimeError: {NO_PREVIOUS_HOSTS}")
            self._emit(
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
        for host, entry in list(self._assigned.items()):
            keep = assignment.get(host, 0)
            for local_rank, rank in list(entry.ranks.items()):
                if not rank.alive:
                    del entry.ranks[local_rank]  # its failure was dealt with above
                elif local_rank >= keep:
                    if self._hosts.is_blacklisted(host, self._clock()):
                        reason = "blacklisted"
                    elif not self._hosts.is_listed(host):
                        reason = "host_removed"
                    else:
                        reason = "slots_reduced"
                    del entry.ranks[local_rank]
                    self._unassign(rank, reason, commit)
            if host not in assignment:
                del self._assigned[host]
                if not self._hosts.is_listed(host) and not self._hosts.is_blacklisted(
                    host, self._clock()
                ):
                    self._hosts_removed += 1
        self._open_window(commit, self._apply_starts(assignment))

    def _apply_starts(self, assignment: dict[str, int]) -> list[Rank]:
        """Starts a rank on every slot of the assignment that has none."""
        listed = self._hosts.listed or {}
        started: list[Rank] = []
        for host, slots in assignment.items():
            entry = self._assigned.get(host)
            new = entry is None
            if entry is None:
                entry = HostEntry()
                self._assigned[host] = entry
            free = [lr for lr in range(slots) if lr not in entry.ranks]
            if new and free:
                self._emit(ev.HOST_ADDED, host=host, slots=listed.get(host), ranks=len(free))
            for local_rank in free:
                rank = Rank(host=host, local_rank=local_rank, rank_id=self._new_rank_id())
                entry.ranks[local_rank] = rank
                self._ranks_started += 1
                self._sink(StartRank(rank))
                started.append(rank)
        return started

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
        self._emit(
            ev.RANK_UNASSIGNED,
            host=rank.host,
            rank_id=rank.rank_id,
            local_rank=rank.local_rank,
            reason=reason,
            commit=commit,
        )
        self._sink(WriteStopFile(rank, REMOVED_MARK))
        if rank.running:
            self._notify(rank)
        self._sink(SignalRank(rank, self.config.stop_grace + self.config.commit_interval))

    def _notify(self, rank: Rank) -> None:
        if rank.notified:
            return
        rank.notified = True
        self._sink(Notify(rank))

    # -- the rendezvous window --------------------------------------------------------

    def _open_window(self, commit: int, started: list[Rank]) -> None:
        for rank in started:
            rank.reset = commit
        if not started:
            return
        self._window = ResetWindow.open(commit, started, self._clock(), self.config.gloo_timeout)

    def _check_window(self) -> None:
        """Closes the reset's rendezvous once every new rank has joined (and no rank of the
        world failed meanwhile: the others would wait for it in Gloo)."""
        window = self._window
        if window is None or self._states.any_failure:
            return
        if window.all_joined():
            self._window = None
            self._emit(
                ev.RESET_COMPLETED,
                commit=window.commit,
                seconds=self._clock() - window.started,
                ranks=[r.rank_id for r in window.new_ranks],
            )
            if self.config.commit_marker:
                self._marker_due += window.new_ranks

    def _gloo_abort(self, window: ResetWindow) -> None:
        """The Gloo timeout passed with a new rank missing: every rank of the world aborts
        in ``hvd.init`` while assigned, each a FAILURE, and the driver stops the job."""
        self._emit(
            ev.GLOO_TIMEOUT,
            commit=window.commit,
            gloo_timeout=self.config.gloo_timeout,
            missing=window.missing(),
        )
        for rank in self._world():
            if not rank.alive or rank.aborted:
                continue
            if self._states.rank_failed(rank):
                continue
            rank.aborted = True
            self._failures += 1
            self._say(f"record state: {rank.host}[{rank.local_rank}] = FAILURE")
            self._emit(
                ev.RANK_FAILED,
                host=rank.host,
                rank_id=rank.rank_id,
                local_rank=rank.local_rank,
                exit_code=1,
                rsh_exit_code=None,
                signal=None,
                stderr="Gloo rendezvous timed out waiting for a new rank",
                exec_refused=False,
                listed=self._hosts.is_listed(rank.host),
                gloo_timeout=True,
            )
        size = len(self._world())
        self._fail_job("all_failed", f"failure count == {size} -> stop running", size=size)

    # -- the commit marker ------------------------------------------------------------

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
        self._emit(
            ev.COMMIT_MARKER_REQUESTED,
            commit=commit,
            resets=sorted({r.reset for r in ranks}),
            ranks=[r.rank_id for r in ranks],
            hosts=[r.host for r in ranks],
        )
        for rank in ranks:
            rank.marker_commit = commit
            self._sink(AskMarker(rank))

    def marker_printed(self, rank: Rank) -> None:
        self._emit(
            ev.COMMIT_MARKER_PRINTED,
            host=rank.host,
            rank_id=rank.rank_id,
            local_rank=rank.local_rank,
            reset=rank.reset,
            requested_commit=rank.marker_commit,
        )

    # -- the ranks --------------------------------------------------------------------

    def joined(self, rank: Rank) -> None:
        """The rank printed its start line (the first time): hvd.init returned, the exec
        worked. A rank of an open window that comes up at or after its deadline is too late:
        Gloo's timer in the waiting ranks fired first, whether or not a commit tick has
        looked at the window since (the ticks alone would let it in up to a tick late)."""
        window = self._window
        if window is not None and rank in window.new_ranks and window.expired(self._clock()):
            self._gloo_abort(window)
            return
        rank.running = True
        self._emit(
            ev.RANK_RUNNING, host=rank.host, rank_id=rank.rank_id, local_rank=rank.local_rank
        )
        if rank.stopping is not None:
            self._notify(rank)  # unassigned before it was up
        self._check_window()

    def rank_exited(
        self, rank: Rank, code: int, rsh_code: int, sig: int | None, stderr: str
    ) -> None:
        """The rank's remote shell exited with ``rsh_code`` (``sig`` if a signal ended it);
        ``code`` is the remote command's own, as kubectl reported it, else ``rsh_code``."""
        rank.exit_code = rsh_code
        self._departing.discard(rank)
        if rank.aborted:
            return  # its FAILURE is already recorded (the Gloo timeout)
        base = {"host": rank.host, "rank_id": rank.rank_id, "local_rank": rank.local_rank}
        entry = self._assigned.get(rank.host)
        assigned = entry is not None and rank.local_rank in entry.ranks
        verdict, reused = judge_exit(rank, assigned, self._stop_requested, code)
        if verdict is Verdict.IGNORED:
            if code != 0:
                self._say(
                    f"host {rank.host} has no assignment, ignoring exit from "
                    f"local_rank={rank.local_rank} (exit {code})"
                )
            self._emit(
                ev.RANK_STOPPED,
                **base,
                exit_code=code,
                rsh_exit_code=rsh_code,
                reason=rank.stopping,
                ignored=True,
            )
        elif verdict is Verdict.SUCCESS:
            # An assigned slot finished: SUCCESS, which ends the job at the next commit.
            self._say(f"record state: {rank.host}[{rank.local_rank}] = SUCCESS")
            self._states.record_success(rank)
            self._emit(ev.RANK_EXITED, **base, exit_code=0, success=True, reused_slot=reused)
        else:
            # Its slot still has an assignment (listed, or gone from discovery but not yet
            # reset without it, or its name assigned again): what Horovod records as
            # FAILURE at once, rolls everyone back for, and blacklists at the next commit.
            self._record_failure(rank, base, code, rsh_code, sig, stderr, reused)
        if self._window is not None and self._states.any_failure:
            self._say("a rank of the world is gone: the others wait for it in Gloo")

    def _record_failure(
        self,
        rank: Rank,
        base: dict[str, Any],
        code: int,
        rsh_code: int,
        sig: int | None,
        stderr: str,
        reused: bool,
    ) -> None:
        self._say(f"record state: {rank.host}[{rank.local_rank}] = FAILURE")
        self._failures += 1
        refused = not rank.running
        self._emit(
            ev.RANK_FAILED,
            **base,
            exit_code=code,
            rsh_exit_code=rsh_code,
            signal=sig,
            stderr=stderr,
            exec_refused=refused,
            listed=self._hosts.is_listed(rank.host),
            reused_slot=reused,
        )
        if refused:
            self._exec_failures += 1
            self._emit(
                ev.EXEC_FAILED, **base, exit_code=code, rsh_exit_code=rsh_code, stderr=stderr
            )
        self._states.record_failure(rank)

    def stop_all(self, reason: str) -> None:
        """Stops every rank at the end of the job, the unassigned ones hurried too: an empty
        stop file (a local rank exits 0 at once), the notice, SIGTERM now and SIGKILL after
        ``--stop-grace``. An unassigned rank keeps its reason."""
        for rank in [*self._world(), *self._departing]:
            if not rank.alive:
                continue
            if rank.stopping is None:
                rank.stopping = reason
            self._sink(WriteStopFile(rank, ""))
            if rank.running:
                self._notify(rank)
            self._sink(SignalRank(rank, 0.0))
