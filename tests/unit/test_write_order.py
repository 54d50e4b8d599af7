"""The write order as data: every plan's phases follow the documented order, and each
phase holds only the writes of its step."""

from __future__ import annotations

from collections.abc import Callable

from mpijob_elastic.core import names
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
from mpijob_elastic.core.outputs.turn import POD_WRITES_PER_TURN
from mpijob_elastic.core.planning.write_order import CONFIG_MAP_EVENTS, STEP, STEPS
from tests.unit.simulation import Cluster, discovered, make_job

ELASTIC = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "5", names.ANN_DRAIN_SECONDS: "5"}

# The order write_order.py's docstring states, written out again here: a change to STEPS must
# be a change to the text too.
DOCUMENTED = (
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
    "ranks report",
    "launcher",
    "Workload",
    "job delete",
    "status",
    "events",
)


def _object(kind: str) -> Callable[[Action], bool]:
    return lambda a: isinstance(a, Create | Replace) and a.obj["kind"] == kind


def _ranks(a: Action) -> bool:
    return (
        isinstance(a, Create | Replace)
        and a.obj["kind"] == "ConfigMap"
        and a.obj["metadata"]["name"].endswith("-ranks")
    )


def _annotates(key: str) -> Callable[[Action], bool]:
    return lambda a: isinstance(a, AnnotatePod) and set(a.annotations) == {key}


def _pod_mark(a: Action) -> bool:
    """A drain mark, the rank-holder label, or both, and nothing else."""
    return (
        isinstance(a, AnnotatePod)
        and set(a.annotations) <= {names.ANN_DRAINING_SINCE}
        and a.stamp in (None, names.ANN_DRAINING_SINCE)
        and set(a.labels) <= {names.LABEL_HOLDS_RANKS}
        and bool(a.annotations or a.labels or a.stamp)
    )


def _worker_create(a: Action) -> bool:
    return _object("Pod")(a) and "-worker-" in a.obj["metadata"]["name"]  # type: ignore[union-attr]


# What each step may write.
BELONGS: dict[str, Callable[[Action], bool]] = {
    "claims": lambda a: isinstance(a, Claim),
    "ServiceAccount": _object("ServiceAccount"),
    "PodDisruptionBudget": _object("PodDisruptionBudget"),
    "notices": _annotates(names.ANN_NOTICE),
    "PodGroup": _object("PodGroup"),
    "ConfigMap": lambda a: _object("ConfigMap")(a) and not _ranks(a),
    "ranks ConfigMap": lambda a: isinstance(a, Create) and _ranks(a),
    "ConfigMap events": lambda a: isinstance(a, Emit) and a.reason in CONFIG_MAP_EVENTS,
    "obsolete": lambda a: (
        isinstance(a, DeleteObject) and a.kind in ("PodDisruptionBudget", "PodGroup")
    ),
    "config hash": _annotates(names.ANN_CONFIG_HASH),
    "pod marks": _pod_mark,
    "deletes": lambda a: isinstance(a, DeletePod),
    "creates": _worker_create,
    "Role": _object("Role"),
    "RoleBinding": _object("RoleBinding"),
    "ranks report": lambda a: isinstance(a, Replace) and _ranks(a),
    "launcher": lambda a: _object("Pod")(a) and not _worker_create(a),
    "Workload": lambda a: (
        (isinstance(a, Create | Replace | PatchStatus) and a.obj["kind"] == "Workload")
        or (isinstance(a, DeleteObject) and a.kind == "Workload")
    ),
    "job delete": lambda a: isinstance(a, DeleteObject) and a.kind == names.KIND,
    "status": lambda a: isinstance(a, WriteStatus),
    "events": lambda a: isinstance(a, Emit),
}


