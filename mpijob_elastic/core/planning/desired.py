"""What one job's children should be now: a pure value computed from (job, observed, now).

``desired()`` is the one entry point: it starts a ``Turn`` (turn.py), takes the decisions
in order and assembles what they return into a ``Desired``, which ``diff.py`` turns into
ordered writes. Each decision has its own module:

* ``run_policy.py``: runPolicy (suspend, active deadline, TTL, backoffLimit and launcher
  restarts) and the suspension for capacity.
* ``capacity.py``: how many workers the job wants now (bounds, the pause after worker
  failures, the scale-out timeout and its backoff, workers moving off going nodes,
  below-min).
* ``membership.py`` and ``drain.py``: which workers stay, which leave and how (drained
  victims, failed workers replaced, retired names).
* ``host_rules.py``: which change of the host list Horovod's driver may see now, and who
  holds ranks (called once, in ``_hosts``).
* ``conditions.py``: the conditions and Events no other decision owns, the server's
  refusals of our writes among them, and the warnings ``spec_warnings.py`` finds.

What this module itself decides is what goes into the children (``children.py`` builds
them): the launcher Role grants exec on the workers the job controls and on those it
creates in this turn (written once their creates went through, ``diff.py``), so a name
someone else's pod holds is never granted; a worker enters ``discover_hosts.sh`` only once
its main container runs and the Role we last wrote grants it, and as the host-list rules
allow; the launcher starts once every worker the job wants exists and enough of them run.
Bad input never deletes anything: an invalid spec freezes the job's children, and Worker
replicas outside the job's bounds keep the job at its current size. A child name held by an
object the job does not control is never granted, written or waited on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import DELETE_MEMORY_SECONDS, Emit, Probe
from mpijob_elastic.core.hosts import drain, host_list
from mpijob_elastic.core.hosts.drain import Victim
from mpijob_elastic.core.hosts.membership import (
    Facts,
    Membership,
    choose_members,
    format_indexes,
    parse_indexes,
)
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.lifecycle import notices, run_policy
from mpijob_elastic.core.lifecycle.notices import Stop
from mpijob_elastic.core.lifecycle.run_policy import Restarts, Suspension
from mpijob_elastic.core.objects import children, podgroups, render
from mpijob_elastic.core.outputs import goodput
from mpijob_elastic.core.outputs.status import QUEUE_ADMITTED
from mpijob_elastic.core.outputs.turn import BUDGET, GANG, POD_WRITES_PER_TURN, Turn
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.reports import conditions, spec_warnings
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.sizing import capacity, opportunistic
from mpijob_elastic.core.sizing.capacity import ScaleOut, Target
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.core.workers import Worker, discovered_hosts, listed_hosts, split_pods

Obj = dict[str, Any]


@dataclass(frozen=True)
class Desired:
    """The children one job should have now, and its status; empty where frozen."""

    # The ServiceAccount, Role, RoleBinding and ConfigMap, by kind.
    objects: Mapping[str, Obj]
    config_hash: str | None
    # Workers the job keeps (their drain marks are stale if set) and pods to create now.
    workers: Sequence[Worker]
    new_pods: Sequence[Obj]
    victims: Sequence[Victim]
    # Pods to delete now without draining: retired and failed workers to replace,
    # finished-job clean-up.
    deletes: Sequence[Worker]
    # The launcher pod to create if it does not exist yet.
    launcher: Obj | None
    status: Obj = field(default_factory=dict)
    events: Sequence[Emit] = ()
    requeue_after: float | None = None
    # Read the launcher's remote shells: a victim's drain may end early (ranks.py).
    probe: Probe | None = None
    # Kinds of ``objects`` the job must no longer have (its PodDisruptionBudget, once it
    # is suspended, finished or no longer elastic).
    obsolete: Sequence[str] = ()
    # The finished job's runPolicy.ttlSecondsAfterFinished is over: delete the job itself.
    delete_job: bool = False
    # Workers that hold ranks, joined a reset that has ended (host_rules.py ``committed``):
    # labelled so, the others not.
    rank_holders: frozenset[str] = frozenset()
    # The ranks ConfigMap to create if missing; its data is the launcher's (ranks.py).
    ranks: Obj | None = None
    # Each pod's notice (notices.py), by name: a pod not named has none. None: the
    # notices are left as they are (a frozen or finished job).
    notices: Mapping[str, str] | None = None


def desired(observed: Observed, settings: Settings, now: datetime) -> Desired:
    """The children and status one job should have now, from what the caches hold."""
    if observed.job["metadata"].get("deletionTimestamp"):
        # The garbage collector removes the children.
        status = dict(observed.job.get("status") or {})
        return Desired({}, None, (), (), (), (), None, status, (), None)
    if observed.queue is not None:
        # A job labelled for a Kueue queue is seen through its admission.
        observed = replace(observed, job=kueue.gate(dict(observed.job), observed.queue))
    turn = Turn.start(observed, settings, now)
    children = _decide(turn)
    _queue(turn)
    conditions.turn_completed(turn.status)
    # A refused write is reported whatever else the turn decided.
    refusal = conditions.refused(turn.status, observed.refused)
    if refusal is not None:
        turn.events.append(refusal)
    return replace(
        children,
        status=turn.status.build(),
        events=turn.events,
        requeue_after=turn.requeue_after,
        probe=turn.probe,
    )


def _queue(turn: Turn) -> None:
    """Where a job labelled for a Kueue queue stands there (kueue.py gates the job). A
    refused Workload write has its Event from ``conditions.refused``, as every refusal."""
    standing = turn.queue
    if standing is not None and turn.status.set(
        QUEUE_ADMITTED, standing.admitted, standing.reason, standing.message
    ):
        if standing.reason in ("KueueNotInstalled", "KueueNotPermitted"):
            turn.event("Warning", standing.reason, standing.message)
        elif standing.reason != "WorkloadRefused":
            turn.event("Normal", f"Queue{standing.reason}", standing.message)


def _decide(turn: Turn) -> Desired:
    """The job's children, by the stage of its life it is in."""
    workers, launcher = split_pods(turn.job_name, turn.observed.pods)
    run_policy.created(turn, workers, launcher)
    spec = run_policy.read_spec(turn)
    conditions.spec_warnings(turn, spec_warnings.check(turn.job, spec, turn.observed.queue))
    if spec is None:
        # Leave every child as it is: a typo must not cost the job its workers.
        return Desired({}, None, (), (), (), (), None)
    conditions.unsupported(turn, spec)
    restarts = run_policy.launcher_restarts(turn, spec, launcher)
    if run_policy.finished(turn, spec, launcher, restarts):
        _goodput(turn, goodput.ENDED, spec.worker.replicas)
        expired = run_policy.expired(turn, spec)
        # A finished job's clean-up may take more pods than one turn writes.
        deletes = run_policy.clean_up(turn, spec, workers, launcher)
        return Desired(
            {}, None, (), (), (), deletes, None, obsolete=(BUDGET, GANG), delete_job=expired
        )
    # Reported suspended too: a held Workload name keeps a queued job suspended.
    conditions.conflicts(turn, spec)
    if run_policy.suspended_by_user(turn, spec):
        # Kueue's eviction waited out its checkpoint window; runPolicy.suspend is not delayed.
        stop = notices.suspended(turn, spec, launcher)
        # Held by Kueue (queued, evicted, requeued) is waiting for capacity; the user's own
        # runPolicy.suspend is a stop.
        queue = turn.queue
        held = queue is not None and (not queue.admitted or queue.evicted_at is not None)
        _goodput(turn, goodput.WAITING if held else goodput.STOPPED, spec.worker.replicas)
        return _stopped(turn, spec, workers, launcher, {}, stop)
    return _scale(turn, spec, workers, launcher, restarts)


