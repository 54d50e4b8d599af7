"""Which workers discover_hosts.sh lists this turn, and who the launcher may exec into.

The job's wanted list (its kept workers that can take ranks and that the Role we wrote
grants) goes through the rules of Horovod's driver (host_rules.py) at this one place.

The workers of one change enter the list together (``gathered``): each host-list change
is one reset of the driver, and after one that added hosts the list holds still until
their ranks have joined (host_rules.py, rule 1), so a worker that started a moment after
its sibling was listed would wait a whole reset, and a second reset would stop every rank
again. A new worker that runs waits, ``GATHER_SECONDS`` at most from its start, while the
others of its change are being created or start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.hosts import drain, host_rules
from mpijob_elastic.core.hosts.membership import Membership
from mpijob_elastic.core.objects import render
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.core.workers import Worker, discovered_hosts, worker_index

# How long a new worker that runs waits for the others of its change to be listed with it:
# pods created together start within a second or two of each other on an idle cluster; a
# sibling later than this goes into the next reset.
GATHER_SECONDS = 5.0


@dataclass(frozen=True)
class Hosts:
    # Who the launcher may exec into: the job's workers, those created now, and the
    # launcher itself if it is a host.
    role_names: list[str]
    # The workers in discover_hosts.sh.
    listed: list[str]
    # Whether the launcher is listed, first, as a host.
    launcher: bool
    # What the host-list rules (host_rules.py) made of the list the job wants.
    rules: host_rules.HostList


def hosts(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    m: Membership,
    create_now: Sequence[int],
    launcher: Mapping[str, Any] | None,
) -> Hosts:
    # Exec rights only on pods the job controls or creates in this turn: never on a
    # name that someone else's pod holds.
    granted = render.exec_names(turn.observed.role)
    role_names = exec_targets(turn, spec.name, workers, create_now, granted)
    main = spec.main_container
    listed = [w.name for w in m.keep if w.can_take_ranks(main) and w.name in granted]
    current = discovered_hosts((turn.observed.config_map or {}).get("data"))
    if host_rules.driver_reads(launcher):
        listed = gathered(turn, spec, m.keep, listed, current, bool(create_now))
    # A launcher that is a host may exec into itself once it exists as the job's (a pod
    # of that name that is not ours is never granted), and is listed, first, once the
    # Role we wrote grants it. It is no worker: never a victim, not counted against
    # min-replicas, max-replicas or Worker replicas.
    launcher_host = (
        render.launcher_is_host(spec)
        and launcher is not None
        and not launcher["metadata"].get("deletionTimestamp")
    )
    if launcher_host:
        role_names.insert(0, names.launcher_name(spec.name))
    launcher_listed = launcher_host and names.launcher_name(spec.name) in granted
    rules = _allowed_hosts(turn, spec, workers, m, listed, launcher, launcher_listed)
    return Hosts(role_names, list(rules.hosts), launcher_listed, rules)


def gathered(
    turn: Turn,
    spec: JobSpec,
    keep: Sequence[Worker],
    wanted: Sequence[str],
    listed: set[str],
    creating: bool,
) -> list[str]:
    """The host list the job wants, less the new workers that wait for the rest of their
    change: while workers are created this turn or a kept one cannot be listed yet
    (unplaced, starting, or its exec grant not written yet), a new one that runs waits up
    to ``GATHER_SECONDS`` from its start."""
    main = spec.main_container
    coming = creating or any(w.name not in wanted and w.name not in listed for w in keep)
    if not coming:
        return list(wanted)
    by_name = {w.name: w for w in keep}
    hold = timedelta(seconds=GATHER_SECONDS)
    out = []
    for name in wanted:
        worker = by_name.get(name)
        since = worker.running_since(main) if worker is not None else None
        if name not in listed and since is not None and turn.now < since + hold:
            turn.requeue((since + hold - turn.now).total_seconds())
        else:
            out.append(name)
    return out


def _allowed_hosts(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    m: Membership,
    wanted: Sequence[str],
    launcher: Mapping[str, Any] | None,
    launcher_listed: bool,
) -> host_rules.HostList:
    """The host list the driver's rules allow now (host_rules.py, the one call site);
    while they hold a change, the launcher's reports say when it may go on (each is a
    watch event), or, if it reports nothing, an exec read every second."""
    rules = host_rules.for_job(
        spec, workers, m, wanted, launcher, launcher_listed, turn.observed, turn.now
    )
    reports = turn.observed.ranks
    if rules.waiting and not (reports is not None and reports.known):
        drain.read_launcher(turn, spec, launcher, drain.PROBE_INTERVAL_SECONDS)
    elif rules.doubted:
        drain.read_launcher(turn, spec, launcher, drain.CONFIRM_INTERVAL_SECONDS)
    if rules.recheck is not None:
        turn.requeue(rules.recheck)
    return rules


def hosts_added(turn: Turn, listed: Sequence[str]) -> str:
    """``names.ANN_HOSTS_ADDED`` after this turn: now if ``listed`` adds a host to
    ``discover_hosts.sh``, else as it was (rule 1, host_rules.py)."""
    current = set(discovered_hosts((turn.observed.config_map or {}).get("data")))
    when = turn.now if set(listed) - current else host_rules.added_at(turn.observed.config_map)
    return format_precise_time(when) if when is not None else ""


def exec_targets(
    turn: Turn,
    job_name: str,
    workers: Sequence[Worker],
    new: Sequence[int],
    granted: set[str],
) -> list[str]:
    """The workers the launcher may exec into: the job's worker pods, terminating ones
    included (a removed worker's ranks wind down through its remote shell), and those
    created now.

    A change removes several workers, and their pods go one by one. While one of them is
    still terminating, and nothing is to be added, the names of those already gone stay
    granted, so that the Role is written once, when the last has gone, not once per pod
    (bench/mass.py counted 2.2 Role writes per scale-in, one needed). A name the Role
    names without a pod grants nothing; one that someone else's pod now holds is never
    kept.
    """
    wanted = by_index(job_name, workers, new)
    deleting = turn.observed.deleting
    if not set(wanted) <= granted or not any(w.terminating or w.uid in deleting for w in workers):
        return wanted
    gone = [
        name
        for name in granted.difference(wanted)
        if worker_index(job_name, name) is not None and ("Pod", name) not in turn.observed.conflicts
    ]
    if not gone:
        return wanted
    # Every name here is a worker name of this job: the index is there.
    return sorted([*wanted, *gone], key=lambda name: worker_index(job_name, name) or 0)


def by_index(job_name: str, workers: Sequence[Worker], new: Sequence[int]) -> list[str]:
    """The names of ``workers`` and of the workers to create at ``new``, in index order."""
    pairs = [(w.index, w.name) for w in workers]
    pairs += [(i, names.worker_name(job_name, i)) for i in new]
    return [name for _, name in sorted(pairs)]
