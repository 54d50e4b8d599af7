"""Parse and validate an MPIJob into the typed spec the planner works from.

Every error names the field the user has to fix, in the API server's ``field.path: message``
style, because these messages end up in a condition and an Event that users read with
``kubectl describe``. Anything that later reaches a shell script (``kubexec.sh``) or a
child's name is checked here, so no spec value can inject shell or break a name limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpijob_elastic import names

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")

# Pod names double as hostnames in Open MPI's view, and hostnames are DNS-1123 labels.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_LABEL = 63


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidSpec(Exception):
    """The job cannot be acted on until the user fixes these fields."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = tuple(errors)


@dataclass(frozen=True)
class ReplicaSpec:
    replicas: int
    restart_policy: str
    template: Mapping[str, Any]

    @property
    def containers(self) -> list[Mapping[str, Any]]:
        spec = self.template.get("spec") or {}
        return list(spec.get("containers") or [])


@dataclass(frozen=True)
class Bounds:
    """Per-job worker bounds; ``None`` means unbounded on that side."""

    min: int | None
    max: int | None

    def contains(self, replicas: int) -> bool:
        if replicas < 0:
            return False
        if self.min is not None and replicas < self.min:
            return False
        return self.max is None or replicas <= self.max

    def clamp(self, replicas: int) -> int:
        low = self.min if self.min is not None else 0
        value = max(replicas, low)
        return value if self.max is None else min(value, self.max)

    def describe(self) -> str:
        low = self.min if self.min is not None else 0
        high = "unbounded" if self.max is None else str(self.max)
        return f"[{low}, {high}]"


@dataclass(frozen=True)
class JobSpec:
    namespace: str
    name: str
    uid: str
    slots_per_worker: int
    main_container: str | None
    clean_pod_policy: str
    launcher: ReplicaSpec
    worker: ReplicaSpec
    bounds: Bounds
    drain_seconds: float


def managed_by(job: Mapping[str, Any]) -> str | None:
    value = ((job.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    # bool is an int subclass in Python, but `replicas: true` is not a number to a user.
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _annotation_int(
    annotations: Mapping[str, Any], key: str, minimum: int, errors: list[FieldError]
) -> int | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    field = f"metadata.annotations[{key}]"
    try:
        value = int(str(raw).strip())
    except ValueError:
        errors.append(FieldError(field, f"must be a whole number, got {raw!r}"))
        return None
    if value < minimum:
        errors.append(FieldError(field, f"must be at least {minimum}, got {value}"))
        return None
    return value


def _drain_seconds(
    annotations: Mapping[str, Any], default: float, errors: list[FieldError]
) -> float:
    raw = annotations.get(names.ANN_DRAIN_SECONDS)
    if raw is None:
        return default
    field = f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]"
    try:
        value = float(str(raw).strip())
    except ValueError:
        errors.append(FieldError(field, f"must be a number of seconds, got {raw!r}"))
        return default
    if not value >= 0 or value == float("inf"):
        errors.append(FieldError(field, f"must be a finite number >= 0, got {raw!r}"))
        return default
    return value


def _replica_spec(
    specs: Mapping[str, Any], role: str, errors: list[FieldError]
) -> ReplicaSpec | None:
    path = f"spec.mpiReplicaSpecs.{role}"
    raw = specs.get(role)
    if not isinstance(raw, Mapping):
        errors.append(FieldError(path, "Required value"))
        return None
    replicas_raw = raw.get("replicas", 1)
    replicas = _int(replicas_raw)
    if replicas is None:
        errors.append(FieldError(f"{path}.replicas", f"must be an integer, got {replicas_raw!r}"))
    restart = raw.get("restartPolicy") or "Never"
    if restart not in RESTART_POLICIES:
        errors.append(
            FieldError(
                f"{path}.restartPolicy",
                f"unsupported value {restart!r}: must be one of {', '.join(RESTART_POLICIES)}",
            )
        )
    template = raw.get("template")
    containers = (
        (template.get("spec") or {}).get("containers") if isinstance(template, Mapping) else None
    ) or []
    if not isinstance(containers, list) or not containers:
        errors.append(
            FieldError(f"{path}.template.spec.containers", "Required value: at least one container")
        )
    elif not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in containers):
        errors.append(
            FieldError(f"{path}.template.spec.containers", "every container needs a name")
        )
    if replicas is None or not isinstance(template, Mapping):
        return None
    return ReplicaSpec(replicas=replicas, restart_policy=restart, template=template)


