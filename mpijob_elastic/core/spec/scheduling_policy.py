"""``spec.runPolicy.schedulingPolicy``: what a gang scheduler's PodGroup takes from the job.

The fields and their meaning are training-operator 1.9's ``SchedulingPolicy``
(``minAvailable``, ``queue``, ``minResources``, ``priorityClass``,
``scheduleTimeoutSeconds``). Its CRD types them; ours keeps the object as given, so the
shapes are checked here, and a wrong one is an ``InvalidSpec`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpijob_elastic.core import quantity
from mpijob_elastic.core.shapes import FieldError, as_int, show

_INT32_MAX = 2**31 - 1
_FIELD = "spec.runPolicy.schedulingPolicy"


@dataclass(frozen=True)
class SchedulingPolicy:
    min_available: int | None = None
    queue: str = ""
    priority_class: str = ""
    # Resource name -> quantity, as given (None: unset, so computed from the pods).
    min_resources: Mapping[str, quantity.Quantity] | None = None
    schedule_timeout_seconds: int | None = None


def _int32(raw: Mapping[str, Any], key: str, errors: list[FieldError]) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    number = as_int(value)
    if number is None or not 0 <= number <= _INT32_MAX:
        errors.append(
            FieldError(
                f"{_FIELD}.{key}",
                f"must be a whole number from 0 to {_INT32_MAX}, got {show(value)}",
            )
        )
        return None
    return number


def _string(raw: Mapping[str, Any], key: str, errors: list[FieldError]) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        errors.append(FieldError(f"{_FIELD}.{key}", f"must be a string, got {show(value)}"))
        return ""
    return value


def _resources(
    raw: Mapping[str, Any], errors: list[FieldError]
) -> Mapping[str, quantity.Quantity] | None:
    value = raw.get("minResources")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errors.append(FieldError(f"{_FIELD}.minResources", f"must be an object, got {show(value)}"))
        return None
    found: dict[str, quantity.Quantity] = {}
    for name, text in value.items():
        parsed = quantity.parse(text)
        if parsed is None:
            errors.append(
                FieldError(f"{_FIELD}.minResources.{name}", f"must be a quantity, got {show(text)}")
            )
        else:
            found[str(name)] = parsed
    return found


def parse(value: Any, errors: list[FieldError]) -> SchedulingPolicy | None:
    """None when the job has no (or an empty) schedulingPolicy."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errors.append(FieldError(_FIELD, f"must be an object, got {show(value)}"))
        return None
    if not value:
        return None
    return SchedulingPolicy(
        min_available=_int32(value, "minAvailable", errors),
        queue=_string(value, "queue", errors),
        priority_class=_string(value, "priorityClass", errors),
        min_resources=_resources(value, errors),
        schedule_timeout_seconds=_int32(value, "scheduleTimeoutSeconds", errors),
    )
