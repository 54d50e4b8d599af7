"""The pure parts of the metrics and the readiness write check (no cluster)."""

from __future__ import annotations

import asyncio
import itertools
import platform
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from prometheus_client import REGISTRY

from mpijob_elastic.app import leader
from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Emit
from mpijob_elastic.core.outputs.status import CONDITION_ORDER, SUSPENDED, StatusBuilder
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import parse
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.kube import request_labels
from mpijob_elastic.machinery.workqueue import WorkQueue
from mpijob_elastic.machinery.write_health import WRITE_STALL_SECONDS, WriteHealth
from tests.metric_names import every_family, family, total
from tests.unit.simulation import make_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("method", "path", "labels"),
    [
        ("PATCH", "/api/v1/namespaces/ns/pods/w-0", ("patch", "Pod")),
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/ns/mpijobs/j/status", ("patch", "MPIJob")),
        ("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/roles", ("create", "Role")),
        ("PUT", "/api/v1/namespaces/ns/configmaps/j-config", ("update", "ConfigMap")),
        (
            "DELETE",
            "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/j",
            ("delete", "PodDisruptionBudget"),
        ),
        ("GET", "/api/v1/namespaces/ns/serviceaccounts/sa", ("get", "ServiceAccount")),
        ("GET", "/api/v1/namespaces/ns/configmaps?limit=5", ("list", "ConfigMap")),
        ("GET", "/api/v1/nodes", ("list", "Node")),
        ("GET", "/apis/kubeflow.org/v1/mpijobs", ("list", "MPIJob")),
    ],
)
def test_request_labels(method: str, path: str, labels: tuple[str, str]) -> None:
    assert request_labels(method, path) == labels


