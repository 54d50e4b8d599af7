"""An in-memory API server and controller shell, to run the real planner against in unit tests.

Two ways in:

* ``Cluster``: plan, then apply the whole plan through the real ``Writer`` against a world
  the planner sees directly. For step-by-step tests of what one plan contains.
* ``Sim``: the controller as it runs for real, against a world that misbehaves. The view is
  a watch cache that lags behind the world (except for the controller's own confirmed
  writes, which it upserts); writes go out one at a time through the real ``Writer`` and
  may fail (409, 403, 422, 500, a timeout before or after the server applied them); the
  controller may die between any two writes and restart with an empty memory and a fresh
  view; failed turns are retried with the work queue's backoff; pods start and terminating
  pods vanish on their own time.

The ``World`` checks the safety invariants at the very write that could break them and
records each breach in ``violations``; ``Sim`` raises ``Violation`` at the end of the turn
in which one happened, and ``Sim.settle`` checks that the world converges. Random faults
come from ``Faults`` and the seed; a test scripts a particular one with ``Sim.inject`` and
a user's change at a particular moment with ``Sim.later``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import heapq
import itertools
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from mpijob_elastic.app.fleet import GONE_SECONDS
from mpijob_elastic.app.predicates import job_signature
from mpijob_elastic.core import formats, names, nodes
from mpijob_elastic.core.actions import (
    Action,
    AnnotatePod,
    Claim,
    Create,
    DeleteObject,
    DeletePod,
    Emit,
    PatchStatus,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.hosts.drain import DRAIN_FLOOR_SECONDS
from mpijob_elastic.core.inputs.growth_state import share
from mpijob_elastic.core.inputs.observe import HANDOVER_KINDS, Gathered, Listed, Observed
from mpijob_elastic.core.inputs.observe import observe as observe_caches
from mpijob_elastic.core.inputs.ranks import RankSnapshot
from mpijob_elastic.core.objects.render import requests_gpu
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing.kueue import QUEUE_LABEL, WORKLOAD, Queue
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.sizing.capacity import WORKER_BACKOFF_MAX_SECONDS
from mpijob_elastic.core.workers import worker_index
from mpijob_elastic.machinery import writer as writer_module
from mpijob_elastic.machinery.job_memory import JobMemory
from mpijob_elastic.machinery.kube import ApiError, Kube
from mpijob_elastic.machinery.store import compact, metadata_only, slim_pod
from mpijob_elastic.machinery.workqueue import ItemBackoff
from mpijob_elastic.machinery.writer import Writer

Obj = dict[str, Any]
Key = tuple[str, str]
Planner = Callable[[Observed, Settings, datetime], Writes]
# Every request passes one: (what it is, the request as it would reach the server) -> its answer.
Gate = Callable[["Request", Callable[[], Obj]], Obj]
# How long a removed host's ranks take to reach their next commit and leave.
RANK_LEAVE_SECONDS = 1.0
# How long a newly listed host takes to hold ranks: the other ranks reach a commit, reset,
# and its own rank starts.
RANK_JOIN_SECONDS = 1.0
# How long after it holds ranks a host's training reports its commit marker (ranks.py):
# the reset it joined has ended and a commit followed.
RANK_COMMIT_SECONDS = 1.0
SETTINGS = Settings(kubectl_delivery=KubectlDelivery.NONE, default_drain_seconds=30)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NAMESPACE = "ns"
# How the writer's memory names a holder it could not read (held_names.learn).
UNREAD_HOLDER = "owner unknown"
# The most workers Kueue admits a Workload with (partial admission: at least its minCount).
MAX_ADMITTED = 3
# The Workload conditions an admission sets.
ADMISSION_CONDITIONS = ("QuotaReserved", "Admitted", "Evicted")


def make_job(
    replicas: int = 2,
    *,
    name: str = "job",
    namespace: str = NAMESPACE,
    annotations: dict[str, str] | None = None,
    slots: int = 1,
    **spec: Any,
) -> Obj:
    container = {"name": "main", "image": "img"}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"{name}-uid",
            "resourceVersion": "1",
            "generation": 1,
            "annotations": annotations or {},
        },
        "spec": {
            "slotsPerWorker": slots,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [container]}}},
                "Worker": {"replicas": replicas, "template": {"spec": {"containers": [container]}}},
            },
            **spec,
        },
    }


def running_status(pod: Obj) -> Obj:
    """What a kubelet reports once every container of the pod runs."""
    return {
        "phase": "Running",
        "containerStatuses": [
            {"name": c["name"], "ready": True, "state": {"running": {}}}
            for c in pod["spec"]["containers"]
        ],
    }


def discovered(config_map: Obj | None) -> list[str]:
    return formats.discover_hosts_hosts(
        ((config_map or {}).get("data") or {}).get(names.DISCOVER_HOSTS, "")
    )


def _controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def job_of(obj: Mapping[str, Any]) -> str:
    return str((obj["metadata"].get("labels") or {}).get(names.LABEL_JOB, ""))


def _true(obj: Mapping[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _admitted_workers(workload: Mapping[str, Any]) -> int:
    """What Kueue charges the job for its workers: the admitted count, or the Workload's
    own once shrunk in place below it."""
    assigned = {a["name"]: a["count"] for a in workload["status"]["admission"]["podSetAssignments"]}
    asked = {p["name"]: p["count"] for p in workload["spec"]["podSets"]}
    return int(min(assigned.get("worker", 0), asked.get("worker", 0)))


def _disrupted(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def waits_for_kueue(type_: str, obj: Mapping[str, Any]) -> bool:
    """A Workload Kueue would queue: one that holds no quota and is not finished."""
    return (
        type_ != "DELETED"
        and obj["kind"] == WORKLOAD
        and (obj.get("status") or {}).get("admission") is None
        and not _true(obj, "Finished")
    )


def _rv(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"].get("resourceVersion") or 0)


def _ours(obj: Mapping[str, Any]) -> bool:
    """What the main caches' selector (watches.CHILD_SELECTOR) lets through."""
    labels = obj["metadata"].get("labels") or {}
    return labels.get(names.LABEL_GROUP) == names.GROUP and names.LABEL_JOB in labels


def _handed_over(obj: Mapping[str, Any]) -> bool:
    """What the hand-over caches' selectors (watches.HANDOVER_SELECTORS) let through."""
    labels = obj["metadata"].get("labels") or {}
    if names.LABEL_JOB in labels:
        return False
    if obj["kind"] == "Pod":
        return labels.get(names.LABEL_TO_OPERATOR) == names.TO_OPERATOR
    return obj["kind"] in HANDOVER_KINDS and names.LABEL_APP in labels


