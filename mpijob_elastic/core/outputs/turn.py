"""One turn's outputs, gathered while the decisions are taken.

Every decision module (``lifecycle``, ``capacity``, ``drain``, ``reports``) returns its
values and adds what a turn reports besides them here: the job's next status (conditions
change only when a reader would see a change, ``status.py``), the Events, when to come back
(the earliest time any decision asked for), and the exec read of the launcher a drain or a
held host-list change wants where the launcher's reports say nothing (``ranks.py``).
``desired.py`` starts one per turn and turns it into the ``Desired``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mpijob_elastic.core import numbers
from mpijob_elastic.core.actions import Emit, Probe
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.outputs.status import StatusBuilder
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import Standing
from mpijob_elastic.core.settings import Settings

# Pod creates and deletes one reconcile may make. A job of a thousand workers then takes
# several turns, and the jobs queued behind it get theirs in between instead of waiting
# for a thousand round trips.
POD_WRITES_PER_TURN = 100
BUDGET = "PodDisruptionBudget"
GANG = "PodGroup"
# Pod status reasons that mean the node, not the program, ended the pod.
NODE_REASONS = frozenset({"Evicted", "NodeLost", "NodeShutdown", "Shutdown", "Terminated"})


@dataclass
class Turn:
    """The inputs of one job's turn, and the outputs its decisions add up."""

    observed: Observed
    settings: Settings
    now: datetime
    status: StatusBuilder
    events: list[Emit] = field(default_factory=list)
    requeue_after: float | None = None
    # Read the launcher's remote shells (ranks.py).
    probe: Probe | None = None
    # Where a job labelled for a Kueue queue stands there (kueue.py); None: not labelled.
    queue: Standing | None = None

    @classmethod
    def start(cls, observed: Observed, settings: Settings, now: datetime) -> Turn:
        queue = observed.queue
        standing = None if queue is None else kueue.standing(observed.job, queue, observed.refused)
        return cls(observed, settings, now, StatusBuilder(observed.job, now), queue=standing)

    @property
    def job(self) -> Mapping[str, Any]:
        return self.observed.job

    @property
    def job_name(self) -> str:
        return str(self.observed.job["metadata"]["name"])

    @property
    def state(self) -> Mapping[str, Any]:
        """What earlier turns stored on the job's ConfigMap (its annotations)."""
        config_map = self.observed.config_map or {}
        return (config_map.get("metadata") or {}).get("annotations") or {}

    def event(
        self, type_: str, reason: str, message: str, counts: tuple[tuple[str, int], ...] = ()
    ) -> None:
        self.events.append(Emit(type_, reason, message, counts))

    def requeue(self, seconds: float) -> None:
        """Come back after ``seconds`` at the latest."""
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def gone(self, uid: str) -> bool:
        """A pod whose delete the server accepted, although the cache still shows it."""
        return uid in self.observed.deleting


def count(value: object) -> int:
    """A counter the job's ConfigMap annotations hold; 0 if unset or edited into junk."""
    return numbers.whole(value) or 0
