"""The Informer against the real local cluster: ConfigMaps changed with kubectl.

Every test labels its objects with its own namespace's name and selects on that label, so
all-namespace informers do not see other tests' objects (nor the kube-root-ca.crt that the
controller-manager puts in every namespace).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import new_client_from_config

from mpijob_elastic.informer import Informer, Obj
from tests.cluster import Cluster

pytestmark = pytest.mark.cluster

TIMEOUT = 15.0
RUN_LABEL = "informer-test"


class Recorder:
    """The event handler: records (type, name) and lets a test wait for a condition."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.objects: list[Obj] = []
        self._changed = asyncio.Event()

    def __call__(self, event_type: str, obj: Obj) -> None:
        self.events.append((event_type, obj["metadata"]["name"]))
        self.objects.append(obj)
        self._changed.set()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(TIMEOUT):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


MakeInformer = Callable[..., Awaitable[Informer]]


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[ApiClient]:
    client: ApiClient = await new_client_from_config(config_file=cluster.kubeconfig)
    yield client
    await client.close()


@pytest.fixture
async def make_informer(api: ApiClient) -> AsyncIterator[MakeInformer]:
    """Starts ConfigMap informers and stops them at the end of the test, even on failure."""
    started: list[Informer] = []

    async def make(
        handler: Recorder,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        watch_timeout_seconds: float = 300.0,
        wait_synced: bool = True,
    ) -> Informer:
        informer = Informer(
            api,
            "/api/v1",
            "configmaps",
            handler,
            namespace=namespace,
            label_selector=label_selector,
            watch_timeout_seconds=watch_timeout_seconds,
        )
        informer.start()
        started.append(informer)
        if wait_synced:
            await asyncio.wait_for(informer.synced.wait(), TIMEOUT)
        return informer

    yield make
    for informer in started:
        await informer.stop()


def configmap(
    namespace: str,
    name: str,
    data: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    owner: Obj | None = None,
    controller: bool = True,
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": {RUN_LABEL: namespace, **(labels or {})},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": controller,
            }
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {}}


async def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    """kubectl in a thread, so the informers keep reading their watches meanwhile."""
    proc = await asyncio.to_thread(cluster.kubectl, *args, input=input)
    return proc.stdout


async def create(cluster: Cluster, obj: Obj) -> Obj:
    out = await kubectl(cluster, "create", "-o", "json", "-f", "-", input=json.dumps(obj))
    created: Obj = json.loads(out)
    return created


async def patch_data(cluster: Cluster, namespace: str, name: str, data: dict[str, str]) -> Obj:
    out = await kubectl(
        cluster, "patch", "configmap", name, "-n", namespace, "-o", "json",
        "--type=merge", "-p", json.dumps({"data": data}),
    )  # fmt: skip
    patched: Obj = json.loads(out)
    return patched


async def delete(cluster: Cluster, namespace: str, *names: str) -> None:
    await kubectl(cluster, "delete", "configmap", "-n", namespace, "--wait=false", *names)


def names(objs: list[Obj]) -> list[str]:
    return [obj["metadata"]["name"] for obj in objs]


def selector(namespace: str) -> str:
    return f"{RUN_LABEL}={namespace}"


async def test_initial_list_fills_cache_and_sets_synced(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    for name in ("a", "b", "c"):
        await create(cluster, configmap(namespace, name, {"k": name}))
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))

    assert informer.synced.is_set()
    assert names(informer.list()) == ["a", "b", "c"]
    assert sorted(handler.events) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    b = informer.get(namespace, "b")
    assert b is not None
    assert b["data"] == {"k": "b"}
    # Listed items get the kind and apiVersion that watch events carry anyway.
    assert (b["kind"], b["apiVersion"]) == ("ConfigMap", "v1")
    assert int(b["metadata"]["resourceVersion"]) > 0
    assert informer.get(namespace, "missing") is None


