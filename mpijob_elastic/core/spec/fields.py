"""Readers of the MPIJob's single fields, for ``parse`` (parse.py).

Each reads one field (or annotation), appends a ``FieldError`` naming it when the value is
unusable, and returns a default instead of raising, so that ``parse`` reports every field
to fix at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.shapes import FieldError, as_int, mapping, show, string_field, string_map
from mpijob_elastic.core.spec import scheduling_policy
from mpijob_elastic.core.spec.model import DEFAULT_GLOO_TIMEOUT_SECONDS, Bounds, ReplicaSpec
from mpijob_elastic.core.spec.scheduling_policy import SchedulingPolicy
from mpijob_elastic.core.workers import worker_index

CLEAN_POD_POLICIES = ("All", "Running", "None")


# Pod names double as hostnames in Open MPI's view, and hostnames are DNS-1123 labels.
# Used with fullmatch: "$" would also match before a trailing newline, which would then
# reach kubexec.sh.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_LABEL = 63
# ServiceAccount names are DNS-1123 subdomains; the API server would refuse the pod and the
# ServiceAccount otherwise, far from the field that caused it.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_SUBDOMAIN = 253
SERVICE_ACCOUNT_FIELD = "spec.mpiReplicaSpecs.Launcher.template.spec.serviceAccountName"

# int() and float() also take "1_0", " 4 ", "\u0661" (Arabic-Indic one), "+4", "1e3" and
# "nan", none of which a user typing a count or a duration means; fullmatch, because "$"
# would let a trailing newline through.
_WHOLE_NUMBER = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")

# The CRD declares replicas and slotsPerWorker int32 but does not enforce it; outside that
# range a number is a typo, and Python's str() of a huge int raises.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# The longest duration an annotation may give, in seconds (365 days): a drain, a scale-out
# or a stay below the minimum longer than a year is a typo, and a deadline computed from
# a duration beyond Python's datetime range raised OverflowError in every reconcile. The
# admission policy (config/admission/policy.yaml) holds the same bound.
MAX_DURATION_SECONDS = 365 * 24 * 3600

# Horovod's Gloo timeout as the launcher's environment sets it (its default where unset:
# spec.DEFAULT_GLOO_TIMEOUT_SECONDS).
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"


def annotation_int(
    annotations: Mapping[str, Any],
    key: str,
    minimum: int,
    maximum: int,
    errors: list[FieldError],
) -> int | None:
    raw = annotations.get(key)
    if not isinstance(raw, str):
        return None  # unset, or already reported as not a string
    field = f"metadata.annotations[{key}]"
    if not _WHOLE_NUMBER.fullmatch(raw):
        errors.append(FieldError(field, f"must be a whole number, got {show(raw)}"))
        return None
    digits = raw.lstrip("0") or "0"
    # Compared as text first: int() refuses more than 4300 digits.
    if len(digits) > len(str(maximum)) or int(digits) > maximum:
        errors.append(
            FieldError(
                field,
                f"must be at most {maximum} (the controller's --max-workers-per-job), "
                f"got {show(raw)}",
            )
        )
        return None
    value = int(digits)
    if value < minimum:
        errors.append(FieldError(field, f"must be at least {minimum}, got {value}"))
        return None
    return value


def _run_policy_count(
    policy: Mapping[str, Any], key: str, minimum: int, errors: list[FieldError]
) -> int | None:
    value = policy.get(key)
    if value is None:
        return None
    # bool is an int to Python, never to the API. Above int32 (68 years) a deadline is a
    # typo, and one beyond Python's datetime range would raise in every reconcile.
    count = as_int(value)
    if count is None or not minimum <= count <= INT32_MAX:
        errors.append(
            FieldError(
                f"spec.runPolicy.{key}",
                f"must be a whole number from {minimum} to {INT32_MAX}, got {show(value)}",
            )
        )
        return None
    return count


def seconds(
    annotations: Mapping[str, Any], key: str, default: float, errors: list[FieldError]
) -> float:
    raw = annotations.get(key)
    if not isinstance(raw, str):
        return default  # unset, or already reported as not a string
    field = f"metadata.annotations[{key}]"
    if not _DECIMAL.fullmatch(raw):
        errors.append(
            FieldError(
                field,
                f"must be a number of seconds in ASCII digits (like 30 or 2.5), got {show(raw)}",
            )
        )
        return default
    # float() of a long run of digits is inf, never an error.
    value = float(raw)
    if not math.isfinite(value) or value > MAX_DURATION_SECONDS:
        errors.append(
            FieldError(
                field,
                f"must be at most {MAX_DURATION_SECONDS} seconds (365 days), got {show(raw)}",
            )
        )
        return default
    return value


def remove_workers(
    annotations: Mapping[str, Any], job_name: str | None, errors: list[FieldError]
) -> frozenset[str]:
    raw = annotations.get(names.ANN_REMOVE_WORKERS)
    if not isinstance(raw, str) or job_name is None:
        return frozenset()  # unset, or already reported
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    strangers = sorted(n for n in wanted if worker_index(job_name, n) is None)
    if strangers:
        errors.append(
            FieldError(
                f"metadata.annotations[{names.ANN_REMOVE_WORKERS}]",
                f"must list worker pod names of this job ({names.worker_name(job_name, 0)}, "
                f"...) separated by commas, got {', '.join(map(repr, strangers))}",
            )
        )
        return frozenset()
    return frozenset(wanted)


def choice(
    value: Any, field: str, allowed: tuple[str, ...], default: str, errors: list[FieldError]
) -> str:
    # "" is how Go clients write "unset", and the upstream operator defaults it too.
    if value is None or value == "":
        return default
    if value not in allowed:
        errors.append(
            FieldError(
                field, f"unsupported value {show(value)}: must be one of {', '.join(allowed)}"
            )
        )
        return default
    return str(value)


def metadata(
    meta: Mapping[str, Any] | None, errors: list[FieldError]
) -> tuple[str | None, str | None, str | None, Mapping[str, Any]]:
    """The job's name, namespace, uid and annotations."""
    if meta is None:
        return None, None, None, {}
    name = string_field(meta.get("name"), "metadata.name", errors, required=True)
    namespace = string_field(meta.get("namespace"), "metadata.namespace", errors)
    uid = string_field(meta.get("uid"), "metadata.uid", errors)
    raw_annotations = meta.get("annotations")
    string_map(raw_annotations, "metadata.annotations", errors)
    annotations = raw_annotations if isinstance(raw_annotations, Mapping) else {}
    return name, namespace, uid, annotations