def _stopped(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    launcher: Mapping[str, Any] | None,
    state: Mapping[str, str],
    stop: Stop | None,
) -> Desired:
    """A suspended job: no launcher, no workers; the job, its ConfigMap (carrying
    ``state``) and RBAC kept. ``stop``: the notice its pods get as they go."""
    found = notices.for_pods(turn, spec, workers, launcher, {}, stop)
    deletes = run_policy.stop(turn, spec, workers, launcher)
    turn.status.fields["elastic"] = {"listed": 0, "draining": 0, "retired": "", **_bounds(spec)}
    # A new launcher is a new Horovod job with an empty blacklist: names are fresh again.
    data = render.config_data(spec, turn.settings, [], [])
    objects = children.objects(turn, spec, [], data, state)
    return Desired(objects, None, (), (), (), deletes, None, obsolete=(BUDGET, GANG), notices=found)


@dataclass(frozen=True)
class _Size:
    """What capacity decided for a job that runs: the size it asks for, the scale-out's
    state, the target, and the suspension for capacity it may be in."""

    # The Worker count in force (within the bounds), kept for an out-of-range one to come.
    replicas: int
    wanted: int
    out: ScaleOut
    goal: Target
    suspension: Suspension | None
    failures: capacity.WorkerFailures
    failed_kept: Sequence[str]
    growth: opportunistic.Growth


