"""The host-list rules of Horovod's driver (issue 20 §1, 1b), as the pure function sees them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from mpijob_elastic.core.hosts.host_rules import (
    Evidence,
    Host,
    HostList,
    committed_holders,
    next_hosts,
    rank_holders,
    reset_bound,
)
from mpijob_elastic.core.inputs.ranks import RankSnapshot, pushed, signal

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=1)
# Horovod's default Gloo timeout (30 s) and the margin.
BOUND = reset_bound(30.0)
SETTLE_SECONDS = BOUND.total_seconds()


def rules(
    wanted: list[str],
    listed: list[str],
    hosts: dict[str, Host],
    snapshot: RankSnapshot | None,
    now: datetime,
    added_at: datetime | None = None,
    **kw: Any,
) -> HostList:
    return next_hosts(wanted, listed, hosts, Evidence(snapshot, BOUND, added_at), now, **kw)


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
    got = rules(new, old, hosts, seen(0, 1, 2), NOW)
    assert got.hosts == (w(0), *new)
    assert got.held == {w(0)}
    assert got.holders == {w(0), w(1), w(2)}
    assert "keeping job-worker-0 listed" in got.waiting
    # Once a new host holds ranks (and has committed), the old ones may all go.
    assert rules(new, [w(0), *new], hosts, seen(0, 3), NOW).hosts == tuple(new)


def test_a_holder_that_stays_anyway_is_kept_before_a_terminating_one() -> None:
    hosts = {w(0): host(0, terminating=True, listable=False), w(1): host(1), w(2): host(2)}
    got = rules([w(2)], [w(0), w(1)], hosts, seen(0, 1), NOW)
    assert got.hosts == (w(1), w(2))


def test_the_last_rank_holder_stays_listed_while_it_is_being_evicted() -> None:
    hosts = {w(0): host(0, terminating=True, listable=False), w(1): host(1)}
    got = rules([w(1)], [w(0)], hosts, seen(0), NOW)
    assert got.hosts == (w(0), w(1))
    # Its ranks left (or its grace period ended and it is gone): it goes.
    assert rules([w(1)], [w(0), w(1)], hosts, seen(1), NOW).hosts == (w(1),)
    del hosts[w(0)]
    assert rules([w(1)], [w(0), w(1)], hosts, seen(0), NOW).hosts == (w(1),)


def test_nothing_changes_until_the_reset_added_hosts_joined_has_ended() -> None:
    hosts = {w(i): host(i) for i in range(4)}
    hosts[w(3)] = host(3, NOW - timedelta(seconds=2))
    listed = [w(0), w(1), w(2), w(3)]
    # worker-3 is listed, its rank not seen yet: the scale-in waits.
    got = rules([w(0), w(3)], listed, hosts, seen(0, 1, 2), NOW)
    assert got.hosts == tuple(listed)
    assert got.held == {w(1), w(2)}
    assert got.recheck == SETTLE_SECONDS - 2
    # Its remote shell started 1 s ago: its rank may take up to the Gloo timeout to join,
    # and the others wait for it in the reset meanwhile. A remote shell that has run for
    # a while is no proof (issue 30: 13 s on a busy node, 60 s on GPU nodes).
    just = RankSnapshot(NOW, frozenset(listed), since={w(3): NOW - timedelta(seconds=1)})
    for later in (0, 5, 20, SETTLE_SECONDS - 2):
        got = rules([w(0), w(3)], listed, hosts, just, NOW + timedelta(seconds=later))
        assert got.hosts == tuple(listed), later
        assert got.recheck == SETTLE_SECONDS - 1 - later
    # Past the bound the reset has ended, or the job failed anyway.
    done = NOW + timedelta(seconds=SETTLE_SECONDS - 1)
    assert rules([w(0), w(3)], listed, hosts, just, done).hosts == (w(0), w(3))
    # The training's commit marker ends the wait at once.
    marked = dataclasses.replace(just, committed=frozenset({w(3)}))
    assert rules([w(0), w(3)], listed, hosts, marked, NOW).hosts == (w(0), w(3))
    # A rank that never comes does not hold the job for ever.
    late = NOW + timedelta(seconds=SETTLE_SECONDS)
    assert rules([w(0), w(3)], listed, hosts, seen(0, 1, 2, at=late), late).hosts == (
        w(0),
        w(3),
    )


def test_the_bound_runs_from_the_latest_remote_shell_of_a_host() -> None:
    hosts = {w(i): host(i) for i in range(3)}
    listed = [w(0), w(1), w(2)]
    # worker-2's first shell started long ago, a second one (a new slot) 3 s ago.
    snap = RankSnapshot(
        NOW,
        frozenset(listed),
        since={w(2): LONG_AGO},
        latest={w(2): NOW - timedelta(seconds=3)},
    )
    got = rules([w(0), w(2)], listed, hosts, snap, NOW)
    assert got.hosts == tuple(listed)
    assert got.recheck == SETTLE_SECONDS - 3


def test_a_host_listed_long_after_it_started_waits_from_its_listing() -> None:
    """A worker held back by the rules runs long before it is listed; once listed, the
    change that removes others waits for its ranks' reset, not for its start + bound."""
    hosts = {w(0): host(0), w(1): host(1), w(2): host(2, LONG_AGO)}
    listed = [w(0), w(1), w(2)]
    added = NOW - timedelta(seconds=1)
    got = rules([w(2)], listed, hosts, seen(0, 1), NOW, added_at=added)
    assert got.hosts == tuple(listed)
    assert got.recheck == SETTLE_SECONDS - 1
    # Without the record, its start long ago would have let the change go at once.
    assert rules([w(2)], listed, hosts, seen(0, 1), NOW).hosts != tuple(listed)


