"""The real planner and Writer under a world that lags, fails writes and kills the controller.

Each run checks the safety invariants after every write (see ``simulation.World``) and
ends by letting the world settle: every job must converge. Beside two elastic jobs run an
opportunistic one and one labelled for a Kueue queue. The tests after the property show
that the simulation catches what it must: a planner that deletes before rewriting the
host lists, a planner that trusts a stale drain mark, a Writer that remembers a delete
the server never confirmed, and a job that runs before Kueue admits it, more workers than
Kueue admitted, or more than max-replicas.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    DELETE_MEMORY_SECONDS,
    Action,
    DeletePod,
    Phase,
    Replace,
    Writes,
)
from mpijob_elastic.core.hosts import host_rules, membership
from mpijob_elastic.core.hosts.host_rules import reset_bound
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.planning.desired import desired
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.planning.write_order import diff
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import QUEUE_LABEL
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.sizing import opportunistic
from mpijob_elastic.machinery.writer import Key, Writer
from tests.unit import simulation
from tests.unit.simulation import (
    KILL,
    RANK_COMMIT_SECONDS,
    SETTINGS,
    TIMEOUT_AFTER,
    TIMEOUT_BEFORE,
    FakeKube,
    Faults,
    Request,
    Sim,
    Violation,
    World,
    discovered,
    make_job,
)

JOBS = ("job", "other")
# Beside them: an opportunistic job, and one labelled for a Kueue queue.
OPPORTUNISTIC, QUEUED = "opp", "queued"
BESIDE = (OPPORTUNISTIC, QUEUED)
# Their max-replicas.
BESIDE_MAX = 3
# The opportunistic job's growth backoff capped well below the time ``Sim.settle`` waits:
# preempted five times, it would pause 300 s by default before growing back.
BESIDE_SETTINGS = dataclasses.replace(SETTINGS, growth_backoff_max_seconds=40.0)
DRAIN = 3


def world(
    replicas: int = 2, *, drain: float = DRAIN, jobs: tuple[str, ...] = JOBS, beside: bool = False
) -> World:
    annotations = {
        names.ANN_MIN_REPLICAS: "1",
        names.ANN_MAX_REPLICAS: "5",
        names.ANN_DRAIN_SECONDS: f"{drain:g}",
    }
    made = [make_job(replicas, name=j, annotations=dict(annotations)) for j in jobs]
    if beside:
        bounded = {**annotations, names.ANN_MAX_REPLICAS: str(BESIDE_MAX)}
        opportunistic = {**bounded, names.ANN_OPPORTUNISTIC: "true"}
        queued = make_job(min(replicas, BESIDE_MAX), name=QUEUED, annotations=bounded)
        queued["metadata"]["labels"] = {QUEUE_LABEL: "q"}
        made += [make_job(1, name=OPPORTUNISTIC, annotations=opportunistic), queued]
    for job in made:
        job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    for job in made[1:2]:
        # A launcher that is a host (listed, granted exec on itself) and runs as a
        # ServiceAccount named in its template, beside a job with neither.
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
        launcher["spec"]["serviceAccountName"] = f"{job['metadata']['name']}-trainer"
        launcher["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return World(*made)


def settled(sim: Sim) -> bool:
    return not any(sim.unconverged(j) for j in sim.jobs)


# -- the real controller holds every invariant, whatever happens -----------------------

# (what, which job, how much). A scale is made after a short delay, so it may land in the
# middle of a turn; a restart kills the controller between turns; the scheduler preempts
# a worker of the opportunistic job, Kueue evicts the queued one.
step = st.one_of(
    st.tuples(
        st.just("scale"), st.sampled_from(JOBS + BESIDE), st.integers(min_value=1, max_value=5)
    ),
    st.tuples(st.just("wait"), st.just(""), st.sampled_from([0.05, 0.5, 1, 2, 4, 8])),
    st.tuples(
        st.just("fail"), st.sampled_from(JOBS + BESIDE), st.integers(min_value=0, max_value=4)
    ),
    st.tuples(st.just("restart"), st.just(""), st.just(0)),
    st.tuples(
        st.just("preempt"),
        st.just(OPPORTUNISTIC),
        st.integers(min_value=0, max_value=BESIDE_MAX - 1),
    ),
    st.tuples(st.just("evict"), st.just(QUEUED), st.just(0)),
)


# Fresh examples on every run (a failure prints its example and the blob that replays it);
# the examples below, each found by a fresh run, run every time.
@settings(max_examples=100, deadline=None, print_blob=True)
@given(
    steps=st.lists(step, max_size=30),
    seed=st.integers(min_value=0, max_value=2**32),
    failure=st.sampled_from([0.0, 0.1, 0.3]),
    kill=st.sampled_from([0.0, 0.02, 0.1]),
    lag=st.sampled_from([0.0, 0.5, 2.0]),
    drain=st.sampled_from([0, DRAIN]),
    # The examples below were found before the opportunistic and the queued job ran beside
    # the others: they replay in the world they were found in.
    beside=st.just(True),
)
# Found by a fresh seed: an opportunistic job scaled in below the workers it ran churned a
# pod a turn: a probe created beside the surplus baseline worker, then deleted unscheduled
# as the one worker too many (invariant (e), no convergence in 300 s).
@example(
    steps=[("scale", "opp", 4), ("scale", "opp", 4), ("evict", "queued", 0), ("scale", "opp", 1)],
    seed=139068,
    failure=0.3,
    kill=0.02,
    lag=0.0,
    drain=0,
    beside=True,
)
# Found by the opportunistic and queued jobs' first fresh seeds: a Workload's release of
# the quota refused (403) after an eviction, and the job started again under that quota
# while the next turn's release gave it back (invariant (k)).
@example(
    steps=[
        ("wait", "", 4),
        ("scale", "job", 1),
        ("evict", "queued", 0),
        ("scale", "queued", 4),
        ("evict", "queued", 0),
        ("restart", "", 0),
        ("preempt", "opp", 1),
        ("restart", "", 0),
        ("wait", "", 8),
        ("restart", "", 0),
        ("wait", "", 8),
        ("scale", "job", 2),
        ("restart", "", 0),
        ("fail", "queued", 2),
        ("scale", "job", 2),
        ("wait", "", 1),
        ("evict", "queued", 0),
        ("evict", "queued", 0),
        ("fail", "opp", 2),
        ("scale", "job", 3),
        ("preempt", "opp", 1),
        ("wait", "", 8),
    ],
    seed=4193873836,
    failure=0.3,
    kill=0.0,
    lag=0.0,
    drain=3,
    beside=True,
)
# Found by the property: a turn whose ConfigMap write (carrying the failure count) landed
# and whose delete of the failed worker did not counted the same failure again on every
# retry, and the job paused its replacement for five minutes.
@example(
    steps=[
        ("wait", "", 0.5),
        ("fail", "job", 0),
        ("scale", "job", 1),
        ("restart", "", 0),
        ("fail", "job", 0),
        ("scale", "job", 1),
        ("fail", "job", 0),
        ("wait", "", 2),
        ("scale", "job", 1),
        ("fail", "job", 1),
        ("restart", "", 0),
        ("wait", "", 0.05),
        ("wait", "", 0.05),
    ],
    seed=0,
    failure=0.3,
    kill=0.0,
    lag=0.0,
    drain=0,
    beside=False,
)
# Found by fresh seeds: a read of who holds a taken name timing out inside a phase; and a
# create that timed out after the server applied it, retried.
@example(
    steps=[("scale", "job", 1), ("scale", "job", 1), ("wait", "", 2)],
    seed=192,
    failure=0.3,
    kill=0.0,
    lag=0.5,
    drain=0,
    beside=False,
)
@example(
    steps=[
        ("wait", "", 2),
        ("restart", "", 0),
        ("wait", "", 0.05),
        ("scale", "job", 1),
        ("wait", "", 0.05),
        ("restart", "", 0),
        ("fail", "other", 1),
        ("restart", "", 0),
    ],
    seed=573214763,
    failure=0.3,
    kill=0.0,
    lag=0.5,
    drain=3,
    beside=False,
)
# A blacklisted name reused: the simulated server took a stale notice patch; the real one 409s
@example(
    steps=[
        ("scale", "job", 5),
        ("scale", "job", 2),
        ("wait", "", 2),
        ("scale", "other", 5),
        ("wait", "", 8),
        ("restart", "", 0),
        ("scale", "other", 3),
        ("fail", "other", 4),
        ("scale", "other", 1),
        ("wait", "", 2),
        ("scale", "job", 1),
        ("restart", "", 0),
        ("scale", "other", 4),
    ],
    seed=453,
    failure=0.0,
    kill=0.02,
    lag=0.5,
    drain=0,
    beside=False,
)
# Every rank-holder dropped, the checker said, 0.5 s after a restarted launcher ran (a GPU
# launcher, listed itself): the checker took a worker listed before then for one whose ranks
# had joined
@example(
    steps=[
        ("scale", "other", 5),
        ("scale", "other", 3),
        ("restart", "", 0),
        ("fail", "job", 0),
        ("fail", "job", 0),
        ("wait", "", 0.05),
        ("wait", "", 4),
        ("scale", "job", 3),
        ("fail", "job", 2),
        ("restart", "", 0),
        ("scale", "job", 1),
        ("restart", "", 0),
        ("scale", "job", 2),
        ("fail", "job", 4),
        ("restart", "", 0),
        ("fail", "other", 0),
        ("wait", "", 4),
        ("scale", "other", 1),
        ("fail", "job", 0),
        ("restart", "", 0),
        ("fail", "other", 1),
        ("wait", "", 1),
        ("fail", "job", 0),
        ("restart", "", 0),
        ("fail", "job", 2),
        ("restart", "", 0),
        ("wait", "", 1),
    ],
    seed=59,
    failure=0.1,
    kill=0.1,
    lag=2.0,
    drain=0,
    beside=False,
)
# Every rank-holder dropped, the checker said, by a scale-in that kept worker-0, failed 0.13 s
# earlier in a world the caches had not caught up with
@example(
    steps=[
        ("wait", "", 1),
        ("wait", "", 4),
        ("scale", "job", 1),
        ("scale", "job", 1),
        ("fail", "job", 0),
    ],
    seed=0,
    failure=0.0,
    kill=0.0,
    lag=0.5,
    drain=0,
    beside=False,
)
# Every rank-holder dropped, the checker said, of a job whose launcher (no driver yet) was Pending
@example(
    steps=[("wait", "", 2), ("scale", "other", 1)],
    seed=0,
    failure=0.0,
    kill=0.0,
    lag=0.5,
    drain=0,
    beside=False,
)
# A queued job said QueueAdmitted False (WorkloadRefused) for good: the turn that reported
# an injected Workload refusal went through and put it behind it, but no event came to
# report that (a status write moves no job)
@example(
    steps=[("wait", "", 8)],
    seed=54211,
    failure=0.1,
    kill=0.02,
    lag=0.5,
    drain=0,
    beside=True,
)
# A 3 s drain ended 2.98 s after the drop: the drain mark carried the plan's time, not the send's
@example(
    steps=[
        ("scale", "job", 2),
        ("wait", "", 0.5),
        ("wait", "", 2),
        ("scale", "job", 5),
        ("fail", "job", 4),
        ("fail", "job", 3),
        ("scale", "other", 3),
        ("scale", "job", 2),
        ("fail", "job", 3),
        ("wait", "", 4),
        ("restart", "", 0),
        ("fail", "job", 2),
        ("scale", "job", 5),
        ("restart", "", 0),
        ("wait", "", 2),
        ("restart", "", 0),
        ("fail", "other", 0),
        ("wait", "", 2),
        ("wait", "", 2),
        ("fail", "job", 1),
        ("wait", "", 0.5),
        ("scale", "other", 5),
        ("fail", "other", 1),
        ("wait", "", 2),
        ("scale", "other", 2),
        ("wait", "", 4),
        ("scale", "job", 2),
    ],
    seed=6683,
    failure=0.0,
    kill=0.0,
    lag=2.0,
    drain=3,
    beside=False,
)
def test_invariants_under_faults_lag_and_restarts(
    steps: list[tuple[str, str, float]],
    seed: int,
    failure: float,
    kill: float,
    lag: float,
    drain: float,
    beside: bool,
) -> None:
    w = world(drain=drain, beside=beside)
    faults = Faults(failure=failure, kill=kill, max_lag=lag)
    with Sim(w, seed=seed, faults=faults, settings=BESIDE_SETTINGS) as sim:
        for kind, job, arg in steps:
            if kind == "scale":
                n = min(int(arg), BESIDE_MAX) if job in BESIDE else int(arg)
                sim.later(sim.rng.uniform(0, 0.2), functools.partial(w.set_replicas, n, job))
            elif kind == "wait":
                sim.advance(arg)
            elif kind in ("fail", "preempt"):
                pod = w.get_obj("Pod", names.worker_name(job, int(arg)))
                if pod and pod["status"]["phase"] == "Running":
                    (w.fail if kind == "fail" else w.preempt)(pod["metadata"]["name"])
            elif kind == "evict":
                w.evict(job)
            else:
                sim.restart()
        sim.settle()


def test_a_faulty_run_meets_every_kind_of_trouble() -> None:
    """The property above is only as good as the trouble it meets: make sure it is met."""
    w = world()
    with Sim(w, seed=8, faults=Faults(failure=0.3, kill=0.1, max_lag=2.0)) as sim:
        for n in (5, 1, 4, 2, 5, 3):
            w.set_replicas(n)
            sim.advance(DRAIN * 1.5)
        sim.settle()
        assert set(sim.met) == {"409", "403", "422", "500", KILL, TIMEOUT_BEFORE, TIMEOUT_AFTER}
        assert sim.failed_turns > 10
        assert sim.kills > 2
    assert len(w.deletions) >= 4


# -- the simulation catches known-bad variants --------------------------------------------


def is_config_map(action: Action) -> bool:
    return isinstance(action, Replace) and action.obj["kind"] == "ConfigMap"


def deletes_first(observed: Observed, s: Settings, now: datetime) -> Writes:
    """The real plan with the victims' deletes moved before the host-list write."""
    p = plan_writes(observed, s, now)
    deletes = tuple(a for a in p.actions if isinstance(a, DeletePod))
    rest = [
        Phase(ph.step, tuple(a for a in ph.writes if not isinstance(a, DeletePod)))
        for ph in p.phases
    ]
    at = next((i for i, ph in enumerate(rest) if any(map(is_config_map, ph.writes))), len(rest))
    moved = [*rest[:at], Phase("deletes", deletes), *rest[at:]]
    return Writes(tuple(ph for ph in moved if ph.writes), p.requeue_after)


