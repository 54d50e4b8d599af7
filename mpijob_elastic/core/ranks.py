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

Keys, one pair per remote shell (a worker's name holds no ``_``):
``<worker>_<pid>_<epoch seconds>`` = ``start``, then ``<same>_exit`` = the exit code.
Separate keys because both reports are sent in the background and may arrive in either
order. Horovod's start-up interface probe (``python -m horovod.runner.task_fn``, one shell
per host before any rank starts) is not a rank: ``kubexec.sh`` tells it by that module
name in its command and does not report it, so its end is never read as ranks lost.

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
from dataclasses import dataclass
from datetime import datetime

# The command run in the launcher. `exit 0`: a process that ends while cat reads makes
# cat fail, which says nothing about the others.
PROBE_COMMAND = ("/bin/sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null; exit 0")
# A victim must have been out of the host list this long before an empty read counts:
# the launcher's mounted files refresh (well under a second with the config-hash
# annotation), then Horovod's next discovery poll (1 s) must see the removal, or it could
# still be starting a rank there.
DRAIN_FLOOR_SECONDS = 3.0
# How often a job with victims in their drain window reads the launcher.
PROBE_INTERVAL_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 5.0
# The ranks ConfigMap's keys: see the module docstring.
REPORT_SEPARATOR = "_"
EXIT_SUFFIX = "_exit"
# A victim whose ranks have left is deleted with this grace period rather than the pod's
# own: nothing of the training runs there any more, and a `sleep` that ignores SIGTERM
# would hold its GPUs for the pod's full grace period (30 s by default).
RANK_FREE_GRACE_SECONDS = 1


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
    # From the reports: the workers any remote shell of this launcher was reported into.
    # Only for those do the reports say whether ranks run; None for an exec read.
    known: frozenset[str] | None = None


def pushed(
    data: Mapping[str, str], at: datetime, previous: RankSnapshot | None = None
) -> RankSnapshot:
    """The snapshot the ranks ConfigMap's ``data`` gives, ``previous`` the last one.

    ``lost`` grows as an exec read's did: workers reached before and no longer, while
    others stay reached, less those whose remote shells all ended with code 0.
    """
    started = {key for key in data if not key.endswith(EXIT_SUFFIX)}
    codes = {key[: -len(EXIT_SUFFIX)]: data[key] for key in data if key.endswith(EXIT_SUFFIX)}

    def host(key: str) -> str:
        return key.split(REPORT_SEPARATOR, 1)[0]

    running = frozenset(host(key) for key in started if key not in codes)
    failed = {host(key) for key in started if codes.get(key, "0").strip() != "0"}
    lost = previous.lost if previous is not None else frozenset()
    if previous is not None and previous.hosts and running:
        lost |= (previous.hosts - running) & failed
    return RankSnapshot(at, running, lost=lost, known=frozenset(host(key) for key in started))


def seen_by(
    host: str, reports: RankSnapshot | None, read: RankSnapshot | None, since: datetime
) -> frozenset[str] | None:
    """The workers known to run ranks, for deciding about ``host``: from the reports if
    they cover ``host``, else from an exec read begun at ``since`` or later; None when
    neither can say."""
    if reports is not None and reports.known is not None and host in reports.known:
        return reports.hosts
    if read is not None and read.at >= since:
        return read.hosts
    return None


def reported(host: str, reports: RankSnapshot | None) -> bool:
    return reports is not None and reports.known is not None and host in reports.known


def remote_shell_hosts(output: bytes, job: str) -> frozenset[str] | None:
    """The job's hosts named right after ``kubexec.sh`` in the launcher's command lines.

    ``output`` is every process's NUL-separated argv, concatenated. Tokens are split on
    NULs and whitespace, so both ``/bin/sh /etc/mpi/kubexec.sh host cmd`` and Horovod's
    ``/bin/sh -c '/etc/mpi/kubexec.sh host cmd'`` read the same. None when no process runs
    our remote shell at all: then the launcher reaches its workers some other way (or
    runs no ranks), and an empty set would wrongly say every rank has left. Only hosts
    named after ``job`` count (its workers, its launcher): on KWOK an exec runs on the
    test machine and sees every job's processes.
    """
    tokens = output.replace(b"\0", b" ").decode("utf-8", "replace").split()
    found = False
    hosts: set[str] = set()
    for i, token in enumerate(tokens):
        if token.strip("'\"").endswith("kubexec.sh"):
            host = tokens[i + 1].strip("'\"") if i + 1 < len(tokens) else ""
            if host.startswith(f"{job}-"):
                found = True
                hosts.add(host)
    return frozenset(hosts) if found else None