class _Recorded(Cluster):
    """A cluster that checks and keeps every plan it applies."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.plans: list[Writes] = []

    def apply(self, p: Writes) -> None:
        check(p)
        self.plans.append(p)
        super().apply(p)


def check(p: Writes) -> None:
    steps = [phase.step for phase in p.phases]
    assert steps == sorted(steps, key=DOCUMENTED.index), steps
    assert len(set(steps)) == len(steps), steps
    for phase in p.phases:
        assert phase.writes, phase
        assert len(phase.writes) <= (STEP[phase.step].bound or len(phase.writes)), phase.step
        strays = [a for a in phase.writes if not BELONGS[phase.step](a)]
        assert not strays, (phase.step, strays)


def test_steps_are_the_documented_order() -> None:
    assert tuple(step.name for step in STEPS) == DOCUMENTED


def test_every_plan_of_a_job_s_life_follows_the_order() -> None:
    c = _Recorded(make_job(2, annotations=dict(ELASTIC)))
    c.converge()
    first = [phase.step for phase in c.plans[0].phases]
    assert first == [
        "ServiceAccount",
        "PodDisruptionBudget",
        "ConfigMap",
        "ranks ConfigMap",
        "creates",
        "Role",
        "RoleBinding",
        "status",
        "events",
    ]
    # Scaling down: the victim's notice, the host list, then the launcher's refresh, then
    # the victim's mark, each its own phase.
    c.set_replicas(1)
    shrink = c.plan()
    steps = [phase.step for phase in shrink.phases]
    assert steps[:4] == ["notices", "ConfigMap", "config hash", "pod marks"], steps
    (notice,) = shrink.phases[0].writes
    assert isinstance(notice, AnnotatePod)
    assert notice.name == "job-worker-1"
    assert str(notice.annotations[names.ANN_NOTICE]).startswith("worker-leaving ")
    # The mark on the pod the notice just patched carries no resourceVersion.
    (mark,) = shrink.phases[3].writes
    assert isinstance(mark, AnnotatePod)
    assert mark.resource_version == ""
    c.apply(shrink)
    c.converge()
    seen = {phase.step for p in c.plans for phase in p.phases}
    assert {"notices", "launcher", "deletes", "config hash", "pod marks"} <= seen


def test_the_notice_of_a_pod_being_taken_is_patched_unconditionally() -> None:
    """Its deletion rewrites the pod under us: a conditional patch met it with 409 and
    stopped the turn (and the pod was gone before the next one)."""
    c = _Recorded(make_job(3, annotations=dict(ELASTIC)))
    c.converge()
    pod = next(p for p in c.pods if p["metadata"]["name"] == "job-worker-2")
    pod["status"].setdefault("conditions", []).append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    notices = [ph for ph in c.plan().phases if ph.step == "notices"]
    (notice,) = notices[0].writes
    assert isinstance(notice, AnnotatePod)
    assert notice.name == "job-worker-2"
    assert str(notice.annotations[names.ANN_NOTICE]).startswith("worker-leaving ")
    assert notice.resource_version == ""
    # A pod nothing is taking keeps the condition on its patch (the scale-in above).
    c.set_replicas(2)
    pod["status"]["conditions"].pop()
    (plain,) = next(ph for ph in c.plan().phases if ph.step == "notices").writes
    assert isinstance(plain, AnnotatePod)
    assert plain.resource_version != ""


def _large_job() -> _Recorded:
    c = _Recorded(
        make_job(
            POD_WRITES_PER_TURN + 30,
            annotations=dict(ELASTIC, **{names.ANN_MAX_REPLICAS: str(POD_WRITES_PER_TURN + 30)}),
        )
    )
    c.converge()
    return c


def test_notices_over_the_bound_end_the_turn_and_the_host_list_waits_for_the_rest() -> None:
    """Every step below the notices may rely on them (a victim reads its notice before the
    host list drops it): a turn with more than the bound writes that many, and nothing
    else, and comes back at once."""
    c = _large_job()
    hosts = discovered(c.get("ConfigMap", "job-config"))
    c.set_replicas(10)
    first = c.plan()
    assert [phase.step for phase in first.phases] == ["notices"]
    assert len(first.phases[0].writes) == POD_WRITES_PER_TURN
    assert first.requeue_after == 0
    c.apply(first)
    assert discovered(c.get("ConfigMap", "job-config")) == hosts
    second = c.plan()
    steps = [phase.step for phase in second.phases]
    assert steps[:2] == ["notices", "ConfigMap"], steps
    assert len(second.phases[0].writes) == 120 - POD_WRITES_PER_TURN
    c.apply(second)
    noticed = {
        p["metadata"]["name"]
        for p in c.pods
        if names.ANN_NOTICE in (p["metadata"].get("annotations") or {})
    }
    dropped = set(hosts) - set(discovered(c.get("ConfigMap", "job-config")))
    assert dropped
    assert dropped <= noticed


def test_rank_holder_labels_over_the_bound_go_over_two_turns() -> None:
    """Nothing below relies on a label: the turn goes on past them, and comes back at once
    for the rest."""
    c = _large_job()
    labelled = [
        p
        for p in c.world.workers()
        if (p["metadata"].get("labels") or {}).get(names.LABEL_HOLDS_RANKS)
    ]
    assert len(labelled) > POD_WRITES_PER_TURN
    for pod in labelled:
        del pod["metadata"]["labels"][names.LABEL_HOLDS_RANKS]
    c.world.fail("job-worker-3")
    first = c.plan()
    marks = next(phase for phase in first.phases if phase.step == "pod marks")
    assert len(marks.writes) == POD_WRITES_PER_TURN
    assert first.requeue_after == 0
    # The steps after it still go out: the job's status (the failed worker).
    steps = [phase.step for phase in first.phases]
    assert "status" in steps[steps.index("pod marks") :], steps
    c.apply(first)
    second = c.plan()
    rest = next(phase for phase in second.phases if phase.step == "pod marks")
    assert len(rest.writes) == len(labelled) - 1 - POD_WRITES_PER_TURN
