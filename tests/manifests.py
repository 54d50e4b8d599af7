"""Session fixtures that install this project's cluster-scoped manifests from config/.

``crd`` installs the MPIJob CRD exactly as shipped. ``admission_policy`` installs the shipped
ValidatingAdmissionPolicies, but binds them only in namespaces labelled
``ADMISSION_LABEL=ADMISSION_ENFORCED`` (use the ``admission_namespace`` fixture): the
policies stay for the rest of the session, and other tests create out-of-range jobs on
purpose to see how the controller copes on clusters without the policy.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob_elastic.core import names
from tests.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config"
CRD_FILE = CONFIG / "crd" / "kubeflow.org_mpijobs.yaml"
CRD_NAME = f"{names.PLURAL}.{names.GROUP}"
ADMISSION_FILES = (
    CONFIG / "admission" / "policy.yaml",
    CONFIG / "admission" / "scale-policy.yaml",
    CONFIG / "admission" / "ranks-policy.yaml",
    CONFIG / "admission" / "queue-policy.yaml",
)
ADMISSION_LABEL = "mpijob-elastic.io/test-admission"
ADMISSION_ENFORCED = "enforced"
# A policy change reaches the API server's admission plugin through an informer; on a
# loaded 2-core machine that has taken several seconds.
POLICY_READY_TIMEOUT = 60.0


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def mpijob(
    name: str,
    workers: int | None = 2,
    *,
    min_replicas: str | None = None,
    max_replicas: str | None = None,
    launchers: int | None = 1,
    slots: int | None = 1,
) -> dict[str, Any]:
    """A small valid MPIJob; None leaves a field out."""
    annotations = {}
    if min_replicas is not None:
        annotations[names.ANN_MIN_REPLICAS] = min_replicas
    if max_replicas is not None:
        annotations[names.ANN_MAX_REPLICAS] = max_replicas
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    launcher: dict[str, Any] = {"template": template}
    worker: dict[str, Any] = {"template": template}
    if launchers is not None:
        launcher["replicas"] = launchers
    if workers is not None:
        worker["replicas"] = workers
    spec: dict[str, Any] = {"mpiReplicaSpecs": {"Launcher": launcher, "Worker": worker}}
    if slots is not None:
        spec["slotsPerWorker"] = slots
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> str:
    """The MPIJob CRD installed and served; returns its name."""
    cluster.kubectl("apply", "-f", str(CRD_FILE))
    cluster.wait_established(CRD_NAME)
    # Established means the API server serves the resource, but kubectl's discovery cache
    # may lag; retry until a list works so the first test does not see "no such resource".
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", names.PLURAL, "-A", check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{CRD_NAME} is Established but cannot be listed")
        time.sleep(0.5)
    return CRD_NAME


@dataclass(frozen=True)
class AdmissionPolicy:
    """The installed policies and the namespace label their bindings select."""

    policy_names: tuple[str, ...]
    namespace_labels: dict[str, str]


def _confined(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "ValidatingAdmissionPolicyBinding":
        doc["spec"]["matchResources"] = {
            "namespaceSelector": {"matchLabels": {ADMISSION_LABEL: ADMISSION_ENFORCED}}
        }
    return doc


# Every test namespace's name starts so.
TEST_NAMESPACE_PREFIX = "t-"


def create_namespace(cluster: Cluster, labels: dict[str, str] | None = None) -> str:
    name = f"{TEST_NAMESPACE_PREFIX}{uuid.uuid4().hex[:10]}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
    return name


def deny_in_namespace(policy: str, namespace: str) -> dict[str, Any]:
    """A binding of the admission policy ``policy`` that denies in ``namespace`` only."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


def wait_until_rejected(
    cluster: Cluster, args: list[str], expect: str, what: str, input: str | None = None
) -> None:
    deadline = time.monotonic() + POLICY_READY_TIMEOUT
    while True:
        proc = cluster.kubectl(*args, input=input, check=False)
        if proc.returncode != 0 and expect in proc.stderr:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} did not take effect in {POLICY_READY_TIMEOUT}s: "
                f"rc={proc.returncode} stdout={proc.stdout!r} stderr={proc.stderr!r}"
            )
        time.sleep(0.5)


@pytest.fixture(scope="session")
def admission_policy(cluster: Cluster, crd: str) -> AdmissionPolicy:
    docs = [_confined(doc) for path in ADMISSION_FILES for doc in load_documents(path)]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1", "items": docs})
    )
    policies = tuple(
        d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
    )
    labels = {ADMISSION_LABEL: ADMISSION_ENFORCED}
    # Probe both policies with a known-bad request in a namespace of their own, so no test
    # starts before the API server enforces them.
    probe_ns = create_namespace(cluster, labels)
    try:
        bad = mpijob("probe", workers=9, max_replicas="1", min_replicas="1", slots=1)
        wait_until_rejected(
            cluster,
            ["create", "--dry-run=server", "-n", probe_ns, "-f", "-"],
            "above the maximum",
            "policy mpijob-elastic-bounds",
            input=json.dumps(bad),
        )
        good = mpijob("probe", workers=1, max_replicas="1", min_replicas="1")
        cluster.kubectl("create", "-n", probe_ns, "-f", "-", input=json.dumps(good))
        wait_until_rejected(
            cluster,
            ["scale", "--dry-run=server", "-n", probe_ns, "mpijob/probe", "--replicas=2"],
            "above the maximum",
            "policy mpijob-elastic-scale-bounds",
        )
    finally:
        cluster.kubectl("delete", "namespace", probe_ns, "--wait=false", check=False)
    return AdmissionPolicy(policies, labels)


@pytest.fixture
def admission_namespace(cluster: Cluster, admission_policy: AdmissionPolicy) -> Iterator[str]:
    """A fresh namespace in which the admission policies are enforced."""
    name = create_namespace(cluster, admission_policy.namespace_labels)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