def observe(
    objects: Mapping[tuple[str, str], Obj],
    job: Obj,
    memory: JobMemory,
    seconds: float,
    ranks: RankSnapshot | None = None,
    reports: RankSnapshot | None = None,
    beside: Gathered | None = None,
) -> Observed:
    """What the controller's caches hold for one job, read by the controller's own
    ``observe``: ``objects`` stand for the caches, each object through its cache's
    transform, so a field the planner reads but a cache drops fails the planner's tests.

    ``ranks``: the last exec read of the launcher; ``reports``: what its reports say
    (ranks.py). The simulated worlds send no reports, so their drains end through exec
    reads, the fallback path; a test may set ``Cluster.reports``. The rest is what the
    controller's shell gathers beside the caches (``Controller.gathered``): the fleet's
    shares and Kueue's view are read from ``objects`` as its caches would hold them;
    ``beside`` brings the rest (the pods gone, the preemptors, when capacity changed)."""
    main: dict[str, list[Obj]] = {}
    handover: dict[str, list[Obj]] = {}
    uid = job["metadata"]["uid"]
    for (kind, _), obj in sorted(objects.items()):
        # Every cache read of ``observe`` is by controller owner: the other jobs' objects
        # would only cost the copies.
        if kind in (names.KIND, "Node") or _controller_uid(obj) != uid:
            continue
        # The API server names the namespace of everything it holds; a test's hand-made
        # object may leave it out.
        obj = {**obj, "metadata": {"namespace": NAMESPACE, **obj["metadata"]}}
        # The PodGroups are watched whole (watches.POD_GROUP_SELECTOR). Each transform
        # leaves its argument as it is and builds every level anew, as a cache's copy.
        if _ours(obj) or kind == "PodGroup":
            transform = slim_pod if kind == "Pod" else compact
            main.setdefault(kind, []).append(transform(obj))
        elif _handed_over(obj):
            handover.setdefault(kind, []).append(metadata_only(obj))
    leaving = {
        name: why
        for (kind, name), node in objects.items()
        if kind == "Node" and (why := nodes.leaving(node, SETTINGS.leaving_node_taints))
    }
    uids = {
        o["metadata"]["name"]: o["metadata"]["uid"]
        for (k, _), o in objects.items()
        if k == names.KIND
    }
    shares = [
        found
        for (kind, name), obj in sorted(objects.items())
        if kind == "ConfigMap"
        and name.endswith(names.config_map_name(""))
        and (other := name[: -len(names.config_map_name(""))]) != job["metadata"]["name"]
        and _controller_uid(obj) == uids.get(other)
        and (found := share(f"{NAMESPACE}/{other}", compact(obj))) is not None
    ]
    queue = Queue(True, main.get(WORKLOAD, ()), slices=False)
    return observe_caches(
        copy.deepcopy(job),
        lambda kind: Listed(main.get(kind, ())),
        lambda kind: Listed(handover.get(kind, ())),
        memory,
        seconds,
        dataclasses.replace(
            copy.deepcopy(beside or Gathered()),
            ranks=reports,
            ranks_read=ranks,
            leaving_nodes=leaving,
            fleet=shares,
            queue=queue,
        ),
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` after a JSON merge patch (RFC 7386), as the API server applies one: what
    the patch leaves out stays, at every level; a null removes its key; a list replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class Violation(AssertionError):
    """A safety invariant broke, or the world did not converge."""


class Killed(Exception):
    """The controller process died: this request, and every later one, never reached the server."""


@dataclass
class Acting:
    """The turn in progress: which job it is for, and the hosts its view allowed to list."""

    job: str
    uid: str
    # Workers the controller's view showed able to take ranks and wanted: the most a host
    # list may name when the controller cannot know better (the world may be ahead).
    listable: set[str]
    # The pods the view showed, terminating ones too.
    seen: set[str] = field(default_factory=set)
    # The writer's memory has a name whose holder could not be read: taken for someone
    # else's, it may be the job's own object, and the job then makes one worker more
    # than it wants, under the next name, until a read succeeds (a known gap a fresh seed
    # showed through (l): a 409 on a create that had timed out after it was applied, the
    # read of the holder refused, a 2 s watch lag). (k) and (l) do not hold it to them.
    guessing: bool = False


class World:
    """The API server of one namespace, and the record the invariants are checked against.

    Names are unique per kind, deletes honour the UID precondition, replaces and patches
    the resourceVersion they carry, and patches the UID. Every change is appended to
    ``changes``, the watch stream that views consume at their own pace.

    The invariants, each checked at the write that could break it (into ``violations``):

    (a) The launcher Role grants exec on every host discover_hosts.sh names, and never on
        a name that a pod the job does not control holds.
    (b) A worker pod is deleted only once discover_hosts.sh no longer names it and, unless
        it failed, no sooner than the job's drain after the host list last stopped naming
        it, or than the drain floor once its ranks have left (``RANK_LEAVE_SECONDS``
        after it stopped being named). A pod that was named and never dropped is a breach;
        one never named may go. Not for a job being stopped as a whole (``stopping``).
    (c) A host list the controller writes names only pods that exist and are not being
        deleted, and that its view showed running and wanted (it cannot know better).
    (d) No pod gets another delete once the controller was told one succeeded.
    (f) A turn for one job writes only that job's objects.
    (g) No pod is created under a name Horovod has blacklisted: one whose pod failed, or
        went, while discover_hosts.sh named it.
    (h) A turn's writes follow its plan's phases: none goes out before every write of
        the phases above it was accepted, nor after a write of an earlier phase failed
        (checked by ``Sim``, which sees the requests go out).
    (i) No host-list write drops every rank-holder while one exists (Horovod's driver
        cannot reset onto a set with no host of its current assignment). A rank-holder is
        a listed worker whose pod lives and has been listed for ``RANK_JOIN_SECONDS``,
        while the launcher runs (no driver, no ranks; a terminating launcher's run is
        ending); a terminating one may stay listed when it is the last (c's one exception).
    (j) Once the job listed min-replicas workers, no host-list write lists fewer while a
        worker it drops could have stayed (exists, runs, is not terminating). Neither (i)
        nor (j) holds for a job being stopped as a whole.
    (k) A job labelled for a Kueue queue has no live pod (not terminating, not finished)
        while none of its Workloads holds quota, and never more live workers than the
        Workload holding it admitted: Kueue charges what the Workload says, so the job
        never runs more than that. Checked at each pod created and each Workload written.
    (l) An opportunistic job never has more live workers than its max-replicas.
    Neither (k) nor (l) holds a turn that guesses who holds a name (``Acting.guessing``).

    The world also plays Kueue's part for those Workloads: ``admit`` reserves quota for
    one, ``evict`` takes it back (the controller then stops the job and clears the
    admission); and the scheduler's: ``preempt`` marks a pod preempted and deletes it,
    recording its preemptor as the scheduler's Event would (``preemptors``).

    (e), convergence, is ``Sim.settle``'s.
    """

    def __init__(self, *jobs: Obj) -> None:
        self.clock = 0.0  # seconds since T0
        self.objects: dict[tuple[str, str], Obj] = {}
        # The watch stream: (when, event type, the object then).
        self.changes: list[tuple[float, str, Obj]] = []
        self.events: list[Emit] = []
        self.violations: list[str] = []
        # (pod name, exec names of the Role at the moment the pod was created)
        self.creations: list[tuple[str, set[str]]] = []
        # (pod name, when it was deleted, its phase then)
        self.deletions: list[tuple[str, datetime, str]] = []
        self.acting: Acting | None = None
        # Deletes whose success the controller was told about, by UID.
        self.confirmed_deletes: set[str] = set()
        self._rvs = itertools.count(2)
        self._uids = itertools.count()
        # Per job: the hosts discover_hosts.sh names now. Per pod UID: whether it was ever
        # named, and when it stopped being named.
        self._listed: dict[str, set[str]] = {}
        self._ever_listed: set[str] = set()
        self._left_at: dict[str, float] = {}
        self._listed_at: dict[str, float] = {}
        # When each pod (by UID) started running.
        self._running_at: dict[str, float] = {}
        # Per job: whether discover_hosts.sh has listed min-replicas workers (j).
        self._reached_min: set[str] = set()
        # Per job: worker names Horovod would have blacklisted.
        self.blacklisted: dict[str, set[str]] = {}
        # The preemptor of each preempted pod, by the victim's UID (the scheduler's Events).
        self.preemptors: dict[str, str] = {}
        # When room last came free: a pod that was not preempted went.
        self.capacity_changed: datetime | None = None
        for job in jobs:
            self.objects[(names.KIND, job["metadata"]["name"])] = job

    @property
    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.clock)

    @now.setter
    def now(self, value: datetime) -> None:
        self.clock = (value - T0).total_seconds()

    def get_obj(self, kind: str, name: str) -> Obj | None:
        return self.objects.get((kind, name))

    def job(self, name: str = "job") -> Obj:
        return self.objects[(names.KIND, name)]

    @property
    def pods(self) -> list[Obj]:
        return [o for (k, _), o in self.objects.items() if k == "Pod"]

    def workers(self, job: str = "job") -> list[Obj]:
        found = [p for p in self.pods if worker_index(job, p["metadata"]["name"]) is not None]
        return sorted(found, key=lambda p: worker_index(job, p["metadata"]["name"]) or 0)

    # -- the API ------------------------------------------------------------------------

    def create(self, obj: Mapping[str, Any]) -> Obj:
        if obj["kind"] == "Event":
            self._check_for(obj["involvedObject"]["uid"], "Event", obj["reason"])
            self.events.append(Emit(obj["type"], obj["reason"], obj["message"]))
            return dict(obj)
        new = copy.deepcopy(dict(obj))
        key = (new["kind"], new["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{key[0]} "{key[1]}" already exists')
        if new["kind"] == "RoleBinding" and ("Role", new["roleRef"]["name"]) not in self.objects:
            # What RBAC's escalation check answers a creator without the ``bind`` verb (the
            # controller's ClusterRole) when the Role to bind does not exist yet.
            raise ApiError(404, "NotFound", f'roles "{new["roleRef"]["name"]}" not found')
        self._check_for(_controller_uid(new), *key)
        new["metadata"]["uid"] = f"uid-{next(self._uids)}"
        new["metadata"]["creationTimestamp"] = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        if new["kind"] == "Pod":
            job = new["metadata"]["labels"][names.LABEL_JOB]
            if new["metadata"]["name"] in self.blacklisted.get(job, set()):
                self._violate(f"(g) pod {new['metadata']['name']} created under a blacklisted name")
            new["status"] = {"phase": "Pending"}
            self._pod_created(new)
        self._put(new)
        if new["kind"] in ("Pod", WORKLOAD):
            self._check_size(job_of(new), new)
        return copy.deepcopy(new)

    def replace(self, obj: Mapping[str, Any]) -> Obj:
        key = (obj["kind"], obj["metadata"]["name"])
        current = self._existing(*key)
        self._check_for(_controller_uid(current), *key)
        self._check_version(current, obj["metadata"].get("resourceVersion"))
        new = copy.deepcopy(dict(obj))
        new["metadata"]["uid"] = current["metadata"]["uid"]
        if new["kind"] == WORKLOAD:
            # Its status is a subresource: a replace leaves it as it is.
            new["status"] = copy.deepcopy(current.get("status") or {})
        self._put(new)
        if new["kind"] == WORKLOAD:
            self._check_size(job_of(new), new)
        return copy.deepcopy(new)

    def patch(self, kind: str, name: str, body: Mapping[str, Any], subresource: str = "") -> Obj:
        current = self._existing(kind, name)
        new = copy.deepcopy(current)
        own_status = subresource == "status" and kind == names.KIND
        owner = current["metadata"]["uid"] if own_status else _controller_uid(current)
        self._check_for(owner, kind, name)
        uid = body["metadata"].get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        self._check_version(current, body["metadata"].get("resourceVersion"))
        if subresource == "status":
            # A merge patch, the job's own and a Workload's alike (merge_patch).
            new["status"] = merge_patch(current.get("status"), body["status"])
        else:
            for part in ("annotations", "labels"):
                values = new["metadata"].setdefault(part, {})
                for k, v in (body["metadata"].get(part) or {}).items():
                    if v is None:
                        values.pop(k, None)
                    else:
                        values[k] = v
        self._put(new)
        if kind == WORKLOAD:
            self._check_size(job_of(new), new)
        return copy.deepcopy(new)

    def delete(self, kind: str, name: str, uid: str, resource_version: str | None = None) -> Obj:
        # The grace period a delete asks for is not modelled: a deleted pod stays
        # Terminating until ``vanish``, which is the harder case for the controller.
        current = self._existing(kind, name)
        if current["metadata"]["uid"] != uid:
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        self._check_version(current, resource_version)
        self._check_for(_controller_uid(current), kind, name)
        if kind != "Pod":
            # No finalizers on the other children: they go at once.
            self._remove((kind, name))
            return copy.deepcopy(current)
        self._pod_deleted(current)
        if not current["metadata"].get("deletionTimestamp"):
            # A kubelet with grace, like KWOK, marks the pod first and removes it later.
            new = copy.deepcopy(current)
            new["metadata"]["deletionTimestamp"] = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
            self._put(new)
        return copy.deepcopy(self.objects[(kind, name)])

    def get(self, kind: str, name: str) -> Obj:
        return copy.deepcopy(self._existing(kind, name))

    def _existing(self, kind: str, name: str) -> Obj:
        current = self.objects.get((kind, name))
        if current is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return current

    @staticmethod
    def _check_version(current: Obj, version: str | None) -> None:
        if version and version != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")

    def _put(self, obj: Obj) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rvs))
        key = (obj["kind"], obj["metadata"]["name"])
        self.objects[key] = obj
        self.changes.append((self.clock, "MODIFIED", copy.deepcopy(obj)))
        if obj["kind"] == "ConfigMap":
            self._config_written(obj)
        self._check_state()

    def _remove(self, key: tuple[str, str]) -> None:
        gone = self.objects.pop(key)
        self.changes.append((self.clock, "DELETED", copy.deepcopy(gone)))

    # -- the world moving on its own ------------------------------------------------------

    def tick(self, seconds: float) -> None:
        self.clock += seconds

    def set_replicas(self, n: int, job: str = "job") -> None:
        new = copy.deepcopy(self.job(job))
        new["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = n
        new["metadata"]["generation"] += 1
        self._put(new)

    def start(self, name: str) -> None:
        """The kubelet reports the pod's containers running."""
        pod = self.objects.get(("Pod", name))
        if (
            pod
            and pod["status"]["phase"] == "Pending"
            and not pod["metadata"].get("deletionTimestamp")
        ):
            self._put({**copy.deepcopy(pod), "status": running_status(pod)})
            self._running_at[pod["metadata"]["uid"]] = self.clock

    def _ranks_die(self, pod: Obj) -> None:
        """Horovod's driver blacklists a listed host whose ranks die. The blacklist is the
        driver's, in the launcher: it goes with the launcher's pod, and a job started again
        (Kueue evicted it, then admitted it again) starts with none (a fresh seed)."""
        job = pod["metadata"]["labels"].get(names.LABEL_JOB, "")
        launcher = names.launcher_name(job)
        if pod["metadata"]["name"] == launcher:
            self.blacklisted.pop(job, None)
        elif (
            pod["metadata"]["name"] in self._listed.get(job, set())
            and ("Pod", launcher) in self.objects
        ):
            self.blacklisted.setdefault(job, set()).add(pod["metadata"]["name"])

    def rank_hosts(self, job: str) -> frozenset[str]:
        """The workers the launcher's remote shells reach now: listed ones, and unlisted
        ones whose ranks have not reached their next commit yet."""
        hosts = {
            n
            for n in self._listed.get(job, set())
            if (pod := self.objects.get(("Pod", n))) is None
            or self.clock - self._listed_at.get(pod["metadata"]["uid"], 0.0) >= RANK_JOIN_SECONDS
        }
        for pod in self.workers(job):
            left = self._left_at.get(pod["metadata"]["uid"])
            if left is not None and self.clock - left < RANK_LEAVE_SECONDS:
                hosts.add(pod["metadata"]["name"])
        return frozenset(hosts)

    def fail(self, name: str, code: int = 137, reason: str = "") -> None:
        pod = copy.deepcopy(self.objects[("Pod", name)])
        self._ranks_die(pod)
        pod["status"] = {
            "phase": "Failed",
            "reason": reason,
            "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}],
        }
        self._put(pod)

    def vanish_now(self, name: str) -> None:
        """The pod is gone without a delete: its node went, and the pod garbage collector
        removed it."""
        pod = self.objects.get(("Pod", name))
        if pod:
            self._ranks_die(pod)
            self._remove(("Pod", name))

    def vanish(self, name: str) -> None:
        """A terminating pod's grace period ends and it is gone; its room is free again,
        unless a preemptor took it."""
        pod = self.objects.get(("Pod", name))
        if pod and pod["metadata"].get("deletionTimestamp"):
            self._ranks_die(pod)
            self._remove(("Pod", name))
            if pod["metadata"]["uid"] not in self.preemptors:
                self.capacity_changed = self.now

    def preempt(self, name: str, by: str = f"{NAMESPACE}/urgent") -> None:
        """The scheduler preempts the pod for ``by``: marks it a disruption target, records
        its Event and deletes it (the kubelet removes it after its grace)."""
        pod = copy.deepcopy(self.objects[("Pod", name)])
        if pod["metadata"].get("deletionTimestamp"):
            return
        stamp = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": f"{by}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": stamp,
        }
        status = pod["status"]
        status["conditions"] = [*(status.get("conditions") or []), condition]
        pod["metadata"]["deletionTimestamp"] = stamp
        self.preemptors[pod["metadata"]["uid"]] = by
        self._put(pod)

    # -- Kueue -----------------------------------------------------------------------------

    def workloads(self, job: str) -> list[Obj]:
        uid = self.job(job)["metadata"]["uid"]
        return [
            o for (k, _), o in self.objects.items() if k == WORKLOAD and _controller_uid(o) == uid
        ]

    def admit(self, name: str, uid: str, workers: int) -> None:
        """Kueue reserves quota for the Workload, ``workers`` workers at most (partial
        admission: from its minCount up) on flavor ``default``, and admits it."""
        workload = self.objects.get((WORKLOAD, name))
        if workload is None or workload["metadata"]["uid"] != uid:
            return
        status = workload.get("status") or {}
        if status.get("admission") is not None or _true(workload, "Finished"):
            return
        spec = {p["name"]: p for p in workload["spec"]["podSets"]}
        low = spec["worker"].get("minCount", spec["worker"]["count"])
        count = min(max(workers, low), spec["worker"]["count"])
        stamp = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        kept = [c for c in status.get("conditions") or [] if c["type"] not in ADMISSION_CONDITIONS]
        new = copy.deepcopy(workload)
        new["status"] = {
            **status,
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "launcher", "count": 1, "flavors": {"cpu": "default"}},
                    {"name": "worker", "count": count, "flavors": {"cpu": "default"}},
                ],
            },
            "conditions": [
                *kept,
                *(
                    {"type": t, "status": v, "reason": r, "lastTransitionTime": stamp}
                    for t, v, r in (
                        ("QuotaReserved", "True", "QuotaReserved"),
                        ("Admitted", "True", "Admitted"),
                        # Kueue turns an eviction's condition off once quota is reserved again.
                        ("Evicted", "False", "QuotaReserved"),
                    )
                ),
            ],
        }
        self._put(new)

    def evict(self, job: str) -> bool:
        """Kueue preempts the job's admitted Workload: it keeps its quota until the job's
        controller clears the admission. Whether there was one to evict."""
        for workload in self.workloads(job):
            if (workload.get("status") or {}).get("admission") is None or _true(
                workload, "Evicted"
            ):
                continue
            stamp = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
            new = copy.deepcopy(workload)
            conditions = [c for c in new["status"]["conditions"] if c["type"] != "Evicted"]
            evicted = {"type": "Evicted", "status": "True", "reason": "Preempted"}
            message = "Preempted to accommodate a workload of higher priority"
            conditions.append({**evicted, "message": message, "lastTransitionTime": stamp})
            new["status"]["conditions"] = conditions
            self._put(new)
            return True
        return False

    # -- invariants -------------------------------------------------------------------------

    def _violate(self, message: str) -> None:
        self.violations.append(f"t={self.clock:.3f}s: {message}")

    def _check_for(self, owner_uid: str | None, kind: str, name: str) -> None:
        """(f) a turn for one job writes only that job's objects."""
        if self.acting is not None and owner_uid != self.acting.uid:
            self._violate(f"(f) a turn of {self.acting.job} wrote {kind} {name} of another owner")

    def _check_state(self) -> None:
        """(a) the launcher may exec into every host its discover_hosts.sh names, and into
        no pod of someone else's."""
        for job, hosts in self._listed.items():
            role = self.objects.get(("Role", names.launcher_name(job)))
            if not hosts <= exec_names(role):
                self._violate(
                    f"(a) discover_hosts.sh names {sorted(hosts - exec_names(role))} "
                    "which the launcher Role does not let it exec into"
                )
        for (kind, name), role in self.objects.items():
            if kind != "Role":
                continue
            for pod_name in exec_names(role):
                pod = self.objects.get(("Pod", pod_name))
                if pod is not None and _controller_uid(pod) != _controller_uid(role):
                    self._violate(f"(a) Role {name} grants exec on {pod_name}, not its job's")

    def _pod_created(self, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        job = pod["metadata"]["labels"][names.LABEL_JOB]
        granted = exec_names(self.objects.get(("Role", names.launcher_name(job))))
        self.creations.append((name, granted))
        if name in self._listed.get(job, set()):
            self._ever_listed.add(pod["metadata"]["uid"])

    def rank_holders(self, job: str) -> set[str]:
        """The listed hosts that hold ranks now: their pod lives (not failed) and has been
        listed for RANK_JOIN_SECONDS while the launcher ran. No host holds ranks before
        the launcher runs, nor before its driver had that long to start them: they are its
        driver's (fresh seeds found a scale-in while the launcher was Pending, and one 0.5 s
        after a restarted launcher ran, each taken for one that dropped every rank-holder
        by the time listed before the launcher ran)."""
        launcher = self.objects.get(("Pod", names.launcher_name(job)))
        if (
            launcher is None
            or launcher["metadata"].get("deletionTimestamp")
            or launcher["status"]["phase"] != "Running"
        ):
            return set()
        driver = self._running_at.get(launcher["metadata"]["uid"], self.clock)
        return {
            n
            for n in self._listed.get(job, set())
            if (pod := self.objects.get(("Pod", n))) is not None
            and pod["status"]["phase"] != "Failed"
            and self.clock - max(self._listed_at.get(pod["metadata"]["uid"], self.clock), driver)
            >= RANK_JOIN_SECONDS
        }

    def joining(self, job: str) -> set[str]:
        """The listed hosts whose ranks may not have joined and committed yet."""
        launcher = self.objects.get(("Pod", names.launcher_name(job)))
        driver = (
            self._running_at.get(launcher["metadata"]["uid"], self.clock)
            if launcher is not None
            else self.clock
        )
        return {
            n
            for n in self._listed.get(job, set())
            if (pod := self.objects.get(("Pod", n))) is not None
            and self.clock - max(self._listed_at.get(pod["metadata"]["uid"], self.clock), driver)
            < RANK_JOIN_SECONDS + RANK_COMMIT_SECONDS
        }

    def _config_written(self, config_map: Obj) -> None:
        job = config_map["metadata"]["labels"][names.LABEL_JOB]
        hosts = set(discovered(config_map))
        before = self._listed.get(job, set())
        holders = self.rank_holders(job)
        if before != hosts:
            self._check_host_change(job, before, hosts, holders)
        self._listed[job] = hosts
        for name in hosts ^ before:
            pod = self.objects.get(("Pod", name))
            if pod is None:
                continue
            uid = pod["metadata"]["uid"]
            if name in hosts:
                self._ever_listed.add(uid)
                self._left_at.pop(uid, None)
                self._listed_at[uid] = self.clock
            else:
                self._left_at[uid] = self.clock
        acting = self.acting
        if acting is None:
            return
        # What the launcher's reports show its ranks reaching: a host there the controller
        # keeps may stay, though the driver started too lately for ``rank_holders`` (a fresh
        # seed: a worker preempted 0.9 s after a restarted launcher ran). So may one whose
        # reset may still run, until its ranks have joined and committed (rule 1; fresh
        # seeds: workers preempted 0.4 s and 0.9 s after they were listed).
        reached = self.rank_hosts(job) | self.joining(job)
        for name in sorted(hosts):
            pod = self.objects.get(("Pod", name))
            # (c) a listed host exists, is not being deleted, runs and is wanted; but a
            # rank-holder already listed may stay, unwanted or terminating: the last one
            # (rule 2), or one whose reset may still run (rule 1: unlisted then, the notice
            # would be lost). A pod someone else ended (the scheduler preempted it) is what
            # the controller could not know while its view showed the pod running, or, for
            # one listed before, still there (fresh seeds: an opportunistic worker preempted
            # 2 s into a 2 s watch lag; a preempted rank-holder kept, gone by the write).
            terminating = pod is not None and pod["metadata"].get("deletionTimestamp")
            kept = name in before and (name in holders or name in reached)
            unseen = name in acting.listable or (
                pod is None and name in before and name in acting.seen
            )
            if (pod is None and not unseen) or (terminating and not kept and not unseen):
                self._violate(f"(c) discover_hosts.sh names {name}, which is gone or terminating")
            elif not unseen and not kept:
                self._violate(
                    f"(c) discover_hosts.sh names {name}, which the controller's view did not "
                    "show running and wanted"
                )

    def _check_host_change(
        self, job: str, before: set[str], hosts: set[str], holders: set[str]
    ) -> None:
        """(i) a rank-holder stays; (j) never below the minimum once reached.

        A host the write keeps, that the turn's view showed running while the world has it
        failed already, is the rank-holder the controller kept: its failure had not reached
        the caches (a fresh seed failed worker-0 0.13 s before a scale-in to 1 kept it and
        dropped worker-1). No controller can know what its watch has not delivered. A job
        being stopped ends its training as a whole: neither applies."""
        if self.stopping(job):
            return
        acting = self.acting
        unknown = {
            n
            for n in hosts & before
            if acting is not None
            and n in acting.listable
            and (
                (pod := self.objects.get(("Pod", n))) is None or pod["status"]["phase"] == "Failed"
            )
        }
        if holders and not holders & hosts and not unknown:
            self._violate(
                f"(i) discover_hosts.sh of {job} dropped every rank-holder {sorted(holders)}"
            )
        annotations = self.job(job)["metadata"].get("annotations") or {}
        minimum = int(annotations.get(names.ANN_MIN_REPLICAS) or 0)
        count = sum(1 for n in hosts if worker_index(job, n) is not None)
        if minimum and count >= minimum:
            self._reached_min.add(job)
        elif minimum and job in self._reached_min:
            could_stay = [
                n
                for n in before - hosts
                if worker_index(job, n) is not None
                and (pod := self.objects.get(("Pod", n))) is not None
                and pod["status"]["phase"] == "Running"
                and not pod["metadata"].get("deletionTimestamp")
            ]
            if could_stay:
                self._violate(
                    f"(j) discover_hosts.sh of {job} lists {count} workers, below "
                    f"min-replicas {minimum}, and dropped {sorted(could_stay)}"
                )

    def stopping(self, job: str) -> bool:
        """Whether the job is being stopped as a whole, Horovod's driver with it: Kueue
        evicted it (or never admitted it)."""
        spec = self.objects[(names.KIND, job)]
        if not (spec["metadata"].get("labels") or {}).get(QUEUE_LABEL):
            return False
        return not any(
            (w.get("status") or {}).get("admission") is not None and not _true(w, "Evicted")
            for w in self.workloads(job)
        )

    def _check_size(self, job: str, written: Obj) -> None:
        """(k) no more live pods than Kueue admitted; (l) an opportunistic job within
        max-replicas: at the write that could break them (a pod created, a Workload
        written; the worker counts only at a worker created or a Workload written).
        Written from the rules, not with the planner's helpers."""
        spec = self.objects.get((names.KIND, job))
        if spec is None or (self.acting is not None and self.acting.guessing):
            return
        counts = (
            written["kind"] == WORKLOAD
            or worker_index(job, written["metadata"]["name"]) is not None
        )
        live = [
            p
            for p in self.pods
            if job_of(p) == job
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
        ]
        workers = sorted(
            p["metadata"]["name"]
            for p in live
            if worker_index(job, p["metadata"]["name"]) is not None
        )
        labels = spec["metadata"].get("labels") or {}
        annotations = spec["metadata"].get("annotations") or {}
        if labels.get(QUEUE_LABEL):
            admitted = [
                _admitted_workers(w)
                for w in self.workloads(job)
                if (w.get("status") or {}).get("admission") is not None and not _true(w, "Finished")
            ]
            if not admitted and live:
                found = sorted(p["metadata"]["name"] for p in live)
                self._violate(f"(k) {job} has pods {found} while no Workload holds quota")
            elif counts and admitted and len(workers) > max(admitted):
                self._violate(
                    f"(k) {job} has workers {workers}, more than the {max(admitted)} Kueue admitted"
                )
        if annotations.get(names.ANN_OPPORTUNISTIC) == "true":
            high = int(annotations[names.ANN_MAX_REPLICAS])
            if counts and len(workers) > high:
                self._violate(f"(l) {job} has workers {workers}, above max-replicas {high}")

    def _pod_deleted(self, pod: Obj) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        if uid in self.confirmed_deletes:
            self._violate(f"(d) pod {name} deleted again after an accepted delete")
        self.deletions.append((name, self.now, pod["status"]["phase"]))
        job = meta["labels"][names.LABEL_JOB]
        if worker_index(job, name) is None or meta.get("deletionTimestamp") or self.stopping(job):
            return
        drain = self.drain_seconds(job)
        if name in self._listed.get(job, set()):
            self._violate(f"(b) worker pod {name} deleted while discover_hosts.sh names it")
        elif uid in self._ever_listed and pod["status"]["phase"] != "Failed":
            since = self.clock - self._left_at[uid]
            floor = min(drain, DRAIN_FLOOR_SECONDS)
            ranks_left = since >= RANK_LEAVE_SECONDS and since >= floor - 1e-6
            # Drain marks carry microseconds, and sums of float seconds drift by less.
            if since < drain - 1e-6 and not ranks_left:
                self._violate(
                    f"(b) worker pod {name} deleted {since:.3f}s after discover_hosts.sh "
                    f"dropped it, with a {drain:g}s drain"
                )

    def drain_seconds(self, job: str) -> float:
        annotations = self.job(job)["metadata"].get("annotations") or {}
        return float(annotations.get(names.ANN_DRAIN_SECONDS, SETTINGS.default_drain_seconds))


@dataclass(frozen=True)
class Request:
    verb: str
    kind: str
    name: str


class FakeKube(Kube):
    """``Kube`` answered by the world; every request passes ``gate``, where faults happen."""

    def __init__(self, world: World, gate: Gate | None = None) -> None:
        self.world = world
        self.gate: Gate = gate or (lambda _request, apply: apply())

    async def list(self, kind: str, namespace: str, name: str) -> Obj:
        return self.gate(Request("list", kind, name), lambda: self.world.get(kind, name))

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        request = Request("create", obj["kind"], obj["metadata"]["name"])
        return self.gate(request, lambda: self.world.create(obj))

    async def replace(self, obj: Mapping[str, Any]) -> Obj:
        request = Request("replace", obj["kind"], obj["metadata"]["name"])
        return self.gate(request, lambda: self.world.replace(obj))

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> Obj:
        request = Request("patch", kind, name)
        return self.gate(request, lambda: self.world.patch(kind, name, patch, subresource))

    async def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        uid: str,
        grace_seconds: int | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        request = Request("delete", kind, name)
        result = self.gate(request, lambda: self.world.delete(kind, name, uid, resource_version))
        # Only now does the controller know the server accepted it.
        self.world.confirmed_deletes.add(uid)
        return result


class _Clock:
    """Stands in for the ``time`` module in writer.py, so its memory and the marks it
    stamps run on world time."""

    def __init__(self, world: World) -> None:
        self.world = world

    def monotonic(self) -> float:
        return self.world.clock

    def time(self) -> float:
        return self.world.now.timestamp()


@contextmanager
def world_time(world: World) -> Iterator[None]:
    with mock.patch.object(writer_module, "time", _Clock(world)):
        yield


class Cluster:
    """The planner against a world it sees directly; whole plans applied by the real Writer."""

    def __init__(self, job: Obj) -> None:
        self.world = World(job)
        self.name = str(job["metadata"]["name"])
        self.writer = Writer(FakeKube(self.world), lambda _: None)
        # What the last read of the launcher's remote shells said, and what its reports
        # say; a test sets them.
        self.ranks: RankSnapshot | None = None
        self.reports: RankSnapshot | None = None

    @property
    def job(self) -> Obj:
        return self.world.job(self.name)

    @property
    def now(self) -> datetime:
        return self.world.now

    @now.setter
    def now(self, value: datetime) -> None:
        self.world.now = value

    @property
    def objects(self) -> dict[tuple[str, str], Obj]:
        return self.world.objects

    @property
    def pods(self) -> list[Obj]:
        return self.world.pods

    @property
    def events(self) -> list[Emit]:
        return self.world.events

    @property
    def creations(self) -> list[tuple[str, set[str]]]:
        return self.world.creations

    @property
    def deletions(self) -> list[tuple[str, datetime, str]]:
        return self.world.deletions

    def get(self, kind: str, name: str) -> Obj | None:
        return self.world.get_obj(kind, name)

    def observed(self) -> Observed:
        with world_time(self.world):
            asyncio.run(self.writer.recheck((NAMESPACE, self.name), self.job))
        memory = self.writer.of((NAMESPACE, self.name))
        return observe(
            self.world.objects, self.job, memory, self.world.clock, self.ranks, self.reports
        )

    def plan(self, settings: Settings = SETTINGS) -> Writes:
        return plan_writes(self.observed(), settings, self.now)

    def apply(self, p: Writes) -> None:
        with world_time(self.world):
            asyncio.run(self.writer.run(self.job, p))

    def set_replicas(self, n: int) -> None:
        self.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = n

    def run_pods(self) -> None:
        for pod in self.pods:
            self.world.start(pod["metadata"]["name"])

    def finalize_deletions(self) -> None:
        for pod in self.pods:
            self.world.vanish(pod["metadata"]["name"])

    def tick(self, seconds: float) -> None:
        self.world.tick(seconds)

    def converge(self, rounds: int = 20) -> None:
        """Let pods start, deletions finish and time pass until the plan is empty."""
        for _ in range(rounds):
            self.run_pods()
            self.finalize_deletions()
            p = self.plan()
            if not p.actions and resting(p, self.pods):
                if p.requeue_after is None or not self._pause_ends():
                    return
                continue
            self.apply(p)
            if p.probe is not None:
                self.ranks = RankSnapshot(self.now, self.world.rank_hosts(self.name))
            self.tick(p.requeue_after if p.requeue_after else 1)
        raise AssertionError(f"did not converge: {self.plan()}")

    def _pause_ends(self) -> bool:
        """Whether a pause ends in work: a failing worker's replacement backoff looks like
        rest, and a requeue may come sooner than its end, so look at each
        requeue until the longest backoff has passed."""
        waited = 0.0
        while waited <= WORKER_BACKOFF_MAX_SECONDS:
            p = self.plan()
            if p.actions:
                return True
            if p.requeue_after is None:
                return False
            self.tick(p.requeue_after)
            waited += p.requeue_after
        return bool(self.plan().actions)


@dataclass(frozen=True)
class Faults:
    """How badly the world behaves. The defaults are a calm cluster with a prompt watch."""

    # The chance that a request fails: an error answer, or a timeout before or after the
    # server applied it.
    failure: float = 0.0
    # The chance that the controller dies just before a request.
    kill: float = 0.0
    # How long each request takes, and how far behind the world the watch may run.
    latency: float = 0.01
    max_lag: float = 0.0
    # How long a pod takes to start, and a terminating one to go.
    pod_start: tuple[float, float] = (0.2, 2.0)
    grace: tuple[float, float] = (0.2, 2.0)
    # How long Kueue takes to admit a Workload that waits.
    admission: tuple[float, float] = (0.5, 3.0)


CALM = Faults()
# A 409 on a create is AlreadyExists and on a delete a failed UID precondition; the world
# answers those itself, when they are true.
_ERRORS = {
    409: "Conflict",
    403: "Forbidden",
    422: "Invalid",
    500: "InternalError",
}
# Faults a test can script with ``Sim.inject``, besides an ApiError.
KILL = "the controller dies before sending it"
TIMEOUT_BEFORE = "timeout before the server applied it"
TIMEOUT_AFTER = "timeout after the server applied it"
Fault = ApiError | str


@dataclass(order=True)
class _Timer:
    """Something the world does at ``at``: "start" or "vanish" the pod (name, uid),
    "admit" the Workload (name, uid),
    "watch": deliver world change ``index`` to the cache of controller ``process``, or
    "user": call ``action``."""

    at: float
    seq: int
    what: str = field(compare=False)
    name: str = field(compare=False, default="")
    uid: str = field(compare=False, default="")
    index: int = field(compare=False, default=-1)
    process: int = field(compare=False, default=0)
    action: Callable[[], None] | None = field(compare=False, default=None)


class Sim:
    """The controller's reconcile loop against a ``World`` that lags, fails and kills it.

    The loop of ``controller.Controller``: a watch cache (here ``view``) fed by the world's
    change stream after a random delay, the controller's own confirmed writes upserted into
    it, read by the controller's own ``observe`` (core/inputs/observe.py), one job reconciled at a
    time from a queue of due times, a failed turn retried with the work queue's backoff,
    ``requeue_after`` honoured. The real ``Writer`` executes each plan, phase by phase;
    ``writer`` and ``planner`` can be swapped for variants under test.
    """

    def __init__(
        self,
        world: World,
        *,
        seed: int = 0,
        faults: Faults = CALM,
        planner: Planner = plan_writes,
        writer: type[Writer] = Writer,
        settings: Settings = SETTINGS,
    ) -> None:
        self.world = world
        self.rng = random.Random(seed)
        self.faults = faults
        self.planner = planner
        self.writer_type = writer
        self.settings = settings
        self.jobs = sorted(name for kind, name in world.objects if kind == names.KIND)
        # Turns taken, turns that failed, and how often the controller died in one.
        self.turns = self.failed_turns = self.kills = 0
        # How often each fault was met: "409" ... "500", KILL, TIMEOUT_BEFORE, TIMEOUT_AFTER.
        self.met: Counter[str] = Counter()
        self._scripted: list[tuple[Request, Fault]] = []
        self._loop = asyncio.new_event_loop()
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._scanned = 0
        self._process = 0
        # The launchers' last reports, by job: (launcher uid, snapshot).
        self._pushed: dict[str, tuple[str, RankSnapshot]] = {}
        # The turn in progress: which phase each of its plan's requests belongs to, which
        # were accepted, the phase of the first that failed, and whether the server itself
        # answered one with an error.
        # A pod patched twice in a turn (its notice, then its label) has a phase for each
        # time: ``_sent`` says which time this is.
        self._phase_of: dict[Request, list[int]] = {}
        self._sent: Counter[Request] = Counter()
        self._accepted: Counter[Request] = Counter()
        self._failed: int | None = None
        self._sending: int | None = None
        self._failed_request: tuple[Request, Fault] | None = None
        self._unsure = False
        self.restart(delay=0.0)

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> Sim:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the controller process -------------------------------------------------------------

    def restart(self, delay: float = 1.0) -> None:
        """A new controller process: empty memory, caches listed afresh, every job queued."""
        self._scan()
        self._process += 1
        self._delivered: dict[str, float] = {}
        self.dead = False
        self.writer = self.writer_type(FakeKube(self.world, self._gate), self._upsert)
        self.view = copy.deepcopy(self.world.objects)
        self._seen_deleted: set[str] = set()
        self._signatures = {name: job_signature(self.world.job(name)) for name in self.jobs}
        self._backoff: ItemBackoff[str] = ItemBackoff(60.0)
        self._ranks: dict[str, RankSnapshot] = {}
        # Per job, the preempted pods the watch saw go, with when (``Fleet.gone``).
        self._gone: dict[str, list[tuple[float, Obj]]] = {}
        self.due = {name: self.world.clock + delay for name in self.jobs}

    def _queue(self, name: str, at: float) -> None:
        self.due[name] = min(self.due.get(name, at), at)

    def reports(self, name: str) -> RankSnapshot | None:
        """What the running launcher's reports say (ranks.py): the world's ranks as of now,
        each host since it was first reached without a break. Kept across controller
        restarts, as the ranks ConfigMap is; started afresh by a new launcher."""
        launcher = self.world.objects.get(("Pod", names.launcher_name(name)))
        if (
            launcher is None
            or launcher["metadata"].get("deletionTimestamp")
            or (launcher.get("status") or {}).get("phase") != "Running"
        ):
            self._pushed.pop(name, None)
            return None
        uid = str(launcher["metadata"]["uid"])
        last = self._pushed.get(name)
        before = last[1] if last is not None and last[0] == uid else None
        hosts, now = self.world.rank_hosts(name), self.world.now
        since = {
            h: before.since.get(h, now) if before and h in (before.hosts or ()) else now
            for h in hosts
        }
        known = hosts | (before.known or frozenset() if before else frozenset())
        marked = [h for h in hosts if (now - since[h]).total_seconds() >= RANK_COMMIT_SECONDS]
        started = {**(before.started if before else {}), **since}
        snapshot = RankSnapshot(
            now, hosts, since=since, known=known, committed=frozenset(marked), started=started
        )
        self._pushed[name] = (uid, snapshot)
        return snapshot

    def _wake_on_ranks(self, name: str) -> None:
        """A report is a watch event: queue the job when its ranks next join or leave."""
        clock, changes = self.world.clock, []
        for pod in self.world.workers(name):
            uid = pod["metadata"]["uid"]
            if (t := self.world._listed_at.get(uid)) is not None:
                changes.append(t + RANK_JOIN_SECONDS)
                changes.append(t + RANK_JOIN_SECONDS + RANK_COMMIT_SECONDS)
            if (t := self.world._left_at.get(uid)) is not None:
                changes.append(t + RANK_LEAVE_SECONDS)
        due = [t for t in changes if t > clock]
        if due:
            process = self._process

            def wake() -> None:
                if process == self._process:
                    self._queue(name, self.world.clock)

            self.later(min(due) - clock + 0.01, wake)

    def _upsert(self, obj: Obj) -> None:
        """The Writer's cache callback: read-your-writes, never back in time."""
        key = (obj["kind"], obj["metadata"]["name"])
        current = self.view.get(key)
        if obj["metadata"]["uid"] in self._seen_deleted:
            return
        if current is None or _rv(obj) >= _rv(current):
            self.view[key] = copy.deepcopy(obj)

    def _watch(self, type_: str, obj: Obj) -> None:
        """One watch event reaches the cache, and queues the job it concerns."""
        key = (obj["kind"], obj["metadata"]["name"])
        current = self.view.get(key)
        uid = obj["metadata"]["uid"]
        if type_ == "DELETED":
            self._seen_deleted.add(uid)
            if obj["kind"] == "Pod" and _disrupted(obj):
                self._gone.setdefault(job_of(obj), []).append((self.world.clock, obj))
            if current is not None and current["metadata"]["uid"] == uid:
                del self.view[key]
        elif current is None or _rv(obj) > _rv(current):
            self.view[key] = obj
        if obj["kind"] == names.KIND:
            signature = job_signature(obj)
            if self._signatures.get(key[1]) != signature:
                self._signatures[key[1]] = signature
                self._queue(key[1], self.world.clock)
            return
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref["name"] in self.jobs:
                self._queue(ref["name"], self.world.clock)

    def inject(self, request: Request, fault: Fault) -> None:
        """Make the next request that matches ``request`` meet ``fault``."""
        self._scripted.append((request, fault))

    def _gate(self, request: Request, apply: Callable[[], Obj]) -> Obj:
        """One request: the process may die first, it takes time, and it may fail."""
        fault = self._fault(request)
        if fault is not None:
            self.met[str(fault.status) if isinstance(fault, ApiError) else fault] += 1
        if self.dead or fault == KILL:
            self.dead = True
            raise Killed(request)
        phase = self._phase(request)
        self._check_phase(request, phase)
        if phase is not None:
            self._sending = phase
        self._progress(self.world.clock + self.faults.latency)
        if fault is not None and fault != TIMEOUT_AFTER:
            self._fail(request, phase, fault)
        if isinstance(fault, ApiError):
            raise fault
        if fault == TIMEOUT_BEFORE:
            raise TimeoutError(fault)
        try:
            result = apply()
        except ApiError:
            # The server's own answer (a name taken, a pod gone): whether the writer takes
            # it for a failure depends on the write, so later phases may or may not follow.
            # A timeout meant to come after the server applied it never comes then (found
            # with a fresh seed: a ServiceAccount made by a create that timed out, whose
            # retry met AlreadyExists, which the writer rightly takes as success).
            self._unsure = True
            raise
        if fault == TIMEOUT_AFTER:
            self._fail(request, phase, fault)
            raise TimeoutError(fault)
        self._accepted[request] += 1
        return result

    def _fail(self, request: Request, phase: int | None, fault: Fault) -> None:
        # A request outside the plan made once the plan's writes go out (the read of who
        # holds a taken name) is part of the write that made it: of the latest phase sent
        # (found by a fresh seed). One before them stops the turn: no write may follow.
        # An Event is sent in the background, in no order: one that fails stops nothing
        # (an opportunistic job's Events go out while its turn's writes do).
        if request.kind == "Event":
            return
        if phase is None:
            phase = -1 if self._sending is None else self._sending
        self._failed = phase
        self._failed_request = (request, fault)

    def _phase(self, request: Request) -> int | None:
        """The phase of the plan this sending of ``request`` belongs to."""
        phases = self._phase_of.get(request)
        if not phases:
            return None
        time = self._sent[request]
        self._sent[request] += 1
        return phases[min(time, len(phases) - 1)]

    def _check_phase(self, request: Request, phase: int | None) -> None:
        """(h) The write goes out only after every write of the phases above it was
        accepted, and not after one failed. The status write that reports a refused
        write is the writer's own, outside the plan."""
        if phase is None or (
            request.kind == names.KIND and (self._failed is not None or self._unsure)
        ):
            return
        if self._failed is not None and phase > self._failed:
            self.world._violate(
                f"(h) {request} went out after a write of an earlier phase failed "
                f"({self._failed_request})"
            )
            return
        waiting = sorted(
            r.name
            for r, phases in self._phase_of.items()
            for time, p in enumerate(phases)
            if p < phase and self._accepted[r] <= time
        )
        if waiting and not self._unsure:
            self.world._violate(
                f"(h) {request} went out before {waiting} of an earlier phase were accepted"
            )

    def _fault(self, request: Request) -> Fault | None:
        for i, (match, fault) in enumerate(self._scripted):
            if match == request:
                del self._scripted[i]
                return fault
        if self.rng.random() < self.faults.kill:
            return KILL
        if self.rng.random() >= self.faults.failure:
            return None
        codes = [c for c in _ERRORS if not (c == 409 and request.verb in ("create", "delete"))]
        pick = self.rng.randrange(len(codes) + 2)
        if pick == len(codes):
            return TIMEOUT_BEFORE
        if pick > len(codes):
            return TIMEOUT_AFTER
        code = codes[pick]
        return ApiError(code, _ERRORS[code], f"injected on {request}")

    def _turn(self, name: str) -> None:
        """``Controller.reconcile`` and the worker around it, for one job."""
        del self.due[name]
        self.turns += 1
        job = self.view[(names.KIND, name)]
        try:
            with world_time(self.world):
                self._loop.run_until_complete(self.writer.recheck((NAMESPACE, name), job))
        except (ApiError, TimeoutError, Killed):
            self.failed_turns += 1
            if not self.dead:
                self._queue(name, self.world.clock + self._backoff.next_delay(name))
            return
        memory = self.writer.of((NAMESPACE, name))
        observed = observe(
            self.view,
            job,
            memory,
            self.world.clock,
            self._ranks.get(name),
            self.reports(name),
            self.beside(name),
        )
        seen = {p["metadata"]["name"] for p in observed.pods}
        guessing = any(h.startswith(UNREAD_HOLDER) for h in memory.conflicts.values())
        self.world.acting = Acting(name, job["metadata"]["uid"], listable(observed), seen, guessing)
        the_plan = self.planner(observed, self.settings, self.world.now)
        self._phase_of = phase_requests(the_plan, name)
        self._sent = Counter()
        self._accepted = Counter()
        self._failed = None
        self._sending = None
        self._unsure = False
        try:
            with world_time(self.world):
                self._loop.run_until_complete(self.writer.run(copy.deepcopy(job), the_plan))
        except (ApiError, TimeoutError, Killed):
            self.failed_turns += 1
            if not self.dead:
                self._queue(name, self.world.clock + self._backoff.next_delay(name))
        else:
            self._backoff.forget(name)
            if the_plan.probe is not None:
                self._probe(name)
            retry = memory.next_retry()
            requeue = [t for t in (the_plan.requeue_after, retry) if t is not None]
            if requeue:
                # As the reconciler does: a hair late, so the deadline has passed on arrival.
                self._queue(name, self.world.clock + min(requeue) + 0.05)
        finally:
            self.world.acting = None
            self._phase_of = {}
        self._wake_on_ranks(name)
        if self.dead:
            self.kills += 1
            self.restart()
        if self.world.violations:
            raise Violation("\n".join(self.world.violations))

    def beside(self, name: str) -> Gathered:
        """What the controller's shell gathers beside the caches: its memory of the pods
        preempted lately (``fleet.GONE_SECONDS``), the scheduler's Events, and when room
        came free (seen by the watch as soon as it happened, which is what the fleet's
        own watch promises)."""
        clock = self.world.clock
        recent = [p for at, p in self._gone.get(name, []) if clock - at < GONE_SECONDS]
        return Gathered(
            gone=recent,
            preemptors=dict(self.world.preemptors),
            capacity_changed=self.world.capacity_changed,
        )

    def _probe(self, name: str) -> None:
        """The reconciler's read of the launcher: answered after one latency, then the job
        is queued, as ``RankProbes`` does."""
        process, at = self._process, self.world.now
        hosts = self.world.rank_hosts(name)

        def answer() -> None:
            if process == self._process:
                self._ranks[name] = RankSnapshot(at, hosts)
                self._queue(name, self.world.clock)

        self.later(max(self.faults.latency, 0.01), answer)

    # -- the world's own pace ---------------------------------------------------------------

    def _scan(self) -> None:
        """Schedule what the world's new changes set off: a kubelet starts a new pod and
        removes a terminating one after its grace; each kind's watch delivers the change to
        the cache after a random lag, in order within the kind (as separate watches do)."""
        changes = self.world.changes
        for index in range(self._scanned, len(changes)):
            at, type_, obj = changes[index]
            meta = obj["metadata"]
            if type_ == "MODIFIED" and obj["kind"] == "Pod":
                if meta.get("deletionTimestamp"):
                    self._timer(at + self.rng.uniform(*self.faults.grace), "vanish", obj)
                elif obj["status"]["phase"] == "Pending":
                    self._timer(at + self.rng.uniform(*self.faults.pod_start), "start", obj)
            if waits_for_kueue(type_, obj):
                self._push(
                    _Timer(
                        at + self.rng.uniform(*self.faults.admission),
                        next(self._seq),
                        "admit",
                        meta["name"],
                        meta["uid"],
                    )
                )
            kind = obj["kind"]
            deliver = max(
                self._delivered.get(kind, 0.0), at + self.rng.uniform(0, self.faults.max_lag)
            )
            self._delivered[kind] = deliver
            self._push(
                _Timer(deliver, next(self._seq), "watch", index=index, process=self._process)
            )
        self._scanned = len(changes)

    def _timer(self, at: float, what: str, pod: Obj) -> None:
        meta = pod["metadata"]
        self._push(_Timer(at, next(self._seq), what, meta["name"], meta["uid"]))

    def later(self, seconds: float, action: Callable[[], None]) -> None:
        """Have the user do ``action`` after ``seconds``, in the middle of a turn if it
        comes to that."""
        self._push(_Timer(self.world.clock + seconds, next(self._seq), "user", action=action))

    def _push(self, timer: _Timer) -> None:
        heapq.heappush(self._timers, timer)

    def _next_event(self) -> float:
        self._scan()
        times = list(self.due.values())
        if self._timers:
            times.append(self._timers[0].at)
        return min(times, default=float("inf"))

    def _progress(self, until: float) -> None:
        """Let the kubelet and the watches catch up with ``until``; no reconcile runs."""
        while True:
            self._scan()
            if not self._timers or self._timers[0].at > until:
                break
            t = heapq.heappop(self._timers)
            self.world.clock = max(self.world.clock, t.at)
            if t.action is not None:
                t.action()
                continue
            if t.what == "watch":
                # A dead process's watches deliver nothing; the new one listed afresh.
                if t.process == self._process:
                    _, type_, obj = self.world.changes[t.index]
                    self._watch(type_, copy.deepcopy(obj))
                continue
            if t.what == "admit":
                workers = self.rng.randint(1, MAX_ADMITTED)
                self.world.admit(t.name, t.uid, workers)
                continue
            pod = self.world.get_obj("Pod", t.name)
            if pod is not None and pod["metadata"]["uid"] == t.uid:
                (self.world.start if t.what == "start" else self.world.vanish)(t.name)
        self.world.clock = max(self.world.clock, until)

    def advance(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Let ``seconds`` pass, reconciling every job whose turn comes; stop early once
        ``until`` holds after a turn."""
        end = self.world.clock + seconds
        while (at := self._next_event()) <= end:
            self._progress(at)
            due = [(t, name) for name, t in self.due.items() if t <= self.world.clock]
            if due:
                self._turn(min(due)[1])
                if until is not None and until():
                    return
        self._progress(end)

    def settle(self, seconds: float = 300.0) -> None:
        """(e) With faults over and time passing, every job reaches its spec, then rests."""
        self.faults = Faults(max_lag=self.faults.max_lag)
        self._scripted.clear()
        self.advance(seconds)
        problems = [p for name in self.jobs for p in self.unconverged(name)]
        if problems:
            raise Violation(f"(e) after {seconds:g}s without faults: " + "; ".join(problems))

    def unconverged(self, name: str) -> list[str]:
        job = self.world.job(name)
        workers = self.world.workers(name)
        have = [p["metadata"]["name"] for p in workers]
        hosts = discovered(self.world.get_obj("ConfigMap", names.config_map_name(name)))
        role = exec_names(self.world.get_obj("Role", names.launcher_name(name)))
        problems = []
        low, high = self.wanted(name)
        if not low <= len(have) <= high:
            wants = low if low == high else f"{low} to {high}"
            problems.append(f"{name} has worker pods {have}, wants {wants}")
        idle = [w for w in have if w not in set(hosts)]
        if idle:
            problems.append(f"{name}'s discover_hosts.sh does not name {idle}")
        expected = set(have)
        if requests_gpu(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]) and (
            self.world.get_obj("Pod", names.launcher_name(name))
        ):
            expected.add(names.launcher_name(name))  # a launcher that is a host
        if sorted(hosts) != sorted(expected) or role != expected:
            problems.append(f"{name} lists {hosts} and grants exec on {sorted(role)}")
        unusable = sorted(set(have) & self.world.blacklisted.get(name, set()))
        if unusable:
            problems.append(f"{name} keeps workers {unusable} that Horovod blacklisted")
        if self.world.get_obj("Pod", names.launcher_name(name)) is None:
            problems.append(f"{name} has no launcher")
        memory = self.writer.of((NAMESPACE, name))
        left = self.planner(
            observe(self.world.objects, job, memory, self.world.clock, beside=self.beside(name)),
            self.settings,
            self.world.now,
        )
        if left.actions or not resting(left, self.world.pods):
            problems.append(f"{name} still plans {left}")
        return problems

    def wanted(self, name: str) -> tuple[int, int]:
        """The fewest and the most workers a job may end with: its replicas; an
        opportunistic job from its replicas up to max-replicas; a queued job's replicas,
        at most as many as Kueue admitted. Not max-replicas exactly for the opportunistic
        job, though the simulated cluster always has room: a fresh seed found one scaled
        in from 2 to 1 while its growth backed off after a preemption rest at 2 workers
        of 3 with the backoff over: the worker the scale-in left, not opportunistic, fills
        the one worker a probe after a failure adds, so no probe is ever bound and the
        backoff never ends. Whether it should grow again is the growth rules' question,
        not the safety invariants'."""
        job = self.world.job(name)
        annotations = job["metadata"].get("annotations") or {}
        if annotations.get(names.ANN_OPPORTUNISTIC) == "true":
            return replicas(job), int(annotations[names.ANN_MAX_REPLICAS])
        if (job["metadata"].get("labels") or {}).get(QUEUE_LABEL):
            held = [
                _admitted_workers(w)
                for w in self.world.workloads(name)
                if (w.get("status") or {}).get("admission") is not None
            ]
            admitted = min(replicas(job), max(held, default=0))
            return admitted, admitted
        return replicas(job), replicas(job)


def _request(action: Action, job: str) -> Request | None:
    """The request a write of the plan makes, as ``FakeKube`` names it."""
    if isinstance(action, Create | Replace):
        verb = "create" if isinstance(action, Create) else "replace"
        return Request(verb, action.obj["kind"], action.obj["metadata"]["name"])
    if isinstance(action, AnnotatePod):
        return Request("patch", "Pod", action.name)
    if isinstance(action, DeletePod):
        return Request("delete", "Pod", action.name)
    if isinstance(action, DeleteObject):
        return Request("delete", action.kind, action.name)
    if isinstance(action, Claim):
        return Request("patch", action.kind, action.name)
    if isinstance(action, PatchStatus):
        return Request("patch", action.obj["kind"], action.obj["metadata"]["name"])
    if isinstance(action, WriteStatus):
        return Request("patch", names.KIND, job)
    return None  # an Event: sent in the background, in no order


def phase_requests(p: Writes, job: str) -> dict[Request, list[int]]:
    """The phases of the plan each of its requests belongs to, in order: a pod patched
    twice (its notice, then its label) has two."""
    found: dict[Request, list[int]] = {}
    for index, phase in enumerate(p.phases):
        for action in phase.writes:
            if (request := _request(action, job)) is not None:
                found.setdefault(request, []).append(index)
    return found


def resting(p: Writes, pods: list[Obj]) -> bool:
    """Nothing left to do: no drain or deletion under way, and no turn due."""
    leaving = any(
        names.ANN_DRAINING_SINCE in (pod["metadata"].get("annotations") or {})
        or pod["metadata"].get("deletionTimestamp")
        for pod in pods
    )
    return p.requeue_after is None and not leaving


def replicas(job: Mapping[str, Any]) -> int:
    return int(job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])


def listable(observed: Observed) -> set[str]:
    """The hosts the observed pods and spec allow in discover_hosts.sh: workers that can
    take ranks, and a launcher that requests a GPU while its pod exists.

    Written from the rule (docs/membership.md), not with the planner's helpers, so that a
    bug in those shows here: a worker is ``<job>-worker-<index>``, not being deleted, and
    its main container (the first) runs, and is Ready if it has a readiness probe."""
    job = str(observed.job["metadata"]["name"])
    gpu = requests_gpu(observed.job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
    hosts: set[str] = set()
    for pod in observed.pods:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if (gpu and name == names.launcher_name(job)) or (
            re.fullmatch(rf"{re.escape(job)}-worker-(0|[1-9][0-9]*)", name) and _main_up(pod)
        ):
            hosts.add(name)
    return hosts


def _main_up(pod: Mapping[str, Any]) -> bool:
    main = pod["spec"]["containers"][0]
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status["name"] == main["name"]:
            running = "running" in (status.get("state") or {})
            return running and (status.get("ready") is True or "readinessProbe" not in main)
    return False


def exec_names(role: Mapping[str, Any] | None) -> set[str]:
    """The pods a launcher Role lets it exec into, read from the rules as RBAC reads them:
    a rule grants ``create`` on ``pods/exec`` for the names it lists."""
    granted: set[str] = set()
    for rule in (role or {}).get("rules") or []:
        if "pods/exec" in rule.get("resources", ()) and "create" in rule.get("verbs", ()):
            granted |= set(rule.get("resourceNames", ()))
    return granted
