"""The mock Horovod driver's state core (e2e/mockhorovod/elastic.py), driven step by step.

The core is fed what the process shell would see (a discovery result, a rank's start line or
exit, a tick of the commit clock) and read back through its effects, with a clock the test
moves. So the rules that take real processes and seconds of waiting in test_mockhorovod.py
are checked here at exact instants: the lost host update of a reset window (rule 2), the
Gloo timeout (rule 3), the elastic timeouts, the blacklist cooldown.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from e2e.mockhorovod import REMOVED_MARK
from e2e.mockhorovod import events as ev
from e2e.mockhorovod.config import DriverConfig
from e2e.mockhorovod.effects import (
    Effect,
    Emit,
    Probe,
    SignalRank,
    StartRank,
    StopJob,
    WriteStopFile,
)
from e2e.mockhorovod.elastic import ElasticDriver
from e2e.mockhorovod.registry import Verdict, judge_exit
from e2e.mockhorovod.world import Rank

Event = dict[str, Any]

PACKAGE = Path(__file__).resolve().parents[2] / "e2e" / "mockhorovod"
CORE_MODULES = ("effects", "elastic", "hosts", "registry", "rendezvous", "timeouts", "world")


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Core:
    """One core, its fake clock, and every effect it has handed over."""

    config: DriverConfig
    clock: Clock = field(default_factory=Clock)
    effects: list[Effect] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.config.validate()
        ids = itertools.count()
        self.driver = ElasticDriver(
            self.config, self.effects.append, clock=self.clock, new_rank_id=lambda: f"r{next(ids)}"
        )
        self.driver.begin()

    def poll(self, *lines: str) -> bool:
        """One turn of the shell's loop with this discovery output; True: the job fails."""
        self.driver.discovered({h: int(s) for h, _, s in (line.partition(":") for line in lines)})
        if self.driver.check_slots():
            return True
        self.driver.start_job()
        return False

    def events(self, *names: str) -> list[Event]:
        return [
            {"event": e.event, **e.fields}
            for e in self.effects
            if isinstance(e, Emit) and (not names or e.event in names)
        ]

    def ranks(self, host: str | None = None) -> list[Rank]:
        return [
            e.rank
            for e in self.effects
            if isinstance(e, StartRank) and (host is None or e.rank.host == host)
        ]

    def join_all(self) -> None:
        for rank in self.ranks():
            if not rank.running and rank.alive:
                self.driver.joined(rank)

    def exit(self, rank: Rank, code: int) -> None:
        self.driver.rank_exited(rank, code, code, None, "")


def core(**overrides: Any) -> Core:
    base = DriverConfig(np=2, min_np=1, network_interface="eth0", commit_interval=1.0)
    return Core(replace(base, **overrides))


def up(c: Core, *lines: str) -> None:
    """The job started on these hosts and its first ranks joined (the start's window closed)."""
    assert not c.poll(*lines)
    c.join_all()
    assert [e["commit"] for e in c.events(ev.RESET_COMPLETED)] == [0]


# -- rule 2: a host update is sent once, and lost during a reset --------------------------


def test_rule2_a_change_inside_the_window_is_lost_and_acted_on_only_with_the_next() -> None:
    c = core(gloo_timeout=30.0)
    up(c, "a:1", "b:1")
    c.poll("a:1", "b:1", "c:1")
    c.driver.commit()
    assert c.events(ev.RESET)[-1] == {"event": ev.RESET, "commit": 1, "reasons": ["hosts_updated"]}
    (c_rank,) = c.ranks("c")

    c.clock.advance(5.0)  # c is still starting: the ranks are in the rendezvous
    c.poll("a:1", "c:1")  # b unlisted meanwhile
    (lost,) = c.events(ev.HOSTS_UPDATE_LOST)
    assert (lost["commit"], lost["hosts"], lost["assigned"]) == (1, ["a", "c"], ["a", "b", "c"])
    c.driver.commit()
    assert c.driver.commits == 1  # no commit inside the window

    c.driver.joined(c_rank)
    assert c.events(ev.RESET_COMPLETED)[-1]["commit"] == 1
    for _ in range(3):
        c.clock.advance(1.0)
        c.driver.commit()
    assert c.driver.commits == 4  # training went on...
    assert len(c.events(ev.RESET)) == 1  # ...nothing re-sent...
    assert c.events(ev.RANK_UNASSIGNED) == []  # ...with b, no longer listed

    c.poll("a:1", "c:1", "d:1")  # an unrelated change sends a notice: the reset drops b
    c.driver.commit()
    (gone,) = c.events(ev.RANK_UNASSIGNED)
    assert (gone["host"], gone["reason"], gone["commit"]) == ("b", "host_removed", 5)
    (b_rank,) = c.ranks("b")
    assert WriteStopFile(b_rank, REMOVED_MARK) in c.effects
    assert [r.host for r in c.ranks()][-1] == "d"


