"""The cluster-wide signal of room freed by other workloads (machinery/capacity_watch.py) against
the real API server: a hungry job's ConfigMap turns the watch on, a bound pod of another
workload that is deleted or ends wakes the hungry job, our own pods and unbound pods do
not, and the watch stops once no job is hungry."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio.config import new_client_from_config

from mpijob_elastic.app.fleet import Fleet, Key
from mpijob_elastic.core import names
from mpijob_elastic.machinery.capacity_watch import QUIET_SECONDS, CapacityWatch
from tests.cluster import Cluster

HUNGRY = "0 1 2026-11-26T03:00:00.000000Z 2099-01-01T00:00:00.000000Z refused"


def config_map(namespace: str, growth: str) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "metadata": {
            "namespace": namespace,
            "name": names.config_map_name("job"),
            "annotations": {names.ANN_GROWTH: growth},
        },
    }


def pod(name: str, node: str | None, labels: dict[str, str] | None = None) -> str:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node  # no such node: nothing runs it, and the API server allows it
    else:
        spec["nodeSelector"] = {"example.com/no-such-node": "true"}  # stays unscheduled
    meta = {"name": name, "labels": labels or {}}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


class Woken(list[list[Key]]):
    """The fleet's wakes, each the keys it woke."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def __call__(self, keys: list[Key]) -> None:
        self.append(keys)
        self.changed.set()

    async def until(self, predicate: Callable[[], bool], within: float) -> bool:
        async with asyncio.timeout(within):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()
        return True


@pytest.fixture
async def fleet(cluster: Cluster) -> AsyncIterator[tuple[Fleet, Woken]]:
    api = await new_client_from_config(config_file=cluster.kubeconfig)
    woken = Woken()
    made = Fleet(CapacityWatch(api, ()), woken)
    yield made, woken
    await made.watch.stop()
    await api.close()


async def test_bound_pods_of_others_going_away_wake_the_hungry_jobs(
    cluster: Cluster, namespace: str, fleet: tuple[Fleet, Woken]
) -> None:
    made, woken = fleet
    kubectl = cluster.kubectl
    for name, node, labels in [
        ("ours", "kwok-nowhere", {names.LABEL_JOB: "job"}),
        ("unbound", None, None),
        ("theirs", "kwok-nowhere", None),
        ("ends", "kwok-nowhere", None),
    ]:
        kubectl("apply", "-n", namespace, "-f", "-", input=pod(name, node, labels))
    made.config_map("ADDED", config_map(namespace, HUNGRY))
    await asyncio.sleep(2)  # the watch lists, then watches

    # Ours (the pod cache judges those) and one that never held a node: no wake.
    kubectl("delete", "pod", "ours", "unbound", "-n", namespace, "--grace-period=0", "--force")
    await asyncio.sleep(3)
    assert woken == []

    kubectl("delete", "pod", "theirs", "-n", namespace, "--grace-period=0", "--force")
    assert await woken.until(lambda: woken == [[(namespace, "job")]], 5)
    assert made.capacity_changed is not None

    # A pod that reaches Succeeded leaves the selection: the API server says DELETED. It
    # comes within the quiet period, so it is deferred to its end, not dropped.
    status = json.dumps({"status": {"phase": "Succeeded"}})
    kubectl("patch", "pod", "ends", "-n", namespace, "--subresource=status", "-p", status)
    await asyncio.sleep(2)
    assert len(woken) == 1
    assert await woken.until(lambda: len(woken) == 2, QUIET_SECONDS + 5)


async def test_the_watch_stops_when_no_job_is_hungry(
    cluster: Cluster, namespace: str, fleet: tuple[Fleet, Woken]
) -> None:
    made, woken = fleet
    made.config_map("ADDED", config_map(namespace, HUNGRY))
    await asyncio.sleep(2)  # the watch lists, then watches
    made.config_map("MODIFIED", config_map(namespace, "2 0 - - grown"))
    # The open watch ends at its next event: this pod's creation.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod("first", "kwok-nowhere"))
    await asyncio.sleep(2)
    cluster.kubectl(
        "delete", "pod", "first", "-n", namespace, "--grace-period=0", "--force", "--wait"
    )
    await asyncio.sleep(3)
    assert woken == []