def slots(spec: Mapping[str, Any], errors: list[FieldError]) -> int | None:
    slots_raw = spec.get("slotsPerWorker", 1)
    count = as_int(slots_raw)
    if count is not None and count < 1:
        errors.append(FieldError("spec.slotsPerWorker", f"must be at least 1, got {count}"))
        count = None
    elif count is None or count > INT32_MAX:
        errors.append(
            FieldError(
                "spec.slotsPerWorker",
                f"must be a 32-bit integer >= 1, got {show(slots_raw)}",
            )
        )
        return None
    return count


@dataclass(frozen=True)
class RunPolicy:
    """spec.runPolicy as read, for the JobSpec's fields of the same meaning."""

    clean: str
    suspend: bool
    deadline: int | None
    ttl: int | None
    backoff_limit: int | None
    scheduling: SchedulingPolicy | None


def run_policy(spec: Mapping[str, Any], errors: list[FieldError]) -> RunPolicy:
    """spec.runPolicy, and the v1 spec.cleanPodPolicy it replaces."""
    policy = mapping(spec.get("runPolicy"), "spec.runPolicy", errors) or {}
    if policy.get("cleanPodPolicy") not in (None, ""):
        clean = choice(
            policy.get("cleanPodPolicy"),
            "spec.runPolicy.cleanPodPolicy",
            CLEAN_POD_POLICIES,
            "None",
            errors,
        )
    else:
        clean = choice(
            spec.get("cleanPodPolicy"), "spec.cleanPodPolicy", CLEAN_POD_POLICIES, "None", errors
        )
    suspend = policy.get("suspend")
    if suspend is None:
        suspend = False
    elif not isinstance(suspend, bool):
        errors.append(
            FieldError("spec.runPolicy.suspend", f"must be true or false, got {show(suspend)}")
        )
        suspend = False
    return RunPolicy(
        clean,
        suspend,
        _run_policy_count(policy, "activeDeadlineSeconds", 1, errors),
        _run_policy_count(policy, "ttlSecondsAfterFinished", 0, errors),
        _run_policy_count(policy, "backoffLimit", 0, errors),
        scheduling_policy.parse(policy.get("schedulingPolicy"), errors),
    )


def check_name(
    name: str | None, worker: ReplicaSpec | None, bounds: Bounds, errors: list[FieldError]
) -> None:
    """The job's name must make worker pod names that are hostnames."""
    if name is not None and not _DNS_LABEL.fullmatch(name):
        errors.append(
            FieldError(
                "metadata.name",
                "must be a DNS-1123 label (lowercase letters, digits, '-'): "
                "worker pod names are used as MPI hostnames",
            )
        )
    elif name is not None and worker is not None:
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


