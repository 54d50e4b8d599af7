"""Elastic by capacity (issue 21): an opportunistic job grows above its Worker replicas into
room the scheduler has, backs off when it has none, gives workers back to preemption and
to a hungry peer (core/sizing/opportunistic.py, docs/capacity.md)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import DeletePod
from mpijob_elastic.core.hosts.membership import Facts, choose_members
from mpijob_elastic.core.inputs.growth_state import GrowthState, Share, parse_growth, share
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.inputs.ranks import RankSnapshot
from mpijob_elastic.core.objects.render import disruption_budget
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.sizing.opportunistic import next_backoff
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.core.workers import Worker
from mpijob_elastic.machinery.kube import ApiError
from tests.unit.simulation import Cluster, discovered, make_job, running_status
from tests.unit.test_kueue import workload

SETTINGS = Settings()
UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        }
    ],
}


def job(replicas: int = 2, maximum: str = "8", grows: bool = True) -> Cluster:
    annotations = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: maximum}
    if grows:
        annotations[names.ANN_OPPORTUNISTIC] = "true"
    return Cluster(make_job(replicas, annotations=annotations))


def workers(c: Cluster) -> list[dict[str, Any]]:
    return [p for p in c.world.workers(c.name) if not p["metadata"].get("deletionTimestamp")]


def opportunistic(c: Cluster) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in workers(c)
        if p["metadata"]["labels"].get(names.LABEL_OPPORTUNISTIC) == "true"
    )


def schedule(c: Cluster, room: int) -> None:
    """A scheduler with room for ``room`` workers (and the launcher): Pending pods run in
    the order they came while there is room, the rest are unschedulable."""
    c.world.start(names.launcher_name(c.name))
    running = sum(1 for p in workers(c) if p["status"].get("phase") == "Running")
    for pod in sorted(workers(c), key=lambda p: p["metadata"]["name"]):
        if pod["status"].get("phase") != "Pending":
            continue
        if running < room:
            c.world.start(pod["metadata"]["name"])
            running += 1
        elif not pod["status"].get("conditions"):
            c.world._put({**copy.deepcopy(pod), "status": copy.deepcopy(UNSCHEDULABLE)})


def turn(c: Cluster, room: int, *, grace: bool = False, **seen: Any) -> float:
    """One turn of the job against a cluster with ``room``; the requeue it asked for.
    ``grace``: terminating pods stay (their grace period is not over)."""
    schedule(c, room)
    if not grace:
        c.finalize_deletions()
    observed = dataclasses.replace(c.observed(), **seen)
    p = plan_writes(observed, SETTINGS, c.now)
    c.apply(p)
    if p.probe is not None:
        c.ranks = RankSnapshot(c.now, c.world.rank_hosts(c.name))
    return p.requeue_after if p.requeue_after is not None else 60.0


def run(c: Cluster, room: int, seconds: float, **seen: Any) -> None:
    end = c.now + timedelta(seconds=seconds)
    while c.now < end:
        c.tick(min(max(turn(c, room, **seen), 0.2), 5.0))


def events(c: Cluster, reason: str) -> list[str]:
    return [e.message for e in c.events if e.reason == reason]


def growth(c: Cluster) -> GrowthState:
    cm = c.get("ConfigMap", "job-config") or {}
    return parse_growth((cm["metadata"].get("annotations") or {}).get(names.ANN_GROWTH))


def test_the_growth_state_round_trips_and_its_backoff_doubles_up_to_the_cap() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = next_backoff(GrowthState(3), now, 300, "Unschedulable: no GPU")
    assert (first.attempts, first.retry_at) == (1, now + timedelta(seconds=10))
    assert parse_growth(first.format()) == first
    fifth = first
    for _ in range(4):
        fifth = next_backoff(fifth, now, 300, "x")
    assert fifth.retry_at == now + timedelta(seconds=160)
    assert next_backoff(fifth, now, 300, "x").retry_at == now + timedelta(seconds=300)
    assert parse_growth("junk") == GrowthState()
    assert GrowthState().format() == ""
    cm = {"metadata": {"annotations": {names.ANN_GROWTH: first.format()}}}
    assert share("ns/a", cm) == Share("ns/a", 3, now)
    assert share("ns/a", {"metadata": {}}) is None


def test_a_job_grows_into_idle_capacity_a_few_workers_a_turn() -> None:
    c = job()
    sizes = []
    for _ in range(40):
        c.tick(min(max(turn(c, 8), 0.2), 5.0))
        sizes.append(len(workers(c)))
    # The baseline first, then steps of at most two.
    steps = [b - a for a, b in itertools.pairwise(sizes) if b > a]
    assert sizes[0] == 2
    assert steps
    assert max(steps) <= 2, sizes
    assert len(workers(c)) == 8
    assert opportunistic(c) == [f"job-worker-{i}" for i in range(2, 8)]
    for pod in workers(c):
        opp = pod["metadata"]["labels"].get(names.LABEL_OPPORTUNISTIC) == "true"
        assert (
            pod["spec"].get("priorityClassName") == SETTINGS.opportunistic_priority_class
        ) == opp
    grew = events(c, "Grew")
    assert grew
    assert all("into idle capacity" in m for m in grew)
    assert sum(int(m.split()[0][1:]) for m in grew) == 6
    elastic = c.job["status"]["elastic"]
    assert (elastic["baseline"], elastic["opportunistic"], elastic["listed"]) == (2, 6, 8)


def bind(c: Cluster, name: str) -> None:
    """The scheduler binds the pod; its containers have not started (phase Pending)."""
    pod = copy.deepcopy(c.objects[("Pod", name)])
    pod["spec"]["nodeName"] = "node-a"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    c.world._put(pod)


def unplaced(c: Cluster) -> list[str]:
    return [n for n in opportunistic(c) if not c.objects[("Pod", n)]["spec"].get("nodeName")]


def test_the_next_step_comes_once_the_last_is_bound_and_doubles_what_the_job_holds() -> None:
    c = job(maximum="16")
    run(c, 2, 40)  # the baseline runs; the first probes are refused
    assert growth(c).attempts >= 1
    c.tick(1)
    steps = []
    for _ in range(8):
        # No scheduler here: the job's own turns, between the scheduler's answers.
        observed = dataclasses.replace(c.observed(), capacity_changed=c.now)
        c.apply(plan_writes(observed, SETTINGS, c.now))
        new = unplaced(c)
        steps.append(len(new))
        c.tick(0.5)
        c.apply(plan_writes(c.observed(), SETTINGS, c.now))
        # Not placed yet: the probe has not answered, no more workers.
        assert unplaced(c) == new
        for name in new:
            bind(c, name)
        c.tick(0.5)
    # After the refusals a probe of one, then double what the job holds (at least 2), up to
    # the room left; none of the pods has started: each step came once the last was bound.
    assert steps == [1, 2, 3, 6, 2, 0, 0, 0], steps
    assert len(opportunistic(c)) == 14
    assert all(c.objects[("Pod", n)]["status"]["phase"] == "Pending" for n in opportunistic(c))
    assert growth(c).attempts == 0


def test_an_overshoot_refuses_at_most_what_the_job_holds() -> None:
    c = job(maximum="16")
    run(c, 7, 60)
    # 2, 2, then 4 of which 1 fits and 3 are refused: deleted at once, and the backoff.
    assert sum(1 for p in workers(c) if p["status"]["phase"] == "Running") == 7
    backed_off = events(c, "GrowthBackedOff")
    assert backed_off[0].count("job-worker-") == 3, backed_off[0]


def listed(c: Cluster) -> list[str]:
    return discovered(c.get("ConfigMap", "job-config"))


def stamped_turn(c: Cluster, room: int, **seen: Any) -> float:
    """A turn in which the pods the scheduler starts carry their start time, as a
    kubelet reports it (the simulation's pods carry none: taken as running for long)."""
    schedule(c, room)
    for pod in workers(c):
        name = pod["metadata"]["name"]
        if pod["status"].get("phase") == "Running" and name not in listed(c):
            pod = copy.deepcopy(pod)
            for status in pod["status"]["containerStatuses"]:
                running = status["state"]["running"]
                running.setdefault("startedAt", format_precise_time(c.now))
            c.world._put(pod)
    return turn(c, room, **seen)


def test_a_growth_step_enters_the_host_list_together() -> None:
    c = job()
    run(c, 5, 40)  # 3 opportunistic workers listed, the next probe refused
    assert len(listed(c)) == 5
    c.tick(1)
    stamped_turn(c, 8, capacity_changed=c.now)  # a node added: a probe of one
    assert len(workers(c)) == 6
    c.tick(0.3)
    # The probe runs and the next step is created: the probe waits for it.
    stamped_turn(c, 8)
    assert len(workers(c)) == 8
    assert len(listed(c)) == 5
    c.tick(0.3)
    stamped_turn(c, 8)  # the step runs: the three enter the list in one change
    assert len(listed(c)) == 8
    assert events(c, "Grew")[-1].startswith("+3 into idle capacity")


def test_a_growth_step_waits_for_the_exec_grant_of_its_siblings() -> None:
    # The Role that grants the step's exec arrives through its own watch: the turn that
    # sees the step running may see the Role before the grant (seen in bench-capacity,
    # where the probe entered the list alone and rule 1 held the others 5 s).
    c = job()
    run(c, 5, 40)
    c.tick(1)
    stamped_turn(c, 8, capacity_changed=c.now)  # the probe
    before = copy.deepcopy(c.get("Role", "job-launcher"))
    c.tick(0.3)
    stamped_turn(c, 8)  # the probe runs, the next step is created
    assert len(workers(c)) == 8
    c.tick(0.3)
    # The step runs; its grant not seen yet. The host list goes out before the Role's
    # write, which the stale view makes a conflict that ends the turn.
    with pytest.raises(ApiError, match="409"):
        stamped_turn(c, 8, role=before)
    assert len(listed(c)) == 5
    c.tick(0.3)
    stamped_turn(c, 8)
    assert len(listed(c)) == 8
    assert events(c, "Grew")[-1].startswith("+3 into idle capacity")


def test_a_worker_waits_for_a_slow_step_no_longer_than_the_commit_hold() -> None:
    c = job()
    run(c, 5, 40)
    c.tick(1)
    stamped_turn(c, 8, capacity_changed=c.now)
    c.tick(0.3)
    stamped_turn(c, 6)  # the probe runs, the next step is created
    started = c.now
    new = [n for n in opportunistic(c) if n not in listed(c)]
    assert len(new) == 3
    for name in new[1:]:
        bind(c, name)  # placed, their containers slow to start
    waited = []
    for _ in range(12):
        c.tick(0.5)
        waited.append(min(stamped_turn(c, 6), 60.0))
        if len(listed(c)) > 5:
            break
    # Listed alone once it has waited as long as rule 2 would have held the list after
    # it; meanwhile the job came back for it (a requeue), not on a timer.
    assert len(listed(c)) == 6
    assert timedelta(seconds=5) <= c.now - started <= timedelta(seconds=5.5)
    assert all(0 < w <= 5 for w in waited[:-1]), waited


def test_an_unschedulable_probe_is_deleted_at_once_and_growth_backs_off() -> None:
    c = job()
    run(c, 5, 40)
    assert len(workers(c)) == 5
    backed_off = events(c, "GrowthBackedOff")
    assert "Insufficient nvidia.com/gpu" in backed_off[0]
    assert "(attempt 1)" in backed_off[0]
    state = growth(c)
    assert (state.workers, state.attempts) == (3, len(backed_off))
    # Each probe after the pause (10 s, 20 s, 40 s, ...) adds one worker, refused again.
    run(c, 5, 150)
    state = growth(c)
    assert state.attempts == len(events(c, "GrowthBackedOff")) > len(backed_off)
    assert state.since is not None
    assert state.retry_at is not None
    assert state.retry_at - state.since == timedelta(seconds=10 * 2 ** (state.attempts - 1))
    # No Pending pod stays: each probe is deleted as the scheduler refuses it.
    assert all(p["status"].get("phase") == "Running" for p in workers(c))


def test_a_probe_bound_after_the_turn_saw_it_refused_is_kept() -> None:
    # The scheduler refuses a probe on a node not Ready yet, then binds it once the node
    # is: a delete planned from the refusal must not land on the bound pod.
    c = job()
    run(c, 2, 30)
    c.tick(11)
    turn(c, 2, capacity_changed=c.now)
    (probe,) = [
        n for n in opportunistic(c) if c.objects[("Pod", n)]["status"]["phase"] == "Pending"
    ]
    schedule(c, 2)  # the scheduler's refusal
    p = plan_writes(c.observed(), SETTINGS, c.now)
    assert probe in {a.name for a in p.of_type(DeletePod)}
    bind(c, probe)
    # Refused: the view was stale, the turn ends and is planned again.
    with pytest.raises(ApiError, match="409"):
        c.apply(p)
    pod = c.objects[("Pod", probe)]
    assert not pod["metadata"].get("deletionTimestamp"), "the bound probe was deleted"
    # The next turn sees it bound: it stays, an answered probe.
    c.apply(plan_writes(c.observed(), SETTINGS, c.now))
    assert not c.objects[("Pod", probe)]["metadata"].get("deletionTimestamp")


def test_a_capacity_change_ends_the_pause_and_a_probe_that_runs_ends_the_backoff() -> None:
    c = job()
    run(c, 5, 40)
    assert growth(c).attempts >= 1
    since = growth(c).since
    assert since is not None
    c.tick(1)
    # A node added: the pause is over at once, the job probes with one worker.
    turn(c, 7, capacity_changed=c.now)
    run(c, 7, 3, capacity_changed=c.now - timedelta(seconds=0.5))
    assert len(workers(c)) >= 6
    assert growth(c).attempts == 0
    run(c, 7, 60)
    assert len(workers(c)) == 7


def preempt(c: Cluster, *victims: str) -> dict[str, str]:
    """The scheduler's condition on the victims (its delete follows); their UIDs by name."""
    uids = {}
    for name in victims:
        pod = copy.deepcopy(c.objects[("Pod", name)])
        pod["status"]["conditions"] = [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": "default-scheduler: preempting to accommodate a higher priority pod",
                "lastTransitionTime": format_precise_time(c.now),
            }
        ]
        c.world._put(pod)
        uids[name] = pod["metadata"]["uid"]
    return uids


