"""The ValidatingAdmissionPolicies in config/admission on a real API server: what they
reject, with which message, what they let through, and what `kubectl scale` runs into.

docs/admission.md documents the same behaviour; the messages asserted here are the ones
users see.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.manifests import (
    ADMISSION_ENFORCED,
    ADMISSION_LABEL,
    POLICY_READY_TIMEOUT,
    AdmissionPolicy,
    create_namespace,
    deny_in_namespace,
    mpijob,
    wait_until_rejected,
)

DENIED_BY = "ValidatingAdmissionPolicy 'mpijob-elastic-bounds' with binding "
SCALE_DENIED_BY = "ValidatingAdmissionPolicy 'mpijob-elastic-scale-bounds' with binding "
# What the API server itself says about a negative value at the scale subresource's
# specReplicasPath, before any admission policy runs.
BUILT_IN_NEGATIVE = (
    ".spec.mpiReplicaSpecs.Worker.replicas: Invalid value: -1: should be a non-negative integer"
)


def above_max(workers: int, low: str, high: str) -> str:
    return (
        f"spec.mpiReplicaSpecs.Worker.replicas is {workers}, above the maximum {high} set by "
        f"annotation mpijob-elastic.io/max-replicas (allowed: {low}..{high})"
    )


def below_min(workers: int, low: str, high: str) -> str:
    return (
        f"spec.mpiReplicaSpecs.Worker.replicas is {workers}, below the minimum {low} set by "
        f"annotation mpijob-elastic.io/min-replicas (allowed: {low}..{high})"
    )


def create(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)


def patch(cluster: Cluster, namespace: str, name: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "patch", "-n", namespace, f"mpijob/{name}", "--type=merge", "-p", json.dumps(body),
        check=False,
    )  # fmt: skip


def scale(cluster: Cluster, namespace: str, name: str, replicas: int) -> Any:
    return cluster.kubectl(
        "scale", "-n", namespace, f"mpijob/{name}", f"--replicas={replicas}", check=False
    )


def get_spec(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "-n", namespace, f"mpijob/{name}", "-o", "json").stdout
    job: dict[str, Any] = json.loads(out)
    return job


def workers_of(job: dict[str, Any]) -> int:
    replicas: int = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    return replicas


def assert_denied(proc: Any, message: str, by: str = DENIED_BY) -> None:
    assert proc.returncode != 0, f"accepted: {proc.stdout}"
    assert by in proc.stderr
    assert message in proc.stderr, proc.stderr


def replicas_patch(role: str, value: int) -> dict[str, Any]:
    return {"spec": {"mpiReplicaSpecs": {role: {"replicas": value}}}}


def annotation_patch(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


CREATE_REJECTIONS = [
    pytest.param(
        mpijob("j", 6, min_replicas="1", max_replicas="5"), above_max(6, "1", "5"), id="above-max"
    ),
    pytest.param(
        mpijob("j", 1, min_replicas="2", max_replicas="5"), below_min(1, "2", "5"), id="below-min"
    ),
    pytest.param(
        mpijob("j", 0, min_replicas="1"), below_min(0, "1", "unbounded"), id="below-min-no-max"
    ),
    pytest.param(mpijob("j", 9, max_replicas="4"), above_max(9, "0", "4"), id="above-max-no-min"),
    pytest.param(
        mpijob("j", None, min_replicas="2"),
        below_min(1, "2", "unbounded"),
        id="unset-replicas-count-as-1",
    ),
    pytest.param(
        mpijob("j", 2, launchers=2),
        "spec.mpiReplicaSpecs.Launcher.replicas must be 1, got 2",
        id="launcher-2",
    ),
    pytest.param(
        mpijob("j", 2, launchers=0),
        "spec.mpiReplicaSpecs.Launcher.replicas must be 1, got 0",
        id="launcher-0",
    ),
    pytest.param(
        mpijob("j", 2, slots=0), "spec.slotsPerWorker must be at least 1, got 0", id="slots-0"
    ),
    pytest.param(
        mpijob("j", 2, slots=-3), "spec.slotsPerWorker must be at least 1, got -3", id="slots-neg"
    ),
    pytest.param(
        mpijob("j", 2, min_replicas="two"),
        'metadata.annotations[mpijob-elastic.io/min-replicas] must be a whole number, got "two"',
        id="min-not-a-number",
    ),
    pytest.param(
        mpijob("j", 2, max_replicas="-1"),
        'metadata.annotations[mpijob-elastic.io/max-replicas] must be a whole number, got "-1"',
        id="max-negative",
    ),
    pytest.param(
        mpijob("j", 0, max_replicas="0"),
        "metadata.annotations[mpijob-elastic.io/max-replicas] must be at least 1, got 0",
        id="max-0",
    ),
    pytest.param(
        mpijob("j", 3, min_replicas="4", max_replicas="2"),
        "metadata.annotations[mpijob-elastic.io/min-replicas] (4) must not be above "
        "metadata.annotations[mpijob-elastic.io/max-replicas] (2)",
        id="min-above-max",
    ),
]


@pytest.mark.parametrize(("job", "message"), CREATE_REJECTIONS)
def test_create_rejected(
    cluster: Cluster, admission_namespace: str, job: dict[str, Any], message: str
) -> None:
    assert_denied(create(cluster, admission_namespace, job), message)
    listed = cluster.kubectl("get", "-n", admission_namespace, "mpijobs", "-o", "name").stdout
    assert listed.strip() == ""


def test_negative_workers_rejected_by_the_api_server_first(
    cluster: Cluster, admission_namespace: str
) -> None:
    """The CRD's scale subresource makes the API server check Worker replicas itself."""
    proc = create(cluster, admission_namespace, mpijob("j", -1, min_replicas="1"))
    assert proc.returncode != 0
    assert BUILT_IN_NEGATIVE in proc.stderr
    assert "ValidatingAdmissionPolicy" not in proc.stderr


