"""The planner, driven through the in-memory cluster: every scaling rule, without a cluster."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    DELETE_MEMORY_SECONDS,
    AnnotatePod,
    Create,
    DeletePod,
    Emit,
    Probe,
    Replace,
    WriteStatus,
)
from mpijob_elastic.core.hosts.drain import DRAIN_FLOOR_SECONDS, PROBE_INTERVAL_SECONDS
from mpijob_elastic.core.objects.render import exec_names
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.reports.conditions import held_names
from mpijob_elastic.core.workers import worker_index
from mpijob_elastic.machinery.kube import ApiError
from mpijob_elastic.machinery.writer import Writer
from tests.unit.simulation import (
    SETTINGS,
    Cluster,
    FakeKube,
    discovered,
    make_job,
    running_status,
)

ELASTIC = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "5"}


def workers_of(c: Cluster) -> list[str]:
    return sorted(
        (p["metadata"]["name"] for p in c.pods if "-worker-" in p["metadata"]["name"]),
        key=lambda n: worker_index("job", n) or 0,
    )


def condition(c: Cluster, type_: str) -> dict[str, Any] | None:
    for cond in c.job.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return None


def cm(c: Cluster) -> dict[str, Any]:
    obj = c.get("ConfigMap", "job-config")
    assert obj is not None
    return obj


def started(replicas: int = 2, annotations: dict[str, str] | None = None, **kw: Any) -> Cluster:
    c = Cluster(make_job(replicas, annotations=annotations or dict(ELASTIC), **kw))
    c.converge()
    return c


def test_new_job_grants_exec_once_its_workers_are_created() -> None:
    c = Cluster(make_job(2))
    p = c.plan()
    kinds = [a.obj["kind"] for a in p.actions if isinstance(a, Create)]
    assert kinds == [
        "ServiceAccount",
        "ConfigMap",
        "ConfigMap",
        "Pod",
        "Pod",
        "Role",
        "RoleBinding",
    ]
    c.apply(p)
    # Granted only after the creates went through: a name held by someone else's pod
    # (a create answered 409) never reaches the Role.
    assert c.creations == [("job-worker-0", set()), ("job-worker-1", set())]
    assert exec_names(c.get("Role", "job-launcher")) == {"job-worker-0", "job-worker-1"}
    # Pending workers take no ranks; the launcher waits for them.
    assert discovered(cm(c)) == []
    assert c.get("Pod", "job-launcher") is None


def test_settled_job_plans_nothing() -> None:
    c = started(3)
    assert discovered(cm(c)) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert c.get("Pod", "job-launcher") is not None
    p = c.plan()
    assert p.actions == ()
    # Nothing on a timer: a rank that dies is reported by the launcher (ranks.py).
    assert p.requeue_after is None
    assert p.probe is None


def test_discovery_is_in_index_order_not_string_order() -> None:
    c = started(11, annotations={names.ANN_MAX_REPLICAS: "20"})
    hosts = discovered(cm(c))
    assert hosts[:3] == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert hosts[-2:] == ["job-worker-9", "job-worker-10"]


def test_v1_file_formats() -> None:
    c = started(2, slots=2)
    data = cm(c)["data"]
    assert data[names.HOSTFILE] == "job-worker-0 slots=2\njob-worker-1 slots=2\n"
    assert data[names.DISCOVER_HOSTS] == "#!/bin/sh\necho job-worker-0:2\necho job-worker-1:2"


def test_scale_up_grants_created_workers_and_lists_them_once_running() -> None:
    c = started(2)
    c.set_replicas(4)
    p = c.plan()
    role_at = next(
        i for i, a in enumerate(p.actions) if isinstance(a, Replace) and a.obj["kind"] == "Role"
    )
    pods_at = [
        i for i, a in enumerate(p.actions) if isinstance(a, Create) and a.obj["kind"] == "Pod"
    ]
    assert pods_at
    assert role_at > max(pods_at)
    c.apply(p)
    assert exec_names(c.get("Role", "job-launcher")) == {f"job-worker-{i}" for i in range(4)}
    assert cm(c)["data"][names.HOSTFILE].count("\n") == 4
    # Created but not Running: not a host yet.
    assert discovered(cm(c)) == ["job-worker-0", "job-worker-1"]
    scaling = condition(c, "Scaling")
    assert scaling is not None
    assert (scaling["status"], scaling["reason"]) == ("True", "ScalingUp")
    c.run_pods()
    c.apply(c.plan())
    assert discovered(cm(c)) == [f"job-worker-{i}" for i in range(4)]
    assert any(e.reason == "ScaledUp" for e in c.events)


def test_scale_in_drains_then_deletes_once_then_revokes() -> None:
    c = started(4)
    c.set_replicas(1)
    p = c.plan()
    # Host lists change before anything happens to the victims.
    cm_at = next(
        i
        for i, a in enumerate(p.actions)
        if isinstance(a, Replace) and a.obj["kind"] == "ConfigMap"
    )
    marks = [
        i
        for i, a in enumerate(p.actions)
        if isinstance(a, AnnotatePod) and a.stamp == names.ANN_DRAINING_SINCE
    ]
    assert marks
    assert min(marks) > cm_at
    assert not p.of_type(DeletePod)
    # Back at the drain floor, to look whether the ranks have left.
    assert p.requeue_after == DRAIN_FLOOR_SECONDS
    c.apply(p)
    assert discovered(cm(c)) == ["job-worker-0"]
    assert cm(c)["data"][names.HOSTFILE] == "job-worker-0 slots=1\n"
    # Still allowed to exec while the ranks wind down.
    assert exec_names(c.get("Role", "job-launcher")) == {f"job-worker-{i}" for i in range(4)}
    assert condition(c, "Scaling")["reason"] == "ScalingDown"  # type: ignore[index]

    c.tick(10)
    p = c.plan()
    # No read of the launcher has answered: the drain runs its full length.
    assert not p.of_type(DeletePod)
    assert p.probe == Probe("job-launcher", "main")
    assert p.requeue_after == PROBE_INTERVAL_SECONDS
    c.tick(20)
    p = c.plan()
    assert sorted(d.name for d in p.of_type(DeletePod)) == [
        "job-worker-1",
        "job-worker-2",
        "job-worker-3",
    ]
    # What the metrics count of it: three drains that ran their full length.
    (deleted,) = [e for e in p.of_type(Emit) if e.reason == "WorkerDeleted"]
    assert deleted.counts == (("drained", 0), ("drain_timed_out", 3))
    c.apply(p)
    # The cache has not caught up yet: no second delete.
    assert not c.plan().of_type(DeletePod)
    c.finalize_deletions()
    c.apply(c.plan())
    assert exec_names(c.get("Role", "job-launcher")) == {"job-worker-0"}
    assert condition(c, "Scaling")["status"] == "False"  # type: ignore[index]
    reasons = [e.reason for e in c.events]
    assert reasons.index("Draining") < reasons.index("WorkerDeleted")


def test_scale_up_during_drain_takes_victims_back() -> None:
    c = started(4)
    c.set_replicas(1)
    c.apply(c.plan())
    c.tick(5)
    c.set_replicas(3)
    p = c.plan()
    assert not p.of_type(DeletePod)
    unmarked = {
        a.name
        for a in p.of_type(AnnotatePod)
        if a.annotations.get(names.ANN_DRAINING_SINCE, "x") is None
    }
    assert unmarked == {"job-worker-1", "job-worker-2"}
    assert not [a for a in p.of_type(Create) if a.obj["kind"] == "Pod"]
    c.apply(p)
    assert discovered(cm(c)) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    c.tick(60)
    c.converge()
    assert workers_of(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert [name for name, _, _ in c.deletions] == ["job-worker-3"]


def test_zero_drain_deletes_right_after_the_host_lists_change() -> None:
    c = started(3, annotations={**ELASTIC, names.ANN_DRAIN_SECONDS: "0"})
    c.set_replicas(1)
    p = c.plan()
    cm_at = next(
        i
        for i, a in enumerate(p.actions)
        if isinstance(a, Replace) and a.obj["kind"] == "ConfigMap"
    )
    deletes = [i for i, a in enumerate(p.actions) if isinstance(a, DeletePod)]
    assert len(deletes) == 2
    assert min(deletes) > cm_at


def test_unreadable_drain_mark_restarts_the_drain() -> None:
    c = started(2)
    c.set_replicas(1)
    c.apply(c.plan())
    c.objects[("Pod", "job-worker-1")]["metadata"]["annotations"][names.ANN_DRAINING_SINCE] = "soon"
    c.tick(100)
    p = c.plan()
    assert not p.of_type(DeletePod)
    assert [a.name for a in p.of_type(AnnotatePod)] == ["job-worker-1"]


def test_config_change_touches_the_launcher() -> None:
    c = started(2)
    c.set_replicas(3)
    c.apply(c.plan())
    c.run_pods()
    p = c.plan()
    hashes = [a for a in p.of_type(AnnotatePod) if a.name == "job-launcher"]
    assert len(hashes) == 1
    cm_at = next(
        i
        for i, a in enumerate(p.actions)
        if isinstance(a, Replace) and a.obj["kind"] == "ConfigMap"
    )
    assert p.actions.index(hashes[0]) > cm_at


def test_out_of_range_replicas_keep_the_current_workers() -> None:
    c = started(3)
    for bad in (9, 0, -1):
        c.set_replicas(bad)
        p = c.plan()
        assert not p.of_type(DeletePod), bad
        assert not [a for a in p.of_type(Create) if a.obj["kind"] == "Pod"], bad
        c.apply(p)
        cond = condition(c, "InvalidSpec")
        assert cond
        assert cond["status"] == "True"
        assert cond["reason"] == "ReplicasOutOfRange"
        assert "spec.mpiReplicaSpecs.Worker.replicas" in cond["message"]
        assert workers_of(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert [e.reason for e in c.events].count("ReplicasOutOfRange") == 3
    # A lost worker is still replaced while the bad value stands.
    del c.objects[("Pod", "job-worker-1")]
    c.converge()
    # Under a fresh name: worker-1 went while listed, so Horovod blacklisted it.
    assert workers_of(c) == ["job-worker-0", "job-worker-2", "job-worker-3"]
    c.set_replicas(2)
    c.converge()
    assert condition(c, "InvalidSpec")["status"] == "False"  # type: ignore[index]
    assert workers_of(c) == ["job-worker-0", "job-worker-2"], "the newest leaves"


def test_new_job_out_of_range_starts_at_the_nearest_bound() -> None:
    c = Cluster(make_job(9, annotations=dict(ELASTIC)))
    c.converge()
    assert len(workers_of(c)) == 5


def test_invalid_spec_touches_no_child() -> None:
    c = started(2)
    c.job["spec"]["slotsPerWorker"] = 0
    p = c.plan()
    assert all(isinstance(a, (WriteStatus,)) or a.__class__.__name__ == "Emit" for a in p.actions)
    c.apply(p)
    cond = condition(c, "InvalidSpec")
    assert cond
    assert "spec.slotsPerWorker" in cond["message"]
    assert c.events[-1].reason == "InvalidSpec"
    # Reconciling again neither repeats the Event nor rewrites the status.
    assert c.plan().actions == ()


def _fail(c: Cluster, name: str, code: int = 1, reason: str = "") -> None:
    pod = c.objects[("Pod", name)]
    pod["status"] = {
        "phase": "Failed",
        "reason": reason,
        "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}],
    }


def test_failed_worker_leaves_discovery_and_is_replaced() -> None:
    c = started(2)
    c.job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    c.converge()
    _fail(c, "job-worker-1")
    p = c.plan()
    assert [d.name for d in p.of_type(DeletePod)] == ["job-worker-1"]
    # The replacement is created at once, beside the failed pod, under a name never used.
    assert [a.obj["metadata"]["name"] for a in p.of_type(Create)] == ["job-worker-2"]
    # What the metrics count of it (machinery/metrics.py): one worker retired, one replaced.
    counted = {e.reason: e.counts for e in p.of_type(Emit)}
    assert counted["WorkerRetired"] == (("retired", 1),)
    assert counted["WorkerReplaced"] == (("replaced", 1),)
    c.apply(p)
    assert discovered(cm(c)) == ["job-worker-0"]
    assert cm(c)["metadata"]["annotations"][names.ANN_RETIRED_WORKERS] == "1"
    c.converge()
    assert discovered(cm(c)) == ["job-worker-0", "job-worker-2"]
    reasons = [e.reason for e in c.events]
    assert "WorkerRetired" in reasons
    assert "WorkerReplaced" in reasons


def test_a_failed_worker_is_reported_once() -> None:
    c = started(2)
    c.job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    c.converge()
    _fail(c, "job-worker-1")
    c.apply(c.plan())
    c.apply(c.plan())  # the cache still shows the pod: no second delete, no second Event
    assert [e.reason for e in c.events].count("WorkerFailed") == 1


def test_min_zero_starts_the_launcher_once_the_workers_exist() -> None:
    c = Cluster(make_job(2, annotations={names.ANN_MIN_REPLICAS: "0"}))
    c.apply(c.plan())
    # The worker creates come first; a launcher never starts beside a create that may fail.
    assert c.get("Pod", "job-launcher") is None
    c.apply(c.plan())
    assert all(p["status"]["phase"] == "Pending" for p in c.pods)
    assert c.get("Pod", "job-launcher") is not None


def test_restart_policies_for_failed_workers() -> None:
    cases = [
        ("Never", 137, "", False),
        ("Never", 1, "Evicted", True),
        ("ExitCode", 1, "", False),
        ("ExitCode", 137, "", True),
        ("Always", 1, "", True),
    ]
    for policy, code, reason, replaced in cases:
        c = started(2)
        c.job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = policy
        c.converge()
        _fail(c, "job-worker-0", code, reason)
        deletes = [d.name for d in c.plan().of_type(DeletePod)]
        assert deletes == (["job-worker-0"] if replaced else []), (policy, code, reason)


def test_launcher_end_decides_the_job_and_clean_pod_policy() -> None:
    for policy, deleted in (("All", 3), ("Running", 2), ("None", 0)):
        c = started(2, runPolicy={"cleanPodPolicy": policy})
        c.objects[("Pod", "job-launcher")]["status"] = {"phase": "Succeeded"}
        p = c.plan()
        assert len(p.of_type(DeletePod)) == deleted, policy
        c.apply(p)
        assert condition(c, "Succeeded")["status"] == "True"  # type: ignore[index]
        assert condition(c, "Running")["status"] == "False"  # type: ignore[index]
        assert c.job["status"]["completionTime"]
        # Finished is final: nothing is recreated, nothing deleted twice.
        c.finalize_deletions()
        p = c.plan()
        assert not p.of_type(Create), policy
        assert not p.of_type(DeletePod), policy


def test_launcher_failure_fails_the_job() -> None:
    c = started(2)
    c.objects[("Pod", "job-launcher")]["status"] = {"phase": "Failed"}
    c.apply(c.plan())
    assert condition(c, "Failed")["status"] == "True"  # type: ignore[index]
    assert [cond["type"] for cond in c.job["status"]["conditions"]][-1] == "Failed"


def test_status_counts_and_selector() -> None:
    c = started(3)
    worker = c.job["status"]["replicaStatuses"]["Worker"]
    assert worker["active"] == 3
    assert worker["selector"] == "group-name=kubeflow.org,mpi-job-name=job,mpi-job-role=worker"


def test_non_elastic_launcher_waits_for_every_worker() -> None:
    c = Cluster(make_job(3))
    c.apply(c.plan())
    pods = c.pods
    pods[0]["status"] = running_status(pods[0])
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is None
    c.run_pods()
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is not None


def test_elastic_launcher_waits_only_for_min() -> None:
    c = Cluster(make_job(3, annotations={names.ANN_MIN_REPLICAS: "1"}))
    c.apply(c.plan())
    c.pods[0]["status"] = running_status(c.pods[0])
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is not None


def test_pods_named_like_workers_of_another_job_are_ignored() -> None:
    c = started(2)
    owner = {"kind": names.KIND, "name": "job", "uid": c.job["metadata"]["uid"], "controller": True}
    stray = {
        "metadata": {
            "name": "job-worker-01",
            "uid": "x",
            "labels": names.labels("job", "worker"),
            "ownerReferences": [owner],
        },
        "status": {"phase": "Running"},
    }
    c.objects[("Pod", "job-worker-01")] = stray
    p = c.plan()
    assert not p.of_type(DeletePod)
    assert "job-worker-01" not in discovered(cm(c))


# -- property: any order of events keeps the safety invariants --------------------------
# Here every plan lands whole on a world the planner sees directly; test_simulation.py runs
# the same invariants against a lagging view, failing writes and restarts.

step = st.one_of(
    st.tuples(st.just("replicas"), st.integers(min_value=-1, max_value=7)),
    st.tuples(st.just("run"), st.just(0)),
    st.tuples(st.just("finalize"), st.just(0)),
    st.tuples(st.just("tick"), st.integers(min_value=1, max_value=40)),
    st.tuples(st.just("fail"), st.integers(min_value=0, max_value=6)),
    st.tuples(st.just("reconcile"), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(step, min_size=1, max_size=40), st.sampled_from(["0", "15"]))
# Workers failing in a row: the job waits out the replacement pause, then converges.
@example(
    steps=[
        ("reconcile", 0),
        ("fail", 0),
        ("fail", 1),
        ("fail", 2),
        ("run", 0),
        ("finalize", 0),
        ("fail", 0),
    ],
    drain="0",
)
# Out-of-range counts while workers fail: the job keeps the count it was last given (it
# used to count the workers it had left, and ended with 1 of 2, or 3 of 5).
@example(
    steps=[
        ("reconcile", 0),
        ("run", 0),
        ("replicas", 0),
        ("reconcile", 0),
        ("fail", 0),
        ("fail", 1),
    ],
    drain="0",
)
@example(steps=[("replicas", 6), ("reconcile", 0), ("fail", 0), ("fail", 1)], drain="0")
# Found by CI's run of perf-latency: every worker failing right after a scale-up.
@example(
    steps=[
        ("replicas", 5),
        ("fail", 0),
        ("run", 0),
        ("fail", 0),
        ("fail", 1),
        ("fail", 2),
        ("fail", 3),
        ("reconcile", 0),
    ],
    drain="0",
)
def test_invariants_under_any_event_order(steps: list[tuple[str, int]], drain: str) -> None:
    c = Cluster(make_job(2, annotations={**ELASTIC, names.ANN_DRAIN_SECONDS: drain}))
    c.job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    blacklisted: set[str] = set()
    # The size the job was last given within its bounds: what it keeps while refusing an
    # out-of-range count (docs/configuration.md), like the admission policy refusing the edit.
    # A job first reconciled with an out-of-range count starts at the nearest bound.
    accepted: int | None = None
    for kind, arg in steps:
        if kind == "replicas":
            c.set_replicas(arg)
        elif kind == "run":
            c.run_pods()
        elif kind == "finalize":
            c.finalize_deletions()
        elif kind == "tick":
            c.tick(arg)
        elif kind == "fail" and ("Pod", f"job-worker-{arg}") in c.objects:
            if f"job-worker-{arg}" in discovered(c.get("ConfigMap", "job-config")):
                blacklisted.add(f"job-worker-{arg}")
            _fail(c, f"job-worker-{arg}", 137)
        else:
            want = c.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
            accepted = want if 1 <= want <= 5 else accepted or min(max(want, 1), 5)
            c.apply(c.plan())
        # Exec before create, hosts within exec rights, deletes only after a full drain
        # out of discovery, no second delete: the world checks each at the write.
        assert c.world.violations == []
        hosts = discovered(c.get("ConfigMap", "job-config"))
        if kind == "reconcile":
            # Right after a reconcile, hosts are only Running pods not being deleted.
            for host in hosts:
                pod = c.get("Pod", host)
                assert pod is not None
                assert pod["status"]["phase"] == "Running"
                assert not pod["metadata"].get("deletionTimestamp")
    # Whatever happened, the job converges to its bounded replicas with nothing extra.
    c.converge(rounds=30)
    want = c.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    # An out-of-range count is never followed: the job keeps the size it was last given.
    kept = accepted or min(max(want, 1), 5)
    assert len(workers_of(c)) == (want if 1 <= want <= 5 else kept), want
    assert not blacklisted & set(workers_of(c)), "a name Horovod blacklisted is back"
    assert discovered(cm(c)) == workers_of(c)
    assert exec_names(c.get("Role", "job-launcher")) == set(workers_of(c))


# -- issue 11 at the planner's level: taken names, who is listed, what a finished job says --


def test_a_worker_name_held_by_someone_else_is_never_granted_nor_waited_on() -> None:
    c = Cluster(make_job(2))
    foreign = {
        "kind": "Pod",
        "metadata": {"name": "job-worker-0", "uid": "foreign", "labels": {}},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }
    c.objects[("Pod", "job-worker-0")] = foreign
    with pytest.raises(ApiError, match="AlreadyExists"):
        c.apply(c.plan())  # the holder of the name is learned from the 409
    for _ in range(3):
        c.run_pods()
        c.apply(c.plan())
    assert c.world.violations == []
    # The job does without the name: it takes the next one instead of waiting for it.
    assert exec_names(c.get("Role", "job-launcher")) == {"job-worker-1", "job-worker-2"}
    assert discovered(cm(c)) == ["job-worker-1", "job-worker-2"]
    assert c.get("Pod", "job-launcher") is not None
    held = "Pod job-worker-0 already exists and is not this job's (no owner): worker name skipped"
    # Long past any retry delay, the condition is still what the foreign pod's presence
    # says: decided from what a read finds each turn, not from a timer.
    for _ in range(3):
        c.tick(60)
        c.apply(c.plan())
        refused = condition(c, "WriteRefused")
        assert refused is not None
        assert (refused["status"], refused["reason"]) == ("True", "AlreadyExists")
        assert held in refused["message"]
    warnings = [e for e in c.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["WriteRefused"]
    assert held in warnings[0].message
    # Nothing was replaced: the skipped name is reported once, as skipped.
    assert not [e for e in c.events if e.reason == "WorkerReplaced"]
    assert c.get("Pod", "job-worker-0") == foreign
    # A new controller remembers nothing, and nothing makes it try the skipped name again:
    # it reads the names the job's status reports held, so the report stays.
    assert held_names(c.job) == {("Pod", "job-worker-0")}
    c.writer = Writer(FakeKube(c.world), lambda _: None)
    for _ in range(2):
        c.tick(60)
        c.apply(c.plan())
        refused = condition(c, "WriteRefused")
        assert refused is not None
        assert refused["status"] == "True"
        assert held in refused["message"]
    assert len([e for e in c.events if e.type == "Warning"]) == 1
    # The holder goes (its delete reaches no cache of ours): the next turn's read sees it.
    del c.objects[("Pod", "job-worker-0")]
    for _ in range(2):
        c.apply(c.plan())
    refused = condition(c, "WriteRefused")
    assert refused is not None
    assert refused["status"] == "False"
    assert exec_names(c.get("Role", "job-launcher")) == {"job-worker-1", "job-worker-2"}


def _main_state(c: Cluster, name: str, state: dict[str, Any], **extra: Any) -> None:
    pod = c.objects[("Pod", name)]
    pod["status"]["containerStatuses"] = [{"name": "main", "state": state, **extra}]


def test_discovery_lists_a_worker_only_while_its_main_container_runs() -> None:
    c = started(3)
    # Restarting after a crash (OnFailure): the pod stays Running, its main container waits.
    _main_state(c, "job-worker-1", {"waiting": {"reason": "CrashLoopBackOff"}})
    # A probe says not ready.
    c.objects[("Pod", "job-worker-2")]["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["true"]}
    }
    _main_state(c, "job-worker-2", {"running": {}}, ready=False)
    p = c.plan()
    # worker-1's ranks died with its container while it was listed: Horovod blacklisted
    # it, so it is replaced under a fresh name. worker-2 only left discovery (graceful).
    assert [d.name for d in p.of_type(DeletePod)] == ["job-worker-1"]
    assert [a.obj["metadata"]["name"] for a in p.of_type(Create)] == ["job-worker-3"]
    c.apply(p)
    assert discovered(cm(c)) == ["job-worker-0"]
    _main_state(c, "job-worker-2", {"running": {}}, ready=True)
    c.finalize_deletions()
    c.converge()
    assert discovered(cm(c)) == ["job-worker-0", "job-worker-2", "job-worker-3"]


def test_a_finished_job_counts_only_the_pods_it_still_has_and_says_so_once() -> None:
    c = started(2, runPolicy={"cleanPodPolicy": "Running"})
    c.objects[("Pod", "job-launcher")]["status"] = {"phase": "Succeeded"}
    c.apply(c.plan())
    c.finalize_deletions()
    for _ in range(3):
        c.apply(c.plan())
    assert c.job["status"]["replicaStatuses"]["Worker"] == {
        "active": 0,
        "succeeded": 0,
        "failed": 0,
        "selector": "group-name=kubeflow.org,mpi-job-name=job,mpi-job-role=worker",
    }
    assert [e.reason for e in c.events].count("MPIJobSucceeded") == 1


def test_an_accepted_delete_whose_pod_stays_is_looked_at_again() -> None:
    c = started(2, annotations={**ELASTIC, names.ANN_DRAIN_SECONDS: "0"})
    # No running launcher, so no watch of its ranks brings the job back either.
    c.objects[("Pod", "job-launcher")]["status"] = {"phase": "Pending"}
    c.set_replicas(1)
    victim = c.get("Pod", "job-worker-1")
    assert victim is not None
    accepted = dataclasses.replace(c.observed(), deleting=frozenset({victim["metadata"]["uid"]}))
    p = plan_writes(accepted, SETTINGS, c.now)
    assert not p.of_type(DeletePod)
    # Not left to another event: once the acceptance is forgotten, the delete is planned again.
    assert p.requeue_after == DELETE_MEMORY_SECONDS
    assert [d.name for d in c.plan().of_type(DeletePod)] == ["job-worker-1"]


def test_a_taken_name_is_reported_even_when_its_holder_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped role has no `get` on ConfigMaps: the 409 alone must reach the user."""
    c = Cluster(make_job(2))
    c.objects[("ConfigMap", "job-config")] = {
        "kind": "ConfigMap",
        "metadata": {"name": "job-config", "uid": "foreign", "labels": {}},
        "data": {},
    }

    def forbidden(kind: str, name: str) -> dict[str, Any]:
        raise ApiError(403, "Forbidden", f'cannot get resource "{kind.lower()}s"')

    monkeypatch.setattr(c.world, "get", forbidden)
    with pytest.raises(ApiError, match="AlreadyExists"):
        c.apply(c.plan())
    c.apply(c.plan())
    refused = condition(c, "WriteRefused")
    assert refused is not None
    assert refused["reason"] == "AlreadyExists"
    assert refused["message"].startswith(
        "ConfigMap job-config already exists and is not this job's (owner unknown: it could "
        "not be read (403 Forbidden"
    )
    assert refused["message"].endswith(
        "the job waits: no launcher starts until it is renamed or removed"
    )
    assert c.get("Pod", "job-launcher") is None