def test_preempted_workers_leave_gracefully_and_growth_backs_off() -> None:
    c = job()
    run(c, 8, 60)
    assert len(workers(c)) == 8
    # The scheduler preempts two opportunistic workers for a pod of higher priority: the
    # condition first, then the delete with the pod's grace period.
    victims = ("job-worker-6", "job-worker-7")
    uids = sorted(c.objects[("Pod", name)]["metadata"]["uid"] for name in victims)
    preempt(c, victims[0])
    c.tick(1)
    turn(c, 6)
    # The second victim's condition comes a moment later, in the same second.
    pod = copy.deepcopy(c.objects[("Pod", victims[1])])
    pod["status"]["conditions"] = copy.deepcopy(
        c.objects[("Pod", victims[0])]["status"]["conditions"]
    )
    c.world._put(pod)
    c.tick(0.2)
    turn(c, 6)
    for name in victims:
        pod = copy.deepcopy(c.objects[("Pod", name)])
        pod["metadata"]["deletionTimestamp"] = format_precise_time(c.now)
        c.world._put(pod)
    # Within their grace period the job unlists them; then they are gone.
    for _ in range(3):
        turn(c, 6, grace=True)
        c.tick(0.5)
    run(c, 6, 5)
    preempted = events(c, "Preempted")
    assert len(preempted) == 2, preempted
    assert "workers job-worker-6 preempted by the scheduler" in preempted[0]
    assert "workers job-worker-7 preempted by the scheduler" in preempted[1]
    # One wave, one step of the backoff, each victim named once.
    assert growth(c).attempts == 1
    assert growth(c).why.startswith(f"preempted {','.join(uids)}: ")
    assert not c.world.blacklisted.get(c.name)
    # It does not grow back into the room before the backoff is over.
    assert len(workers(c)) == 6
    run(c, 8, 60)
    assert len(workers(c)) == 8


