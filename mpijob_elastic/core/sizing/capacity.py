"""How many workers the job should have now, and how long to wait for ones that do not come.

* The target is ``Worker.replicas`` when within the job's bounds; a value outside them is
  refused (``InvalidSpec``, reason ``ReplicasOutOfRange``) and the job keeps the count it
  was last given within them (kept on the ConfigMap).
* Failing workers are replaced at once the first time, then after a pause doubling from
  10 s to at most 5 min (an OOM-killed worker is not recreated in a tight loop); ten
  minutes without a failure forget them. No new worker is created during the pause.
* Scale-out: a worker that is not running ``scale-out-timeout-seconds`` after its pod was
  created (unschedulable: no node has the GPUs; an image that cannot be pulled) holds a
  place the job cannot use. It is deleted, the job runs below its requested size and says
  why, and no new worker is created until a backoff has passed (the timeout, doubling per
  failed attempt, at most an hour); then the controller tries again. The state lives in
  an annotation of the job's ConfigMap, so a restart neither forgets the backoff nor
  retries at once. ``Worker.replicas`` is left as the user or the autoscaler wrote it: a
  controller that rewrote it (et-operator rolls the count back) would fight an HPA and
  lose the user's intent. The gap shows in the ``Scaling`` condition and in ``kubectl get
  mpijob`` (READY below DESIRED) instead.
* Workers on nodes that are going away (``drain.relocate``) stay until their replacements
  take ranks elsewhere (make before break): the target grows by them meanwhile.
* Below the minimum: since when a running elastic job has had fewer than ``min-replicas``
  workers listed, for ``run_policy.py``'s suspension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names, numbers
from mpijob_elastic.core.outputs.status import INVALID
from mpijob_elastic.core.outputs.turn import NODE_REASONS, Turn, count
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_precise_time, format_time, parse_time
from mpijob_elastic.core.workers import Worker, hostfile_workers

MAX_BACKOFF_SECONDS = 3600.0
WORKER_BACKOFF_SECONDS = 10.0
WORKER_BACKOFF_MAX_SECONDS = 300.0
WORKER_FAILURES_FORGOTTEN_SECONDS = 600.0


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
    attempts = numbers.whole(parts[0])
    retry_at = parse_time(parts[1]) if len(parts) >= 2 else None
    if attempts is None or retry_at is None:
        return None
    return Backoff(attempts, retry_at, parts[2] if len(parts) == 3 else "")


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


@dataclass(frozen=True)
class WorkerFailures:
    """Worker failures in a row, and when the last one was seen."""

    count: int = 0
    last: datetime | None = None
    # UIDs of the failed pods already in ``count`` and not yet gone: a turn whose delete
    # of them failed after the count was written must not count them again.
    counted: frozenset[str] = frozenset()

    def format(self) -> str:
        if not self.last:
            return ""
        text = f"{self.count} {format_precise_time(self.last)}"
        return f"{text} {','.join(sorted(self.counted))}" if self.counted else text


def worker_failures(turn: Turn, replacing: Sequence[Worker]) -> WorkerFailures:
    """The failures so far, counting the workers replaced now unless their node caused
    them (those say nothing of the program)."""
    number, at, uids = [
        *str(turn.state.get(names.ANN_WORKER_FAILURES) or "").split(" ", 2),
        "",
        "",
    ][:3]
    failures, last = count(number), parse_time(at)
    counted = frozenset(uids.split(",")) - {""}
    if last is None or (turn.now - last).total_seconds() >= WORKER_FAILURES_FORGOTTEN_SECONDS:
        failures, last, counted = 0, None, frozenset()
    own = [w for w in replacing if not (w.reason in NODE_REASONS or w.disrupted)]
    new = [w for w in own if w.uid not in counted]
    if new:
        failures, last = failures + len(new), turn.now
    return WorkerFailures(failures, last, frozenset(w.uid for w in own))


def _worker_pause(failures: int) -> timedelta:
    """The first failure is replaced at once; then 10 s, 20 s, ... at most 5 min."""
    if failures <= 1:
        return timedelta(0)
    seconds = WORKER_BACKOFF_SECONDS * 2 ** min(failures - 2, 10)
    return timedelta(seconds=min(seconds, WORKER_BACKOFF_MAX_SECONDS))


def paused(
    turn: Turn,
    wanted: int,
    workers: Sequence[Worker],
    failed: Sequence[Worker],
    failures: WorkerFailures,
) -> int:
    """``wanted``, held while the replacement of ``failed`` workers pauses."""
    if failures.last is None:
        return wanted
    until = failures.last + _worker_pause(failures.count)
    if turn.now >= until:
        return wanted
    return _hold(turn, wanted, workers, {w.name for w in failed}, until)


def within_bounds(turn: Turn, spec: JobSpec, workers: Sequence[Worker]) -> int:
    """How many workers the job should have: Worker replicas, if within bounds."""
    replicas = spec.worker.replicas
    if spec.bounds.contains(replicas):
        return replicas
    # Refuse the value: keep the count the job was last given within its bounds, as if the
    # edit had been refused at admission. Not what it has now: workers failed or lost
    # meanwhile are still replaced, and new ones not running yet are still wanted.
    kept = numbers.whole(turn.state.get(names.ANN_WORKERS))
    if kept is not None:
        keep = spec.bounds.clamp(kept)
    else:
        # No count kept (a new job, or one last reconciled before the count was): the
        # workers it has (its last hostfile, else its pods), or the nearest bound.
        members = hostfile_workers(spec.name, (turn.observed.config_map or {}).get("data"))
        held = [w for w in workers if not w.terminating and not w.marked]
        had = len(members) or len(held)
        keep = spec.bounds.clamp(had if had else replicas)
    message = (
        f"spec.mpiReplicaSpecs.Worker.replicas: {replicas} is outside the job's bounds "
        f"{spec.bounds.describe()} (annotations {names.ANN_MIN_REPLICAS}, "
        f"{names.ANN_MAX_REPLICAS}); keeping {keep} workers"
    )
    if turn.status.set(INVALID, True, "ReplicasOutOfRange", message):
        turn.event("Warning", "ReplicasOutOfRange", message)
    return keep


def _hold(
    turn: Turn, target: int, workers: Sequence[Worker], going: set[str], until: datetime
) -> int:
    """No new workers until ``until``: the target is at most the workers that stay
    (neither leaving already nor in ``going``)."""
    staying = [
        w for w in workers if not w.terminating and not turn.gone(w.uid) and w.name not in going
    ]
    turn.requeue((until - turn.now).total_seconds())
    return min(target, len(staying))


@dataclass(frozen=True)
class ScaleOut:
    """The scale-out backoff in force, and the new workers given up on now."""

    backoff: Backoff | None
    given_up: Sequence[Worker] = ()

    def waiting(self, now: datetime) -> bool:
        """Whether the job runs below its requested size until the backoff is over."""
        return self.backoff is not None and now < self.backoff.retry_at


def scale_out(
    turn: Turn, spec: JobSpec, workers: Sequence[Worker], target: int, retry_now: bool
) -> ScaleOut:
    """Give up on new workers not running within the scale-out timeout, and back off;
    ``retry_now``: the user changed the suspended job, so the backoff is over."""
    stored = parse_backoff(turn.state.get(names.ANN_SCALE_OUT_BACKOFF))
    backoff = None if retry_now else stored
    # Only an elastic job can run below its requested size: one without min-replicas
    # needs every worker (v1), so it waits for them however long it takes.
    timeout = spec.scale_out_timeout if spec.bounds.min is not None else 0.0
    main = spec.main_container
    given_up = []
    for w in workers:
        if turn.gone(w.uid):
            continue
        if stuck(w, main, turn.now, timeout):
            given_up.append(w)
        elif timeout > 0 and not w.terminating and not w.main_running(main) and w.created:
            turn.requeue(w.created + timeout - turn.now.timestamp())
    if not given_up:
        return ScaleOut(backoff)
    why = why_not_running(given_up[0], main)
    backoff = next_backoff(backoff, turn.now, timeout, why)
    turn.event(
        "Warning",
        "ScaleOutTimedOut",
        f"worker pods {', '.join(w.name for w in given_up)} were not running within "
        f"{timeout:g}s ({why}): deleting them; the job runs below its requested "
        f"{target} workers and tries again at {format_time(backoff.retry_at)} "
        f"(attempt {backoff.attempts}); Worker replicas is left as it is",
    )
    return ScaleOut(backoff, given_up)


@dataclass(frozen=True)
class Target:
    """How many workers the job wants now, and its workers on nodes that are going away."""

    workers: int
    # Staying until their replacements take ranks elsewhere, with why.
    moving: Mapping[str, str] = field(default_factory=dict)
    # Leaving now: the workers elsewhere are enough.
    relocate: Mapping[str, str] = field(default_factory=dict)


def target(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    wanted: int,
    out: ScaleOut,
    relocate: Mapping[str, str],
) -> Target:
    """``wanted`` held during a scale-out backoff, and grown by the workers that move."""
    waiting = out.waiting(turn.now)
    if waiting and out.backoff is not None:
        going = {w.name for w in out.given_up}
        wanted = _hold(turn, wanted, workers, going, out.backoff.retry_at)
    main = spec.main_container
    elsewhere = sum(1 for w in workers if w.name not in relocate and w.can_take_ranks(main))
    if not relocate or elsewhere >= wanted:
        return Target(wanted, relocate=relocate)
    # Make before break: the workers on going nodes stay until their replacements take
    # ranks elsewhere (their eviction, if it comes first, is a graceful leave of its
    # own), so a cordon with nowhere to go costs the job nothing.
    return Target(wanted if waiting else wanted + len(relocate), moving=relocate)


def below_min_since(
    turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None, listed: int
) -> datetime | None:
    """Since when the running job has had fewer than min-replicas workers listed, if it
    has now; None otherwise (also while it is suspended: ``lifecycle.suspension``)."""
    if spec.below_min_timeout <= 0 or not spec.bounds.min:
        return None
    # Only a launcher that runs has anything to lose; before its first start the
    # scale-out timeout alone deals with capacity that does not come.
    if launcher is None or launcher["metadata"].get("deletionTimestamp"):
        return None
    if listed >= spec.bounds.min:
        return None
    return parse_time(turn.state.get(names.ANN_BELOW_MIN_SINCE)) or turn.now


def below_min_too_long(turn: Turn, spec: JobSpec, since: datetime) -> bool:
    """Whether the job has been below its minimum for ``below-min-timeout-seconds``."""
    due = since + timedelta(seconds=spec.below_min_timeout)
    if turn.now >= due:
        return True
    turn.requeue((due - turn.now).total_seconds())
    return False