def trusts_any_mark(observed: Observed, s: Settings, now: datetime) -> Writes:
    """The old drain rule: a marked worker is draining even if the host lists name it.

    ``desired`` is shown host lists without the marked workers; ``diff`` the real ones.
    """
    marked = {
        p["metadata"]["name"]
        for p in observed.pods
        if names.ANN_DRAINING_SINCE in (p["metadata"].get("annotations") or {})
    }
    cm = observed.config_map
    if cm is not None:
        data = {k: _without(v, marked) for k, v in (cm.get("data") or {}).items()}
        cm = {**cm, "data": data}
    return diff(desired(dataclasses.replace(observed, config_map=cm), s, now), observed, now)


def _without(text: str, hosts: set[str]) -> str:
    def names_host(line: str) -> bool:
        return any(word.split(":")[0] in hosts for word in line.split())

    return "\n".join(line for line in text.split("\n") if not names_host(line))


class RemembersBeforeAsking(Writer):
    """The old Writer: a delete counts as issued before the server answers, and stays so."""

    async def _write(self, key: Key, job: dict[str, Any], action: Action) -> None:
        if isinstance(action, DeletePod):
            assert isinstance(self.kube, FakeKube)
            self.of(key).deletes[action.uid] = self.kube.world.clock
        await super()._write(key, job, action)


