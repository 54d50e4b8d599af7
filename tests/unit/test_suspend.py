"""Below the minimum (issue 13, part 3): a running elastic job that has had fewer than
min-replicas workers listed for its below-min timeout is suspended, probes for capacity
with its own workers, and resumes by itself; and its PodDisruptionBudget (part 1) keeps
voluntary disruptions above min-replicas while it runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Create, DeleteObject, DeletePod
from mpijob_elastic.core.outputs.status import StatusBuilder
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from tests.unit.simulation import SETTINGS, Cluster, make_job

BUDGET = ("PodDisruptionBudget", "job-workers")


def elastic_job(scale_out_timeout: str | None = None, checkpoint: str = "0") -> Cluster:
    """No checkpoint window by default: the window is tested in test_notices.py."""
    annotations = {
        names.ANN_MIN_REPLICAS: "2",
        names.ANN_MAX_REPLICAS: "8",
        names.ANN_BELOW_MIN_TIMEOUT: "30",
        names.ANN_CHECKPOINT_SECONDS: checkpoint,
    }
    if scale_out_timeout is not None:
        annotations[names.ANN_SCALE_OUT_TIMEOUT] = scale_out_timeout
    c = Cluster(make_job(3, annotations=annotations))
    c.converge()
    return c


def condition(c: Cluster, type_: str) -> dict[str, Any]:
    return next(x for x in c.job["status"]["conditions"] if x["type"] == type_)


def cm_annotations(c: Cluster) -> dict[str, str]:
    cm = c.get("ConfigMap", "job-config")
    assert cm is not None
    return dict(cm["metadata"].get("annotations") or {})


def pod_names(c: Cluster, *, alive: bool = True) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in c.pods
        if not (alive and p["metadata"].get("deletionTimestamp"))
    )


def created_pods(c: Cluster) -> list[str]:
    return [a.obj["metadata"]["name"] for a in c.plan().of_type(Create) if a.obj["kind"] == "Pod"]


def lose(c: Cluster, *indexes: int) -> None:
    """Workers evicted with their node; their replacements find no capacity (they stay
    Pending: this test never starts them)."""
    for i in indexes:
        c.world.fail(f"job-worker-{i}", 137, "Evicted")
    c.apply(c.plan())
    c.finalize_deletions()
    c.apply(c.plan())


# -- the PodDisruptionBudget ---------------------------------------------------------------


def test_an_elastic_job_has_a_budget_at_min_replicas_that_follows_the_bounds() -> None:
    c = elastic_job()
    budget = c.get(*BUDGET)
    assert budget is not None
    assert budget["spec"] == {
        "minAvailable": 2,
        # Only the workers that hold ranks count (host_rules.py).
        "selector": {
            "matchLabels": {
                **names.labels("job", names.ROLE_WORKER),
                names.LABEL_HOLDS_RANKS: "true",
            }
        },
        # A Pending or crash-looping worker holds no rank and must not block a drain.
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    c.job["metadata"]["annotations"][names.ANN_MIN_REPLICAS] = "1"
    c.converge()
    budget = c.get(*BUDGET)
    assert budget is not None
    assert budget["spec"]["minAvailable"] == 1
    # No longer elastic: the budget goes (a v1 job cannot lose a worker gracefully anyway).
    del c.job["metadata"]["annotations"][names.ANN_MIN_REPLICAS]
    del c.job["metadata"]["annotations"][names.ANN_BELOW_MIN_TIMEOUT]
    deletes = c.plan().of_type(DeleteObject)
    assert [(d.kind, d.name) for d in deletes] == [BUDGET]
    c.converge()
    assert c.get(*BUDGET) is None


def test_a_v1_job_has_no_budget() -> None:
    c = Cluster(make_job(2))
    c.converge()
    assert c.get(*BUDGET) is None


def test_a_finished_job_drops_its_budget() -> None:
    c = elastic_job()
    c.world.fail("job-launcher", 1)
    c.converge()
    assert condition(c, "Failed")["status"] == "True"
    assert c.get(*BUDGET) is None


# -- below the minimum ---------------------------------------------------------------------


def test_below_the_minimum_for_the_timeout_suspends_the_job() -> None:
    c = elastic_job()
    lose(c, 1, 2)
    since = cm_annotations(c)[names.ANN_BELOW_MIN_SINCE]
    c.tick(29)
    c.apply(c.plan())
    assert not c.plan().of_type(DeletePod), "not before the timeout"
    assert cm_annotations(c)[names.ANN_BELOW_MIN_SINCE] == since, "the clock is not reset"
    c.tick(1)
    p = c.plan()
    doomed = sorted(d.name for d in p.of_type(DeletePod))
    assert doomed == ["job-launcher", "job-worker-0", "job-worker-3", "job-worker-4"]
    assert [(d.kind, d.name) for d in p.of_type(DeleteObject)] == [BUDGET]
    c.apply(p)
    suspended = condition(c, "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "WaitingForCapacity")
    assert "only 1 of the min-replicas 2 workers were listed for 30s" in suspended["message"]
    assert condition(c, "Running")["status"] == "False"
    assert c.job["status"]["conditions"][-1]["type"] == "Suspended", "kubectl shows it"
    assert any(e.reason == "Suspended" and e.type == "Warning" for e in c.events)
    # The job, its ConfigMap and RBAC stay; nothing is listed.
    for kind, name in (
        ("ConfigMap", "job-config"),
        ("Role", "job-launcher"),
        ("RoleBinding", "job-launcher"),
        ("ServiceAccount", "job-launcher"),
    ):
        assert c.get(kind, name) is not None
    cm = c.get("ConfigMap", "job-config")
    assert cm is not None
    assert "echo" not in cm["data"][names.DISCOVER_HOSTS]
    assert names.ANN_SUSPENDED in cm_annotations(c)


def test_a_suspended_job_probes_with_its_workers_and_resumes_when_min_run() -> None:
    c = elastic_job()
    lose(c, 1, 2)
    c.tick(30)
    c.apply(c.plan())
    c.finalize_deletions()
    # The probe: its workers, at once, so an autoscaler sees Pending pods to make room for.
    # A new launcher is a new Horovod job, so the names start afresh.
    assert created_pods(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]
    c.apply(c.plan())
    c.world.start("job-worker-0")
    c.apply(c.plan())
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is None, "one worker is below the minimum"
    c.world.start("job-worker-1")
    c.apply(c.plan())
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is not None, "resumed with min-replicas running"
    resumed = condition(c, "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    assert any(e.reason == "Resumed" for e in c.events)
    assert names.ANN_SUSPENDED not in cm_annotations(c)
    c.converge()
    assert c.job["status"]["conditions"][-1]["type"] == "Running"
    assert condition(c, "Running")["status"] == "True"
    assert c.get(*BUDGET) is not None


def probing(scale_out_timeout: str) -> Cluster:
    """A job suspended for capacity, its first attempt's workers created (Pending)."""
    c = elastic_job(scale_out_timeout=scale_out_timeout)
    lose(c, 1, 2)
    c.tick(30)
    c.apply(c.plan())
    c.finalize_deletions()
    c.apply(c.plan())
    return c


