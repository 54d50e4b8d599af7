"""The rules Horovod's driver enforces on every change of ``discover_hosts.sh``, in one place.

The rest of the planner decides which workers the job wants listed; this module decides
which of those changes may reach Horovod now, and what must stay listed meanwhile. Each
rule is a way the real driver (0.28.1, reference section 4a) ends or stalls the job:

1. **One change at a time.** The driver sends one notice per discovery change, to rank 0
   only, and drops the notices that arrive while the ranks re-initialise, and a reset
   lasts until every new rank has started (10-60 s on a GPU node). So after a rewrite
   that added hosts, nothing changes until the reset each added host's ranks joined is
   known to have ended: their remote shells reported the training's commit marker
   (``ranks.py``), or the reset bound has passed since the latest of them started (the
   Gloo timeout, past which every rank of an unfinished reset aborts and the job has
   failed anyway, plus ``RESET_MARGIN_SECONDS``); an added host whose ranks never start
   holds the list the bound from when it was listed. The driver's first reset counts
   from its start-up probe until its first ranks are reported. After a rewrite that removed hosts,
   nothing changes until their ranks have left, and a removed host a scale-out takes
   back is not listed again before then (the driver judges an exit by host at exit
   time). Only hosts that can no longer be listed and run no rank (gone, failed,
   terminating without ranks) leave meanwhile; one whose ranks run, or may have started
   unreported (an eviction or preemption during the reset), stays until the reset ends,
   then leaves: the driver drops a notice sent during a reset, and its ranks would die
   assigned at the end of the grace period.
2. **A rank-holder stays.** The driver refuses a reset whose host set holds no host of
   the ranks' current assignment ("No hosts from previous set remaining") and ends the
   job. So while a listed worker holds ranks and no host of the new list does, one of the
   rank-holders stays listed: a worker that stays anyway first, else the lowest index;
   one being deleted (an eviction's grace period) only if no other holds ranks, until its
   ranks leave or its grace period ends.
3. **Never below the minimum.** Below ``--min-np`` listed slots every rank, the removed
   ones too, blocks in the reset, so a graceful removal that would take the list below
   min-replicas waits (the hosts stay listed) until replacements are listed. So does a
   rank-holder being deleted (a drain that evicts every worker at once), when the
   workers that may stay are too few.
4. **Listing is a promise.** A host added to the list must start a rank within the Gloo
   timeout or the whole job ends; a worker about to be evicted or preempted
   (``DisruptionTarget``) is not added.

Who holds ranks comes from the rank signal (``ranks.py``): a worker the launcher's remote
shells reach. When the signal cannot be read, a listed worker whose main container has
run for the reset bound is taken as holding ranks (a guess: nothing better is known).
docs/membership.md says what each piece of evidence costs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.hosts.drain import DRAIN_FLOOR_SECONDS
from mpijob_elastic.core.hosts.membership import Membership
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.inputs.ranks import RankSnapshot, signal
from mpijob_elastic.core.spec.model import DEFAULT_GLOO_TIMEOUT_SECONDS, JobSpec
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.core.workers import Worker, discovered_hosts

# After the Gloo timeout, what a reset's end may still take before a new notice is safe:
# the driver's discovery poll (every second) and the ranks' next commit (trainings commit
# about every second).
RESET_MARGIN_SECONDS = 5.0
_FLOOR = timedelta(seconds=DRAIN_FLOOR_SECONDS)


@dataclass(frozen=True)
class Host:
    """A worker as the rules see it."""

    index: int
    # When its main container started running; None: it does not run, no rank can.
    running_since: datetime | None
    terminating: bool = False
    # It may be listed now (kept or leaving, can take ranks, granted, not retired).
    listable: bool = True
    # An eviction, preemption or taint-based deletion is about to take it.
    disrupted: bool = False


@dataclass(frozen=True)
class HostList:
    # The hosts to write, in index order.
    hosts: tuple[str, ...]
    # Hosts listed only because of these rules: the planner wants them gone, and they
    # wait (no drain starts for them).
    held: frozenset[str]
    # Workers that hold ranks now, as far as the controller can tell.
    holders: frozenset[str]
    # Why the list waits ("" if it does not); the rank signal is then wanted every second.
    waiting: str = ""
    # When to look again, in seconds from now.
    recheck: float | None = None
    # Holders whose reset is known to have ended (``joined``). Only these count for the
    # disruption budget (render.py).
    committed: frozenset[str] = frozenset()
    # Hosts the list waits for on a reported shell that started before their pod ran: a
    # former pod's of the same name, which has ended unless its exit report is on its way
    # or lost. A read of the launcher settles it (ranks.corrected).
    doubted: frozenset[str] = frozenset()


def reset_bound(gloo_timeout_seconds: float) -> timedelta:
    """The longest a reset may last after its last new rank started: the Gloo timeout,
    past which the ranks waiting for a missing one abort (the job has failed then), plus
    the margin of the driver's poll and the next commit."""
    return timedelta(seconds=gloo_timeout_seconds + RESET_MARGIN_SECONDS)


