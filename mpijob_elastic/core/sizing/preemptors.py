"""Who took an opportunistic worker's room: the job's ``Preempted`` Event names the pod of
higher priority, ``preempted by <namespace>/<pod>`` (docs/capacity.md, "Giving capacity
back: preemption").

The ``DisruptionTarget`` condition the scheduler sets on a victim does not name the
preemptor; the scheduler's own ``Preempted`` Event on the victim does (its ``related``
object), and the controller's cache of those Events gives ``Observed.preemptors``. The
scheduler records that Event after it sets the condition and deletes the pod, through an
asynchronous broadcaster, so the turn that counts a victim usually comes first. The
victim is counted at once (the growth backoff does not wait); only the job's Event waits,
until every pending victim's preemptor is known or ``WAIT`` has passed, whichever is
first, in a requeue of the job's turn. The victims waiting are kept on the ConfigMap
(``names.ANN_PREEMPTED``, ``<deadline> <uid>/<pod> ...``), so that one whose pod is gone
by then is still named, and each victim is named in one Event only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.times import format_precise_time, format_time, parse_time
from mpijob_elastic.core.workers import Worker

# The scheduler's Event reaches the API server well within a second of the condition; a
# loaded server may take longer, and past this the Event goes without the names.
WAIT = timedelta(seconds=5)


@dataclass(frozen=True)
class Pending:
    """Victims counted whose Event waits for their preemptors, until ``deadline``."""

    deadline: datetime | None = None
    # (pod UID, pod name)
    victims: tuple[tuple[str, str], ...] = ()

    def format(self) -> str:
        if self.deadline is None or not self.victims:
            return ""
        victims = (f"{uid}/{name}" for uid, name in self.victims)
        return " ".join([format_precise_time(self.deadline), *victims])


def parse_pending(value: object) -> Pending:
    """The annotation's value; unset or unreadable reads as none waiting."""
    if not isinstance(value, str) or not value.strip():
        return Pending()
    first, *rest = value.split()
    deadline = parse_time(first)
    victims = tuple((u, n) for u, _, n in (v.partition("/") for v in rest) if u and n)
    return Pending(deadline, victims) if deadline is not None and victims else Pending()


def announce(
    turn: Turn, pending: Pending, victims: Sequence[Worker], why: str, retry_at: datetime
) -> Pending:
    """Adds the victims counted this turn to those waiting, and emits the ``Preempted``
    Event of all of them once each one's preemptor is known or the wait is over; returns
    those still waiting. ``why``: the condition's words; ``retry_at``: when growth may
    probe again."""
    if victims:
        deadline = pending.deadline or turn.now + WAIT
        pending = Pending(deadline, (*pending.victims, *((w.uid, w.name) for w in victims)))
    if pending.deadline is None or not pending.victims:
        return Pending()
    known = turn.observed.preemptors
    if (
        known is not None
        and turn.now < pending.deadline
        and not all(uid in known for uid, _ in pending.victims)
    ):
        turn.requeue((pending.deadline - turn.now).total_seconds())
        return pending
    turn.event(
        "Normal",
        "Preempted",
        message(pending.victims, known, why, retry_at),
        counts=(("preempted", len(pending.victims)),),
    )
    return Pending()


def message(
    victims: Sequence[tuple[str, str]],
    known: Mapping[str, str] | None,
    why: str,
    retry_at: datetime,
) -> str:
    """``known``: the preemptor (``<namespace>/<pod>``) by victim UID; None when this
    controller may not read the scheduler's Events."""
    by: dict[str, list[str]] = {}
    for uid, name in victims:
        by.setdefault((known or {}).get(uid, ""), []).append(name)
    parts = [f"{', '.join(pods)} preempted by {who}" for who, pods in by.items() if who]
    unnamed = by.get("")
    if unnamed:
        cause = f" ({why})" if why else ""
        parts.append(
            f"{', '.join(unnamed)} preempted by the scheduler for a pod of higher priority{cause}"
        )
    text = (
        f"opportunistic workers {'; '.join(parts)}; they leave gracefully, and the job grows "
        f"again at {format_time(retry_at)} at the earliest"
    )
    if not unnamed:
        return text
    if known is None:
        return (
            f"{text} (the scheduler's Preempted Event on each pod names the preemptor; this "
            "controller may not list and watch Events to name it here: docs/rbac.md)"
        )
    return f"{text} (the scheduler's Preempted Event on each pod names the preemptor)"