def test_a_longer_gloo_timeout_is_a_longer_bound() -> None:
    hosts = {w(i): host(i) for i in range(3)}
    listed = [w(0), w(1), w(2)]
    snap = RankSnapshot(NOW, frozenset(listed), since={w(2): NOW - timedelta(seconds=40)})
    assert rules([w(0), w(2)], listed, hosts, snap, NOW).hosts == (w(0), w(2))
    long = Evidence(snap, reset_bound(120.0))
    got = next_hosts([w(0), w(2)], listed, hosts, long, NOW)
    assert got.hosts == tuple(listed)
    assert got.recheck == 125 - 40


def test_nothing_changes_until_removed_hosts_ranks_have_left() -> None:
    hosts = {w(i): host(i) for i in range(3)}
    mark = NOW - timedelta(seconds=5)
    draining = {w(2): mark}
    got = rules([w(0), w(1)], [w(0)], hosts, seen(0, 1, 2), NOW, draining=draining)
    assert got.hosts == (w(0),)
    assert "job-worker-2" in got.waiting
    got = rules([w(0), w(1)], [w(0)], hosts, seen(0, 1), NOW, draining=draining)
    assert got.hosts == (w(0), w(1))
    # A read from before the host was unlisted says nothing of its ranks.
    old_read = seen(0, 1, 2, at=mark - timedelta(seconds=1))
    got = rules([w(0), w(1)], [w(0)], hosts, old_read, NOW, draining=draining)
    assert got.hosts == (w(0), w(1))


def test_a_graceful_removal_never_takes_the_list_below_the_minimum() -> None:
    hosts = {w(i): host(i) for i in range(4)}
    hosts[w(2)] = host(2, None)  # a replacement not running yet
    got = rules([w(3)], [w(0), w(1), w(3)], hosts, seen(0, 1, 3), NOW, minimum=3)
    assert got.hosts == (w(0), w(1), w(3))
    # A worker that cannot stay is no help: the list goes below, as far as it must.
    hosts[w(1)] = host(1, None, listable=False)
    got = rules([w(3)], [w(0), w(1), w(3)], hosts, seen(0, 3), NOW, minimum=3)
    assert got.hosts == (w(0), w(3))


