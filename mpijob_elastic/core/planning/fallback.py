"""A turn that raised before its writes: the job says so, and its stops still happen.

The inputs are read totally (docs/design.md, "Bad input"), but a bug can always remain,
and a turn that raises writes nothing: without this the job would get no status and no
Event, and nothing would stop it, whatever the user or Kueue asked for. So the shell
catches what ``observe`` or ``plan_writes`` raised and plans this turn instead, from the
least it can: the job and the pods the job controls (``Observed`` with nothing else but a
queue-labelled job's Kueue view and the writer's memory of accepted deletes and held
names). What it reads of the spec is what the stops need, with the spec's own total
readers: ``runPolicy.suspend``, ``activeDeadlineSeconds`` and ``cleanPodPolicy``, and the
checkpoint window of a Kueue eviction. The decisions are the normal turn's own
(``run_policy``, ``notices``, ``kueue``), and ``diff`` orders the writes:

* ``TurnFailed`` True naming the exception, with one Warning Event per change of it
  (``conditions.turn_failed``); the next turn that completes turns it False.
* Suspended (``runPolicy.suspend``, or Kueue's eviction once its checkpoint window is over,
  the job's Workload released once its pods are gone, as ``kueue_writes`` does): the
  launcher and workers deleted, with their job-stopping notice.
* Past ``activeDeadlineSeconds``, or finished before: the job fails and ``cleanPodPolicy``
  applies.

A job being deleted is left to the garbage collector, as the normal turn leaves it. Nothing
else happens: no pod is created, no host list written, no launcher restarted. A launcher
that ended is not read for the job's end here: whether it is restarted depends on its
restart policy and the job's backoffLimit, which are the normal turn's to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Failure, Writes
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.lifecycle import notices, run_policy
from mpijob_elastic.core.lifecycle.run_policy import Restarts
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.planning.desired import Desired
from mpijob_elastic.core.planning.write_order import diff
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.reports import conditions
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.shapes import FieldError
from mpijob_elastic.core.spec import fields
from mpijob_elastic.core.spec.model import DEFAULT_CHECKPOINT_SECONDS, Bounds, JobSpec, ReplicaSpec
from mpijob_elastic.core.workers import Worker, split_pods

# The runPolicy fields a stop reads; the others (schedulingPolicy's quantities) are not read.
_STOP_FIELDS = ("suspend", "activeDeadlineSeconds", "cleanPodPolicy")


def stop_only(observed: Observed, settings: Settings, now: datetime, failure: Failure) -> Writes:
    """The writes of a turn whose planning raised ``failure``: the report and the stops.
    ``observed``: the job and the pods it controls, and its Kueue view if it is labelled."""
    if observed.queue is not None:
        observed = replace(observed, job=kueue.gate(dict(observed.job), observed.queue))
    turn = Turn.start(observed, settings, now)
    deletes: list[Worker] = []
    found = None
    if not observed.job["metadata"].get("deletionTimestamp"):
        spec = stop_spec(turn.job)
        workers, launcher = split_pods(turn.job_name, observed.pods)
        run_policy.created(turn, workers, launcher)
        # No launcher is passed: its end is the normal turn's to judge (see above).
        if run_policy.finished(turn, spec, None, Restarts(0)):
            deletes = run_policy.clean_up(turn, spec, workers, launcher)
        elif run_policy.suspended_by_user(turn, spec):
            stop = notices.suspended(turn, spec, launcher)
            found = notices.for_pods(turn, spec, workers, launcher, {}, stop)
            deletes = run_policy.stop(turn, spec, workers, launcher)
        else:
            evicted = notices.queue_evicted(turn, spec, launcher)
            if evicted is not None:
                # Within its checkpoint window: the pods are told, as the normal turn does.
                found = notices.for_pods(turn, spec, workers, launcher, {}, evicted)
    event = conditions.turn_failed(turn.status, failure)
    if event is not None:
        turn.events.append(event)
    want = Desired(
        {},
        None,
        (),
        (),
        (),
        deletes,
        None,
        status=turn.status.build(),
        events=turn.events,
        requeue_after=turn.requeue_after,
        notices=found,
    )
    return diff(want, observed, now)


def stop_spec(job: Mapping[str, Any]) -> JobSpec:
    """The spec as far as a stop reads it, by the spec's own readers: a field they refuse
    reads as unset (not suspended, no deadline, cleanPodPolicy None: nothing deleted)."""
    errors: list[FieldError] = []
    meta = job["metadata"]
    raw = job.get("spec")
    spec = raw if isinstance(raw, Mapping) else {}
    policy = spec.get("runPolicy")
    stops = (
        {k: v for k, v in policy.items() if k in _STOP_FIELDS}
        if isinstance(policy, Mapping)
        else {}
    )
    read = fields.run_policy(
        {"cleanPodPolicy": spec.get("cleanPodPolicy"), "runPolicy": stops}, errors
    )
    annotations = meta.get("annotations")
    checkpoint = fields.seconds(
        annotations if isinstance(annotations, Mapping) else {},
        names.ANN_CHECKPOINT_SECONDS,
        DEFAULT_CHECKPOINT_SECONDS,
        errors,
    )
    empty = ReplicaSpec(0, "Never", {})
    return JobSpec(
        namespace=str(meta["namespace"]),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        slots_per_worker=1,
        main_container=None,
        clean_pod_policy=read.clean,
        launcher=empty,
        worker=empty,
        bounds=Bounds(None, None),
        drain_seconds=0.0,
        checkpoint_seconds=checkpoint,
        suspend=read.suspend,
        active_deadline_seconds=read.deadline,
    )
