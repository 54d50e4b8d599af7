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


def kubexec(kubectl: str, container: str | None) -> str:
    """mpirun's remote shell: ``kubexec.sh <pod> <command>`` runs the command in the pod.

    ``container`` must be a DNS-1123 label (spec.mainContainer, validated as one), so it
    cannot carry shell.
    """
    flag = f" --container {container}" if container else ""
    return (
        f"{SHEBANG}"
        "set -x\n"
        "POD_NAME=$1\n"
        "shift\n"
        f'{kubectl} exec ${{POD_NAME}}{flag} -- /bin/sh -c "$*"'
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