def test_rank_holders_being_deleted_keep_the_list_at_the_minimum() -> None:
    # kubectl drain evicted all three at once (seen on kind): rule 2 keeps one, rule 3
    # as many more as the minimum needs, until the replacements are listed.
    hosts = {w(i): host(i, terminating=True, listable=False) for i in range(3)}
    listed = [w(0), w(1), w(2)]
    got = rules([], listed, hosts, seen(0, 1, 2), NOW, minimum=2)
    assert got.hosts == (w(0), w(1))
    # A worker that may stay comes first; one whose ranks have gone is no help.
    hosts[w(3)] = host(3)
    got = rules([w(3)], [*listed, w(3)], hosts, seen(0, 2), NOW, minimum=3)
    assert got.hosts == (w(0), w(2), w(3))


def test_a_worker_about_to_be_evicted_is_not_added() -> None:
    hosts = {w(0): host(0), w(1): host(1, disrupted=True)}
    assert rules([w(0), w(1)], [w(0)], hosts, seen(0), NOW).hosts == (w(0),)
    # Already listed, it is not dropped for that alone.
    assert rules([w(0), w(1)], [w(0), w(1)], hosts, seen(0, 1), NOW).hosts == (
        w(0),
        w(1),
    )


def test_without_the_signal_a_listed_worker_holds_ranks_once_it_has_run_a_while() -> None:
    hosts = {w(0): host(0), w(1): host(1, NOW - timedelta(seconds=3))}
    assert rank_holders(None, hosts, [w(0), w(1)], NOW, BOUND) == {w(0)}
    got = rules([w(1)], [w(0), w(1)], hosts, None, NOW)
    assert got.hosts == (w(0), w(1))
    late = NOW + timedelta(seconds=SETTLE_SECONDS)
    assert rules([w(1)], [w(0), w(1)], hosts, None, late).hosts == (w(1),)


def test_a_launcher_that_holds_ranks_is_enough() -> None:
    hosts = {w(0): host(0), w(1): host(1)}
    got = rules([w(1)], [w(0)], hosts, seen(0), NOW, fixed_holder=True)
    assert got.hosts == (w(1),)


def test_the_budget_counts_a_new_holder_once_the_reset_it_joined_has_ended() -> None:
    old = {w(0): LONG_AGO}
    new = {w(3): NOW - timedelta(seconds=1), w(4): NOW - timedelta(seconds=2)}
    snapshot = RankSnapshot(NOW, frozenset([*old, *new]), since={**old, **new})
    holders = frozenset([*old, *new])
    counted, later = committed_holders(snapshot, holders, NOW, BOUND)
    assert counted == {w(0)}
    assert later == SETTLE_SECONDS - 2
    done = NOW + timedelta(seconds=SETTLE_SECONDS)
    assert committed_holders(snapshot, holders, done, BOUND) == (holders, None)
    # The commit marker counts a host at once.
    marked = dataclasses.replace(snapshot, committed=frozenset({w(3)}))
    assert committed_holders(marked, holders, NOW, BOUND) == (
        frozenset({w(0), w(3)}),
        SETTLE_SECONDS - 2,
    )
    # The job's first ranks: no older state to keep, all of them count at once.
    assert committed_holders(snapshot, frozenset(new), NOW, BOUND) == (frozenset(new), None)


def test_one_marker_ends_the_reset_for_every_rank_started_with_it_or_before() -> None:
    # w3 and w4 joined one reset (their shells started in the same second); w5 a later
    # one. Their markers' reports come one by one: w3's is in.
    started = NOW - timedelta(seconds=3)
    latest = {w(0): LONG_AGO, w(3): started, w(4): started, w(5): NOW - timedelta(seconds=1)}
    snapshot = RankSnapshot(
        NOW, frozenset(latest), since=latest, latest=latest, committed=frozenset({w(0)})
    )
    holders = frozenset(latest)
    assert committed_holders(snapshot, holders, NOW, BOUND)[0] == {w(0)}
    marked = dataclasses.replace(snapshot, committed=frozenset({w(0), w(3)}))
    assert committed_holders(marked, holders, NOW, BOUND)[0] == {w(0), w(3), w(4)}
    # So rule 1 lets the next change through once the reset of w3 and w4 has ended; w5's
    # still holds it.
    hosts = {n: host(i) for i, n in enumerate(map(w, range(6))) if n in latest}
    listed = [w(0), w(3), w(4)]
    assert rules([w(3), w(4)], listed, hosts, snapshot, NOW).hosts == tuple(listed)
    assert rules([w(3), w(4)], listed, hosts, marked, NOW).hosts == (w(3), w(4))
    listed.append(w(5))
    assert rules([w(3), w(4), w(5)], listed, hosts, marked, NOW).hosts == tuple(listed)


