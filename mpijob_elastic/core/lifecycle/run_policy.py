"""The job's life as runPolicy shapes it: start, suspend and resume, restart, fail, finish.

* ``runPolicy.suspend``, as training-operator does it: everything stops, a resume starts
  the training again from the user's checkpoint, and the active deadline counts from it.
* ``runPolicy.activeDeadlineSeconds``, from ``startTime``: past it the job fails and
  ``cleanPodPolicy`` applies; ``ttlSecondsAfterFinished`` deletes the finished job.
* ``runPolicy.backoffLimit``: a launcher its node or a signal stopped (under OnFailure,
  ExitCode or Always), or that vanished while the job ran, is started again, at most that
  many times; then the job fails.
* Below the minimum for too long: Horovod's elastic driver trains only while at least
  ``--min-np`` slots are there; below that it waits ``--elastic-timeout`` and fails the
  whole run, although a spot job's capacity may come back minutes later. With
  ``mpijob-elastic.io/below-min-timeout-seconds`` set, a running elastic job that has had
  fewer than ``min-replicas`` workers listed for that long is suspended instead: launcher
  and workers deleted, the job, its ConfigMap and RBAC kept, ``Suspended`` with reason
  ``WaitingForCapacity``. The suspended job creates its workers at once (Pending pods are
  what a cluster autoscaler provisions nodes for) and starts a new launcher, resuming from
  the user's last checkpoint, as soon as ``min-replicas`` of them run. If the scale-out
  timeout passes first, every worker of the attempt is deleted and the next attempt waits
  out the scale-out backoff (``capacity.py``). A user who changes the job (its spec, or
  ``min-replicas``) gets a new attempt at once. The state lives in annotations of the
  job's ConfigMap, so a restart keeps the clock and the suspension.
* The checkpoint window: a suspension below the minimum, the one full stop the controller
  decides, first posts a job-stopping notice to every pod (notices.py) and goes ahead
  ``mpijob-elastic.io/checkpoint-seconds`` later (0: at once), so the training can save a
  checkpoint; the job's requeue brings the turn back then, no timer. Back at its minimum
  in the window, the job runs on and the notice is removed. Kueue's eviction of the job's
  Workload (kueue.py) is stopped the same way: a ``job-stopping`` notice (cause
  ``queue-evicted``), and the pods deleted one window after the eviction; its quota is
  held until they are gone (kueue_writes.py). A user's runPolicy.suspend and a deletion of
  the job are never delayed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle import notices
from mpijob_elastic.core.outputs.status import (
    CREATED,
    FAILED,
    INVALID,
    RESTARTING,
    RUNNING,
    SCALING,
    SUCCEEDED,
    SUSPENDED,
    replica_statuses,
)
from mpijob_elastic.core.outputs.turn import NODE_REASONS, POD_WRITES_PER_TURN, Turn, count
from mpijob_elastic.core.sizing.capacity import Backoff
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.times import format_time, parse_time
from mpijob_elastic.core.workers import Worker


@dataclass(frozen=True)
class Suspension:
    since: datetime
    # What the user had set when the job was suspended or last retried (``intent``): a
    # change is the user asking for a new attempt now.
    intent: str

    def format(self) -> str:
        return f"{format_time(self.since)} {self.intent}"


def parse_suspension(value: object) -> Suspension | None:
    """The annotation's value, or None if unset or unreadable (then: not suspended)."""
    if not isinstance(value, str):
        return None
    since, _, intent = value.partition(" ")
    at = parse_time(since)
    return Suspension(at, intent) if at is not None else None


def intent(job: Mapping[str, Any], spec: JobSpec) -> str:
    """What the user controls that may let the job run: its spec (the generation counts
    every edit of it) and its bounds, which live in annotations."""
    generation = (job.get("metadata") or {}).get("generation")
    return f"{generation}/{spec.bounds.min}/{spec.bounds.max}"


@dataclass(frozen=True)
class Restarts:
    """The launcher's restarts, counting this turn's, and whether it restarts now."""

    done: int
    now: bool = False


def created(turn: Turn, workers: Sequence[Worker], launcher: Mapping[str, Any] | None) -> None:
    """What every status says, whatever else the turn decides."""
    s = turn.status
    if s.get(CREATED) is None:
        s.set(CREATED, True, "MPIJobCreated", f"MPIJob {turn.job_name} is created.")
    s.fields.setdefault("startTime", s.observed.get("startTime") or s.now)
    s.fields["replicaStatuses"] = replica_statuses(turn.job_name, workers, launcher)


