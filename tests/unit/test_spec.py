"""Validation: every bad field is named, every good spec parses, nothing reaches a shell."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpijob_elastic import names
from mpijob_elastic.spec import Bounds, InvalidSpec, parse
from tests.unit.simulation import make_job


def errors_of(job: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30)
    return [e.field for e in info.value.errors]


def with_spec(**changes: Any) -> dict[str, Any]:
    job = make_job(2)
    job["spec"].update(changes)
    return job


def test_a_good_job_parses_with_v1_defaults() -> None:
    job = make_job(3)
    del job["spec"]["slotsPerWorker"]
    spec = parse(job, 30)
    assert (spec.slots_per_worker, spec.clean_pod_policy, spec.drain_seconds) == (1, "None", 30)
    assert spec.worker.replicas == 3
    assert spec.worker.restart_policy == "Never"
    assert spec.bounds == Bounds(None, None)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda j: j["spec"]["mpiReplicaSpecs"].pop("Worker"), "spec.mpiReplicaSpecs.Worker"),
        (lambda j: j["spec"].pop("mpiReplicaSpecs"), "spec.mpiReplicaSpecs"),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=2.5),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas="2"),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=True),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
            "spec.mpiReplicaSpecs.Launcher.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Sometimes"),
            "spec.mpiReplicaSpecs.Worker.restartPolicy",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(
                containers=[]
            ),
            "spec.mpiReplicaSpecs.Worker.template.spec.containers",
        ),
        (lambda j: j["spec"].update(slotsPerWorker=0), "spec.slotsPerWorker"),
        (lambda j: j["spec"].update(slotsPerWorker="1"), "spec.slotsPerWorker"),
        (lambda j: j["spec"].update(cleanPodPolicy="Some"), "spec.cleanPodPolicy"),
        (
            lambda j: j["spec"].update(runPolicy={"cleanPodPolicy": "Some"}),
            "spec.runPolicy.cleanPodPolicy",
        ),
        (lambda j: j["spec"].update(mainContainer="main; rm -rf /"), "spec.mainContainer"),
        (lambda j: j["spec"].update(mainContainer="$(reboot)"), "spec.mainContainer"),
        (lambda j: j["spec"].update(mainContainer="sidecar"), "spec.mainContainer"),
        (lambda j: j["metadata"].update(name="Upper"), "metadata.name"),
        (lambda j: j["metadata"].update(name="a" * 60), "metadata.name"),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_MIN_REPLICAS: "two"}),
            f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_MAX_REPLICAS: "0"}),
            f"metadata.annotations[{names.ANN_MAX_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update(
                {names.ANN_MIN_REPLICAS: "4", names.ANN_MAX_REPLICAS: "2"}
            ),
            f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_DRAIN_SECONDS: "-1"}),
            f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_DRAIN_SECONDS: "nan"}),
            f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]",
        ),
    ],
)
def test_each_invalid_field_is_named(mutate: Any, field: str) -> None:
    job = make_job(2)
    mutate(job)
    assert field in errors_of(job)


def test_all_errors_are_reported_at_once() -> None:
    job = with_spec(slotsPerWorker=0, mainContainer="BAD")
    assert errors_of(job) == ["spec.slotsPerWorker", "spec.mainContainer"]


def test_name_length_counts_the_largest_worker_index() -> None:
    # 50 + len("-worker-99999") = 63, the most a hostname takes; one more digit is too long.
    job = make_job(10, name="n" * 50, annotations={names.ANN_MAX_REPLICAS: "100000"})
    parse(job, 30)
    job["metadata"]["annotations"][names.ANN_MAX_REPLICAS] = "1000000"
    assert errors_of(job) == ["metadata.name"]


def test_out_of_range_replicas_are_not_a_parse_error() -> None:
    job = make_job(9, annotations={names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "5"})
    spec = parse(job, 30)
    assert not spec.bounds.contains(9)
    assert spec.bounds.clamp(9) == 5


@given(
    st.integers(min_value=-5, max_value=20),
    st.one_of(st.none(), st.integers(min_value=0, max_value=10)),
    st.one_of(st.none(), st.integers(min_value=1, max_value=10)),
)
def test_bounds_clamp_lands_inside(replicas: int, low: int | None, high: int | None) -> None:
    if low is not None and high is not None and low > high:
        return
    bounds = Bounds(low, high)
    assert bounds.contains(bounds.clamp(replicas))
    if bounds.contains(replicas):
        assert bounds.clamp(replicas) == replicas


@given(st.text(min_size=1, max_size=70))
def test_no_main_container_that_could_carry_shell_is_accepted(name: str) -> None:
    job = make_job(2)
    job["spec"]["mainContainer"] = name
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = name
    try:
        spec = parse(copy.deepcopy(job), 30)
    except InvalidSpec:
        return
    assert spec.main_container is not None
    assert set(spec.main_container) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
