"""Pytest fixtures for the real local cluster (KWOK binary runtime).

The cluster is started once per session by ``hack/cluster-up.sh`` under a name of its own,
and removed at the end. Set ``MPIJOB_ELASTIC_KUBECONFIG`` to run against a cluster that is
already up (a kept demo cluster, or any cluster you point at): then nothing is started or
stopped. Unit tests never ask for these fixtures, so they run without a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parent.parent
HACK = ROOT / "hack"


def binaries_dir() -> Path:
    out = subprocess.run(
        [str(HACK / "build-binaries.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip())


def fake_gpu_node(
    name: str, gpus: int, taint: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A KWOK node with ``gpus`` GPUs, tainted ``taint`` (NoSchedule) so that only the
    pods that tolerate it land there."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
        },
        "spec": {"taints": [{"key": taint, "effect": "NoSchedule"}]},
        "status": {
            "allocatable": capacity,
            "capacity": capacity,
            "nodeInfo": {
                "kubeletVersion": "fake",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def on_gpu_pool(spec: dict[str, Any], labels: dict[str, str], taint: str) -> None:
    """A pod template's ``spec`` on the nodes of ``fake_gpu_node`` with these labels and
    taint, each container asking for one GPU."""
    spec["nodeSelector"] = dict(labels)
    spec["tolerations"] = [{"key": taint, "operator": "Exists"}]
    for container in spec["containers"]:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its kubeconfig and the kubectl built for its version."""

    kubeconfig: str
    kubectl_path: str
    _api: client.ApiClient | None = field(default=None, compare=False, repr=False)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, as_user: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl_path, "--kubeconfig", self.kubeconfig, *args]
        if as_user:
            cmd += ["--as", as_user]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Until each named CRD is Established. Right after its create a CRD's
        ``status.conditions`` may still be null, which ``kubectl wait`` rejects at once
        rather than waiting (seen under load): it is asked again until the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(1, int(deadline - time.monotonic()))
            args = ("wait", "--for=condition=Established", *(f"crd/{c}" for c in crds))
            proc = self.kubectl(*args, f"--timeout={left}s", check=False)
            if proc.returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
            time.sleep(0.5)

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=text)

    def api_client(self) -> client.ApiClient:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=self.kubeconfig
        )
        return api

    def raw(self, method: str, path: str, body: Any = None) -> dict[str, Any] | None:
        """One API request as plain JSON (None for 404): what the server holds, untyped."""
        if self._api is None:
            object.__setattr__(self, "_api", self.api_client())
        api: Any = self._api
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        headers = {"Accept": "application/json", "Content-Type": content}
        request = api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = api.call_api(*request)
        response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise AssertionError(f"{method} {path}: {response.status} {response.data[:300]!r}")
        return dict(json.loads(response.data))

    def service_account_kubeconfig(self, namespace: str, service_account: str, path: Path) -> str:
        """Write a kubeconfig that acts as a ServiceAccount, with a token from TokenRequest.

        Impersonation (--as) would go through the admin's credentials; a real token makes
        the API server authenticate the ServiceAccount itself, as in a pod.
        """
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration=2h"
        ).stdout.strip()
        admin = yaml.safe_load(Path(self.kubeconfig).read_text())
        server = admin["clusters"][0]["cluster"]
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": server}],
                    "users": [{"name": service_account, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "c",
                            "context": {
                                "cluster": "c",
                                "user": service_account,
                                "namespace": namespace,
                            },
                        }
                    ],
                    "current-context": "c",
                }
            )
        )
        return str(path)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    bin_dir = binaries_dir()
    existing = os.environ.get("MPIJOB_ELASTIC_KUBECONFIG")
    if existing:
        yield Cluster(existing, str(bin_dir / "kubectl"))
        return
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER=f"mpijob-elastic-test-{os.getpid()}")
    out = subprocess.run(
        [str(HACK / "cluster-up.sh")], check=True, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        yield Cluster(out.stdout.strip().splitlines()[-1], str(bin_dir / "kubectl"))
    finally:
        subprocess.run([str(HACK / "cluster-down.sh")], env=env, check=False)


def delete_namespace(cluster: Cluster, name: str) -> None:
    """Delete without waiting for it to go; gone already is fine."""
    with contextlib.suppress(AssertionError):
        cluster.raw("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, so tests cannot see each other's objects. Made and
    deleted by requests of this process (a kubectl each was most of this fixture's time)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.raw(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    # Pods need the default ServiceAccount. The controller-manager adds it, but on a starved
    # machine not always within 90 s (3 tests of one cluster in a make test from nothing,
    # load 32, 2026-12-06): made here, it is one request, and the controller-manager's own
    # create then meets ours and keeps it.
    with contextlib.suppress(AssertionError):  # 409: the controller-manager was first
        cluster.raw(
            "POST",
            f"/api/v1/namespaces/{name}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
        )
    assert cluster.raw("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None
    yield name
    delete_namespace(cluster, name)


@pytest.fixture
def core(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = cluster.api_client()
    yield client.CoreV1Api(api)
    api.close()  # type: ignore[no-untyped-call]
