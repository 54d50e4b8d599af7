"""The launcher's command against the job's bounds, where the command is plain.

``horovodrun -np 2 --min-np 1 --max-np 5 --host-discovery-script /etc/mpi/discover_hosts.sh``
must agree with ``min-replicas``/``max-replicas`` times ``slotsPerWorker`` (plus the
launcher's own slots when it requests a GPU: it is then listed as a host), or the job
fails or never grows and nothing says why. Horovod's rules (horovod/runner/launch.py):
``--host-discovery-script`` or ``--min-np`` makes a run elastic; ``--min-np`` defaults
to ``-np``; ``-np`` is what an elastic run waits for before training starts; below
``--min-np`` training stops and waits, up to ``--elastic-timeout``; above ``--max-np``
no rank is started. ``mpirun`` reads the hostfile once, at start: it is never elastic.

Plain means: the container's ``command`` and ``args`` run ``horovodrun`` or ``mpirun``
directly, or through ``sh -c``/``bash -c`` with a script that is one simple command (no
``;``, ``&&``, pipes, redirections, variables or substitutions; ``exec`` and leading
``NAME=value`` assignments are skipped). Anything else (a script, a Python entry point,
a compound shell line, ``horovodrun --config-file``) is opaque: nothing is said.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render
from mpijob_elastic.core.shapes import FieldError
from mpijob_elastic.core.spec.model import JobSpec

DISCOVER_HOSTS = f"{names.CONFIG_MOUNT}/{names.DISCOVER_HOSTS}"
HOSTFILE = f"{names.CONFIG_MOUNT}/{names.HOSTFILE}"
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
# A script with any of these is more than one simple command.
_SHELL_SYNTAX = re.compile(r"[;&|<>$`(){}\n*?~#\\]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_COUNT = re.compile(r"[0-9]{1,9}")

# horovodrun's options that take no value, and the one that takes two; every other
# option takes one (horovod/runner/launch.py, parse_args).
HOROVOD_FLAGS = frozenset(
    {
        "-v", "--version", "-cb", "--check-build", "--disable-cache", "--verbose",
        "--hierarchical-allreduce", "--no-hierarchical-allreduce",
        "--hierarchical-allgather", "--no-hierarchical-allgather", "--autotune",
        "--no-autotune", "--timeline-mark-cycles", "--no-timeline-mark-cycles",
        "--no-stall-check", "--stall-check", "--mpi-threads-disable",
        "--no-mpi-threads-disable", "--tcp", "--log-with-timestamp",
        "--log-without-timestamp", "-prefix-timestamp", "--prefix-output-with-timestamp",
        "--log-hide-timestamp", "--no-log-hide-timestamp", "--gloo", "--mpi", "--jsrun",
    }
)  # fmt: skip
HOROVOD_PAIRS = frozenset({"--blacklist-cooldown-range"})
# Open MPI's: those read here, and enough of the valueless ones that a plain command's
# program is found after them; an unknown option is taken to have one value.
MPIRUN_FLAGS = frozenset(
    {
        "--oversubscribe", "-oversubscribe", "--allow-run-as-root", "-allow-run-as-root",
        "--display-map", "-display-map", "--report-bindings", "-report-bindings",
        "--tag-output", "-tag-output", "--timestamp-output", "-timestamp-output", "-v",
        "--verbose", "-q", "--quiet", "--nolocal", "-nolocal", "--noprefix",
        "--display-allocation", "-display-allocation", "--use-hwthread-cpus",
    }
)  # fmt: skip
MPIRUN_PAIRS = frozenset({"--mca", "-mca", "--gmca", "-gmca"})
MPIRUN_NP = ("-np", "--np", "-n", "--n", "-c")
# Options that make mpirun run elsewhere than on the hostfile the controller writes.
MPIRUN_HOSTS = ("-H", "--host", "-host", "--hostfile", "-hostfile", "--machinefile",
                "-machinefile", "--default-hostfile")  # fmt: skip


@dataclass(frozen=True)
class _Slots:
    """Listed slots at a number of workers: the workers' and the launcher's, if a host."""

    per_worker: int
    launcher: int

    def at(self, workers: int) -> int:
        return workers * self.per_worker + self.launcher

    def show(self, workers: int) -> str:
        launcher = f" + {self.launcher} on the launcher" if self.launcher else ""
        return f"{_n(workers, 'worker')} x {_n(self.per_worker, 'slot')}{launcher}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def check(spec: JobSpec) -> list[FieldError]:
    """A warning for each contradiction between a launcher container's plain command and
    the job's bounds."""
    slots = _Slots(
        spec.slots_per_worker, spec.slots_per_worker if render.launcher_is_host(spec) else 0
    )
    found = []
    for i, container in enumerate(spec.launcher.containers):
        plain = argv(container)
        if plain is None:
            continue
        words, source = plain
        field = f"spec.mpiReplicaSpecs.Launcher.template.spec.containers[{i}].{source}"
        tool = words[0].rsplit("/", 1)[-1]
        if tool == "horovodrun":
            messages = _horovodrun(words[1:], spec, slots)
        elif tool in ("mpirun", "mpiexec", "orterun"):
            messages = _mpirun(tool, words[1:], spec, slots)
        else:
            messages = []
        found += [FieldError(field, m) for m in messages]
    return found


def argv(container: Mapping[str, Any]) -> tuple[list[str], str] | None:
    """The words the container runs and the field they are read from (``command`` or,
    without one, ``args``), if they are plain; None if opaque."""
    command, args = container.get("command"), container.get("args")
    parts = [p for p in (command, args) if p is not None]
    if not all(isinstance(p, list) and all(isinstance(w, str) for w in p) for p in parts):
        return None
    words = [*(command or []), *(args or [])]
    source = "command" if command else "args"
    if not words:
        return None
    if words[0].rsplit("/", 1)[-1] in SHELLS:
        words = _shell_script(words[1:])
    return (words, source) if words else None


