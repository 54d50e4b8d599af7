"""Who the API server is told wrote: Kube's writes carry the fieldManager, and the
controller's clients (writes and watches alike) its User-Agent, by which the API server
names a write that carries none (managedFields) and every request (audit logs)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.kube import ApiError, Kube
from mpijob_elastic.machinery.kubeclient import ApiClient
from tests.cluster import Cluster


def config_map(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        # A field to manage: an object with none has no managedFields.
        "data": {"written-by": name},
    }


async def post(api: ApiClient, namespace: str, name: str) -> None:
    """A create without a fieldManager."""
    response = await api.call_api(
        f"/api/v1/namespaces/{namespace}/configmaps",
        "POST",
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=config_map(namespace, name),
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    async with response:
        assert response.status == 201, await response.text()


def managers(cluster: Cluster, namespace: str, name: str) -> list[str]:
    got = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}") or {}
    return [f["manager"] for f in got["metadata"]["managedFields"]]


async def test_the_controller_names_itself_to_the_api_server(
    cluster: Cluster, namespace: str
) -> None:
    configuration = await clients.load_configuration(cluster.kubeconfig)
    apis = clients.connect(configuration, write_connections=2)
    # kubernetes_asyncio's own User-Agent, "OpenAPI-Generator/...".
    plain = ApiClient(copy.deepcopy(configuration))
    try:
        await Kube(plain).create(config_map(namespace, "by-kube"))
        await post(apis.write, namespace, "by-write-client")
        await post(apis.watch, namespace, "by-watch-client")
        await post(plain, namespace, "by-someone-else")
    finally:
        await apis.close()
        await plain.close()
    for name in ("by-kube", "by-write-client", "by-watch-client"):
        assert managers(cluster, namespace, name) == [clients.FIELD_MANAGER], name
    # What either would have been recorded as without it: the check can tell.
    (other,) = managers(cluster, namespace, "by-someone-else")
    assert other != clients.FIELD_MANAGER
    assert clients.USER_AGENT.startswith(f"{clients.FIELD_MANAGER}/0.")


async def test_a_delete_as_seen_is_refused_once_the_object_changed(
    cluster: Cluster, namespace: str
) -> None:
    # A refused probe's delete (actions.DeletePod.resource_version): a pod the scheduler
    # bound since the turn's view is another version, and stays.
    configuration = await clients.load_configuration(cluster.kubeconfig)
    api = ApiClient(configuration)
    kube = Kube(api)
    try:
        seen = await kube.create(config_map(namespace, "as-seen"))
        meta = seen["metadata"]
        cluster.kubectl("label", "configmap", "as-seen", "-n", namespace, "changed=yes")
        with pytest.raises(ApiError) as refused:
            await kube.delete(
                "ConfigMap", namespace, "as-seen", meta["uid"], None, meta["resourceVersion"]
            )
        assert refused.value.conflict, refused.value
        now = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/configmaps/as-seen") or {}
        assert now["metadata"]["labels"] == {"changed": "yes"}
        await kube.delete(
            "ConfigMap", namespace, "as-seen", meta["uid"], None, now["metadata"]["resourceVersion"]
        )
        assert cluster.raw("GET", f"/api/v1/namespaces/{namespace}/configmaps/as-seen") is None
    finally:
        await api.close()
