"""Which workers the launcher's remote shells reach: pushed by the launcher, not polled.

A drain used to last its full ``drain-seconds`` although Horovod lets a removed host's
ranks go at their next commit, about a second after the host leaves discovery: GPUs sat
idle for the rest of the period. The drain now ends as soon as the ranks have left.

The signal: every rank Horovod (or mpirun, or Intel MPI's hydra) runs on a worker is a
remote shell in the launcher, ``kubexec.sh <worker> <command>``, alive exactly as long as
the remote command. The ``kubexec.sh`` the controller renders (``render.kubexec``) reports
each remote shell's start and, once the remote command has ended, its exit code, into the
job's ranks ConfigMap ``<job>-ranks``: one merge patch per report on keys of that shell's
own, so concurrent shells never conflict. The controller watches that object like its
other children (a report is a watch event, so the job is reconciled when a rank starts or
ends, and not otherwise) and reads it here. An idle fleet costs nothing: no report, no
request. Reads from the side that decides (the driver), not from the workers, where only
a guess at which processes are ranks would be possible.

Keys per remote shell (a worker's name holds no ``_``): ``<worker>_<pid>_<epoch seconds>``
= ``start``, then ``<same>_exit`` = the exit code; and ``<same>_committed`` = the epoch
second when the rank printed the commit marker (``formats.COMMITTED_MARKER``, from the
training's ``report_commits`` hook): its first commit after the reset it joined, so that
reset has ended (docs/membership.md). Separate keys because the reports are sent in the
background and may arrive in any order. Horovod's start-up interface probe (``python -m
horovod.runner.task_fn``, one shell per host before any rank starts) is not a rank:
``kubexec.sh`` tells it by that module name in its command and reports only its start, as
``<worker>_<pid>_<epoch seconds>`` = ``probe``: the driver has started, and its first ranks
come next (``probed``). Its end is never read as ranks lost.

A shell killed by a signal (horovodrun stopping every rank after a failure, or the
launcher's container ending) does not report its exit on purpose: the run ends then, its
ranks were not lost one by one. A rank that died under a live pod (a crash, an OOM kill of
the rank process: ranks are exec'd beside the container's main process, so the pod does
not notice) ends its ``kubectl exec`` with a non-zero code, and that is reported: the
remote shell into a listed worker is gone while others remain. Horovod has blacklisted
that name, so the worker is retired and replaced (``membership.py``). An exit 0 is a rank
that finished (Horovod's SUCCESS, which ends the job): not a loss.

A launcher that is a host (it requests a GPU) may show a remote shell into itself; it is
read like any other, but it is no worker: never a victim, and a lost one retires nothing.

Where the push says nothing about a drain's victim (no report of a shell into it: the
launcher reaches its workers some other way, e.g. ssh; its ``kubexec.sh`` predates the
reports; or the reports were refused), the drain's early end falls back to one exec read
of the launcher's process list (``PROBE_COMMAND``), at most every
``PROBE_INTERVAL_SECONDS`` per job and globally rate-limited (``rankprobe.py``); when that
cannot be read either, the drain runs to its full ``drain-seconds``. That is the only exec
left: a drain's end is the one decision that cannot wait for nothing to happen. A rank
watch without reports has no fallback: it was the periodic exec this replaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from mpijob_elastic.core import names, numbers, times

# The command run in the launcher. `exit 0`: a process that ends while cat reads makes
# cat fail, which says nothing about the others.
PROBE_COMMAND = ("/bin/sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null; exit 0")
PROBE_TIMEOUT_SECONDS = 5.0
# The ranks ConfigMap's keys: see the module docstring.
REPORT_SEPARATOR = "_"
# What an exec read that found no remote shell at all says (rankprobe.py): where the
# launcher reports, its shells are kubexec.sh's, so none runs.
NO_REMOTE_SHELL = "no kubexec.sh process in the launcher"
# The value of a start-up probe's key (the module docstring).
PROBE_VALUE = "probe"
EXIT_SUFFIX = "_exit"
COMMITTED_SUFFIX = "_committed"
# Past this many keys the controller drops the reports of shells that ended before a later
# one into the same host (``compacted``): about 55 kB of the ConfigMap's 1 MiB.
COMPACT_AT = 1000
# The largest start second a key is read as when ordering shells (year 9999).
_MAX_SECOND = 253_402_300_799
# A start second later than the read by more than this is not believed (a clock that far
# off, or a forged key): the shell is taken as started at the read, which only makes the
# rules wait longer for it.
_CLOCK_SKEW_SECONDS = 86_400


@dataclass(frozen=True)
class RankSnapshot:
    """What the launcher's remote shells reach: its reports (``pushed``), or one exec read."""

    # When the read began: every process missing from it was gone at some moment after.
    # For the reports, when the controller looked: they are current up to its watch.
    at: datetime
    # Workers the launcher's remote shells reach; None when the signal could not be read.
    hosts: frozenset[str] | None
    # Why it could not be read, for the log.
    error: str = ""
    # Workers an earlier read showed reached and a later one did not, while others stayed
    # reached, since the planner last acted on a read: their ranks ended.
    lost: frozenset[str] = frozenset()
    # Since when each host in ``hosts`` has been reached without a break (the first read
    # that showed it); a host missing here: unknown, taken as long ago. The host-list
    # rules (host_rules.py) wait for a new host's ranks to have run a while.
    # From the reports, the earliest start of a running shell into the host.
    since: Mapping[str, datetime] = field(default_factory=dict)
    # From the reports: the workers any remote shell of this launcher was reported into.
    # Only for those do the reports say whether ranks run; None for an exec read.
    known: frozenset[str] | None = None
    # From the reports: each reached host's latest start of a running shell (a host
    # missing here: unknown, as in ``since``).
    latest: Mapping[str, datetime] = field(default_factory=dict)
    # From the reports: reached hosts every running shell of which has reported the
    # commit marker; the resets their ranks joined have ended.
    committed: frozenset[str] = frozenset()
    # From the reports: each host in ``known``'s latest shell start, running or ended. A
    # worker's name is reused by a later pod (membership.py): shells that started before
    # that pod was listed say nothing of its ranks.
    started: Mapping[str, datetime] = field(default_factory=dict)
    # From the reports: the keys of every shell reported, and of those still running.
    # The next snapshot judges a loss by shell, against these.
    shells: frozenset[str] = frozenset()
    running_shells: frozenset[str] = frozenset()
    # From the reports: when the driver's start-up probe last started (the latest probe
    # shell's start), None without one. Its first ranks come next.
    probed: datetime | None = None