def condition(type_: str, status: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": "R", "message": "m"}


def test_the_last_condition_built_is_the_last_true_one() -> None:
    """What `kubectl get mpijob` shows as STATE (.status.conditions[-1:].type)."""
    types = [*CONDITION_ORDER, SUSPENDED]
    # Created is always True; every True/False mix of up to three other conditions.
    for n in range(4):
        for chosen in itertools.combinations(types[1:], n):
            for statuses in itertools.product(("True", "False"), repeat=n):
                given = [condition("Created", "True")] + [
                    condition(t, s) for t, s in zip(chosen, statuses, strict=True)
                ]
                built = StatusBuilder({"status": {"conditions": given}}, NOW).build()
                last = built["conditions"][-1]
                assert last["status"] == "True", built["conditions"]
                trues = [c["type"] for c in given if c["status"] == "True"]
                expected = max(trues, key=types.index)
                assert last["type"] == expected
                assert metrics.state(built) == expected


def test_a_running_job_that_was_restarting_shows_running() -> None:
    given = [
        condition("Created", "True"),
        condition("Running", "True"),
        condition("Restarting", "False"),
        condition("Scaling", "False"),
    ]
    built = StatusBuilder({"status": {"conditions": given}}, NOW).build()
    assert built["conditions"][-1]["type"] == "Running"


def test_state_without_conditions() -> None:
    assert metrics.state(None) == ""
    assert metrics.state({"conditions": [condition("Created", "False")]}) == ""


def scaling(reason: str | None, status: str = "True") -> dict[str, object]:
    return {
        "conditions": []
        if reason is None
        else [{"type": "Scaling", "status": status, "reason": reason}]
    }


def test_scale_direction_counts_the_start_of_an_operation_once() -> None:
    done = scaling("ScalingComplete", "False")
    assert metrics.scale_direction(scaling(None), scaling("ScalingUp")) == "out"
    assert metrics.scale_direction(scaling("ScalingUp"), scaling("ScalingDown")) == "in"
    assert metrics.scale_direction(done, scaling("ScalingDown")) == "in"
    # Still the same operation (its message changed), or not one of ours to count.
    assert metrics.scale_direction(scaling("ScalingUp"), scaling("ScalingUp")) is None
    assert metrics.scale_direction(scaling("ScalingUp"), done) is None
    assert metrics.scale_direction(None, scaling("Relocating")) is None


def pod(name: str, phase: str, *, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"namespace": "ns", "name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def config_map(*hosts: str, namespace: str = "ns") -> dict[str, object]:
    script = "#!/bin/sh\n" + "".join(f"echo {h}:1\n" for h in hosts)
    return {
        "kind": "ConfigMap",
        "metadata": {"namespace": namespace, "name": "j-config"},
        "data": {names.DISCOVER_HOSTS: script},
    }


def test_running_to_listed_times_each_pod_once_from_its_first_running_sighting() -> None:
    latency = metrics.HostListLatency()
    latency.pod("ADDED", pod("w-0", "Pending"), 1.0)
    latency.pod("MODIFIED", pod("w-0", "Running"), 2.0)
    latency.pod("MODIFIED", pod("w-0", "Running"), 3.0)  # a later event keeps the first time
    latency.pod("ADDED", pod("w-1", "Pending"), 1.0)
    latency.pod("MODIFIED", pod("w-1", "Running"), 2.5)
    assert latency.written(config_map("w-0"), 4.0) == [2.0]
    assert latency.written(config_map("w-0"), 5.0) == []  # timed once
    # Same name in another namespace is another pod.
    assert latency.written(config_map("w-1", namespace="other"), 5.0) == []
    # A pod that stops running (or goes) before it is listed is not timed.
    latency.pod("MODIFIED", pod("w-1", "Running", deleting=True), 5.5)
    assert latency.written(config_map("w-0", "w-1"), 6.0) == []


def test_a_pod_running_before_it_was_watched_is_never_timed() -> None:
    """As after a controller restart: the first list shows it Running, later events too."""
    latency = metrics.HostListLatency()
    latency.pod("ADDED", pod("w-0", "Running"), 1.0)
    latency.pod("MODIFIED", pod("w-0", "Running"), 2.0)
    assert latency.written(config_map("w-0"), 3.0) == []
    # One the first list showed Pending is seen start: it is timed.
    latency.pod("ADDED", pod("w-1", "Pending"), 1.0)
    latency.pod("MODIFIED", pod("w-1", "Running"), 5.0)
    assert latency.written(config_map("w-0", "w-1"), 5.5) == [0.5]


def test_drain_seconds_from_the_mark() -> None:
    marked = NOW - timedelta(seconds=12.5)
    drained = {"metadata": {"annotations": {names.ANN_DRAINING_SINCE: format_precise_time(marked)}}}
    assert metrics.drain_seconds(drained, NOW) == 12.5
    assert metrics.drain_seconds({"metadata": {}}, NOW) is None


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_accepted_writes_count_scale_operations_and_drains() -> None:
    latency = metrics.HostListLatency()
    before = sample(total(metrics.SCALE_OPERATIONS), direction="in")
    metrics.status_written(scaling(None), scaling("ScalingDown"))
    metrics.status_written(scaling("ScalingDown"), scaling("ScalingDown"))
    assert sample(total(metrics.SCALE_OPERATIONS), direction="in") == before + 1

    bucket = f"{family(metrics.DRAIN_SECONDS)}_bucket"
    drains = sample(f"{family(metrics.DRAIN_SECONDS)}_count")
    below, above = sample(bucket, le="2.5"), sample(bucket, le="5.0")
    since = format_precise_time(datetime.now(UTC) - timedelta(seconds=3))
    deleted = {
        "kind": "Pod",
        "metadata": {
            "namespace": "ns",
            "name": "w-1",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {names.ANN_DRAINING_SINCE: since},
        },
    }
    metrics.observe_write(deleted, latency)
    assert sample(f"{family(metrics.DRAIN_SECONDS)}_count") == drains + 1
    # Three seconds of drain: above the 2.5 s bucket, within the 5 s one.
    assert (sample(bucket, le="2.5"), sample(bucket, le="5.0")) == (below, above + 1)


def test_write_health_turns_unready_only_after_the_stall_bound() -> None:
    health = WriteHealth()
    assert health.problem(100.0) is None  # idle
    slow = health.started(100.0)
    assert health.problem(100.0 + WRITE_STALL_SECONDS - 1) is None
    assert health.problem(100.0 + WRITE_STALL_SECONDS + 1) is not None  # in flight too long
    health.finished(slow, True, 100.0 + WRITE_STALL_SECONDS + 1)
    assert health.problem(100.0 + WRITE_STALL_SECONDS + 1) is None

    # Writes that fail without an answer: unready from the first one's start on...
    first = health.started(200.0)
    health.finished(first, False, 210.0)
    second = health.started(215.0)
    health.finished(second, False, 225.0)
    problem = health.problem(225.0)
    assert problem is not None
    assert "25s" in problem
    # ...until one gets an answer, even a refusal.
    third = health.started(230.0)
    health.finished(third, True, 230.1)
    assert health.problem(300.0) is None

    # A request we cancelled says nothing about the server.
    cancelled = health.started(400.0)
    health.finished(cancelled, None, 401.0)
    assert health.problem(500.0) is None


async def test_queue_reports_each_keys_wait() -> None:
    waits: list[float] = []
    queue: WorkQueue[str] = WorkQueue(observe_wait=waits.append)
    queue.add("a")
    await asyncio.sleep(0.02)
    assert await queue.get() == "a"
    queue.add("a")  # added while processing: its wait starts at done()
    await asyncio.sleep(0.02)
    queue.done("a")
    assert await queue.get() == "a"
    assert len(waits) == 2
    assert waits[0] >= 0.02
    assert waits[1] < 0.02


def test_docs_list_every_series_the_registry_holds() -> None:
    """docs/operations.md's table has one row per series, named as scraped."""
    table = Path(__file__).parents[2].joinpath("docs", "operations.md").read_text()
    rows = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    ours = {row for row in rows if row.startswith(f"{metrics.PREFIX}_")}
    counters = {m.name for m in REGISTRY.collect() if m.type == "counter"}
    scraped = {f"{f}_total" if f in counters else f for f in every_family()}
    assert ours == scraped


def conditions(**true: str) -> dict[str, object]:
    """A status whose conditions are True with these reasons (type=reason)."""
    return {"conditions": [{"type": t, "status": "True", "reason": r} for t, r in true.items()]}


def test_transitions_are_the_conditions_a_status_write_turns() -> None:
    running = conditions(Created="MPIJobCreated", Running="MPIJobRunning")
    assert metrics.transitions(None, conditions(Created="MPIJobCreated")) == ["created"]
    assert metrics.transitions(running, {**running}) == []
    done = conditions(Created="MPIJobCreated", Succeeded="MPIJobSucceeded")
    assert metrics.transitions(running, done) == ["succeeded"]
    failed = conditions(Created="MPIJobCreated", Failed="MPIJobFailed")
    assert metrics.transitions(running, failed) == ["failed"]
    suspended = conditions(Created="MPIJobCreated", Suspended="WaitingForCapacity")
    assert metrics.transitions(running, suspended) == ["suspended"]
    # Resumed: Suspended turned False (or went), the job runs again.
    assert metrics.transitions(suspended, running) == ["resumed"]
    moving = conditions(Created="MPIJobCreated", Scaling="Relocating")
    assert metrics.transitions(running, moving) == ["relocating"]
    assert metrics.transitions(moving, moving) == []
    # A controller that restarts plans from the status on the server: nothing again.
    assert metrics.transitions(done, done) == []


def test_accepted_status_writes_and_sent_events_move_the_lifecycle_counters() -> None:
    transitions = total(metrics.JOB_TRANSITIONS)
    created, succeeded = (
        sample(transitions, transition="created"),
        sample(transitions, transition="succeeded"),
    )
    metrics.status_written(None, conditions(Created="MPIJobCreated"))
    metrics.status_written(
        conditions(Created="MPIJobCreated"),
        conditions(Created="MPIJobCreated", Succeeded="MPIJobSucceeded"),
    )
    assert sample(transitions, transition="created") == created + 1
    assert sample(transitions, transition="succeeded") == succeeded + 1

    changes = total(metrics.WORKER_CHANGES)
    before = {c: sample(changes, change=c) for c in ("replaced", "drained", "drain_timed_out")}
    metrics.event_sent(Emit("Normal", "WorkerReplaced", "m", (("replaced", 2),)))
    metrics.event_sent(
        Emit("Normal", "WorkerDeleted", "m", (("drained", 1), ("drain_timed_out", 0)))
    )
    metrics.event_sent(Emit("Normal", "ScaledUp", "m"))
    after = {c: sample(changes, change=c) for c in before}
    assert after == {
        "replaced": before["replaced"] + 2,
        "drained": before["drained"] + 1,
        "drain_timed_out": before["drain_timed_out"],
    }


def test_job_details_count_conditions_and_the_workers_of_running_jobs() -> None:
    elastic = make_job(3, name="a", annotations={names.ANN_MIN_REPLICAS: "2"})
    elastic["status"] = conditions(Created="MPIJobCreated", Running="MPIJobRunning")
    fixed = make_job(1, name="b")
    fixed["status"] = conditions(Created="MPIJobCreated", WriteRefused="AlreadyExists")
    finished = make_job(2, name="c", annotations={names.ANN_MIN_REPLICAS: "1"})
    finished["status"] = conditions(Created="MPIJobCreated", Succeeded="MPIJobSucceeded")
    broken = make_job(2, name="d", annotations={names.ANN_MIN_REPLICAS: "x"})
    details = metrics._JobDetails(metrics._JobStates())
    details._jobs.jobs = lambda: [elastic, fixed, finished, broken]
    maps = {"a-config": config_map("a-worker-0", "a-worker-1")}
    details.config_map = lambda _ns, name: maps.get(name)
    found_conditions, workers, _ = details.collect()
    counted = {tuple(s.labels.values()): s.value for s in found_conditions.samples}
    assert counted == {
        ("ns", "Created", "MPIJobCreated"): 3,
        ("ns", "Running", "MPIJobRunning"): 1,
        ("ns", "WriteRefused", "AlreadyExists"): 1,
        ("ns", "Succeeded", "MPIJobSucceeded"): 1,
    }
    # The finished job has none; the one whose spec does not parse neither (InvalidSpec
    # says why); a job without min-replicas has no min.
    listed = {(s.labels["mpijob"], s.labels["count"]): s.value for s in workers.samples}
    assert listed == {
        ("a", "listed"): 2,
        ("a", "desired"): 3,
        ("a", "min"): 2,
        ("b", "listed"): 0,
        ("b", "desired"): 1,
    }


def test_is_leader_follows_the_elector_and_build_info_names_the_build() -> None:
    elector = leader.Elector(None, "ns", "lease", "me", leader.Timings())  # type: ignore[arg-type]
    assert sample(family(metrics.IS_LEADER)) == 0
    elector.leading = True
    assert sample(family(metrics.IS_LEADER)) == 1
    elector.leading = False
    assert sample(family(metrics.IS_LEADER)) == 0
    metrics.build("9.9.9", "abc")
    python = platform.python_version()
    labels = {"version": "9.9.9", "commit": "abc", "python": python}
    assert sample(family(metrics.BUILD_INFO), **labels) == 1


def test_job_details_read_a_job_with_the_controllers_settings() -> None:
    """A job larger than the default limit reads as the controller reads it."""
    big = make_job(Settings().max_workers_per_job + 1, name="big")
    details = metrics._JobDetails(metrics._JobStates())
    details._jobs.jobs = lambda: [big]
    assert not list(details.collect())[1].samples
    details.settings = Settings(max_workers_per_job=Settings().max_workers_per_job + 1)
    _, workers, _ = details.collect()
    assert {s.labels["count"]: s.value for s in workers.samples}["desired"] == (
        Settings().max_workers_per_job + 1
    )


def test_a_job_whose_reading_raises_is_left_out_of_a_scrape_and_counted() -> None:
    """/metrics must not fail for every job because of one (issue 31): a job whose reading
    raises (a bug in parse, played by a patched one; a status no schema lets in) is
    skipped and counted, the others are served."""
    good = make_job(2, name="a")
    good["status"] = conditions(Created="MPIJobCreated")
    bad = make_job(2, name="bad")
    odd = make_job(2, name="odd")
    odd["status"] = ["not a mapping"]
    real = parse

    def buggy(job: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        if job["metadata"]["name"] == "bad":
            raise TypeError("a bug")
        return real(job, *args, **kwargs)

    states = metrics._JobStates()
    states.jobs = lambda: [good, bad, odd]
    details = metrics._JobDetails(states)
    skipped = total(metrics.SKIPPED_JOBS)
    before = sample(skipped)
    with mock.patch.object(metrics, "parse", side_effect=buggy):
        found_conditions, workers, _ = details.collect()
        (jobs,) = states.collect()
    assert sample(skipped) == before + 3  # bad's details, odd's details and odd's state
    assert {s.labels["mpijob"] for s in workers.samples} == {"a"}
    assert [tuple(s.labels.values()) for s in found_conditions.samples] == [
        ("ns", "Created", "MPIJobCreated")
    ]
    assert {s.labels["state"]: s.value for s in jobs.samples} == {"Created": 1, "Pending": 1}


def test_job_seconds_add_the_time_since_the_last_change_at_each_scrape() -> None:
    job = make_job(2, name="a")
    since = datetime.now(UTC) - timedelta(seconds=30)
    job["status"] = {
        "goodput": {
            "state": "training_full",
            "since": since.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "target": 2,
            "seconds": {"waiting": 12.5},
        }
    }
    details = metrics._JobDetails(metrics._JobStates())
    details._jobs.jobs = lambda: [job]
    _, _, seconds = details.collect()
    found = {s.labels["state"]: s.value for s in seconds.samples if s.name.endswith("_total")}
    assert found["waiting"] == 12.5
    assert 30 <= found["training_full"] < 40
