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
   drain starts (after the host-list write, so a mark never predates the list that
   dropped them).
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
9. ``ranks emptied``: the ranks ConfigMap's reports removed, so no report of an earlier
   launcher is read as the new one's (ranks.py); then ``launcher``, after its workers
   exist and are granted.
10. ``status`` (or, once runPolicy.ttlSecondsAfterFinished is over, ``job delete``), then
    ``events``.

A turn that claims children (``handover.py``) writes only its ``claims``, then ``events``.
Only drift is written: a settled job yields no writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
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
from mpijob_elastic.core.lifecycle.notices import notice_patches
from mpijob_elastic.core.outputs.status import REFUSED, StatusBuilder
from mpijob_elastic.core.planning.desired import Desired
from mpijob_elastic.core.reports.conditions import REFUSAL_EVENTS
from mpijob_elastic.core.times import format_precise_time

Obj = dict[str, Any]

# The phases of a plan, in the order they are written (above).
STEPS = (
    "claims",
    "ServiceAccount",
    "PodDisruptionBudget",
    "notices",
    "PodGroup",
    "ConfigMap",
    "ranks ConfigMap",
    "ConfigMap events",
    "obsolete",
    "config hash",
    "pod marks",
    "deletes",
    "creates",
    "Role",
    "RoleBinding",
    "ranks emptied",
    "launcher",
    "job delete",
    "status",
    "events",
)

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


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _phases(steps: Sequence[tuple[str, Sequence[Action]]]) -> tuple[Phase, ...]:
    return tuple(Phase(step, tuple(writes)) for step, writes in steps if writes)


def _holder_labels(want: Desired, observed: Observed) -> dict[str, dict[str, str | None]]:
    """The rank-holder label to set or remove, per worker whose label is not as wanted
    (the PodDisruptionBudget counts only labelled workers). Terminating pods are left
    alone: the budget does not count them anyway."""
    if not want.objects:
        return {}  # frozen or finished: nothing of the job's children changes
    changes: dict[str, dict[str, str | None]] = {}
    going = {w.uid for w in want.deletes} | {
        v.worker.uid for v in want.victims if v.action == "delete"
    }
    for pod in observed.pods:
        meta = pod["metadata"]
        name = meta["name"]
        if (
            meta.get("deletionTimestamp")
            or meta.get("uid") in observed.deleting
            or meta.get("uid") in going
            or (meta.get("labels") or {}).get(names.LABEL_ROLE) != names.ROLE_WORKER
        ):
            continue
        has = (meta.get("labels") or {}).get(names.LABEL_HOLDS_RANKS) == "true"
        if has != (name in want.rank_holders):
            changes[name] = {names.LABEL_HOLDS_RANKS: "true" if not has else None}
    return changes


def _obsolete(want: Desired, observed: Observed) -> list[Action]:
    """Deletes of the children the job must no longer have."""
    writes: list[Action] = []
    for kind in want.obsolete:
        gone = _observed_object(observed, kind)
        if gone is not None and not gone["metadata"].get("deletionTimestamp"):
            meta = gone["metadata"]
            writes.append(DeleteObject(kind, meta["name"], str(meta.get("uid", ""))))
    return writes


def _refresh_launcher(want: Desired, observed: Observed) -> list[Action]:
    """The launcher's config-hash annotation, when its host lists changed: the annotation
    change makes its mounted files refresh in well under a second (ranks.py)."""
    job_name = str(observed.job["metadata"]["name"])
    launcher = next(
        (
            p
            for p in observed.pods
            if p["metadata"]["name"] == names.launcher_name(job_name)
            and not p["metadata"].get("deletionTimestamp")
        ),
        None,
    )
    if launcher is None or want.config_hash is None:
        return []
    current = (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)
    if current == want.config_hash:
        return []
    return [
        AnnotatePod(
            launcher["metadata"]["name"],
            {names.ANN_CONFIG_HASH: want.config_hash},
            _resource_version(launcher),
        )
    ]


def _ranks_create(want: Desired, observed: Observed) -> list[Action]:
    ranks = want.ranks
    if ranks is None or observed.ranks_report is not None:
        return []
    if ("ConfigMap", ranks["metadata"]["name"]) in observed.conflicts:
        return []
    return [Create(ranks)]


