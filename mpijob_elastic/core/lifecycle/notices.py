"""Notices to the training: what the controller knows before capacity goes, told to the ranks.

Horovod's in-memory commits survive losing a worker, not losing the whole run: a
suspension, or a launcher lost with its node, throws away everything since the user's last
checkpoint to disk. The controller often knows first (a cordon, a spot taint, a
``DisruptionTarget``, a scale-in victim, a suspension it decided), so every launcher and
worker pod carries the controller's current notice for it in the annotation
``names.ANN_NOTICE``, which a downwardAPI volume shows to its containers as a file
(``render_pods.py``); the helper ``contrib/mpijob_elastic_notice.py`` reads it.

The format (docs/formats.md), one line, the annotation absent when there is no notice::

    <kind> <deadline, RFC 3339> <cause> <message>

* kind ``job-stopping`` (every pod of the job gets it): ``below-min`` (a suspension for
  capacity, after the checkpoint window, run_policy.py), ``queue-evicted`` (Kueue evicted
  the job's Workload: after the checkpoint window too), ``queue-requeued`` (its pods
  would request more than Kueue admitted: at once, queued again; kueue.overcharged),
  ``suspend`` (runPolicy.suspend),
  ``launcher-node-leaving``, ``launcher-evicted``, ``launcher-preempted``,
  ``active-deadline``;
* kind ``worker-leaving`` (that worker only): ``scale-in``, ``node-leaving``,
  ``evicted``, ``preempted``, ``deleted``.

A job-stopping notice comes before a worker-leaving one. The deadline is when the stop is
due: the end of the checkpoint window, a victim's drain deadline, the active deadline, a
pod's deletion timestamp; where nobody knows (a node leaving), the notice's time plus the
pod's grace period, the least an eviction gives. A notice is kept as it is while its kind
and cause hold, so its deadline does not move; it is removed when its cause goes away
(node uncordoned, job back at its minimum), except on a terminating pod, which keeps it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names, numbers
from mpijob_elastic.core.actions import AnnotatePod
from mpijob_elastic.core.hosts.drain import Victim
from mpijob_elastic.core.hosts.membership import Membership
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_time, parse_time
from mpijob_elastic.core.workers import Worker, split_pods

JOB_STOPPING = "job-stopping"
WORKER_LEAVING = "worker-leaving"
# Kubernetes' default terminationGracePeriodSeconds.
DEFAULT_GRACE_SECONDS = 30
# DisruptionTarget's reasons (Kubernetes 1.26+), as the notice's cause.
_DISRUPTION_CAUSES = {
    "PreemptionByScheduler": "preempted",
    "PreemptionByKubeScheduler": "preempted",
    "EvictionByEvictionAPI": "evicted",
    "DeletionByTaintManager": "node-leaving",
    "TerminationByKubelet": "evicted",
    "DeletionByPodGC": "node-leaving",
}


@dataclass(frozen=True)
class Stop:
    """A job-stopping notice for every pod; ``deadline`` None: each pod's own (its
    deletion now plus its grace period)."""

    cause: str
    message: str
    deadline: datetime | None = None


def format_notice(kind: str, deadline: datetime, cause: str, message: str) -> str:
    return f"{kind} {format_time(deadline)} {cause} {message}".strip()


def parse_notice(value: object) -> tuple[str, datetime, str, str] | None:
    """(kind, deadline, cause, message), or None if unset or unreadable."""
    if not isinstance(value, str):
        return None
    parts = value.split(" ", 3)
    if len(parts) < 3:
        return None
    deadline = parse_time(parts[1])
    if deadline is None:
        return None
    return parts[0], deadline, parts[2], parts[3] if len(parts) == 4 else ""


def below_min(spec: JobSpec, decided: datetime, listed: int) -> Stop:
    """The notice of a suspension below the minimum decided at ``decided``, due once its
    checkpoint window is over (run_policy.py)."""
    message = (
        f"only {listed} of the min-replicas {spec.bounds.min} workers were listed for "
        f"{spec.below_min_timeout:g}s: the job is suspended until capacity returns"
    )
    return Stop("below-min", message, decided + timedelta(seconds=spec.checkpoint_seconds))


def queue_evicted(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> Stop | None:
    """Kueue evicted the job's Workload, which still holds its quota (kueue.py): the whole
    job stops one checkpoint window after the eviction (run_policy.py), or at once, at each
    pod's own deadline, when no launcher runs: then there is no training to save."""
    standing = turn.queue
    if standing is None or standing.evicted_at is None:
        return None
    message = f"{standing.message}; the job stops until Kueue admits it again"
    if launcher is None or Worker(-1, launcher).phase != "Running":
        return Stop("queue-evicted", message)
    window = timedelta(seconds=spec.checkpoint_seconds)
    return Stop("queue-evicted", message, standing.evicted_at + window)


