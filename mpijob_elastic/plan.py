"""Pure planning: (MPIJob, the children we observe, now) -> the ordered writes to make.

This is the controller's functional core. It reads nothing and writes nothing; the shell
(reconciler.py) executes the actions in order and feeds its results back through the
caches. Everything that makes scaling safe lives here, so it is tested without a cluster:

* Scale-up: the launcher Role grants exec on a new worker *before* the worker is created,
  and the worker enters ``discover_hosts.sh`` only once it is Running.
* Scale-in: victims (the highest indexes) leave ``hostfile`` and ``discover_hosts.sh``
  first, are marked draining, and are deleted only after the job's drain period, so
  Horovod removes them gracefully instead of counting a failure and blacklisting them.
  A delete is issued once per pod; exec rights are revoked after the pod is gone.
* Bad input never deletes anything: an invalid spec freezes the job's children, and
  Worker replicas outside the job's bounds keep the job at its current size.

Writes are planned only where the observed state drifts from the desired one, so a
reconcile of a settled job plans nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic import names, render
from mpijob_elastic.settings import Settings
from mpijob_elastic.spec import InvalidSpec, JobSpec, parse

Obj = dict[str, Any]

# Condition types: the v1 ones, plus Scaling and InvalidSpec. Kept in this order so that
# the last condition, which `kubectl get mpijob` shows as the job's state, is its lifecycle.
CREATED = "Created"
INVALID = "InvalidSpec"
SCALING = "Scaling"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
POD_REJECTED = "PodTemplateRejected"
CONDITION_ORDER = (CREATED, INVALID, SCALING, RUNNING, "Restarting", SUCCEEDED, FAILED)


@dataclass(frozen=True)
class Create:
    obj: Obj


@dataclass(frozen=True)
class Replace:
    """A full update of an object we own, made conditional on the observed resourceVersion."""

    obj: Obj


@dataclass(frozen=True)
class AnnotatePod:
    """Merge-patch pod annotations; a value of None removes the annotation."""

    name: str
    annotations: Mapping[str, str | None]


@dataclass(frozen=True)
class DeletePod:
    """Delete with a UID precondition, so a same-named successor is never hit."""

    name: str
    uid: str


@dataclass(frozen=True)
class Emit:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class WriteStatus:
    status: Obj
    resource_version: str


Action = Create | Replace | AnnotatePod | DeletePod | Emit | WriteStatus


@dataclass(frozen=True)
class Observed:
    """What the caches hold for one job: only children it controls, in its namespace."""

    job: Mapping[str, Any]
    pods: Sequence[Mapping[str, Any]] = ()
    config_map: Mapping[str, Any] | None = None
    service_account: Mapping[str, Any] | None = None
    role: Mapping[str, Any] | None = None
    role_binding: Mapping[str, Any] | None = None
    # UIDs of pods whose delete this controller already issued; the cache may not show
    # their deletionTimestamp yet.
    deleting: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    # Reconcile again after this many seconds even if nothing changes (a drain deadline).
    requeue_after: float | None = None

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_precise_time(t: datetime) -> str:
    """RFC 3339 with microseconds: a drain deadline must not come a second early."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