@dataclass(frozen=True)
class Evidence:
    """What tells the rules who holds ranks and whether a reset has ended."""

    # The rank signal (ranks.py); None when it cannot be read.
    snapshot: RankSnapshot | None
    # ``reset_bound`` of the job's Gloo timeout.
    bound: timedelta = field(default=reset_bound(DEFAULT_GLOO_TIMEOUT_SECONDS))
    # When a host-list change last added hosts (``names.ANN_HOSTS_ADDED``).
    added_at: datetime | None = None


def added_at(config_map: Mapping[str, Any] | None) -> datetime | None:
    """``names.ANN_HOSTS_ADDED`` of the job's ConfigMap; None where unset or unreadable."""
    meta = (config_map or {}).get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    return parse_time(notes.get(names.ANN_HOSTS_ADDED)) if isinstance(notes, Mapping) else None


def joined(
    name: str, snapshot: RankSnapshot | None, bound: timedelta, now: datetime
) -> datetime | None:
    """None once the reset that ``name``'s running ranks joined is known to have ended
    (their commit marker, or the bound past their latest start, or a start nothing tells,
    taken as long ago); else when the bound will have passed.

    A marker ends the reset for every rank that was running when it ended, so a host
    counts once a committed host's latest shell started in the same second as its own
    or later: their markers' reports arrive apart (one remote shell each), and until
    the last one the budget would not cover the others (seen as rank-holder labels
    flipping). Resets follow one another, each ending only once its new ranks have
    started, which real ranks take seconds to do."""
    if snapshot is None or name in snapshot.committed:
        return None
    start = snapshot.latest.get(name) or snapshot.since.get(name)
    if start is None or start + bound <= now:
        return None
    if any(start <= t for c in snapshot.committed if (t := snapshot.latest.get(c)) is not None):
        return None
    return start + bound


def rank_holders(
    snapshot: RankSnapshot | None,
    hosts: Mapping[str, Host],
    listed: Collection[str],
    now: datetime,
    bound: timedelta,
) -> frozenset[str]:
    """The workers that hold ranks: reached by the launcher's remote shells and running;
    when the signal cannot be read, the listed ones that have run for the reset bound."""
    alive = {n: h for n, h in hosts.items() if h.running_since is not None}
    if snapshot is not None and snapshot.hosts is not None:
        return frozenset(n for n in snapshot.hosts if n in alive)
    return frozenset(
        n
        for n in listed
        if (h := alive.get(n)) is not None
        and h.running_since is not None
        and h.running_since + bound <= now
    )


def committed_holders(
    snapshot: RankSnapshot | None, holders: frozenset[str], now: datetime, bound: timedelta
) -> tuple[frozenset[str], float | None]:
    """The holders the disruption budget may count, and when the next one may be counted
    (seconds from now). Beside holders whose reset has ended, a new host's ranks count once
    the reset they joined has ended too: an eviction the budget allowed on the strength of
    ranks still re-initialising would unlist the last old rank-holder during that reset, a
    notice the driver drops, and its ranks would be killed at the end of its grace period
    (a failure, a blacklist: seen in e2e under load). When none has committed yet (the
    job's first ranks), all count: there is no older state to keep."""
    ends = {n: joined(n, snapshot, bound, now) for n in holders}
    counted = frozenset(n for n, end in ends.items() if end is None)
    if not counted:
        return holders, None
    later = [(end - now).total_seconds() for end in ends.values() if end is not None]
    return counted, min(later, default=None)