def queue_stop_due(turn: Turn, spec: JobSpec) -> bool:
    """Kueue evicted the job and its checkpoint window is over (or there was none: no
    launcher runs), so it is suspended now (run_policy.py). Within the window the job runs on
    with the notice posted, and its turn comes back when the window ends."""
    _, launcher = split_pods(turn.job_name, turn.observed.pods)
    stop = queue_evicted(turn, spec, launcher)
    if stop is None:
        return False
    if stop.deadline is None:
        return True
    announce(turn, spec, launcher, stop)
    if turn.now >= stop.deadline:
        return True
    turn.requeue((stop.deadline - turn.now).total_seconds())
    return False


def suspended(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> Stop:
    """The notice of a job stopped as suspended: Kueue's eviction (its window is over), or
    runPolicy.suspend, which is not delayed: the pods' grace periods are all it gives."""
    standing = turn.queue
    if standing is not None and standing.reason == "WorkloadOutdated":
        return Stop("queue-requeued", standing.message)
    return queue_evicted(turn, spec, launcher) or Stop("suspend", "runPolicy.suspend is true")


def announce(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None, stop: Stop) -> None:
    """The Event of a stop the controller decided, in the turn that posts its notice (the
    launcher does not carry it yet): the job says why it has not stopped at once."""
    found = parse_notice(_current(Worker(-1, launcher))) if launcher is not None else None
    if found is not None and found[:1] == (JOB_STOPPING,) and found[2] == stop.cause:
        return
    due = format_time(stop.deadline) if stop.deadline is not None else "now"
    turn.event(
        "Normal",
        "StopNoticed",
        f"job-stopping notice ({stop.cause}) posted to every pod: {stop.message}; stopping "
        f"at {due}, {spec.checkpoint_seconds:g}s to checkpoint "
        f"({names.ANN_CHECKPOINT_SECONDS})",
    )


def running(
    turn: Turn,
    spec: JobSpec,
    launcher: Mapping[str, Any] | None,
    m: Membership,
    victims: Sequence[Victim],
    stop: Stop | None,
) -> dict[str, str]:
    """The notices of a job that runs: its leaving workers' carry their drain deadlines."""
    deadlines = {v.worker.name: v.deadline for v in victims}
    leaving = {i.worker.name: deadlines.get(i.worker.name) for i in m.leaving}
    workers, _ = split_pods(turn.job_name, turn.observed.pods)
    found = for_pods(turn, spec, workers, launcher, leaving, stop)
    for v in victims:
        if v.as_seen:
            # Deleted at once, as seen (no rank runs there to read a notice): a patch now
            # would change the version its delete is conditional on.
            current = _current(v.worker)
            if current is None:
                found.pop(v.worker.name, None)
            else:
                found[v.worker.name] = current
    return found


def for_pods(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    launcher: Mapping[str, Any] | None,
    leaving: Mapping[str, datetime | None],
    stop: Stop | None,
) -> dict[str, str]:
    """Each pod's notice, by name; a pod not named has none. ``leaving``: the workers a
    scale-in or a relocation takes, with their drain deadline where it is known."""
    pods = [*workers, *([Worker(-1, launcher)] if launcher is not None else [])]
    stop = stop or _job_stop(turn, spec, launcher)
    found: dict[str, str] = {}
    for pod in pods:
        if turn.gone(pod.uid):
            continue
        current = _current(pod)
        if pod.terminating and current is not None:
            # Its stop is under way: the notice it was given stays, deadline and all.
            found[pod.name] = current
            continue
        if stop is not None:
            wanted: tuple[str, datetime, str, str] | None = (
                JOB_STOPPING,
                stop.deadline or _deletion(turn, pod),
                stop.cause,
                stop.message,
            )
        elif pod.index >= 0:
            wanted = _worker_leaving(turn, spec, pod, leaving)
        else:
            wanted = None
        if wanted is None:
            continue
        old = parse_notice(current)
        # Kept while its kind and cause hold: the deadline the training read stays.
        same = old is not None and old[0] == wanted[0] and old[2] == wanted[2]
        found[pod.name] = current if same and current is not None else format_notice(*wanted)
    return found


def _current(pod: Worker) -> str | None:
    value = (pod.pod["metadata"].get("annotations") or {}).get(names.ANN_NOTICE)
    return value if isinstance(value, str) else None


def _grace(pod: Worker) -> int:
    grace = (pod.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    if not isinstance(grace, int) or grace < 0:
        return DEFAULT_GRACE_SECONDS
    # The API takes any int64; past int32 (68 years) a grace period means "never", and the
    # deadline now plus it raised OverflowError past datetime's end in every reconcile.
    return min(grace, numbers.INT32_MAX)


def _deletion(turn: Turn, pod: Worker) -> datetime:
    """When the pod is killed: its deletion timestamp (the delete's time plus its grace
    period), or now plus its grace period if it is not being deleted yet."""
    at = parse_time(pod.pod["metadata"].get("deletionTimestamp"))
    return at or turn.now + timedelta(seconds=_grace(pod))


def _disruption(pod: Worker) -> str | None:
    """The cause of a pod being taken: its DisruptionTarget's reason, or a delete."""
    for condition in (pod.pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return _DISRUPTION_CAUSES.get(str(condition.get("reason")), "evicted")
    return "deleted" if pod.terminating else None


def _job_stop(turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None) -> Stop | None:
    """A stop that is not the controller's to delay: the launcher's node is going, the
    launcher is being taken; or one it delays by the checkpoint window: Kueue evicted the
    job, or the active deadline is near."""
    if launcher is not None:
        pod = Worker(-1, launcher)
        cause = _disruption(pod)
        if cause is not None and pod.phase in ("Pending", "Running"):
            cause = "launcher-" + ("preempted" if cause == "preempted" else "evicted")
            return Stop(cause, f"the launcher {pod.name} is being stopped", _deletion(turn, pod))
        node = pod.node
        why = turn.observed.leaving_nodes.get(node) if node is not None else None
        if why is not None:
            return Stop("launcher-node-leaving", f"the launcher's node {node} is {why}")
    return queue_evicted(turn, spec, launcher) or _active_deadline(turn, spec)


def _active_deadline(turn: Turn, spec: JobSpec) -> Stop | None:
    """runPolicy.activeDeadlineSeconds: noticed a checkpoint window before it is over."""
    start = parse_time(turn.status.fields.get("startTime"))
    if spec.active_deadline_seconds is None or start is None:
        return None
    due = start + timedelta(seconds=spec.active_deadline_seconds)
    posted = due - timedelta(seconds=spec.checkpoint_seconds)
    if turn.now < posted:
        turn.requeue((posted - turn.now).total_seconds())
        return None
    message = f"runPolicy.activeDeadlineSeconds {spec.active_deadline_seconds} ends the job"
    return Stop("active-deadline", message, due)


def _worker_leaving(
    turn: Turn, spec: JobSpec, worker: Worker, leaving: Mapping[str, datetime | None]
) -> tuple[str, datetime, str, str] | None:
    cause = _disruption(worker)
    if cause is not None:
        return WORKER_LEAVING, _deletion(turn, worker), cause, "this worker is being stopped"
    node = worker.node
    # A job without elastic bounds keeps its workers on a going node (drain.relocate).
    going = node is not None and spec.bounds.min is not None
    why = turn.observed.leaving_nodes.get(node) if going and node is not None else None
    if worker.name in leaving or why is not None:
        deadline = leaving.get(worker.name) or turn.now + timedelta(seconds=spec.drain_seconds)
        if why is not None:
            return WORKER_LEAVING, deadline, "node-leaving", f"its node {node} is {why}"
        return WORKER_LEAVING, deadline, "scale-in", "this worker is removed from the job"
    return None


def notice_patches(
    wanted: Mapping[str, str], pods: Sequence[Mapping[str, Any]], deleting: Collection[str]
) -> list[AnnotatePod]:
    """Each pod's notice where it is not as ``wanted`` (write_order.py's ``notices``)."""
    writes = []
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("uid") in deleting:
            continue
        has = (meta.get("annotations") or {}).get(names.ANN_NOTICE)
        notice = wanted.get(meta["name"])
        if has != notice:
            # A pod the scheduler or an eviction is taking (DisruptionTarget) changes under
            # us as it goes: its notice is patched unconditionally. Conditional, it met the
            # deletion's own write with 409, the turn stopped there, and the pod was gone
            # before the next one (KWOK), so the turn's Preempted Event was never sent.
            rv = "" if Worker(0, dict(pod)).disrupted else str(meta.get("resourceVersion", ""))
            writes.append(AnnotatePod(meta["name"], {names.ANN_NOTICE: notice}, rv))
    return writes