def main_container(
    spec: Mapping[str, Any], worker: ReplicaSpec | None, errors: list[FieldError]
) -> str | None:
    main = spec.get("mainContainer")
    if main is None:
        return None
    if not isinstance(main, str) or len(main) > _MAX_LABEL or not _DNS_LABEL.fullmatch(main):
        errors.append(
            FieldError(
                "spec.mainContainer",
                f"must be a container name (DNS-1123 label), got {show(main)}",
            )
        )
    elif worker is not None and main not in {c.get("name") for c in worker.containers}:
        errors.append(
            FieldError(
                "spec.mainContainer",
                f"names no container of spec.mpiReplicaSpecs.Worker.template: {main!r}",
            )
        )
    return main if isinstance(main, str) else None


def gloo_timeout(launcher: ReplicaSpec | None, errors: list[FieldError]) -> float:
    """Horovod's Gloo timeout as the launcher's containers set it (horovodrun passes its
    environment on to the ranks); the largest where several do, Horovod's default where
    none does. The host-list rules take it as the longest a reset may last (host_rules.py),
    so a value the controller cannot read (``valueFrom``) is refused rather than guessed."""
    found: list[float] = []
    for i, container in enumerate(launcher.containers if launcher is not None else []):
        env = container.get("env") if isinstance(container, Mapping) else None
        for j, var in enumerate(env if isinstance(env, list) else []):
            if not isinstance(var, Mapping) or var.get("name") != GLOO_TIMEOUT_ENV:
                continue
            field = f"spec.mpiReplicaSpecs.Launcher.template.spec.containers[{i}].env[{j}]"
            raw = var.get("value")
            if "valueFrom" in var or not isinstance(raw, str):
                errors.append(
                    FieldError(
                        f"{field}.value",
                        f"{GLOO_TIMEOUT_ENV} must be a literal value: the controller waits "
                        "that long for a reset of Horovod's to end, so it must read it "
                        "(docs/membership.md)",
                    )
                )
            elif (
                not _WHOLE_NUMBER.fullmatch(raw)
                or len(raw) > len(str(MAX_DURATION_SECONDS))
                or not 1 <= int(raw) <= MAX_DURATION_SECONDS
            ):
                errors.append(
                    FieldError(
                        f"{field}.value",
                        f"{GLOO_TIMEOUT_ENV} must be a whole number of seconds from 1 to "
                        f"{MAX_DURATION_SECONDS}, got {show(raw)}",
                    )
                )
            else:
                found.append(float(raw))
    return max(found, default=DEFAULT_GLOO_TIMEOUT_SECONDS)


def launcher_account(launcher: ReplicaSpec | None, errors: list[FieldError]) -> Any:
    """The Launcher template's serviceAccountName; None: unset."""
    if launcher is None:
        return None
    account = (launcher.template.get("spec") or {}).get("serviceAccountName")
    if account == "":
        return None  # how Go clients write "unset"
    if account is not None and (
        not isinstance(account, str)
        or len(account) > _MAX_SUBDOMAIN
        or not _DNS_SUBDOMAIN.fullmatch(account)
    ):
        errors.append(
            FieldError(
                SERVICE_ACCOUNT_FIELD,
                f"must be a ServiceAccount name (DNS-1123 subdomain), got {show(account)}",
            )
        )
    return account


def opportunistic(
    annotations: Mapping[str, Any], bounds: Bounds, errors: list[FieldError]
) -> tuple[bool, str | None]:
    """Whether the job grows into idle capacity (opportunistic.py), and the PriorityClass
    its opportunistic workers run at if the job names one."""
    raw = annotations.get(names.ANN_OPPORTUNISTIC)
    field = f"metadata.annotations[{names.ANN_OPPORTUNISTIC}]"
    enabled = False
    if isinstance(raw, str):
        if raw not in ("true", "false"):
            errors.append(FieldError(field, f"must be true or false, got {show(raw)}"))
        elif raw == "true" and (bounds.min is None or bounds.max is None):
            # Growth needs a ceiling, and only an elastic job can change size.
            errors.append(
                FieldError(
                    field,
                    f"needs {names.ANN_MIN_REPLICAS} and {names.ANN_MAX_REPLICAS}: only an "
                    "elastic job with a maximum can grow into idle capacity",
                )
            )
        enabled = raw == "true"
    raw_class = annotations.get(names.ANN_OPPORTUNISTIC_PRIORITY_CLASS)
    if not isinstance(raw_class, str):
        return enabled, None
    if len(raw_class) > _MAX_SUBDOMAIN or not _DNS_SUBDOMAIN.fullmatch(raw_class):
        errors.append(
            FieldError(
                f"metadata.annotations[{names.ANN_OPPORTUNISTIC_PRIORITY_CLASS}]",
                f"must be a PriorityClass name (DNS-1123 subdomain), got {show(raw_class)}",
            )
        )
        return enabled, None
    return enabled, raw_class
