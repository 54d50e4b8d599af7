"""The gang scheduler's PodGroup and pods, against training-operator 1.9's.

The expected objects below are written by hand from training-operator v1.9.2's Go code,
not produced by it (its Volcano client module cannot be fetched here): ReconcileJobs and
CalcPGMinResources in pkg/controller.v1/common (minMember = every replica unless
schedulingPolicy.minAvailable says otherwise, queue "default" unless it names one, the
first minMember pods' requests, or limits where a container has no requests, added as
resource.Quantity values), SyncPodGroup (name, namespace, the job's annotations and the
job as controller), the Volcano and scheduler-plugins spec fill functions (the whole spec,
Go's omitempty leaving out zero fields), and DecoratePodTemplateSpec in
pkg/controller.v1/control (schedulerName unless the template names one; Volcano's
``scheduling.k8s.io/group-name`` and ``volcano.sh/task-spec`` annotations, or
scheduler-plugins' ``scheduling.x-k8s.io/pod-group`` label). The comparison is of the
JSON bytes, keys sorted.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mpijob_elastic.core import names, quantity
from mpijob_elastic.core.actions import Create, DeleteObject, Replace
from mpijob_elastic.core.objects import podgroups, render_pods
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from tests.unit.simulation import NAMESPACE, Cluster, make_job

VOLCANO = Settings(gang_scheduler_name="volcano")
PLUGINS = Settings(gang_scheduler_name="scheduler-plugins")
KAI = Settings(gang_scheduler_name="kai-scheduler")
OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "MPIJob",
    "name": "job",
    "uid": "job-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}


def _job(replicas: int = 2, annotations: dict[str, str] | None = None, **spec: Any) -> Any:
    job = make_job(replicas, annotations=annotations, **spec)
    replica_specs = job["spec"]["mpiReplicaSpecs"]
    launcher: dict[str, Any] = {"name": "main", "image": "img"}
    launcher["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    replica_specs["Launcher"]["template"]["spec"]["containers"] = [launcher]
    worker: dict[str, Any] = {"name": "main", "image": "img"}
    worker["resources"] = {
        # Requests present: the limits are not looked at, so the GPU limit is not counted.
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    replica_specs["Worker"]["template"]["spec"]["containers"] = [worker]
    sidecar = {"name": "side", "image": "img", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    replica_specs["Worker"]["template"]["spec"]["containers"].append(sidecar)
    return job


def _bytes(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _render(job: Any, settings: Settings) -> Any:
    gang = podgroups.gang(settings)
    assert gang is not None
    spec = parse(job, 30)
    return podgroups.pod_group(spec, gang, job["metadata"]["annotations"])


def test_volcano_pod_group_of_a_job_that_is_not_elastic_is_training_operator_s() -> None:
    job = _job(
        annotations={"team": "vision"},
        runPolicy={"schedulingPolicy": {"queue": "research", "priorityClass": "high"}},
    )
    expected = (
        '{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"PodGroup","metadata":'
        '{"annotations":{"team":"vision"},"name":"job","namespace":"'
        + NAMESPACE
        + '","ownerReferences":[{"apiVersion":'
        '"kubeflow.org/v1","blockOwnerDeletion":true,"controller":true,"kind":"MPIJob",'
        '"name":"job","uid":"job-uid"}]},"spec":{"minMember":3,"minResources":'
        '{"cpu":"4500m","memory":"9Gi","nvidia.com/gpu":"2"},'
        '"priorityClassName":"high","queue":"research"}}'
    )
    assert _bytes(_render(job, VOLCANO)) == expected


def test_scheduler_plugins_pod_group_of_a_job_that_is_not_elastic_is_training_operator_s() -> None:
    job = _job(3, runPolicy={"schedulingPolicy": {"scheduleTimeoutSeconds": 60, "queue": "q"}})
    expected = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": "job",
            "namespace": NAMESPACE,
            "ownerReferences": [OWNER],
        },
        # queue and priorityClass are Volcano's: scheduler-plugins' spec has neither.
        "spec": {
            "minMember": 4,
            "minResources": {"cpu": "6500m", "memory": "13Gi", "nvidia.com/gpu": "3"},
            "scheduleTimeoutSeconds": 60,
        },
    }
    assert _bytes(_render(job, PLUGINS)) == _bytes(expected)


def test_an_elastic_gang_is_its_minimum_and_the_launcher() -> None:
    job = _job(4, annotations={names.ANN_MIN_REPLICAS: "2", names.ANN_MAX_REPLICAS: "6"})
    group = _render(job, PLUGINS)
    assert group["spec"] == {
        "minMember": 3,
        "minResources": {"cpu": "4500m", "memory": "9Gi", "nvidia.com/gpu": "2"},
    }
    # The job's annotations, as training-operator copies them.
    assert group["metadata"]["annotations"] == job["metadata"]["annotations"]


def test_the_policy_s_own_minimum_and_resources_win_written_as_go_writes_them() -> None:
    policy = {"minAvailable": 2, "minResources": {"cpu": "1000m", "memory": "2048Mi"}}
    job = _job(4, annotations={names.ANN_MIN_REPLICAS: "2"}, runPolicy={"schedulingPolicy": policy})
    spec = _render(job, VOLCANO)["spec"]
    assert spec == {
        "minMember": 2,
        "queue": "default",
        "minResources": {"cpu": "1", "memory": "2Gi"},
    }


def test_a_volcano_gang_without_resources_still_writes_them_empty() -> None:
    # Volcano's minResources is a pointer (written when set, even empty); scheduler-plugins'
    # a map, left out when empty.
    job = make_job(2)
    assert _render(job, VOLCANO)["spec"] == {"minMember": 3, "queue": "default", "minResources": {}}
    assert _render(job, PLUGINS)["spec"] == {"minMember": 3}


@pytest.mark.parametrize(
    ("terms", "total"),
    [
        (["500m", "2", "2"], "4500m"),
        (["1Gi", "4Gi"], "5Gi"),
        (["1", "1"], "2"),
        (["1000m"], "1"),
        (["1500Mi", "12Mi"], "1512Mi"),
        (["100Mi", "0.5"], "104857600500m"),
        (["1G", "1Gi"], "2073741824"),
        (["1e3", "1"], "1001"),
        (["2e3"], "2e3"),
        (["512", "512"], "1024"),
        (["512Ki", "512Ki"], "1Mi"),
        (["100", "200"], "300"),
        (["0.1"], "100m"),
        (["1k", "1k"], "2k"),
        ([0, "1Mi"], "1Mi"),
    ],
)
def test_quantities_add_up_as_the_api_machinery_writes_them(terms: list[Any], total: str) -> None:
    parsed = [quantity.parse(t) for t in terms]
    assert all(p is not None for p in parsed)
    result = parsed[0]
    assert result is not None
    for p in parsed[1:]:
        assert p is not None
        result = result + p
    assert str(result) == total


def test_a_policy_of_the_wrong_shape_is_an_invalid_spec() -> None:
    job = make_job(
        2, runPolicy={"schedulingPolicy": {"minAvailable": "two", "minResources": {"cpu": "lots"}}}
    )
    with pytest.raises(InvalidSpec) as err:
        parse(job, 30)
    fields = [e.field for e in err.value.errors]
    assert fields == [
        "spec.runPolicy.schedulingPolicy.minAvailable",
        "spec.runPolicy.schedulingPolicy.minResources.cpu",
    ]


def test_pods_join_the_gang_as_training_operator_s_do() -> None:
    job = make_job(2)
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["schedulerName"] = "mine"
    spec = parse(job, 30)
    volcano = podgroups.gang(VOLCANO)
    worker = render_pods.worker_pod(spec, 0, volcano)
    assert worker["spec"]["schedulerName"] == "volcano"
    assert worker["metadata"]["annotations"] == {
        "scheduling.k8s.io/group-name": "job",
        "volcano.sh/task-spec": "worker",
    }
    launcher = render_pods.launcher_pod(spec, PLUGINS, "h", 1, podgroups.gang(PLUGINS))
    # The template's own scheduler is kept.
    assert launcher["spec"]["schedulerName"] == "mine"
    assert launcher["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "job"
    plain = render_pods.worker_pod(spec, 0)
    assert "schedulerName" not in plain["spec"]
    assert podgroups.gang(Settings(gang_scheduler_name="none")) is None


def _step(c: Cluster, settings: Settings) -> list[Any]:
    p = c.plan(settings)
    c.apply(p)
    return [a for phase in p.phases for a in phase.writes]


def test_the_pod_group_comes_before_the_pods_and_keeps_step_with_the_minimum() -> None:
    job = make_job(4, annotations={names.ANN_MIN_REPLICAS: "2", names.ANN_MAX_REPLICAS: "6"})
    c = Cluster(job)
    first = _step(c, PLUGINS)
    kinds = [a.obj["kind"] for a in first if isinstance(a, Create)]
    assert kinds.index("PodGroup") < kinds.index("Pod")
    # The launcher is made with its workers: the gang is held until all of it exists.
    assert any(
        isinstance(a, Create) and a.obj["metadata"]["name"] == names.launcher_name("job")
        for a in first
    )
    group = c.get("PodGroup", "job")
    assert group is not None
    assert group["spec"]["minMember"] == 3
    c.run_pods()
    c.job["metadata"]["annotations"][names.ANN_MIN_REPLICAS] = "3"
    writes = _step(c, PLUGINS)
    replaced = [a for a in writes if isinstance(a, Replace) and a.obj["kind"] == "PodGroup"]
    assert [a.obj["spec"]["minMember"] for a in replaced] == [4]
    group = c.get("PodGroup", "job")
    assert group is not None
    assert group["spec"]["minMember"] == 4
    # Settled: nothing more to write to it.
    c.tick(1)
    assert not [a for a in _step(c, PLUGINS) if getattr(a, "obj", {}).get("kind") == "PodGroup"]
    # Suspended: the PodGroup goes with the pods, as training-operator deletes it.
    c.job["spec"]["runPolicy"] = {"suspend": True}
    c.tick(1)
    writes = _step(c, PLUGINS)
    assert "PodGroup" in [a.kind for a in writes if isinstance(a, DeleteObject)]
    assert c.get("PodGroup", "job") is None


def test_scheduling_policy_is_reported_ignored_only_without_a_gang_scheduler() -> None:
    job = make_job(2, runPolicy={"schedulingPolicy": {"queue": "q"}})
    c = Cluster(job)
    _step(c, Settings())
    assert any(e.reason == "SchedulingPolicyIgnored" for e in c.events)
    c2 = Cluster(make_job(2, runPolicy={"schedulingPolicy": {"queue": "q"}}))
    _step(c2, VOLCANO)
    assert not any(e.reason == "SchedulingPolicyIgnored" for e in c2.events)
    group = c2.get("PodGroup", "job")
    assert group is not None
    assert group["spec"]["queue"] == "q"


def test_under_volcano_no_pod_is_made_before_volcano_admits_the_pod_group() -> None:
    """training-operator's DelayPodCreationDueToPodGroup: the pods wait until Volcano's
    enqueue action moves the PodGroup out of Pending."""
    c = Cluster(make_job(2))
    first = _step(c, VOLCANO)
    assert [a.obj["kind"] for a in first if isinstance(a, Create)].count("Pod") == 0
    group = c.get("PodGroup", "job")
    assert group is not None
    group["status"] = {"phase": "Pending"}
    c.tick(1)
    assert not [a for a in _step(c, VOLCANO) if isinstance(a, Create) and a.obj["kind"] == "Pod"]
    group["status"] = {"phase": "Inqueue"}
    c.tick(1)
    made = [a.obj["metadata"]["name"] for a in _step(c, VOLCANO) if isinstance(a, Create)]
    c.tick(1)
    made += [a.obj["metadata"]["name"] for a in _step(c, VOLCANO) if isinstance(a, Create)]
    assert made == ["job-worker-0", "job-worker-1", "job-launcher"]


# KAI-Scheduler's PodGroup (scheduling.run.ai/v2alpha2), written by hand from KAI v0.17.0's
# published API (pkg/apis/scheduling/v2alpha2: minMember, queue, priorityClassName, Go's
# omitempty) and its external PodGroups contract (docs/batch/README.md: the pods'
# pod-group-name and kai.scheduler/skip-podgrouper annotations, schedulerName
# kai-scheduler); training-operator 1.9 has no KAI shape to compare with.


def _kai(job: Any) -> Any:
    gang = podgroups.gang(KAI)
    assert gang is not None
    spec = parse(job, 30)
    return podgroups.pod_group(
        spec, gang, job["metadata"]["annotations"], labels=job["metadata"].get("labels")
    )


def test_kai_pod_group_of_a_job_that_is_not_elastic_holds_every_pod() -> None:
    job = _job(3, annotations={"team": "vision"})
    expected = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {
            "annotations": {"team": "vision"},
            "name": "job",
            "namespace": NAMESPACE,
            "ownerReferences": [OWNER],
        },
        # KAI's spec has no minResources; a queue is always named, since KAI's scheduler
        # leaves a PodGroup of a queue that does not exist (or of none) unscheduled.
        "spec": {"minMember": 4, "queue": "default-queue"},
    }
    assert _bytes(_kai(job)) == _bytes(expected)


def test_a_kai_gang_is_its_minimum_and_the_launcher_in_the_job_s_queue() -> None:
    job = _job(4, annotations={names.ANN_MIN_REPLICAS: "2", names.ANN_MAX_REPLICAS: "6"})
    job["metadata"]["labels"] = {"kai.scheduler/queue": "research", "priorityClassName": "train"}
    assert _kai(job)["spec"] == {"minMember": 3, "queue": "research", "priorityClassName": "train"}


def test_kai_reads_the_scheduling_policy_where_the_job_has_no_kai_label() -> None:
    policy = {"queue": "team-a", "priorityClass": "build", "scheduleTimeoutSeconds": 60}
    job = _job(2, runPolicy={"schedulingPolicy": policy})
    assert _kai(job)["spec"] == {"minMember": 3, "queue": "team-a", "priorityClassName": "build"}
    # KAI's own labels win: they are what KAI documents for a workload.
    job["metadata"]["labels"] = {"kai.scheduler/queue": "team-b", "priorityClassName": "train"}
    assert _kai(job)["spec"] == {"minMember": 3, "queue": "team-b", "priorityClassName": "train"}
    # minAvailable still overrides the gang, as for the other schedulers.
    job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] = 2
    assert _kai(job)["spec"]["minMember"] == 2


def test_pods_join_the_kai_gang_by_its_annotation_and_keep_kai_s_pod_grouper_out() -> None:
    job = make_job(2)
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["schedulerName"] = "mine"
    spec = parse(job, 30)
    gang = podgroups.gang(Settings(gang_scheduler_name="KAI-Scheduler"))
    assert gang == podgroups.Gang("kai-scheduler", "scheduling.run.ai/v2alpha2")
    worker = render_pods.worker_pod(spec, 0, gang)
    assert worker["spec"]["schedulerName"] == "kai-scheduler"
    assert worker["metadata"]["annotations"] == {
        "pod-group-name": "job",
        "kai.scheduler/skip-podgrouper": "true",
    }
    assert podgroups.SCHEDULER_PLUGINS_LABEL not in worker["metadata"].get("labels", {})
    launcher = render_pods.launcher_pod(spec, KAI, "h", 1, gang)
    # The template's own scheduler is kept.
    assert launcher["spec"]["schedulerName"] == "mine"
    assert launcher["metadata"]["annotations"]["pod-group-name"] == "job"
    # KAI admits pods itself: nothing waits for the PodGroup's phase, as under Volcano.
    assert not podgroups.held(gang, {"status": {}})


def test_the_kai_pod_group_keeps_step_with_the_minimum_and_the_queue() -> None:
    job = make_job(4, annotations={names.ANN_MIN_REPLICAS: "2", names.ANN_MAX_REPLICAS: "6"})
    c = Cluster(job)
    first = _step(c, KAI)
    kinds = [a.obj["kind"] for a in first if isinstance(a, Create)]
    assert kinds.index("PodGroup") < kinds.index("Pod")
    group = c.get("PodGroup", "job")
    assert group is not None
    assert group["apiVersion"] == "scheduling.run.ai/v2alpha2"
    assert group["spec"] == {"minMember": 3, "queue": "default-queue"}
    c.run_pods()
    c.job["metadata"]["annotations"][names.ANN_MIN_REPLICAS] = "3"
    writes = _step(c, KAI)
    replaced = [a for a in writes if isinstance(a, Replace) and a.obj["kind"] == "PodGroup"]
    assert [a.obj["spec"]["minMember"] for a in replaced] == [4]
    c.tick(1)
    c.job["metadata"]["labels"] = {"kai.scheduler/queue": "research"}
    writes = _step(c, KAI)
    replaced = [a for a in writes if isinstance(a, Replace) and a.obj["kind"] == "PodGroup"]
    assert [a.obj["spec"] for a in replaced] == [{"minMember": 4, "queue": "research"}]
    # Settled: nothing more to write to it.
    c.tick(1)
    assert not [a for a in _step(c, KAI) if getattr(a, "obj", {}).get("kind") == "PodGroup"]
