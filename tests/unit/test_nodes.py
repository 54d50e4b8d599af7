"""Nodes going away (issue 13, part 1): which notices count, and elastic jobs moving their
workers off such nodes gracefully while keeping their size."""

from __future__ import annotations

import dataclasses

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import AnnotatePod, Create, DeletePod
from mpijob_elastic.core.nodes import DEFAULT_LEAVING_TAINTS, leaving, slim
from mpijob_elastic.core.plan import plan_writes
from tests.unit.simulation import SETTINGS, Cluster, discovered, make_job

NODE = {
    "metadata": {"name": "n1", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"}},
    "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
    "status": {"images": [{"names": ["x" * 100]}] * 50},
}


def test_a_cordon_or_a_known_taint_says_the_node_is_going() -> None:
    assert leaving(NODE, DEFAULT_LEAVING_TAINTS) == "tainted karpenter.sh/disrupted"
    assert leaving({"spec": {"unschedulable": True}}, ()) == "cordoned"
    assert leaving({"spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}}, ()) is None
    assert leaving({}, DEFAULT_LEAVING_TAINTS) is None


def test_only_what_is_read_is_cached() -> None:
    assert slim(NODE) == {
        "metadata": {"name": "n1", "uid": "u", "resourceVersion": "7"},
        "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
    }


def on_nodes(c: Cluster) -> None:
    for i, pod in enumerate(p for p in c.pods if "-worker-" in p["metadata"]["name"]):
        pod["spec"]["nodeName"] = f"n{i}"


def test_workers_on_a_going_node_leave_gracefully_and_are_replaced() -> None:
    c = Cluster(make_job(3, annotations={names.ANN_MIN_REPLICAS: "1"}))
    c.converge()
    on_nodes(c)
    observed = dataclasses.replace(c.observed(), leaving_nodes={"n1": "cordoned"})
    p = plan_writes(observed, SETTINGS, c.now)
    # Make before break: the replacement starts first, the worker on n1 stays listed.
    assert [a.obj["metadata"]["name"] for a in p.of_type(Create)] == ["job-worker-3"]
    assert not [a for a in p.of_type(AnnotatePod) if names.ANN_DRAINING_SINCE in a.annotations]
    c.apply(p)
    assert discovered(c.get("ConfigMap", "job-config")) == [f"job-worker-{i}" for i in range(3)]
    scaling = next(x for x in c.job["status"]["conditions"] if x["type"] == "Scaling")
    assert scaling["reason"] == "Relocating"
    assert "job-worker-1 (node n1 cordoned)" in scaling["message"]
    # Once the replacement takes ranks, the worker on n1 leaves gracefully.
    c.run_pods()
    p = plan_writes(
        dataclasses.replace(c.observed(), leaving_nodes={"n1": "cordoned"}), SETTINGS, c.now
    )
    marks = [a.name for a in p.of_type(AnnotatePod) if names.ANN_DRAINING_SINCE in a.annotations]
    assert marks == ["job-worker-1"]
    assert not p.of_type(DeletePod)
    assert not p.of_type(Create)
    c.apply(p)
    assert discovered(c.get("ConfigMap", "job-config")) == [
        "job-worker-0",
        "job-worker-2",
        "job-worker-3",
    ]


def test_a_job_without_elastic_bounds_is_left_alone() -> None:
    c = Cluster(make_job(2))
    c.converge()
    on_nodes(c)
    observed = dataclasses.replace(c.observed(), leaving_nodes={"n1": "cordoned"})
    assert plan_writes(observed, SETTINGS, c.now).actions == ()
