"""Whether a draining worker still runs ranks, read from the launcher's side.

A drain used to last its full ``drain-seconds`` although Horovod lets a removed host's
ranks go at their next commit, about a second after the host leaves discovery: GPUs sat
idle for the rest of the period. The drain now ends as soon as the ranks have left.

The signal: every rank Horovod (or mpirun, or Intel MPI's hydra) runs on a worker is a
remote-shell process in the launcher, ``kubexec.sh <worker> <command>``, alive exactly as
long as the remote command. So one exec into the launcher's main container that lists the
processes' command lines (``/proc/*/cmdline``, needing nothing but ``cat``) tells, for
every worker at once, whether the launcher still reaches it. It is read from the side
that decides (the driver), not from the workers, where only a guess at which processes
are ranks would be possible. The controller holds ``pods/exec`` already (it must, to
grant it to the launcher).

The same read, repeated every ``RANK_WATCH_SECONDS`` while a job runs, catches a rank
that died while its worker pod lives on (a crash, an OOM kill of the rank process: ranks
are exec'd beside the container's main process, so the pod does not notice): the remote
shell into a listed worker is gone while others remain. Horovod has blacklisted that
name, so the worker is retired and replaced (``membership.py``).

A launcher that is a host (it requests a GPU) may show a remote shell into itself; it is
read like any other, but it is no worker: never a victim, and a lost one retires nothing.

When the signal cannot be read (no launcher, exec refused, timed out, no ``/proc``, or
no ``kubexec.sh`` process at all, which means the launcher does not use our remote shell,
e.g. ssh), the drain falls back to its full ``drain-seconds``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

# The command run in the launcher. `exit 0`: a process that ends while cat reads makes
# cat fail, which says nothing about the others.
PROBE_COMMAND = ("/bin/sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null; exit 0")
PROBE_TIMEOUT_SECONDS = 5.0
# How often a running job's launcher is read for ranks that died under a live pod: one
# exec per running job per period, no write.
RANK_WATCH_SECONDS = 15.0
# A rank seen by no read is never missed, so while a worker's main container started less
# than this long ago (its ranks are starting, and a crash at start-up is likely) the
# launcher is read every drain.PROBE_INTERVAL_SECONDS instead.
RANK_WATCH_STARTING_SECONDS = 30.0


@dataclass(frozen=True)
class RankSnapshot:
    """One read of the launcher's remote shells."""

    # When the read began: every process missing from it was gone at some moment after.
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
    since: Mapping[str, datetime] = field(default_factory=dict)


def remote_shell_hosts(output: bytes) -> frozenset[str] | None:
    """The hosts named right after ``kubexec.sh`` in the launcher's command lines.

    ``output`` is every process's NUL-separated argv, concatenated. Both
    ``/bin/sh /etc/mpi/kubexec.sh host cmd`` and Horovod's
    ``/bin/sh -c '/etc/mpi/kubexec.sh host cmd'`` read the same. A remote shell that runs
    Horovod's start-up interface probe (``horovod.runner.task_fn``) holds no rank and is
    not counted: its end must not read as ranks lost. None when no process runs our
    remote shell at all: then the launcher reaches its workers some other way (or runs no
    ranks), and an empty set would wrongly say every rank has left.
    """
    args = [a.split() for a in output.decode("utf-8", "replace").split("\0")]
    found = False
    hosts: set[str] = set()
    for i, tokens in enumerate(args):
        for j, token in enumerate(tokens):
            if not token.strip("'\"").endswith("kubexec.sh"):
                continue
            found = True
            # The host and command follow in the same argument (sh -c), else in the next
            # ones (kubexec.sh's own argv: the host, then the command as one argument).
            if len(tokens) > j + 1:
                host, command = tokens[j + 1], tokens[j + 2 :]
            else:
                after = [t for a in args[i + 1 : i + 3] for t in a]
                host, command = (after[0], after[1:]) if after else ("", [])
            host = host.strip("'\"")
            if host and not any("horovod.runner.task_fn" in t for t in command):
                hosts.add(host)
    return frozenset(hosts) if found else None