@pytest.mark.parametrize(
    "job",
    [
        pytest.param(mpijob("j", 1, min_replicas="1", max_replicas="5"), id="at-min"),
        pytest.param(mpijob("j", 5, min_replicas="1", max_replicas="5"), id="at-max"),
        pytest.param(mpijob("j", 0, min_replicas="0", max_replicas="1"), id="min-0"),
        pytest.param(mpijob("j", 3, min_replicas="3", max_replicas="3"), id="fixed"),
        pytest.param(mpijob("j", 0), id="no-bounds-0"),
        pytest.param(mpijob("j", 1000), id="no-bounds-1000"),
        pytest.param(mpijob("j", 2, launchers=None, slots=None), id="defaults"),
    ],
)
def test_create_allowed(cluster: Cluster, admission_namespace: str, job: dict[str, Any]) -> None:
    proc = create(cluster, admission_namespace, job)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def running_job(cluster: Cluster, admission_namespace: str) -> str:
    """A job with 2 workers allowed between 1 and 5."""
    job = mpijob("elastic", 2, min_replicas="1", max_replicas="5")
    cluster.kubectl("create", "-n", admission_namespace, "-f", "-", input=json.dumps(job))
    return "elastic"


PATCH_REJECTIONS = [
    pytest.param(replicas_patch("Worker", 6), above_max(6, "1", "5"), id="above-max"),
    pytest.param(replicas_patch("Worker", 0), below_min(0, "1", "5"), id="below-min"),
    pytest.param(
        replicas_patch("Launcher", 2),
        "spec.mpiReplicaSpecs.Launcher.replicas must be 1, got 2",
        id="launcher-2",
    ),
    pytest.param(
        {"spec": {"slotsPerWorker": 0}},
        "spec.slotsPerWorker must be at least 1, got 0",
        id="slots-0",
    ),
    pytest.param(
        annotation_patch(names.ANN_MAX_REPLICAS, "1"), above_max(2, "1", "1"), id="max-lowered"
    ),
    pytest.param(
        annotation_patch(names.ANN_MIN_REPLICAS, "3"), below_min(2, "3", "5"), id="min-raised"
    ),
    pytest.param(
        annotation_patch(names.ANN_MIN_REPLICAS, "6"),
        "metadata.annotations[mpijob-elastic.io/min-replicas] (6) must not be above "
        "metadata.annotations[mpijob-elastic.io/max-replicas] (5)",
        id="min-above-max",
    ),
    pytest.param(
        annotation_patch(names.ANN_MAX_REPLICAS, "five"),
        'metadata.annotations[mpijob-elastic.io/max-replicas] must be a whole number, got "five"',
        id="max-not-a-number",
    ),
]


