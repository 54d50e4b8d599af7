"""Which lane of the work queue a job's edit goes to (app/routes.py; docs/design.md,
"Which job goes next"), read from the informer caches as the controller fills them."""

from __future__ import annotations

import asyncio
from typing import Any

from mpijob_elastic.app.fleet import Fleet
from mpijob_elastic.app.routes import Routes
from mpijob_elastic.app.watches import Caches
from mpijob_elastic.core import names
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery.capacity_watch import CapacityWatch
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.workqueue import URGENT, WorkQueue

Key = tuple[str, str]


def job(name: str, replicas: int) -> dict[str, Any]:
    worker = {"replicas": replicas, "template": {}}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {"mpiReplicaSpecs": {"Worker": worker}},
    }


def owned(name: str, owner: str, role: str) -> dict[str, Any]:
    ref: dict[str, Any] = {"kind": names.KIND, "apiVersion": f"{names.GROUP}/v1"}
    ref |= {"name": owner, "uid": f"uid-{owner}", "controller": True}
    labels = {names.LABEL_ROLE: role}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "ownerReferences": [ref]}
    }


async def test_an_edit_that_asks_for_pods_goes_before_the_urgent_lane() -> None:
    caches = Caches()
    for kind, plural in (("Pod", "pods"), ("ConfigMap", "configmaps"), (names.KIND, "mpijobs")):
        caches.add(kind, None, Informer(None, "/api/v1", plural, lambda *_: None))  # type: ignore[arg-type]
    queue: WorkQueue[Key] = WorkQueue()
    fleet = Fleet(CapacityWatch(None, ("ns",)), lambda _keys: None)  # type: ignore[arg-type]
    routes = Routes(Settings(), caches, queue, fleet)
    pods, config_maps = caches.pick("Pod", "ns"), caches.pick("ConfigMap", "ns")
    assert pods is not None
    assert config_maps is not None
    for name in ("up", "down", "new"):
        for i in range(2):
            pods.upsert(owned(f"{name}-worker-{i}", name, names.ROLE_WORKER))
        pods.upsert(owned(f"{name}-launcher", name, names.ROLE_LAUNCHER))
    for name in ("up", "down"):
        config_maps.upsert(owned(names.config_map_name(name), name, ""))
    queue.add(("ns", "earlier"), lane=URGENT)
    routes.on_job("MODIFIED", job("down", 1))
    routes.on_job("MODIFIED", job("new", 3))  # no host list yet: behind the urgent ones
    routes.on_job("MODIFIED", job("up", 3))
    got = [await asyncio.wait_for(queue.get(), 0.2) for _ in range(4)]
    assert got == [("ns", "up"), ("ns", "earlier"), ("ns", "down"), ("ns", "new")]
