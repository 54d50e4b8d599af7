"""Giving up on new workers that do not run, and trying again later.

A worker that is not running ``scale-out-timeout-seconds`` after its pod was created
(unschedulable: no node has the GPUs; an image that cannot be pulled) holds a place the
job cannot use. It is deleted, the job runs below its requested size and says why, and
no new worker is created until a backoff has passed (the timeout, doubling per failed
attempt, at most an hour); then the controller tries again. The state lives in an
annotation of the job's ConfigMap, so a restart neither forgets the backoff nor retries
at once.

``Worker.replicas`` is left as the user or the autoscaler wrote it: a controller that
rewrote it (et-operator rolls the count back) would fight an HPA and lose the user's
intent. The gap shows in the ``Scaling`` condition and in ``kubectl get mpijob`` (READY
below DESIRED) instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core.times import format_time, parse_time
from mpijob_elastic.core.workers import Worker

MAX_BACKOFF_SECONDS = 3600.0


@dataclass(frozen=True)
class Backoff:
    attempts: int
    retry_at: datetime
    reason: str

    def format(self) -> str:
        return f"{self.attempts} {format_time(self.retry_at)} {self.reason}"


def parse_backoff(value: object) -> Backoff | None:
    """The annotation's value, or None if unset or unreadable (then: no backoff)."""
    if not isinstance(value, str):
        return None
    parts = value.split(" ", 2)
    if len(parts) < 2 or not parts[0].isascii() or not parts[0].isdigit():
        return None
    retry_at = parse_time(parts[1])
    if retry_at is None:
        return None
    return Backoff(int(parts[0]), retry_at, parts[2] if len(parts) == 3 else "")


def next_backoff(previous: Backoff | None, now: datetime, timeout: float, why: str) -> Backoff:
    attempts = (previous.attempts if previous else 0) + 1
    delay = min(timeout * 2 ** min(attempts - 1, 20), MAX_BACKOFF_SECONDS)
    return Backoff(attempts, now + timedelta(seconds=delay), why)


def stuck(worker: Worker, main: str | None, now: datetime, timeout: float) -> bool:
    """A worker that has not run within the timeout (0: never given up)."""
    if timeout <= 0 or worker.terminating or worker.main_running(main):
        return False
    if worker.phase not in ("Pending", "Running"):
        return False  # failed or succeeded: the restart policy decides, not this
    return worker.created > 0 and now.timestamp() - worker.created >= timeout


def why_not_running(worker: Worker, main: str | None) -> str:
    """What the scheduler or the kubelet says, e.g. ``Unschedulable: 0/4 nodes are
    available: 4 Insufficient nvidia.com/gpu.``"""
    status: Mapping[str, Any] = worker.pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _one_line(condition.get("reason"), condition.get("message"))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return _one_line(waiting.get("reason"), waiting.get("message"))
    return f"pod {worker.phase}"


def _one_line(reason: object, message: object) -> str:
    text = ": ".join(str(p) for p in (reason, message) if p)
    return " ".join(text.split())[:300] or "not running"