def read_spec(turn: Turn) -> JobSpec | None:
    """The job's spec; None if it is invalid, which the job then says."""
    settings = turn.settings
    try:
        return parse(
            turn.job,
            settings.default_drain_seconds,
            max_workers=settings.max_workers_per_job,
            default_scale_out_timeout=settings.default_scale_out_timeout_seconds,
            protected_service_account=settings.own_service_account,
        )
    except InvalidSpec as err:
        if turn.status.set(INVALID, True, "InvalidSpec", str(err)):
            turn.event("Warning", "InvalidSpec", str(err))
        return None


def launcher_restarts(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> Restarts:
    """How many times the launcher has been restarted, and whether it is restarted now: it
    failed by its node or a signal under OnFailure, ExitCode or Always, or vanished while
    the job ran (deleted, or lost with its node). Past runPolicy.backoffLimit the job
    fails instead."""
    s = turn.status
    done = count(turn.state.get(names.ANN_LAUNCHER_RESTARTS))
    stopping = turn.queue is not None and turn.queue.evicted_at is not None
    if s.is_true(SUCCEEDED) or s.is_true(FAILED) or spec.suspend or stopping:
        return Restarts(done)
    why = _why_restart(turn, spec, launcher)
    if why is None:
        return Restarts(done)
    limit = spec.backoff_limit
    if limit is not None and done >= limit:
        fail(
            turn,
            f"Job {spec.name} has failed because it has reached the specified backoff "
            f"limit ({limit} launcher restarts; the last: {why})",
        )
        return Restarts(done)
    message = f"MPIJob {spec.name} is restarting: {why} (restart {done + 1}"
    message += f" of at most {limit})" if limit is not None else ")"
    s.set(RESTARTING, True, "MPIJobRestarting", message)
    s.set(RUNNING, False, "MPIJobRestarting", message)
    turn.event("Warning", "MPIJobRestarting", message)
    return Restarts(done + 1, now=True)


def _why_restart(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> str | None:
    """Why the launcher is to be started again; None: it is not."""
    if launcher is None:
        if not turn.status.is_true(RUNNING):
            return None
        return "the launcher pod is gone (deleted, or lost with its node)"
    pod = Worker(-1, launcher)
    if pod.phase != "Failed" or pod.terminating or turn.gone(pod.uid):
        return None
    # None: the program's own failure, and the job fails.
    return _launcher_failure(spec, pod)


def _launcher_failure(spec: JobSpec, pod: Worker) -> str | None:
    """Why a failed launcher is worth starting again, or None if its failure is the
    job's own (v1: Never, or ExitCode with an exit code of 1-127)."""
    policy = spec.launcher.restart_policy
    if pod.reason in NODE_REASONS or pod.disrupted:
        # Evicted, preempted, drained: horovodrun exits 1 on SIGTERM, which says
        # nothing of the training, whatever the restart policy.
        return f"its node stopped it ({pod.reason or 'DisruptionTarget'})"
    if policy == "Never":
        return None
    code = pod.exit_code(spec.main_container)
    if policy == "ExitCode" and (code is None or code < 128):
        return None
    return f"it exited with code {code}"


def finished(
    turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None, restarts: Restarts
) -> bool:
    """Whether the job is over: it succeeded or failed before, its active deadline is past
    (it fails now), or its launcher ended and is not restarted."""
    s = turn.status
    return (
        s.is_true(SUCCEEDED)
        or s.is_true(FAILED)
        or _past_deadline(turn, spec)
        or (launcher is not None and not restarts.now and _launcher_ended(turn, launcher))
    )


def _past_deadline(turn: Turn, spec: JobSpec) -> bool:
    """runPolicy.activeDeadlineSeconds, counted from startTime (reset on a resume):
    past it the job fails and cleanPodPolicy applies, as in training-operator."""
    deadline = spec.active_deadline_seconds
    start_time = parse_time(turn.status.fields.get("startTime"))
    if deadline is None or start_time is None or spec.suspend:
        return False
    due = start_time + timedelta(seconds=deadline)
    if turn.now < due:
        turn.requeue((due - turn.now).total_seconds())
        return False
    fail(turn, f"Job {spec.name} has failed because it was active longer than specified deadline")
    return True


def fail(turn: Turn, message: str) -> None:
    s = turn.status
    if s.set(FAILED, True, "MPIJobFailed", message):
        turn.event("Warning", "MPIJobFailed", message)
    _ended(turn)


def _ended(turn: Turn) -> None:
    s = turn.status
    if s.get(RUNNING) is not None:
        s.set(RUNNING, False, "MPIJobFinished", f"MPIJob {turn.job_name} has finished.")
    s.clear(SCALING, "ScalingComplete", "the job has finished")
    s.fields["completionTime"] = s.observed.get("completionTime") or s.now


def _launcher_ended(turn: Turn, launcher: Mapping[str, Any]) -> bool:
    phase = (launcher.get("status") or {}).get("phase")
    s = turn.status
    name = launcher["metadata"]["name"]
    if phase == "Succeeded":
        message = f"MPIJob {turn.job_name} successfully completed."
        if s.set(SUCCEEDED, True, "MPIJobSucceeded", message):
            turn.event("Normal", "MPIJobSucceeded", f"launcher {name} succeeded")
    elif phase == "Failed" and _disrupted(launcher):
        # Its exit (1 after SIGTERM) is not the job's: it is restarted once it is gone.
        return False
    elif phase == "Failed":
        message = f"MPIJob {turn.job_name} has failed: launcher {name} failed."
        if s.set(FAILED, True, "MPIJobFailed", message):
            turn.event("Warning", "MPIJobFailed", f"launcher {name} failed")
    else:
        return False
    _ended(turn)
    return True


def _disrupted(launcher: Mapping[str, Any]) -> bool:
    """A launcher ended by an eviction, a preemption, a drain or a delete: with the
    ``DisruptionTarget`` condition, a node's reason, or terminating."""
    pod = Worker(-1, launcher)
    return pod.disrupted or pod.terminating or pod.reason in NODE_REASONS


def expired(turn: Turn, spec: JobSpec) -> bool:
    """runPolicy.ttlSecondsAfterFinished: the finished job is deleted after it."""
    ttl = spec.ttl_seconds_after_finished
    s = turn.status
    done = parse_time(s.fields.get("completionTime") or s.observed.get("completionTime"))
    if ttl is None or done is None:
        return False
    due = done + timedelta(seconds=ttl)
    if turn.now < due:
        turn.requeue((due - turn.now).total_seconds())
        return False
    return True


def clean_up(
    turn: Turn, spec: JobSpec, workers: Sequence[Worker], launcher: Mapping[str, Any] | None
) -> list[Worker]:
    """The finished job's pods that cleanPodPolicy deletes: pods left running must not
    block a node's drain. Nothing is listed or draining any more."""
    elastic = turn.status.observed.get("elastic")
    if isinstance(elastic, Mapping):
        turn.status.fields["elastic"] = {**elastic, "listed": 0, "draining": 0}
    policy = spec.clean_pod_policy
    if policy == "None":
        return []
    doomed = [
        w
        for w in _pods(workers, launcher)
        if not w.terminating
        and not turn.gone(w.uid)
        and (policy == "All" or w.phase in ("Running", "Pending"))
    ]
    return _this_turn(turn, doomed)


def suspended_by_user(turn: Turn, spec: JobSpec) -> bool:
    """runPolicy.suspend, as training-operator does it (kueue.gate sets it while the job
    waits in Kueue's queue), or Kueue's eviction once its checkpoint window is over; False
    also when it was just lifted, which restarts the active deadline's clock, as a
    Kubernetes Job does."""
    s = turn.status
    if spec.suspend or notices.queue_stop_due(turn, spec):
        message = f"MPIJob {spec.name} is suspended."
        if s.set(SUSPENDED, True, "MPIJobSuspended", message):
            turn.event("Normal", "MPIJobSuspended", message)
        return True
    suspended = s.get(SUSPENDED)
    if s.is_true(SUSPENDED) and (suspended or {}).get("reason") == "MPIJobSuspended":
        message = f"MPIJob {spec.name} is resumed."
        s.set(SUSPENDED, False, "MPIJobResumed", message)
        turn.event("Normal", "MPIJobResumed", message)
        s.fields["startTime"] = s.now
    return False


def suspension(turn: Turn, spec: JobSpec) -> tuple[Suspension | None, bool]:
    """The suspension for capacity the job is in (None: it is not), and whether the user
    changed the job since, which asks for a new attempt now."""
    if spec.bounds.min is None:
        return None, False  # no longer elastic: it runs as v1 does, once every worker is up
    found = parse_suspension(turn.state.get(names.ANN_SUSPENDED))
    if found is None or found.intent == intent(turn.job, spec):
        return found, False
    return Suspension(found.since, intent(turn.job, spec)), True


def suspend(
    turn: Turn, spec: JobSpec, suspension: Suspension, backoff: Backoff | None, listed: int
) -> dict[str, str]:
    """Enter the suspension for capacity (``listed`` workers were left), or wait for the
    next attempt to resume after one timed out (``backoff`` says when). The ConfigMap
    annotations that keep the state, returned."""
    minimum = spec.bounds.min
    if backoff is None:
        message = (
            f"only {listed} of the min-replicas {minimum} workers were listed for "
            f"{spec.below_min_timeout:g}s ({names.ANN_BELOW_MIN_TIMEOUT}): launcher and "
            f"workers deleted, the job, its ConfigMap and RBAC kept; creating "
            f"{spec.worker.replicas} workers again now, resuming once {minimum} run"
        )
        turn.event("Warning", "Suspended", message)
        turn.requeue(0)
    else:
        message = (
            f"waiting for capacity: fewer than min-replicas {minimum} workers ran within "
            f"{spec.scale_out_timeout:g}s ({backoff.reason}); trying again at "
            f"{format_time(backoff.retry_at)} (attempt {backoff.attempts + 1})"
        )
        turn.requeue((backoff.retry_at - turn.now).total_seconds())
    turn.status.set(SUSPENDED, True, "WaitingForCapacity", message)
    state = {names.ANN_SUSPENDED: suspension.format()}
    if backoff is not None:
        state[names.ANN_SCALE_OUT_BACKOFF] = backoff.format()
    return state


def stop_at(turn: Turn, spec: JobSpec, decided: datetime) -> datetime | None:
    """When a stop the controller decided at ``decided`` goes ahead, while its checkpoint
    window runs (the turn comes back then); None once it is over."""
    at = decided + timedelta(seconds=spec.checkpoint_seconds)
    if turn.now >= at:
        return None
    turn.requeue((at - turn.now).total_seconds())
    return at


def stop(
    turn: Turn, spec: JobSpec, workers: Sequence[Worker], launcher: Mapping[str, Any] | None
) -> list[Worker]:
    """A suspended job: no launcher, no workers (the pods to delete now, returned)."""
    s = turn.status
    doomed = [w for w in _pods(workers, launcher) if not w.terminating and not turn.gone(w.uid)]
    if s.get(RUNNING) is not None:
        s.set(RUNNING, False, "MPIJobSuspended", f"MPIJob {spec.name} is suspended.")
    s.clear(SCALING, "Suspended", "the job is suspended")
    return _this_turn(turn, doomed)


def resumed(turn: Turn, spec: JobSpec, listed: int, *, made: bool) -> None:
    """A job suspended for capacity starts its launcher again (``made``: a gang's launcher,
    made with the attempt's workers, is there already)."""
    launcher = "its launcher was made with them" if made else "starting the launcher again"
    message = (
        f"{listed} workers run, at least min-replicas {spec.bounds.min}: "
        f"{launcher}; training continues from its last checkpoint"
    )
    turn.status.set(SUSPENDED, False, "Resumed", message)
    turn.event("Normal", "Resumed", message)


def running(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> None:
    """The job says whether its launcher runs."""
    if launcher is None or (launcher.get("status") or {}).get("phase") != "Running":
        return
    message = f"MPIJob {spec.name} is running."
    turn.status.set(RUNNING, True, "MPIJobRunning", message)
    turn.status.clear(RESTARTING, "MPIJobRunning", message)


def _pods(workers: Sequence[Worker], launcher: Mapping[str, Any] | None) -> list[Worker]:
    return list(workers) + ([Worker(-1, launcher)] if launcher is not None else [])


def _this_turn(turn: Turn, doomed: list[Worker]) -> list[Worker]:
    if len(doomed) > POD_WRITES_PER_TURN:
        turn.requeue(0)
    return doomed[:POD_WRITES_PER_TURN]
