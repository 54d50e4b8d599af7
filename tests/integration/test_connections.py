"""The controller's connections to the API server when it watches many namespaces.

Twelve watches per namespace stay open for good (six when the defect was found). On one
client with a pool of 100 connections, 17 namespaces were enough to leave the writes
without a connection: the controller kept running and logging, and no job got its
children.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from mpijob_elastic.core import names
from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.kube import WRITE_TIMEOUT, Kube
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd")

# Past the 17 at which one shared pool ran dry (24 x 12 + 1 = 289 watches now).
NAMESPACES = 24


@pytest.fixture
def many_namespaces(cluster: Cluster) -> Iterator[list[str]]:
    created = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(NAMESPACES)]
    namespaces = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in created
        ],
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(namespaces))
    yield created
    cluster.kubectl("delete", "namespace", *created, "--wait=false", check=False)


def test_a_job_in_the_last_of_24_watched_namespaces_gets_its_children(
    cluster: Cluster, many_namespaces: list[str], start_controller: StartController
) -> None:
    ns = many_namespaces[-1]
    # Pods need the default ServiceAccount, which the controller-manager adds shortly.
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
    controller = start_controller(*many_namespaces)
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mpijob("wide", workers=2)))
    created = time.monotonic()

    launcher = names.launcher_name("wide")
    children = {
        "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps/{names.config_map_name('wide')}",
        "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{launcher}",
        "worker 0": f"/api/v1/namespaces/{ns}/pods/wide-worker-0",
        "worker 1": f"/api/v1/namespaces/{ns}/pods/wide-worker-1",
        "launcher": f"/api/v1/namespaces/{ns}/pods/{launcher}",
    }

    def missing() -> list[str]:
        return [what for what, path in children.items() if cluster.raw("GET", path) is None]

    # Seconds when it works; generous for a loaded machine. Before the fix, never.
    wait_for(lambda: not missing(), timeout=120, what="ConfigMap, Role, worker and launcher pods")
    took = time.monotonic() - created
    print(f"FIGURE defect 3: children of a job in the last of {NAMESPACES} namespaces: {took:.1f}s")
    # No write waited for a connection, so none failed along the way.
    assert [e for e in controller.log_entries() if e.get("level") == "WARNING"] == []


async def test_a_write_that_cannot_get_a_connection_fails_fast_and_says_why(
    cluster: Cluster,
) -> None:
    apis = clients.connect(
        await clients.load_configuration(cluster.kubeconfig), write_connections=1
    )
    try:
        # A watch holds the only write connection, as the watches did on the shared client.
        held = await apis.write.call_api(
            "/api/v1/namespaces/default/configmaps",
            "GET",
            query_params=[("watch", "true"), ("timeoutSeconds", 300)],
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        started = time.monotonic()
        with pytest.raises(aiohttp.ConnectionTimeoutError, match="all 1 write connections"):
            await Kube(apis.write).request("GET", "/api/v1/namespaces/default/configmaps")
        waited = time.monotonic() - started
        assert clients.WRITE_CONNECT_TIMEOUT_SECONDS - 1 < waited < WRITE_TIMEOUT
        held.close()
        # The connection is back, and writes flow again.
        listed = await Kube(apis.write).request("GET", "/api/v1/namespaces/default/configmaps")
        assert listed["kind"] == "ConfigMapList"
    finally:
        await apis.close()