def attempt_ends(c: Cluster, doomed: list[str], settings: Settings = SETTINGS) -> None:
    """The attempt's timeout: ``doomed`` deleted, and the next attempt after a backoff."""
    p = c.plan(settings)
    assert sorted(d.name for d in p.of_type(DeletePod)) == doomed
    c.apply(p)
    c.finalize_deletions()
    assert cm_annotations(c)[names.ANN_SCALE_OUT_BACKOFF].startswith("1 ")
    assert "(attempt 2)" in condition(c, "Suspended")["message"]


def test_a_failed_probe_releases_every_worker_and_backs_off() -> None:
    c = probing("10")
    c.world.start("job-worker-0")  # one runs: below the minimum, it would idle its GPUs
    c.apply(c.plan())
    c.tick(10)
    attempt_ends(c, ["job-worker-0", "job-worker-1", "job-worker-2"])
    message = condition(c, "Suspended")["message"]
    assert "fewer than min-replicas 2 workers ran within 10s" in message
    c.apply(c.plan())
    assert created_pods(c) == [], "nothing until the backoff is over"
    assert c.get("Pod", "job-launcher") is None
    c.tick(10)
    assert created_pods(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]


# Under a gang the launcher is one of the gang (minMember counts it), so an attempt to
# resume makes it with the attempt's workers; the job still resumes only once its minimum
# runs, and an attempt that never runs ends by its own timeout.
GANG = Settings(gang_scheduler_name="scheduler-plugins")


def gang_probing(scale_out_timeout: str) -> Cluster:
    c = elastic_job(scale_out_timeout=scale_out_timeout)
    for i in (1, 2):
        c.world.fail(f"job-worker-{i}", 137, "Evicted")
    for _ in range(2):
        c.apply(c.plan(GANG))
        c.finalize_deletions()
    c.tick(30)
    for _ in range(3):
        c.apply(c.plan(GANG))
        c.finalize_deletions()
    return c


