"""Goodput (core/outputs/goodput.py): the seconds a job spends in each state, kept in its
status at each change and nowhere else, and the time from a loss back to its target."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from mpijob_elastic.core.actions import WriteStatus
from mpijob_elastic.core.outputs import goodput
from mpijob_elastic.core.outputs.goodput import FULL, REDUCED, RESETTING, STOPPED, WAITING
from tests.unit.simulation import Cluster, make_job

T0 = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_state_of_a_job_that_runs() -> None:
    assert goodput.training(holders=0, committed=0, target=4) == WAITING
    assert goodput.training(holders=4, committed=2, target=4) == RESETTING
    assert goodput.training(holders=3, committed=3, target=4) == REDUCED
    assert goodput.training(holders=4, committed=4, target=4) == FULL
    # Grown beyond the target (opportunistic workers) is full too.
    assert goodput.training(holders=6, committed=6, target=4) == FULL


def test_seconds_are_counted_at_each_change_and_nothing_is_written_between() -> None:
    first = goodput.account(None, WAITING, 4, at(0))
    assert first == {
        "state": WAITING,
        "since": "2026-12-06T06:00:00.000000Z",
        "target": 4,
        "seconds": {},
    }
    assert goodput.account(first, WAITING, 4, at(30)) is first
    full = goodput.account(first, FULL, 4, at(12.5))
    assert full["seconds"] == {WAITING: 12.5}
    assert goodput.totals(full, at(20)) == {WAITING: 12.5, FULL: 7.5}
    # A change of target alone is written: it decides what a loss is.
    bigger = goodput.account(full, FULL, 6, at(40))
    assert (bigger["target"], bigger["seconds"]) == (6, {WAITING: 12.5, FULL: 27.5})


def test_a_loss_is_timed_until_the_job_trains_at_its_target_again() -> None:
    full = goodput.account(None, FULL, 4, at(0))
    lost = goodput.account(full, REDUCED, 4, at(100))
    assert lost["lostAt"] == "2026-12-06T06:01:40.000000Z"
    resetting = goodput.account(lost, RESETTING, 4, at(130))
    assert resetting["lostAt"] == lost["lostAt"]
    back = goodput.account(resetting, FULL, 4, at(145))
    assert "lostAt" not in back
    assert goodput.recovered(resetting, back) == 45.0
    assert back["seconds"] == {FULL: 100.0, REDUCED: 30.0, RESETTING: 15.0}
    # A scale-out is no loss: the target rose.
    grown = goodput.account(back, RESETTING, 6, at(200))
    assert "lostAt" not in grown
    assert goodput.recovered(grown, goodput.account(grown, FULL, 6, at(230))) is None
    # A stop forgets the loss: what follows is a new start, not a recovery.
    stopped = goodput.account(lost, STOPPED, 4, at(120))
    assert "lostAt" not in stopped


def test_what_others_wrote_into_the_status_reads_as_nothing() -> None:
    hostile: list[Any] = [
        "x", 7, [], {"state": 5, "since": "never", "seconds": "lots", "target": "9" * 5000},
        {"state": FULL, "since": "9999-12-31T23:59:59Z", "seconds": {FULL: 1e400}},
        {"state": FULL, "since": "2026-12-06T06:00:00Z", "seconds": {FULL: True, WAITING: -5}},
    ]  # fmt: skip
    for previous in hostile:
        found = goodput.account(previous, REDUCED, 4, at(10))
        assert found["state"] == REDUCED
        assert all(0 <= v < 1e10 for v in found["seconds"].values()), (previous, found)
        assert all(0 <= v < 1e10 for v in goodput.totals(previous, at(10)).values())
        assert goodput.recovered(previous, found) is None


def statuses(c: Cluster) -> list[dict[str, Any]]:
    return [a.status for a in c.plan().of_type(WriteStatus)]


def test_a_job_reports_its_state_as_it_converges_and_is_suspended() -> None:
    c = Cluster(make_job(2))
    c.converge()
    c.run_pods()
    c.converge()
    # No rank signal here: the listed workers are taken as holding ranks (host_rules.py).
    found = c.job["status"]["goodput"]
    assert (found["state"], found["target"]) == (FULL, 2)
    # Nothing more to say while nothing changes: no status write.
    c.tick(5)
    assert statuses(c) == []
    c.job["spec"]["runPolicy"] = {"suspend": True}
    c.converge()
    found = c.job["status"]["goodput"]
    assert found["state"] == STOPPED
    assert found["seconds"][FULL] >= 5