def test_rule2_a_change_after_the_window_closed_is_acted_on_at_the_next_commit() -> None:
    c = core()
    up(c, "a:1", "b:1")
    c.poll("a:1")
    assert c.events(ev.HOSTS_UPDATE_LOST) == []
    assert c.events(ev.RANK_UNASSIGNED) == []  # only at the commit
    c.driver.commit()
    assert [e["host"] for e in c.events(ev.RANK_UNASSIGNED)] == ["b"]


# -- rule 3: the Gloo timeout ----------------------------------------------------------


def test_rule3_a_new_rank_missing_at_the_gloo_timeout_aborts_every_rank() -> None:
    c = core(gloo_timeout=30.0)
    up(c, "a:1", "b:1")
    c.poll("a:1", "b:1", "c:1")
    c.driver.commit()
    (c_rank,) = c.ranks("c")

    c.clock.advance(29.9)
    c.driver.commit()
    assert c.events(ev.GLOO_TIMEOUT) == []  # the window is still open: no abort yet
    c.clock.advance(0.1)
    c.driver.commit()
    (timeout,) = c.events(ev.GLOO_TIMEOUT)
    assert (timeout["commit"], timeout["missing"]) == (1, [c_rank.rank_id])
    aborted = c.events(ev.RANK_FAILED)
    assert {e["host"] for e in aborted} == {"a", "b", "c"}
    assert all(e["gloo_timeout"] for e in aborted)
    (failed,) = c.events(ev.JOB_FAILED)
    assert failed["line"] == "failure count == 3 -> stop running"
    assert c.effects[-1] == StopJob()
    assert c.driver.finish(stop_file_present=False) == (1, "all_failed")
    assert c.driver.summary()["failures"] == 3


def test_rule3_a_rank_up_after_the_gloo_timeout_is_too_late_between_two_ticks() -> None:
    c = core(gloo_timeout=5.0)
    up(c, "a:1", "b:1")
    c.poll("a:1", "b:1", "c:1")
    c.driver.commit()
    (c_rank,) = c.ranks("c")
    c.clock.advance(5.3)  # no tick since: only Gloo's own timer has fired
    c.driver.joined(c_rank)
    (timeout,) = c.events(ev.GLOO_TIMEOUT)
    assert timeout["missing"] == [c_rank.rank_id]
    assert not c_rank.running
    assert [e for e in c.events(ev.RANK_RUNNING) if e["host"] == "c"] == []
    assert c.driver.finish(stop_file_present=False) == (1, "all_failed")


def test_rule3_a_rank_failing_inside_the_window_keeps_it_open_until_the_timeout() -> None:
    c = core(gloo_timeout=10.0)
    up(c, "a:1", "b:1")
    c.poll("a:1", "b:1", "c:1")
    c.driver.commit()
    (a_rank,) = c.ranks("a")
    c.exit(a_rank, 137)  # a dies while the others wait for c
    c.driver.joined(c.ranks("c")[0])
    assert c.events(ev.RESET_COMPLETED)[-1]["commit"] == 0  # not closed: they wait for a
    c.clock.advance(10.0)
    c.driver.commit()
    (timeout,) = c.events(ev.GLOO_TIMEOUT)
    assert timeout["missing"] == []
    # a's FAILURE is recorded once, not again as an abort.
    assert [e["host"] for e in c.events(ev.RANK_FAILED)] == ["a", "b", "c"]
    assert [e.get("gloo_timeout", False) for e in c.events(ev.RANK_FAILED)] == [False, True, True]


# -- the elastic timeouts -------------------------------------------------------------


def test_elastic_timeout_before_the_start_counts_from_the_launch() -> None:
    c = core(np=2, elastic_timeout=60.0)
    assert not c.poll("a:1")
    (waiting,) = c.events(ev.WAITING_FOR_SLOTS)
    assert (waiting["needed"], waiting["available"]) == (2, 1)
    c.clock.advance(60.0)
    assert not c.poll("a:1")  # at the timeout, not yet past it
    c.clock.advance(0.5)
    assert c.poll("a:1")
    (timeout,) = c.events(ev.ELASTIC_TIMEOUT)
    assert (timeout["phase"], timeout["waited"]) == ("start", 60.5)
    assert len(c.events(ev.WAITING_FOR_SLOTS)) == 1  # announced once
    assert c.ranks() == []


