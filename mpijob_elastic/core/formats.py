"""The files of a job's ConfigMap, written and read in one place.

``hostfile``, ``kubexec.sh`` and ``discover_hosts.sh`` are interfaces: users' images,
mpirun, Horovod and the launcher's init container read them, so they follow the upstream
v1 controllers byte for byte (docs/formats.md). Each reader here is the inverse of its
writer beside it, and the init container's count of listed workers is built from the
same line format, so a change to one cannot leave the others reading the old one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mpijob_elastic.core import names

SHEBANG: Final = "#!/bin/sh\n"
# discover_hosts.sh prints one "<host>:<slots>" per line, which Horovod splits at the
# last colon; the hostfile gives "<host> slots=<slots>", mpirun's syntax.
_SLOTS_SEPARATOR: Final = ":"
_HOSTFILE_SLOTS: Final = " slots="
_ECHO: Final = "echo"

# A basic regular expression (grep's) matching the discover_hosts.sh lines of workers and
# not the launcher's: a worker's name ends in "-worker-<index>", right before the slots.
WORKER_LINE_PATTERN: Final = f"{names.WORKER_INFIX.lstrip('-')}[0-9]*{_SLOTS_SEPARATOR}"


def hostfile(hosts: Sequence[str], slots: int) -> str:
    """One line per host, each ending in a newline."""
    return "".join(f"{host}{_HOSTFILE_SLOTS}{slots}\n" for host in hosts)


def hostfile_hosts(text: str) -> list[str]:
    """The hosts a ``hostfile`` names, in order."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


# kubexec.sh's reports of each remote shell's start, its first commit after a reset and,
# once the remote command has ended, its exit code (ranks.py), around the v1 exec line.
# Horovod's start-up interface probe (``horovod.runner.task_fn``) is no rank: only its start
# is reported, as ``probe``, which says that the driver has started and its first ranks
# come next (host_rules.py, the driver's first reset).
# They never hold up or fail the remote shell: each is a background kubectl, retried twice,
# its output and errors discarded, and the script's exit status is still kubectl exec's
# own. No `--request-timeout`: given any connection flag, kubectl no longer falls back to
# its in-cluster config and dials localhost:8080 (seen on kind); a report that hangs holds
# up nothing, being in the background. The background job is a new `sh`, not a subshell: a
# forked subshell would keep the copy of stderr that the shell saves around `2>/dev/null`,
# and so keep the caller's pipe open, which horovodrun reads to its end; for the same
# reason it closes the descriptors 3 and 4 of the exit status's plumbing below. Traced
# lines are sent to /dev/null to keep the trace of `set -x` close to v1's. A shell that the
# caller kills by a signal reports no exit: see ranks.py. `$$` and the start second name
# the shell: unique in the launcher.
#
# The commit marker (COMMITTED_MARKER, printed by the training through
# contrib/mpijob_elastic_notice.py's report_commits) comes on the remote command's standard
# output, which passes through `committed` line by line until the marker, then through
# `cat` untouched (the read loop itself where there is no cat): a training without the
# hook only costs a read loop on its output. Only the first marker of a shell is
# reported: it says the reset that shell's rank joined has ended (docs/membership.md).
# stdout goes through a pipe, so kubectl exec's exit status comes back on descriptor 3
# into `rc`; its stderr (where kubectl says "command terminated with exit code N") is
# untouched.
COMMITTED_MARKER: Final = "mpijob-elastic: committed after reset"
KUBEXEC_REPORT: Final = """\
{{ R=${{POD_NAME}}_$$_$(date +%s) S=start
case "$*" in *horovod.runner.task_fn*) S=probe;; esac
report() {{
  /bin/sh -c 'for t in 1 2 3; do "$0" patch configmap "$1" --type=merge -p "$2" \\
    && break; sleep 1; done' {kubectl} {ranks} "{{\\"data\\":{{\\"$R$1\\":\\"$2\\"}}}}" \\
    </dev/null >/dev/null 2>&1 3>&- 4>&- &
}}
committed() {{
  M=$R
  [ $S = start ] || M=
  [ -n "$M" ] || ! command -v cat >/dev/null || exec cat
  while IFS= read -r l; do
    printf '%s\\n' "$l"
    case $M in ?*) case $l in *'{marker}'*) M=
      report _committed "$(date +%s)"; ! command -v cat >/dev/null || exec cat;; esac;; esac
  done
  printf '%s' "$l"
}}
report "" $S; exec 4>&1; }} 2>/dev/null
"""
KUBEXEC_EXIT: Final = "{ [ $S = probe ] || report _exit $rc; exit $rc; } 2>/dev/null\n"


def kubexec(kubectl: str, container: str | None, ranks: str) -> str:
    """mpirun's remote shell: ``kubexec.sh <pod> <command>`` runs the command in the pod.

    v1's script byte for byte up to its exec line; the exec line is v1's too, with the
    reports to the ConfigMap ``ranks`` around it and its output through the commit
    marker's watch. ``container`` must be a DNS-1123 label (spec.mainContainer, validated
    as one) and ``ranks`` a DNS-1123 subdomain, so neither can carry shell.
    """
    flag = f" --container {container}" if container else ""
    exec_line = f'{kubectl} exec ${{POD_NAME}}{flag} -- /bin/sh -c "$*"'
    return (
        f"{SHEBANG}"
        "set -x\n"
        "POD_NAME=$1\n"
        "shift\n"
        + KUBEXEC_REPORT.format(kubectl=kubectl, ranks=ranks, marker=COMMITTED_MARKER)
        + f"rc=$({{ {{ {exec_line} 3>&- 4>&-; {{ echo $? >&3; }} 2>/dev/null; }}"
        + " | { set +x; committed; } 2>/dev/null >&4 3>&-; } 3>&1)\n"
        + KUBEXEC_EXIT
    )


def _echo(host: str, slots: int) -> str:
    return f"{_ECHO} {host}{_SLOTS_SEPARATOR}{slots}"


def discover_hosts(hosts: Sequence[str], slots: int, launcher: str | None = None) -> str:
    """``hosts``: the workers to list; ``launcher``: its name, listed first, or None.

    v1 format: no newline after the last line; Horovod reads the output as a set, and
    ignores blank lines. The launcher's line is training-operator 1.9's byte for byte: it
    ends in a newline of its own, so a blank line follows it when workers are listed.
    """
    lines = [_echo(host, slots) for host in hosts]
    head = SHEBANG
    if launcher is not None:
        head += _echo(launcher, slots) + "\n" + ("\n" if lines else "")
    return head + "\n".join(lines)


def discover_hosts_hosts(text: str) -> list[str]:
    """The hosts a ``discover_hosts.sh`` lists (the launcher too when it is one), in order."""
    hosts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == _ECHO:
            hosts.append(parts[1].rsplit(_SLOTS_SEPARATOR, 1)[0])
    return hosts


def count_listed_workers(path: str) -> str:
    """A shell command printing how many workers the ``discover_hosts.sh`` at ``path``
    lists, not counting a launcher that is a host."""
    return f'/bin/sh {path} | grep -c "{WORKER_LINE_PATTERN}"'