def pushed(
    data: Mapping[str, str], at: datetime, previous: RankSnapshot | None = None
) -> RankSnapshot:
    """The snapshot the ranks ConfigMap's ``data`` gives, ``previous`` the last one.

    ``lost`` grows by the hosts of shells that failed since ``previous``
    (``_failed_since``), while others still run. ``since``
    and ``latest``: each reached host's earliest and latest running shell's start, as the
    keys name them; ``committed``: the reached hosts none of whose running shells lacks
    the commit marker's report.
    """
    suffixes = (EXIT_SUFFIX, COMMITTED_SUFFIX)
    shells = {key for key in data if not key.endswith(suffixes)}
    probes = {key for key in shells if data[key] == PROBE_VALUE}
    started = shells - probes
    codes = {key[: -len(EXIT_SUFFIX)]: data[key] for key in data if key.endswith(EXIT_SUFFIX)}
    marked = {key[: -len(COMMITTED_SUFFIX)] for key in data if key.endswith(COMMITTED_SUFFIX)}

    when = {key: _started_at(key.rsplit(REPORT_SEPARATOR, 1)[-1], at) for key in shells}
    since: dict[str, datetime] = {}
    latest: dict[str, datetime] = {}
    last: dict[str, datetime] = {}
    unmarked: set[str] = set()
    for key in started:
        last[_host(key)] = max(last.get(_host(key), when[key]), when[key])
    for key in started - codes.keys():
        since[_host(key)] = min(since.get(_host(key), when[key]), when[key])
        latest[_host(key)] = max(latest.get(_host(key), when[key]), when[key])
        if key not in marked:
            unmarked.add(_host(key))
    running = frozenset(since)
    lost = previous.lost if previous is not None else frozenset()
    if previous is not None and previous.hosts and running:
        lost |= {_host(key) for key in _failed_since(previous, started, codes, when)}
    known = frozenset(_host(key) for key in started)
    return RankSnapshot(
        at,
        running,
        lost=lost,
        since=since,
        known=known,
        latest=latest,
        committed=running - unmarked,
        started=last,
        shells=frozenset(started),
        running_shells=frozenset(started - codes.keys()),
        probed=max((when[key] for key in probes), default=None),
    )