def test_under_a_gang_a_suspended_job_is_made_whole_and_resumes_when_min_run() -> None:
    c = gang_probing("60")
    assert pod_names(c) == ["job-launcher", "job-worker-0", "job-worker-1", "job-worker-2"]
    assert names.ANN_SUSPENDED in cm_annotations(c), "made is not resumed"
    assert condition(c, "Suspended")["status"] == "True"
    assert not any(e.reason == "Resumed" for e in c.events)
    c.world.start("job-worker-0")
    c.world.start("job-worker-1")
    for _ in range(2):
        c.apply(c.plan(GANG))
    resumed = condition(c, "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    assert "2 workers run, at least min-replicas 2: its launcher was made" in resumed["message"]
    assert names.ANN_SUSPENDED not in cm_annotations(c)
    assert [e.reason for e in c.events].count("Resumed") == 1


def test_under_a_gang_an_attempt_that_never_runs_ends_by_its_timeout_and_backs_off() -> None:
    c = gang_probing("10")
    c.tick(10)
    attempt_ends(c, ["job-launcher", "job-worker-0", "job-worker-1", "job-worker-2"], GANG)
    # Not suspended again by the below-minimum clock, which would tear the gang down and
    # make it again every below-min-timeout, whatever the backoff.
    assert [e.reason for e in c.events].count("Suspended") == 1
    c.tick(5)
    c.apply(c.plan(GANG))
    assert pod_names(c) == [], "nothing until the backoff is over"


def test_editing_a_suspended_job_is_a_new_attempt_at_once() -> None:
    c = probing("10")
    c.tick(10)
    c.apply(c.plan())
    c.finalize_deletions()
    assert created_pods(c) == []
    c.job["metadata"]["annotations"][names.ANN_MIN_REPLICAS] = "1"
    assert created_pods(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]


def test_a_recovered_job_forgets_the_clock() -> None:
    c = elastic_job()
    lose(c, 1, 2)
    assert names.ANN_BELOW_MIN_SINCE in cm_annotations(c)
    c.tick(20)
    c.converge()  # capacity came back before the timeout
    assert names.ANN_BELOW_MIN_SINCE not in cm_annotations(c)
    assert c.get("Pod", "job-launcher") is not None
    assert not any(x["type"] == "Suspended" for x in c.job["status"]["conditions"])


def test_without_the_annotation_a_job_below_the_minimum_is_never_suspended() -> None:
    c = elastic_job()
    del c.job["metadata"]["annotations"][names.ANN_BELOW_MIN_TIMEOUT]
    lose(c, 1, 2)
    c.tick(3600)
    c.apply(c.plan())
    assert c.get("Pod", "job-launcher") is not None
    assert names.ANN_BELOW_MIN_SINCE not in cm_annotations(c)


def test_the_timeout_needs_a_minimum() -> None:
    job = make_job(2, annotations={names.ANN_BELOW_MIN_TIMEOUT: "30"})
    with pytest.raises(InvalidSpec, match=r"below-min-timeout-seconds\]: needs"):
        parse(job, 30.0)


def test_a_resumed_job_shows_its_lifecycle_not_the_old_suspension() -> None:
    def last(status: str) -> str:
        job = {
            "status": {
                "conditions": [
                    {"type": "Running", "status": "True"},
                    {"type": "Suspended", "status": status},
                ]
            }
        }
        built = StatusBuilder(job, datetime(2026, 1, 1, tzinfo=UTC)).build()
        return str(built["conditions"][-1]["type"])

    assert last("True") == "Suspended"
    assert last("False") == "Running"


# -- runPolicy.suspend ---------------------------------------------------------------------


def set_suspend(c: Cluster, value: object) -> None:
    c.job["spec"]["runPolicy"] = {"suspend": value}
    c.job["metadata"]["generation"] += 1


def test_run_policy_suspend_stops_the_pods_and_false_starts_again() -> None:
    c = elastic_job()
    set_suspend(c, True)
    p = c.plan()
    doomed = sorted(d.name for d in p.of_type(DeletePod))
    assert doomed == ["job-launcher", "job-worker-0", "job-worker-1", "job-worker-2"]
    c.converge()
    assert pod_names(c, alive=False) == []
    suspended = condition(c, "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "MPIJobSuspended")
    assert condition(c, "Running")["status"] == "False"
    assert c.get(*BUDGET) is None
    assert c.get("ConfigMap", "job-config") is not None
    assert c.get("Role", "job-launcher") is not None
    set_suspend(c, False)
    c.converge()
    assert pod_names(c) == ["job-launcher", "job-worker-0", "job-worker-1", "job-worker-2"]
    resumed = condition(c, "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "MPIJobResumed")
    assert c.job["status"]["conditions"][-1]["type"] == "Running"
    assert [e.reason for e in c.events if e.reason.startswith("MPIJob")][-2:] == [
        "MPIJobSuspended",
        "MPIJobResumed",
    ]


def test_a_job_created_suspended_starts_nothing() -> None:
    job = make_job(2)
    job["spec"]["runPolicy"] = {"suspend": True}
    c = Cluster(job)
    c.converge()
    assert pod_names(c, alive=False) == []
    assert condition(c, "Suspended")["status"] == "True"


def test_run_policy_suspend_must_be_a_boolean() -> None:
    job = make_job(2)
    job["spec"]["runPolicy"] = {"suspend": "yes"}
    with pytest.raises(InvalidSpec, match=r"spec.runPolicy.suspend: must be true or false"):
        parse(job, 30.0)
