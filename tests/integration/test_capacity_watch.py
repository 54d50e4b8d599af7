"""The cluster-wide signal of room freed by other workloads (machinery/capacity_watch.py) against
the real API server: a hungry job's ConfigMap turns the watch on, a bound pod of another
workload that is deleted or ends wakes the hungry job, our own pods and unbound pods do
not, and the watch stops once no job is hungry (and starts again when one is)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio.config import new_client_from_config

from mpijob_elastic.app.fleet import Fleet, Key
from mpijob_elastic.core import names
from mpijob_elastic.machinery import capacity_watch
from mpijob_elastic.machinery.capacity_watch import QUIET_SECONDS, SETTLE_SECONDS, CapacityWatch
from tests.cluster import Cluster

HUNGRY = "0 1 2026-11-26T03:00:00.000000Z 2099-01-01T00:00:00.000000Z refused"


# The job the ConfigMap below is controlled by (the fleet reads only such a ConfigMap).
JOB_UID = "job-uid"


def config_map(namespace: str, growth: str) -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "metadata": {
            "namespace": namespace,
            "name": names.config_map_name("job"),
            "annotations": {names.ANN_GROWTH: growth},
            "ownerReferences": [{"controller": True, "uid": JOB_UID}],
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
        return await until(self.changed, predicate, within)


async def until(changed: asyncio.Event, predicate: Callable[[], bool], within: float) -> bool:
    async with asyncio.timeout(within):
        while not predicate():
            changed.clear()
            await changed.wait()
    return True


class Lists:
    """How many lists the watch's API client has had answered: a watch resumes from its
    list's resourceVersion, so a pod deleted once a list is answered reaches the watch
    that follows it, however late that opens (the API server replays from the version).
    The client's calls are the real ones, only counted."""

    def __init__(self, api: Any) -> None:
        self.answered = 0
        self.changed = asyncio.Event()
        call = api.call_api

        async def counted(*args: Any, **kwargs: Any) -> Any:
            response = await call(*args, **kwargs)
            if ("watch", "true") not in (kwargs.get("query_params") or []):
                self.answered += 1
                self.changed.set()
            return response

        api.call_api = counted

    async def reach(self, n: int, within: float = 30) -> None:
        try:
            await until(self.changed, lambda: self.answered >= n, within)
        except TimeoutError:
            raise AssertionError(
                f"the capacity watch listed {self.answered} times, not {n}"
            ) from None


Made = tuple[Fleet, Woken, Lists]


async def made_fleet(cluster: Cluster, namespace: str) -> AsyncIterator[Made]:
    """A fleet whose capacity watch covers the test's namespace alone: pods that other
    tests' namespaces lose meanwhile wake nothing here."""
    api = await new_client_from_config(config_file=cluster.kubeconfig)
    woken, lists = Woken(), Lists(api)
    made = Fleet(CapacityWatch(api, (namespace,)), woken)
    try:
        yield made, woken, lists
    finally:
        await made.watch.stop()
        await api.close()


@pytest.fixture
async def fleet(cluster: Cluster, namespace: str) -> AsyncIterator[Made]:
    async for made in made_fleet(cluster, namespace):
        yield made


@pytest.fixture
async def unspaced_fleet(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Made]:
    """The fleet with wakes one settle period after each pod, not spaced by the quiet
    period (the spacing is tests/unit/test_capacity_watch.py's and the test above's): a
    second wake need not wait out 10 s."""
    monkeypatch.setattr(capacity_watch, "QUIET_SECONDS", 0.0)
    async for made in made_fleet(cluster, namespace):
        yield made


async def test_bound_pods_of_others_going_away_wake_the_hungry_jobs(
    cluster: Cluster, namespace: str, fleet: Made
) -> None:
    made, woken, lists = fleet
    kubectl = cluster.kubectl
    for name, node, labels in [
        ("ours", "kwok-nowhere", {names.LABEL_JOB: "job"}),
        ("unbound", None, None),
        ("theirs", "kwok-nowhere", None),
        ("ends", "kwok-nowhere", None),
    ]:
        kubectl("apply", "-n", namespace, "-f", "-", input=pod(name, node, labels))
    made.config_map("ADDED", config_map(namespace, HUNGRY), JOB_UID)
    await lists.reach(1)  # the watch has listed: it sees every change from now on

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


async def woken_by_a_pod_going(cluster: Cluster, namespace: str, woken: Woken) -> None:
    """A bound pod of another workload comes and goes: the hungry fleet is woken."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod("probe", "kwok-nowhere"))
    cluster.kubectl("delete", "pod", "probe", "-n", namespace, "--grace-period=0", "--force")
    assert await woken.until(lambda: woken == [[(namespace, "job")]], SETTLE_SECONDS + 10)


async def test_the_watch_stops_when_no_job_is_hungry(
    cluster: Cluster, namespace: str, unspaced_fleet: Made
) -> None:
    made, woken, lists = unspaced_fleet
    made.config_map("ADDED", config_map(namespace, HUNGRY), JOB_UID)
    # It watches: a pod going wakes the hungry job. (A watch that never started fails here.)
    await lists.reach(1)
    await woken_by_a_pod_going(cluster, namespace, woken)
    woken.clear()

    made.config_map("MODIFIED", config_map(namespace, "2 0 - - grown"), JOB_UID)
    # The open watch ends at its next event: this pod's creation. Its deletion, which the
    # watch would report as it did the probe's, wakes nothing: within the settle period and
    # a margin, nothing else can show that nothing came.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod("first", "kwok-nowhere"))
    cluster.kubectl(
        "delete", "pod", "first", "-n", namespace, "--grace-period=0", "--force", "--wait"
    )
    await asyncio.sleep(SETTLE_SECONDS + 2)
    assert woken == []

    # Hungry again: the watch lists afresh and watches again.
    made.config_map("MODIFIED", config_map(namespace, HUNGRY), JOB_UID)
    await lists.reach(2)
    await woken_by_a_pod_going(cluster, namespace, woken)
