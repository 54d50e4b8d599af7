"""The manifests under config/ against a real API server: they validate, the CRD serves
MPIJobs with printer columns and a working scale subresource, and the ClusterRole grants
the controller what it needs and no more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.manifests import CONFIG, CRD_NAME, load_documents, mpijob

NAMESPACED = CONFIG / "namespaced"
# The namespaced overlay's RoleBindings name example namespaces; it has a test of its own.
# The ServiceMonitor's kind exists only with the Prometheus Operator's CRDs.
PROMETHEUS = CONFIG / "prometheus"
MANIFESTS = sorted(
    p
    for p in CONFIG.rglob("*.yaml")
    if p.name != "kustomization.yaml"
    and not p.is_relative_to(NAMESPACED)
    and not p.is_relative_to(PROMETHEUS)
)
SAMPLE = CONFIG / "samples" / "elastic-mpijob.yaml"
SYSTEM_NAMESPACE = "mpijob-elastic-system"
CONTROLLER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:mpijob-elastic"


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


@pytest.fixture(scope="module")
def system_namespace(cluster: Cluster) -> str:
    # Server-side dry runs of namespaced objects need their namespace to exist for real. It
    # is left in place: a later test may deploy the controller into it.
    cluster.kubectl("apply", "-f", str(CONFIG / "manager" / "namespace.yaml"))
    return SYSTEM_NAMESPACE


@pytest.fixture(scope="module")
def controller_rbac(cluster: Cluster, system_namespace: str) -> str:
    """The shipped ServiceAccount, ClusterRole and binding, applied for real."""
    cluster.kubectl("apply", "-k", str(CONFIG / "rbac"))
    return CONTROLLER


def test_kustomize_default_renders_every_object(cluster: Cluster) -> None:
    rendered = cluster.kubectl("kustomize", str(CONFIG / "default")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert kinds(docs) == {
        ("CustomResourceDefinition", CRD_NAME),
        ("ValidatingAdmissionPolicy", "mpijob-elastic-bounds"),
        ("ValidatingAdmissionPolicyBinding", "mpijob-elastic-bounds"),
        ("ValidatingAdmissionPolicy", "mpijob-elastic-skipped-namespaces"),
        ("ValidatingAdmissionPolicyBinding", "mpijob-elastic-skipped-namespaces"),
        ("ValidatingAdmissionPolicy", "mpijob-elastic-scale-bounds"),
        ("ValidatingAdmissionPolicyBinding", "mpijob-elastic-scale-bounds"),
        ("ValidatingAdmissionPolicy", "mpijob-elastic-ranks-reports"),
        ("ValidatingAdmissionPolicyBinding", "mpijob-elastic-ranks-reports"),
        ("ValidatingAdmissionPolicy", "mpijob-elastic-queue-label"),
        ("ValidatingAdmissionPolicyBinding", "mpijob-elastic-queue-label"),
        ("Namespace", SYSTEM_NAMESPACE),
        ("ServiceAccount", "mpijob-elastic"),
        ("ClusterRole", "mpijob-elastic-controller"),
        ("ClusterRoleBinding", "mpijob-elastic-controller"),
        ("ClusterRole", "mpijob-elastic-nodes"),
        ("ClusterRoleBinding", "mpijob-elastic-nodes"),
        ("ClusterRole", "mpijob-elastic-kueue"),
        ("ClusterRoleBinding", "mpijob-elastic-kueue"),
        ("ClusterRole", "mpijob-elastic-kueue-flavors"),
        ("ClusterRoleBinding", "mpijob-elastic-kueue-flavors"),
        ("Role", "mpijob-elastic-leader-election"),
        ("RoleBinding", "mpijob-elastic-leader-election"),
        ("ClusterRole", "mpijob-elastic-metrics-auth"),
        ("ClusterRoleBinding", "mpijob-elastic-metrics-auth"),
        ("ClusterRole", "mpijob-elastic-metrics-reader"),
        ("Deployment", "mpijob-elastic"),
        ("Service", "mpijob-elastic-metrics"),
        ("PodDisruptionBudget", "mpijob-elastic"),
        ("NetworkPolicy", "mpijob-elastic-metrics"),
        ("PriorityClass", "mpijob-elastic-opportunistic"),
    }


def test_a_drain_never_takes_both_replicas(cluster: Cluster) -> None:
    """The controller's own PodDisruptionBudget covers its pods and leaves one up; the
    replicas spread across nodes, but a one-node cluster still runs both."""
    rendered = cluster.kubectl("kustomize", str(CONFIG / "default")).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    deployment = docs[("Deployment", "mpijob-elastic")]
    budget = docs[("PodDisruptionBudget", "mpijob-elastic")]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 2
    assert budget["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert budget["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": pod["metadata"]["labels"]},
    }
    assert pod["spec"]["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": pod["metadata"]["labels"]},
        }
    ]


def test_only_labelled_namespaces_reach_the_pods_and_only_the_metrics_port(
    cluster: Cluster,
) -> None:
    """The NetworkPolicy selects the controller's pods and admits scrapers from namespaces
    labelled `metrics: enabled` to the port that serves /metrics, and to nothing else."""
    rendered = cluster.kubectl("kustomize", str(CONFIG / "default")).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    deployment = docs[("Deployment", "mpijob-elastic")]
    policy = docs[("NetworkPolicy", "mpijob-elastic-metrics")]
    pod = deployment["spec"]["template"]
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert f"--metrics-port={ports['metrics']}" in container["args"]


def test_namespaced_overlay_binds_per_namespace(
    cluster: Cluster, crd: str, system_namespace: str, namespace: str
) -> None:
    rendered = cluster.kubectl("kustomize", str(NAMESPACED)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    found = kinds(docs)
    assert ("ClusterRoleBinding", "mpijob-elastic-controller") not in found
    assert ("ClusterRole", "mpijob-elastic-controller") in found
    # Nor are the Workloads' rights (Kueue's) bound cluster-wide.
    assert ("ClusterRoleBinding", "mpijob-elastic-kueue") not in found
    # Issue 31: nothing cluster-wide is written. Every right bound cluster-wide reads, or
    # asks the API server a question (the reviews that guard /metrics).
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    questions = {"tokenreviews", "subjectaccessreviews"}
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        for rule in roles[binding["roleRef"]["name"]]["rules"]:
            verbs = set(rule["verbs"]) - {"get", "list", "watch"}
            assert not verbs or set(rule["resources"]) <= questions, (binding, rule)
    # Nodes belong to no namespace: their read stays bound cluster-wide.
    assert ("ClusterRoleBinding", "mpijob-elastic-nodes") in found
    # The reviews that guard /metrics are cluster-scoped: bound cluster-wide too.
    assert ("ClusterRoleBinding", "mpijob-elastic-metrics-auth") in found
    # The Lease stays in the controller's own namespace, whichever it watches.
    assert ("RoleBinding", "mpijob-elastic-leader-election") in found
    bindings = [
        d
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "mpijob-elastic-controller"
    ]
    watched = {b["metadata"]["namespace"] for b in bindings}
    assert {
        d["metadata"]["namespace"]
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "mpijob-elastic-kueue"
    } == watched
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == [
        "run",
        "--log-format=json",
        "--health-port=8081",
        "--metrics-port=8080",
        "--leader-elect",
        "--skip-namespaces=kube-system,kube-public,mpijob-elastic-system",
        f"--namespaces={','.join(sorted(watched))}",
    ]
    for binding in bindings:
        assert binding["roleRef"]["name"] == "mpijob-elastic-controller"
        binding["metadata"]["namespace"] = namespace  # the example namespaces do not exist
    items = {"apiVersion": "v1", "kind": "List", "items": [*bindings, deployment]}
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(items))


def test_kustomize_default_validates_server_side(
    cluster: Cluster, crd: str, system_namespace: str
) -> None:
    rendered = cluster.kubectl("kustomize", str(CONFIG / "default")).stdout
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert "deployment.apps/mpijob-elastic" in proc.stdout


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(CONFIG)))
def test_manifest_validates_server_side(
    cluster: Cluster, crd: str, system_namespace: str, namespace: str, path: Path
) -> None:
    docs = load_documents(path)
    # Samples leave the namespace to the user; kubectl refuses -n on objects that name one.
    where = [] if any("namespace" in d["metadata"] for d in docs) else ["-n", namespace]
    proc = cluster.kubectl("apply", "--dry-run=server", *where, "-f", str(path))
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(docs)
    assert all(line.endswith("(server dry run)") for line in lines), lines


def test_crd_is_established_with_a_structural_schema(cluster: Cluster, crd: str) -> None:
    got = json.loads(cluster.kubectl("get", "crd", crd, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in conditions
    version = got["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.mpiReplicaSpecs.Worker.replicas",
        "statusReplicasPath": ".status.replicaStatuses.Worker.active",
        "labelSelectorPath": ".status.replicaStatuses.Worker.selector",
    }


@pytest.fixture
def sample(cluster: Cluster, crd: str, namespace: str) -> str:
    cluster.kubectl("create", "-n", namespace, "-f", str(SAMPLE))
    return "elastic-horovod"


def set_worker_status(cluster: Cluster, namespace: str, job: str, active: int) -> None:
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Created",
                    "status": "True",
                    "reason": "MPIJobCreated",
                    "lastUpdateTime": "2025-01-01T00:00:00Z",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                },
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "MPIJobRunning",
                    "lastUpdateTime": "2025-01-01T00:00:01Z",
                    "lastTransitionTime": "2025-01-01T00:00:01Z",
                },
            ],
            "replicaStatuses": {
                "Launcher": {"active": 1},
                "Worker": {
                    "active": active,
                    "selector": names.selector(job, names.ROLE_WORKER),
                    "labelSelector": {"matchLabels": names.labels(job, names.ROLE_WORKER)},
                },
            },
            "elastic": {
                "listed": active - 1,
                "draining": 1,
                "retired": "",
                "minReplicas": 1,
                "maxReplicas": 4,
            },
            "startTime": "2025-01-01T00:00:00Z",
            "lastReconcileTime": "2025-01-01T00:00:02Z",
        }
    }
    cluster.kubectl(
        "patch", "-n", namespace, f"mpijob/{job}", "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


def get_job(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "-n", namespace, f"mpijob/{job}", "-o", "json").stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_sample_is_stored_with_its_pod_templates_unpruned(
    cluster: Cluster, namespace: str, sample: str
) -> None:
    job = get_job(cluster, namespace, sample)
    assert job["metadata"]["annotations"][names.ANN_MAX_REPLICAS] == "5"
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == "horovod/horovod:0.28.1"
    assert launcher["command"][:2] == ["horovodrun", "-np"]
    assert "/etc/mpi/discover_hosts.sh" in launcher["command"]


def test_get_shows_printer_columns(cluster: Cluster, namespace: str, sample: str) -> None:
    before = cluster.kubectl("get", "-n", namespace, "mpijob", sample).stdout.splitlines()
    header = ["NAME", "DESIRED", "READY", "DRAINING", "MIN", "MAX", "STATE", "AGE"]
    assert before[0].split() == header
    assert before[1].split()[:2] == [sample, "2"]

    # Two pods running, one of them draining: ready (listed) 1, draining 1.
    set_worker_status(cluster, namespace, sample, active=2)
    after = cluster.kubectl("get", "-n", namespace, "mpijob", sample).stdout.splitlines()
    assert after[1].split()[:7] == [sample, "2", "1", "1", "1", "4", "Running"]


def test_status_keeps_fields_the_controller_adds(
    cluster: Cluster, namespace: str, sample: str
) -> None:
    extra = {"status": {"scaling": {"from": 2, "to": 3}}}
    cluster.kubectl(
        "patch", "-n", namespace, f"mpijob/{sample}", "--subresource=status", "--type=merge",
        "-p", json.dumps(extra),
    )  # fmt: skip
    assert get_job(cluster, namespace, sample)["status"]["scaling"] == {"from": 2, "to": 3}


def test_kubectl_scale_changes_worker_replicas(
    cluster: Cluster, namespace: str, sample: str
) -> None:
    cluster.kubectl("scale", "-n", namespace, f"mpijob/{sample}", "--replicas=3")
    job = get_job(cluster, namespace, sample)
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1


def test_scale_subresource_reports_status_and_selector(
    cluster: Cluster, namespace: str, sample: str
) -> None:
    path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}/{sample}/scale"
    set_worker_status(cluster, namespace, sample, active=1)
    scale = json.loads(cluster.kubectl("get", "--raw", path).stdout)
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 2
    assert scale["status"]["replicas"] == 1
    assert scale["status"]["selector"] == names.selector(sample, names.ROLE_WORKER)


def test_unknown_spec_fields_are_refused_or_pruned_but_templates_are_kept(
    cluster: Cluster, crd: str, namespace: str
) -> None:
    job = mpijob("pruning", workers=1)
    job["spec"]["slotPerWorker"] = 2  # a typo the schema must catch
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = {"gpu": "a"}
    job["spec"]["runPolicy"] = {"schedulingPolicy": {"queue": "q", "futureField": 1}}
    strict = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", input=json.dumps(job), check=False
    )
    assert 'unknown field "spec.slotPerWorker"' in strict.stderr
    # Clients that do not ask for strict field validation get the typo pruned instead.
    cluster.kubectl("create", "--validate=false", "-n", namespace, "-f", "-", input=json.dumps(job))
    stored = get_job(cluster, namespace, "pruning")["spec"]
    assert "slotPerWorker" not in stored
    assert stored["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] == {"gpu": "a"}
    assert stored["runPolicy"]["schedulingPolicy"] == {"queue": "q", "futureField": 1}


# What the controller must be able to do, per docs/rbac.md, as `kubectl auth can-i`
# arguments: verb, resource, subresource.
GRANTED = [
    *[(v, "mpijobs.kubeflow.org", "") for v in ("list", "watch", "delete")],
    ("patch", "mpijobs.kubeflow.org", "status"),
    ("update", "mpijobs.kubeflow.org", "finalizers"),
    *[(v, "pods", "") for v in ("get", "list", "watch", "create", "delete", "patch")],
    *[(v, "pods", "exec") for v in ("get", "create")],
    *[
        (v, r, "")
        for r in ("configmaps", "serviceaccounts")
        for v in ("list", "watch", "create", "update", "patch")
    ],
    *[
        (v, f"{r}.rbac.authorization.k8s.io", "")
        for r in ("roles", "rolebindings")
        for v in ("list", "watch", "create", "update", "patch")
    ],
    # The launcher's Role grants get on its <job>-ranks ConfigMap: RBAC lets the controller
    # grant only what it holds (docs/rbac.md).
    ("get", "configmaps", ""),
    ("create", "events", ""),
    # The scheduler's Preempted Events name who preempted a worker (app/preemptions.py).
    *[(v, "events", "") for v in ("list", "watch")],
    *[(v, "nodes", "") for v in ("list", "watch")],
    *[
        (v, "poddisruptionbudgets.policy", "")
        for v in ("list", "watch", "create", "update", "delete")
    ],
    # Who a scrape's token is, and whether they may get /metrics (metrics_guard.py).
    ("create", "tokenreviews.authentication.k8s.io", ""),
    ("create", "subjectaccessreviews.authorization.k8s.io", ""),
]
DENIED = [
    # Read by name as a list narrowed to the name (mpijob_elastic/machinery/kube.py).
    ("get", "mpijobs.kubeflow.org", ""),
    # Status is only ever merge-patched.
    ("update", "mpijobs.kubeflow.org", "status"),
    ("create", "mpijobs.kubeflow.org", ""),
    ("update", "mpijobs.kubeflow.org", ""),
    ("patch", "mpijobs.kubeflow.org", ""),
    ("update", "mpijobs.kubeflow.org", "scale"),
    ("get", "mpijobs.kubeflow.org", "status"),
    ("update", "pods", ""),
    ("deletecollection", "pods", ""),
    ("create", "pods", "eviction"),
    ("create", "pods", "attach"),
    ("create", "pods", "portforward"),
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("delete", "configmaps", ""),
    ("delete", "serviceaccounts", ""),
    ("create", "serviceaccounts", "token"),
    ("delete", "roles.rbac.authorization.k8s.io", ""),
    ("escalate", "roles.rbac.authorization.k8s.io", ""),
    ("bind", "roles.rbac.authorization.k8s.io", ""),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
    ("get", "events", ""),
    # Every Event is a new one; none is patched.
    ("patch", "events", ""),
    ("create", "events.events.k8s.io", ""),
    ("create", "namespaces", ""),
    ("get", "poddisruptionbudgets.policy", ""),
    ("patch", "poddisruptionbudgets.policy", ""),
    ("update", "poddisruptionbudgets.policy", "status"),
]


# Authorization does not need the namespace to exist; a ClusterRoleBinding grants in all.
ANY_NAMESPACE = "any-namespace"


def can_i(cluster: Cluster, user: str, namespace: str, verb: str, resource: str, sub: str) -> str:
    extra = [f"--subresource={sub}"] if sub else []
    proc = cluster.kubectl(
        "auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", user, check=False
    )
    return proc.stdout.strip()


@pytest.mark.parametrize(("verb", "resource", "sub"), GRANTED)
def test_controller_is_granted(
    cluster: Cluster, controller_rbac: str, verb: str, resource: str, sub: str
) -> None:
    assert can_i(cluster, controller_rbac, ANY_NAMESPACE, verb, resource, sub) == "yes"


# The gang schedulers' PodGroups (docs/rbac.md): asked with their CRDs installed, since
# kubectl answers "no" for a resource the server does not serve.
POD_GROUPS = [
    f"podgroups.{group}"
    for group in ("scheduling.volcano.sh", "scheduling.x-k8s.io", "scheduling.run.ai")
]
POD_GROUPS_GRANTED = [
    (v, r, "yes") for r in POD_GROUPS for v in ("list", "watch", "create", "update", "delete")
]
POD_GROUPS_DENIED = [(v, r, "no") for r in POD_GROUPS for v in ("get", "patch")]


@pytest.mark.usefixtures("volcano_crd", "scheduler_plugins_crd", "kai_crd")
@pytest.mark.parametrize(("verb", "resource", "answer"), POD_GROUPS_GRANTED + POD_GROUPS_DENIED)
def test_controller_is_granted_the_gang_schedulers_pod_groups(
    cluster: Cluster, controller_rbac: str, verb: str, resource: str, answer: str
) -> None:
    assert can_i(cluster, controller_rbac, ANY_NAMESPACE, verb, resource, "") == answer


@pytest.mark.parametrize(("verb", "resource", "sub"), DENIED)
def test_controller_is_not_granted(
    cluster: Cluster, controller_rbac: str, verb: str, resource: str, sub: str
) -> None:
    assert can_i(cluster, controller_rbac, ANY_NAMESPACE, verb, resource, sub) == "no"


def launcher_role(job: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": names.launcher_name(job)},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": [""],
                "resources": ["pods/exec"],
                "verbs": ["create"],
                "resourceNames": [names.worker_name(job, 0)],
            },
        ],
    }


def test_controller_can_grant_the_launcher_pods_exec(
    cluster: Cluster, controller_rbac: str, namespace: str
) -> None:
    launcher = names.launcher_name("j")
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": launcher}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": launcher},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": launcher},
        "subjects": [{"kind": "ServiceAccount", "name": launcher, "namespace": namespace}],
    }
    for obj in (account, launcher_role("j"), binding):
        cluster.kubectl(
            "create", "-n", namespace, "-f", "-", input=json.dumps(obj), as_user=controller_rbac
        )
    as_launcher = f"system:serviceaccount:{namespace}:{launcher}"
    worker = f"pods/{names.worker_name('j', 0)}"
    assert can_i(cluster, as_launcher, namespace, "create", worker, "exec") == "yes"
    # resourceNames confine the launcher to its own workers.
    assert can_i(cluster, as_launcher, namespace, "create", "pods/other", "exec") == "no"


def test_granting_pods_exec_needs_pods_exec(
    cluster: Cluster, controller_rbac: str, namespace: str
) -> None:
    """Why the ClusterRole holds pods/exec: without it the same Role is refused."""
    name = f"no-exec-{namespace}"
    without_exec = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            r
            for r in load_documents(CONFIG / "rbac" / "role.yaml")[0]["rules"]
            if r["resources"] != ["pods/exec"]
        ],
    }
    user = f"system:serviceaccount:{namespace}:no-exec"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "no-exec", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "no-exec", "namespace": namespace}],
    }
    cluster.apply(without_exec)
    try:
        cluster.apply(binding)
        proc = cluster.kubectl(
            "create", "-n", namespace, "-f", "-",
            input=json.dumps(launcher_role("k")), as_user=user, check=False,
        )  # fmt: skip
        assert proc.returncode != 0
        assert "attempting to grant RBAC permissions not currently held" in proc.stderr
    finally:
        cluster.kubectl("delete", "clusterrole", name, check=False)


def test_controller_can_create_children_owned_by_the_job(
    cluster: Cluster, controller_rbac: str, namespace: str, sample: str
) -> None:
    """Children carry a controller ownerReference with blockOwnerDeletion.

    Clusters running the OwnerReferencesPermissionEnforcement admission plugin allow that
    only with update on mpijobs/finalizers; the test cluster runs the default plugins, so
    this shows the controller's write goes through, not that the plugin would refuse it
    without the grant (the can-i test above covers the grant).
    """
    uid = get_job(cluster, namespace, sample)["metadata"]["uid"]
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.config_map_name(sample),
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.KIND,
                    "name": sample,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {names.HOSTFILE: f"{names.worker_name(sample, 0)} slots=1\n"},
    }
    cluster.kubectl(
        "create", "-n", namespace, "-f", "-", input=json.dumps(config_map), as_user=controller_rbac
    )