def _scale(
    turn: Turn,
    spec: JobSpec,
    workers: Sequence[Worker],
    launcher: Mapping[str, Any] | None,
    restarts: Restarts,
) -> Desired:
    """A job that runs, or is to: its size, its members, its drains and its children."""
    size = _size(turn, spec, workers)
    if size.suspension is not None and size.out.given_up:
        # The attempt to resume failed: release what it got, wait out the backoff.
        state = run_policy.suspend(turn, spec, size.suspension, size.out.backoff, 0)
        return _stopped(turn, spec, workers, launcher, state, None)
    m = _members(turn, spec, workers, size)
    create_now = list(m.new_indexes[:POD_WRITES_PER_TURN])
    if len(m.new_indexes) > len(create_now):
        turn.requeue(0)
    gang = podgroups.gang(turn.settings)
    baseline = size.goal.workers - size.growth.extra
    create_now = opportunistic.paced(spec, m.keep, create_now, baseline, gang)
    if podgroups.held(gang, turn.observed.pod_group) or podgroups.taken(
        gang, spec.name, turn.observed.conflicts
    ):
        # The PodGroup's change of phase, or the holder's going, brings the job's next
        # turn (its watch, app/routes.py).
        create_now = []  # and no launcher either: it waits for its workers
    hosts = host_list.hosts(turn, spec, workers, m, create_now, launcher)
    below_since = None
    if size.suspension is None:
        below_since = capacity.below_min_since(turn, spec, launcher, len(hosts.listed))
    stop = None
    if below_since is not None and capacity.below_min_too_long(turn, spec, below_since):
        decided = below_since + timedelta(seconds=spec.below_min_timeout)
        stop = notices.below_min(spec, decided, len(hosts.listed))
        notices.announce(turn, spec, launcher, stop)
        if run_policy.stop_at(turn, spec, decided) is None:
            suspension = Suspension(turn.now, run_policy.intent(turn.job, spec))
            state = run_policy.suspend(turn, spec, suspension, None, len(hosts.listed))
            return _stopped(turn, spec, workers, launcher, state, stop)
    old_data = (turn.observed.config_map or {}).get("data")
    # A worker the host-list rules keep listed waits: its drain has not begun.
    leaving = [i for i in m.leaving if i.worker.name not in hosts.rules.held]
    victims = drain.drain(turn, spec, leaving, listed_hosts(old_data), launcher)
    members = _Members(m, create_now, hosts, victims, stop)
    return _children(turn, spec, launcher, size, members, restarts, below_since)


def _size(turn: Turn, spec: JobSpec, workers: Sequence[Worker]) -> _Size:
    replicas = capacity.within_bounds(turn, spec, workers)
    failed = [w for w in workers if w.phase == "Failed" and not w.terminating]
    replacing = drain.failed_to_replace(turn, spec, failed)
    failures = capacity.worker_failures(turn, replacing)
    wanted = capacity.paused(turn, replicas, workers, failed, failures)
    suspension, retry_now = run_policy.suspension(turn, spec)
    out = capacity.scale_out(turn, spec, workers, wanted, retry_now)
    goal = capacity.target(turn, spec, workers, wanted, out, drain.relocate(turn, spec, workers))
    held = wanted < replicas or out.waiting(turn.now) or suspension is not None
    growth = opportunistic.grow(turn, spec, workers, wanted, held)
    goal = replace(goal, workers=goal.workers + growth.extra)
    gone = {w.name for w in replacing}
    kept = [w.name for w in failed if w.name not in gone]
    return _Size(replicas, wanted, out, goal, suspension, failures, kept, growth)