def test_victims_gone_before_a_turn_saw_them_preempted_are_counted_from_their_last_state() -> None:
    """KWOK deletes a preempted pod at once: the turn after the preemption finds the
    victims gone, their last states only in the delete events (``Observed.gone``). Seen
    without it in CI: no Preempted Event, and the job grew back into the room at once."""
    c = job()
    run(c, 8, 60)
    victims = ("job-worker-6", "job-worker-7")
    preempt(c, *victims)
    last = [copy.deepcopy(c.objects[("Pod", name)]) for name in victims]
    for name in victims:
        c.world.vanish_now(name)
    c.tick(1)
    turn(c, 8, gone=last)
    (preempted,) = events(c, "Preempted")
    assert "workers job-worker-6, job-worker-7 preempted by the scheduler" in preempted
    assert growth(c).attempts == 1
    # Seen again in the next turns (the memory lasts a minute), each victim counts once.
    run(c, 8, 5, gone=last)
    assert len(events(c, "Preempted")) == 1
    assert growth(c).attempts == 1
    assert len(workers(c)) == 6, "it grew back into the room before its backoff ended"


def baseline(c: Cluster) -> list[str]:
    return sorted(set(n["metadata"]["name"] for n in workers(c)) - set(opportunistic(c)))


def lose_the_baseline(grows: bool) -> Cluster:
    """A job at 4 (2 of them opportunistic when it grows) whose node took its 2 baseline
    workers with it; its turn's creates, not yet placed by the scheduler."""
    c = job(maximum="4", grows=grows)
    c.set_replicas(2 if grows else 4)
    run(c, 4, 60)
    assert len(workers(c)) == 4
    assert opportunistic(c) == (["job-worker-2", "job-worker-3"] if grows else [])
    for name in ("job-worker-0", "job-worker-1"):
        c.world.vanish_now(name)
    c.apply(plan_writes(c.observed(), SETTINGS, c.now))
    return c


