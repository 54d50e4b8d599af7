"""The Helm chart (charts/mpijob-elastic) against config/, its one source of truth.

`helm template` with the default values must give exactly the objects of `kubectl
kustomize config/default` (but the Namespace, which the chart leaves to the installer:
docs/operations.md), and with watchNamespaces those of config/namespaced. The parts that take
no value are copies made by hack/sync-chart.sh, checked up to date; the rest are templates,
checked by the rendering. `helm lint --strict` runs here rather than in `make lint`: helm is
built from its Go module (hack/build-helm.sh, about 80 s the first time), which `make lint`
must not start. No cluster is needed: both sides only render.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import HACK, ROOT, binaries_dir

CHART = Path("charts") / "mpijob-elastic"
SYSTEM_NAMESPACE = "mpijob-elastic-system"
# helm template assumes Kubernetes 1.20 unless told; the chart asks for 1.30 or later.
KUBE_VERSION = "v1.34.4"
NAMESPACED_VALUES = ["--set", "watchNamespaces={team-a,team-b}"]

Key = tuple[str, str, str]


@pytest.fixture(scope="module")
def helm() -> str:
    out = subprocess.run(
        [str(HACK / "build-helm.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def kubectl() -> str:
    return str(binaries_dir() / "kubectl")


def run(*cmd: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, check=check, capture_output=True, text=True)


def by_key(rendered: str) -> dict[Key, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    objects = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs
    }
    assert len(objects) == len(docs), "two objects of the same kind, namespace and name"
    return objects


def chart(helm: str, root: Path, *values: str) -> dict[Key, dict[str, Any]]:
    out = run(
        helm, "template", "mpijob-elastic", str(CHART), "--namespace", SYSTEM_NAMESPACE,
        "--include-crds", "--kube-version", KUBE_VERSION, *values, cwd=root,
    )  # fmt: skip
    return by_key(out.stdout)


def kustomize(kubectl: str, root: Path, overlay: str) -> dict[Key, dict[str, Any]]:
    objects = by_key(run(kubectl, "kustomize", f"config/{overlay}", cwd=root).stdout)
    del objects[("Namespace", "", SYSTEM_NAMESPACE)]
    return objects


def differences(ours: dict[Key, dict[str, Any]], theirs: dict[Key, dict[str, Any]]) -> list[str]:
    """Each object only one side renders, or that the two render differently."""
    return [
        f"{'/'.join(k)}: " + ("only in the chart" if k not in theirs else "only in config/")
        if k not in ours or k not in theirs
        else f"{'/'.join(k)}: differs"
        for k in sorted(ours.keys() | theirs.keys())
        if ours.get(k) != theirs.get(k)
    ]


def test_the_copies_are_up_to_date() -> None:
    proc = run(str(HACK / "sync-chart.sh"), "--check", check=False)
    assert proc.returncode == 0, proc.stderr


def test_default_values_render_config_default(helm: str, kubectl: str) -> None:
    ours, theirs = chart(helm, ROOT), kustomize(kubectl, ROOT, "default")
    assert differences(ours, theirs) == []
    # Not two empty renderings: the objects a test elsewhere names for config/default.
    assert ("Deployment", SYSTEM_NAMESPACE, "mpijob-elastic") in ours
    assert ("PodDisruptionBudget", SYSTEM_NAMESPACE, "mpijob-elastic") in ours
    assert ("CustomResourceDefinition", "", "mpijobs.kubeflow.org") in ours
    assert len(ours) == 30


def test_watch_namespaces_render_config_namespaced(helm: str, kubectl: str) -> None:
    ours = chart(helm, ROOT, *NAMESPACED_VALUES)
    assert differences(ours, kustomize(kubectl, ROOT, "namespaced")) == []
    assert ("RoleBinding", "team-a", "mpijob-elastic-controller") in ours
    assert ("ClusterRoleBinding", "", "mpijob-elastic-controller") not in ours


def test_a_change_to_config_alone_is_caught(helm: str, kubectl: str, tmp_path: Path) -> None:
    """The check above on a copy of the repository where config/ moved and the chart did not:
    a templated object (the Deployment) and a copied one (the ClusterRole)."""
    for part in ("config", "charts", "hack"):
        shutil.copytree(ROOT / part, tmp_path / part)
    deployment = tmp_path / "config" / "manager" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("memory: 512Mi", "memory: 1Gi"))
    role = tmp_path / "config" / "rbac" / "role.yaml"
    role.write_text(role.read_text().replace('verbs: ["create"]', 'verbs: ["create", "patch"]'))

    found = differences(chart(helm, tmp_path), kustomize(kubectl, tmp_path, "default"))
    assert found == [
        "ClusterRole//mpijob-elastic-controller: differs",
        f"Deployment/{SYSTEM_NAMESPACE}/mpijob-elastic: differs",
    ]
    stale = run(str(tmp_path / "hack" / "sync-chart.sh"), "--check", cwd=tmp_path, check=False)
    assert stale.returncode == 1
    assert "templates/rbac-role.yaml is out of date with config/rbac/role.yaml" in stale.stderr
    # The script brings the copy back in line; the Deployment is a template, edited by hand.
    run(str(tmp_path / "hack" / "sync-chart.sh"), cwd=tmp_path)
    found = differences(chart(helm, tmp_path), kustomize(kubectl, tmp_path, "default"))
    assert found == [f"Deployment/{SYSTEM_NAMESPACE}/mpijob-elastic: differs"]


@pytest.mark.parametrize("values", [[], NAMESPACED_VALUES], ids=["default", "namespaced"])
def test_helm_lint_strict(helm: str, values: list[str]) -> None:
    proc = run(helm, "lint", "--strict", str(CHART), *values, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def deployment(objects: dict[Key, dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for k, o in objects.items() if k[0] == "Deployment"]
    return found


def test_values_reach_the_deployment(helm: str) -> None:
    objects = chart(
        helm, ROOT,
        "--set", "image.repository=registry.example.com/mpijob-elastic,image.tag=0.1.0",
        "--set", "replicas=3,metrics.port=9090,health.port=9091",
        "--set", "resources.limits.memory=1Gi",
        "--set", "extraArgs={--kubectl-image=registry.example.com/kubectl:v1.34.4}",
    )  # fmt: skip
    spec = deployment(objects)["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    assert spec["replicas"] == 3
    assert container["image"] == "registry.example.com/mpijob-elastic:0.1.0"
    assert container["args"] == [
        "run",
        "--log-format=json",
        "--health-port=9091",
        "--metrics-port=9090",
        "--leader-elect",
        "--skip-namespaces=kube-system,kube-public,mpijob-elastic-system",
        "--kubectl-image=registry.example.com/kubectl:v1.34.4",
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "health": 9091,
        "metrics": 9090,
    }
    assert container["resources"]["limits"] == {"memory": "1Gi"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    service = objects[("Service", SYSTEM_NAMESPACE, "mpijob-elastic-metrics")]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics"}]


def test_one_replica_runs_without_election_or_budget(helm: str) -> None:
    objects = chart(helm, ROOT, "--set", "replicas=1,leaderElection.enabled=false")
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert "--leader-elect" not in container["args"]
    # minAvailable 1 of 1 would block every drain of that node.
    assert not [k for k in objects if k[0] == "PodDisruptionBudget"]


def test_two_replicas_without_election_are_refused(helm: str) -> None:
    proc = run(
        helm, "template", "m", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "leaderElection.enabled=false", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "replicas above 1 need leaderElection.enabled" in proc.stderr


def test_skipped_namespaces_reach_the_flag_and_the_policy(helm: str) -> None:
    objects = chart(helm, ROOT, "--set", "skipNamespaces={kube-system,shared}")
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert "--skip-namespaces=kube-system,shared,mpijob-elastic-system" in container["args"]
    policy = objects[("ValidatingAdmissionPolicy", "", "mpijob-elastic-skipped-namespaces")]
    (selected,) = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert selected["values"] == ["kube-system", "shared", "mpijob-elastic-system"]
    # With watchNamespaces the controller is bound in those alone: no policy to keep.
    namespaced = chart(helm, ROOT, *NAMESPACED_VALUES)
    assert not [k for k in namespaced if k[2] == "mpijob-elastic-skipped-namespaces"]