def test_elastic_timeout_below_min_np_counts_from_the_drop_and_restarts_after_recovery() -> None:
    c = core(np=2, min_np=2, elastic_timeout=60.0)
    up(c, "a:1", "b:1")
    c.clock.advance(100.0)  # time spent at full size does not count
    assert not c.poll("a:1")
    (below,) = c.events(ev.BELOW_MIN_NP)
    assert (below["slots"], below["min_np"]) == (1, 2)
    c.clock.advance(50.0)
    assert not c.poll("a:1", "b:1")
    assert len(c.events(ev.MIN_NP_RESTORED)) == 1
    c.clock.advance(1.0)
    assert not c.poll("a:1")  # a new drop: the count starts again
    c.clock.advance(60.0)
    assert not c.poll("a:1")
    c.clock.advance(0.5)
    assert c.poll("a:1")
    (timeout,) = c.events(ev.ELASTIC_TIMEOUT)
    assert (timeout["phase"], timeout["waited"]) == ("running", 60.5)


def test_rule4_a_reset_below_min_np_blocks_every_rank_and_resumes_with_the_hosts_of_then() -> None:
    c = core(np=3, min_np=2, elastic_timeout=600.0)
    up(c, "a:1", "b:1", "c:1")
    c.poll("a:1")
    c.driver.commit()
    (waiting,) = c.events(ev.RESET_WAITING)
    assert (waiting["commit"], waiting["slots"]) == (1, 1)
    for _ in range(5):
        c.clock.advance(1.0)
        c.driver.commit()
    assert c.driver.commits == 1  # no training
    assert c.events(ev.RANK_UNASSIGNED) == []  # the removed ranks wait too
    c.poll("a:1", "d:1")
    c.driver.commit()
    assert {e["host"] for e in c.events(ev.RANK_UNASSIGNED)} == {"b", "c"}
    assert {e["commit"] for e in c.events(ev.RANK_UNASSIGNED)} == {1}
    assert [r.host for r in c.ranks("d")] == ["d"]


# -- the blacklist and its cooldown ---------------------------------------------------


def test_a_failure_is_blacklisted_at_the_next_commit_and_never_at_once() -> None:
    c = core()
    up(c, "a:1", "b:1")
    (b_rank,) = c.ranks("b")
    c.exit(b_rank, 137)
    assert c.events(ev.HOST_BLACKLISTED) == []
    c.driver.commit()
    (reset,) = c.events(ev.RESET)
    assert reset["reasons"] == ["failure"]
    (black,) = c.events(ev.HOST_BLACKLISTED)
    assert (black["host"], black["permanent"], black["failed_ranks"]) == ("b", True, ["r1"])
    c.clock.advance(10_000.0)
    c.poll("a:1", "b:1")
    assert c.events(ev.HOST_UNBLACKLISTED) == []  # for the rest of the job
    assert c.ranks("b") == [b_rank]


def test_cooldown_lets_the_host_back_when_it_ends_and_doubles_the_next_time() -> None:
    c = core(cooldown_range=(10, 1000))
    up(c, "a:1", "b:1")
    c.exit(c.ranks("b")[0], 1)
    c.driver.commit()
    (black,) = c.events(ev.HOST_BLACKLISTED)
    first = black["cooldown_seconds"]
    assert 20 <= first <= 30  # MIN * 2^1 + jitter up to MIN

    c.clock.advance(first - 0.01)
    c.poll("a:1", "b:1")
    assert c.events(ev.HOST_UNBLACKLISTED) == []
    c.clock.advance(0.02)
    c.poll("a:1", "b:1")
    assert [e["host"] for e in c.events(ev.HOST_UNBLACKLISTED)] == ["b"]
    c.driver.commit()  # Horovod counts it back as an added host: a reset starts its rank
    assert c.events(ev.RESET)[-1]["reasons"] == ["hosts_updated"]
    second_rank = c.ranks("b")[-1]
    assert second_rank.rank_id != c.ranks("b")[0].rank_id

    c.driver.joined(second_rank)
    c.exit(second_rank, 1)
    c.driver.commit()
    second = c.events(ev.HOST_BLACKLISTED)[-1]["cooldown_seconds"]
    assert 40 <= second <= 50  # MIN * 2^2 + jitter


