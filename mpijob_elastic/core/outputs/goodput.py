"""How a job's time went: training at its size, reduced, resetting, waiting, stopped
(docs/operations.md, "Goodput").

Each turn names the job's state from what it decided, and ``status.goodput`` keeps the
seconds spent in each state up to the last change, with the state in force and since when.
Nothing is written while the state holds: /metrics adds the time since the change at each
scrape (machinery/metrics.py), and the status is written only with a change, which the
turn writes anyway. A loss (fewer workers training than the target, with the target
unchanged) is remembered as ``lostAt`` until the job trains at its target again: the
time to recover, which the shell observes from the status write (metrics.status_written).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from mpijob_elastic.core import numbers
from mpijob_elastic.core.times import format_precise_time, parse_time

FULL = "training_full"
REDUCED = "training_reduced"
RESETTING = "resetting"
WAITING = "waiting"
STOPPED = "stopped"
# The states /metrics counts time in; a finished job's time stops (ENDED).
STATES = (FULL, REDUCED, RESETTING, WAITING, STOPPED)
ENDED = "ended"
# The seconds kept in the status, per state: a tenth of a second, read up to a century.
_MAX_SECONDS = 100 * 365 * 86400


def training(holders: int, committed: int, target: int) -> str:
    """A job that runs: ``holders`` workers hold ranks, ``committed`` of them past their
    reset (host_rules.py), of ``target`` workers it should train on."""
    if holders == 0:
        return WAITING
    if committed < holders:
        return RESETTING
    return FULL if committed >= target else REDUCED


def _seconds(value: Any) -> float:
    """A count of seconds this controller wrote: a whole or a tenths' count, else 0."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float) and 0 <= value <= _MAX_SECONDS:
        return float(value)
    return 0.0


def _kept(raw: Any) -> dict[str, float]:
    """The seconds per state the status holds, those it holds none of left out."""
    if not isinstance(raw, Mapping):
        return {}
    return {s: v for s in STATES if (v := _seconds(raw.get(s)))}


def account(previous: Any, state: str, target: int, now: datetime) -> Any:
    """The next ``status.goodput`` after ``previous`` (as the status holds it, any JSON),
    with the job in ``state`` of ``target`` workers now; ``previous`` itself when neither
    changed, so the status is not rewritten."""
    before: Mapping[str, Any] = previous if isinstance(previous, Mapping) else {}
    old_state = before.get("state")
    old_target = numbers.whole(before.get("target"))
    if old_state == state and old_target == target:
        return previous
    since = parse_time(before.get("since"))
    seconds = _kept(before.get("seconds"))
    if old_state in STATES and since is not None and now > since:
        seconds[str(old_state)] = seconds.get(str(old_state), 0.0) + (now - since).total_seconds()
    lost_at = parse_time(before.get("lostAt"))
    if state in (FULL, STOPPED, ENDED):
        lost_at = None
    elif old_state == FULL and (old_target is None or target <= old_target):
        lost_at = now
    found: dict[str, Any] = {
        "state": state,
        "since": format_precise_time(now),
        "target": target,
        "seconds": {s: round(v, 1) for s, v in sorted(seconds.items())},
    }
    if lost_at is not None:
        found["lostAt"] = format_precise_time(lost_at)
    return found


def recovered(old: Any, new: Any) -> float | None:
    """Seconds from a loss to training at the target again, if ``new`` is that return."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)) or new.get("state") != FULL:
        return None
    lost, back = parse_time(old.get("lostAt")), parse_time(new.get("since"))
    if lost is None or back is None or back < lost:
        return None
    return (back - lost).total_seconds()


def totals(goodput: Any, now: datetime) -> dict[str, float]:
    """The seconds in each state until ``now``: the status's, and the time since its last
    change in the state in force."""
    if not isinstance(goodput, Mapping):
        return {}
    found = _kept(goodput.get("seconds"))
    state, since = goodput.get("state"), parse_time(goodput.get("since"))
    if state in STATES and since is not None and now > since:
        found[str(state)] = found.get(str(state), 0.0) + (now - since).total_seconds()
    return found
