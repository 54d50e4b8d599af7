"""The host-list rules of Horovod's driver (issue 20 §1, 1b), as the pure function sees them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mpijob_elastic.core.host_rules import (
    COMMIT_SECONDS,
    SETTLE_SECONDS,
    Host,
    committed_holders,
    next_hosts,
    rank_holders,
)
from mpijob_elastic.core.ranks import RankSnapshot

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)


def w(i: int) -> str:
    return f"job-worker-{i}"


def host(i: int, since: datetime | None = LONG_AGO, **kw: bool) -> Host:
    return Host(i, since, **kw)


def seen(*indexes: int, at: datetime = NOW, since: datetime = LONG_AGO) -> RankSnapshot:
    names = frozenset(w(i) for i in indexes)
    return RankSnapshot(at, names, since=dict.fromkeys(names, since))


def test_a_new_list_without_any_rank_holder_keeps_one() -> None:
    hosts = {w(i): host(i) for i in range(6)}
    old, new = [w(0), w(1), w(2)], [w(3), w(4), w(5)]
    got = next_hosts(new, old, hosts, seen(0, 1, 2), NOW)
    assert got.hosts == (w(0), *new)
    assert got.held == {w(0)}
    assert got.holders == {w(0), w(1), w(2)}
    assert "keeping job-worker-0 listed" in got.waiting
    # Once a new host holds ranks (and has committed), the old ones may all go.
    assert next_hosts(new, [w(0), *new], hosts, seen(0, 3), NOW).hosts == tuple(new)


def test_a_holder_that_stays_anyway_is_kept_before_a_terminating_one() -> None:
    hosts = {w(0): host(0, terminating=True, listable=False), w(1): host(1), w(2): host(2)}
    got = next_hosts([w(2)], [w(0), w(1)], hosts, seen(0, 1), NOW)
    assert got.hosts == (w(1), w(2))


def test_the_last_rank_holder_stays_listed_while_it_is_being_evicted() -> None:
    hosts = {w(0): host(0, terminating=True, listable=False), w(1): host(1)}
    got = next_hosts([w(1)], [w(0)], hosts, seen(0), NOW)
    assert got.hosts == (w(0), w(1))
    # Its ranks left (or its grace period ended and it is gone): it goes.
    assert next_hosts([w(1)], [w(0), w(1)], hosts, seen(1), NOW).hosts == (w(1),)
    del hosts[w(0)]
    assert next_hosts([w(1)], [w(0), w(1)], hosts, seen(0), NOW).hosts == (w(1),)


def test_nothing_changes_until_added_hosts_have_run_and_committed() -> None:
    hosts = {w(i): host(i) for i in range(4)}
    hosts[w(3)] = host(3, NOW - timedelta(seconds=2))
    listed = [w(0), w(1), w(2), w(3)]
    # worker-3 is listed, its rank not seen yet: the scale-in waits.
    got = next_hosts([w(0), w(3)], listed, hosts, seen(0, 1, 2), NOW)
    assert got.hosts == tuple(listed)
    assert got.held == {w(1), w(2)}
    assert got.recheck == SETTLE_SECONDS - 2
    # Seen, but only just: still waiting for a commit.
    just = RankSnapshot(NOW, frozenset(listed), since={w(3): NOW - timedelta(seconds=1)})
    got = next_hosts([w(0), w(3)], listed, hosts, just, NOW)
    assert got.hosts == tuple(listed)
    assert got.recheck == COMMIT_SECONDS - 1
    later = NOW + timedelta(seconds=COMMIT_SECONDS)
    assert next_hosts([w(0), w(3)], listed, hosts, just, later).hosts == (w(0), w(3))
    # A rank that never comes does not hold the job for ever.
    late = NOW + timedelta(seconds=SETTLE_SECONDS)
    assert next_hosts([w(0), w(3)], listed, hosts, seen(0, 1, 2, at=late), late).hosts == (
        w(0),
        w(3),
    )


def test_nothing_changes_until_removed_hosts_ranks_have_left() -> None:
    hosts = {w(i): host(i) for i in range(3)}
    mark = NOW - timedelta(seconds=5)
    draining = {w(2): mark}
    got = next_hosts([w(0), w(1)], [w(0)], hosts, seen(0, 1, 2), NOW, draining=draining)
    assert got.hosts == (w(0),)
    assert "job-worker-2" in got.waiting
    got = next_hosts([w(0), w(1)], [w(0)], hosts, seen(0, 1), NOW, draining=draining)
    assert got.hosts == (w(0), w(1))
    # A read from before the host was unlisted says nothing of its ranks.
    old_read = seen(0, 1, 2, at=mark - timedelta(seconds=1))
    got = next_hosts([w(0), w(1)], [w(0)], hosts, old_read, NOW, draining=draining)
    assert got.hosts == (w(0), w(1))


def test_a_graceful_removal_never_takes_the_list_below_the_minimum() -> None:
    hosts = {w(i): host(i) for i in range(4)}
    hosts[w(2)] = host(2, None)  # a replacement not running yet
    got = next_hosts([w(3)], [w(0), w(1), w(3)], hosts, seen(0, 1, 3), NOW, minimum=3)
    assert got.hosts == (w(0), w(1), w(3))
    # A worker that cannot stay is no help: the list goes below, as far as it must.
    hosts[w(1)] = host(1, None, listable=False)
    got = next_hosts([w(3)], [w(0), w(1), w(3)], hosts, seen(0, 3), NOW, minimum=3)
    assert got.hosts == (w(0), w(3))


def test_a_worker_about_to_be_evicted_is_not_added() -> None:
    hosts = {w(0): host(0), w(1): host(1, disrupted=True)}
    assert next_hosts([w(0), w(1)], [w(0)], hosts, seen(0), NOW).hosts == (w(0),)
    # Already listed, it is not dropped for that alone.
    assert next_hosts([w(0), w(1)], [w(0), w(1)], hosts, seen(0, 1), NOW).hosts == (
        w(0),
        w(1),
    )


def test_without_the_signal_a_listed_worker_holds_ranks_once_it_has_run_a_while() -> None:
    hosts = {w(0): host(0), w(1): host(1, NOW - timedelta(seconds=3))}
    assert rank_holders(None, hosts, [w(0), w(1)], NOW) == {w(0)}
    got = next_hosts([w(1)], [w(0), w(1)], hosts, None, NOW)
    assert got.hosts == (w(0), w(1))
    late = NOW + timedelta(seconds=SETTLE_SECONDS)
    assert next_hosts([w(1)], [w(0), w(1)], hosts, None, late).hosts == (w(1),)


def test_a_launcher_that_holds_ranks_is_enough() -> None:
    hosts = {w(0): host(0), w(1): host(1)}
    got = next_hosts([w(1)], [w(0)], hosts, seen(0), NOW, fixed_holder=True)
    assert got.hosts == (w(1),)


def test_the_budget_counts_a_new_holder_once_the_reset_it_joined_has_ended() -> None:
    old = {w(0): LONG_AGO}
    new = {w(3): NOW - timedelta(seconds=1), w(4): NOW - timedelta(seconds=2)}
    snapshot = RankSnapshot(NOW, frozenset([*old, *new]), since={**old, **new})
    counted, later = committed_holders(snapshot, frozenset([*old, *new]), NOW)
    assert counted == {w(0)}
    assert later == COMMIT_SECONDS - 2
    done = NOW + timedelta(seconds=COMMIT_SECONDS)
    assert committed_holders(snapshot, frozenset([*old, *new]), done) == (
        frozenset({w(0), *new}),
        None,
    )
    # The job's first ranks: no older state to keep, all of them count at once.
    assert committed_holders(snapshot, frozenset(new), NOW) == (frozenset(new), None)