def parse(job: Mapping[str, Any], default_drain_seconds: float) -> JobSpec:
    """Return the job's typed spec, or raise InvalidSpec listing every field to fix.

    Worker replicas outside the job's bounds are *not* an error here: the planner keeps such
    a job running at its current size, which needs the rest of the spec.
    """
    errors: list[FieldError] = []
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    name = str(meta.get("name", ""))
    annotations = meta.get("annotations") or {}

    slots_raw = spec.get("slotsPerWorker", 1)
    slots = _int(slots_raw)
    if slots is None or slots < 1:
        errors.append(
            FieldError("spec.slotsPerWorker", f"must be an integer >= 1, got {slots_raw!r}")
        )

    run_policy = spec.get("runPolicy") or {}
    clean = run_policy.get("cleanPodPolicy") or spec.get("cleanPodPolicy") or "None"
    if clean not in CLEAN_POD_POLICIES:
        field = (
            "spec.runPolicy.cleanPodPolicy"
            if run_policy.get("cleanPodPolicy")
            else ("spec.cleanPodPolicy")
        )
        errors.append(
            FieldError(field, f"unsupported value {clean!r}: must be one of All, Running, None")
        )

    specs = spec.get("mpiReplicaSpecs")
    if not isinstance(specs, Mapping):
        errors.append(FieldError("spec.mpiReplicaSpecs", "Required value"))
        specs = {}
    launcher = _replica_spec(specs, "Launcher", errors)
    worker = _replica_spec(specs, "Worker", errors)
    if launcher is not None and launcher.replicas != 1:
        errors.append(
            FieldError(
                "spec.mpiReplicaSpecs.Launcher.replicas",
                f"must be 1, got {launcher.replicas}",
            )
        )

    bounds = Bounds(
        _annotation_int(annotations, names.ANN_MIN_REPLICAS, 0, errors),
        _annotation_int(annotations, names.ANN_MAX_REPLICAS, 1, errors),
    )
    if bounds.min is not None and bounds.max is not None and bounds.min > bounds.max:
        errors.append(
            FieldError(
                f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
                f"min-replicas {bounds.min} is greater than max-replicas {bounds.max}",
            )
        )
    drain = _drain_seconds(annotations, default_drain_seconds, errors)

    if not _DNS_LABEL.match(name):
        errors.append(
            FieldError(
                "metadata.name",
                "must be a DNS-1123 label (lowercase letters, digits, '-'): "
                "worker pod names are used as MPI hostnames",
            )
        )
    elif worker is not None:
        largest = max(worker.replicas, bounds.max or 0, 1) - 1
        longest = names.worker_name(name, largest)
        if len(longest) > _MAX_LABEL:
            errors.append(
                FieldError(
                    "metadata.name",
                    f"too long: worker pod name {longest!r} would be {len(longest)} characters, "
                    f"over the {_MAX_LABEL} a hostname allows; use at most "
                    f"{_MAX_LABEL - len(longest) + len(name)} characters",
                )
            )

    main = spec.get("mainContainer")
    if main is not None:
        if not isinstance(main, str) or len(main) > _MAX_LABEL or not _DNS_LABEL.match(main):
            errors.append(
                FieldError(
                    "spec.mainContainer", f"must be a container name (DNS-1123 label), got {main!r}"
                )
            )
        elif worker is not None and main not in {c.get("name") for c in worker.containers}:
            errors.append(
                FieldError(
                    "spec.mainContainer",
                    f"names no container of spec.mpiReplicaSpecs.Worker.template: {main!r}",
                )
            )

    if errors or launcher is None or worker is None or slots is None:
        raise InvalidSpec(errors)
    return JobSpec(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        slots_per_worker=slots,
        main_container=main,
        clean_pod_policy=clean,
        launcher=launcher,
        worker=worker,
        bounds=bounds,
        drain_seconds=drain,
    )