def _members(turn: Turn, spec: JobSpec, workers: Sequence[Worker], size: _Size) -> Membership:
    observed = turn.observed
    old_data = (observed.config_map or {}).get("data")
    facts = Facts(
        listed=discovered_hosts(old_data),
        retired=parse_indexes(turn.state.get(names.ANN_RETIRED_WORKERS)),
        named=spec.remove
        | {w.name for w in size.out.given_up}
        | {w.name for w in size.growth.refused},
        taken={name for kind, name in observed.conflicts if kind == "Pod"},
        failed_kept=size.failed_kept,
        deleting=observed.deleting,
        lost=observed.ranks.lost if observed.ranks else (),
        relocate=size.goal.relocate,
    )
    m = choose_members(spec.name, workers, size.goal.workers, spec.main_container, facts)
    if any(turn.gone(w.uid) and not w.terminating for w in workers):
        # Accepted deletes the cache has yet to show: look again once the acceptance
        # is forgotten, in case a pod never goes.
        turn.requeue(DELETE_MEMORY_SECONDS)
    return m


@dataclass(frozen=True)
class _Members:
    m: Membership
    create_now: Sequence[int]
    hosts: host_list.Hosts
    victims: Sequence[Victim]
    # A job-stopping notice the controller posted (a suspension in its window).
    stop: Stop | None


def _with_workers(turn: Turn, size: _Size) -> bool:
    """Whether the launcher is made with its workers under Kueue: Kueue admitted the whole
    job, and its waitForPodsReady counts every pod from the admission. A launcher made only
    once its workers run takes a second trip through the scheduler and the kubelet: in a
    wave of 1000 jobs its PodsReady came 75 s (p50) and 110 s (max) after the host list
    was right, and 269 s after the admission, against Kueue's default timeout of 300 s
    (bench/wave.py, docs/benchmarks.md). Only where the launcher's pod waits for the workers
    itself (its kubectl delivery init container), and not while the job is suspended for
    capacity, which resumes once its minimum runs again."""
    return (
        turn.observed.queue is not None
        and size.suspension is None
        and turn.settings.kubectl_delivery is KubectlDelivery.INIT_CONTAINER
    )


