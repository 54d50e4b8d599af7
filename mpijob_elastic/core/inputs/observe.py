"""What the caches hold for one job, read into the planner's input, ``Observed``.

One pure function used by the controller, the simulation and ``render``: the caches are
passed in as views (``View``), the writer's memory of what landed as ``Memory``, what the
shell keeps beyond the job's children as plain values (``Gathered``), and the clock as a
value, so nothing here reads the time or does I/O. Everything a decision reads enters
here, so a simulated turn sees what a real one sees: opportunistic and queued jobs too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Refusal
from mpijob_elastic.core.inputs.growth_state import Share
from mpijob_elastic.core.inputs.ranks import RankSnapshot
from mpijob_elastic.core.queueing.kueue import Queue, queued
from mpijob_elastic.core.spec.parse import launcher_service_account

Obj = dict[str, Any]

# The kinds of children a hand-over may claim (handover.py): those training-operator made.
HANDOVER_KINDS = ("Pod", "ConfigMap", "ServiceAccount", "Role", "RoleBinding")


@dataclass(frozen=True)
class Observed:
    """What the caches hold for one job: only children it controls, in its namespace."""

    job: Mapping[str, Any]
    pods: Sequence[Mapping[str, Any]] = ()
    config_map: Mapping[str, Any] | None = None
    service_account: Mapping[str, Any] | None = None
    role: Mapping[str, Any] | None = None
    role_binding: Mapping[str, Any] | None = None
    disruption_budget: Mapping[str, Any] | None = None
    # The gang scheduler's PodGroup (podgroups.py), named after the job.
    pod_group: Mapping[str, Any] | None = None
    # UIDs of pods whose delete the server accepted while the cache still shows them
    # without a deletionTimestamp (a pod removed at once answers with a Status, not the
    # pod), for at most DELETE_MEMORY_SECONDS.
    deleting: frozenset[str] = frozenset()
    # (kind, name) of children whose name an object this job does not control already
    # holds, with a description of that object for the user.
    conflicts: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # (kind, name) of objects the job uses without controlling them: a ServiceAccount of
    # the launcher's name that someone else made (the user's own, named in the template).
    in_use: frozenset[tuple[str, str]] = frozenset()
    # Which workers the launcher's remote shells reach, from its reports (ranks.py); None
    # while no launcher runs.
    ranks: RankSnapshot | None = None
    # The job's ranks ConfigMap, if it exists as the job's; and the last exec read of the
    # launcher, asked for only where the reports say nothing (ranks.py).
    ranks_report: Mapping[str, Any] | None = None
    ranks_read: RankSnapshot | None = None
    # Nodes that are going away (nodes.py), with why.
    leaving_nodes: Mapping[str, str] = field(default_factory=dict)
    # Candidates for a hand-over (handover.py), not among the children above: objects
    # this job controls that carry only another controller's labels, and objects in its
    # namespace that no controller owns.
    strays: Sequence[Mapping[str, Any]] = ()
    # The last write the server refused (the writer's memory of it).
    refused: Refusal | None = None
    # For an opportunistic job (opportunistic.py): the other opportunistic jobs' growth
    # states, and when capacity last changed (a node that starts to take pods, a pod of
    # ours that held a node deleted), as far as this controller saw since it started.
    fleet: Sequence[Share] = ()
    capacity_changed: datetime | None = None
    # The last states of the job's pods deleted while disrupted, lately (fleet.py): a
    # preempted worker may be gone before a turn saw its preemption.
    gone: Sequence[Mapping[str, Any]] = ()
    # The pod of higher priority (<namespace>/<name>) that preempted each pod, by the
    # victim's UID, from the scheduler's Preempted Events (preemptors.py); None: this
    # controller may not read Events.
    preemptors: Mapping[str, str] | None = None
    # What the caches hold of Kueue for a job labelled for a Kueue queue (kueue.py): its
    # Workloads, the flavors, the priorities; None: not labelled.
    queue: Queue | None = None


@dataclass(frozen=True)
class Gathered:
    """What a turn reads besides the caches of the job's children, as the shell keeps it:
    the fields of ``Observed`` of the same names. ``observe`` takes from it only what
    applies to the job (``reads_fleet``, ``queued``), so a caller may pass all of it."""

    ranks: RankSnapshot | None = None
    ranks_read: RankSnapshot | None = None
    leaving_nodes: Mapping[str, str] = field(default_factory=dict)
    fleet: Sequence[Share] = ()
    capacity_changed: datetime | None = None
    gone: Sequence[Mapping[str, Any]] = ()
    preemptors: Mapping[str, str] | None = None
    queue: Queue | None = None


def reads_fleet(job: Mapping[str, Any]) -> bool:
    """Only an opportunistic job's decisions read the fleet, the capacity changes, its gone
    pods and their preemptors (opportunistic.py); the shell need not gather them for
    another (the preemptors cost a pass over the namespace's Preempted Events)."""
    return names.asks_to_grow(job)


class View(Protocol):
    """One cache of one kind: its objects by controller owner, by name."""

    def by_owner(self, uid: str) -> Iterable[Obj]: ...

    def get(self, namespace: str, name: str) -> Obj | None: ...


class Memory(Protocol):
    """What the writer learned that the caches cannot show yet (writer.JobMemory)."""

    def deleting(self, pods: Sequence[Mapping[str, Any]], now: float) -> frozenset[str]: ...

    def taken(self) -> Mapping[tuple[str, str], str]: ...

    def used(self, now: float) -> frozenset[tuple[str, str]]: ...

    @property
    def refused(self) -> Refusal | None: ...


# kind -> the cache of that kind for the job's namespace, None if there is none.
Caches = Callable[[str], View | None]


def observe(
    job: Mapping[str, Any],
    caches: Caches,
    handover: Caches,
    memory: Memory,
    now: float,
    gathered: Gathered = Gathered(),
) -> Observed:
    """``caches`` hold the children carrying our labels, ``handover`` those that carry only
    another controller's (docs/handover.md); ``now``: the monotonic clock's reading, which
    the writer's memory runs on."""
    meta = job["metadata"]
    ns, uid = meta["namespace"], meta["uid"]

    def named(kind: str, name: str) -> Obj | None:
        return _named(job, caches, kind, name)

    def strays(kind: str) -> list[Obj]:
        """Hand-over candidates (handover.py): children of this job that only the
        hand-over caches hold."""
        main, other = caches(kind), handover(kind)
        found = []
        for obj in other.by_owner(uid) if other is not None else ():
            obj_meta = obj["metadata"]
            seen = main.get(ns, obj_meta["name"]) if main else None
            # Relabelled already: our write put it in the main cache, and the hand-over
            # cache's view of it is on its way out.
            if obj_meta["namespace"] == ns and not (
                seen is not None and seen["metadata"].get("uid") == obj_meta.get("uid")
            ):
                found.append(obj)
        return found

    pods = _owned(job, caches, "Pod")
    launcher = names.launcher_name(meta["name"])
    opportunistic = reads_fleet(job)
    return Observed(
        job=job,
        pods=pods,
        config_map=named("ConfigMap", names.config_map_name(meta["name"])),
        service_account=named("ServiceAccount", launcher_service_account(job)),
        role=named("Role", launcher),
        role_binding=named("RoleBinding", launcher),
        disruption_budget=named("PodDisruptionBudget", names.disruption_budget_name(meta["name"])),
        pod_group=named("PodGroup", meta["name"]),
        deleting=memory.deleting(pods, now),
        conflicts=memory.taken(),
        in_use=memory.used(now),
        refused=memory.refused,
        ranks=gathered.ranks,
        ranks_report=named("ConfigMap", names.ranks_name(meta["name"])),
        ranks_read=gathered.ranks_read,
        leaving_nodes=dict(gathered.leaving_nodes),
        strays=[o for kind in HANDOVER_KINDS for o in strays(kind)],
        fleet=gathered.fleet if opportunistic else (),
        capacity_changed=gathered.capacity_changed if opportunistic else None,
        gone=gathered.gone if opportunistic else (),
        preemptors=gathered.preemptors if opportunistic else None,
        queue=queued(job, gathered.queue),
    )


def launcher_report(job: Mapping[str, Any], caches: Caches) -> tuple[Obj | None, bool]:
    """The job's ranks ConfigMap, if it is the job's, and whether its launcher runs: what
    the launcher's reports are read from. The shell reads them before ``observe``, to keep
    the reports across turns so that losses add up (rankprobe.py), and passes the snapshot
    in as ``Gathered.ranks``."""
    name = job["metadata"]["name"]
    launcher = names.launcher_name(name)
    running = any(
        p["metadata"]["name"] == launcher
        and not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
        for p in _owned(job, caches, "Pod")
    )
    return _named(job, caches, "ConfigMap", names.ranks_name(name)), running


def _owned(job: Mapping[str, Any], caches: Caches, kind: str) -> list[Obj]:
    meta = job["metadata"]
    ns, cache = meta["namespace"], caches(kind)
    return (
        [o for o in cache.by_owner(meta["uid"]) if o["metadata"]["namespace"] == ns]
        if cache
        else []
    )


def _named(job: Mapping[str, Any], caches: Caches, kind: str, name: str) -> Obj | None:
    return next((o for o in _owned(job, caches, kind) if o["metadata"]["name"] == name), None)


class Listed:
    """A view over a plain list of objects, for callers without caches (``render``, the
    simulation)."""

    def __init__(self, objects: Iterable[Obj]) -> None:
        # Ordered by key, as the caches answer.
        self.objects = sorted(
            objects, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])
        )

    def by_owner(self, uid: str) -> list[Obj]:
        return [o for o in self.objects if controller_uid(o) == uid]

    def get(self, namespace: str, name: str) -> Obj | None:
        meta = (namespace, name)
        return next(
            (
                o
                for o in self.objects
                if (o["metadata"]["namespace"], o["metadata"]["name"]) == meta
            ),
            None,
        )


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None
