"""The ordered writes that move the observed children to the desired ones.

The order is the safety argument, stated once, here, and returned as data: a plan is a
list of phases (``STEPS`` names them, in order). The writes of one phase rely on nothing
else in it and may go out together; the shell starts a phase only once the server
accepted every write of the one before, and stops at the first phase with a write
refused, so every write may rely on the phases above it having landed:

1. ``ServiceAccount``, then ``PodDisruptionBudget``: the budget before any worker it
   protects exists.
   Then ``notices``: each pod's notice to the training (notices.py) set, changed or
   removed, before anything of this turn happens to the pod: a scale-in victim reads its
   notice before the host list drops it, a pod of a suspended job before its delete. The
   patch carries the pod's observed resourceVersion like every pod patch (but for a pod
   carrying ``DisruptionTarget``, whose deletion is under way and rewrites it); a later patch
   of the same pod in the same turn (``config hash``, ``pod marks``) then carries none:
   the notice's patch landing proved that view current, and its own write changed it.
   Then ``PodGroup`` (under a gang scheduler, podgroups.py): the gang before its pods,
   which the scheduler would otherwise hold as members of no group, and a PodGroup the
   server refuses (its CRD not installed) stops the turn before any pod is made, as
   training-operator makes none without it.
2. ``ConfigMap``: victims leave the host lists before anything happens to them; a worker
   is listed only once the Role we wrote grants exec on it (``desired.py``). Then
   ``ranks ConfigMap``: the job's ranks ConfigMap, created empty (only its existence is
   ours, its data is the launcher's reports, ranks.py); before the Role that grants the
   launcher its patch, so a name someone else holds is never granted. Then
   ``ConfigMap events``: the Events of what that write recorded (``CONFIG_MAP_EVENTS``:
   workers listed into idle capacity, the growth's backoff, a preemption's victims),
   sent as soon as it landed: at the end of the turn, a later phase's conflict (a 409 on
   the launcher's refresh) lost them, and the next turn, seeing the change already
   recorded, had nothing to report.
3. ``obsolete``: the budget's delete, once the job is suspended, finished or no longer
   elastic.
4. ``config hash``: the launcher's annotation; its kubelet refreshes the mounted files now.
5. ``pod marks``: the rank-holder label set on workers that hold ranks and removed from
   the others (the PodDisruptionBudget counts only labelled workers, host_rules.py); drain
   marks cleared on workers the job keeps, and marks on victims whose
   drain starts (after the host-list write, and stamped by the writer as they are sent,
   so a mark never predates the list that dropped them).
6. ``deletes``: victims whose drain is over, retired and failed workers to replace, a
   finished job's pods. The ConfigMap above carries the retired indexes, so a restart
   between these writes and the creates cannot hand a retired name out again.
7. ``creates``: missing workers.
8. ``Role``: exec on the job's workers, new ones only once their creates went through,
   so a name that someone else's pod holds (a create answered 409) is never granted. A
   new worker cannot be listed before this write: it is not running yet, and step 2
   lists only granted workers. Then ``RoleBinding``: a controller without the ``bind``
   verb (ours) may bind only a Role that exists, whose rules it holds itself; the API
   server answers 404 for a RoleBinding to a Role not there yet.
9. ``ranks report``: the ranks ConfigMap's reports removed before a launcher is created,
   so no report of an earlier launcher is read as the new one's, or, while one runs,
   compacted once they are many (ranks.py); then ``launcher``, after its workers exist
   and are granted.
10. ``Workload``: a job labelled for a Kueue queue keeps its Workloads in step
    (kueue_writes.py): the first one created, one waiting in the queue following the job's
    edits, ``PodsReady``, a slice that grows it, one shrunk in place, all of them finished
    with the job, an eviction's admission cleared. After every child, and decided with the
    status this turn writes, so that a job finishing now gives its quota back in this turn;
    quota is only ever given back for pods the caches show gone, never for this turn's
    deletes. Before the status, so that no status says every write went through while a
    Workload write is still to land.
11. ``status`` (or, once runPolicy.ttlSecondsAfterFinished is over, ``job delete``), then
    ``events``.

A turn that claims children (``handover.py``) writes only its ``claims``, then ``events``.
Only drift is written: a settled job yields no writes.

Each step also says which of the writer's lanes its writes take and how many of them one
turn makes (``Step``). A step with more writes than its bound makes the first ones, and
the job comes back at once for the rest. The order above holds across that cut because
of ``relied_on``: a step that the steps below rely on (``notices``: a victim's host-list
write relies on its notice, a stopped job's deletes on theirs) ends the turn with it, so
nothing below it goes out before the last of its writes landed, in a later turn. Only
``pod marks`` lets the turn go on: no step below relies on a drain mark or a rank-holder
label, and ending there would lose the Events of what the ``ConfigMap`` above recorded
(the next turn, seeing it recorded, has nothing to report). The bounds of ``deletes``,
``creates`` and ``claims`` are where their pods are chosen (``POD_WRITES_PER_TURN``,
``CLAIMS_PER_TURN``); a plan never has more (tests/unit/test_write_order.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    Action,
    AnnotatePod,
    Create,
    DeleteObject,
    DeletePod,
    Emit,
    Phase,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.inputs.ranks import compacted
from mpijob_elastic.core.lifecycle.notices import notice_patches
from mpijob_elastic.core.outputs.status import REFUSED, StatusBuilder
from mpijob_elastic.core.outputs.turn import POD_WRITES_PER_TURN
from mpijob_elastic.core.planning.desired import Desired
from mpijob_elastic.core.planning.handover import CLAIMS_PER_TURN
from mpijob_elastic.core.planning.pod_marks import pod_marks, refresh_launcher
from mpijob_elastic.core.queueing.kueue import WORKLOAD
from mpijob_elastic.core.queueing.kueue_writes import workload_writes
from mpijob_elastic.core.reports.conditions import REFUSAL_EVENTS
from mpijob_elastic.core.times import format_time

Obj = dict[str, Any]

# The writer's lanes (docs/design.md, "Write lanes"): each has slots of its own, so a job's
# host-list writes never wait behind other jobs' bulk writes; Events go out in the
# background, a turn does not wait for them.
HOST_LIST = "host list"
BULK = "bulk"
BACKGROUND = "background"


@dataclass(frozen=True)
class Step:
    """One step of the write order: its lane, and how many writes it makes in one turn."""

    name: str
    lane: str
    # At most this many writes a turn; the rest come in the job's next turn, which follows
    # at once. None: one object's writes, bounded already.
    bound: int | None = None
    # Whether the steps below rely on every write of this one, so that a turn whose step
    # was cut at its bound ends with it.
    relied_on: bool = True


# The steps of a plan, in the order they are written (above).
STEPS = (
    Step("claims", BULK, CLAIMS_PER_TURN),
    Step("ServiceAccount", BULK),
    Step("PodDisruptionBudget", BULK),
    Step("notices", HOST_LIST, POD_WRITES_PER_TURN),
    Step("PodGroup", BULK),
    Step("ConfigMap", HOST_LIST),
    Step("ranks ConfigMap", HOST_LIST),
    Step("ConfigMap events", BACKGROUND),
    Step("obsolete", BULK),
    Step("config hash", HOST_LIST),
    Step("pod marks", HOST_LIST, POD_WRITES_PER_TURN, relied_on=False),
    # Victims whose drain is over, workers to replace, and a launcher to restart.
    Step("deletes", BULK, 2 * POD_WRITES_PER_TURN + 1),
    Step("creates", BULK, POD_WRITES_PER_TURN),
    Step("Role", BULK),
    Step("RoleBinding", BULK),
    Step("ranks report", HOST_LIST),
    Step("launcher", BULK),
    Step("Workload", BULK),
    Step("job delete", BULK),
    Step("status", BULK),
    Step("events", BACKGROUND),
)
STEP = {step.name: step for step in STEPS}

# Events of decisions the job's ConfigMap records (opportunistic.py, preemptors.py).
CONFIG_MAP_EVENTS = frozenset({"Grew", "GrowthBackedOff", "Preempted"})

# The keys of each kind that are ours to keep in step; anything else on the object
# (another controller's labels, the server's fields) is left alone.
_OWNED_KEYS = {
    "ServiceAccount": (),
    "Role": ("rules",),
    "RoleBinding": ("subjects", "roleRef"),
    "ConfigMap": ("data",),
    "PodDisruptionBudget": ("spec",),
}


# Annotations that are ours to set and to remove; any other is left as it is.
_OWNED_ANNOTATIONS = names.STATE_ANNOTATIONS


def _ensure(desired: Obj, observed: Mapping[str, Any] | None, keys: Sequence[str]) -> Action | None:
    """Create the object, or replace it if any of ``keys``, our labels or our annotations
    drifted."""
    if observed is None:
        return Create(desired)
    meta = observed["metadata"]
    # Our labels and annotations are merged in; others' are left as they are.
    others = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _OWNED_ANNOTATIONS
    }
    merged = {
        "labels": {**(meta.get("labels") or {}), **desired["metadata"]["labels"]},
        "annotations": {**others, **(desired["metadata"].get("annotations") or {})},
    }
    drifted = any(observed.get(k) != desired.get(k) for k in keys) or any(
        (meta.get(field) or {}) != value for field, value in merged.items()
    )
    if not drifted:
        return None
    updated = {**observed, **{k: desired[k] for k in keys}}
    updated["metadata"] = {**meta, **merged}
    return Replace(updated)


# The PodGroup spec fields the job sets (podgroups.py); the scheduler's defaults for others
# are left as they are.
_POD_GROUP_FIELDS = (
    "minMember",
    "queue",
    "priorityClassName",
    "minResources",
    "scheduleTimeoutSeconds",
)


def _ensure_pod_group(desired: Obj, observed: Mapping[str, Any] | None) -> Action | None:
    """Create the PodGroup, or replace its spec where a field the job sets drifted. Its
    metadata is left alone: the job's annotations are copied on create only, as
    training-operator copies them."""
    if observed is None:
        return Create(desired)
    have = dict(observed.get("spec") or {})
    want = desired["spec"]
    if all(have.get(k) == want.get(k) for k in _POD_GROUP_FIELDS):
        return None
    spec = {k: v for k, v in have.items() if k not in _POD_GROUP_FIELDS} | want
    return Replace({**observed, "spec": spec})


def _observed_object(observed: Observed, kind: str) -> Mapping[str, Any] | None:
    return {
        "ServiceAccount": observed.service_account,
        "Role": observed.role,
        "RoleBinding": observed.role_binding,
        "ConfigMap": observed.config_map,
        "PodDisruptionBudget": observed.disruption_budget,
        "PodGroup": observed.pod_group,
    }[kind]


def _phases(steps: Sequence[tuple[str, Sequence[Action]]]) -> tuple[tuple[Phase, ...], bool, bool]:
    """The steps' phases, each cut at its step's bound; whether a step was cut (the job
    comes back at once for the rest of it), and whether the turn ends with that step (the
    steps below rely on every write of it)."""
    phases: list[Phase] = []
    cut = False
    for name, writes in steps:
        if not writes:
            continue
        bound = STEP[name].bound
        phases.append(Phase(name, tuple(writes[:bound])))
        if bound is not None and len(writes) > bound:
            if STEP[name].relied_on:
                return tuple(phases), True, True
            cut = True
    return tuple(phases), cut, False


def _obsolete(want: Desired, observed: Observed) -> list[Action]:
    """Deletes of the children the job must no longer have."""
    writes: list[Action] = []
    for kind in want.obsolete:
        gone = _observed_object(observed, kind)
        if gone is not None and not gone["metadata"].get("deletionTimestamp"):
            meta = gone["metadata"]
            writes.append(DeleteObject(kind, meta["name"], str(meta.get("uid", ""))))
    return writes


def _ranks_create(want: Desired, observed: Observed) -> list[Action]:
    ranks = want.ranks
    if ranks is None or observed.ranks_report is not None:
        return []
    if ("ConfigMap", ranks["metadata"]["name"]) in observed.conflicts:
        return []
    return [Create(ranks)]


def _ranks_report(want: Desired, observed: Observed) -> list[Action]:
    """A PUT with the resourceVersion seen: a report landing meanwhile makes it 409, and
    the next turn decides again with it."""
    report = observed.ranks_report
    data = report.get("data") if report is not None else None
    if report is None or not isinstance(data, Mapping) or not data:
        return []
    if want.launcher is not None:
        return [Replace({k: v for k, v in report.items() if k != "data"})]
    kept = compacted(data)
    return [] if kept is None else [Replace({**report, "data": kept})]


def _after(writes: list[Action], noticed: set[str]) -> list[Action]:
    """``writes``, those to pods whose notice this turn wrote without a resourceVersion."""
    return [
        replace(w, resource_version="") if isinstance(w, AnnotatePod) and w.name in noticed else w
        for w in writes
    ]


def _workloads(want: Desired, observed: Observed, now: datetime) -> list[Action]:
    """The writes of a queue-labelled job's Workloads, for the job with the status this
    turn writes. A name someone else's object holds is not created again: the job reports
    it and waits (reports.conflicts)."""
    if observed.queue is None:
        return []
    job = {**observed.job, "status": want.status}
    return [
        w
        for w in workload_writes(job, observed.queue, observed.pods, format_time(now))
        if not (
            isinstance(w, Create) and (WORKLOAD, w.obj["metadata"]["name"]) in observed.conflicts
        )
    ]


def diff(want: Desired, observed: Observed, now: datetime) -> Writes:
    def ensure(kind: str) -> list[Action]:
        obj = want.objects.get(kind)
        if obj is None or (kind, obj["metadata"]["name"]) in observed.conflicts:
            return []
        if kind == "PodGroup":
            action = _ensure_pod_group(obj, observed.pod_group)
        else:
            action = _ensure(obj, _observed_object(observed, kind), _OWNED_KEYS[kind])
        return [] if action is None else [action]

    deletes: list[Action] = [
        DeletePod(
            v.worker.name,
            v.worker.uid,
            v.grace_seconds,
            v.worker.pod["metadata"].get("resourceVersion") if v.as_seen else None,
        )
        for v in want.victims
        if v.action == "delete"
    ]
    deletes += [DeletePod(w.name, w.uid) for w in want.deletes]
    notices = (
        []
        if want.notices is None
        else notice_patches(want.notices, observed.pods, observed.deleting)
    )
    noticed = {n.name for n in notices}
    children, cut, ended = _phases(
        [
            ("ServiceAccount", ensure("ServiceAccount")),
            ("PodDisruptionBudget", ensure("PodDisruptionBudget")),
            ("notices", list(notices)),
            ("PodGroup", ensure("PodGroup")),
            ("ConfigMap", ensure("ConfigMap")),
            ("ranks ConfigMap", _ranks_create(want, observed)),
            ("ConfigMap events", [e for e in want.events if e.reason in CONFIG_MAP_EVENTS]),
            ("obsolete", _obsolete(want, observed)),
            ("config hash", _after(refresh_launcher(want, observed), noticed)),
            ("pod marks", _after(pod_marks(want, observed), noticed)),
            ("deletes", deletes),
            ("creates", [Create(pod) for pod in want.new_pods]),
            ("Role", ensure("Role")),
            ("RoleBinding", ensure("RoleBinding")),
            ("ranks report", _ranks_report(want, observed)),
            ("launcher", [] if want.launcher is None else [Create(want.launcher)]),
            ("Workload", _workloads(want, observed, now)),
        ]
    )
    rv = str(observed.job["metadata"].get("resourceVersion", ""))
    changed = want.status != (observed.job.get("status") or {})
    on_refusal: tuple[WriteStatus | Emit, ...] = (
        *([WriteStatus(want.status, rv)] if changed else []),
        *(e for e in want.events if e.reason in REFUSAL_EVENTS),
    )
    requeue = 0.0 if cut else want.requeue_after
    if ended:
        # The steps below rely on the one cut: they come with the rest of it, next turn.
        return Writes(children, requeue, want.probe, on_refusal)
    last = _job_writes(want, observed, now, writing=bool(children))
    return Writes((*children, *last), requeue, want.probe, on_refusal)


def _job_writes(
    want: Desired, observed: Observed, now: datetime, writing: bool
) -> tuple[Phase, ...]:
    """The job's own writes after its children's (``writing``: some of them this turn):
    its delete or its status, then its Events."""
    events = [e for e in want.events if e.reason not in CONFIG_MAP_EVENTS]
    meta = observed.job["metadata"]
    if want.delete_job:
        # runPolicy.ttlSecondsAfterFinished: the garbage collector takes the children; a
        # status written after the delete would only fail (unless the delete is refused).
        delete = DeleteObject(names.KIND, str(meta["name"]), str(meta.get("uid", "")))
        return _phases([("job delete", [delete]), ("events", events)])[0]
    status = want.status
    if not writing and not observed.conflicts:
        # Nothing left to write means every earlier refusal is behind us.
        builder = StatusBuilder({"status": status}, now)
        if builder.clear(REFUSED, "WritesAccepted", "every write of the last sync went through"):
            status = builder.build()
    writes: list[Action] = []
    if status != (observed.job.get("status") or {}):
        writes.append(WriteStatus(status, str(meta.get("resourceVersion", ""))))
    return _phases([("status", writes), ("events", events)])[0]
