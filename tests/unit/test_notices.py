"""Notices to the training (issue 22): which notice each pod carries, when it is posted and
cleared, the checkpoint window before a suspension below the minimum, and the file the
pods get it in."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import AnnotatePod, DeletePod, Emit, Writes
from mpijob_elastic.core.lifecycle.notices import format_notice, parse_notice
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.spec.model import DEFAULT_CHECKPOINT_SECONDS
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.times import format_time
from tests.unit.simulation import SETTINGS, Cluster, discovered, make_job

T = datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)


def notice(c: Cluster, pod: str) -> str | None:
    obj = c.get("Pod", pod)
    assert obj is not None
    return (obj["metadata"].get("annotations") or {}).get(names.ANN_NOTICE)


def notices(c: Cluster) -> dict[str, str | None]:
    return {p["metadata"]["name"]: notice(c, p["metadata"]["name"]) for p in c.pods}


def notice_writes(p: Writes) -> dict[str, str | None]:
    (phase,) = [ph for ph in p.phases if ph.step == "notices"]
    found = {}
    for a in phase.writes:
        assert isinstance(a, AnnotatePod)
        found[a.name] = a.annotations[names.ANN_NOTICE]
    return found


def test_the_format_is_one_line_that_reads_back() -> None:
    text = format_notice("job-stopping", T, "below-min", "only 1 of 2 workers")
    assert text == "job-stopping 2026-01-01T00:01:30Z below-min only 1 of 2 workers"
    assert parse_notice(text) == ("job-stopping", T, "below-min", "only 1 of 2 workers")
    assert parse_notice("worker-leaving 2026-01-01T00:01:30Z scale-in") == (
        "worker-leaving",
        T,
        "scale-in",
        "",
    )
    assert parse_notice("junk") is None
    assert parse_notice("job-stopping yesterday below-min") is None
    assert parse_notice(None) is None


# -- a worker leaving ---------------------------------------------------------------------


def elastic(replicas: int, **annotations: str) -> Cluster:
    c = Cluster(
        make_job(
            replicas,
            annotations={
                names.ANN_MIN_REPLICAS: "1",
                names.ANN_MAX_REPLICAS: "5",
                names.ANN_DRAIN_SECONDS: "20",
                **annotations,
            },
        )
    )
    c.converge()
    return c


def test_a_scale_in_victim_gets_its_notice_before_it_is_unlisted_and_keeps_its_deadline() -> None:
    c = elastic(3)
    assert all(v is None for v in notices(c).values())
    c.set_replicas(2)
    p = c.plan()
    steps = [ph.step for ph in p.phases]
    assert steps.index("notices") < steps.index("ConfigMap")
    deadline = format_time(c.now + timedelta(seconds=20))
    assert notice_writes(p) == {
        "job-worker-2": f"worker-leaving {deadline} scale-in this worker is removed from the job"
    }
    c.apply(p)
    assert "job-worker-2" not in discovered(c.get("ConfigMap", "job-config"))
    # Later turns keep it as it is: the deadline the training read does not move.
    c.tick(2)
    c.apply(c.plan())
    assert str(notice(c, "job-worker-2")).startswith(f"worker-leaving {deadline} scale-in")
    assert notice(c, "job-worker-0") is None
    assert notice(c, "job-launcher") is None


def test_a_terminating_pod_keeps_the_notice_it_was_given() -> None:
    c = elastic(3)
    c.set_replicas(2)
    c.apply(c.plan())
    text = notice(c, "job-worker-2")
    pod = c.get("Pod", "job-worker-2")
    assert pod is not None
    pod["metadata"]["deletionTimestamp"] = format_time(c.now + timedelta(seconds=30))
    p = c.plan()
    assert "notices" not in [ph.step for ph in p.phases], "no second notice for its delete"
    c.apply(p)
    assert notice(c, "job-worker-2") == text


def test_a_victim_taken_back_loses_its_notice() -> None:
    c = elastic(3)
    c.set_replicas(2)
    c.apply(c.plan())
    assert notice(c, "job-worker-2") is not None
    c.set_replicas(3)
    p = c.plan()
    assert notice_writes(p) == {"job-worker-2": None}
    c.apply(p)
    assert notice(c, "job-worker-2") is None


def on_nodes(c: Cluster) -> None:
    for i, pod in enumerate(p for p in c.pods if "-worker-" in p["metadata"]["name"]):
        pod["spec"]["nodeName"] = f"n{i}"
    launcher = c.get("Pod", "job-launcher")
    assert launcher is not None
    launcher["spec"]["nodeName"] = "ln"


def test_a_worker_on_a_going_node_is_noticed_and_cleared_when_the_node_stays() -> None:
    c = elastic(3)
    on_nodes(c)
    observed = dataclasses.replace(c.observed(), leaving_nodes={"n1": "cordoned"})
    p = plan_writes(observed, SETTINGS, c.now)
    (text,) = notice_writes(p).values()
    assert notice_writes(p).keys() == {"job-worker-1"}
    assert text is not None
    assert text.startswith("worker-leaving ")
    assert text.endswith("node-leaving its node n1 is cordoned")
    c.apply(p)
    # Uncordoned before anything happened: the notice goes (and the replacement, now one
    # too many, is the scale-in's victim).
    p = c.plan()
    assert notice_writes(p)["job-worker-1"] is None


def test_an_evicted_worker_is_noticed_with_its_deletion_as_deadline() -> None:
    c = elastic(3)
    pod = c.get("Pod", "job-worker-1")
    assert pod is not None
    gone_at = c.now + timedelta(seconds=30)
    pod["metadata"]["deletionTimestamp"] = format_time(gone_at)
    pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    text = notice_writes(c.plan())["job-worker-1"]
    assert text == f"worker-leaving {format_time(gone_at)} evicted this worker is being stopped"


def test_the_launcher_s_node_leaving_stops_the_job_for_every_pod() -> None:
    c = elastic(2)
    on_nodes(c)
    observed = dataclasses.replace(c.observed(), leaving_nodes={"ln": "tainted x"})
    found = notice_writes(plan_writes(observed, SETTINGS, c.now))
    assert found.keys() == {"job-launcher", "job-worker-0", "job-worker-1"}
    deadline = format_time(c.now + timedelta(seconds=30))  # the pods' grace period
    assert set(found.values()) == {
        f"job-stopping {deadline} launcher-node-leaving the launcher's node ln is tainted x"
    }


# -- a job stopping -----------------------------------------------------------------------


def below_min_job(checkpoint: str | None) -> Cluster:
    annotations = {names.ANN_MIN_REPLICAS: "2", names.ANN_BELOW_MIN_TIMEOUT: "30"}
    if checkpoint is not None:
        annotations[names.ANN_CHECKPOINT_SECONDS] = checkpoint
    c = Cluster(make_job(3, annotations={**annotations, names.ANN_MAX_REPLICAS: "8"}))
    c.converge()
    for i in (1, 2):
        c.world.fail(f"job-worker-{i}", 137, "Evicted")
    c.apply(c.plan())
    c.finalize_deletions()
    c.apply(c.plan())
    return c


def test_a_suspension_below_the_minimum_waits_its_checkpoint_window_after_the_notice() -> None:
    c = below_min_job(None)
    assert parse(c.job, 30).checkpoint_seconds == DEFAULT_CHECKPOINT_SECONDS == 60
    c.tick(30)
    p = c.plan()
    assert not p.of_type(DeletePod), "the window first"
    due = format_time(c.now + timedelta(seconds=60))
    found = notice_writes(p)
    assert found.keys() == {"job-launcher", "job-worker-0", "job-worker-3", "job-worker-4"}
    (text,) = set(found.values())
    assert text is not None
    assert text.startswith(f"job-stopping {due} below-min only 1 of the min-replicas 2 workers")
    assert p.requeue_after == pytest.approx(60)
    (emit,) = [e for e in p.of_type(Emit) if e.reason == "StopNoticed"]
    assert f"stopping at {due}, 60s to checkpoint" in emit.message
    c.apply(p)
    c.tick(59)
    p = c.plan()
    assert not p.of_type(DeletePod)
    assert not [e for e in p.of_type(Emit) if e.reason == "StopNoticed"], "once"
    c.apply(p)
    assert notice(c, "job-launcher") == text, "the notice stays as it was"
    c.tick(1)
    p = c.plan()
    assert sorted(d.name for d in p.of_type(DeletePod)) == [
        "job-launcher",
        "job-worker-0",
        "job-worker-3",
        "job-worker-4",
    ]
    assert "notices" not in [ph.step for ph in p.phases], "the notice was there already"
    c.apply(p)
    suspended = next(x for x in c.job["status"]["conditions"] if x["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "WaitingForCapacity")


def test_back_at_the_minimum_within_the_window_the_job_runs_on_and_the_notice_goes() -> None:
    c = below_min_job("60")
    c.tick(30)
    c.apply(c.plan())
    assert notice(c, "job-worker-0") is not None
    c.tick(10)
    c.run_pods()  # the replacements run: back at the minimum
    c.converge()
    assert not any(d[0] == "job-launcher" for d in c.deletions)
    assert all(notice(c, p["metadata"]["name"]) is None for p in c.pods)


def test_a_window_of_0_suspends_at_once_with_the_notice_in_the_same_turn() -> None:
    c = below_min_job("0")
    c.tick(30)
    p = c.plan()
    steps = [ph.step for ph in p.phases]
    assert steps.index("notices") < steps.index("deletes")
    assert len(p.of_type(DeletePod)) == 4


def test_a_user_s_suspend_is_not_delayed_and_noticed_before_the_deletes() -> None:
    c = elastic(2)
    c.job["spec"].setdefault("runPolicy", {})["suspend"] = True
    p = c.plan()
    steps = [ph.step for ph in p.phases]
    assert steps.index("notices") < steps.index("deletes")
    assert len(p.of_type(DeletePod)) == 3
    deadline = format_time(c.now + timedelta(seconds=30))
    assert set(notice_writes(p).values()) == {
        f"job-stopping {deadline} suspend runPolicy.suspend is true"
    }


def evicted_plan(c: Cluster, evicted_at: datetime) -> Writes:
    """A turn of the job while Kueue's eviction of its Workload (still holding its quota)
    is in force."""
    workers = c.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    workload = kueue.render_workload(c.job, Queue(True), workers)
    workload["metadata"].update(name="w", uid="wl", resourceVersion="1")
    # Kueue's times are whole seconds; the window counts from a second after (kueue.py).
    since = format_time(evicted_at - timedelta(seconds=1))
    workload["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": kueue.LAUNCHER, "count": 1},
                {"name": kueue.WORKER, "count": workers},
            ],
        },
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
            {
                "type": "Evicted",
                "status": "True",
                "reason": "Preempted",
                "message": "Preempted",
                "lastTransitionTime": since,
            },
        ],
    }
    queue = Queue(True, [workload])
    return plan_writes(dataclasses.replace(c.observed(), queue=queue), SETTINGS, c.now)


def test_a_kueue_eviction_is_noticed_and_stops_the_job_after_its_window() -> None:
    c = elastic(2, **{names.ANN_CHECKPOINT_SECONDS: "20"})
    evicted_at = c.now
    p = evicted_plan(c, evicted_at)
    assert not p.of_type(DeletePod), "the window first"
    due = format_time(evicted_at + timedelta(seconds=20))
    found = notice_writes(p)
    assert found.keys() == {"job-launcher", "job-worker-0", "job-worker-1"}
    (text,) = set(found.values())
    assert text is not None
    assert text.startswith(f"job-stopping {due} queue-evicted Kueue evicted Workload w")
    assert p.requeue_after == pytest.approx(20)
    (emit,) = [e for e in p.of_type(Emit) if e.reason == "StopNoticed"]
    assert f"stopping at {due}, 20s to checkpoint" in emit.message
    c.apply(p)
    c.tick(19)
    p = evicted_plan(c, evicted_at)
    assert not p.of_type(DeletePod)
    assert not [e for e in p.of_type(Emit) if e.reason == "StopNoticed"], "once"
    c.apply(p)
    c.tick(1)
    p = evicted_plan(c, evicted_at)
    assert sorted(d.name for d in p.of_type(DeletePod)) == [
        "job-launcher",
        "job-worker-0",
        "job-worker-1",
    ]
    assert "notices" not in [ph.step for ph in p.phases], "the notice was there already"
    c.apply(p)
    assert notice(c, "job-launcher") == text
    suspended = next(x for x in c.job["status"]["conditions"] if x["type"] == "Suspended")
    assert suspended["status"] == "True"


def test_a_kueue_eviction_with_no_launcher_running_stops_at_once() -> None:
    c = elastic(2, **{names.ANN_CHECKPOINT_SECONDS: "20"})
    launcher = c.get("Pod", "job-launcher")
    assert launcher is not None
    launcher["status"]["phase"] = "Pending"  # e.g. its image still pulling: nothing to save
    p = evicted_plan(c, c.now)
    assert len(p.of_type(DeletePod)) == 3
    assert {t.split(" ")[2] for t in notice_writes(p).values() if t} == {"queue-evicted"}


def test_the_active_deadline_is_noticed_a_window_before_it_is_over() -> None:
    c = elastic(2, **{names.ANN_CHECKPOINT_SECONDS: "20"})
    start = datetime.strptime(c.job["status"]["startTime"], "%Y-%m-%dT%H:%M:%SZ")
    c.job["spec"].setdefault("runPolicy", {})["activeDeadlineSeconds"] = 100
    due = start.replace(tzinfo=UTC) + timedelta(seconds=100)
    p = c.plan()
    assert "notices" not in [ph.step for ph in p.phases]
    assert p.requeue_after is not None
    c.tick(p.requeue_after)
    found = notice_writes(c.plan())
    assert set(found.values()) == {
        f"job-stopping {format_time(due)} active-deadline "
        "runPolicy.activeDeadlineSeconds 100 ends the job"
    }


# -- the file -----------------------------------------------------------------------------


def test_the_notice_is_a_downward_api_file_in_the_main_container() -> None:
    spec = parse(make_job(2), 30)
    for pod in (render_pods.worker_pod(spec, 0), render_pods.launcher_pod(spec, SETTINGS, "h", 1)):
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == names.NOTICE_VOLUME)
        assert volume == {
            "name": "mpijob-elastic-notice",
            "downwardAPI": {
                "items": [
                    {
                        "path": "notice",
                        "fieldRef": {
                            "fieldPath": "metadata.annotations['mpijob-elastic.io/notice']"
                        },
                    }
                ]
            },
        }
        main = pod["spec"]["containers"][0]
        assert {"name": "mpijob-elastic-notice", "mountPath": "/etc/mpijob-elastic"} in main[
            "volumeMounts"
        ]
        assert {"name": "MPIJOB_ELASTIC_NOTICE_FILE", "value": "/etc/mpijob-elastic/notice"} in (
            main["env"]
        )


def test_a_template_s_own_volume_at_the_path_is_kept_and_the_file_moves() -> None:
    job = make_job(2)
    for role in ("Launcher", "Worker"):
        template = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        template["automountServiceAccountToken"] = False
        template["volumes"] = [{"name": "mine", "emptyDir": {}}]
        template["containers"][0]["volumeMounts"] = [
            {"name": "mine", "mountPath": "/etc/mpijob-elastic/"}
        ]
    spec = parse(job, 30)
    for pod in (render_pods.worker_pod(spec, 0), render_pods.launcher_pod(spec, SETTINGS, "h", 1)):
        main = pod["spec"]["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
        assert mounts["mine"] == "/etc/mpijob-elastic/"
        assert mounts["mpijob-elastic-notice"] == "/var/run/mpijob-elastic"
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["MPIJOB_ELASTIC_NOTICE_FILE"] == "/var/run/mpijob-elastic/notice"
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_checkpoint_seconds_is_a_duration() -> None:
    job = make_job(2, annotations={names.ANN_CHECKPOINT_SECONDS: "0"})
    assert parse(job, 30).checkpoint_seconds == 0
    job["metadata"]["annotations"][names.ANN_CHECKPOINT_SECONDS] = "soon"
    with pytest.raises(InvalidSpec, match=r"checkpoint-seconds\]"):
        parse(job, 30)