def test_missing_baseline_workers_come_one_at_a_time_while_the_job_holds_opportunistic_ones() -> (
    None
):
    # Each would preempt one of the job's own opportunistic workers: together they could
    # take the last rank-holder (docs/capacity.md).
    c = lose_the_baseline(grows=True)
    first = baseline(c)
    assert len(first) == 1, first
    c.tick(0.5)
    c.apply(plan_writes(c.observed(), SETTINGS, c.now))
    assert baseline(c) == first  # not placed yet: the next waits
    bind(c, first[0])
    c.tick(0.5)
    c.apply(plan_writes(c.observed(), SETTINGS, c.now))
    assert len(baseline(c)) == 2, baseline(c)
    for name in baseline(c):
        assert "priorityClassName" not in c.objects[("Pod", name)]["spec"]
    # A job with no opportunistic worker has no own worker to preempt: both at once.
    assert len(baseline(lose_the_baseline(grows=False))) == 4


def test_a_job_without_the_annotation_does_not_grow() -> None:
    c = job(grows=False)
    run(c, 8, 60)
    assert len(workers(c)) == 2
    assert opportunistic(c) == []
    assert "opportunistic" not in c.job["status"]["elastic"]
    cm = c.get("ConfigMap", "job-config") or {}
    assert names.ANN_GROWTH not in (cm["metadata"].get("annotations") or {})


