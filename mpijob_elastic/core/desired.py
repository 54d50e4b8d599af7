"""What one job's children should be now: a pure value computed from (job, observed, now).

Everything that makes scaling safe is decided here, and ``diff.py`` only turns it into
ordered writes:

* Scale-up: the launcher Role grants exec on the workers the job controls and on those
  it creates in this turn, written once their creates went through (``diff.py``), so a
  name someone else's pod holds is never granted. A worker enters ``discover_hosts.sh``
  only once its main container runs and the Role we last wrote grants it.
* Membership (``membership.py``): which workers stay, which leave and why, and which
  names are retired because Horovod may have blacklisted them.
* Scale-in: victims leave ``hostfile`` and ``discover_hosts.sh`` first. A drain mark on
  the pod records when; a mark on a worker that the observed host list still names is
  stale (a scale-up took the worker back and a restart lost the clean-up), so its drain
  starts again instead of ending at once. A victim is deleted once a read of the launcher
  shows its ranks have left (``ranks.py``), no sooner than a short floor after the mark
  and no later than ``drain-seconds`` after it; one that cannot run ranks goes at once.
* Bad input never deletes anything: an invalid spec freezes the job's children, and
  Worker replicas outside the job's bounds keep the job at its current size. A child name
  held by an object the job does not control is never granted, written or waited on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names, render
from mpijob_elastic.core.actions import DELETE_MEMORY_SECONDS, Emit, Observed, Probe
from mpijob_elastic.core.membership import (
    Leaving,
    Membership,
    describe,
    format_indexes,
    parse_indexes,
    plan_membership,
)
from mpijob_elastic.core.ranks import (
    DRAIN_FLOOR_SECONDS,
    PROBE_INTERVAL_SECONDS,
    RANK_FREE_GRACE_SECONDS,
    reported,
    seen_by,
)
from mpijob_elastic.core.scaleout import (
    Backoff,
    next_backoff,
    parse_backoff,
    stuck,
    why_not_running,
)
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec import InvalidSpec, JobSpec, parse
from mpijob_elastic.core.status import (
    CREATED,
    FAILED,
    INVALID,
    POD_REJECTED,
    REFUSED,
    RESTARTING,
    RUNNING,
    SCALING,
    SUCCEEDED,
    SUSPENDED,
    UNSUPPORTED,
    StatusBuilder,
    replica_statuses,
)
from mpijob_elastic.core.suspend import Suspension, intent, parse_suspension
from mpijob_elastic.core.times import format_precise_time, format_time, parse_time
from mpijob_elastic.core.workers import (
    Worker,
    discovered_hosts,
    hostfile_workers,
    listed_hosts,
    split_pods,
)

Obj = dict[str, Any]

# Pod creates and deletes one reconcile may make. A job of a thousand workers then takes
# several turns, and the jobs queued behind it get theirs in between instead of waiting
# for a thousand round trips.
POD_WRITES_PER_TURN = 100
_BUDGET = "PodDisruptionBudget"
# Pod status reasons that mean the node, not the program, ended the pod.
_NODE_REASONS = frozenset({"Evicted", "NodeLost", "NodeShutdown", "Shutdown", "Terminated"})
# Worker failures (not caused by the node) are replaced at once the first time, then after
# a pause doubling from 10 s to at most 5 min; ten minutes without one forget them.
WORKER_BACKOFF_SECONDS = 10.0
WORKER_BACKOFF_MAX_SECONDS = 300.0
WORKER_FAILURES_FORGOTTEN_SECONDS = 600.0


@dataclass(frozen=True)
class Victim:
    worker: Worker
    # Why it leaves (membership.py): named, not in discovery, or the newest.
    why: str
    # When the drain ends at the latest; None: it has not begun (the worker is still
    # listed, or unmarked), or it needs none (no rank can run there).
    deadline: datetime | None
    # This turn's write for it: "mark" (its drain starts), "delete" (its drain is over), or
    # None (waiting, or left for a later turn).
    action: str | None = None
    # The delete's grace period; None: the pod's own.
    grace_seconds: int | None = None
    # Deleted at its deadline while the launcher still reached it: Horovod counts a
    # failure and blacklists the name, so it is never used again.
    retire: bool = False


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
    status: Obj
    events: Sequence[Emit]
    requeue_after: float | None
    # Read the launcher's remote shells: a victim's drain may end early (ranks.py).
    probe: Probe | None = None
    # Kinds of ``objects`` the job must no longer have (its PodDisruptionBudget, once it
    # is suspended, finished or no longer elastic).
    obsolete: Sequence[str] = ()
    # The finished job's runPolicy.ttlSecondsAfterFinished is over: delete the job itself.
    delete_job: bool = False
    # The ranks ConfigMap to create if missing; its data is the launcher's (ranks.py).
    ranks: Obj | None = None


class _Builder:
    def __init__(self, observed: Observed, settings: Settings, now: datetime) -> None:
        self.observed = observed
        self.settings = settings
        self.now = now
        self.job = observed.job
        self.job_name = str(self.job["metadata"]["name"])
        self.status = StatusBuilder(self.job, now)
        self.events: list[Emit] = []
        self.requeue_after: float | None = None
        self.probe: Probe | None = None
        # Workers on going nodes that stay until their replacements run, with why.
        self.moving: Mapping[str, str] = {}

    @property
    def state(self) -> Mapping[str, Any]:
        """What earlier turns stored on the job's ConfigMap (its annotations)."""
        config_map = self.observed.config_map or {}
        return (config_map.get("metadata") or {}).get("annotations") or {}

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Emit(type_, reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def frozen(self, deletes: Sequence[Worker] = (), obsolete: Sequence[str] = ()) -> Desired:
        return Desired(
            {},
            None,
            (),
            (),
            (),
            deletes,
            None,
            self.status.build(),
            self.events,
            # A finished job's clean-up of more pods than one turn writes, and its TTL.
            self.requeue_after,
            obsolete=obsolete,
        )

    def build(self) -> Desired:
        s = self.status
        if s.get(CREATED) is None:
            s.set(CREATED, True, "MPIJobCreated", f"MPIJob {self.job_name} is created.")
        s.fields.setdefault("startTime", s.observed.get("startTime") or s.now)
        workers, launcher = split_pods(self.job_name, self.observed.pods)
        s.fields["replicaStatuses"] = replica_statuses(self.job_name, workers, launcher)
        try:
            spec = parse(
                self.job,
                self.settings.default_drain_seconds,
                max_workers=self.settings.max_workers_per_job,
                default_scale_out_timeout=self.settings.default_scale_out_timeout_seconds,
                protected_service_account=self.settings.own_service_account,
            )
        except InvalidSpec as err:
            # Leave every child as it is: a typo must not cost the job its workers.
            if s.set(INVALID, True, "InvalidSpec", str(err)):
                self.event("Warning", "InvalidSpec", str(err))
            return self.frozen()
        self.report_unsupported(spec)
        restarts, restart = self.launcher_restarts(spec, launcher)
        if (
            s.is_true(SUCCEEDED)
            or s.is_true(FAILED)
            or self.past_deadline(spec)
            or (launcher is not None and not restart and self.launcher_finished(launcher))
        ):
            # Nothing is listed or draining once the job has finished.
            elastic = s.observed.get("elastic")
            if isinstance(elastic, Mapping):
                s.fields["elastic"] = {**elastic, "listed": 0, "draining": 0}
            # Pods left running by cleanPodPolicy must not block a node's drain.
            expired = self.expired(spec)
            finished = self.frozen(self.clean_up(spec, workers, launcher), (_BUDGET,))
            return replace(finished, delete_job=expired)
        if spec.suspend:
            # runPolicy.suspend, as training-operator does it: everything stops, a resume
            # starts the training again from the user's checkpoint.
            message = f"MPIJob {spec.name} is suspended."
            if s.set(SUSPENDED, True, "MPIJobSuspended", message):
                self.event("Normal", "MPIJobSuspended", message)
            return self.stop(spec, workers, launcher, {})
        suspended = s.get(SUSPENDED)
        if s.is_true(SUSPENDED) and (suspended or {}).get("reason") == "MPIJobSuspended":
            message = f"MPIJob {spec.name} is resumed."
            s.set(SUSPENDED, False, "MPIJobResumed", message)
            self.event("Normal", "MPIJobResumed", message)
            # As a Kubernetes Job does: the active deadline counts from the resume.
            s.fields["startTime"] = s.now
        return self.scale(spec, workers, launcher, self.target(spec, workers), restarts, restart)

    def hold(self, target: int, workers: Sequence[Worker], going: set[str], until: datetime) -> int:
        """No new workers until ``until``: the target is at most the workers that stay
        (neither leaving already nor in ``going``)."""
        staying = [
            w
            for w in workers
            if not w.terminating and w.uid not in self.observed.deleting and w.name not in going
        ]
        self.requeue((until - self.now).total_seconds())
        return min(target, len(staying))

    def worker_failures(
        self, replacing: Sequence[Worker], annotations: Mapping[str, Any]
    ) -> tuple[int, datetime | None]:
        """Worker failures in a row, counting the ones replaced now unless their node
        caused them (those say nothing of the program), and when the last one was seen."""
        count, _, at = str(annotations.get(names.ANN_WORKER_FAILURES) or "").partition(" ")
        failures, last = _count(count), parse_time(at)
        if last is None or (self.now - last).total_seconds() >= WORKER_FAILURES_FORGOTTEN_SECONDS:
            failures, last = 0, None
        own = [w for w in replacing if not (w.reason in _NODE_REASONS or w.disrupted)]
        if own:
            failures, last = failures + len(own), self.now
        return failures, last

    def report_unsupported(self, spec: JobSpec) -> None:
        s = self.status
        if spec.scheduling_policy:
            message = (
                "spec.runPolicy.schedulingPolicy is not supported: no PodGroup is made and "
                "the pods are scheduled one by one (an elastic job starts with what it gets); "
                "remove the field to clear this"
            )
            if s.set(UNSUPPORTED, True, "SchedulingPolicyIgnored", message):
                self.event("Warning", "SchedulingPolicyIgnored", message)
        else:
            s.clear(UNSUPPORTED, "Supported", "every field in use is supported")

    def past_deadline(self, spec: JobSpec) -> bool:
        """runPolicy.activeDeadlineSeconds, counted from startTime (reset on a resume):
        past it the job fails and cleanPodPolicy applies, as in training-operator."""
        deadline = spec.active_deadline_seconds
        start = parse_time(self.status.fields.get("startTime"))
        if deadline is None or start is None or spec.suspend:
            return False
        due = start + timedelta(seconds=deadline)
        if self.now < due:
            self.requeue((due - self.now).total_seconds())
            return False
        self.fail(
            f"Job {spec.name} has failed because it was active longer than specified deadline"
        )
        return True

    def fail(self, message: str) -> None:
        s = self.status
        if s.set(FAILED, True, "MPIJobFailed", message):
            self.event("Warning", "MPIJobFailed", message)
        if s.get(RUNNING) is not None:
            s.set(RUNNING, False, "MPIJobFinished", f"MPIJob {self.job_name} has finished.")
        s.clear(SCALING, "ScalingComplete", "the job has finished")
        s.fields["completionTime"] = s.observed.get("completionTime") or s.now

    def expired(self, spec: JobSpec) -> bool:
        """runPolicy.ttlSecondsAfterFinished: the finished job is deleted after it."""
        ttl = spec.ttl_seconds_after_finished
        s = self.status
        done = parse_time(s.fields.get("completionTime") or s.observed.get("completionTime"))
        if ttl is None or done is None:
            return False
        due = done + timedelta(seconds=ttl)
        if self.now < due:
            self.requeue((due - self.now).total_seconds())
            return False
        return True

    def launcher_restarts(
        self, spec: JobSpec, launcher: Mapping[str, Any] | None
    ) -> tuple[int, bool]:
        """How many times the launcher has been restarted (counting this turn's), and
        whether it is restarted now: it failed by its node or a signal under OnFailure,
        ExitCode or Always, or vanished while the job ran (deleted, or lost with its node). Past
        runPolicy.backoffLimit the job fails instead."""
        s = self.status
        done = _count(self.state.get(names.ANN_LAUNCHER_RESTARTS))
        if s.is_true(SUCCEEDED) or s.is_true(FAILED) or spec.suspend:
            return done, False
        if launcher is None:
            if not s.is_true(RUNNING):
                return done, False
            why = "the launcher pod is gone (deleted, or lost with its node)"
        else:
            pod = Worker(-1, launcher)
            if pod.phase != "Failed" or pod.terminating or pod.uid in self.observed.deleting:
                return done, False
            failure = self.launcher_failure(spec, pod)
            if failure is None:
                return done, False  # the program's own failure: the job fails
            why = failure
        limit = spec.backoff_limit
        if limit is not None and done >= limit:
            self.fail(
                f"Job {spec.name} has failed because it has reached the specified backoff "
                f"limit ({limit} launcher restarts; the last: {why})"
            )
            return done, False
        message = f"MPIJob {spec.name} is restarting: {why} (restart {done + 1}"
        message += f" of at most {limit})" if limit is not None else ")"
        s.set(RESTARTING, True, "MPIJobRestarting", message)
        s.set(RUNNING, False, "MPIJobRestarting", message)
        self.event("Warning", "MPIJobRestarting", message)
        return done + 1, True

    def launcher_failure(self, spec: JobSpec, pod: Worker) -> str | None:
        """Why a failed launcher is worth starting again, or None if its failure is the
        job's own (v1: Never, or ExitCode with an exit code of 1-127)."""
        policy = spec.launcher.restart_policy
        if policy == "Never":
            return None
        node = pod.reason in _NODE_REASONS or pod.disrupted
        code = pod.exit_code(spec.main_container)
        if policy == "ExitCode" and not node and (code is None or code < 128):
            return None
        if node:
            return f"its node stopped it ({pod.reason or 'DisruptionTarget'})"
        return f"it exited with code {code}"

    def target(self, spec: JobSpec, workers: Sequence[Worker]) -> int:
        """How many workers the job should have: Worker replicas, if within bounds."""
        requested = spec.worker.replicas
        if spec.bounds.contains(requested):
            return requested
        # Refuse the value: keep as many workers as the job had (its last hostfile, so a
        # worker lost meanwhile is still replaced), or, for a new job, the nearest bound.
        members = hostfile_workers(spec.name, (self.observed.config_map or {}).get("data"))
        held = [w for w in workers if not w.terminating and not w.marked]
        had = len(members) or len(held)
        keep = spec.bounds.clamp(had if had else requested)
        message = (
            f"spec.mpiReplicaSpecs.Worker.replicas: {requested} is outside the job's bounds "
            f"{spec.bounds.describe()} (annotations {names.ANN_MIN_REPLICAS}, "
            f"{names.ANN_MAX_REPLICAS}); keeping {keep} workers"
        )
        if self.status.set(INVALID, True, "ReplicasOutOfRange", message):
            self.event("Warning", "ReplicasOutOfRange", message)
        return keep

    def taken(self, kind: str, name: str) -> bool:
        return (kind, name) in self.observed.conflicts

    def scale(
        self,
        spec: JobSpec,
        workers: Sequence[Worker],
        launcher: Mapping[str, Any] | None,
        target: int,
        restarts: int = 0,
        restart: bool = False,
    ) -> Desired:
        s = self.status
        main = spec.main_container
        config_map = self.observed.config_map or {}
        old_data = config_map.get("data")
        old_annotations = self.state
        failed = [w for w in workers if w.phase == "Failed" and not w.terminating]
        replacing = {w.name for w in failed if self.replace_failed(spec, w)}
        failed_kept = [w.name for w in failed if w.name not in replacing]
        failures, last_failure = self.worker_failures(
            [w for w in failed if w.name in replacing], old_annotations
        )
        pause = _worker_pause(failures)
        if last_failure is not None and self.now < last_failure + pause:
            # Failing workers are replaced after a pause that grows with each failure in a
            # row: an OOM-killed worker is not recreated in a tight loop.
            target = self.hold(target, workers, {w.name for w in failed}, last_failure + pause)
        requested = target
        backoff = parse_backoff(old_annotations.get(names.ANN_SCALE_OUT_BACKOFF))
        suspension = parse_suspension(old_annotations.get(names.ANN_SUSPENDED))
        if spec.bounds.min is None:
            suspension = None  # no longer elastic: it runs as v1 does, once every worker is up
        elif suspension is not None and suspension.intent != intent(self.job, spec):
            # The user changed the job: that is a request for a new attempt now.
            suspension = Suspension(suspension.since, intent(self.job, spec))
            backoff = None
        backoff, given_up = self.scale_out(spec, workers, target, backoff)
        if suspension is not None and given_up:
            # The attempt failed: release what it got, wait out the backoff.
            return self.suspend(spec, workers, launcher, suspension, backoff, 0)
        if backoff is not None and self.now < backoff.retry_at:
            # Running below the requested size until the backoff is over.
            target = self.hold(target, workers, {w.name for w in given_up}, backoff.retry_at)
        relocate = self.relocate(spec, workers)
        elsewhere = sum(1 for w in workers if w.name not in relocate and w.can_take_ranks(main))
        if relocate and elsewhere < target:
            # Make before break: the workers on going nodes stay until their replacements
            # take ranks elsewhere (their eviction, if it comes first, is a graceful leave
            # of its own), so a cordon with nowhere to go costs the job nothing.
            if backoff is None or self.now >= backoff.retry_at:
                target += len(relocate)
            self.moving = relocate
            relocate = {}
        m = plan_membership(
            spec.name,
            workers,
            target,
            listed=discovered_hosts(old_data),
            retired=parse_indexes(old_annotations.get(names.ANN_RETIRED_WORKERS)),
            named=spec.remove | {w.name for w in given_up},
            taken={name for kind, name in self.observed.conflicts if kind == "Pod"},
            main=main,
            failed_kept=failed_kept,
            deleting=self.observed.deleting,
            lost=self.observed.ranks.lost if self.observed.ranks else (),
            relocate=relocate,
        )
        if any(w.uid in self.observed.deleting and not w.terminating for w in workers):
            # Accepted deletes the cache has yet to show: look again once the acceptance
            # is forgotten, in case a pod never goes.
            self.requeue(DELETE_MEMORY_SECONDS)
        create_now = list(m.new_indexes[:POD_WRITES_PER_TURN])
        if len(m.new_indexes) > len(create_now):
            self.requeue(0)

        # Exec rights only on pods the job controls or creates in this turn: never on a
        # name that someone else's pod holds.
        role_names = _by_index(spec.name, workers, create_now)
        granted = render.exec_names(self.observed.role)
        hosts = [w.name for w in m.keep if w.can_take_ranks(main) and w.name in granted]
        # A launcher that is a host may exec into itself once it exists as the job's (a pod
        # of that name that is not ours is never granted), and is listed, first, once the
        # Role we wrote grants it. It is no worker: never a victim, not counted against
        # min-replicas, max-replicas or Worker replicas.
        launcher_host = (
            render.launcher_is_host(spec)
            and launcher is not None
            and not launcher["metadata"].get("deletionTimestamp")
        )
        if launcher_host:
            role_names.insert(0, names.launcher_name(spec.name))
        launcher_listed = launcher_host and names.launcher_name(spec.name) in granted
        below_since = self.below_min(spec, launcher, hosts, old_annotations, suspension)
        if below_since is not None and suspension is None:
            timeout = timedelta(seconds=spec.below_min_timeout)
            if self.now - below_since >= timeout:
                now = Suspension(self.now, intent(self.job, spec))
                return self.suspend(spec, workers, launcher, now, None, len(hosts))
            self.requeue((below_since + timeout - self.now).total_seconds())
        members = _by_index(spec.name, m.keep, m.new_indexes)
        victims = self.drain(spec, m.leaving, listed_hosts(old_data), launcher)
        retired = m.retired | {v.worker.index for v in victims if v.retire}
        if backoff is not None and len(hosts) >= requested:
            backoff = None  # every requested worker runs: the scale-out succeeded
        # The launcher starts once every worker the job wants exists, none of its names is
        # taken, and the workers the job minimally needs can take ranks; a suspended job,
        # whose attempt may be in its backoff with no worker wanted, needs its minimum.
        needed = target if spec.bounds.min is None else min(spec.bounds.min, target)
        if suspension is not None:
            needed = spec.bounds.min or 0
        resuming = suspension is not None and launcher is None and len(hosts) >= needed
        state = {
            names.ANN_LAUNCHER_RESTARTS: str(restarts) if restarts else "",
            names.ANN_WORKER_FAILURES: (
                f"{failures} {format_precise_time(last_failure)}" if last_failure else ""
            ),
            names.ANN_RETIRED_WORKERS: format_indexes(retired),
            names.ANN_SCALE_OUT_BACKOFF: backoff.format() if backoff is not None else "",
            names.ANN_BELOW_MIN_SINCE: format_precise_time(below_since) if below_since else "",
            names.ANN_SUSPENDED: suspension.format() if suspension and not resuming else "",
        }
        data = render.config_data(spec, self.settings, members, hosts, launcher_listed)
        hash_ = render.config_hash(data)
        objects = {
            **self.service_account(spec),
            # The reports' grant on the job's ranks ConfigMap (ranks.py), never on a name
            # someone else holds: its create comes first (diff.py), and a refused one
            # stops the turn before this Role is written.
            "Role": render.role(
                spec, role_names, ranks=not self.taken("ConfigMap", names.ranks_name(spec.name))
            ),
            "RoleBinding": render.role_binding(spec),
            "ConfigMap": render.config_map(spec, data, {k: v for k, v in state.items() if v}),
        }
        obsolete: tuple[str, ...] = ()
        if spec.bounds.min and suspension is None:
            objects[_BUDGET] = render.disruption_budget(spec, spec.bounds.min)
        else:
            obsolete = (_BUDGET,)
        self.report_membership(spec, m, create_now, old_data, target)

        blocked = any(self.taken(kind, obj["metadata"]["name"]) for kind, obj in objects.items())
        new_launcher = None
        if (
            launcher is None
            and not m.new_indexes
            and not blocked
            and not self.taken("Pod", names.launcher_name(spec.name))
            and len(hosts) >= needed
        ):
            new_launcher = render.launcher_pod(spec, self.settings, hash_, needed)
            if resuming:
                message = (
                    f"{len(hosts)} workers run, at least min-replicas {spec.bounds.min}: "
                    "starting the launcher again; training continues from its last checkpoint"
                )
                s.set(SUSPENDED, False, "Resumed", message)
                self.event("Normal", "Resumed", message)
        if launcher is not None and (launcher.get("status") or {}).get("phase") == "Running":
            s.set(RUNNING, True, "MPIJobRunning", f"MPIJob {spec.name} is running.")
            s.clear(RESTARTING, "MPIJobRunning", f"MPIJob {spec.name} is running.")

        # A pod template the API server refused stays reported until a pod create goes
        # through, which a plan without pod creates implies.
        invalid = s.get(INVALID)
        creating = bool(create_now) or new_launcher is not None
        if (
            spec.bounds.contains(spec.worker.replicas)
            and invalid is not None
            and not (invalid.get("reason") == POD_REJECTED and creating)
        ):
            s.clear(INVALID, "SpecValid", "The spec is valid.")
        self.report_scaling(spec, requested, hosts, victims, backoff)
        s.fields["elastic"] = {
            "listed": len(hosts),
            "draining": sum(1 for v in victims if v.deadline is not None or v.action == "mark"),
            "retired": format_indexes(retired),
            **_bounds(spec),
            # Shown only once there is something to show.
            **({"workerFailures": failures} if failures else {}),
            **({"launcherRestarts": restarts} if restarts else {}),
        }
        self.report_conflicts()
        return Desired(
            objects=objects,
            config_hash=hash_,
            workers=m.keep,
            new_pods=[render.worker_pod(spec, i) for i in create_now],
            victims=victims,
            # A launcher restarted because of its node or a signal: its name is freed first.
            deletes=([Worker(-1, launcher)] if restart and launcher is not None else [])
            + list(m.replace[:POD_WRITES_PER_TURN]),
            launcher=new_launcher,
            status=s.build(),
            events=self.events,
            requeue_after=self.requeue_after,
            probe=self.probe,
            obsolete=obsolete,
            ranks=render.ranks_config_map(spec),
        )

    def service_account(self, spec: JobSpec) -> dict[str, Obj]:
        """The launcher's ServiceAccount to create and keep, unless one of that name that
        the job does not control exists: that one is used as it is, never written."""
        if self.observed.service_account is None and (
            ("ServiceAccount", spec.service_account) in self.observed.in_use
        ):
            return {}
        return {"ServiceAccount": render.service_account(spec)}

    def below_min(
        self,
        spec: JobSpec,
        launcher: Mapping[str, Any] | None,
        hosts: Sequence[str],
        annotations: Mapping[str, Any],
        suspension: Suspension | None,
    ) -> datetime | None:
        """Since when the running job has had fewer than min-replicas workers listed, if
        it has now and is to be suspended for it; None otherwise."""
        if spec.below_min_timeout <= 0 or not spec.bounds.min or suspension is not None:
            return None
        # Only a launcher that runs has anything to lose; before its first start the
        # scale-out timeout alone deals with capacity that does not come.
        if launcher is None or launcher["metadata"].get("deletionTimestamp"):
            return None
        if len(hosts) >= spec.bounds.min:
            return None
        return parse_time(annotations.get(names.ANN_BELOW_MIN_SINCE)) or self.now

    def suspend(
        self,
        spec: JobSpec,
        workers: Sequence[Worker],
        launcher: Mapping[str, Any] | None,
        suspension: Suspension,
        backoff: Backoff | None,
        listed: int,
    ) -> Desired:
        """The launcher and every worker deleted, the job, ConfigMap and RBAC kept: on
        entering the suspension (``listed`` workers were left), and when an attempt to
        resume timed out (``backoff`` says when the next one is)."""
        minimum = spec.bounds.min
        if backoff is None:
            message = (
                f"only {listed} of the min-replicas {minimum} workers were listed for "
                f"{spec.below_min_timeout:g}s ({names.ANN_BELOW_MIN_TIMEOUT}): launcher and "
                f"workers deleted, the job, its ConfigMap and RBAC kept; creating "
                f"{spec.worker.replicas} workers again now, resuming once {minimum} run"
            )
            self.event("Warning", "Suspended", message)
            self.requeue(0)
        else:
            message = (
                f"waiting for capacity: fewer than min-replicas {minimum} workers ran within "
                f"{spec.scale_out_timeout:g}s ({backoff.reason}); trying again at "
                f"{format_time(backoff.retry_at)} (attempt {backoff.attempts + 1})"
            )
            self.requeue((backoff.retry_at - self.now).total_seconds())
        self.status.set(SUSPENDED, True, "WaitingForCapacity", message)
        state = {names.ANN_SUSPENDED: suspension.format()}
        if backoff is not None:
            state[names.ANN_SCALE_OUT_BACKOFF] = backoff.format()
        return self.stop(spec, workers, launcher, state)

    def stop(
        self,
        spec: JobSpec,
        workers: Sequence[Worker],
        launcher: Mapping[str, Any] | None,
        state: Mapping[str, str],
    ) -> Desired:
        """A suspended job: no launcher, no workers; the job, its ConfigMap (carrying
        ``state``) and RBAC kept."""
        s = self.status
        pods = list(workers) + ([Worker(-1, launcher)] if launcher is not None else [])
        doomed = [w for w in pods if not w.terminating and w.uid not in self.observed.deleting]
        if len(doomed) > POD_WRITES_PER_TURN:
            self.requeue(0)
        if s.get(RUNNING) is not None:
            s.set(RUNNING, False, "MPIJobSuspended", f"MPIJob {spec.name} is suspended.")
        s.clear(SCALING, "Suspended", "the job is suspended")
        s.fields["elastic"] = {"listed": 0, "draining": 0, "retired": "", **_bounds(spec)}
        # A new launcher is a new Horovod job with an empty blacklist: names are fresh again.
        data = render.config_data(spec, self.settings, [], [])
        objects = {
            **self.service_account(spec),
            "Role": render.role(spec, []),
            "RoleBinding": render.role_binding(spec),
            "ConfigMap": render.config_map(spec, data, state),
        }
        return Desired(
            objects=objects,
            config_hash=None,
            workers=(),
            new_pods=(),
            victims=(),
            deletes=doomed[:POD_WRITES_PER_TURN],
            launcher=None,
            status=s.build(),
            events=self.events,
            requeue_after=self.requeue_after,
            obsolete=(_BUDGET,),
        )

    def drain(
        self,
        spec: JobSpec,
        leaving: Sequence[Leaving],
        listed: set[str],
        launcher: Mapping[str, Any] | None,
    ) -> list[Victim]:
        """Each leaving worker's drain: unlisted first, deleted once its ranks have left.

        A worker that cannot be running ranks (not started, failed) goes at once. Any
        other is marked when the host list drops it; from the floor on (ranks.py), it is
        deleted as soon as a read of the launcher no longer shows a remote shell into it,
        and at the latest when ``drain-seconds`` are over.
        """
        main = spec.main_container
        victims: list[Victim] = []
        marking: list[str] = []
        due: list[Victim] = []
        drain = timedelta(seconds=spec.drain_seconds)
        floor = timedelta(seconds=min(DRAIN_FLOOR_SECONDS, spec.drain_seconds))
        reports = self.observed.ranks
        for item in leaving:
            w = item.worker
            since = w.draining_since
            deadline: datetime | None = None
            action: str | None = None
            grace: int | None = None
            retire = False
            if not w.main_running(main):
                # No rank runs there (ranks live in the main container): nothing to wait
                # for. This turn's host-list write, made before any delete, drops it.
                action = "delete"
            elif spec.drain_seconds == 0:
                deadline = self.now
                action = "delete"
            elif since is None or w.name in listed:
                # Unmarked, a mark edited into nonsense, or a mark from a drain that a
                # scale-up undid: the drain starts with this turn's host-list write.
                self.requeue(0 if len(marking) >= POD_WRITES_PER_TURN else floor.total_seconds())
                if len(marking) < POD_WRITES_PER_TURN:
                    marking.append(w.name)
                    action = "mark"
            else:
                deadline = since + drain
                reached = since + floor
                seen = seen_by(w.name, reports, self.observed.ranks_read, reached)
                if self.now >= deadline:
                    action = "delete"
                    # Deleted under a running rank: Horovod counts a failure.
                    retire = seen is not None and w.name in seen
                elif self.now < reached:
                    self.requeue((reached - self.now).total_seconds())
                elif seen is not None and w.name not in seen:
                    action = "delete"
                    grace = RANK_FREE_GRACE_SECONDS
                else:
                    if not reported(w.name, reports):
                        # The reports say nothing of it: an exec read must (ranks.py).
                        self.want_probe(spec, launcher, PROBE_INTERVAL_SECONDS)
                    self.requeue((deadline - self.now).total_seconds())
            if action == "delete" and len(due) >= POD_WRITES_PER_TURN:
                self.requeue(0)
                action = None
            victim = Victim(w, item.why, deadline, action, grace, retire)
            if action == "delete":
                due.append(victim)
            victims.append(victim)
        if marking:
            self.event(
                "Normal",
                "Draining",
                f"draining worker pods {describe([i for i in leaving if i.worker.name in marking])}"
                f": removed from discover_hosts.sh, deleting each once its ranks have left, "
                f"within {spec.drain_seconds:g}s",
            )
        if due:
            self.event(
                "Normal",
                "WorkerDeleted",
                "deleted worker pods "
                + ", ".join(f"{v.worker.name} ({_gone_why(v)})" for v in due),
            )
            if spec.drain_seconds == 0 and any(v.deadline is not None for v in due):
                self.event(
                    "Warning",
                    "DrainDisabled",
                    f"{names.ANN_DRAIN_SECONDS} is 0: worker pods are deleted while Horovod may "
                    "still run ranks there, which it counts as failures, blacklisting the names",
                )
        return victims

    def relocate(self, spec: JobSpec, workers: Sequence[Worker]) -> dict[str, str]:
        """Workers of an elastic job on nodes that are going away: they leave gracefully
        and are replaced elsewhere, keeping the job at its size. A job without elastic
        bounds (v1) cannot lose a worker gracefully, so it is left as it is."""
        leaving = self.observed.leaving_nodes
        if spec.bounds.min is None or not leaving:
            return {}
        return {
            w.name: f"node {node} {leaving[node]}"
            for w in workers
            if (node := w.node) is not None and node in leaving and not w.terminating
        }

    def scale_out(
        self, spec: JobSpec, workers: Sequence[Worker], target: int, backoff: Backoff | None
    ) -> tuple[Backoff | None, list[Worker]]:
        """The scale-out backoff in force, and the new workers to give up on now."""
        # Only an elastic job can run below its requested size: one without min-replicas
        # needs every worker (v1), so it waits for them however long it takes.
        timeout = spec.scale_out_timeout if spec.bounds.min is not None else 0.0
        main = spec.main_container
        given_up = []
        for w in workers:
            if w.uid in self.observed.deleting:
                continue
            if stuck(w, main, self.now, timeout):
                given_up.append(w)
            elif timeout > 0 and not w.terminating and not w.main_running(main) and w.created:
                self.requeue(w.created + timeout - self.now.timestamp())
        if given_up:
            why = why_not_running(given_up[0], main)
            backoff = next_backoff(backoff, self.now, timeout, why)
            self.event(
                "Warning",
                "ScaleOutTimedOut",
                f"worker pods {', '.join(w.name for w in given_up)} were not running within "
                f"{timeout:g}s ({why}): deleting them; the job runs below its requested "
                f"{target} workers and tries again at {format_time(backoff.retry_at)} "
                f"(attempt {backoff.attempts}); Worker replicas is left as it is",
            )
        return backoff, given_up

    def want_probe(self, spec: JobSpec, launcher: Mapping[str, Any] | None, every: float) -> None:
        """Read the launcher if the last read is ``every`` seconds old; come back then."""
        if launcher is None or launcher["metadata"].get("deletionTimestamp"):
            return
        if (launcher.get("status") or {}).get("phase") != "Running":
            return
        last = self.observed.ranks_read
        age = (self.now - last.at).total_seconds() if last is not None else every
        if age < every:
            self.requeue(every - age)
            return
        self.requeue(every)
        containers = (launcher.get("spec") or {}).get("containers") or []
        index = render.main_container_index(spec, containers) if containers else None
        container = containers[index].get("name") if index is not None else None
        self.probe = Probe(str(launcher["metadata"]["name"]), container)

    def replace_failed(self, spec: JobSpec, worker: Worker) -> bool:
        if worker.phase != "Failed" or worker.terminating or worker.uid in self.observed.deleting:
            return False
        if worker.reason == "Evicted":
            replace = True  # the node's doing, not the program's
        elif spec.worker.restart_policy == "Never":
            replace = False
        elif spec.worker.restart_policy == "ExitCode":
            # v1 semantics: 1-127 is the program's own error, 128+ a signal worth retrying.
            code = worker.exit_code(spec.main_container)
            replace = code is not None and code >= 128
        else:
            replace = True
        if replace:
            why = worker.reason or f"exit code {worker.exit_code(spec.main_container)}"
            self.event(
                "Warning", "WorkerFailed", f"worker pod {worker.name} failed ({why}); replacing it"
            )
        return replace

    def report_membership(
        self, spec: JobSpec, m: Membership, create_now: Sequence[int], old_data: Any, target: int
    ) -> None:
        if m.newly_retired:
            retired = ", ".join(names.worker_name(spec.name, i) for i in sorted(m.newly_retired))
            self.event(
                "Warning",
                "WorkerRetired",
                f"worker pods {retired} lost their ranks while listed in discover_hosts.sh; "
                "Horovod blacklists such names, so their replacements get names never used "
                "in this job",
            )
        previous = len(hostfile_workers(spec.name, old_data))
        growth = max(target - previous, 0)
        new = [names.worker_name(spec.name, i) for i in create_now]
        if new[:growth]:
            self.event(
                "Normal",
                "ScaledUp",
                f"created worker pods {', '.join(new[:growth])}: scaling to {target} workers",
            )
        if new[growth:]:
            self.event(
                "Normal",
                "WorkerReplaced",
                f"created worker pods {', '.join(new[growth:])} "
                "in place of workers that failed or left",
            )

    def report_conflicts(self) -> None:
        if not self.observed.conflicts:
            return
        message = "; ".join(what for _, what in sorted(self.observed.conflicts.items()))
        message += ": rename or remove it; until then the job does without it"
        if self.status.set(REFUSED, True, "AlreadyExists", message):
            self.event("Warning", REFUSED, message)

    def report_scaling(
        self,
        spec: JobSpec,
        target: int,
        hosts: Sequence[str],
        victims: Sequence[Victim],
        backoff: Backoff | None,
    ) -> None:
        s = self.status
        if self.moving:
            moving = ", ".join(f"{name} ({why})" for name, why in sorted(self.moving.items()))
            s.set(
                SCALING,
                True,
                "Relocating",
                f"moving workers {moving} to other nodes: they stay until their replacements "
                f"take ranks ({len(hosts)} of {target} workers listed)",
            )
        elif backoff is not None and self.now < backoff.retry_at:
            s.set(
                SCALING,
                True,
                "ScaleOutBackoff",
                f"running {len(hosts)} of {target} workers: new workers were not running "
                f"within {spec.scale_out_timeout:g}s ({backoff.reason}); trying again at "
                f"{format_time(backoff.retry_at)} (attempt {backoff.attempts + 1})",
            )
        elif len(hosts) < target or victims:
            parts = []
            for v in victims:
                deadline = v.deadline
                if v.action == "mark":
                    deadline = self.now + timedelta(seconds=spec.drain_seconds)
                until = f", until {format_time(deadline)} at the latest" if deadline else ""
                parts.append(f"{v.worker.name} ({v.why}{until})")
            removing = f"removing {', '.join(parts)}" if parts else ""
            if len(hosts) < target:
                starting = f"{target - len(hosts)} not running yet"
                message = f"scaling workers from {len(hosts)} to {target}: " + "; ".join(
                    p for p in (starting, removing) if p
                )
                s.set(SCALING, True, "ScalingUp", message)
            else:
                s.set(
                    SCALING,
                    True,
                    "ScalingDown",
                    f"scaling workers from {len(hosts) + len(victims)} to {target}: {removing}",
                )
        elif s.get(SCALING) is not None:
            s.set(SCALING, False, "ScalingComplete", f"{target} workers ready")

    def launcher_finished(self, launcher: Mapping[str, Any]) -> bool:
        phase = (launcher.get("status") or {}).get("phase")
        s = self.status
        name = launcher["metadata"]["name"]
        if phase == "Succeeded":
            message = f"MPIJob {self.job_name} successfully completed."
            if s.set(SUCCEEDED, True, "MPIJobSucceeded", message):
                self.event("Normal", "MPIJobSucceeded", f"launcher {name} succeeded")
        elif phase == "Failed":
            message = f"MPIJob {self.job_name} has failed: launcher {name} failed."
            if s.set(FAILED, True, "MPIJobFailed", message):
                self.event("Warning", "MPIJobFailed", f"launcher {name} failed")
        else:
            return False
        if s.get(RUNNING) is not None:
            s.set(RUNNING, False, "MPIJobFinished", f"MPIJob {self.job_name} has finished.")
        s.clear(SCALING, "ScalingComplete", "the job has finished")
        s.fields["completionTime"] = s.observed.get("completionTime") or s.now
        return True

    def clean_up(
        self, spec: JobSpec, workers: Sequence[Worker], launcher: Mapping[str, Any] | None
    ) -> list[Worker]:
        policy = spec.clean_pod_policy
        if policy == "None":
            return []
        pods = list(workers) + ([Worker(-1, launcher)] if launcher is not None else [])
        doomed = [
            w
            for w in pods
            if not w.terminating
            and w.uid not in self.observed.deleting
            and (policy == "All" or w.phase in ("Running", "Pending"))
        ]
        if len(doomed) > POD_WRITES_PER_TURN:
            self.requeue(0)
        return doomed[:POD_WRITES_PER_TURN]


def _bounds(spec: JobSpec) -> dict[str, int]:
    """min- and max-replicas for `kubectl get mpijob`, whose columns are jsonPaths: one
    cannot name an annotation key with dots and slashes in it."""
    found = {"minReplicas": spec.bounds.min, "maxReplicas": spec.bounds.max}
    return {k: v for k, v in found.items() if v is not None}


def _by_index(job_name: str, workers: Sequence[Worker], new: Sequence[int]) -> list[str]:
    """The names of ``workers`` and of the workers to create at ``new``, in index order."""
    pairs = [(w.index, w.name) for w in workers]
    pairs += [(i, names.worker_name(job_name, i)) for i in new]
    return [name for _, name in sorted(pairs)]


def _worker_pause(failures: int) -> timedelta:
    """The first failure is replaced at once; then 10 s, 20 s, ... at most 5 min."""
    if failures <= 1:
        return timedelta(0)
    seconds = WORKER_BACKOFF_SECONDS * 2 ** min(failures - 2, 10)
    return timedelta(seconds=min(seconds, WORKER_BACKOFF_MAX_SECONDS))


def _count(value: object) -> int:
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else 0


def _gone_why(victim: Victim) -> str:
    if victim.deadline is None:
        return "no rank could run there"
    if victim.grace_seconds is not None:
        return "its ranks have left"
    return "drain over"


def desired(observed: Observed, settings: Settings, now: datetime) -> Desired:
    """The children and status one job should have now, from what the caches hold."""
    if observed.job["metadata"].get("deletionTimestamp"):
        # The garbage collector removes the children.
        status = dict(observed.job.get("status") or {})
        return Desired({}, None, (), (), (), (), None, status, (), None)
    return _Builder(observed, settings, now).build()
