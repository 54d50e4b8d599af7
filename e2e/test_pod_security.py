"""The launcher's kubectl-delivery init container, admitted under Pod Security "restricted".

A namespace that enforces the "restricted" level refuses a pod if any of its containers,
init containers included, falls short. The launcher's own container is the user's to
harden; the init container is ours, so it must never be the reason a launcher is refused.
The real API server's PodSecurity admission judges the pod the controller renders.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.parse import parse
from tests.cluster import Cluster
from tests.unit.simulation import make_job

INIT = Settings(kubectl_delivery=KubectlDelivery.INIT_CONTAINER)
# What a user puts on a launcher container for the "restricted" level.
RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def launcher_pod(namespace: str) -> dict[str, Any]:
    job = make_job(2, namespace=namespace)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    launcher["containers"] = [dict(launcher["containers"][0], securityContext=RESTRICTED_CONTAINER)]
    pod = render_pods.launcher_pod(parse(job, 30), INIT, "hash", 2)
    # The test job does not exist, so the garbage collector would delete an owned pod.
    del pod["metadata"]["ownerReferences"]
    return pod


def create(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> str:
    """Creates the pod; the API server's refusal, or "" when it was admitted."""
    text = json.dumps(pod)
    created = cluster.kubectl("create", "-n", namespace, "-f", "-", input=text, check=False)
    return created.stderr if created.returncode != 0 else ""


def test_restricted_namespace_admits_the_launcher_with_its_init_container(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    # The pod runs as the launcher ServiceAccount, which must exist to be admitted at all.
    cluster.kubectl("create", "serviceaccount", "-n", namespace, names.launcher_name("job"))
    pod = launcher_pod(namespace)
    (init,) = pod["spec"]["initContainers"]
    assert init["name"] == "kubectl-delivery"

    # Without its securityContext the same pod is refused, naming the init container: the
    # namespace really enforces the level.
    bare = copy.deepcopy(pod)
    del bare["spec"]["initContainers"][0]["securityContext"]
    refused = create(cluster, namespace, bare)
    assert "forbidden" in refused.lower(), refused
    assert "kubectl-delivery" in refused, refused

    assert create(cluster, namespace, pod) == ""
    admitted = json.loads(
        cluster.kubectl("get", "pod", "-n", namespace, pod["metadata"]["name"], "-o", "json").stdout
    )
    assert admitted["spec"]["initContainers"][0]["securityContext"] == init["securityContext"]
    assert admitted["spec"]["initContainers"][0]["resources"] == init["resources"]