def test_a_host_preempted_during_the_reset_it_joined_leaves_once_the_reset_ends() -> None:
    """A growth step's workers are listed, their ranks start slowly, and the scheduler
    preempts one at once: unlisted during the reset, the notice would be dropped and its
    rank would die assigned at the end of its grace period (issue 30)."""
    # Preempted: first the scheduler's DisruptionTarget (the planner no longer lists it),
    # then its deletion.
    hosts = {w(0): host(0), w(1): host(1), w(2): host(2, listable=False, disrupted=True)}
    listed = [w(0), w(1), w(2)]
    started = NOW - timedelta(seconds=2)
    snap = RankSnapshot(NOW, frozenset(listed), since={w(1): started, w(2): started})
    assert rules([w(0), w(1)], listed, hosts, snap, NOW).hosts == tuple(listed)
    hosts[w(2)] = host(2, terminating=True, listable=False)
    started = NOW - timedelta(seconds=2)
    snap = RankSnapshot(NOW, frozenset(listed), since={w(1): started, w(2): started})
    got = rules([w(0), w(1)], listed, hosts, snap, NOW)
    assert got.hosts == tuple(listed)
    assert w(2) in got.held
    # Both new hosts of the step preempted: their own reset still holds the list.
    hosts[w(1)] = host(1, terminating=True, listable=False)
    assert rules([w(0)], listed, hosts, snap, NOW).hosts == tuple(listed)
    # The reset has ended (the commit marker): they leave, and the driver hears of it.
    done = dataclasses.replace(snap, committed=frozenset({w(1), w(2)}))
    assert rules([w(0)], listed, hosts, done, NOW).hosts == (w(0),)
    # Preempted so soon after its listing that no report of its remote shell came yet: the
    # driver may well have started its rank in this reset, so it stays too.
    unseen = RankSnapshot(NOW, frozenset({w(0), w(1)}), since={w(1): started})
    hosts[w(1)] = host(1)
    got = rules([w(0), w(1)], listed, hosts, unseen, NOW, added_at=started)
    assert got.hosts == tuple(listed)
    # Listed long ago and never reached: no rank of it to wait for; it goes.
    got = rules([w(0), w(1)], listed, hosts, unseen, NOW, added_at=LONG_AGO)
    assert got.hosts == (w(0), w(1))


def test_a_reused_name_waits_for_its_new_pods_ranks() -> None:
    """A scale-out reuses the lowest free index (membership.py): the former pod's remote
    shells into that name all ended, which says nothing of the new pod's ranks. Read as
    "its shells have ended", a scale-in right after the scale-out was written during the
    reset, and the driver lost it (landing CI, e2e drain case)."""
    listed = [w(0), w(1), w(2)]
    added = NOW - timedelta(seconds=2)
    hosts = {w(0): host(0, since=added), w(1): host(1), w(2): host(2, since=added)}
    old_shell = LONG_AGO + timedelta(seconds=10)
    snap = RankSnapshot(
        NOW,
        frozenset({w(1)}),
        since={w(1): LONG_AGO},
        known=frozenset({w(0), w(1)}),
        started={w(0): old_shell, w(1): LONG_AGO},
    )
    got = rules([w(0), w(1)], listed, hosts, snap, NOW, added_at=added)
    assert got.hosts == tuple(listed)
    assert "job-worker-0" in got.waiting
    # Shells into the new pod that started after its listing and all ended: its ranks are
    # gone (a crash), nothing of it to wait for.
    crashed = dataclasses.replace(snap, started={w(0): NOW - timedelta(seconds=1), w(1): LONG_AGO})
    got = rules([w(1), w(2)], listed, hosts, crashed, NOW, added_at=added)
    assert w(0) not in got.waiting


