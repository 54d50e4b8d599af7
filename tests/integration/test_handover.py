"""Hand-over on the real local cluster: a running job whose children training-operator 1.9
made is taken over without restarting a pod, then scaled gracefully.

Training-operator itself is not run (it is a Go controller with its own CRDs and image):
the children are made here by hand, exactly as it makes them (reference §5a, docs/formats.md),
while our controller is stopped, as after `--enable-scheme` dropped MPIJob from it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render, render_pods
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.parse import parse
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")

Obj = dict[str, Any]
TO_POD = {names.LABEL_TO_JOB: "elastic", names.LABEL_TO_OPERATOR: "mpijob-controller"}
# training-operator 1.9's kubectl delivery and worker command.
TO_SETTINGS = Settings(kubectl_delivery=KubectlDelivery.INIT_CONTAINER, kubectl_image="kubectl")


def controller_ref(job: Obj) -> Obj:
    return render.job_owner_reference(job["metadata"]["name"], job["metadata"]["uid"])


def as_training_operator(obj: Obj, labels: dict[str, str], owner: Obj | None) -> Obj:
    """``obj`` with training-operator's metadata: its labels only, its owner (None: none)."""
    meta = {"name": obj["metadata"]["name"], "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {**obj, "metadata": meta}


def training_operator_children(job: Obj) -> list[Obj]:
    """The children training-operator 1.9 makes for a running 2-worker job: names, labels,
    owner references and the v1 ConfigMap as it writes them."""
    spec = parse(job, 30)
    app = {names.LABEL_APP: spec.name}
    workers = [names.worker_name(spec.name, i) for i in range(2)]
    hosts = [f"{w}:1" for w in sorted(workers)]  # it sorts by name as strings
    config = render.config_map(
        spec,
        {
            names.HOSTFILE: "".join(f"{w} slots=1\n" for w in workers),
            names.KUBEXEC: render.kubexec(spec, TO_SETTINGS),
            names.DISCOVER_HOSTS: "#!/bin/sh\n" + "\n".join(f"echo {h}" for h in hosts),
        },
    )
    launcher = render_pods.launcher_pod(spec, TO_SETTINGS, "", 2)
    launcher["spec"]["containers"][0]["command"] = ["sleep", "365d"]
    made = [
        (render.service_account(spec), app),
        (render.role(spec, workers), app),
        (render.role_binding(spec), app),
        (config, app),
        *[
            (
                render_pods.worker_pod(spec, i),
                {**TO_POD, names.LABEL_TO_REPLICA_TYPE: "worker", names.LABEL_INDEX: str(i)},
            )
            for i in range(2)
        ],
        (
            launcher,
            {**TO_POD, names.LABEL_TO_REPLICA_TYPE: "launcher", names.LABEL_TO_JOB_ROLE: "master"},
        ),
    ]
    children = [as_training_operator(obj, labels, controller_ref(job)) for obj, labels in made]
    for pod in children:
        if pod["kind"] == "Pod" and "worker" in pod["metadata"]["name"]:
            pod["spec"]["containers"][0]["command"] = ["sleep", "365d"]
    return children


@pytest.fixture
def job(cluster: Cluster, namespace: str) -> Job:
    return Job(cluster, namespace, "elastic")


def get(cluster: Cluster, ns: str, kind: str, name: str) -> Obj:
    prefix, plural = {
        "Pod": ("/api/v1", "pods"),
        "ConfigMap": ("/api/v1", "configmaps"),
        "ServiceAccount": ("/api/v1", "serviceaccounts"),
        "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
        "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    }[kind]
    obj = cluster.raw("GET", f"{prefix}/namespaces/{ns}/{plural}/{name}")
    assert obj is not None, f"{kind} {name} not found"
    return obj


def pod_names(cluster: Cluster, ns: str, selector: str) -> list[str]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout
    return sorted(line.removeprefix("pod/") for line in out.split())


def test_a_running_training_operator_job_is_taken_over_and_scaled_gracefully(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    job.create(elastic_job(job.name, 2, drain="3"))
    mpijob = job.get()
    ns = job.ns
    children = training_operator_children(mpijob)
    # A pod named as the job's next worker but controlled by something else.
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "holder"}}
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(holder))
    holder_uid = get(cluster, ns, "ConfigMap", "holder")["metadata"]["uid"]
    foreign = json.loads(json.dumps(children[4]))
    foreign["metadata"] = {
        "name": "elastic-worker-5",
        "labels": TO_POD,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "holder",
                "uid": holder_uid,
                "controller": True,
            }
        ],
    }
    for obj in (*children, foreign):
        cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj))
    pods = ["elastic-launcher", "elastic-worker-0", "elastic-worker-1"]
    wait_for(
        lambda: all(
            get(cluster, ns, "Pod", p).get("status", {}).get("phase") == "Running" for p in pods
        ),
        30,
        "training-operator's pods running",
    )
    uids = {p: get(cluster, ns, "Pod", p)["metadata"]["uid"] for p in pods}
    foreign_before = get(cluster, ns, "Pod", "elastic-worker-5")["metadata"]

    start_controller(ns)

    def ours(kind: str, name: str) -> bool:
        meta = get(cluster, ns, kind, name)["metadata"]
        labels = meta.get("labels") or {}
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        return (
            labels.get(names.LABEL_JOB) == job.name
            and labels.get(names.LABEL_GROUP) == names.GROUP
            and refs == [controller_ref(mpijob)]
        )

    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    wait_for(lambda: all(ours(k, n) for k, n in kinds), 30, "every child labelled and owned")
    # Our labels merged in, training-operator's kept: the SDK's selectors still work.
    assert get(cluster, ns, "Pod", "elastic-launcher")["metadata"]["labels"] == (
        names.pod_labels(job.name, names.ROLE_LAUNCHER)
    )
    assert get(cluster, ns, "Pod", "elastic-worker-1")["metadata"]["labels"] == (
        names.pod_labels(job.name, names.ROLE_WORKER, 1)
    )
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert get(cluster, ns, kind, "elastic-launcher")["metadata"]["labels"] == (
            names.object_labels(job.name, names.ROLE_LAUNCHER)
        )
    # Nothing restarted: the same pods.
    assert {p: get(cluster, ns, "Pod", p)["metadata"]["uid"] for p in pods} == uids
    job.wait_hosts(2)
    taken_over = job.wait_event("TakenOver")
    assert "Pod elastic-worker-1" in taken_over
    assert "RoleBinding elastic-launcher" in taken_over
    # Someone else's pod is left exactly as it was, though named and labelled as the job's.
    assert get(cluster, ns, "Pod", "elastic-worker-5")["metadata"] == foreign_before

    job.set_workers(3)
    job.wait_hosts(3)
    worker_selector = f"{names.LABEL_TO_JOB}={job.name},{names.LABEL_TO_REPLICA_TYPE}=worker"
    assert pod_names(cluster, ns, worker_selector) == [f"elastic-worker-{i}" for i in range(3)]
    master = f"{names.LABEL_TO_JOB}={job.name},{names.LABEL_TO_JOB_ROLE}=master"
    assert pod_names(cluster, ns, master) == ["elastic-launcher"]

    job.set_workers(1)
    job.wait_hosts(1, timeout=10)
    victims = ("elastic-worker-1", "elastic-worker-2")
    # Off the host lists first, and only then deleted.
    wait_for(
        lambda: all(
            names.ANN_DRAINING_SINCE in (job.pods()[v]["metadata"].get("annotations") or {})
            for v in victims
        ),
        5,
        "victims marked draining",
    )
    assert not any(job.pods()[v]["metadata"].get("deletionTimestamp") for v in victims)
    wait_for(lambda: job.workers() == ["elastic-worker-0"], 20, "victims deleted")
    survivors = ("elastic-launcher", "elastic-worker-0")
    assert {p: get(cluster, ns, "Pod", p)["metadata"]["uid"] for p in survivors} == {
        p: uids[p] for p in survivors
    }
    assert get(cluster, ns, "Pod", "elastic-worker-5")["metadata"]["uid"] == foreign_before["uid"]