def _shell_script(words: Sequence[str]) -> list[str]:
    """The command of ``sh -c '<one simple command>'``; [] if there is more to it."""
    for i, word in enumerate(words):
        if not word.startswith("-"):
            return []  # a script file
        if "c" in word[1:] and not word.startswith("--") and i + 1 < len(words):
            script = words[i + 1]
            if _SHELL_SYNTAX.search(script):
                return []
            try:
                split = shlex.split(script)
            except ValueError:
                return []
            while split and (split[0] == "exec" or _ASSIGNMENT.match(split[0])):
                split = split[1:]
            return split
    return []


def _options(words: Sequence[str], flags: frozenset[str], pairs: frozenset[str]) -> dict[str, str]:
    """Each option before the program to run, with its (first) value; '' for a flag."""
    found: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        option, eq, value = words[i].partition("=")
        i += 1
        if eq or option in flags:
            found[option] = value
            continue
        takes = 2 if option in pairs else 1
        values = []
        while takes and i < len(words) and not words[i].startswith("-"):
            values.append(words[i])
            i, takes = i + 1, takes - 1
        found[option] = values[0] if values else ""
    return found


def _counts(options: Mapping[str, str], *groups: tuple[str, ...]) -> list[tuple[str, int] | None]:
    """For each group of synonyms, the one given and its whole number, or None if none
    is; [] if any is not a plain number (``$(NP)``, which Kubernetes expands): opaque."""
    found: list[tuple[str, int] | None] = []
    for keys in groups:
        key = next((k for k in keys if k in options), None)
        if key is not None and not _COUNT.fullmatch(options[key]):
            return []
        found.append(None if key is None else (key, int(options[key])))
    return found


def _horovodrun(words: Sequence[str], spec: JobSpec, slots: _Slots) -> list[str]:
    options = _options(words, HOROVOD_FLAGS, HOROVOD_PAIRS)
    script = options.get("--host-discovery-script")
    if "--config-file" in options or "$" in (script or ""):
        return []  # values from elsewhere override or fill the command line's: not plain
    bounds = spec.bounds
    elastic_job = bounds.min is not None or bounds.max is not None
    if script is None:
        if elastic_job or "--min-np" in options or "--min-num-proc" in options:
            return [
                "horovodrun has no --host-discovery-script: it never sees a worker added or "
                f"removed; add --host-discovery-script {DISCOVER_HOSTS}"
            ]
        return []  # not elastic, and the job is not either
    found = []
    if script != DISCOVER_HOSTS:
        found.append(
            f"--host-discovery-script is {script}, not {DISCOVER_HOSTS}, the host list "
            "this controller writes: Horovod sees the job's workers only if that script "
            "prints it"
        )
    counts = _counts(
        options,
        ("-np", "--num-proc"),
        ("--min-np", "--min-num-proc"),
        ("--max-np", "--max-num-proc"),
    )
    if counts:
        found += _horovod_bounds(spec, slots, *counts)
    return found


def _horovod_bounds(
    spec: JobSpec,
    slots: _Slots,
    np: tuple[str, int] | None,
    min_np: tuple[str, int] | None,
    max_np: tuple[str, int] | None,
) -> list[str]:
    low, high = spec.bounds.min, spec.bounds.max
    found = []
    minimum = min_np or np
    if minimum and low is not None and minimum[1] > slots.at(low):
        default = "" if min_np else " (Horovod's --min-np when none is given)"
        found.append(
            f"{minimum[0]} {minimum[1]}{default} is above the {_n(slots.at(low), 'slot')} of the "
            f"job at its min-replicas ({slots.show(low)}): at that size Horovod stops "
            "training, and fails after --elastic-timeout"
        )
    if np and high is not None and np[1] > slots.at(high):
        found.append(
            f"{np[0]} {np[1]} is above the {_n(slots.at(high), 'slot')} of the job at its "
            f"max-replicas ({slots.show(high)}): Horovod waits for {np[1]} slots before "
            "training starts, and never gets them"
        )
    if max_np and high is not None and max_np[1] < slots.at(high):
        found.append(
            f"{max_np[0]} {max_np[1]} is below the {_n(slots.at(high), 'slot')} of the job at its "
            f"max-replicas ({slots.show(high)}): Horovod starts no rank beyond "
            f"{max_np[1]}, so the workers above that idle"
        )
    return found


def _mpirun(tool: str, words: Sequence[str], spec: JobSpec, slots: _Slots) -> list[str]:
    options = _options(words, MPIRUN_FLAGS, MPIRUN_PAIRS)
    found = []
    if spec.bounds.min is not None or spec.bounds.max is not None:
        found.append(
            f"{tool} is not elastic: it reads {HOSTFILE} once, at start, so a worker added "
            "later gets no rank and one removed fails the run; run horovodrun with "
            f"--host-discovery-script {DISCOVER_HOSTS} instead"
        )
    np = (_counts(options, MPIRUN_NP) or [None])[0]
    hosts_elsewhere = any(key in options for key in MPIRUN_HOSTS)
    oversubscribe = any(key.lstrip("-") == "oversubscribe" for key in options)
    workers = spec.bounds.clamp(spec.worker.replicas)
    if np and not hosts_elsewhere and not oversubscribe and np[1] > slots.at(workers):
        found.append(
            f"{np[0]} {np[1]} is above the {_n(slots.at(workers), 'slot')} {HOSTFILE} lists "
            f"({slots.show(workers)}): {tool} refuses to start"
        )
    return found
