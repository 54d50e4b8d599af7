"""The job's Events, sent in the background so that no turn waits for them.

An Event is a courtesy: one lost (a timeout, a lost connection) is logged and never fails
the turn that made it, and at most a few are in flight at once, so a burst of them cannot
take the connections that host-list writes need (writer.py's lanes).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Emit
from mpijob_elastic.core.times import format_time
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.kube import ApiError, Kube

log = logging.getLogger("mpijob_elastic.machinery.writer")

Obj = dict[str, Any]


def _job(job: Mapping[str, Any]) -> str:
    return f"{job['metadata']['namespace']}/{job['metadata']['name']}"


class EventRecorder:
    """Creates the Events of the jobs' turns, ``slots`` at a time."""

    def __init__(self, kube: Kube, slots: int) -> None:
        self.kube = kube
        self._slots = asyncio.Semaphore(slots)
        self._pending: set[asyncio.Task[None]] = set()

    def emit_soon(self, job: Obj, event: Emit) -> None:
        """Send the Event in the background: the job's next turn must not wait for it
        (a worker that turned Running while its creator's ScaledUp Event was being sent
        waited for that round trip before its host list was written)."""
        # Counted as the turn reports it, whether or not the Event's create goes through.
        metrics.event_sent(event)
        task = asyncio.create_task(self._emit_bounded(job, event), name="event")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _emit_bounded(self, job: Obj, event: Emit) -> None:
        async with self._slots:
            try:
                await self.emit(job, event)
            except Exception as err:  # a lost connection, a timeout: nobody awaits this task
                log.warning(
                    "could not record event",
                    extra={"job": _job(job), "reason": event.reason, "error": str(err)},
                )

    async def close(self, grace_seconds: float = 2.0) -> None:
        """Send the Events still waiting, for at most ``grace_seconds``, and drop the rest."""
        if not self._pending:
            return
        _, pending = await asyncio.wait(set(self._pending), timeout=grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def emit(self, job: Obj, event: Emit) -> None:
        meta = job["metadata"]
        now = format_time(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": event.reason,
            "message": event.message,
            "type": event.type,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "mpijob-elastic"},
            "reportingComponent": "mpijob-elastic",
        }
        try:
            await self.kube.create(body)
        except ApiError as err:
            # An Event is a courtesy; losing one must not fail the reconcile that made it.
            log.warning(
                "could not record event",
                extra={"job": _job(job), "reason": event.reason, "error": str(err)},
            )