def _children(
    turn: Turn,
    spec: JobSpec,
    launcher: Mapping[str, Any] | None,
    size: _Size,
    members: _Members,
    restarts: Restarts,
    below_since: datetime | None,
) -> Desired:
    """The running job's children, and what its status says of them."""
    m, listed, victims = members.m, members.hosts.listed, members.victims
    retired = m.retired | {v.worker.index for v in victims if v.retire}
    # Every requested worker runs: the scale-out succeeded.
    backoff = size.out.backoff if len(listed) < size.wanted else None
    # The launcher starts once every worker the job wants exists, none of its names is
    # taken, and the workers the job minimally needs can take ranks; a suspended job,
    # whose attempt may be in its backoff with no worker wanted, needs its minimum.
    needed = (
        size.goal.workers if spec.bounds.min is None else min(spec.bounds.min, size.goal.workers)
    )
    if size.suspension is not None:
        needed = spec.bounds.min or 0
    # Under a gang scheduler the launcher is one of the gang, which is held until all of
    # it exists: it is made with its workers, as training-operator makes it, and its
    # kubectl delivery waits for the workers to be listed (render_pods.py). Never alone,
    # though: not while a suspended job waits out its backoff with no worker.
    gang = podgroups.gang(turn.settings)
    with_workers = gang is not None or _with_workers(turn, size)
    ready = len(listed) >= needed or (with_workers and len(m.keep) >= needed)
    # A job suspended for capacity resumes once its minimum is listed, not when its
    # launcher is made: under a gang that is made with the attempt's workers, and the
    # attempt's own timeout (not the below-minimum clock) must still be able to end it.
    resuming = size.suspension is not None and len(listed) >= needed
    state = {
        names.ANN_LAUNCHER_RESTARTS: str(restarts.done) if restarts.done else "",
        names.ANN_WORKER_FAILURES: size.failures.format(),
        names.ANN_WORKERS: str(size.replicas),
        names.ANN_RETIRED_WORKERS: format_indexes(retired),
        names.ANN_SCALE_OUT_BACKOFF: backoff.format() if backoff is not None else "",
        names.ANN_BELOW_MIN_SINCE: format_precise_time(below_since) if below_since else "",
        names.ANN_SUSPENDED: (size.suspension.format() if size.suspension and not resuming else ""),
        names.ANN_GROWTH: size.growth.state.format(),
        names.ANN_PREEMPTED: size.growth.preempted,
        names.ANN_HOSTS_ADDED: host_list.hosts_added(turn, listed),
    }
    members_names = host_list.by_index(spec.name, m.keep, m.new_indexes)
    data = render.config_data(spec, turn.settings, members_names, listed, members.hosts.launcher)
    hash_ = render.config_hash(data)
    objects = children.objects(
        turn, spec, members.hosts.role_names, data, {k: v for k, v in state.items() if v}
    )
    obsolete: tuple[str, ...] = ()
    if spec.bounds.min and size.suspension is None:
        objects[BUDGET] = render.disruption_budget(spec, spec.bounds.min)
    else:
        obsolete = (BUDGET,)
    conditions.membership(turn, spec, m, members.create_now, size.goal.workers)
    if gang is not None:
        objects[GANG] = children.pod_group(turn, spec, gang)
    old_hosts = discovered_hosts((turn.observed.config_map or {}).get("data"))
    opportunistic.grown(turn, m.keep, listed, old_hosts)
    waiting = launcher is not None or bool(m.new_indexes) or not ready
    new_launcher = None if waiting else children.new_launcher(turn, spec, objects, hash_, needed)
    if resuming:
        made = launcher is not None and not Worker(-1, launcher).terminating
        run_policy.resumed(turn, spec, len(listed), made=made)
    run_policy.running(turn, spec, launcher)
    conditions.spec_valid(turn, spec, bool(members.create_now) or new_launcher is not None)
    conditions.scaling(turn, spec, size.wanted, listed, victims, backoff, size.goal.moving)
    conditions.waiting_for_ranks(turn, members.hosts.rules.waiting, size.goal.moving)
    driver_down = restarts.now or (launcher is not None and Worker(-1, launcher).phase == "Failed")
    rules = members.hosts.rules
    trains = goodput.training(len(rules.holders), len(rules.committed), size.replicas)
    _goodput(turn, goodput.WAITING if driver_down else trains, size.replicas)
    turn.status.fields["elastic"] = {
        # The files still name them, but no driver trains on them.
        "listed": 0 if driver_down else len(listed),
        "draining": sum(1 for v in victims if v.deadline is not None or v.action == "mark"),
        "retired": format_indexes(retired),
        **_bounds(spec),
        **opportunistic.split(spec, m.keep, listed),
        # Shown only once there is something to show.
        **({"workerFailures": size.failures.count} if size.failures.count else {}),
        **({"launcherRestarts": restarts.done} if restarts.done else {}),
    }
    # A launcher restarted because of its node or a signal: its name is freed first.
    restarted = [Worker(-1, launcher)] if restarts.now and launcher is not None else []
    return Desired(
        objects=objects,
        config_hash=hash_,
        workers=m.keep,
        new_pods=opportunistic.new_pods(
            turn, spec, m.keep, members.create_now, size.goal.workers - size.growth.extra, gang
        ),
        victims=victims,
        deletes=restarted + list(m.replace[:POD_WRITES_PER_TURN]),
        launcher=new_launcher,
        obsolete=obsolete,
        rank_holders=members.hosts.rules.committed,
        ranks=render.ranks_config_map(spec),
        notices=notices.running(turn, spec, launcher, m, victims, members.stop),
    )


def _goodput(turn: Turn, state: str, target: int) -> None:
    before = turn.status.observed.get("goodput")
    turn.status.fields["goodput"] = goodput.account(before, state, target, turn.now)


def _bounds(spec: JobSpec) -> dict[str, int]:
    """min- and max-replicas for `kubectl get mpijob`, whose columns are jsonPaths: one
    cannot name an annotation key with dots and slashes in it."""
    found = {"minReplicas": spec.bounds.min, "maxReplicas": spec.bounds.max}
    return {k: v for k, v in found.items() if v is not None}