def _failed_since(
    previous: RankSnapshot,
    started: set[str],
    codes: Mapping[str, str],
    when: Mapping[str, datetime],
) -> set[str]:
    """The shells that ended in failure since ``previous``: those it saw running, and
    those that started after it and failed before this read. A failed shell older than the
    previous read and unseen by it may be a former pod's of the same name: it says nothing
    of the current one. Judged by shell, not by host: a rank's crash while another shell
    into its host still runs (the mock driver's commit notice, a second slot's rank) is a
    loss all the same, and the next read would no longer see it as new."""
    slack = previous.at - timedelta(seconds=1)  # reports name whole seconds
    return {
        key
        for key in started
        if codes.get(key, "0").strip() != "0"
        and (key in previous.running_shells or (key not in previous.shells and when[key] >= slack))
    }


def compacted(data: Mapping[str, str]) -> dict[str, str] | None:
    """The reports to keep once there are more than ``COMPACT_AT`` keys, None below or when
    nothing would go (so no turn rewrites the object to what it is, again and again): every
    key of a running shell, and of each host the keys of its latest ended shell (its start
    says when a shell last reached the host, ``started``). The rest are shells that ended
    before another into the same host, which the controller read when they ended (a loss
    judged then is remembered in ``lost``). Without this the ConfigMap fills its 1 MiB on
    a long elastic run, and the launcher's reports stop (issue 31)."""
    if len(data) <= COMPACT_AT:
        return None
    suffixes = (EXIT_SUFFIX, COMMITTED_SUFFIX)
    shells = {key for key in data if not key.endswith(suffixes)}
    ended = {key for key in shells if f"{key}{EXIT_SUFFIX}" in data}
    latest: dict[str, tuple[int, str]] = {}
    for key in ended:
        host, _, rest = key.partition(REPORT_SEPARATOR)
        second = numbers.whole(rest.rsplit(REPORT_SEPARATOR, 1)[-1], _MAX_SECOND) or 0
        latest[host] = max(latest.get(host, (second, key)), (second, key))
    dropped = ended - {key for _, key in latest.values()}
    if not dropped:
        return None  # keys that are no shell's (the launcher may write any): no rewrite
    gone = {f"{key}{suffix}" for key in dropped for suffix in ("", *suffixes)}
    return {key: value for key, value in data.items() if key not in gone}


def _host(key: str) -> str:
    """The worker a shell's key names."""
    return key.split(REPORT_SEPARATOR, 1)[0]


def _started_at(second: str, at: datetime) -> datetime:
    """The start a key names; ``at`` for one that is no epoch second or lies past ``at``
    by more than a day (the launcher can write any key)."""
    limit = min(at.timestamp() + _CLOCK_SKEW_SECONDS, times.LATEST.timestamp())
    found = numbers.whole(second, int(limit))
    return at if found is None else datetime.fromtimestamp(found, at.tzinfo)


def reported(host: str, reports: RankSnapshot | None) -> bool:
    return reports is not None and reports.known is not None and host in reports.known


def signal(reports: RankSnapshot | None, read: RankSnapshot | None) -> RankSnapshot | None:
    """The rank signal for the whole job: the reports once they name any host or the
    driver's start-up probe (less the shells a later read no longer found: ``corrected``),
    else the last exec read (a launcher that reports nothing reaches its hosts some other
    way)."""
    if reports is not None and (reports.known or reports.probed is not None):
        return corrected(reports, read)
    return read