@dataclass(frozen=True)
class Worker:
    index: int
    pod: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"].get("uid", ""))

    @property
    def phase(self) -> str:
        return str((self.pod.get("status") or {}).get("phase", "Pending"))

    @property
    def terminating(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def draining(self) -> bool:
        return names.ANN_DRAINING_SINCE in (self.pod["metadata"].get("annotations") or {})

    @property
    def draining_since(self) -> datetime | None:
        """When the drain began; None if unmarked or the mark is unreadable."""
        annotations = self.pod["metadata"].get("annotations") or {}
        return parse_time(annotations.get(names.ANN_DRAINING_SINCE))

    @property
    def reason(self) -> str:
        return str((self.pod.get("status") or {}).get("reason", ""))

    def exit_code(self, main_container: str | None) -> int | None:
        statuses = (self.pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            if main_container is None or status.get("name") == main_container:
                terminated = (status.get("state") or {}).get("terminated") or {}
                code = terminated.get("exitCode")
                return code if isinstance(code, int) else None
        return None


def worker_index(job_name: str, pod_name: str) -> int | None:
    """The index a worker pod's name encodes, matched exactly.

    The name, not the index label, is the worker's identity: it is the MPI hostname and the
    Role's resourceName. Upstream trimmed a cutset off the name and deleted wrong pods
    (#352); a pod missing the label made it think the job had no workers.
    """
    match = re.fullmatch(re.escape(job_name) + r"-worker-(0|[1-9][0-9]*)", pod_name)
    return int(match.group(1)) if match else None


def _role_of(pod: Mapping[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE)


def _split_pods(
    job_name: str, pods: Sequence[Mapping[str, Any]]
) -> tuple[list[Worker], Mapping[str, Any] | None]:
    workers: list[Worker] = []
    launcher = None
    for pod in pods:
        name = pod["metadata"]["name"]
        role = _role_of(pod)
        if role == names.ROLE_LAUNCHER and name == names.launcher_name(job_name):
            launcher = pod
        elif role == names.ROLE_WORKER:
            index = worker_index(job_name, name)
            if index is not None:
                workers.append(Worker(index, pod))
    workers.sort(key=lambda w: w.index)
    return workers, launcher


def _counts(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    phases = [
        ((p.get("status") or {}).get("phase"), p["metadata"].get("deletionTimestamp")) for p in pods
    ]
    return {
        "active": sum(1 for phase, deleting in phases if phase == "Running" and not deleting),
        "succeeded": sum(1 for phase, _ in phases if phase == "Succeeded"),
        "failed": sum(1 for phase, _ in phases if phase == "Failed"),
    }


def replica_statuses(job_name: str, pods: Sequence[Mapping[str, Any]]) -> Obj:
    workers, launcher = _split_pods(job_name, pods)
    return {
        "Launcher": _counts([launcher] if launcher else []),
        "Worker": {
            **_counts([w.pod for w in workers]),
            "selector": names.selector(job_name, names.ROLE_WORKER),
        },
    }


class _Status:
    """Builds the next status from the observed one, touching timestamps only on change."""

    def __init__(self, job: Mapping[str, Any], now: datetime) -> None:
        self.observed: Obj = dict(job.get("status") or {})
        self.now = format_time(now)
        self.conditions: dict[str, Obj] = {
            c["type"]: dict(c) for c in self.observed.get("conditions") or [] if "type" in c
        }
        self.fields: Obj = {}

    def get(self, type_: str) -> Obj | None:
        return self.conditions.get(type_)

    def is_true(self, type_: str) -> bool:
        c = self.conditions.get(type_)
        return c is not None and c.get("status") == "True"

    def set(self, type_: str, status: bool, reason: str, message: str) -> bool:
        """Set a condition; return whether anything a reader sees changed."""
        value = "True" if status else "False"
        old = self.conditions.get(type_)
        if old and (old.get("status"), old.get("reason"), old.get("message")) == (
            value,
            reason,
            message,
        ):
            return False
        transition = (
            self.now
            if not old or old.get("status") != value
            else old.get("lastTransitionTime", self.now)
        )
        self.conditions[type_] = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastUpdateTime": self.now,
            "lastTransitionTime": transition,
        }
        return True

    def clear(self, type_: str, reason: str, message: str) -> None:
        """Turn a problem condition False, if it was ever set; never add it just to say no."""
        if self.is_true(type_):
            self.set(type_, False, reason, message)

    def build(self) -> Obj:
        status = {**self.observed, **self.fields}
        order = {t: i for i, t in enumerate(CONDITION_ORDER)}
        status["conditions"] = sorted(
            self.conditions.values(), key=lambda c: order.get(c["type"], len(order))
        )
        return status


@dataclass
class _Planner:
    observed: Observed
    settings: Settings
    now: datetime
    actions: list[Action] = field(default_factory=list)
    events: list[Emit] = field(default_factory=list)
    requeue_after: float | None = None

    def __post_init__(self) -> None:
        self.job = self.observed.job
        self.job_name = str(self.job["metadata"]["name"])
        self.status = _Status(self.job, self.now)

    # -- helpers ---------------------------------------------------------------------

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Emit(type_, reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def ensure(self, desired: Obj, observed: Mapping[str, Any] | None, keys: Sequence[str]) -> None:
        """Create the object, or replace it if any of ``keys`` or our metadata drifted."""
        if observed is None:
            self.actions.append(Create(desired))
            return
        meta = observed["metadata"]
        drifted = any(observed.get(k) != desired.get(k) for k in keys) or any(
            (meta.get("labels") or {}).get(k) != v for k, v in desired["metadata"]["labels"].items()
        )
        if drifted:
            updated = {**observed, **{k: desired[k] for k in keys}}
            updated["metadata"] = {
                **meta,
                "labels": {**(meta.get("labels") or {}), **desired["metadata"]["labels"]},
            }
            self.actions.append(Replace(updated))

    def delete(self, worker: Worker) -> bool:
        """Plan the pod's delete, once: False if it was already issued."""
        if worker.uid in self.observed.deleting:
            return False
        self.actions.append(DeletePod(worker.name, worker.uid))
        return True

    def finish(self) -> Plan:
        status = self.status.build()
        if status != (self.job.get("status") or {}):
            rv = str(self.job["metadata"].get("resourceVersion", ""))
            self.actions.append(WriteStatus(status, rv))
        return Plan((*self.actions, *self.events), self.requeue_after)

    # -- the plan --------------------------------------------------------------------

    def run(self) -> Plan:
        if self.job["metadata"].get("deletionTimestamp"):
            return Plan(())  # the garbage collector removes the children
        s = self.status
        if s.get(CREATED) is None:
            s.set(CREATED, True, "MPIJobCreated", f"MPIJob {self.job_name} is created.")
        s.fields.setdefault("startTime", s.observed.get("startTime") or s.now)
        workers, launcher = _split_pods(self.job_name, self.observed.pods)
        try:
            spec = parse(self.job, self.settings.default_drain_seconds)
        except InvalidSpec as err:
            # Leave every child as it is: a typo must not cost the job its workers.
            if s.set(INVALID, True, "InvalidSpec", str(err)):
                self.event("Warning", "InvalidSpec", str(err))
            s.fields["replicaStatuses"] = replica_statuses(self.job_name, self.observed.pods)
            return self.finish()

        if s.is_true(SUCCEEDED) or s.is_true(FAILED):
            self.clean_up(spec, workers, launcher)
            return self.finish()

        s.fields["replicaStatuses"] = replica_statuses(self.job_name, self.observed.pods)
        if launcher is not None and self.launcher_finished(launcher):
            self.clean_up(spec, workers, launcher)
            return self.finish()

        target = self.target(spec, workers)
        self.scale(spec, workers, launcher, target)
        return self.finish()

    def target(self, spec: JobSpec, workers: Sequence[Worker]) -> int:
        """How many workers the job should have: Worker replicas, if within bounds."""
        requested = spec.worker.replicas
        if spec.bounds.contains(requested):
            return requested
        # Refuse the value: keep the workers the job holds now (by highest index, so a
        # worker lost meanwhile is still replaced), or, for a new job, the nearest bound.
        held = [w.index for w in workers if not w.terminating and not w.draining]
        keep = spec.bounds.clamp(max(held) + 1 if held else requested)
        message = (
            f"spec.mpiReplicaSpecs.Worker.replicas: {requested} is outside the job's bounds "
            f"{spec.bounds.describe()} (annotations {names.ANN_MIN_REPLICAS}, "
            f"{names.ANN_MAX_REPLICAS}); keeping {keep} workers"
        )
        if self.status.set(INVALID, True, "ReplicasOutOfRange", message):
            self.event("Warning", "ReplicasOutOfRange", message)
        return keep

    def scale(
        self,
        spec: JobSpec,
        workers: Sequence[Worker],
        launcher: Mapping[str, Any] | None,
        target: int,
    ) -> None:
        s = self.status
        wanted = [w for w in workers if w.index < target]
        surplus = [w for w in workers if w.index >= target]
        by_index = {w.index: w for w in workers}

        # 1. RBAC first: exec rights for every wanted worker before its pod exists, kept for
        #    surplus workers until their pods are gone.
        worker_names = sorted(
            {names.worker_name(spec.name, i) for i in range(target)} | {w.name for w in workers},
            key=lambda n: worker_index(spec.name, n) or 0,
        )
        self.ensure(render.service_account(spec), self.observed.service_account, ())
        self.ensure(render.role(spec, worker_names), self.observed.role, ("rules",))
        self.ensure(render.role_binding(spec), self.observed.role_binding, ("subjects", "roleRef"))

        # 2. The host lists: only wanted workers, and in discovery only those that can take
        #    ranks now.
        hosts = [w.name for w in wanted if w.phase == "Running" and not w.terminating]
        data = render.config_data(spec, self.settings, target, hosts)
        old_data = (self.observed.config_map or {}).get("data")
        self.ensure(render.config_map(spec, data), self.observed.config_map, ("data",))
        hash_ = render.config_hash(data)

        # 3. Make the kubelet refresh the launcher's mounted files now, not in a minute.
        if launcher is not None and not launcher["metadata"].get("deletionTimestamp"):
            current = (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)
            if current != hash_:
                self.actions.append(
                    AnnotatePod(names.launcher_name(spec.name), {names.ANN_CONFIG_HASH: hash_})
                )

        # 4. A scale-up during a drain takes the wanted victims back.
        for w in wanted:
            if w.draining and not w.terminating:
                self.actions.append(AnnotatePod(w.name, {names.ANN_DRAINING_SINCE: None}))

        # 5. Scale-in, after the host lists no longer name the victims.
        self.drain(spec, surplus)

        # 6. Lost workers within replicas are replaced, per the Worker restartPolicy.
        for w in wanted:
            if (
                w.phase == "Failed"
                and not w.terminating
                and self.replace_failed(spec, w)
                and self.delete(w)
            ):
                why = w.reason or f"exit code {w.exit_code(spec.main_container)}"
                self.event(
                    "Warning", "WorkerFailed", f"worker pod {w.name} failed ({why}); recreating it"
                )

        # 7. New workers, after the Role that lets the launcher exec into them.
        missing = [i for i in range(target) if i not in by_index]
        if missing:
            for i in missing:
                self.actions.append(Create(render.worker_pod(spec, i)))
            previous = _hostfile_workers(spec.name, old_data)
            new = [names.worker_name(spec.name, i) for i in missing if i >= previous]
            replaced = [names.worker_name(spec.name, i) for i in missing if i < previous]
            if new:
                self.event(
                    "Normal",
                    "ScaledUp",
                    f"created worker pods {', '.join(new)}: scaling to {target} workers",
                )
            if replaced:
                self.event(
                    "Normal", "WorkerReplaced", f"recreated worker pods {', '.join(replaced)}"
                )

        # 8. The launcher starts once the workers the job minimally needs can take ranks.
        needed = target if spec.bounds.min is None else min(spec.bounds.min, target)
        if launcher is None and len(hosts) >= needed:
            self.actions.append(Create(render.launcher_pod(spec, self.settings, hash_, needed)))
        if launcher is not None and (launcher.get("status") or {}).get("phase") == "Running":
            s.set(RUNNING, True, "MPIJobRunning", f"MPIJob {spec.name} is running.")

        # A pod template the API server refused stays reported until a pod create goes
        # through, which a plan without pod creates implies.
        invalid = s.get(INVALID)
        creates = any(isinstance(a, Create) and a.obj["kind"] == "Pod" for a in self.actions)
        if (
            spec.bounds.contains(spec.worker.replicas)
            and invalid is not None
            and not (invalid.get("reason") == POD_REJECTED and creates)
        ):
            s.clear(INVALID, "SpecValid", "The spec is valid.")

        # 9. Tell the user a scale is in progress, from how many workers to how many.
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

    def drain(self, spec: JobSpec, surplus: Sequence[Worker]) -> None:
        marking: list[str] = []
        deleted: list[str] = []
        for w in surplus:
            if w.terminating:
                continue
            since = w.draining_since
            if since is None and spec.drain_seconds > 0:
                # Unmarked, or a mark edited into nonsense: the drain starts now. Deleting
                # early is the very failure draining exists to avoid.
                self.actions.append(
                    AnnotatePod(w.name, {names.ANN_DRAINING_SINCE: format_precise_time(self.now)})
                )
                marking.append(w.name)
                self.requeue(spec.drain_seconds)
                continue
            elapsed = (self.now - since).total_seconds() if since else 0.0
            remaining = spec.drain_seconds - elapsed
            if remaining > 0:
                self.requeue(remaining)
            elif self.delete(w):
                deleted.append(w.name)
        if marking:
            self.event(
                "Normal",
                "Draining",
                f"draining worker pods {', '.join(marking)}: removed from discover_hosts.sh, "
                f"deleting them in {spec.drain_seconds:g}s",
            )
        if deleted:
            self.event(
                "Normal", "WorkerDeleted", f"deleted drained worker pods {', '.join(deleted)}"
            )

    def replace_failed(self, spec: JobSpec, worker: Worker) -> bool:
        if worker.reason == "Evicted":
            return True  # the node's doing, not the program's
        policy = spec.worker.restart_policy
        if policy == "Never":
            return False
        if policy == "ExitCode":
            # v1 semantics: 1-127 is the program's own error, 128+ a signal worth retrying.
            code = worker.exit_code(spec.main_container)
            return code is not None and code >= 128
        return True

    def launcher_finished(self, launcher: Mapping[str, Any]) -> bool:
        phase = (launcher.get("status") or {}).get("phase")
        s = self.status
        name = launcher["metadata"]["name"]
        if phase == "Succeeded":
            s.set(
                SUCCEEDED,
                True,
                "MPIJobSucceeded",
                f"MPIJob {self.job_name} successfully completed.",
            )
            self.event("Normal", "MPIJobSucceeded", f"launcher {name} succeeded")
        elif phase == "Failed":
            s.set(
                FAILED,
                True,
                "MPIJobFailed",
                f"MPIJob {self.job_name} has failed: launcher {name} failed.",
            )
            self.event("Warning", "MPIJobFailed", f"launcher {name} failed")
        else:
            return False
        if s.get(RUNNING) is not None:
            s.set(RUNNING, False, "MPIJobFinished", f"MPIJob {self.job_name} has finished.")
        s.clear(SCALING, "ScalingComplete", "the job has finished")
        s.fields["completionTime"] = s.now
        return True

    def clean_up(
        self, spec: JobSpec, workers: Sequence[Worker], launcher: Mapping[str, Any] | None
    ) -> None:
        policy = spec.clean_pod_policy
        if policy == "None":
            return
        pods = [w.pod for w in workers] + ([launcher] if launcher is not None else [])
        for pod in pods:
            meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
            if meta.get("deletionTimestamp") or meta.get("uid") in self.observed.deleting:
                continue
            if policy == "All" or phase in ("Running", "Pending"):
                self.actions.append(DeletePod(meta["name"], meta.get("uid", "")))


def _hostfile_workers(job: str, data: Mapping[str, Any] | None) -> int:
    """How many workers the hostfile we wrote last listed: the size the job had."""
    text = (data or {}).get(names.HOSTFILE) or ""
    return sum(1 for line in text.splitlines() if line.startswith(f"{job}-worker-"))


def rejected_status(
    job: Mapping[str, Any], message: str, now: datetime | None = None
) -> Obj | None:
    """The job's status after the API server refused a pod built from its template.

    The server's message names the field (``spec.containers[0].image: Required value``),
    which is what the user must fix. None when the status already says so.
    """
    status = _Status(job, now or datetime.now(UTC))
    if not status.set(INVALID, True, POD_REJECTED, message):
        return None
    return status.build()


def plan(observed: Observed, settings: Settings, now: datetime | None = None) -> Plan:
    """Plan the writes that move one job's children towards its spec."""
    return _Planner(observed, settings, now or datetime.now(UTC)).run()
