"""The fixtures every end-to-end module shares: a namespace of its own, and the controller
watching it (a local process on the KWOK cluster; on kind, the one hack/e2e-kind.sh
installed). A module that runs the controller with other flags defines its own
``controller``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.cluster import Cluster
from tests.controller import ControllerProcess
from tests.manifests import AdmissionPolicy, create_namespace

IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"


@pytest.fixture(scope="module")
def e2e_namespace(cluster: Cluster, admission_policy: AdmissionPolicy) -> Iterator[str]:
    name = create_namespace(cluster, admission_policy.namespace_labels)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def controller(
    cluster: Cluster, e2e_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess | None]:
    if IN_CLUSTER:
        yield None  # deployed from config/default by hack/e2e-kind.sh
        return
    proc = ControllerProcess(
        cluster, (e2e_namespace,), tmp_path_factory.mktemp("controller") / "controller.log"
    )
    proc.start()
    yield proc
    proc.stop()