@pytest.mark.parametrize(("body", "message"), PATCH_REJECTIONS)
def test_patch_rejected(
    cluster: Cluster,
    admission_namespace: str,
    running_job: str,
    body: dict[str, Any],
    message: str,
) -> None:
    before = get_spec(cluster, admission_namespace, running_job)
    assert_denied(patch(cluster, admission_namespace, running_job, body), message)
    after = get_spec(cluster, admission_namespace, running_job)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_patch_negative_workers_rejected_by_the_api_server(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    proc = patch(cluster, admission_namespace, running_job, replicas_patch("Worker", -1))
    assert proc.returncode != 0
    assert BUILT_IN_NEGATIVE in proc.stderr


def test_in_range_edits_allowed(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    for workers in (5, 1, 3):
        proc = patch(cluster, admission_namespace, running_job, replicas_patch("Worker", workers))
        assert proc.returncode == 0, proc.stderr
        assert workers_of(get_spec(cluster, admission_namespace, running_job)) == workers
    # Moving replicas and bounds together in one write is judged on the result.
    both = {
        "metadata": {"annotations": {names.ANN_MIN_REPLICAS: "6", names.ANN_MAX_REPLICAS: "8"}},
        **replicas_patch("Worker", 7),
    }
    proc = patch(cluster, admission_namespace, running_job, both)
    assert proc.returncode == 0, proc.stderr
    # Removing the bounds lifts them.
    unbound = {
        "metadata": {"annotations": {names.ANN_MIN_REPLICAS: None, names.ANN_MAX_REPLICAS: None}}
    }
    assert patch(cluster, admission_namespace, running_job, unbound).returncode == 0
    proc = patch(cluster, admission_namespace, running_job, replicas_patch("Worker", 0))
    assert proc.returncode == 0, proc.stderr


def test_jobs_without_bounds_take_any_non_negative_count(
    cluster: Cluster, admission_namespace: str
) -> None:
    cluster.kubectl(
        "create", "-n", admission_namespace, "-f", "-", input=json.dumps(mpijob("free", 2))
    )
    for workers in (0, 64, 1):
        proc = patch(cluster, admission_namespace, "free", replicas_patch("Worker", workers))
        assert proc.returncode == 0, proc.stderr
    for workers in (0, 100, 2):
        proc = scale(cluster, admission_namespace, "free", workers)
        assert proc.returncode == 0, proc.stderr
        assert workers_of(get_spec(cluster, admission_namespace, "free")) == workers


def test_status_writes_are_not_checked(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    """The controller's status updates never go through the policy."""
    status = {"status": {"replicaStatuses": {"Worker": {"active": 9}}}}
    cluster.kubectl(
        "patch", "-n", admission_namespace, f"mpijob/{running_job}", "--subresource=status",
        "--type=merge", "-p", json.dumps(status),
    )  # fmt: skip


def test_out_of_range_job_from_before_the_policy_can_still_be_edited(
    cluster: Cluster, admission_policy: AdmissionPolicy
) -> None:
    """Rules re-check only what a write changes: old jobs stay labelable and deletable."""
    namespace = create_namespace(cluster)  # not selected by the bindings yet
    try:
        job = mpijob("legacy", 9, max_replicas="5", launchers=2, slots=0)
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(job))
        cluster.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}={ADMISSION_ENFORCED}")
        wait_until_rejected(
            cluster,
            ["patch", "-n", namespace, "mpijob/legacy", "--dry-run=server", "--type=merge",
             "-p", json.dumps(replicas_patch("Worker", 8))],
            above_max(8, "0", "5"),
            "the binding in a newly labelled namespace",
        )  # fmt: skip
        cluster.kubectl("label", "-n", namespace, "mpijob/legacy", "team=a")
        cluster.kubectl("annotate", "-n", namespace, "mpijob/legacy", "note=old")
        # Bringing it into range is allowed; so is raising the bound to cover it.
        proc = patch(cluster, namespace, "legacy", annotation_patch(names.ANN_MAX_REPLICAS, "10"))
        assert proc.returncode == 0, proc.stderr
        proc = patch(cluster, namespace, "legacy", replicas_patch("Launcher", 3))
        assert_denied(proc, "spec.mpiReplicaSpecs.Launcher.replicas must be 1, got 3")
        cluster.kubectl("delete", "-n", namespace, "mpijob/legacy")
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def wait_for_scale_policy(cluster: Cluster, namespace: str, name: str, bad: int) -> None:
    """The scale policy reads the job from the API server's watch cache, which lags a
    fresh job by a moment; wait until it sees this one."""
    wait_until_rejected(
        cluster,
        ["scale", "--dry-run=server", "-n", namespace, f"mpijob/{name}", f"--replicas={bad}"],
        SCALE_DENIED_BY,
        f"the scale policy for mpijob/{name}",
    )


def test_scale_in_range_allowed(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    for workers in (5, 1, 4):
        proc = scale(cluster, admission_namespace, running_job, workers)
        assert proc.returncode == 0, proc.stderr
        assert workers_of(get_spec(cluster, admission_namespace, running_job)) == workers


@pytest.mark.parametrize(
    ("workers", "message"),
    [(6, above_max(6, "1", "5")), (0, below_min(0, "1", "5"))],
    ids=["above-max", "below-min"],
)
def test_scale_out_of_range_rejected(
    cluster: Cluster, admission_namespace: str, running_job: str, workers: int, message: str
) -> None:
    wait_for_scale_policy(cluster, admission_namespace, running_job, 6)
    assert_denied(
        scale(cluster, admission_namespace, running_job, workers), message, SCALE_DENIED_BY
    )
    assert workers_of(get_spec(cluster, admission_namespace, running_job)) == 2


def test_scale_follows_changed_bounds(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    wait_for_scale_policy(cluster, admission_namespace, running_job, 6)
    patch(cluster, admission_namespace, running_job, annotation_patch(names.ANN_MAX_REPLICAS, "8"))
    # The new bound reaches the policy through the watch cache: poll until it is taken.
    deadline = time.monotonic() + POLICY_READY_TIMEOUT
    while (proc := scale(cluster, admission_namespace, running_job, 7)).returncode != 0:
        assert time.monotonic() < deadline, proc.stderr
        time.sleep(0.5)
    assert workers_of(get_spec(cluster, admission_namespace, running_job)) == 7
    assert_denied(
        scale(cluster, admission_namespace, running_job, 9), above_max(9, "1", "8"), SCALE_DENIED_BY
    )


def test_scale_negative_rejected_by_the_api_server(
    cluster: Cluster, admission_namespace: str, running_job: str
) -> None:
    # kubectl scale refuses a negative count itself; a client of the API can still send one.
    proc = cluster.kubectl(
        "patch", "-n", admission_namespace, f"mpijob/{running_job}", "--subresource=scale",
        "--type=merge", "-p", json.dumps({"spec": {"replicas": -1}}), check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert BUILT_IN_NEGATIVE in proc.stderr
    assert workers_of(get_spec(cluster, admission_namespace, running_job)) == 2


def test_scale_only_judges_the_scaled_job(cluster: Cluster, admission_namespace: str) -> None:
    """The scale policy reads every MPIJob of the namespace as a parameter; another job's
    bounds must not apply."""
    tight = mpijob("tight", 1, min_replicas="1", max_replicas="1")
    loose = mpijob("loose", 1)
    for job in (tight, loose):
        cluster.kubectl("create", "-n", admission_namespace, "-f", "-", input=json.dumps(job))
    wait_for_scale_policy(cluster, admission_namespace, "tight", 2)
    proc = scale(cluster, admission_namespace, "loose", 7)
    assert proc.returncode == 0, proc.stderr


# A policy that denies every scale request and says what it was shown. It pins down the
# facts docs/admission.md and scale-policy.yaml rest on, should a Kubernetes release change
# them.
PROBE = "mpijob-elastic-test-probe"
PROBE_MESSAGE = (
    "'kind=' + object.apiVersion + '/' + object.kind"
    " + ' request=' + request.kind.group + '/' + request.kind.version + '/' + request.kind.kind"
    " + ' resource=' + request.resource.resource + ' subresource=' + request.subResource"
    " + ' metadata=' + object.metadata.map(k, k).join(',')"
    " + ' replicas=' + string(object.spec.replicas)"
    " + ' old=' + (oldObject == null ? 'none' : oldObject.kind"
    " + '/' + string(oldObject.spec.replicas))"
)


@pytest.fixture
def probe_policy(cluster: Cluster, crd: str) -> Iterator[str]:
    namespace = create_namespace(cluster)
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": PROBE},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [names.GROUP],
                        "apiVersions": [names.VERSION],
                        "operations": ["UPDATE"],
                        "resources": [f"{names.PLURAL}/scale"],
                    }
                ]
            },
            "validations": [{"expression": "false", "messageExpression": PROBE_MESSAGE}],
        },
    }
    binding = deny_in_namespace(PROBE, namespace)
    cluster.apply(policy)
    cluster.apply(binding)
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding", PROBE, check=False)
        cluster.kubectl("delete", "validatingadmissionpolicy", PROBE, check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_what_a_policy_sees_on_the_scale_subresource(cluster: Cluster, probe_policy: str) -> None:
    job = mpijob("seen", 2, min_replicas="1", max_replicas="5")
    job["metadata"]["labels"] = {"team": "a"}
    cluster.kubectl("create", "-n", probe_policy, "-f", "-", input=json.dumps(job))
    args = ["scale", "-n", probe_policy, "mpijob/seen", "--replicas=3"]
    # A dry run goes through admission too, and leaves the job at 2 should the policy not
    # be in force yet.
    wait_until_rejected(cluster, [*args, "--dry-run=server"], PROBE, "the probe policy")
    stderr = cluster.kubectl(*args, check=False).stderr
    seen = dict(
        part.split("=", 1) for part in stderr.split("denied request: ", 1)[1].strip().split(" ")
    )
    assert seen["kind"] == "autoscaling/v1/Scale"
    assert seen["request"] == "autoscaling/v1/Scale"
    assert seen["resource"] == names.PLURAL
    assert seen["subresource"] == "scale"
    # No annotations and no labels: the bounds are out of the policy's sight.
    assert set(seen["metadata"].split(",")) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    }
    assert seen["replicas"] == "3"
    assert seen["old"] == "Scale/2"


