"""Fixtures for the gang-scheduling tests (docs/scheduling.md): the scheduler-plugins
scheduler as a second scheduler of the local cluster, its, Volcano's and KAI-Scheduler's
PodGroup CRDs, and a node of few GPUs for the jobs to compete for.

The scheduler is the scheduler-plugins release's ``cmd/scheduler`` built from its Go module
(hack/build-scheduler-plugins.sh), run as a process beside the cluster's own scheduler
with the Coscheduling plugin enabled under the name training-operator 1.9's tests give it,
``scheduler-plugins-scheduler``, the name of the scheduler-plugins chart's second
scheduler.
"""

from __future__ import annotations

import ssl
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import HACK, ROOT, Cluster, fake_gpu_node
from tests.controller import free_port, stop_process, wait_for

SCHEDULER_NAME = "scheduler-plugins-scheduler"
VOLCANO_CRD = ROOT / "config" / "gang" / "volcano-podgroup-crd.yaml"
KAI_CRD = ROOT / "config" / "gang" / "kai-podgroup-crd.yaml"
GANG_TAINT = "mpijob-elastic.io/gang-test"
# The scheduler's flush of pods it holds as unschedulable: upstream's 5 minutes is longer
# than a test waits for a gang to start once room appears.
UNSCHEDULABLE_FLUSH_SECONDS = 20


def install_crd(cluster: Cluster, path: Path, name: str, plural: str) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(path))
    cluster.wait_established(name)
    # Established may run ahead of kubectl's discovery: list until it works.
    wait_for(
        lambda: cluster.kubectl("get", plural, "-A", check=False).returncode == 0,
        30,
        f"{name} listed",
    )


@pytest.fixture(scope="session")
def volcano_crd(cluster: Cluster) -> str:
    install_crd(
        cluster, VOLCANO_CRD, "podgroups.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh"
    )
    return "scheduling.volcano.sh/v1beta1"


@pytest.fixture(scope="session")
def kai_crd(cluster: Cluster) -> str:
    install_crd(cluster, KAI_CRD, "podgroups.scheduling.run.ai", "podgroups.scheduling.run.ai")
    return "scheduling.run.ai/v2alpha2"


def scheduler_plugins_build(*args: str) -> Path:
    out = subprocess.run(
        [str(HACK / "build-scheduler-plugins.sh"), *args],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def scheduler_plugins_crd(cluster: Cluster) -> None:
    """The scheduler-plugins release's PodGroup CRD installed, from its module: no wait for
    the scheduler's build."""
    crd = "podgroups.scheduling.x-k8s.io"
    install_crd(cluster, scheduler_plugins_build("crd"), crd, crd)


@pytest.fixture(scope="session")
def scheduler_plugins(
    cluster: Cluster, scheduler_plugins_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The coscheduling scheduler running against the cluster (its CRD installed first);
    yields its name."""
    bin_dir = scheduler_plugins_build()
    work = tmp_path_factory.mktemp("scheduler-plugins")
    # The module's manifests/coscheduling/scheduler-config.yaml, under the second
    # scheduler's name.
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": cluster.kubeconfig},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "*"}],
                    },
                },
                "pluginConfig": [
                    {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}
                ],
            }
        ],
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = work / "scheduler.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(bin_dir / "kube-scheduler-plugins"),
                f"--config={work / 'config.yaml'}",
                f"--authentication-kubeconfig={cluster.kubeconfig}",
                f"--authorization-kubeconfig={cluster.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--v=2",
                # A gang that Coscheduling rejected (a Permit timeout, PostFilter's
                # rejection of its waiting pods, a PreFilter gap) is retried only on a
                # pod's creation, a PodGroup change or this periodic flush (5 min by
                # default): a job's deletion alone does not retry it
                # (docs/scheduling.md, "A gang that waits for the scheduler's retry").
                f"--pod-max-in-unschedulable-pods-duration={UNSCHEDULABLE_FLUSH_SECONDS}s",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE

    def healthy() -> bool:
        assert proc.poll() is None, log_path.read_text()[-5000:]
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/healthz", context=insecure, timeout=2
            ) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(healthy, 60, "the scheduler-plugins scheduler healthy")
    try:
        yield SCHEDULER_NAME
    finally:
        stop_process(proc)
        print(f"scheduler-plugins log: {log_path}")


def gang_node_manifest(name: str, gpus: int) -> dict[str, Any]:
    """A KWOK node with ``gpus`` GPUs, tainted so only the gang tests' pods land there."""
    return fake_gpu_node(name, gpus, GANG_TAINT, {GANG_TAINT: name})


@pytest.fixture
def gang_node(cluster: Cluster) -> Iterator[str]:
    """A node of 4 GPUs of the test's own; gone after it."""
    name = f"gang-{uuid.uuid4().hex[:8]}"
    cluster.apply(gang_node_manifest(name, 4))
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")
    yield name
    cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def on_node(manifest: dict[str, Any], node: str, gpus: int, scheduler: str | None) -> None:
    """Every pod of the job on ``node``, each worker asking for ``gpus`` GPUs (requests and
    limits, as the device plugin wants them), the pods under ``scheduler``."""
    for role, replica in manifest["spec"]["mpiReplicaSpecs"].items():
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
        replica["template"] = {"spec": spec}
        spec["nodeSelector"] = {GANG_TAINT: node}
        spec["tolerations"] = [{"key": GANG_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
        if scheduler is not None:
            spec["schedulerName"] = scheduler
        resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
        if role == "Worker":
            resources = {
                "requests": {"cpu": "100m", "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)},
            }
        spec["containers"][0]["resources"] = resources


def bound(pods: dict[str, dict[str, Any]]) -> list[str]:
    """The pods a node holds (bound by a scheduler, whether or not they run yet)."""
    return sorted(n for n, p in pods.items() if (p.get("spec") or {}).get("nodeName"))
