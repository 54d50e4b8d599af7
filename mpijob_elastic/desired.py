"""What one job's children should be now: a pure value computed from (job, observed, now).

Everything that makes scaling safe is decided here, and ``diff.py`` only turns it into
ordered writes:

* Scale-up: the launcher Role grants exec on the workers the job controls and on those
  it creates in this turn, written once their creates went through (``diff.py``), so a
  name someone else's pod holds is never granted. A worker enters ``discover_hosts.sh``
  only once its main container runs and the Role we last wrote grants it.
* Scale-in: victims (the highest indexes) leave ``hostfile`` and ``discover_hosts.sh``,
  and are deleted only a full drain period after the host list we wrote stopped naming
  them. A drain mark on the pod records when that happened; a mark on a worker that the
  observed host list still names is stale (a scale-up took the worker back and a restart
  lost the clean-up), so its drain starts again instead of ending at once.
* Bad input never deletes anything: an invalid spec freezes the job's children, and
  Worker replicas outside the job's bounds keep the job at its current size. A child name
  held by an object the job does not control is never granted, written or waited on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic import names, render
from mpijob_elastic.actions import DELETE_MEMORY_SECONDS, Emit, Observed
from mpijob_elastic.settings import Settings
from mpijob_elastic.spec import InvalidSpec, JobSpec, parse
from mpijob_elastic.status import (
    CREATED,
    FAILED,
    INVALID,
    POD_REJECTED,
    REFUSED,
    RUNNING,
    SCALING,
    SUCCEEDED,
    StatusBuilder,
    replica_statuses,
)
from mpijob_elastic.workers import Worker, listed_hosts, split_pods

Obj = dict[str, Any]

# Pod creates and deletes one reconcile may make. A job of a thousand workers then takes
# several turns, and the jobs queued behind it get theirs in between instead of waiting
# for a thousand round trips.
POD_WRITES_PER_TURN = 100


@dataclass(frozen=True)
class Victim:
    worker: Worker
    # When the drain ends; None: it has not begun (the worker is still listed, or unmarked).
    deadline: datetime | None
    # This turn's write for it: "mark" (its drain starts), "delete" (its drain is over), or
    # None (waiting, or left for a later turn).
    action: str | None = None


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
    # Pods to delete now without draining: failed workers to replace, finished-job clean-up.
    deletes: Sequence[Worker]
    # The launcher pod to create if it does not exist yet.
    launcher: Obj | None
    status: Obj
    events: Sequence[Emit]
    requeue_after: float | None


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

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Emit(type_, reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def frozen(self, deletes: Sequence[Worker] = ()) -> Desired:
        return Desired({}, None, (), (), (), deletes, None, self.status.build(), self.events, None)

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
            )
        except InvalidSpec as err:
            # Leave every child as it is: a typo must not cost the job its workers.
            if s.set(INVALID, True, "InvalidSpec", str(err)):
                self.event("Warning", "InvalidSpec", str(err))
            return self.frozen()
        if s.is_true(SUCCEEDED) or s.is_true(FAILED):
            return self.frozen(self.clean_up(spec, workers, launcher))
        if launcher is not None and self.launcher_finished(launcher):
            return self.frozen(self.clean_up(spec, workers, launcher))
        return self.scale(spec, workers, launcher, self.target(spec, workers))

    def target(self, spec: JobSpec, workers: Sequence[Worker]) -> int:
        """How many workers the job should have: Worker replicas, if within bounds."""
        requested = spec.worker.replicas
        if spec.bounds.contains(requested):
            return requested
        # Refuse the value: keep the workers the job holds now (by highest index, so a
        # worker lost meanwhile is still replaced), or, for a new job, the nearest bound.
        held = [w.index for w in workers if not w.terminating and not w.marked]
        keep = spec.bounds.clamp(max(held) + 1 if held else requested)
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
    ) -> Desired:
        s = self.status
        main = spec.main_container
        wanted = [w for w in workers if w.index < target]
        surplus = [w for w in workers if w.index >= target]
        held = {w.index for w in workers}
        missing = [
            i
            for i in range(target)
            if i not in held and not self.taken("Pod", names.worker_name(spec.name, i))
        ]
        create_now = missing[:POD_WRITES_PER_TURN]
        if len(missing) > len(create_now):
            self.requeue(0)

        # Exec rights only on pods the job controls or creates in this turn: never on a
        # name that someone else's pod holds.
        role_names = [
            name
            for _, name in sorted(
                [(w.index, w.name) for w in workers]
                + [(i, names.worker_name(spec.name, i)) for i in create_now]
            )
        ]
        granted = render.exec_names(self.observed.role)
        hosts = [w.name for w in wanted if w.can_take_ranks(main) and w.name in granted]
        data = render.config_data(spec, self.settings, target, hosts)
        hash_ = render.config_hash(data)
        objects = {
            "ServiceAccount": render.service_account(spec),
            "Role": render.role(spec, role_names),
            "RoleBinding": render.role_binding(spec),
            "ConfigMap": render.config_map(spec, data),
        }

        old_data = (self.observed.config_map or {}).get("data")
        victims = self.drain(spec, surplus, listed_hosts(old_data))
        replacing = [w for w in wanted if self.replace_failed(spec, w)]
        self.report_new_workers(spec, create_now, old_data, target)

        # The launcher starts once every worker the job wants exists, none of its names is
        # taken, and the workers the job minimally needs can take ranks.
        needed = target if spec.bounds.min is None else min(spec.bounds.min, target)
        blocked = any(self.taken(kind, obj["metadata"]["name"]) for kind, obj in objects.items())
        new_launcher = None
        if (
            launcher is None
            and held.issuperset(range(target))
            and not blocked
            and not self.taken("Pod", names.launcher_name(spec.name))
            and len(hosts) >= needed
        ):
            new_launcher = render.launcher_pod(spec, self.settings, hash_, needed)
        if launcher is not None and (launcher.get("status") or {}).get("phase") == "Running":
            s.set(RUNNING, True, "MPIJobRunning", f"MPIJob {spec.name} is running.")

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
        self.report_scaling(target, hosts, surplus)
        self.report_conflicts()
        return Desired(
            objects=objects,
            config_hash=hash_,
            workers=wanted,
            new_pods=[render.worker_pod(spec, i) for i in create_now],
            victims=victims,
            deletes=replacing[:POD_WRITES_PER_TURN],
            launcher=new_launcher,
            status=s.build(),
            events=self.events,
            requeue_after=self.requeue_after,
        )

    def drain(self, spec: JobSpec, surplus: Sequence[Worker], listed: set[str]) -> list[Victim]:
        victims: list[Victim] = []
        marking: list[str] = []
        due: list[str] = []
        drain = timedelta(seconds=spec.drain_seconds)
        for w in surplus:
            if w.terminating:
                continue
            since = w.draining_since
            if spec.drain_seconds == 0:
                deadline: datetime | None = self.now
            elif since is None or w.name in listed:
                # Unmarked, a mark edited into nonsense, or a mark from a drain that a
                # scale-up undid: the drain starts with this turn's host-list write.
                deadline = None
            else:
                deadline = since + drain
            action = None
            if deadline is None:
                self.requeue(0 if len(marking) >= POD_WRITES_PER_TURN else spec.drain_seconds)
                if len(marking) < POD_WRITES_PER_TURN:
                    marking.append(w.name)
                    action = "mark"
            elif (remaining := (deadline - self.now).total_seconds()) > 0:
                self.requeue(remaining)
            elif w.uid in self.observed.deleting:
                # Accepted already and the cache has yet to show it; look again once the
                # acceptance is forgotten, in case the pod never goes.
                self.requeue(DELETE_MEMORY_SECONDS)
            elif len(due) < POD_WRITES_PER_TURN:
                due.append(w.name)
                action = "delete"
            else:
                self.requeue(0)
            victims.append(Victim(w, deadline, action))
        if marking:
            self.event(
                "Normal",
                "Draining",
                f"draining worker pods {', '.join(marking)}: removed from discover_hosts.sh, "
                f"deleting them in {spec.drain_seconds:g}s",
            )
        if due:
            self.event("Normal", "WorkerDeleted", f"deleted drained worker pods {', '.join(due)}")
        return victims

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
                "Warning", "WorkerFailed", f"worker pod {worker.name} failed ({why}); recreating it"
            )
        return replace

    def report_new_workers(
        self, spec: JobSpec, create_now: Sequence[int], old_data: Any, target: int
    ) -> None:
        previous = sum(
            1
            for host in listed_hosts({names.HOSTFILE: (old_data or {}).get(names.HOSTFILE)})
            if host.startswith(f"{spec.name}-worker-")
        )
        new = [names.worker_name(spec.name, i) for i in create_now if i >= previous]
        replaced = [names.worker_name(spec.name, i) for i in create_now if i < previous]
        if new:
            self.event(
                "Normal",
                "ScaledUp",
                f"created worker pods {', '.join(new)}: scaling to {target} workers",
            )
        if replaced:
            self.event("Normal", "WorkerReplaced", f"recreated worker pods {', '.join(replaced)}")

    def report_conflicts(self) -> None:
        if not self.observed.conflicts:
            return
        message = "; ".join(what for _, what in sorted(self.observed.conflicts.items()))
        message += ": rename or remove it; until then the job does without it"
        if self.status.set(REFUSED, True, "AlreadyExists", message):
            self.event("Warning", REFUSED, message)

    def report_scaling(self, target: int, hosts: Sequence[str], surplus: Sequence[Worker]) -> None:
        s = self.status
        if len(hosts) < target:
            s.set(
                SCALING,
                True,
                "ScalingUp",
                f"scaling workers from {len(hosts)} to {target}: "
                f"{target - len(hosts)} not running yet",
            )
        elif surplus:
            s.set(
                SCALING,
                True,
                "ScalingDown",
                f"scaling workers from {len(hosts) + len(surplus)} to {target}: "
                f"removing {', '.join(w.name for w in surplus)}",
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


def desired(observed: Observed, settings: Settings, now: datetime) -> Desired:
    """The children and status one job should have now, from what the caches hold."""
    if observed.job["metadata"].get("deletionTimestamp"):
        # The garbage collector removes the children.
        status = dict(observed.job.get("status") or {})
        return Desired({}, None, (), (), (), (), None, status, (), None)
    return _Builder(observed, settings, now).build()
