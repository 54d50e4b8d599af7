"""What one pod of a pod template charges Kueue's quota, and whether a Workload charges what
the job's pods would now request (docs/scheduling.md, "Quota that holds").

Kueue charges a Workload its pod sets' requests, counted as Kueue counts a pod's: each
container's requests (a limit stands in for the request of its resource, as the API server
defaults a pod), the containers summed, the init containers' largest taken where it is
larger, the pod's overhead added. The job's templates can be edited after its Workload was
written; only what is counted here is compared, since the server defaults the rest of the
Workload's copy of a template.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from mpijob_elastic.core import quantity
from mpijob_elastic.core.quantity import Quantity

Charge = dict[str, Quantity]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _container(container: Any) -> Charge:
    resources = _map(_map(container).get("resources"))
    counted: Charge = {}
    for source in (_map(resources.get("limits")), _map(resources.get("requests"))):
        for name, text in source.items():
            value = quantity.parse(text)
            if value is not None:
                counted[str(name)] = value
    return counted


def pod_charge(template: Mapping[str, Any]) -> Charge:
    """One pod's requests, as Kueue counts them."""
    spec = _map(template.get("spec"))
    total: Charge = {}
    for container in _list(spec.get("containers")):
        for name, value in _container(container).items():
            total[name] = total[name] + value if name in total else value
    for container in _list(spec.get("initContainers")):
        for name, value in _container(container).items():
            if name not in total or value.value > total[name].value:
                total[name] = value
    for name, text in _map(spec.get("overhead")).items():
        extra = quantity.parse(text)
        if extra is not None:
            total[str(name)] = total[str(name)] + extra if name in total else extra
    return total


def beyond(wanted: Charge, charged: Charge) -> list[str]:
    """Each resource ``wanted`` asks more of than ``charged`` holds, as ``name a > b``."""
    zero = Quantity(Decimal(0), quantity.DECIMAL_SI)
    return [
        f"{name} {value} > {charged.get(name, zero)}"
        for name, value in sorted(wanted.items())
        if value.value > charged.get(name, zero).value
    ]