def started(w: World, **kw: Any) -> Sim:
    sim = Sim(w, **kw)
    sim.advance(30, until=lambda: settled(sim))
    assert settled(sim)
    # The host-list rules (host_rules.py) keep a host the launcher's reports showed
    # holding ranks, and hold a change until new ranks have committed: the scenarios start
    # once the reports show every worker's and their commit markers.
    sim.advance(
        reset_bound(30).total_seconds() + 1,
        until=lambda: all(
            (r := sim.reports(j)) is not None
            and r.hosts is not None
            and {n for n in r.hosts if "worker" in n} == set(discovered_names(sim, j))
            for j in sim.jobs
        ),
    )
    sim.advance(RANK_COMMIT_SECONDS + 0.1)
    return sim


def discovered_names(sim: Sim, job: str) -> list[str]:
    return [
        n
        for n in discovered(sim.world.get_obj("ConfigMap", names.config_map_name(job)))
        if "worker" in n
    ]


def scale_in_with_zero_drain(sim: Sim) -> None:
    sim.world.set_replicas(2)
    sim.advance(10)
    sim.settle()


def stale_mark_after_restart(sim: Sim) -> None:
    """Defect 1's scenario: workers 2 and 3 listed and wanted, but carrying a drain mark
    an hour old (left by a drain a scale-out took back, the controller killed before it
    unmarked them), then 4->2."""
    w = sim.world
    sim.settle()
    stale = "2000-01-01T00:00:00.000000Z"
    for name in ("job-worker-2", "job-worker-3"):
        w.patch("Pod", name, {"metadata": {"annotations": {names.ANN_DRAINING_SINCE: stale}}})
    assert discovered_names(sim, "job") == [f"job-worker-{i}" for i in range(4)]
    w.set_replicas(2)
    sim.settle()


