"""Nodes going away (issue 13, part 1): which notices count, and elastic jobs moving their
workers off such nodes gracefully while keeping their size."""

from __future__ import annotations

import dataclasses

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import AnnotatePod, Create, DeletePod, Emit
from mpijob_elastic.core.inputs.ranks import RankSnapshot
from mpijob_elastic.core.nodes import DEFAULT_LEAVING_TAINTS, leaving, slim, takes_pods
from mpijob_elastic.core.planning.plan import plan_writes
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
    assert not [a for a in p.of_type(AnnotatePod) if a.stamp == names.ANN_DRAINING_SINCE]
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
    marks = [a.name for a in p.of_type(AnnotatePod) if a.stamp == names.ANN_DRAINING_SINCE]
    assert marks == ["job-worker-1"]
    (draining,) = [e for e in p.of_type(Emit) if e.reason == "Draining"]
    assert draining.counts == (("relocated", 1),)
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


def test_a_job_whose_workers_all_sit_on_a_going_node_keeps_a_rank_holder_listed() -> None:
    """Issue 20 §1: Horovod cannot reset onto hosts none of which holds ranks."""
    c = Cluster(make_job(3, annotations={names.ANN_MIN_REPLICAS: "1"}))
    c.converge()
    for pod in c.pods:
        pod["spec"]["nodeName"] = "n1"
    old = [f"job-worker-{i}" for i in range(3)]
    new = [f"job-worker-{i}" for i in range(3, 6)]
    c.ranks = RankSnapshot(c.now, frozenset(old))

    def step() -> list[str]:
        p = plan_writes(
            dataclasses.replace(c.observed(), leaving_nodes={"n1": "cordoned"}), SETTINGS, c.now
        )
        c.apply(p)
        return sorted(a.name for a in p.of_type(AnnotatePod) if a.stamp == names.ANN_DRAINING_SINCE)

    def holding() -> list[str]:
        return sorted(
            p["metadata"]["name"]
            for p in c.pods
            if (p["metadata"].get("labels") or {}).get(names.LABEL_HOLDS_RANKS) == "true"
        )

    assert step() == []
    assert holding() == old
    c.run_pods()
    # The replacements run but hold no rank: one old worker stays listed, the others leave.
    assert step() == ["job-worker-1", "job-worker-2"]
    assert discovered(c.get("ConfigMap", "job-config")) == ["job-worker-0", *new]
    c.tick(1)
    # The first read that shows the replacements' ranks (rankprobe.py: since then).
    c.ranks = RankSnapshot(
        c.now, frozenset(["job-worker-0", *new]), since=dict.fromkeys(new, c.now)
    )
    # Their ranks run, but have not yet had the time to commit: nothing changes.
    assert step() == []
    assert discovered(c.get("ConfigMap", "job-config")) == ["job-worker-0", *new]
    # Nor do they count for the disruption budget yet: an eviction of job-worker-0 now
    # would be unlisted during their reset, a notice the driver drops.
    assert holding() == ["job-worker-0"]
    scaling = next(x for x in c.job["status"]["conditions"] if x["type"] == "Scaling")
    assert scaling["reason"] == "WaitingForRanks"
    assert "waiting for the ranks of job-worker-3, job-worker-4, job-worker-5" in scaling["message"]
    # 20 s later the new ranks may still be starting (import torch, CUDA: 10-60 s), and
    # their reset with them: a remote shell that has run a while proves nothing.
    c.tick(20)
    c.ranks = dataclasses.replace(c.ranks, at=c.now)
    assert step() == []
    assert holding() == ["job-worker-0"]
    # The training's commit marker from each new host: their reset has ended.
    c.ranks = dataclasses.replace(c.ranks, committed=frozenset(new))
    assert step() == ["job-worker-0"]
    assert discovered(c.get("ConfigMap", "job-config")) == new
    assert holding() == ["job-worker-0", *new]


def test_a_node_takes_pods_once_ready_and_untainted_and_not_while_it_is_going_away() -> None:
    def node(*taints: tuple[str, str], cordoned: bool = False) -> dict[str, object]:
        spec: dict[str, object] = {"taints": [{"key": k, "effect": e} for k, e in taints]}
        if cordoned:
            spec["unschedulable"] = True
        return {"metadata": {"name": "n"}, "spec": spec}

    assert takes_pods(node(), DEFAULT_LEAVING_TAINTS)
    # A new node, before its kubelet reports Ready (the API server's admission taints it).
    assert not takes_pods(node(("node.kubernetes.io/not-ready", "NoSchedule")), ())
    assert not takes_pods(node(("node.kubernetes.io/unreachable", "NoExecute")), ())
    # A taint of ours or a user's is for the pods' tolerations: the scheduler judges it.
    assert takes_pods(node(("example.com/gpu", "NoSchedule")), ())
    assert takes_pods(node(("node.kubernetes.io/memory-pressure", "PreferNoSchedule")), ())
    assert not takes_pods(node(cordoned=True), ())
    assert not takes_pods(node(("karpenter.sh/disrupted", "NoSchedule")), DEFAULT_LEAVING_TAINTS)