def _ranks_emptied(want: Desired, observed: Observed) -> list[Action]:
    report = observed.ranks_report
    if want.launcher is None or report is None or not report.get("data"):
        return []
    return [Replace({k: v for k, v in report.items() if k != "data"})]


def _after(writes: list[Action], noticed: set[str]) -> list[Action]:
    """``writes``, those to pods whose notice this turn wrote without a resourceVersion."""
    return [
        replace(w, resource_version="") if isinstance(w, AnnotatePod) and w.name in noticed else w
        for w in writes
    ]


def _pod_marks(want: Desired, observed: Observed, now: datetime) -> list[Action]:
    """The workers' drain marks to set or clear, and their rank-holder labels (in the
    same patch where a worker gets both)."""
    labels = _holder_labels(want, observed)
    writes: list[Action] = []
    for w in want.workers:
        if w.marked and not w.terminating:
            writes.append(
                AnnotatePod(
                    w.name,
                    {names.ANN_DRAINING_SINCE: None},
                    _resource_version(w.pod),
                    labels.pop(w.name, {}),
                )
            )
    mark = format_precise_time(now)
    for v in want.victims:
        if v.action == "mark":
            writes.append(
                AnnotatePod(
                    v.worker.name,
                    {names.ANN_DRAINING_SINCE: mark},
                    _resource_version(v.worker.pod),
                    labels.pop(v.worker.name, {}),
                )
            )
    pods = {p["metadata"]["name"]: p for p in observed.pods}
    return writes + [
        AnnotatePod(name, {}, _resource_version(pods[name]), change)
        for name, change in sorted(labels.items())
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
    children = _phases(
        [
            ("ServiceAccount", ensure("ServiceAccount")),
            ("PodDisruptionBudget", ensure("PodDisruptionBudget")),
            ("notices", list(notices)),
            ("PodGroup", ensure("PodGroup")),
            ("ConfigMap", ensure("ConfigMap")),
            ("ranks ConfigMap", _ranks_create(want, observed)),
            ("ConfigMap events", [e for e in want.events if e.reason in CONFIG_MAP_EVENTS]),
            ("obsolete", _obsolete(want, observed)),
            ("config hash", _after(_refresh_launcher(want, observed), noticed)),
            ("pod marks", _after(_pod_marks(want, observed, now), noticed)),
            ("deletes", deletes),
            ("creates", [Create(pod) for pod in want.new_pods]),
            ("Role", ensure("Role")),
            ("RoleBinding", ensure("RoleBinding")),
            ("ranks emptied", _ranks_emptied(want, observed)),
            ("launcher", [] if want.launcher is None else [Create(want.launcher)]),
        ]
    )
    events = [e for e in want.events if e.reason not in CONFIG_MAP_EVENTS]
    rv = str(observed.job["metadata"].get("resourceVersion", ""))
    changed = want.status != (observed.job.get("status") or {})
    on_refusal: tuple[WriteStatus | Emit, ...] = (
        *([WriteStatus(want.status, rv)] if changed else []),
        *(e for e in want.events if e.reason in REFUSAL_EVENTS),
    )
    if want.delete_job:
        # runPolicy.ttlSecondsAfterFinished: the garbage collector takes the children; a
        # status written after the delete would only fail (unless the delete is refused).
        meta = observed.job["metadata"]
        delete = DeleteObject(names.KIND, str(meta["name"]), str(meta.get("uid", "")))
        last = _phases([("job delete", [delete]), ("events", events)])
        return Writes((*children, *last), want.requeue_after, want.probe, on_refusal)
    status = want.status
    if not children and not observed.conflicts:
        # Nothing left to write means every earlier refusal is behind us.
        builder = StatusBuilder({"status": status}, now)
        if builder.clear(REFUSED, "WritesAccepted", "every write of the last sync went through"):
            status = builder.build()
    writes: list[Action] = []
    if status != (observed.job.get("status") or {}):
        writes.append(WriteStatus(status, rv))
    last = _phases([("status", writes), ("events", events)])
    return Writes((*children, *last), want.requeue_after, want.probe, on_refusal)
