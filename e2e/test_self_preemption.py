"""End to end on KWOK: an opportunistic job that loses its whole baseline with a node,
while its opportunistic workers fill the only room left, judged by the mock Horovod driver.

The baseline's replacements outrank the job's own opportunistic workers, so the scheduler
preempts those to place them. Created together, the replacements took both remaining
rank-holders at once; the host-list rules kept the last one listed while it terminated
(a reset needs a host of the previous set), the replacements waited for its room, and its
ranks were killed at the end of its grace period: a failure (seen in `make
bench-capacity`, docs/benchmarks.md). The controller now creates the baseline's
replacements one at a time while the job holds opportunistic workers (docs/capacity.md).

KWOK only: it needs nodes of its own that it adds and takes away (fake nodes with 2 GPUs
each, tainted for this test's workers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import ElasticRun
from e2e.mockhorovod import events as ev
from e2e.test_relocation import nothing_fatal
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster, fake_gpu_node, on_gpu_pool
from tests.controller import ControllerProcess, wait_for

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
PRIORITY_CLASS = ROOT / "config" / "default" / "priority_class.yaml"
POOL = "self-preemption"
TAINT = "example.com/self-preemption"
RECLAIMED = "example.com/reclaimed"
NODES = ("self-preemption-a", "self-preemption-b")
BASELINE, MAXIMUM = 2, 4


def job() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    manifest["metadata"]["name"] = "selfpre"
    manifest["metadata"]["annotations"].update(
        {
            names.ANN_MAX_REPLICAS: str(MAXIMUM),
            names.ANN_OPPORTUNISTIC: "true",
            names.ANN_DRAIN_SECONDS: "15",
        }
    )
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]
    worker["replicas"] = BASELINE
    spec = worker["template"]["spec"]
    on_gpu_pool(spec, {"pool": POOL}, TAINT)
    return manifest


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[None]:
    cluster.kubectl("apply", "-f", str(PRIORITY_CLASS))
    yield
    for name in NODES:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def workers(run: ElasticRun) -> list[dict[str, Any]]:
    out = json.loads(
        run.kubectl("get", "pods", "-l", names.selector(run.job, names.ROLE_WORKER), "-o", "json")
    )
    return list(out["items"])


def baseline_holding_ranks(run: ElasticRun) -> set[str] | None:
    """The job's baseline workers on node b, once they alone hold ranks and nothing of
    the job terminates any more."""
    pods = workers(run)
    if any(p["metadata"].get("deletionTimestamp") for p in pods):
        return None
    base = {
        p["metadata"]["name"]
        for p in pods
        if (p["metadata"].get("labels") or {}).get(names.LABEL_OPPORTUNISTIC) != "true"
        and p["spec"].get("nodeName") == NODES[1]
    }
    settled = len(base) == BASELINE and run.ranks_running_on() == base
    return base if settled and set(run.discovered()) == base else None


def test_a_lost_baseline_is_replaced_without_killing_the_last_rank_holder(
    cluster: Cluster, e2e_namespace: str, pool: None, tmp_path: Path
) -> None:
    controller = ControllerProcess(
        cluster,
        (e2e_namespace,),
        tmp_path / "controller.log",
        args=("--growth-backoff-max-seconds", "20"),
    )
    controller.start()
    run = ElasticRun(
        cluster,
        e2e_namespace,
        job(),
        tmp_path / "run",
        driver_args=("-np", str(BASELINE), "--min-np", "1", "--max-np", str(MAXIMUM)),
    )
    try:
        # The baseline on node a, the only room there is; then node b, and the job grows
        # into it: its two opportunistic workers are all that node holds.
        cluster.apply(fake_gpu_node(NODES[0], 2, TAINT, {"pool": POOL}))
        run.submit()
        run.start_launcher()
        run.wait_for_size(BASELINE, timeout=120)
        cluster.apply(fake_gpu_node(NODES[1], 2, TAINT, {"pool": POOL}))
        run.wait_for_size(MAXIMUM, timeout=120)
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in workers(run)}
        opportunistic = {
            p["metadata"]["name"]
            for p in workers(run)
            if p["metadata"]["labels"].get(names.LABEL_OPPORTUNISTIC) == "true"
        }
        assert {placed[n] for n in opportunistic} == {NODES[1]}, placed
        # Node a is reclaimed: its pods are deleted (the taint manager) and nothing may
        # go there any more. The replacements find room only by preempting.
        since = time.time()
        cluster.kubectl("taint", "node", NODES[0], f"{RECLAIMED}=true:NoExecute")
        # With both replacements at once, the kept victim's ranks die at the end of its
        # 30 s grace period; one at a time, the job settles in seconds.
        settled = wait_for(lambda: baseline_holding_ranks(run), 90, "two new baseline workers")
        assert not settled & set(placed), (settled, placed)
        nothing_fatal(run, since)
        assert run.driver_events(ev.HOST_BLACKLISTED) == []
    finally:
        run.close()
        controller.stop()
