"""The controller's connections to the API server when it watches many namespaces.

Six watches per namespace stay open for good. On one client with a pool of 100
connections, 17 namespaces were enough to leave the writes without a connection: the
controller kept running and logging, and no job got its children.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from mpijob_elastic import names
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd")

# Past the 17 at which one shared pool ran dry (24 x 6 = 144 watches).
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
    print(f"children of a job in the last of {NAMESPACES} namespaces after {took:.1f}s")
    # No write waited for a connection, so none failed along the way.
    assert [e for e in controller.log_entries() if e.get("level") == "WARNING"] == []
