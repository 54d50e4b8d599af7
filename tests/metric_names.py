"""Metric names as the controller's registry has them, so that no test spells one out and
a renamed series fails the tests that read it instead of passing on a stale copy."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.registry import Collector

from mpijob_elastic.machinery import metrics


def family(metric: Collector) -> str:
    """A metric's family name: a counter's samples add ``_total``, a histogram's
    ``_bucket``, ``_count`` and ``_sum``."""
    (collected,) = metric.collect()
    return collected.name


def families(metric: Collector) -> list[str]:
    """The family names of a collector that yields several."""
    return [collected.name for collected in metric.collect()]


def total(counter: Collector) -> str:
    return f"{family(counter)}_total"


def every_family() -> list[str]:
    """Each family the controller registers (the library's process_ and python_ left out)."""
    prefix = f"{metrics.PREFIX}_"
    return sorted({m.name for m in REGISTRY.collect() if m.name.startswith(prefix)})
