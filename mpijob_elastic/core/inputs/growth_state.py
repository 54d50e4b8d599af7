"""The growth state an opportunistic job keeps on its ConfigMap (``names.ANN_GROWTH``), and
what the fleet's fair split reads of other jobs from it (opportunistic.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mpijob_elastic.core import names, numbers
from mpijob_elastic.core.times import format_precise_time, parse_time


def _count(value: str) -> int:
    return numbers.whole(value) or 0


@dataclass(frozen=True)
class GrowthState:
    """What a job's ConfigMap keeps: its opportunistic workers, and the growth backoff."""

    workers: int = 0
    attempts: int = 0
    # When growth last failed (unschedulable or preempted), and when it may probe again.
    since: datetime | None = None
    retry_at: datetime | None = None
    why: str = ""

    def format(self) -> str:
        if not self.workers and not self.attempts:
            return ""
        times = " ".join(format_precise_time(t) if t else "-" for t in (self.since, self.retry_at))
        return f"{self.workers} {self.attempts} {times} {self.why}".rstrip()

    def hungry(self) -> bool:
        """Asked for more and was refused: its backoff is on."""
        return self.attempts > 0 and self.since is not None

    def waiting(self, now: datetime, changed: datetime | None) -> bool:
        """Whether the pause is on: before retry_at, and no capacity change since."""
        if self.retry_at is None or now >= self.retry_at:
            return False
        return not (changed is not None and self.since is not None and changed > self.since)


def parse_growth(value: object) -> GrowthState:
    """The annotation's value; unset or unreadable parts read as none."""
    if not isinstance(value, str):
        return GrowthState()
    parts = [*value.split(" ", 4), "", "", "", ""]
    return GrowthState(
        _count(parts[0]), _count(parts[1]), parse_time(parts[2]), parse_time(parts[3]), parts[4]
    )


@dataclass(frozen=True)
class Share:
    """Another opportunistic job, as its ConfigMap's growth state shows it."""

    job: str
    workers: int
    hungry_since: datetime | None


def share(job: str, config_map: Mapping[str, Any]) -> Share | None:
    """The fleet's view of one job's ConfigMap; None if it has no growth state."""
    annotations = (config_map.get("metadata") or {}).get("annotations") or {}
    if names.ANN_GROWTH not in annotations:
        return None
    state = parse_growth(annotations[names.ANN_GROWTH])
    return Share(job, state.workers, state.since if state.hungry() else None)