def test_the_ranks_configmap_is_created_granted_and_emptied_before_a_new_launcher() -> None:
    c = started(2)
    ranks = c.get("ConfigMap", "job-ranks")
    assert ranks is not None
    assert not ranks.get("data")
    assert ranks["metadata"]["ownerReferences"][0]["name"] == "job"
    role = c.get("Role", "job-launcher")
    assert role is not None
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "patch"],
        "resourceNames": ["job-ranks"],
    } in role["rules"]
    # The launcher reported; then its pod is gone (its node went) and a new one is made.
    ranks["data"] = {"job-worker-0_12_34": "start"}
    c.world.vanish_now("job-launcher")
    p = c.plan()
    writes = [
        (type(a).__name__, a.obj["kind"], a.obj["metadata"]["name"])
        for a in p.actions
        if isinstance(a, Create | Replace)
    ]
    assert ("Create", "Pod", "job-launcher") in writes
    emptied = writes.index(("Replace", "ConfigMap", "job-ranks"))
    assert emptied < writes.index(("Create", "Pod", "job-launcher"))
    replaced = next(
        a.obj
        for a in p.actions
        if isinstance(a, Replace) and a.obj["metadata"]["name"] == "job-ranks"
    )
    assert "data" not in replaced


def test_a_foreign_ranks_configmap_is_never_granted_to_the_launcher() -> None:
    c = Cluster(make_job(2, annotations=dict(ELASTIC)))
    c.objects[("ConfigMap", "job-ranks")] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "job-ranks",
            "namespace": "ns",
            "uid": "someone",
            "resourceVersion": "1",
        },
        "data": {"theirs": "x"},
    }
    for _ in range(10):
        c.run_pods()
        # The create of job-ranks is answered 409: that turn fails, the next knows why.
        with contextlib.suppress(ApiError):
            c.apply(c.plan())
    role = c.get("Role", "job-launcher")
    assert role is not None
    assert all("configmaps" not in r["resources"] for r in role["rules"])
    assert c.get("Pod", "job-launcher") is not None
    theirs = c.get("ConfigMap", "job-ranks")
    assert theirs is not None
    assert theirs["data"] == {"theirs": "x"}


