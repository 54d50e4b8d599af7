"""The shapes of the JSON a pod template may hold, checked before render.py reads it.

The CRD keeps pod templates unpruned, so a template can hold any JSON at all. These checks
cover every part of a template that render.py reads or extends, so that whatever passes
renders without raising. Each check appends a FieldError naming the exact path and returns
the value in the shape the caller can use, or None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# render.py deep-copies a template recursively, which hits Python's recursion limit at
# about 500 levels. Real pod templates nest about 12 deep (affinity terms are the deepest).
_MAX_TEMPLATE_DEPTH = 64


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def show(value: Any) -> str:
    """The value as JSON, kept short: it lands in a condition message."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a number too large to be meant"  # and str() of it may raise
    if isinstance(value, str) and len(value) > 40:
        value = value[:40] + "..."
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return type(value).__name__


def as_int(value: Any) -> int | None:
    # bool is an int subclass in Python, but `replicas: true` is not a number to a user.
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def mapping(
    value: Any, field: str, errors: list[FieldError], *, required: bool = False
) -> Mapping[str, Any] | None:
    """The value as a mapping ({} if unset), or None after reporting why it is not one."""
    if value is None:
        if required:
            errors.append(FieldError(field, "Required value"))
            return None
        return {}
    if not isinstance(value, Mapping):
        errors.append(FieldError(field, f"must be an object, got {show(value)}"))
        return None
    return value


def string_field(
    value: Any, field: str, errors: list[FieldError], *, required: bool = False
) -> str | None:
    if value is None:
        if required:
            errors.append(FieldError(field, "Required value"))
            return None
        return ""
    if not isinstance(value, str):
        errors.append(FieldError(field, f"must be a string, got {show(value)}"))
        return None
    return value


def string_map(value: Any, field: str, errors: list[FieldError]) -> None:
    for key, item in (mapping(value, field, errors) or {}).items():
        if not isinstance(item, str):
            # Only the first bad entry: the message goes into a condition, whatever its size.
            errors.append(FieldError(f"{field}[{key}]", f"must be a string, got {show(item)}"))
            return


def _string_list(value: Any, field: str, errors: list[FieldError]) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        errors.append(FieldError(field, f"must be a list of strings, got {show(value)}"))
        return
    for i, item in enumerate(value):
        if not isinstance(item, str):
            errors.append(FieldError(f"{field}[{i}]", f"must be a string, got {show(item)}"))
            return


def _named_objects(
    value: Any, field: str, what: str, errors: list[FieldError]
) -> list[Mapping[str, Any]] | None:
    """A list of objects that each have a string ``name``, as most lists in a PodSpec are.

    ``what`` describes one entry (``"{name, value} object"``). None after reporting.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        errors.append(FieldError(field, f"must be a list of {what}s, got {show(value)}"))
        return None
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            errors.append(FieldError(f"{field}[{i}]", f"must be a {what}, got {show(item)}"))
            return None
        name = item.get("name")
        if not isinstance(name, str) or not name:
            message = (
                "Required value" if name in (None, "") else f"must be a string, got {show(name)}"
            )
            errors.append(FieldError(f"{field}[{i}].name", message))
            return None
    return value


def _container(container: Mapping[str, Any], field: str, errors: list[FieldError]) -> None:
    # Only what render reads or extends, and the lists it appends to; the API server checks
    # the rest when the pod is created, and that refusal is reported on the job too.
    _string_list(container.get("command"), f"{field}.command", errors)
    _string_list(container.get("args"), f"{field}.args", errors)
    env = _named_objects(container.get("env"), f"{field}.env", "{name, value} object", errors)
    for i, var in enumerate(env or []):
        value = var.get("value")
        if value is not None and not isinstance(value, str):
            errors.append(
                FieldError(f"{field}.env[{i}].value", f"must be a string, got {show(value)}")
            )
            break
    _named_objects(
        container.get("volumeMounts"), f"{field}.volumeMounts", "{name, mountPath} object", errors
    )
    resources = mapping(container.get("resources"), f"{field}.resources", errors)
    if resources is not None:
        mapping(resources.get("limits"), f"{field}.resources.limits", errors)
        mapping(resources.get("requests"), f"{field}.resources.requests", errors)


def _deeper_than(value: Any, limit: int) -> bool:
    # Iterative, because the point is to refuse what recursion cannot handle.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _without_null_lists(template: Mapping[str, Any]) -> Mapping[str, Any]:
    """The template without ``volumes: null`` and ``volumeMounts: null``.

    A YAML ``volumes:`` with every entry commented out is null, which the API server reads as
    unset; render appends to these lists, and appending to None raises.
    """
    pod = template["spec"]
    containers = pod["containers"]
    if pod.get("volumes", []) is not None and all(
        c.get("volumeMounts", []) is not None for c in containers
    ):
        return template
    pod = {k: v for k, v in pod.items() if not (k == "volumes" and v is None)}
    pod["containers"] = [
        {k: v for k, v in c.items() if not (k == "volumeMounts" and v is None)} for c in containers
    ]
    return {**template, "spec": pod}


def pod_template(value: Any, field: str, errors: list[FieldError]) -> Mapping[str, Any] | None:
    template = mapping(value, field, errors, required=True)
    if template is None:
        return None
    if _deeper_than(template, _MAX_TEMPLATE_DEPTH):
        errors.append(FieldError(field, f"must not nest more than {_MAX_TEMPLATE_DEPTH} levels"))
        return None
    before = len(errors)
    meta = mapping(template.get("metadata"), f"{field}.metadata", errors)
    if meta is not None:
        string_map(meta.get("labels"), f"{field}.metadata.labels", errors)
        string_map(meta.get("annotations"), f"{field}.metadata.annotations", errors)
    pod = mapping(template.get("spec"), f"{field}.spec", errors, required=True)
    if pod is not None:
        path = f"{field}.spec.containers"
        containers = _named_objects(pod.get("containers"), path, "container object", errors)
        if containers == []:
            errors.append(FieldError(path, "Required value: at least one container"))
        for i, container in enumerate(containers or []):
            _container(container, f"{path}[{i}]", errors)
        path = f"{field}.spec.initContainers"
        init = _named_objects(pod.get("initContainers"), path, "container object", errors)
        for i, container in enumerate(init or []):
            _container(container, f"{path}[{i}]", errors)
        _named_objects(pod.get("volumes"), f"{field}.spec.volumes", "volume object", errors)
    if len(errors) > before:
        return None
    return _without_null_lists(template)
