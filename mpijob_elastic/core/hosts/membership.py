"""Which workers a job keeps, which leave and why, and which names it may never use again.

Horovod's elastic driver blacklists a host by name for the rest of the job when a rank
dies on it while it is assigned, and a blacklisted name never gets a rank again, even on a
brand-new pod. So a worker's name is its membership in Horovod's eyes, and:

* A worker whose ranks may have died while ``discover_hosts.sh`` listed it (the pod is
  gone, terminating, failed, or its main container stopped) is *retired*: its index is
  never used again in this job. The retired indexes are kept in an annotation of the
  job's ConfigMap, written in the same update that drops the name from the host list, so
  a restart cannot forget one.
* A worker that left through our drain (unlisted first, deleted after its ranks left)
  was removed gracefully by Horovod and its name may be reused; but a drain victim whose
  rank ended in failure is not taken back by a scale-out meanwhile (``choose_members``).
* New workers take the lowest index that no pod of the job holds, that is not retired
  and that the user has not named for removal: names stay short and, after graceful
  scale-ins, familiar.

Victims of a scale-in are chosen, in order: the workers the user named, those not in
discovery (not running yet, failed, not ready, or already draining), those whose pod is
about to be disrupted (the ``DisruptionTarget`` condition), then the newest; opportunistic
workers (opportunistic.py) go after the named and before every other baseline worker.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from mpijob_elastic.core import numbers
from mpijob_elastic.core.workers import Worker, worker_index

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# A worker retires when its ranks may have died: far fewer than this in any job's life.
_MOST_RETIRED = 100_000

# Why a worker leaves, as the Scaling condition and the Draining Event say it.
NAMED = "named for removal"
NOT_LISTED = "not in discovery"
DISRUPTED = "being disrupted (DisruptionTarget)"
NEWEST = "newest"


def format_indexes(indexes: Iterable[int]) -> str:
    """``{1, 4, 5, 6}`` as ``"1,4-6"``: a job that lost many workers still fits."""
    parts: list[str] = []
    ordered = sorted(set(indexes))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_indexes(value: object) -> frozenset[int]:
    """The indexes an annotation written by ``format_indexes`` holds; junk parts are skipped.

    The annotation is ours, but a user can edit it; the set is capped so an edited
    "0-999999999", or many ranges, cannot make the controller build a huge one.
    """
    if not isinstance(value, str):
        return frozenset()
    out: set[int] = set()
    for part in value.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            continue
        low = numbers.whole(m.group(1))
        high = numbers.whole(m.group(2)) if m.group(2) else low
        if low is None or high is None or high < low or len(out) + high - low > _MOST_RETIRED:
            continue
        out.update(range(low, high + 1))
    return frozenset(out)


def ranks_may_have_died(worker: Worker | None, main: str | None) -> bool:
    """Whether a worker listed in discovery may have lost its ranks other than gracefully.

    Conservative on purpose: a terminating pod may still let its ranks go gracefully (the
    default worker command waits for them), but if its grace period is short they die
    assigned; a fresh name costs nothing, a blacklisted one costs the worker for good.
    A running main container that is merely not Ready is not retired: its host leaves
    discovery, which Horovod treats as a graceful removal.
    """
    if worker is None or worker.terminating or worker.phase != "Running":
        return True
    return not worker.main_running(main)


@dataclass(frozen=True)
class Leaving:
    worker: Worker
    why: str


@dataclass(frozen=True)
class Membership:
    # Workers the job keeps, in index order.
    keep: tuple[Worker, ...]
    # Surplus workers that leave through the drain, most removable first.
    leaving: tuple[Leaving, ...]
    # Workers that go at once, without a drain, and are replaced: retired ones whose pods
    # still exist (no use to Horovod any more, and no longer listed) and failed ones the
    # restart policy replaces.
    replace: tuple[Worker, ...]
    # Every retired index, the newly retired among them.
    retired: frozenset[int]
    newly_retired: frozenset[int]
    # Indexes to create, lowest first, enough to bring the job to its target.
    new_indexes: tuple[int, ...]


@dataclass(frozen=True)
class Facts:
    """What decides a job's members besides its pods.

    ``listed``: names in the ``discover_hosts.sh`` the launcher last saw (ours, observed).
    ``retired``: indexes already retired. ``named``: worker names the user asked to remove.
    ``taken``: worker names held by objects the job does not control.
    ``lost``: workers whose remote shell from the launcher ended while others went on
    (ranks.py): their ranks died under a live pod.
    ``relocate``: workers to move elsewhere (their node is going away), with why: they
    leave like named ones, and are replaced.
    ``deleting``: UIDs of pods whose delete the server accepted (gone, for our purposes).
    ``failed_kept``: failed workers the restart policy keeps as they are (they hold their
    place, as in v1, until the job ends or they are chosen as victims); every other failed
    worker is replaced.
    """

    listed: Collection[str] = ()
    retired: Collection[int] = ()
    named: Collection[str] = ()
    taken: Collection[str] = ()
    failed_kept: Collection[str] = ()
    deleting: Collection[str] = ()
    lost: Collection[str] = ()
    relocate: Mapping[str, str] = field(default_factory=dict)


def choose_members(
    job_name: str, workers: Sequence[Worker], target: int, main: str | None, facts: Facts
) -> Membership:
    """Decide the job's members: ``target`` workers, ``main`` their main container.

    A worker unlisted by a scale-in whose rank then ended in failure (``facts.lost``) is
    not taken back by a scale-out: it is retired, deleted and replaced under a fresh name.
    Its old rank's end was judged while unlisted (no blacklist), but keeping it lists a
    name that the next turn, reading it among the lost while listed, would retire anyway:
    a host listed and deleted at once, whose rank never starts (seen on kind).
    """
    chosen = _choose(job_name, workers, target, main, facts)
    lost = frozenset(facts.lost)
    taken_back = frozenset(
        w.index for w in chosen.keep if w.name in lost and w.name not in facts.listed
    )
    if not taken_back:
        return chosen
    facts = replace(facts, retired=frozenset(facts.retired) | taken_back)
    again = _choose(job_name, workers, target, main, facts)
    return replace(again, newly_retired=again.newly_retired | taken_back)


def _choose(
    job_name: str, workers: Sequence[Worker], target: int, main: str | None, facts: Facts
) -> Membership:
    listed, retired, named = facts.listed, facts.retired, facts.named
    # Every pod blocks its name; only those not being deleted can stay or leave.
    held = {w.index for w in workers}
    workers = [w for w in workers if not w.uid or w.uid not in facts.deleting]
    by_name = {w.name: w for w in workers}
    newly: set[int] = set()
    for name in listed:
        index = worker_index(job_name, name)
        if index is None or index in retired:
            continue
        if name in facts.lost or ranks_may_have_died(by_name.get(name), main):
            newly.add(index)
    all_retired = frozenset(retired) | newly

    replace = tuple(
        w
        for w in workers
        if not w.terminating
        and w.name not in facts.failed_kept
        and (w.index in all_retired or w.phase == "Failed")
    )
    gone = {w.name for w in replace}
    candidates = [w for w in workers if not w.terminating and w.name not in gone]
    relocate = facts.relocate
    named_set = set(named) | set(relocate)

    cohort = _cohorts(candidates)

    def removal_order(w: Worker) -> tuple[int, int, int, int, int]:
        # Lower sorts first: removed before the others; after the named ones, opportunistic
        # workers (above the job's baseline, opportunistic.py) before the baseline.
        if w.name in named_set:
            group = 0
        elif w.name not in listed:
            group = 1
        elif w.disrupted:
            group = 2
        else:
            group = 3
        runs = 0 if not w.main_running(main) else 1
        baseline = int(group > 0 and not w.opportunistic)
        return (baseline, group, runs, -cohort[w.name], -w.index)

    ordered = sorted(candidates, key=removal_order)
    surplus = max(len(candidates) - target, 0)
    named_count = sum(1 for w in candidates if w.name in named_set)
    remove = ordered[: max(surplus, named_count)]
    leaving = tuple(Leaving(w, relocate.get(w.name) or _why(w, named_set, listed)) for w in remove)
    keep = tuple(sorted(ordered[len(remove) :], key=lambda w: w.index))

    blocked = (
        held
        | all_retired
        | {i for n in (*named, *facts.taken) if (i := worker_index(job_name, n)) is not None}
    )
    new: list[int] = []
    index = 0
    while len(keep) + len(new) < target:
        if index not in blocked:
            new.append(index)
        index += 1
    return Membership(
        keep=keep,
        leaving=leaving,
        replace=replace,
        retired=all_retired,
        newly_retired=frozenset(newly),
        new_indexes=tuple(new),
    )


# Workers created this close together came from one scale-up: the same age.
COHORT_SECONDS = 2.0


def _cohorts(workers: Sequence[Worker]) -> dict[str, int]:
    """Each worker's age rank, newest highest. creationTimestamp has 1 s resolution, so
    the pods of one scale-up can straddle a second; grouping creations that follow each
    other within COHORT_SECONDS keeps them one cohort, ordered among themselves by index
    (the highest leaves first), whatever second each landed in."""
    ranks: dict[str, int] = {}
    cohort, last = 0, None
    for w in sorted(workers, key=lambda w: (w.created, w.index)):
        if last is not None and w.created - last > COHORT_SECONDS:
            cohort += 1
        ranks[w.name] = cohort
        last = w.created
    return ranks


def _why(w: Worker, named: Collection[str], listed: Collection[str]) -> str:
    if w.name in named:
        return NAMED
    if w.name not in listed:
        return NOT_LISTED
    if w.disrupted:
        return DISRUPTED
    return NEWEST


def describe(leaving: Sequence[Leaving]) -> str:
    """``"w-3 (named for removal), w-1 (not in discovery)"`` for messages."""
    return ", ".join(f"{item.worker.name} ({item.why})" for item in leaving)