@pytest.mark.parametrize(
    ("error", "type_", "reason", "event"),
    [
        (
            ApiError(403, "Forbidden", 'pods "job-worker-1" is forbidden: exceeded quota'),
            "WriteRefused",
            "Forbidden",
            "WriteRefused",
        ),
        (
            ApiError(422, "Invalid", "spec.containers[0].image: Required value"),
            "InvalidSpec",
            "PodTemplateRejected",
            "PodTemplateRejected",
        ),
    ],
)
def test_a_refused_write_is_reported_by_the_core_once(
    monkeypatch: pytest.MonkeyPatch, error: ApiError, type_: str, reason: str, event: str
) -> None:
    """The writer only remembers the server's refusal; the next turn's desired() sets the
    condition quoting the server, and its Event goes out once though the write is refused
    on every turn."""
    c = started(1)
    create = c.world.create

    def refuse(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Pod" and obj["metadata"]["name"] == "job-worker-1":
            raise error
        return create(obj)

    monkeypatch.setattr(c.world, "create", refuse)
    c.set_replicas(2)
    for _ in range(3):
        with pytest.raises(ApiError):
            c.apply(c.plan())
    assert c.observed().refused is not None
    cond = condition(c, type_)
    assert cond is not None
    assert cond["status"] == "True"
    assert cond["reason"] == reason
    assert error.message in cond["message"]
    if type_ == "WriteRefused":
        assert cond["message"].startswith("create Pod job-worker-1: ")
    said = [e for e in c.events if e.reason == event]
    assert len(said) == 1
    assert said[0].type == "Warning"
    assert said[0].message == cond["message"]
    # The cause removed: the writes go through, the memory forgets, the condition clears.
    monkeypatch.setattr(c.world, "create", create)
    c.converge()
    assert c.observed().refused is None
    cleared = condition(c, type_)
    assert cleared is not None
    assert cleared["status"] == "False"
    assert len([e for e in c.events if e.reason == event]) == 1


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("ConfigMap", "job-config"),
        ("Role", "job-launcher"),
        ("RoleBinding", "job-launcher"),
        ("Pod", "job-launcher"),
        ("PodDisruptionBudget", "job-workers"),
    ],
)
def test_any_other_name_held_by_someone_else_is_waited_for_while_held(kind: str, name: str) -> None:
    """Issue 20 §2: a name that cannot be skipped is waited for: no launcher, the condition
    and one Warning naming the holder's owner and saying the job waits, for as long as the
    holder is there; then the job makes its own and starts."""
    c = Cluster(make_job(2, annotations=ELASTIC))
    c.objects[(kind, name)] = {
        "kind": kind,
        "metadata": {
            "name": name,
            "uid": "foreign",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "controller": True}],
        },
        **({"status": {"phase": "Running"}} if kind == "Pod" else {}),
    }
    refused_creates = []
    for _ in range(3):
        c.run_pods()
        try:
            c.apply(c.plan())
        except ApiError as err:
            refused_creates.append(err.reason)
    assert refused_creates == ["AlreadyExists"]  # learned once, then left alone
    held = (
        f"{kind} {name} already exists and is not this job's (owner ReplicaSet/web): "
        "the job waits: no launcher starts until it is renamed or removed"
    )
    for _ in range(3):
        c.tick(60)
        c.run_pods()
        c.apply(c.plan())
        refused = condition(c, "WriteRefused")
        assert refused is not None
        assert (refused["status"], refused["message"]) == ("True", held)
        launcher = c.get("Pod", "job-launcher")
        assert launcher is None or launcher["metadata"]["uid"] == "foreign"
    assert [e.message for e in c.events if e.type == "Warning"] == [held]
    assert c.objects[(kind, name)]["metadata"]["uid"] == "foreign"
    del c.objects[(kind, name)]
    # The Role, then its binding, then the launcher and its first turns: a few turns.
    for _ in range(6):
        c.run_pods()
        c.apply(c.plan())
    refused = condition(c, "WriteRefused")
    assert refused is not None
    assert refused["status"] == "False"
    launcher = c.get("Pod", "job-launcher")
    assert launcher is not None
    assert launcher["metadata"]["uid"] != "foreign"