def lost_delete(sim: Sim) -> None:
    """Defect 2's scenario: a drained worker's delete times out before reaching the server."""
    sim.inject(Request("delete", "Pod", "job-worker-3"), TIMEOUT_BEFORE)
    sim.world.set_replicas(2)
    sim.advance(DRAIN + 5, until=lambda: sim.failed_turns == 1)
    assert sim.failed_turns == 1
    # Promptly, through the failed turn's backoff: not only once the safety net of
    # forgetting an accepted delete (DELETE_MEMORY_SECONDS) has brought the job back.
    sim.settle(DELETE_MEMORY_SECONDS / 2)


CASES: Mapping[str, tuple[Any, float, dict[str, Any], str]] = {
    "deletes before the host-list write": (
        scale_in_with_zero_drain,
        0,
        {"planner": deletes_first},
        "(b) worker pod job-worker-2 deleted while discover_hosts.sh names it",
    ),
    "defect 1: a stale drain mark": (
        stale_mark_after_restart,
        DRAIN,
        {"planner": trusts_any_mark},
        "(b) worker pod job-worker-2 deleted",
    ),
    "defect 2: a lost delete taken for issued": (
        lost_delete,
        DRAIN,
        {"writer": RemembersBeforeAsking},
        f"(e) after {DELETE_MEMORY_SECONDS / 2:g}s without faults: job has worker pods",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_simulation_catches(case: str) -> None:
    scenario, drain, variant, violation = CASES[case]
    with (
        started(world(4, drain=drain, jobs=("job",)), **variant) as sim,
        pytest.raises(Violation) as caught,
    ):
        scenario(sim)
    assert violation in str(caught.value), caught.value


@pytest.mark.parametrize("case", CASES)
def test_the_real_controller_passes(case: str) -> None:
    scenario, drain, _, _ = CASES[case]
    w = world(4, drain=drain, jobs=("job",))
    with started(w) as sim:
        scenario(sim)
    assert [p["metadata"]["name"] for p in w.workers()] == ["job-worker-0", "job-worker-1"]


def crash_then_scale_up(sim: Sim) -> None:
    """A rank dies while its worker is listed (Horovod blacklists the name); the worker is
    replaced, its failed pod goes, and a later scale-up needs more names."""
    w = sim.world
    w.fail("job-worker-1")
    sim.advance(10)
    w.set_replicas(5)
    sim.settle()


def test_a_blacklisted_name_is_never_handed_out_again() -> None:
    with started(world(4, drain=DRAIN, jobs=("job",))) as sim:
        crash_then_scale_up(sim)
        names_now = sorted(p["metadata"]["name"] for p in sim.world.workers())
    assert "job-worker-1" not in names_now
    assert len(names_now) == 5
    assert sim.world.blacklisted["job"] == {"job-worker-1"}


def test_the_simulation_catches_a_reused_blacklisted_name() -> None:
    with (
        mock.patch.object(membership, "ranks_may_have_died", return_value=False),
        started(world(4, drain=DRAIN, jobs=("job",))) as sim,
        pytest.raises(Violation) as caught,
    ):
        crash_then_scale_up(sim)
    assert "(g) pod job-worker-1 created under a blacklisted name" in str(caught.value)


def ignores_host_rules(observed: Observed, s: Settings, now: datetime) -> Writes:
    """The planner as it was before host_rules.py: the wanted host list, written at once."""

    def wanted_only(wanted: Any, *_: Any, **__: Any) -> host_rules.HostList:
        return host_rules.HostList(tuple(wanted), frozenset(), frozenset())

    with mock.patch.object(host_rules, "next_hosts", wanted_only):
        return plan_writes(observed, s, now)


def replace_every_worker(sim: Sim) -> None:
    """Every worker named for removal at the same replicas: all are replaced, as when the
    node that holds them all is drained."""
    w = sim.world
    job = copy.deepcopy(w.job())
    job["metadata"]["annotations"][names.ANN_REMOVE_WORKERS] = ",".join(
        p["metadata"]["name"] for p in w.workers()
    )
    job["metadata"]["generation"] += 1
    w.replace(job)
    sim.settle()


def test_replacing_every_worker_keeps_a_rank_holder_listed() -> None:
    w = world(3, jobs=("job",))
    with started(w) as sim:
        replace_every_worker(sim)
    assert [p["metadata"]["name"] for p in w.workers()] == [
        "job-worker-3",
        "job-worker-4",
        "job-worker-5",
    ]


def test_the_simulation_catches_a_list_without_rank_holders() -> None:
    with (
        started(world(3, jobs=("job",)), planner=ignores_host_rules) as sim,
        pytest.raises(Violation) as caught,
    ):
        replace_every_worker(sim)
    assert "(i) discover_hosts.sh of job dropped every rank-holder" in str(caught.value)


# -- the opportunistic and the queued job: what Kueue admitted, and max-replicas ----------


def beside_only() -> World:
    return world(jobs=(), beside=True)


def admitted_then_evicted(sim: Sim) -> None:
    """The queued job waits for Kueue, runs as admitted, is evicted, stops, and is
    admitted again; the opportunistic job grows beside it and loses a worker to a
    preemption."""
    w = sim.world
    w.set_replicas(BESIDE_MAX, QUEUED)
    sim.advance(20)
    w.preempt(names.worker_name(OPPORTUNISTIC, BESIDE_MAX - 1))
    assert w.evict(QUEUED)
    sim.settle()


def runs_before_admission(job: Any, _queue: Any) -> Any:
    """Kueue's gate ignored: the job is seen as it was written, admitted or not."""
    return job


real_gate = kueue.gate


def runs_its_replicas(job: Any, queue: Any) -> Any:
    """Kueue's gate that holds the job until admitted but then runs every worker it asks
    for, not the fewer Kueue admitted."""
    gated = real_gate(job, queue)
    if not gated["spec"]["runPolicy"].get("suspend"):
        workers = gated["spec"]["mpiReplicaSpecs"]["Worker"]
        workers["replicas"] = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    return gated


def grows_past_max(*_: Any) -> int:
    """The growth step without the room left: one worker more than max-replicas allows."""
    return BESIDE_MAX


BESIDE_CASES: Mapping[str, tuple[Any, str]] = {
    "pods before Kueue admits the job": (
        mock.patch.object(kueue, "gate", runs_before_admission),
        f"(k) {QUEUED} has pods",
    ),
    "more workers than Kueue admitted": (
        mock.patch.object(kueue, "gate", runs_its_replicas),
        "more than the 1 Kueue admitted",
    ),
    "an opportunistic job past max-replicas": (
        mock.patch.object(opportunistic, "_step", grows_past_max),
        f"(l) {OPPORTUNISTIC} has workers",
    ),
}


@pytest.mark.parametrize("case", BESIDE_CASES)
def test_the_simulation_catches_a_broken_opportunistic_or_queued_job(case: str) -> None:
    broken, violation = BESIDE_CASES[case]
    with (
        mock.patch.object(simulation, "MAX_ADMITTED", 1),
        broken,
        Sim(beside_only(), settings=BESIDE_SETTINGS) as sim,
        pytest.raises(Violation) as caught,
    ):
        admitted_then_evicted(sim)
    assert violation in str(caught.value), caught.value


def test_the_real_controller_runs_what_kueue_admitted_and_max_replicas() -> None:
    w = beside_only()
    with mock.patch.object(simulation, "MAX_ADMITTED", 1), Sim(w, settings=BESIDE_SETTINGS) as sim:
        admitted_then_evicted(sim)
    assert len(w.workers(QUEUED)) == 1
    assert BESIDE_MAX - 1 <= len(w.workers(OPPORTUNISTIC)) <= BESIDE_MAX
    evicted = [c for wl in w.workloads(QUEUED) for c in wl["status"]["conditions"]]
    assert {"type": "Requeued", "status": "True"}.items() <= next(
        c for c in evicted if c["type"] == "Requeued"
    ).items()