def _pending(
    evidence: Evidence,
    hosts: Mapping[str, Host],
    listed: Collection[str],
    draining: Mapping[str, datetime | None],
    now: datetime,
) -> tuple[list[str], float | None]:
    """Listed hosts whose ranks may still be in a reset, and unlisted ones whose ranks
    have not yet left: the driver is in a reset, a change now would be lost."""
    snapshot, bound = evidence.snapshot, evidence.bound
    seen = snapshot.hosts if snapshot is not None else None
    waiting: list[str] = []
    recheck: float | None = None
    if seen is None or not seen & set(listed):
        # Without the signal nothing tells a reset under way; rule 2 still waits, on time.
        # A launcher that reaches none of the listed hosts runs no ranks on them (not yet,
        # or no more): there is no reset to wait for, unless its driver is starting them.
        return _first_reset(snapshot, hosts, listed, bound, now)
    assert snapshot is not None
    for name in sorted(listed):
        h = hosts.get(name)
        if h is None or h.running_since is None:
            continue
        # When the driver may have started its ranks: at the reset its listing brought (at
        # its start, if that came later).
        listed_at = max(h.running_since, evidence.added_at or h.running_since)
        if name in seen:
            # A terminating host too: its ranks are in the reset until it ends.
            end = joined(name, snapshot, bound, now)
        elif _ended_since(snapshot, name, listed_at):
            continue  # its remote shells have all ended: no rank of it to wait for
        else:
            # Not started yet, or its report is on its way.
            end = listed_at + bound
        if end is not None and end > now:
            waiting.append(name)
            left = (end - now).total_seconds()
            recheck = left if recheck is None else min(recheck, left)
    for name, mark in sorted(draining.items()):
        # Unlisted at ``mark``: a read from before then says nothing; the drain's floor
        # (drain.py) is when a read that counts is due.
        if mark is None or name not in hosts:
            continue
        if name in seen if snapshot.at >= mark else now < mark + _FLOOR:
            waiting.append(name)
    return waiting, recheck


def _first_reset(
    snapshot: RankSnapshot | None,
    hosts: Mapping[str, Host],
    listed: Collection[str],
    bound: timedelta,
    now: datetime,
) -> tuple[list[str], float | None]:
    """The listed hosts while the driver's first ranks may be starting unreported: its
    start-up probe was reported and no rank's shell since. The driver started them on
    the hosts its first discovery found, and a change made before they join is lost as in
    any reset (seen on kind: a growth written 2 s after the driver started; the grown
    workers stayed idle). Up to the bound from the probe: by then the ranks have joined
    or the job has failed."""
    probed = snapshot.probed if snapshot is not None else None
    if snapshot is None or probed is None or probed + bound <= now:
        return [], None
    slack = probed - timedelta(seconds=1)  # reports name whole seconds
    if any(start >= slack for start in snapshot.started.values()):
        return [], None  # its ranks are reported: the rules above judge them
    running = [n for n in sorted(listed) if (h := hosts.get(n)) and h.running_since is not None]
    return running, ((probed + bound - now).total_seconds() if running else None)


def _ended_since(snapshot: RankSnapshot, name: str, listed_at: datetime) -> bool:
    """Whether remote shells into ``name`` started since it was listed and all ended.
    Reports name start seconds, hence the second's slack."""
    start = snapshot.started.get(name)
    return start is not None and start >= listed_at - timedelta(seconds=1)


def next_hosts(
    wanted: Sequence[str],
    listed: Collection[str],
    hosts: Mapping[str, Host],
    evidence: Evidence,
    now: datetime,
    *,
    draining: Mapping[str, datetime | None] | None = None,
    minimum: int = 0,
    fixed_holder: bool = False,
) -> HostList:
    """The host list to write now.

    ``wanted``: what the planner wants listed. ``listed``: what ``discover_hosts.sh``
    names now. ``hosts``: every worker of the job by name. ``draining``: leaving workers
    no longer listed, with their drain marks. ``minimum``: min-replicas (0: none).
    ``fixed_holder``: a host outside the workers (the launcher) holds ranks and stays
    listed, which satisfies rule 2 by itself.
    """
    snapshot, bound = evidence.snapshot, evidence.bound
    holders = rank_holders(snapshot, hosts, listed, now, bound)
    waiting, recheck = _pending(evidence, hosts, listed, draining or {}, now)
    why = ""
    chosen = [
        n for n in wanted if n in listed or not ((h := hosts.get(n)) is not None and h.disrupted)
    ]
    doubted: frozenset[str] = frozenset()
    if waiting and set(chosen) != set(listed):
        why = f"waiting for the ranks of {', '.join(waiting)} (one host-list change at a time)"
        doubted = _doubted(snapshot, hosts, waiting)
        # A host whose ranks run stays too, until the reset ends, even one that may no
        # longer be listed (preempted, terminating): unlisted now, the driver would drop
        # the notice and its ranks would die assigned at the end of its grace period;
        # unlisted after the reset, they leave at their next commit.
        # So does a host listed so lately that its remote shells' reports may still be on
        # their way (it is pending itself).
        keep = holders | set(waiting)
        chosen = [
            n for n in listed if (h := hosts.get(n)) is not None and (h.listable or n in keep)
        ]
    else:
        waiting, recheck = [], None
    current = [n for n in listed if n in hosts]
    if holders and not fixed_holder and not holders & set(chosen):
        stay = min(
            (n for n in holders if n in listed),
            key=lambda n: (not hosts[n].listable, hosts[n].index),
            default=None,
        )
        if stay is not None:
            chosen.append(stay)
            why = why or f"keeping {stay} listed until a new host holds ranks"
    if minimum and len(current) >= minimum:
        # A rank-holder being deleted helps too, after the others: its ranks run to the
        # end of its grace period listed or not (below the minimum, unlisted ones wait in
        # the reset), and listed they keep the rest training meanwhile.
        spare = sorted(
            (n for n in current if n not in chosen and (hosts[n].listable or n in holders)),
            key=lambda n: (not hosts[n].listable, hosts[n].index),
        )
        missing = minimum - sum(1 for n in chosen if n in hosts)
        chosen += spare[: max(missing, 0)]
    ordered = tuple(sorted(set(chosen), key=lambda n: (hosts[n].index if n in hosts else -1, n)))
    committed, counted_in = committed_holders(snapshot, holders, now, bound)
    if counted_in is not None:
        recheck = counted_in if recheck is None else min(recheck, counted_in)
    return HostList(
        ordered, frozenset(ordered) - set(wanted), holders, why, recheck, committed, doubted
    )


