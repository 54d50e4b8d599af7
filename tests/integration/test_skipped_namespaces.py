"""Issue 31 §4: installed cluster-wide, the controller leaves kube-system, kube-public and its
own namespace alone (``--skip-namespaces``), and config/admission/namespaces-policy.yaml
keeps its ServiceAccount's token from writing there, so that the token is not worth the
ServiceAccounts of kube-system.

Before, a cluster-wide controller made the pods of a job in kube-system, and its
ServiceAccount could create any pod there."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.manifests import CONFIG, POLICY_READY_TIMEOUT, create_namespace, load_documents

pytestmark = pytest.mark.usefixtures("crd")

POLICY = CONFIG / "admission" / "namespaces-policy.yaml"
# The controller's own namespace and ServiceAccount, as config/ installs them.
OWN_NAMESPACE = "mpijob-elastic-system"
ACCOUNT = f"system:serviceaccount:{OWN_NAMESPACE}:mpijob-elastic"
REFUSED = "mpijob-elastic leaves this namespace alone"


def managed(name: str) -> dict[str, Any]:
    """A job only a controller with ``--only-managed-by`` takes: other tests' jobs in this
    cluster stay out of the cluster-wide controller's way."""
    manifest = elastic_job(name, 1)
    manifest["spec"]["runPolicy"] = {"managedBy": names.MANAGED_BY}
    return manifest


def nothing_written(job: Job) -> bool:
    """No pod, no ConfigMap, no status: the controller never took the job."""
    status = job.get().get("status") or {}
    return not (job.pods() or job.pods(names.ROLE_LAUNCHER) or job.config() or status)


def test_a_cluster_wide_controller_leaves_the_skipped_namespaces_alone(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    skipped = create_namespace(cluster)
    jobs = [Job(cluster, ns, f"skip-{uuid.uuid4().hex[:6]}") for ns in ("kube-system", skipped)]
    served = Job(cluster, namespace, "served")
    try:
        # The defaults (kube-system, kube-public), and a namespace named on the command line.
        start_controller(args=("--only-managed-by", "--skip-namespaces", f"kube-system,{skipped}"))
        for job in jobs:
            job.create(managed(job.name))
        served.create(managed(served.name))
        # The served job, created last, gets its pods: the others' turn would have come.
        wait_for(lambda: served.pods(names.ROLE_LAUNCHER), 60, "the served job's launcher")
        for job in jobs:
            assert nothing_written(job), job.ns
    finally:
        for job in jobs:
            cluster.kubectl("delete", "mpijob", job.name, "-n", job.ns, check=False)
        cluster.kubectl("delete", "namespace", skipped, "--wait=false", check=False)


def test_by_default_a_cluster_wide_controller_skips_the_system_namespaces(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    job = Job(cluster, "kube-public", f"skip-{uuid.uuid4().hex[:6]}")
    served = Job(cluster, namespace, "served")
    try:
        start_controller(args=("--only-managed-by",))
        job.create(managed(job.name))
        served.create(managed(served.name))
        wait_for(lambda: served.pods(names.ROLE_LAUNCHER), 60, "the served job's launcher")
        assert nothing_written(job)
    finally:
        cluster.kubectl("delete", "mpijob", job.name, "-n", job.ns, check=False)


@pytest.fixture
def as_controller(cluster: Cluster) -> Iterator[list[str]]:
    """kubectl as the shipped controller's ServiceAccount, with its shipped roles and the
    namespaces policy installed; the policy, keyed to that one account, binds nothing else."""
    if cluster.kubectl("get", "namespace", OWN_NAMESPACE, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", OWN_NAMESPACE)
    shipped = [
        doc
        for path in (CONFIG / "rbac" / "role.yaml", CONFIG / "rbac" / "leader_election.yaml")
        for doc in load_documents(path)
    ]
    binding = f"namespaces-policy-{uuid.uuid4().hex[:6]}"
    shipped.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "mpijob-elastic-controller",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "mpijob-elastic", "namespace": OWN_NAMESPACE}
            ],
        }
    )
    listed = {"apiVersion": "v1", "kind": "List", "items": [*shipped, *load_documents(POLICY)]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(listed))
    try:
        yield ["--as", ACCOUNT, "--as-group", "system:serviceaccounts"]
    finally:
        cluster.kubectl("delete", "clusterrolebinding", binding, check=False)
        cluster.kubectl("delete", "-f", str(POLICY), check=False)


def pod(name: str) -> str:
    """A pod any namespace admits, the controller's own included (config/manager labels it
    for the restricted Pod Security level): only the policy may refuse it."""
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {"name": "c", "image": "busybox", "securityContext": restricted}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [container]},
        }
    )


def test_the_controllers_account_writes_nothing_in_the_skipped_namespaces(
    cluster: Cluster, namespace: str, as_controller: list[str]
) -> None:
    def create_pod(ns: str) -> Any:
        return cluster.kubectl(
            *as_controller, "create", "--dry-run=server", "-n", ns, "-f", "-",
            input=pod("taken"), check=False,
        )  # fmt: skip

    # The policy reaches the API server's admission plugin through an informer.
    wait_for(
        lambda: REFUSED in create_pod("kube-system").stderr,
        POLICY_READY_TIMEOUT,
        "the policy refusing a pod in kube-system",
    )
    for ns in ("kube-public", OWN_NAMESPACE):
        assert REFUSED in create_pod(ns).stderr, ns
    refused = cluster.kubectl(
        *as_controller, "create", "configmap", "x", "--dry-run=server", "-n", OWN_NAMESPACE,
        check=False,
    )  # fmt: skip
    assert REFUSED in refused.stderr
    # Its rights elsewhere are untouched, and so are its Lease and Events at home.
    made = create_pod(namespace)
    assert made.returncode == 0, made.stderr
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "mpijob-elastic", "namespace": OWN_NAMESPACE},
        "spec": {"holderIdentity": "a"},
    }
    took = cluster.kubectl(
        *as_controller, "create", "--dry-run=server", "-f", "-", input=json.dumps(lease),
        check=False,
    )  # fmt: skip
    assert took.returncode == 0, took.stderr
