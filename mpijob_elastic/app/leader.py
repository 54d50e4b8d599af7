"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Two replicas run; the one holding the Lease reconciles and writes, the other keeps its
caches synced and waits, so a take-over needs no relist. The rules, as client-go's
``leaderelection`` package has them:

* The Lease names its holder and for how long a renewal holds. Clocks of different
  machines are never compared: a candidate takes the Lease over only once it has seen the
  same record, unchanged, for the record's whole ``leaseDurationSeconds`` on its own
  monotonic clock. A live leader renews every retry period, which changes the record.
* Every write of the Lease is a PUT carrying the resourceVersion read just before (or a
  create when there is none), so two candidates racing for it cannot both win: the
  loser gets 409 and reads again.
* A leader that has not renewed for the renew deadline (shorter than the lease duration)
  takes itself for deposed: it stops writing at once and the process exits non-zero. A
  candidate takes over no sooner than the lease duration after it saw the last renewal,
  so the old leader has stopped by then, with lease duration minus renew deadline to
  spare for its in-flight requests (which the writes' own preconditions also guard).
* A leader that shuts down on purpose releases the Lease (no holder, a 1 s duration), so
  the standby takes over on its next try instead of after a whole lease duration.

The decisions are pure functions of what was read and when (``observe``, ``decide``,
``claim``, ``released``, ``deposed``); ``Elector`` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.kube import ApiError, Kube

log = logging.getLogger("mpijob_elastic.app.leader")

Obj = dict[str, Any]

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# client-go waits between a retry period and 1.2 retry periods more between tries, so
# candidates started together do not keep colliding.
JITTER = 1.2
# How long a release may take: the process is on its way out.
RELEASE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Timings:
    """client-go's defaults: a 15 s lease, renewed every 2 s, given up after 10 s."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problems(self) -> list[str]:
        """Why these timings cannot keep two leaders apart (empty: they can)."""
        found = []
        if self.retry_period <= 0:
            found.append("the retry period must be positive")
        if self.renew_deadline <= JITTER * self.retry_period:
            found.append(f"the renew deadline must exceed {JITTER} retry periods")
        if self.lease_duration <= self.renew_deadline:
            found.append("the lease duration must exceed the renew deadline")
        return found


@dataclass(frozen=True)
class Record:
    """The Lease's spec: who holds it, since when, for how long a renewal holds."""

    holder: str
    duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @staticmethod
    def of(lease: Mapping[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return Record(
            holder=str(spec.get("holderIdentity") or ""),
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> Obj:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Observation:
    """A record, and when (monotonic seconds) this process first saw it as it is."""

    record: Record
    since: float


class Step(Enum):
    CREATE = "create"  # there is no Lease yet
    ACQUIRE = "acquire"  # free, released, or its holder stopped renewing
    RENEW = "renew"  # ours
    WAIT = "wait"  # someone else's, and alive


def observe(previous: Observation | None, record: Record, now: float) -> Observation:
    """The expiry clock restarts whenever the record changes: a renewal is a change."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def decide(observed: Observation | None, me: str, now: float) -> Step:
    if observed is None:
        return Step.CREATE
    record = observed.record
    if record.holder == me:
        return Step.RENEW
    if record.holder and now < observed.since + record.duration_seconds:
        return Step.WAIT
    return Step.ACQUIRE


def claim(record: Record | None, me: str, timings: Timings, wall: datetime) -> Record:
    """The record to write to hold the Lease from now: renewed, or taken over."""
    now = format_precise_time(wall)
    # A Lease counts whole seconds; never less than asked for.
    duration = max(1, math.ceil(timings.lease_duration))
    if record is not None and record.holder == me:
        return replace(record, duration_seconds=duration, renew_time=now)
    transitions = 0 if record is None else record.transitions + 1
    return Record(me, duration, now, now, transitions)


def released(record: Record, wall: datetime) -> Record:
    """client-go's ReleaseOnCancel: no holder, and a duration that is over at once."""
    now = format_precise_time(wall)
    return Record("", 1, now, now, record.transitions)


def deposed(last_renewed: float, now: float, timings: Timings) -> bool:
    """A leader that has not renewed for the renew deadline must stop writing."""
    return now - last_renewed >= timings.renew_deadline


def default_identity() -> str:
    """The pod's name (its hostname) and a random suffix, so a restarted pod is new."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace(env: Mapping[str, str], in_cluster: Path | None = None) -> str:
    """The pod's own namespace: POD_NAMESPACE (the downward API), else the ServiceAccount's
    mounted namespace file; empty outside a pod."""
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return (in_cluster or IN_CLUSTER_NAMESPACE).read_text().strip()
    except OSError:
        return ""


class Elector:
    """The I/O: reads and writes one Lease, decides with the functions above."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timings: Timings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timings = timings
        self._clock = clock
        self._observed: Observation | None = None
        self._resource_version: str | None = None
        # When the last successful write of the Lease was sent (monotonic seconds).
        self._renewed_at = 0.0
        self.leading = False
        # Read at each scrape, so it is never out of step with the flag the workers obey.
        metrics.IS_LEADER.set_function(lambda: 1.0 if self.leading else 0.0)

    def _lease(self, record: Record) -> Obj:
        metadata: Obj = {"name": self.name, "namespace": self.namespace}
        if self._resource_version is not None:
            metadata["resourceVersion"] = self._resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.spec(),
        }

    def _seen(self, lease: Obj, at: float) -> Record:
        record = Record.of(lease)
        self._observed = observe(self._observed, record, at)
        self._resource_version = str(lease["metadata"]["resourceVersion"])
        return record

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, write it if it is ours to take; whether we hold it."""
        now = self._clock()
        try:
            record: Record | None = self._seen(
                await self.kube.get("Lease", self.namespace, self.name), now
            )
        except ApiError as err:
            if not err.not_found:
                raise
            record, self._observed, self._resource_version = None, None, None
        step = decide(self._observed, self.identity, now)
        if step is Step.WAIT:
            return False
        lease = self._lease(claim(record, self.identity, self.timings, datetime.now(UTC)))
        try:
            written = await (
                self.kube.create(lease) if step is Step.CREATE else self.kube.replace(lease)
            )
        except ApiError as err:
            if err.conflict or err.reason == "AlreadyExists":
                return False  # another candidate wrote first: read again next round
            raise
        self._seen(written, now)
        self._renewed_at = now
        return True

    async def _attempt(self, within: float) -> bool:
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), within)
        # Whatever went wrong (an answer, a dropped connection, a timeout), the Lease is
        # not ours this round; the loops around this must never die of it.
        except Exception as err:
            log.warning(
                "could not read or write the lease",
                extra={"lease": f"{self.namespace}/{self.name}", "error": str(err) or repr(err)},
            )
            return False

    def _pause(self) -> float:
        return self.timings.retry_period * (1 + random.uniform(0, JITTER - 1))

    async def acquire(self) -> None:
        """Return once this process holds the Lease."""
        log.info(
            "waiting to lead",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )
        while True:
            if await self._attempt(self.timings.renew_deadline):
                break
            await asyncio.sleep(self._pause())
        self.leading = True
        log.info(
            "became the leader",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )

    async def hold(self) -> str:
        """Renew every retry period; return why leadership was lost (never returns while
        leading). Each attempt is cut off at the renew deadline, so a hung request cannot
        keep a deposed leader writing."""
        while True:
            deadline = self._renewed_at + self.timings.renew_deadline
            await asyncio.sleep(min(self.timings.retry_period, max(0.0, deadline - self._clock())))
            started = self._clock()
            if deposed(self._renewed_at, started, self.timings):
                break
            remaining = self._renewed_at + self.timings.renew_deadline - started
            if await self._attempt(remaining):
                continue
            observed = self._observed
            if observed is not None and observed.record.holder not in ("", self.identity):
                self.leading = False
                return f"the lease is held by {observed.record.holder}"
            if deposed(self._renewed_at, self._clock(), self.timings):
                break
        self.leading = False
        return f"no renewal within the renew deadline ({self.timings.renew_deadline:g}s)"

    async def _release(self) -> bool:
        # Read afresh: a renewal cancelled on its way (the shutdown cuts the renew loop
        # short) may have landed, leaving the resourceVersion we hold behind.
        lease = await self.kube.get("Lease", self.namespace, self.name)
        record = self._seen(lease, self._clock())
        if record.holder != self.identity:
            return False
        await self.kube.replace(self._lease(released(record, datetime.now(UTC))))
        return True

    async def release(self) -> None:
        """Give the Lease up so the standby takes over on its next try; best effort."""
        if not self.leading:
            return
        self.leading = False
        try:
            if not await asyncio.wait_for(self._release(), RELEASE_TIMEOUT_SECONDS):
                return
        except Exception as err:
            log.warning(
                "could not release the lease; the standby takes over when it expires",
                extra={"lease": f"{self.namespace}/{self.name}", "error": str(err) or repr(err)},
            )
            return
        log.info("released the lease", extra={"lease": f"{self.namespace}/{self.name}"})