# -- rules 5, 6 and 8 ---------------------------------------------------------------


def test_rule5_every_rank_failed_ends_the_job_before_any_blacklist() -> None:
    c = core()
    up(c, "a:1", "b:1")
    for rank in c.ranks():
        c.exit(rank, 137)
    c.driver.commit()
    (failed,) = c.events(ev.JOB_FAILED)
    assert failed["line"] == "failure count == 2 -> stop running"
    assert c.events(ev.HOST_BLACKLISTED) == []
    assert c.driver.finish(stop_file_present=False) == (1, "all_failed")


@pytest.mark.parametrize(("still_training", "code"), [(True, 1), (False, 0)])
def test_rule6_a_success_ends_the_job_at_the_next_commit(still_training: bool, code: int) -> None:
    c = core()
    up(c, "a:1", "b:1")
    a_rank, b_rank = c.ranks()
    c.exit(a_rank, 0)
    if not still_training:
        c.exit(b_rank, 0)
    assert c.driver.finish(stop_file_present=False) is None  # not before the commit
    c.driver.commit()
    assert c.driver.finish(stop_file_present=False) == (code, "success")


def test_rule6_the_stop_file_and_run_seconds_end_the_job_with_0() -> None:
    c = core(run_seconds=30.0)
    up(c, "a:1", "b:1")
    c.clock.advance(29.0)
    assert c.driver.finish(stop_file_present=False) is None
    c.clock.advance(1.0)
    assert c.driver.finish(stop_file_present=False) == (0, "run_seconds")
    assert core().driver.finish(stop_file_present=True) == (0, "stop_file")


def test_rule8_an_exit_is_judged_by_host_and_slot_at_exit_time() -> None:
    rank = Rank(host="b", local_rank=0, rank_id="r")
    assert judge_exit(rank, True, False, 1) == (Verdict.FAILURE, False)  # assigned
    assert judge_exit(rank, True, False, 0) == (Verdict.SUCCESS, False)
    rank.stopping = "host_removed"
    assert judge_exit(rank, False, False, 134) == (Verdict.IGNORED, False)
    assert judge_exit(rank, True, False, 143) == (Verdict.FAILURE, True)  # its slot reused
    assert judge_exit(rank, True, True, 143) == (Verdict.IGNORED, False)  # the job is ending
    rank.stopping = "shutdown"
    assert judge_exit(rank, True, False, 143) == (Verdict.IGNORED, False)


def test_rule8_a_removed_rank_exiting_after_its_name_is_reassigned_is_a_failure() -> None:
    c = core()
    up(c, "a:1", "b:1")
    (old_b,) = c.ranks("b")
    c.poll("a:1")
    c.driver.commit()
    assert old_b.stopping == "host_removed"
    # Signals only as a safety net, after the rank's own next commit.
    assert SignalRank(old_b, c.config.stop_grace + c.config.commit_interval) in c.effects
    c.poll("a:1", "b:1")
    c.driver.commit()
    assert len(c.ranks("b")) == 2  # the name gets a slot at once
    c.exit(old_b, 143)
    (failed,) = c.events(ev.RANK_FAILED)
    assert (failed["rank_id"], failed["reused_slot"]) == (old_b.rank_id, True)


# -- the start (rule 7) -------------------------------------------------------------


def test_rule7_the_probe_runs_once_with_the_time_left_to_the_start_deadline() -> None:
    c = core(network_interface=None, start_timeout=30.0)
    c.clock.advance(12.0)
    assert not c.poll("a:1", "b:1")
    (probe,) = [e for e in c.effects if isinstance(e, Probe)]
    assert probe == Probe(("a", "b"), 18.0)
    assert c.ranks() == []
    assert not c.poll("a:1", "b:1")
    assert len([e for e in c.effects if isinstance(e, Probe)]) == 1
    c.driver.probe_finished(["a", "b"], ["b"])
    assert c.events(ev.START_FAILED)[0]["failed"] == ["b"]
    assert c.ranks() == []
    assert c.driver.finish(stop_file_present=False) == (1, "start_failed")


# -- the core does no I/O -------------------------------------------------------------


@pytest.mark.parametrize("module", CORE_MODULES)
def test_the_core_touches_no_process_file_loop_or_clock(module: str) -> None:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    forbidden = {"asyncio", "subprocess", "os", "signal", "time", "pathlib", "shutil", "io"}
    assert not {name.split(".")[0] for name in imported} & forbidden
    assert "e2e.mockhorovod.driver" not in imported
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "open" not in calls