def test_the_launcher_changes_only_the_data_of_its_ranks_config_map(
    cluster: Cluster, admission_namespace: str
) -> None:
    """Issue 31 §4: the launcher's patch right on ``<job>-ranks`` (its reports) could set
    ``immutable`` (the controller could never empty the reports again, and no launcher is
    created for the job again) or a finalizer (its deletion stuck). ranks-policy.yaml lets
    an update change the data alone. Played with the launcher's own right, as the
    controller grants it (render.py)."""
    ns = admission_namespace
    ranks = names.ranks_name("job")
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ranks, "labels": names.object_labels("job", None)},
        },
        ns,
    )
    launcher = names.launcher_name("job")
    cluster.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": launcher}}, ns
    )
    rbac = "rbac.authorization.k8s.io"
    rule = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [ranks]}
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": launcher},
            "rules": [{**rule, "verbs": ["get", "patch"]}],
        },
        ns,
    )
    cluster.apply(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": launcher},
            "subjects": [{"kind": "ServiceAccount", "name": launcher, "namespace": ns}],
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": launcher},
        },
        ns,
    )

    def as_launcher(patch: dict[str, Any]) -> Any:
        return cluster.kubectl(
            "patch", "configmap", ranks, "-n", ns, "--type=merge", "-p", json.dumps(patch),
            check=False, as_user=f"system:serviceaccount:{ns}:{launcher}",
        )  # fmt: skip

    by = "ValidatingAdmissionPolicy 'mpijob-elastic-ranks-reports'"
    deadline = time.monotonic() + POLICY_READY_TIMEOUT
    while by not in (refused := as_launcher({"immutable": True})).stderr:
        assert refused.returncode != 0, "immutable set: the policy is not enforced"
        assert time.monotonic() < deadline, refused.stderr
        time.sleep(0.5)
    assert "immutable field is the controller's" in refused.stderr
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u", "controller": True}
    for patch, field in (
        ({"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers"),
        ({"metadata": {"labels": {names.LABEL_JOB: None}}}, "labels and annotations"),
        ({"metadata": {"annotations": {"example.com/note": "x"}}}, "labels and annotations"),
        ({"metadata": {"ownerReferences": [owner]}}, "owner references"),
    ):
        refused = as_launcher(patch)
        assert refused.returncode != 0, patch
        assert by in refused.stderr, (patch, refused.stderr)
        assert f"ranks ConfigMap's {field} are the controller's" in refused.stderr, refused.stderr
    # Its reports go through, as before.
    report = as_launcher({"data": {"job-worker-0_1_1795900000": "start"}})
    assert report.returncode == 0, report.stderr
    cm = cluster.raw("GET", f"/api/v1/namespaces/{ns}/configmaps/{ranks}") or {}
    assert cm["data"] == {"job-worker-0_1_1795900000": "start"}
    assert not cm.get("immutable")
    assert not cm["metadata"].get("finalizers")


def test_an_admitted_job_keeps_its_queue_label_until_suspended(
    cluster: Cluster, admission_namespace: str
) -> None:
    """Issue 32: the queue label removed from an admitted job that runs took it out of
    Kueue's path while its Workload kept the quota. queue-policy.yaml keeps the label
    while the job's QueueAdmitted condition is True and it is not suspended."""
    ns = admission_namespace
    job = mpijob("queued", 2)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(job))
    path = f"/apis/{names.API_VERSION}/namespaces/{ns}/{names.PLURAL}/queued"

    def relabel(labels: dict[str, Any]) -> Any:
        patch = json.dumps({"metadata": {"labels": labels}})
        return cluster.kubectl(
            "patch", "mpijob", "queued", "-n", ns, "--type=merge", "-p", patch, check=False
        )

    # Not admitted yet: the label may change (the Workload follows it).
    assert relabel({"kueue.x-k8s.io/queue-name": "cpus"}).returncode == 0
    admitted = {"type": "QueueAdmitted", "status": "True", "reason": "Admitted", "message": ""}
    cluster.raw("PATCH", f"{path}/status", {"status": {"conditions": [admitted]}})
    by = "ValidatingAdmissionPolicy 'mpijob-elastic-queue-label'"
    deadline = time.monotonic() + POLICY_READY_TIMEOUT
    while by not in (refused := relabel({"kueue.x-k8s.io/queue-name": None})).stderr:
        assert refused.returncode != 0, "the label removed: the policy is not enforced"
        assert time.monotonic() < deadline, refused.stderr
        time.sleep(0.5)
    assert "label of a job Kueue admitted stays cpus while the job runs" in refused.stderr
    moved = relabel({"kueue.x-k8s.io/queue-name": "gpus"})
    assert by in moved.stderr, moved.stderr
    # Other edits go through; once suspended, the label may go.
    assert relabel({"team": "a"}).returncode == 0
    cluster.raw("PATCH", path, {"spec": {"runPolicy": {"suspend": True}}})
    removed = relabel({"kueue.x-k8s.io/queue-name": None})
    assert removed.returncode == 0, removed.stderr