def test_turning_growth_off_withdraws_the_opportunistic_workers_gracefully() -> None:
    c = job()
    run(c, 8, 60)
    c.job["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "false"
    run(c, 8, 90)
    assert len(workers(c)) == 2
    assert opportunistic(c) == []
    assert not c.world.blacklisted.get(c.name)


def fair(c: Cluster, hungry: Share, changed: datetime) -> datetime:
    """Turns beside a hungry peer; a pod of the job that goes is a capacity change."""
    count = len(workers(c))
    for _ in range(40):
        c.tick(min(max(turn(c, 8, fleet=[hungry], capacity_changed=changed), 0.2), 5.0))
        if len(workers(c)) < count:
            count, changed = len(workers(c)), c.now
    return changed


def test_a_hungry_peer_with_two_fewer_gets_one_worker_back() -> None:
    c = job()
    run(c, 8, 60)
    hungry = Share("ns/other", 0, c.now)
    changed = fair(c, hungry, c.now - timedelta(seconds=5))
    assert len(events(c, "FairShare")) == 1
    # One at a time: its peer has not tried the room freed by the last one yet.
    assert len(workers(c)) == 7
    assert len(opportunistic(c)) == 5
    assert not c.world.blacklisted.get(c.name)
    # The peer tried and failed again, still with two fewer: one more.
    c.tick(1)
    fair(c, Share("ns/other", 1, c.now), changed)
    assert len(opportunistic(c)) == 4
    assert len(events(c, "FairShare")) == 2


def test_no_yield_to_a_peer_within_one_nor_to_one_that_has_not_tried_the_room() -> None:
    c = job()
    run(c, 8, 60)
    stale = Share("ns/other", 0, c.now - timedelta(seconds=10))
    run(c, 8, 20, fleet=[stale], capacity_changed=c.now - timedelta(seconds=5))
    close = Share("ns/other", 5, c.now)
    run(c, 8, 20, fleet=[close], capacity_changed=c.now - timedelta(seconds=5))
    assert len(workers(c)) == 8
    assert not events(c, "FairShare")


def test_no_growth_while_a_hungry_peer_holds_fewer() -> None:
    c = job()
    run(c, 4, 30)
    assert growth(c).workers == 2
    peer = Share("ns/other", 1, c.now - timedelta(hours=1))
    # A probe already asked for may still run; no more after it.
    run(c, 8, 2, fleet=[peer], capacity_changed=c.now)
    have = len(opportunistic(c))
    run(c, 8, 60, fleet=[peer], capacity_changed=c.now)
    assert len(opportunistic(c)) == have
    run(c, 8, 60, fleet=[Share("ns/other", 2, None)], capacity_changed=c.now)
    assert len(opportunistic(c)) == 6


def test_scale_in_takes_opportunistic_workers_first_after_named_ones() -> None:
    def pod(i: int, opp: bool) -> Worker:
        labels = {names.LABEL_OPPORTUNISTIC: "true"} if opp else {}
        obj = {
            "metadata": {
                "name": f"j-worker-{i}",
                "uid": str(i),
                "labels": labels,
                "creationTimestamp": f"2026-01-01T00:00:0{i}Z",
            },
            "spec": {"containers": [{"name": "main"}]},
        }
        obj["status"] = running_status(obj)
        return Worker(i, obj)

    ws: Sequence[Worker] = [pod(0, False), pod(1, True), pod(2, False), pod(3, True)]
    listed = {w.name for w in ws}
    m = choose_members("j", ws, 2, None, Facts(listed=listed))
    assert sorted(item.worker.name for item in m.leaving) == ["j-worker-1", "j-worker-3"]
    m = choose_members("j", ws, 2, None, Facts(listed=listed, named={"j-worker-0"}))
    assert next(item.worker.name for item in m.leaving) == "j-worker-0"
    assert {item.worker.name for item in m.leaving} == {"j-worker-0", "j-worker-3"}


def test_the_disruption_budget_counts_the_baseline_only() -> None:
    annotations = {
        names.ANN_MIN_REPLICAS: "1",
        names.ANN_MAX_REPLICAS: "4",
        names.ANN_OPPORTUNISTIC: "true",
    }
    spec = parse(make_job(2, annotations=annotations), 30)
    selector = disruption_budget(spec, 1)["spec"]["selector"]
    assert {"key": names.LABEL_OPPORTUNISTIC, "operator": "DoesNotExist"} in selector[
        "matchExpressions"
    ]


def test_the_annotations_are_validated() -> None:
    def errors(annotations: dict[str, str]) -> list[str]:
        try:
            parse(make_job(2, annotations=annotations), 30)
        except InvalidSpec as err:
            return [f"{e.field} {e.message}" for e in err.errors]
        return []

    bounds = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "4"}
    assert errors({**bounds, names.ANN_OPPORTUNISTIC: "true"}) == []
    assert "must be true or false" in errors({**bounds, names.ANN_OPPORTUNISTIC: "yes"})[0]
    assert "only an elastic job with a maximum" in errors({names.ANN_OPPORTUNISTIC: "true"})[0]
    assert "DNS-1123" in errors({**bounds, names.ANN_OPPORTUNISTIC_PRIORITY_CLASS: "A b"})[0]
    spec = parse(
        make_job(
            2,
            annotations={
                **bounds,
                names.ANN_OPPORTUNISTIC: "true",
                names.ANN_OPPORTUNISTIC_PRIORITY_CLASS: "team-spot",
            },
        ),
        30,
    )
    assert (spec.opportunistic, spec.opportunistic_priority_class) == (True, "team-spot")


