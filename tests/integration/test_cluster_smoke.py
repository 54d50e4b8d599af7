"""The local cluster is a real one: scheduling, garbage collection, RBAC and exec all work.

Every controller test leans on these four facts, so each is proved on its own first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.cluster import Cluster

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "smoke"},
    "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1d"]}]},
}


def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


def running_pod(cluster: Cluster, namespace: str) -> dict[str, Any]:
    cluster.apply(POD, namespace)

    def running() -> dict[str, Any] | None:
        pod = get_json(cluster, "pod", "smoke", "-n", namespace)
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    pod: dict[str, Any] = wait_for(running, what="pod Running")
    return pod


def test_pod_is_scheduled_to_a_fake_node_and_runs(cluster: Cluster, namespace: str) -> None:
    pod = running_pod(cluster, namespace)
    assert pod["spec"]["nodeName"].startswith("kwok-node-")
    assert pod["status"]["podIP"]


def test_gpu_pods_schedule_on_gpu_shaped_nodes(cluster: Cluster, namespace: str) -> None:
    gpu_pod = json.loads(json.dumps(POD))
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    cluster.apply(gpu_pod, namespace)
    wait_for(
        lambda: get_json(cluster, "pod", "smoke", "-n", namespace)["spec"].get("nodeName"),
        what="GPU pod scheduled",
    )


def test_garbage_collector_removes_controlled_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = get_json(cluster, "configmap", "owner", "-n", namespace)
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
    }
    cluster.apply(dependent, namespace)
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: (
            cluster.kubectl(
                "get", "configmap", "dependent", "-n", namespace, check=False
            ).returncode
            != 0
        ),
        what="dependent garbage-collected",
    )


def can_i_exec(cluster: Cluster, namespace: str, sa: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{sa}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "create",
                "resource": "pods",
                "subresource": "exec",
                "name": "smoke",
            },
        },
    }
    out = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(out.stdout)["status"].get("allowed"))


def test_exec_needs_a_role_for_the_pod_name(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    running_pod(cluster, namespace)
    cluster.kubectl("create", "serviceaccount", "launcher", "-n", namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, "launcher", tmp_path / "kc")
    as_sa = Cluster(kubeconfig, cluster.kubectl_path)

    denied = as_sa.kubectl("exec", "smoke", "--", "echo", "in", check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr or "forbidden" in denied.stderr
    assert not can_i_exec(cluster, namespace, "launcher")

    cluster.kubectl(
        "create",
        "role",
        "exec-smoke",
        "-n",
        namespace,
        "--verb=get",
        "--resource=pods",
    )
    role = get_json(cluster, "role", "exec-smoke", "-n", namespace)
    role["rules"].append(
        {
            "apiGroups": [""],
            "resources": ["pods/exec"],
            "verbs": ["create"],
            "resourceNames": ["smoke"],
        }
    )
    cluster.apply(role, namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "exec-smoke",
        "-n",
        namespace,
        "--role=exec-smoke",
        f"--serviceaccount={namespace}:launcher",
    )
    wait_for(lambda: can_i_exec(cluster, namespace, "launcher"), what="RBAC to allow exec")
    allowed = as_sa.kubectl("exec", "smoke", "--", "echo", "in")
    assert allowed.stdout.strip() == "in"


def test_exec_into_a_fake_pod_runs_a_local_command(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    running_pod(cluster, namespace)
    marker = tmp_path / "marker"
    out = cluster.kubectl(
        "exec", "smoke", "-n", namespace, "--", "/bin/sh", "-c", f"echo ran > {marker}; echo ok"
    )
    assert out.stdout.strip() == "ok"
    assert marker.read_text().strip() == "ran"
