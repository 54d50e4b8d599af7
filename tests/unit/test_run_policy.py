"""runPolicy honoured as training-operator 1.9 does (issue 7, part 4): the active deadline,
the TTL after finishing, launcher restarts bounded by backoffLimit, a pause before
replacing workers that keep failing, and a warning for gang scheduling."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Create, DeleteObject, DeletePod, WriteStatus
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.times import parse_time
from tests.unit.simulation import Cluster, make_job


def job_with(
    run_policy: dict[str, Any] | None = None,
    launcher_restart: str | None = None,
    worker_restart: str | None = None,
) -> Cluster:
    job = make_job(2, annotations={names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "4"})
    if run_policy is not None:
        job["spec"]["runPolicy"] = run_policy
    specs = job["spec"]["mpiReplicaSpecs"]
    if launcher_restart is not None:
        specs["Launcher"]["restartPolicy"] = launcher_restart
    if worker_restart is not None:
        specs["Worker"]["restartPolicy"] = worker_restart
    c = Cluster(job)
    c.converge()
    return c


def condition(c: Cluster, type_: str) -> dict[str, Any]:
    return next(x for x in c.job["status"]["conditions"] if x["type"] == type_)


def alive(c: Cluster) -> list[str]:
    return sorted(
        p["metadata"]["name"] for p in c.pods if not p["metadata"].get("deletionTimestamp")
    )


def created_pods(c: Cluster) -> list[str]:
    return [a.obj["metadata"]["name"] for a in c.plan().of_type(Create) if a.obj["kind"] == "Pod"]


# -- activeDeadlineSeconds and ttlSecondsAfterFinished --------------------------------------


def test_past_the_active_deadline_the_job_fails_and_its_pods_are_cleaned_up() -> None:
    c = job_with({"cleanPodPolicy": "Running"})
    start = parse_time(c.job["status"]["startTime"])
    assert start is not None
    ran = int((c.now - start).total_seconds())
    c.job["spec"]["runPolicy"]["activeDeadlineSeconds"] = ran + 60
    c.tick(30)
    c.apply(c.plan())
    assert condition(c, "Running")["status"] == "True"
    c.tick(30)
    c.converge()
    failed = condition(c, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "MPIJobFailed")
    assert failed["message"] == (
        "Job job has failed because it was active longer than specified deadline"
    )
    assert c.job["status"]["conditions"][-1]["type"] == "Failed"
    assert alive(c) == []
    assert c.job["status"]["completionTime"]


def test_a_finished_job_is_deleted_after_its_ttl() -> None:
    c = job_with({})
    c.world.fail("job-launcher", 0)
    c.objects[("Pod", "job-launcher")]["status"]["phase"] = "Succeeded"
    c.converge()
    assert condition(c, "Succeeded")["status"] == "True"
    c.job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 100
    done = parse_time(c.job["status"]["completionTime"])
    assert done is not None
    c.now = done + timedelta(seconds=99)
    waiting = c.plan()
    assert not waiting.of_type(DeleteObject)
    assert waiting.requeue_after == pytest.approx(1), "comes back when the TTL is over"
    c.tick(1)
    p = c.plan()
    assert [(d.kind, d.name, d.uid) for d in p.of_type(DeleteObject)] == [
        (names.KIND, "job", "job-uid")
    ]
    assert not p.of_type(WriteStatus), "no status write after the job's delete"


def test_gang_scheduling_is_reported_as_unsupported() -> None:
    c = job_with({"schedulingPolicy": {"minAvailable": 3}})
    unsupported = condition(c, "Unsupported")
    assert (unsupported["status"], unsupported["reason"]) == ("True", "SchedulingPolicyIgnored")
    assert [e.type for e in c.events if e.reason == "SchedulingPolicyIgnored"] == ["Warning"]
    del c.job["spec"]["runPolicy"]["schedulingPolicy"]
    c.converge()
    assert condition(c, "Unsupported")["status"] == "False"


@pytest.mark.parametrize(
    ("field", "value"),
    [("activeDeadlineSeconds", 0), ("backoffLimit", -1), ("ttlSecondsAfterFinished", True)],
)
def test_bad_run_policy_numbers_name_the_field(field: str, value: object) -> None:
    job = make_job(2)
    job["spec"]["runPolicy"] = {field: value}
    with pytest.raises(InvalidSpec, match=rf"spec.runPolicy.{field}: must be a whole number"):
        parse(job, 30.0)


# -- launcher restarts -----------------------------------------------------------------------


def test_an_evicted_launcher_is_restarted_until_the_backoff_limit() -> None:
    c = job_with({"backoffLimit": 1}, launcher_restart="OnFailure")
    c.world.fail("job-launcher", 137, "Evicted")
    p = c.plan()
    assert [d.name for d in p.of_type(DeletePod)] == ["job-launcher"]
    c.apply(p)
    restarting = condition(c, "Restarting")
    assert restarting["status"] == "True"
    assert "its node stopped it (Evicted) (restart 1 of at most 1)" in restarting["message"]
    assert condition(c, "Running")["status"] == "False"
    c.converge()
    assert "job-launcher" in alive(c), "a new launcher"
    assert condition(c, "Running")["status"] == "True"
    assert condition(c, "Restarting")["status"] == "False"
    assert c.job["status"]["elastic"]["launcherRestarts"] == 1
    assert not any(x["type"] == "Failed" for x in c.job["status"]["conditions"])
    # The workers stayed through it.
    assert {"job-worker-0", "job-worker-1"} <= set(alive(c))
    c.world.fail("job-launcher", 137, "Evicted")
    c.converge()
    failed = condition(c, "Failed")
    assert "reached the specified backoff limit" in failed["message"]


def test_a_launcher_whose_node_vanished_is_started_again() -> None:
    c = job_with(launcher_restart="ExitCode")
    c.world.vanish_now("job-launcher")
    c.converge()
    assert "job-launcher" in alive(c)
    assert c.job["status"]["elastic"]["launcherRestarts"] == 1
    assert condition(c, "Running")["status"] == "True"


@pytest.mark.parametrize(
    ("policy", "code", "restarts"),
    [("ExitCode", 137, True), ("ExitCode", 1, False), ("Never", 137, False)],
)
def test_which_launcher_failures_restart(policy: str, code: int, restarts: bool) -> None:
    c = job_with(launcher_restart=policy)
    c.world.fail("job-launcher", code)
    c.converge()
    failed = any(
        x["type"] == "Failed" and x["status"] == "True" for x in c.job["status"]["conditions"]
    )
    assert failed is not restarts


def disrupt(c: Cluster, name: str, code: int, *, delete: bool) -> None:
    """What an eviction does to a pod: DisruptionTarget, then (deleted) SIGTERM, on which
    horovodrun exits 1."""
    pod = c.world.objects[("Pod", name)]
    pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    if delete:
        pod["metadata"]["deletionTimestamp"] = c.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = pod["status"]["conditions"]
    c.world.fail(name, code)
    c.world.objects[("Pod", name)]["status"]["conditions"] = conditions


@pytest.mark.parametrize("policy", ["ExitCode", "Never", "OnFailure"])
@pytest.mark.parametrize("delete", [True, False])
def test_a_launcher_ended_by_a_disruption_does_not_fail_the_job(policy: str, delete: bool) -> None:
    c = job_with(launcher_restart=policy)
    disrupt(c, "job-launcher", 1, delete=delete)
    c.apply(c.plan())
    assert not any(
        x["type"] == "Failed" and x["status"] == "True" for x in c.job["status"]["conditions"]
    )
    # The driver is gone: no worker is listed as training.
    assert c.job["status"]["elastic"]["listed"] == 0
    if delete:
        c.world.vanish("job-launcher")
    c.converge()
    assert "job-launcher" in alive(c), "a new launcher"
    assert condition(c, "Running")["status"] == "True"
    assert c.job["status"]["elastic"]["listed"] == 2


def test_a_failed_launcher_lists_no_worker() -> None:
    c = job_with(launcher_restart="ExitCode")
    c.world.fail("job-launcher", 1)
    c.converge()
    assert condition(c, "Failed")["status"] == "True"
    assert c.job["status"]["elastic"]["listed"] == 0


# -- worker replacement backoff ----------------------------------------------------------------


def test_a_worker_that_keeps_failing_is_replaced_after_a_growing_pause() -> None:
    c = job_with(worker_restart="ExitCode")
    c.world.fail("job-worker-1", 137)  # OOM-killed
    p = c.plan()
    assert [d.name for d in p.of_type(DeletePod)] == ["job-worker-1"]
    assert created_pods(c) == ["job-worker-2"], "the first failure is replaced at once"
    c.converge()
    assert c.job["status"]["elastic"]["workerFailures"] == 1
    c.world.fail("job-worker-2", 137)
    c.apply(c.plan())
    c.finalize_deletions()
    assert created_pods(c) == [], "the second waits"
    assert c.job["status"]["elastic"]["workerFailures"] == 2
    c.tick(9)
    assert created_pods(c) == []
    c.tick(1)
    assert created_pods(c) == ["job-worker-3"]


def test_evictions_do_not_count_as_worker_failures() -> None:
    c = job_with(worker_restart="ExitCode")
    for name in ("job-worker-1", "job-worker-2", "job-worker-3"):
        c.world.fail(name, 137, "Evicted")
        assert len(created_pods(c)) == 1, "replaced at once"
        c.converge()
    assert "workerFailures" not in c.job["status"]["elastic"]


def test_a_worker_evicted_while_listed_is_not_said_to_have_lost_its_ranks() -> None:
    c = job_with()
    pod = c.world.objects[("Pod", "job-worker-1")]
    pod["metadata"]["deletionTimestamp"] = c.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    c.apply(c.plan())
    retired = [e for e in c.events if e.reason == "WorkerRetired"]
    assert len(retired) == 1
    assert retired[0].type == "Normal"
    assert "job-worker-1 are being deleted while listed" in retired[0].message
    assert "lost" not in retired[0].message
    c.world.vanish_now("job-worker-0")
    c.apply(c.plan())
    lost = [e for e in c.events if e.reason == "WorkerRetired"][-1]
    assert lost.type == "Warning"
    assert "job-worker-0 lost their ranks" in lost.message