def test_an_orphan_named_and_labelled_as_a_worker_is_never_adopted(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    """Issue 31 §3: anyone who may create pods in the namespace can make a pod named and
    labelled as the job's next worker. Adopted, it would enter discover_hosts.sh and the
    launcher's exec grant; it is a name taken like any other (docs/design.md)."""
    ns = job.ns
    start_controller(ns)
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    orphan = render_pods.worker_pod(parse(job.get(), 30), 2)
    orphan["metadata"].pop("ownerReferences")
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(orphan))
    before = get(cluster, ns, "Pod", "elastic-worker-2")["metadata"]

    job.set_workers(3)
    # The name is skipped: the third worker is made at the next free index.
    job_hosts = ["elastic-worker-0:1", "elastic-worker-1:1", "elastic-worker-3:1"]
    wait_for(lambda: job.hosts() == job_hosts, 30, f"discover_hosts.sh == {job_hosts}")
    refused = job.wait_event("WriteRefused", "Warning", "elastic-worker-2")
    assert "no owner" in refused, refused
    assert (job.condition("WriteRefused") or {}).get("reason") == "AlreadyExists"
    assert "elastic-worker-2" not in job.exec_names()
    after = get(cluster, ns, "Pod", "elastic-worker-2")["metadata"]
    # Left as it was (its status is KWOK's: the pod runs meanwhile).
    for field in ("ownerReferences", "labels", "annotations", "uid"):
        assert after.get(field) == before.get(field), field
