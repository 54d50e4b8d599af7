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

from dataclasses import dataclass
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


def remote_shell_hosts(output: bytes) -> frozenset[str] | None:
    """The hosts named right after ``kubexec.sh`` in the launcher's command lines.

    ``output`` is every process's NUL-separated argv, concatenated. Tokens are split on
    NULs and whitespace, so both ``/bin/sh /etc/mpi/kubexec.sh host cmd`` and Horovod's
    ``/bin/sh -c '/etc/mpi/kubexec.sh host cmd'`` read the same. None when no process runs
    our remote shell at all: then the launcher reaches its workers some other way (or
    runs no ranks), and an empty set would wrongly say every rank has left.
    """
    tokens = output.replace(b"\0", b" ").decode("utf-8", "replace").split()
    found = False
    hosts: set[str] = set()
    for i, token in enumerate(tokens):
        if token.strip("'\"").endswith("kubexec.sh"):
            found = True
            host = tokens[i + 1].strip("'\"") if i + 1 < len(tokens) else ""
            if host:
                hosts.add(host)
    return frozenset(hosts) if found else None
