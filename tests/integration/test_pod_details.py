"""The pod details training-operator 1.9 has, on the real local cluster: a launcher that
requests a GPU is a host, a ServiceAccount named in the launcher template is the
launcher's, and the user's MPI environment is kept. RBAC is checked with the
ServiceAccount's own token against the real API server."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import wait_for
from tests.integration.test_controller import Job, can_exec, elastic_job

pytestmark = pytest.mark.usefixtures("crd")


def launcher_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Launcher template's spec, no longer shared with the Worker's (tests.manifests
    gives both roles one template)."""
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]
    launcher["template"] = copy.deepcopy(launcher["template"])
    spec: dict[str, Any] = launcher["template"]["spec"]
    return spec


def kubectl_as(cluster: Cluster, ns: str, account: str, tmp_path: Path) -> Cluster:
    kubeconfig = cluster.service_account_kubeconfig(ns, account, tmp_path / f"{account}.kubeconfig")
    return Cluster(kubeconfig, cluster.kubectl_path)


def get(cluster: Cluster, path: str) -> dict[str, Any]:
    obj = cluster.raw("GET", path)
    assert obj is not None, f"{path} not found"
    return obj


def launcher_of(job: Job) -> dict[str, Any]:
    pods: dict[str, dict[str, Any]] = wait_for(
        lambda: job.pods(names.ROLE_LAUNCHER), 30, "the launcher pod"
    )
    return pods[names.launcher_name(job.name)]


def test_a_service_account_named_in_the_template_is_created_bound_and_used(
    cluster: Cluster, shared_namespace: str, tmp_path: Path
) -> None:
    namespace = shared_namespace  # watched by the module's shared controller
    job = Job(cluster, namespace, "named")
    manifest = elastic_job(job.name, 1)
    launcher_spec(manifest)["serviceAccountName"] = "trainer"
    job.create(manifest)
    assert launcher_of(job)["spec"]["serviceAccountName"] == "trainer"
    account = get(cluster, f"/api/v1/namespaces/{namespace}/serviceaccounts/trainer")
    (owner,) = account["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        names.KIND,
        job.get()["metadata"]["uid"],
        True,
    )
    assert (
        cluster.raw("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/named-launcher") is None
    )
    binding = get(
        cluster,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/named-launcher",
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "trainer", "namespace": namespace}
    ]
    trainer = kubectl_as(cluster, namespace, "trainer", tmp_path)
    assert can_exec(trainer, "named-worker-0")


def test_someone_elses_service_account_is_used_and_left_alone(
    cluster: Cluster, shared_namespace: str, tmp_path: Path
) -> None:
    namespace = shared_namespace  # watched by the module's shared controller
    theirs = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "shared", "labels": {"team": "a"}},
        "imagePullSecrets": [{"name": "registry"}],
    }
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(theirs))
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/shared"
    before = get(cluster, path)
    job = Job(cluster, namespace, "borrow")
    manifest = elastic_job(job.name, 1)
    launcher_spec(manifest)["serviceAccountName"] = "shared"
    job.create(manifest)
    assert launcher_of(job)["spec"]["serviceAccountName"] == "shared"
    after = get(cluster, path)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "ownerReferences" not in after["metadata"]
    shared = kubectl_as(cluster, namespace, "shared", tmp_path)
    assert can_exec(shared, "borrow-worker-0")
    refused = job.condition("WriteRefused")
    assert refused is None or refused["status"] == "False", refused


def test_a_gpu_launcher_is_listed_first_and_may_exec_into_itself(
    cluster: Cluster, shared_namespace: str, tmp_path: Path
) -> None:
    namespace = shared_namespace  # watched by the module's shared controller
    job = Job(cluster, namespace, "gpu")
    manifest = elastic_job(job.name, 2)
    launcher_spec(manifest)["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    job.create(manifest)
    listed = "#!/bin/sh\necho gpu-launcher:1\n\necho gpu-worker-0:1\necho gpu-worker-1:1"
    wait_for(lambda: job.config().get(names.DISCOVER_HOSTS) == listed, 30, "the launcher listed")
    config = job.config()
    assert config[names.HOSTFILE] == (
        "gpu-launcher slots=1\ngpu-worker-0 slots=1\ngpu-worker-1 slots=1\n"
    )
    assert job.exec_names() == ["gpu-launcher", "gpu-worker-0", "gpu-worker-1"]
    env = {e["name"]: e.get("value") for e in launcher_of(job)["spec"]["containers"][0]["env"]}
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    launcher = kubectl_as(cluster, namespace, "gpu-launcher", tmp_path)
    assert can_exec(launcher, "gpu-launcher")

    # A scale-in takes a worker, never the launcher, which stays listed and exec-able.
    job.set_workers(1)
    wait_for(lambda: job.workers() == ["gpu-worker-0"], 30, "the surplus worker drained")
    assert job.hosts() == ["gpu-launcher:1", "gpu-worker-0:1"]
    wait_for(lambda: job.exec_names() == ["gpu-launcher", "gpu-worker-0"], 10, "exec revoked")
    assert can_exec(launcher, "gpu-launcher")
    assert job.get()["status"]["elastic"]["listed"] == 1


def test_the_users_env_is_kept_on_the_created_pods(cluster: Cluster, shared_namespace: str) -> None:
    namespace = shared_namespace  # watched by the module's shared controller
    job = Job(cluster, namespace, "env")
    manifest = elastic_job(job.name, 1)
    mine = [
        {"name": "I_MPI_HYDRA_BOOTSTRAP", "value": "ssh"},
        {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC", "value": "/usr/bin/ssh"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "/data/hostfile"},
        {"name": "TRAIN_STEPS", "value": "10"},
    ]
    launcher_spec(manifest)["containers"][0]["env"] = mine
    worker_env = [{"name": "OMPI_MCA_btl", "value": "tcp,self"}]
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"] = (
        worker_env
    )
    job.create(manifest)
    # The API server leaves an empty value out.
    env = [
        (e["name"], e.get("value", "")) for e in launcher_of(job)["spec"]["containers"][0]["env"]
    ]
    assert env == [
        *((e["name"], e["value"]) for e in mine),
        ("OMPI_MCA_plm_rsh_agent", "/etc/mpi/kubexec.sh"),
        ("MPIJOB_ELASTIC_NOTICE_FILE", "/etc/mpijob-elastic/notice"),
        ("NVIDIA_VISIBLE_DEVICES", ""),
        ("NVIDIA_DRIVER_CAPABILITIES", ""),
    ]
    (pod,) = job.pods().values()
    assert pod["spec"]["containers"][0]["env"] == [
        *worker_env,
        {"name": "MPIJOB_ELASTIC_NOTICE_FILE", "value": "/etc/mpijob-elastic/notice"},
    ]