async def test_watch_events_reach_handler_and_cache(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    assert informer.list() == []

    await create(cluster, configmap(namespace, "a", {"k": "1"}))
    await handler.wait_until(lambda: ("ADDED", "a") in handler.events)
    assert informer.get(namespace, "a") is not None

    patched = await patch_data(cluster, namespace, "a", {"k": "2"})
    await handler.wait_until(lambda: ("MODIFIED", "a") in handler.events)
    cached = informer.get(namespace, "a")
    assert cached is not None
    assert cached["data"] == {"k": "2"}
    assert cached["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    # The handler runs after the cache holds the change.
    assert handler.objects[-1] is cached

    await delete(cluster, namespace, "a")
    await handler.wait_until(lambda: ("DELETED", "a") in handler.events)
    assert informer.get(namespace, "a") is None
    assert handler.events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


async def test_label_selector_and_namespace_filtering(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    await kubectl(cluster, "create", "namespace", other)
    try:
        everywhere = Recorder()
        all_namespaces = await make_informer(
            everywhere, label_selector=f"{selector(namespace)},app=x"
        )
        here = Recorder()
        one_namespace = await make_informer(here, namespace=namespace, label_selector="app=x")

        # "other" gets this test's label too, so only the namespace filter keeps c out.
        await create(cluster, configmap(namespace, "a", labels={"app": "x"}))
        await create(cluster, configmap(namespace, "b", labels={"app": "y"}))
        await create(cluster, configmap(other, "c", labels={"app": "x", RUN_LABEL: namespace}))
        await everywhere.wait_until(lambda: len(everywhere.events) == 2)
        await here.wait_until(lambda: len(here.events) == 1)

        listed = [
            (o["metadata"]["namespace"], o["metadata"]["name"]) for o in all_namespaces.list()
        ]
        assert listed == sorted([(namespace, "a"), (other, "c")])
        assert names(all_namespaces.list(namespace=other)) == ["c"]
        assert names(all_namespaces.list(namespace=namespace)) == ["a"]
        assert names(one_namespace.list()) == ["a"]
        assert all_namespaces.get(other, "c") is not None
        assert one_namespace.get(other, "c") is None

        # An object that stops matching the selector is DELETED for the informer.
        await kubectl(cluster, "label", "configmap", "a", "-n", namespace, "app=z", "--overwrite")
        await here.wait_until(lambda: ("DELETED", "a") in here.events)
        assert one_namespace.list() == []
        await everywhere.wait_until(lambda: ("DELETED", "a") in everywhere.events)
        assert names(all_namespaces.list()) == ["c"]
    finally:
        await kubectl(cluster, "delete", "namespace", other, "--wait=false")


async def test_by_owner_indexes_controller_references(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    parent = await create(cluster, configmap(namespace, "parent"))
    uid = parent["metadata"]["uid"]
    await create(cluster, configmap(namespace, "child-1", owner=parent))
    await create(cluster, configmap(namespace, "child-0", owner=parent))
    # Owned but not controlled, and not owned at all: neither is in the index.
    await create(cluster, configmap(namespace, "dependent", owner=parent, controller=False))
    await create(cluster, configmap(namespace, "orphan"))
    await handler.wait_until(lambda: len(handler.events) == 5)

    assert names(informer.by_owner(uid)) == ["child-0", "child-1"]
    assert informer.by_owner("no-such-uid") == []

    await delete(cluster, namespace, "child-1")
    await handler.wait_until(lambda: ("DELETED", "child-1") in handler.events)
    assert names(informer.by_owner(uid)) == ["child-0"]


async def test_upsert_gives_read_your_writes(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    created = await create(cluster, configmap(namespace, "a", {"k": "1"}))
    informer.upsert(created)
    assert informer.get(namespace, "a") is created
    await handler.wait_until(lambda: ("ADDED", "a") in handler.events)

    patched = await patch_data(cluster, namespace, "a", {"k": "2"})
    informer.upsert(patched)
    assert informer.get(namespace, "a") is patched
    # The write result of an older version must not take the cache back in time.
    informer.upsert(created)
    assert informer.get(namespace, "a") is patched
    await handler.wait_until(lambda: ("MODIFIED", "a") in handler.events)
    cached = informer.get(namespace, "a")
    assert cached is not None
    assert cached["data"] == {"k": "2"}

    await delete(cluster, namespace, "a")
    await handler.wait_until(lambda: ("DELETED", "a") in handler.events)
    # A write result arriving after the deletion was seen cannot resurrect the object.
    informer.upsert(patched)
    assert informer.get(namespace, "a") is None


def records(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(
        text in record.getMessage()
        for record in caplog.records
        if record.name == "mpijob_elastic.informer"
    )


async def test_watch_resumes_after_server_timeout_without_relist(
    cluster: Cluster, namespace: str, make_informer: MakeInformer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mpijob_elastic.informer")
    handler = Recorder()
    # The server ends each watch after a second.
    informer = await make_informer(
        handler,
        namespace=namespace,
        label_selector=selector(namespace),
        watch_timeout_seconds=1,
    )
    await create(cluster, configmap(namespace, "a"))
    await handler.wait_until(lambda: ("ADDED", "a") in handler.events)
    # Let the watch end and resume a couple of times.
    for _ in range(int(TIMEOUT / 0.1)):
        if records(caplog, "watch ended") >= 2:
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the watch did not end twice")
    await create(cluster, configmap(namespace, "b"))
    await handler.wait_until(lambda: ("ADDED", "b") in handler.events)

    assert records(caplog, "listed") == 1
    assert records(caplog, "watching from") >= 3
    assert names(informer.list()) == ["a", "b"]


async def test_410_gone_relists_and_reports_what_changed_meanwhile(
    cluster: Cluster, namespace: str, make_informer: MakeInformer, caplog: pytest.LogCaptureFixture
) -> None:
    """An informer that was away too long gets 410 Gone, relists and catches up.

    How the 410 is provoked: the informer is stopped (as if cut off by a partition), the
    objects change meanwhile, and its remembered resourceVersion is set to "1" before it
    starts again, as if the server's history had moved on past it while it was away. The
    kube-apiserver's watch cache starts at the resourceVersion it had when it started, so
    a watch from "1" is answered with a real ERROR event "410 Expired: too old resource
    version". Waiting for the history to really move past a resourceVersion would take
    minutes: the watch cache keeps at least 75 s of events, and etcd compacts every 5 min.
    """
    caplog.set_level(logging.INFO, logger="mpijob_elastic.informer")
    for name in ("gone", "changed", "same"):
        await create(cluster, configmap(namespace, name, {"k": "1"}))
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    assert names(informer.list()) == ["changed", "gone", "same"]
    await informer.stop()

    await delete(cluster, namespace, "gone")
    await patch_data(cluster, namespace, "changed", {"k": "2"})
    await create(cluster, configmap(namespace, "new"))
    handler.events.clear()
    informer._resource_version = "1"
    informer.start()

    await handler.wait_until(lambda: len(handler.events) == 3)
    assert sorted(handler.events) == [
        ("ADDED", "new"),
        ("DELETED", "gone"),
        ("MODIFIED", "changed"),
    ]
    assert names(informer.list()) == ["changed", "new", "same"]
    changed = informer.get(namespace, "changed")
    assert changed is not None
    assert changed["data"] == {"k": "2"}
    assert records(caplog, "410") == 1
    assert records(caplog, "listed") == 2

    # And the watch that follows the relist works.
    await delete(cluster, namespace, "same")
    await handler.wait_until(lambda: ("DELETED", "same") in handler.events)
    assert names(informer.list()) == ["changed", "new"]


async def test_restart_resumes_from_last_resource_version(
    cluster: Cluster, namespace: str, make_informer: MakeInformer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mpijob_elastic.informer")
    await create(cluster, configmap(namespace, "a"))
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    await informer.stop()
    await delete(cluster, namespace, "a")
    await create(cluster, configmap(namespace, "b"))
    informer.start()
    # Still within the server's history: the watch replays what was missed, no relist.
    await handler.wait_until(lambda: ("ADDED", "b") in handler.events)
    assert handler.events == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    assert records(caplog, "listed") == 1


async def test_stop_is_clean_and_final(
    cluster: Cluster, namespace: str, make_informer: MakeInformer
) -> None:
    handler = Recorder()
    informer = await make_informer(handler, namespace=namespace, label_selector=selector(namespace))
    tasks_before = asyncio.all_tasks()
    await informer.stop()
    await informer.stop()  # a second stop is harmless
    assert {task.get_name() for task in tasks_before - asyncio.all_tasks()} == {repr(informer)}

    await create(cluster, configmap(namespace, "a"))
    await asyncio.sleep(0.5)
    assert handler.events == []
    assert informer.list() == []

    # Stopping in the middle of the first list is clean too.
    early = await make_informer(Recorder(), namespace=namespace, wait_synced=False)
    await early.stop()
    assert not early.synced.is_set()