def _doubted(
    snapshot: RankSnapshot | None, hosts: Mapping[str, Host], waiting: Collection[str]
) -> frozenset[str]:
    """The waiting hosts whose latest reported running shell started before their pod ran."""
    latest = snapshot.latest if snapshot is not None else {}
    return frozenset(
        n
        for n in waiting
        if (start := latest.get(n)) is not None
        and (h := hosts.get(n)) is not None
        and h.running_since is not None
        and start < h.running_since
    )


def driver_reads(launcher: Mapping[str, Any] | None) -> bool:
    """Whether a driver reads the list: a running launcher, not being deleted. Before it
    runs a change costs no reset, and nothing reads the list."""
    return (
        launcher is not None
        and not launcher["metadata"].get("deletionTimestamp")
        and (launcher.get("status") or {}).get("phase") == "Running"
    )


def for_job(
    spec: JobSpec,
    workers: Sequence[Worker],
    m: Membership,
    wanted: Sequence[str],
    launcher: Mapping[str, Any] | None,
    launcher_listed: bool,
    observed: Observed,
    now: datetime,
) -> HostList:
    """The rules applied to one job's turn (desired.py's one call): ``wanted`` is the
    worker host list the planner would write; ``discover_hosts.sh`` as observed says what
    is listed now. Only a running launcher's driver is bound by them; before it runs,
    nothing reads the list."""
    if not driver_reads(launcher):
        return HostList(tuple(wanted), frozenset(), frozenset())
    listed = discovered_hosts((observed.config_map or {}).get("data"))
    main = spec.main_container
    may_list = {w.name for w in (*m.keep, *(i.worker for i in m.leaving)) if w.can_take_ranks(main)}
    # A main container whose start time cannot be read is taken as running for long.
    long_ago = now - timedelta(days=1)
    hosts = {
        w.name: Host(
            w.index,
            (w.running_since(main) or long_ago) if w.main_running(main) else None,
            w.terminating,
            w.name in may_list,
            w.disrupted,
        )
        for w in workers
        if w.uid not in observed.deleting
    }
    # The launcher, when it is a host, holds ranks of the current assignment and stays.
    own = names.launcher_name(spec.name)
    snapshot = signal(observed.ranks, observed.ranks_read)
    seen = snapshot.hosts if snapshot is not None else None
    evidence = Evidence(
        snapshot, reset_bound(spec.gloo_timeout_seconds), added_at(observed.config_map)
    )
    return next_hosts(
        wanted,
        [n for n in listed if n != own],
        hosts,
        evidence,
        now,
        draining={
            i.worker.name: i.worker.draining_since for i in m.leaving if i.worker.name not in listed
        }
        # A drained worker a scale-out takes back (unmarked at once or not): its name is
        # not listed again while its old rank runs (rule 8; seen on kind). Any read counts.
        | {w.name: w.draining_since or long_ago for w in m.keep if w.name not in listed},
        minimum=spec.bounds.min or 0,
        fixed_holder=launcher_listed and own in listed and (seen is None or own in seen),
    )
