"""How the driver reaches a host, and how it reads what came back: the remote shell's
command string (Horovod's ``get_remote_command`` for ``/etc/mpi/kubexec.sh``), the rank's
command template, and the exit codes of the local shell and of kubectl."""

from __future__ import annotations

import re
import shlex

# What the interface probe runs on each host, through the remote shell: a short-lived shell
# that is not a rank (Horovod's task service, which ends once the driver has its answer).
# Its command names the module the real one runs (``python -m horovod.runner.task_fn``), as
# a remote shell tells a probe from a rank by it.
PROBE_MARKER = "mockhorovod-probe"
PROBE_COMMAND = f": python -m horovod.runner.task_fn; echo {PROBE_MARKER} && sleep 1"

# How kubectl exec reports the remote command's exit: a real kubelet makes kubectl print
# this and exit with the same code; KWOK's local exec makes kubectl exit 1 with an internal
# error that ends in "exit status N". Either way Horovod's log would name the remote code.
_REMOTE_EXIT_PATTERNS = (
    re.compile(r"command terminated with exit code (\d+)"),
    re.compile(r"error executing command in container:.*exit status (\d+)"),
)


def remote_exit_code(stderr: str) -> int | None:
    """The remote command's exit code as kubectl reported it on stderr, if it did."""
    found: int | None = None
    for line in stderr.splitlines():
        for pattern in _REMOTE_EXIT_PATTERNS:
            match = pattern.search(line)
            if match:
                found = int(match.group(1))
    return found


def exit_status(returncode: int) -> tuple[int, int | None]:
    """A shell-style exit code and the signal, from asyncio's returncode (negative when a
    signal ended the process), so a SIGKILL reads as 137 like kubectl reports it."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def render_rank_command(template: str, values: dict[str, str], rank_args: list[str]) -> str:
    """Fills the ``--rank-command`` template; every value is shell-quoted on the way in,
    because host names come from a file the controller writes."""
    quoted = {key: shlex.quote(value) for key, value in values.items()}
    quoted["rank_args"] = shlex.join(rank_args)
    return template.format_map(quoted)


def remote_shell_command(rsh_agent: str, host: str, command: str) -> str:
    """The string Horovod's gloo runner hands to ``/bin/sh -c`` for a remote slot.

    Horovod quotes the whole remote command into one word; kubexec.sh joins its arguments
    with ``"$*"`` and hands them to ``/bin/sh -c`` in the pod, so the command survives the
    trip byte for byte.
    """
    return f"{shlex.quote(rsh_agent)} {shlex.quote(host)} {shlex.quote(command)}"
