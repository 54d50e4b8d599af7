"""Values read from objects others can write parse to a value or to a refusal, never to an
exception (issue 31): each input here raised before. test_inputs_fuzz.py holds the whole
plan to it for any value on the same surfaces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpijob_elastic.core import names, numbers, quantity
from mpijob_elastic.core.hosts.membership import parse_indexes
from mpijob_elastic.core.inputs.growth_state import parse_growth
from mpijob_elastic.core.inputs.ranks import pushed
from mpijob_elastic.core.lifecycle.notices import parse_notice
from mpijob_elastic.core.outputs.turn import count
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.queueing.kueue_writes import workload_writes
from mpijob_elastic.core.sizing.capacity import parse_backoff
from mpijob_elastic.core.spec.parse import InvalidSpec
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.core.workers import worker_index
from tests.unit.simulation import Cluster, make_job
from tests.unit.test_kueue import FLAVOR, NOW, workload
from tests.unit.test_kueue import job as queued_job
from tests.unit.test_notices import notice_writes
from tests.unit.test_plan_fuzz import refusal, sample

HUGE = "9" * 5000  # int() refuses more than 4300 digits
LAST_SECOND = "9999-12-31T23:59:59Z"  # a deadline after it is past datetime's end


def test_a_whole_number_is_ascii_digits_within_its_bound() -> None:
    assert numbers.whole("0042") == 42
    assert numbers.whole(7) == 7
    assert numbers.whole("5", 4) is None
    assert numbers.whole(5, 4) is None
    for junk in (HUGE, "0" * 5000 + "1" + "0" * 10, "-1", -1, "1_0", " 4", "\u0661", "", True, 2.0):
        assert numbers.whole(junk) is None, junk
    assert numbers.whole("0" * 5000 + "1") == 1


@pytest.mark.parametrize("second", ["253402300800", "9" * 20, HUGE])
def test_a_rank_report_past_datetimes_range_is_taken_as_started_at_the_read(second: str) -> None:
    # A read within a day of datetime's end lets the clock-skew bound past it.
    at = datetime(9999, 12, 31, 12, tzinfo=UTC)
    snapshot = pushed({f"job-worker-0_1_{second}": "start"}, at)
    assert snapshot.hosts == frozenset({"job-worker-0"})
    assert snapshot.since["job-worker-0"] == at


@pytest.mark.parametrize(
    "text", ["1e99999999999999", "1e" + HUGE, HUGE, "1" * 65, "1e1000", "1e-1000", "9" * 65 + "Ei"]
)
def test_a_quantity_beyond_its_bounds_is_none(text: str) -> None:
    assert quantity.parse(text) is None


def test_quantities_within_the_bounds_still_read() -> None:
    assert str(quantity.parse("1e999")) == "1e999"
    assert quantity.parse("9" * 64) is not None
    assert str(quantity.parse("1.5Gi")) == "1536Mi"


@pytest.mark.parametrize("text", ["1e99999999999999", "1e" + HUGE])
def test_a_min_resource_beyond_the_bounds_refuses_the_spec_naming_it(text: str) -> None:
    job = sample()
    job["spec"].setdefault("runPolicy", {})["schedulingPolicy"] = {"minResources": {"cpu": text}}
    refused = refusal(job)
    assert isinstance(refused, InvalidSpec)
    assert [e.field for e in refused.errors] == ["spec.runPolicy.schedulingPolicy.minResources.cpu"]


def test_the_state_annotations_read_a_huge_number_as_unset() -> None:
    assert parse_indexes(f"1,{HUGE},3-{HUGE},{HUGE}-{HUGE}") == {1}
    assert parse_backoff(f"{HUGE} 2026-11-25T12:00:00Z why") is None
    assert count(HUGE) == 0
    growth = parse_growth(f"{HUGE} {HUGE} 2026-11-25T12:00:00.000000Z - why")
    assert (growth.workers, growth.attempts) == (0, 0)


def test_a_time_past_the_bounds_reads_as_none() -> None:
    assert parse_time(LAST_SECOND) is None
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert parse_time("2026-11-25T12:00:00Z") == datetime(2026, 11, 25, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        (names.ANN_RETIRED_WORKERS, HUGE),
        (names.ANN_SCALE_OUT_BACKOFF, f"{HUGE} {LAST_SECOND} why"),
        (names.ANN_WORKERS, HUGE),
        (names.ANN_LAUNCHER_RESTARTS, HUGE),
        (names.ANN_WORKER_FAILURES, f"{HUGE} {LAST_SECOND}"),
        (names.ANN_WORKER_FAILURES, f"3 {LAST_SECOND}"),
    ],
)
def test_a_running_job_plans_on_through_an_edited_state_annotation(
    annotation: str, value: str
) -> None:
    # Replicas out of the bounds: the kept worker count is read.
    c = Cluster(make_job(2, annotations={names.ANN_MAX_REPLICAS: "3"}))
    c.converge()
    c.world.patch("ConfigMap", "job-config", {"metadata": {"annotations": {annotation: value}}})
    c.set_replicas(5)
    c.converge()
    assert len(c.world.workers()) == 2


@pytest.mark.parametrize("value", [None, "x", HUGE, [], -3])
def test_a_workload_count_others_wrote_is_read_as_none(value: object) -> None:
    j = queued_job(replicas=4, low="2", high="6")
    # Evicted, its pods gone: an elastic Workload above the minimum asks for it again.
    wl = workload(j, 4, admitted=4, conditions=(("Evicted", "Preempted"),))
    for pod_set in wl["spec"]["podSets"]:
        if pod_set["name"] == "worker":
            pod_set["count"] = value
    workload_writes(j, Queue(True, [wl], FLAVOR, slices=True), [], NOW)


@pytest.mark.parametrize("pod", ["job-worker-1", "job-launcher"])
def test_a_pod_taken_with_a_grace_period_past_int32_gets_a_notice_in_range(pod: str) -> None:
    job = make_job(3, annotations={names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "5"})
    for role in ("Launcher", "Worker"):
        template = job["spec"]["mpiReplicaSpecs"][role]["template"]
        template["spec"]["terminationGracePeriodSeconds"] = 2**63 - 1
    c = Cluster(job)
    c.converge()
    taken = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    found = c.get("Pod", pod)
    assert found is not None
    found["status"].setdefault("conditions", []).append(taken)
    notice = parse_notice(notice_writes(c.plan())[pod])
    assert notice is not None
    assert notice[1] == c.now + timedelta(seconds=numbers.INT32_MAX)


def test_a_worker_name_past_int32_is_no_worker_of_the_job() -> None:
    assert worker_index("job", f"job-worker-{numbers.INT32_MAX}") == numbers.INT32_MAX
    assert worker_index("job", f"job-worker-{numbers.INT32_MAX + 1}") is None
    assert worker_index("job", f"job-worker-{HUGE}") is None


def test_remove_workers_naming_a_worker_of_5000_digits_refuses_the_spec_naming_it() -> None:
    job = sample()
    name = job["metadata"]["name"]
    job["metadata"]["annotations"][names.ANN_REMOVE_WORKERS] = f"{name}-worker-{HUGE}"
    refused = refusal(job)
    assert isinstance(refused, InvalidSpec)
    assert [e.field for e in refused.errors] == [
        f"metadata.annotations[{names.ANN_REMOVE_WORKERS}]"
    ]


@pytest.mark.parametrize(
    ("key", "line"),
    [
        (names.HOSTFILE, f"job-worker-{HUGE} slots=1\n"),
        (names.DISCOVER_HOSTS, f"\necho job-worker-{HUGE}:1"),
    ],
)
def test_a_host_list_edited_to_name_a_worker_of_5000_digits_is_planned_through(
    key: str, line: str
) -> None:
    c = Cluster(make_job(2))
    c.converge()
    config_map = c.get("ConfigMap", "job-config")
    assert config_map is not None
    config_map["data"][key] += line
    c.set_replicas(3)
    c.converge()
    assert len(c.world.workers()) == 3


def test_the_retired_indexes_are_capped_in_all() -> None:
    many = ",".join(f"{i * 200_000}-{i * 200_000 + 99_999}" for i in range(20))
    assert len(parse_indexes(many)) == 100_000
    assert len(parse_indexes("0-100000")) == 100_001