def test_observed_defaults_see_no_fleet() -> None:
    observed = Observed(job=make_job())
    assert (tuple(observed.fleet), observed.capacity_changed) == ((), None)


def test_the_grew_event_goes_out_once_the_host_list_landed_not_at_the_turns_end() -> None:
    """A later phase's conflict (a 409 on the launcher's refresh) must not lose it: the
    next turn sees the workers listed already and has nothing to report."""
    c = job()
    for _ in range(60):
        schedule(c, 6)
        c.finalize_deletions()
        p = plan_writes(c.observed(), SETTINGS, c.now)
        steps = [ph.step for ph in p.phases]
        grew = [ph.step for ph in p.phases for a in ph.writes if getattr(a, "reason", "") == "Grew"]
        c.apply(p)
        c.tick(1)
        if grew:
            break
    assert grew == ["ConfigMap events"], steps
    # Right behind the host list it reports, before the writes that may still conflict.
    before = steps[: steps.index("ConfigMap events")]
    assert before[-1] in ("ConfigMap", "ranks ConfigMap"), steps


def test_a_job_of_a_kueue_queue_runs_only_what_kueue_admitted() -> None:
    # Kueue charges what the Workload asks for: growth into idle room would run workers
    # the ClusterQueue never saw (issue 32). The job grows through Kueue instead.
    c = job()
    c.job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q"}
    # Admitted, its pods once ready (no Workload write is left to make).
    queue = Queue(True, [workload(c.job, 2, admitted=2, conditions=(("PodsReady", "Started"),))])
    run(c, 8, 60, queue=queue)
    assert len(workers(c)) == 2
    assert opportunistic(c) == []
    warnings = next(x for x in c.job["status"]["conditions"] if x["type"] == "SpecWarnings")
    assert (
        f"[{names.ANN_OPPORTUNISTIC}]: ignored for a job queued in Kueue without workload slices"
        in warnings["message"]
    )
    # The same job without the label grows into the room.
    free = job()
    run(free, 8, 60)
    assert len(workers(free)) > 2