def test_a_change_waits_while_the_driver_s_first_ranks_start_unreported() -> None:
    """Seen on kind: a growth written 2 s after the driver started, while its first ranks
    were starting and not yet reported, was lost; the grown workers stayed idle. The
    driver's start-up probe (reported by ``kubexec.sh``) says its first ranks come next."""
    hosts = {w(i): host(i) for i in range(4)}
    listed = [w(0), w(1)]
    wanted = [w(0), w(1), w(2), w(3)]
    probe_at = NOW - timedelta(seconds=2)
    data = {f"{w(0)}_7_{int(probe_at.timestamp())}": "probe"}
    starting = pushed(data, NOW)
    assert starting.hosts == frozenset()
    assert starting.probed == probe_at
    # The reports are the job's signal from the probe on, though they name no rank yet.
    assert signal(starting, None) is starting
    got = rules(wanted, listed, hosts, starting, NOW)
    assert got.hosts == tuple(listed)
    assert got.recheck == SETTLE_SECONDS - 2
    # Once its ranks are reported, the rules of any reset judge them.
    ranks = {**data, **{f"{w(i)}_{i + 8}_{int(NOW.timestamp())}": "start" for i in (0, 1)}}
    started = pushed(ranks, NOW)
    assert started.hosts == frozenset(listed)
    assert rules(wanted, listed, hosts, started, NOW).hosts == tuple(listed)
    # A driver whose ranks never came holds nothing past the bound.
    late = NOW + BOUND
    assert rules(wanted, listed, hosts, pushed(data, late), late).hosts == tuple(wanted)
    # Without a probe (a driver given --network-interface, or none at all): nothing to
    # wait for.
    assert rules(wanted, listed, hosts, pushed({}, NOW), NOW).hosts == tuple(wanted)


def test_a_name_taken_back_waits_on_a_former_pods_shell_until_a_read_finds_it_gone() -> None:
    # worker-1 was drained and a scale-out took its name back: the new pod runs since 20 s
    # ago, and the reports still show the old pod's shell (started 60 s ago), its exit
    # report lost. The list waits on it and says it doubts the claim.
    started = NOW - timedelta(seconds=60)
    hosts = {w(0): host(0), w(1): host(1, NOW - timedelta(seconds=20))}
    reports = pushed(
        {
            f"{w(0)}_1_{int(started.timestamp())}": "start",
            f"{w(1)}_2_{int(started.timestamp())}": "start",
        },
        NOW,
    )
    draining = {w(1): LONG_AGO}
    got = rules([w(0), w(1)], [w(0)], hosts, signal(reports, None), NOW, draining=draining)
    assert got.hosts == (w(0),)
    assert got.doubted == {w(1)}
    # A read that began after the shell started and no longer finds it settles it.
    read = RankSnapshot(NOW - timedelta(seconds=2), frozenset({w(0)}))
    got = rules([w(0), w(1)], [w(0)], hosts, signal(reports, read), NOW, draining=draining)
    assert got.hosts == (w(0), w(1))
    # A shell the read found still runs: the name waits, and is no longer in doubt only
    # once its pod ran before the shell started (its own rank, not a former pod's).
    read = RankSnapshot(NOW - timedelta(seconds=2), frozenset({w(0), w(1)}))
    got = rules([w(0), w(1)], [w(0)], hosts, signal(reports, read), NOW, draining=draining)
    assert got.hosts == (w(0),)
    hosts[w(1)] = host(1, started - timedelta(seconds=5))
    got = rules([w(0), w(1)], [w(0)], hosts, signal(reports, read), NOW, draining=draining)
    assert got.hosts == (w(0),)
    assert got.doubted == frozenset()