def test_an_admitted_job_without_the_queue_label_is_not_given_one_while_it_runs(
    cluster: Cluster, admission_namespace: str
) -> None:
    """Issue 32: a job without the label that Kueue admitted in the LocalQueue default
    (--kueue-manage-jobs-without-queue-name) is not moved to another queue while it runs."""
    ns = admission_namespace
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(mpijob("plain", 2)))
    path = f"/apis/{names.API_VERSION}/namespaces/{ns}/{names.PLURAL}/plain"
    admitted = {"type": "QueueAdmitted", "status": "True", "reason": "Admitted", "message": ""}
    cluster.raw("PATCH", f"{path}/status", {"status": {"conditions": [admitted]}})
    patch = json.dumps({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpus"}}})
    by = "ValidatingAdmissionPolicy 'mpijob-elastic-queue-label'"
    deadline = time.monotonic() + POLICY_READY_TIMEOUT
    while (
        by
        not in (
            refused := cluster.kubectl(
                "patch", "mpijob", "plain", "-n", ns, "--type=merge", "-p", patch, check=False
            )
        ).stderr
    ):
        assert refused.returncode != 0, "the label added: the policy is not enforced"
        assert time.monotonic() < deadline, refused.stderr
        time.sleep(0.5)
    assert "stays unset (its LocalQueue: default) while the job runs" in refused.stderr