def seen_by(
    host: str, reports: RankSnapshot | None, read: RankSnapshot | None, since: datetime
) -> frozenset[str] | None:
    """The workers known to run ranks, for deciding about ``host``: from the reports if
    they cover ``host`` (less the shells a read begun at ``since`` or later no longer
    found), else from such a read; None when neither can say."""
    fresh = read if read is not None and read.at >= since else None
    if reports is not None and reported(host, reports):
        return corrected(reports, fresh).hosts
    return fresh.hosts if fresh is not None else None


def corrected(reports: RankSnapshot, read: RankSnapshot | None) -> RankSnapshot:
    """The reports, less the hosts whose running shells all started a second or more
    before ``read`` began and are missing from it: those shells have ended, and their exit
    reports are late or lost (each is one ``kubectl patch`` in the background of the
    launcher, three tries). Uncorrected, such a claim held a drain to its deadline, its
    worker retired for a failure that never was, and kept a name a scale-out took back out
    of the list for good (rule 1, host_rules.py). A read that could not see the shells
    changes nothing."""
    if reports.hosts is None or read is None:
        return reports
    found = read.hosts
    if found is None:
        if read.error != NO_REMOTE_SHELL:
            return reports
        found = frozenset()  # a launcher that reports runs kubexec.sh: none runs now
    began = read.at - timedelta(seconds=1)  # reports name whole seconds
    ended = {
        h for h in reports.hosts - found if (start := reports.latest.get(h)) and start <= began
    }
    if not ended:
        return reports
    return replace(
        reports,
        hosts=reports.hosts - ended,
        since={h: t for h, t in reports.since.items() if h not in ended},
        latest={h: t for h, t in reports.latest.items() if h not in ended},
        committed=reports.committed - ended,
        running_shells=frozenset(k for k in reports.running_shells if _host(k) not in ended),
    )


def remote_shell_hosts(output: bytes, job: str) -> frozenset[str] | None:
    """The hosts named right after ``kubexec.sh`` in the launcher's command lines.

    ``output`` is every process's NUL-separated argv, concatenated. Both
    ``/bin/sh /etc/mpi/kubexec.sh host cmd`` and Horovod's
    ``/bin/sh -c '/etc/mpi/kubexec.sh host cmd'`` read the same. A remote shell that runs
    Horovod's start-up interface probe (``horovod.runner.task_fn``) holds no rank and is
    not counted: its end must not read as ranks lost. None when no process runs our
    remote shell at all: then the launcher reaches its workers some other way (or runs no
    ranks), and an empty set would wrongly say every rank has left. Only the job's own
    pod names count, matched whole (job ``a``'s prefix also starts job ``a-b``'s workers):
    on KWOK an exec runs on the test machine and sees every job's processes.
    """
    args = [a.split() for a in output.decode("utf-8", "replace").split("\0")]
    found = False
    hosts: set[str] = set()
    for i, tokens in enumerate(args):
        for j, token in enumerate(tokens):
            if not token.strip("'\"").endswith("kubexec.sh"):
                continue
            # The host and command follow in the same argument (sh -c), else in the next
            # ones (kubexec.sh's own argv: the host, then the command as one argument).
            if len(tokens) > j + 1:
                host, command = tokens[j + 1], tokens[j + 2 :]
            else:
                after = [t for a in args[i + 1 : i + 3] for t in a]
                host, command = (after[0], after[1:]) if after else ("", [])
            host = host.strip("'\"")
            if not _own_pod(host, job):
                continue
            found = True
            if not any("horovod.runner.task_fn" in t for t in command):
                hosts.add(host)
    return frozenset(hosts) if found else None


def _own_pod(host: str, job: str) -> bool:
    index = host.removeprefix(f"{job}{names.WORKER_INFIX}")
    return host == names.launcher_name(job) or (
        index != host and index.isascii() and index.isdigit()
    )
