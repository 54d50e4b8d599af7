"""Kueue admission, pure (core/queueing/kueue.py, core/queueing/kueue_writes.py): the
Workload a job gets, how the job is seen through its admission, and the writes of its
Workloads."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    Action,
    Create,
    DeleteObject,
    PatchStatus,
    Refusal,
    Replace,
    Writes,
)
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.planning.desired import desired
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import charges, kueue, kueue_writes
from mpijob_elastic.core.queueing.kueue import Queue, Standing
from mpijob_elastic.core.queueing.kueue_writes import workload_writes
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.machinery.kube import ApiError
from tests.unit.simulation import SETTINGS, Cluster, FakeKube, Obj, Request, make_job

NOW = "2026-11-26T00:00:00Z"
FLAVOR = {
    "gpu": {
        "nodeLabels": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
}


def job(replicas: int = 6, low: str | None = "2", high: str = "6") -> dict[str, Any]:
    annotations = {names.ANN_MIN_REPLICAS: low, names.ANN_MAX_REPLICAS: high} if low else {}
    made = make_job(replicas, annotations=annotations)
    made["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q", kueue.PRIORITY_LABEL: "high"}
    return made


def workload(
    j: dict[str, Any],
    workers: int,
    index: int = 0,
    *,
    admitted: int | None = None,
    conditions: tuple[tuple[str, str], ...] = (),
    replaces: str = "",
) -> dict[str, Any]:
    w = kueue.render_workload(j, Queue(True, slices=True), workers, index, replaces)
    w["metadata"].update(uid=f"wl-{index}", resourceVersion="7", generation=1)
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]
    }
    if admitted is not None:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "launcher", "count": 1, "flavors": {"cpu": "gpu"}},
                {"name": "worker", "count": admitted, "flavors": {"nvidia.com/gpu": "gpu"}},
            ],
        }
        status["conditions"] += [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
        ]
    w["status"] = status
    return w


def verb(write: Action) -> str:
    return {Create: "create", Replace: "replace", DeleteObject: "delete", PatchStatus: "patch"}[
        type(write)
    ]


def obj(write: Action) -> dict[str, Any]:
    assert isinstance(write, Create | Replace | PatchStatus)
    return write.obj


def worker_pods(n: int, phase: str = "Pending") -> list[dict[str, Any]]:
    return [
        {
            "metadata": {"name": f"job-worker-{i}", "labels": {names.LABEL_ROLE: "worker"}},
            "status": {"phase": phase},
        }
        for i in range(n)
    ]


def launcher_pod(phase: str = "Running") -> dict[str, Any]:
    labels = {names.LABEL_ROLE: names.ROLE_LAUNCHER}
    return {"metadata": {"name": "job-launcher", "labels": labels}, "status": {"phase": phase}}


def test_without_slices_the_workload_admits_from_min_replicas_with_the_jobs_priority() -> None:
    w = kueue.render_workload(job(), Queue(True, priorities={"high": 1000}), 6)
    sets = {p["name"]: p for p in w["spec"]["podSets"]}
    assert (sets["launcher"]["count"], sets["worker"]["count"]) == (1, 6)
    assert sets["worker"]["minCount"] == 2
    assert "minCount" not in sets["launcher"]
    assert w["spec"]["queueName"] == "q"
    assert w["spec"]["priority"] == 1000
    assert w["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"
    assert kueue.ELASTIC_ANNOTATION not in w["metadata"]["annotations"]
    (owner,) = w["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (names.KIND, "job-uid", True)


def test_with_slices_the_first_workload_asks_for_min_replicas_exactly() -> None:
    (write,) = workload_writes(job(), Queue(True, slices=True), (), NOW)
    assert verb(write) == "create"
    worker = next(p for p in obj(write)["spec"]["podSets"] if p["name"] == "worker")
    assert worker["count"] == 2
    assert "minCount" not in worker
    assert obj(write)["metadata"]["annotations"][kueue.ELASTIC_ANNOTATION] == "true"


def test_a_job_is_held_until_admitted_then_runs_at_the_admitted_size_on_the_flavor() -> None:
    j = job()
    held = kueue.gate(j, Queue(True, [workload(j, 2)], FLAVOR, slices=True))
    assert held["spec"]["runPolicy"]["suspend"] is True
    assert "runPolicy" not in j["spec"]  # the input is left alone
    admitted = kueue.gate(j, Queue(True, [workload(j, 2, admitted=2)], FLAVOR, slices=True))
    assert "suspend" not in admitted["spec"].get("runPolicy", {})
    specs = admitted["spec"]["mpiReplicaSpecs"]
    assert specs["Worker"]["replicas"] == 2
    for role in ("Launcher", "Worker"):
        pod = specs[role]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "a100"}
        assert pod["tolerations"] == FLAVOR["gpu"]["tolerations"]


def test_an_evicted_job_is_held_and_its_quota_released_only_once_its_pods_are_gone() -> None:
    j = job(replicas=2, low=None)
    evicted = workload(j, 2, admitted=2, conditions=(("Evicted", "Preempted"),))
    evicted["status"]["conditions"][0]["lastTransitionTime"] = NOW
    queue = Queue(True, [evicted], FLAVOR)
    # Its quota still held: the job runs on as admitted, until run_policy.py stops it once
    # the checkpoint window after the eviction is over (tests/unit/test_notices.py).
    gated = kueue.gate(j, queue)
    assert "suspend" not in gated["spec"].get("runPolicy", {})
    assert gated["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["nodeSelector"]
    standing = kueue.standing(j, queue)
    assert standing.reason == "Evicted"
    # A second after the condition's whole-second time: the window is never shorter.
    assert standing.evicted_at == datetime(2026, 11, 26, 0, 0, 1, tzinfo=UTC)
    assert workload_writes(j, queue, worker_pods(1), NOW) == []
    (write,) = workload_writes(j, queue, (), NOW)
    assert verb(write) == "patch"
    status = obj(write)["status"]
    assert status["admission"] is None
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds["QuotaReserved"] == ("False", "Pending")
    assert conds["Requeued"] == ("True", "Preempted")
    assert conds["Evicted"] == ("True", "Preempted")  # Kueue's, kept
    assert obj(write)["metadata"]["resourceVersion"] == "7"
    # Once the admission is cleared the job is held again, and no longer stopping.
    cleared = copy.deepcopy(evicted)
    cleared["status"].pop("admission")
    queue = Queue(True, [cleared], FLAVOR)
    assert kueue.gate(j, queue)["spec"]["runPolicy"]["suspend"] is True
    assert kueue.standing(j, queue).evicted_at is None


def test_an_evicted_elastic_job_asks_for_its_minimum_again_and_withdraws_its_growth() -> None:
    j = job()
    evicted = workload(j, 4, 2, admitted=4, conditions=(("Evicted", "Preempted"),))
    growing = workload(j, 5, 3, replaces="ns/x")
    queue = Queue(True, [evicted, growing], FLAVOR, slices=True)
    writes = workload_writes(j, queue, worker_pods(4), NOW)
    assert [(verb(w), w.name) for w in writes if isinstance(w, DeleteObject)] == [
        ("delete", kueue.workload_name(j, 3))
    ]
    assert len(writes) == 1
    shrink = workload_writes(j, Queue(True, [evicted], FLAVOR, slices=True), (), NOW)
    assert [verb(w) for w in shrink] == ["replace"]
    assert next(p["count"] for p in obj(shrink[0])["spec"]["podSets"] if p["name"] == "worker") == 2


def test_an_admitted_elastic_job_grows_one_worker_per_slice() -> None:
    j = job()
    now = workload(j, 2, 0, admitted=2)
    (write,) = workload_writes(j, Queue(True, [now], FLAVOR, slices=True), worker_pods(2), NOW)
    assert verb(write) == "create"
    assert obj(write)["metadata"]["name"] == kueue.workload_name(j, 1)
    annotations = obj(write)["metadata"]["annotations"]
    assert annotations[kueue.REPLACEMENT_ANNOTATION] == f"{j['metadata']['namespace']}/" + (
        kueue.workload_name(j)
    )
    assert next(p["count"] for p in obj(write)["spec"]["podSets"] if p["name"] == "worker") == 3
    # While that slice waits, no other is asked for.
    asked = workload(j, 3, 1, replaces="x")
    assert workload_writes(j, Queue(True, [now, asked], FLAVOR, slices=True), (), NOW) == []


def test_the_slice_kueue_replaced_stays_in_force_until_its_replacement_is_admitted() -> None:
    j = job()
    ns = j["metadata"]["namespace"]
    old = workload(j, 2, 0, admitted=2, conditions=(("Finished", "WorkloadSliceReplaced"),))
    new = workload(j, 3, 1, replaces=f"{ns}/{kueue.workload_name(j)}")
    queue = Queue(True, [old, new], FLAVOR, slices=True)
    assert kueue.current(queue) is old
    assert kueue.gate(j, queue)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    # A slice that was admitted once and lost its quota since leaves the old one behind.
    new["status"]["conditions"].append({"type": "Admitted", "status": "False", "reason": "x"})
    assert kueue.current(queue) is new
    assert kueue.gate(j, queue)["spec"]["runPolicy"]["suspend"] is True


def test_a_shrunk_elastic_job_gives_quota_back_once_the_workers_are_gone() -> None:
    j = job(replicas=2)
    now = workload(j, 4, 2, admitted=4)
    queue = Queue(True, [now], FLAVOR, slices=True)
    assert kueue.gate(j, queue)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert workload_writes(j, queue, worker_pods(3), NOW) == []
    (write,) = workload_writes(j, queue, worker_pods(2), NOW)
    assert verb(write) == "replace"
    assert obj(write)["metadata"]["resourceVersion"] == "7"
    shrunk = next(p for p in obj(write)["spec"]["podSets"] if p["name"] == "worker")
    assert shrunk["count"] == 2
    # The admission still says 4; the Workload's own count is what Kueue now counts.
    assert kueue.admitted_workers(obj(write)) == 2


def test_a_finished_job_finishes_its_workloads() -> None:
    j = job(replicas=2, low=None)
    j["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    queue = Queue(True, [workload(j, 2, admitted=2)], FLAVOR)
    (write,) = workload_writes(j, queue, (), NOW)
    finished = next(c for c in obj(write)["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    assert kueue.gate(j, queue) is j


def test_without_kueue_a_queue_labelled_job_is_held_with_a_condition_and_a_warning() -> None:
    j = job(replicas=2, low=None)
    queue = Queue(False)
    gated = kueue.gate(j, queue)
    assert gated["spec"]["runPolicy"]["suspend"] is True
    assert workload_writes(j, queue, (), NOW) == []
    # desired() sees the job through its admission itself.
    out = desired(Observed(job=j, queue=queue), Settings(), datetime(2026, 11, 26, tzinfo=UTC))
    cond = next(c for c in out.status["conditions"] if c["type"] == "QueueAdmitted")
    assert (cond["status"], cond["reason"]) == ("False", "KueueNotInstalled")
    assert ("Warning", "KueueNotInstalled") in [(e.type, e.reason) for e in out.events]
    assert out.new_pods == ()
    assert out.launcher is None


def test_standing_reports_the_admitted_size() -> None:
    j = job()
    standing = kueue.standing(j, Queue(True, [workload(j, 2, admitted=2)], slices=True))
    assert standing == Standing(True, "Admitted", standing.message)
    assert "with 2 workers" in standing.message


def test_a_refused_workload_write_does_not_hide_an_eviction() -> None:
    """The refused write may be the one that gives the quota back: the job stays stopped
    (found by the simulation's invariant (k): a job started again under that quota)."""
    j = job(replicas=2, low=None)
    evicted = workload(j, 2, admitted=2, conditions=(("Evicted", "Preempted"),))
    evicted["status"]["conditions"][0]["lastTransitionTime"] = NOW
    refused = Refusal("patch Workload w", "Forbidden", "no", kind=kueue.WORKLOAD)
    standing = kueue.standing(j, Queue(True, [evicted], FLAVOR), refused)
    assert (standing.reason, standing.evicted_at) == (
        "WorkloadRefused",
        datetime(2026, 11, 26, 0, 0, 1, tzinfo=UTC),
    )


def test_a_waiting_workload_follows_the_jobs_edits_an_admitted_one_does_not() -> None:
    j = job(replicas=3, low=None)
    waiting = workload(j, 3)
    assert workload_writes(j, Queue(True, [waiting], FLAVOR), (), NOW) == []
    edited = job(replicas=5, low=None)
    (write,) = workload_writes(edited, Queue(True, [waiting], FLAVOR), (), NOW)
    assert verb(write) == "replace"
    assert next(p["count"] for p in obj(write)["spec"]["podSets"] if p["name"] == "worker") == 5
    admitted = workload(j, 3, admitted=3)
    assert workload_writes(edited, Queue(True, [admitted], FLAVOR), (), NOW) == []


def test_nothing_raises_on_a_malformed_job() -> None:
    """An invalid spec is parse.py's to report; Kueue's part must not raise on it."""
    base = job(replicas=2, low=None)
    bad_values: tuple[Any, ...] = ([], "x", 3, None, {"spec": []})
    paths = (
        ("spec",),
        ("spec", "runPolicy"),
        ("spec", "mpiReplicaSpecs"),
        ("spec", "mpiReplicaSpecs", "Worker"),
        ("spec", "mpiReplicaSpecs", "Worker", "template"),
        ("spec", "mpiReplicaSpecs", "Worker", "replicas"),
        ("metadata", "labels"),
        ("metadata", "annotations"),
    )
    for path in paths:
        for value in bad_values:
            j = copy.deepcopy(base)
            node = j
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            for queue in (
                Queue(True, [workload(base, 2, admitted=2)], FLAVOR, slices=True),
                Queue(True, [], FLAVOR),
                Queue(False),
            ):
                kueue.gate(j, queue)
                kueue.standing(j, queue)
                workload_writes(j, queue, worker_pods(2), NOW)


def test_pods_ready_once_the_launcher_and_the_admitted_workers_run() -> None:
    j = job(replicas=2, low=None)
    queue = Queue(True, [workload(j, 2, admitted=2)], FLAVOR)
    assert workload_writes(j, queue, [launcher_pod(), *worker_pods(2)], NOW) == []
    running = [launcher_pod(), *worker_pods(2, "Running")]
    assert (
        workload_writes(j, queue, [launcher_pod("Pending"), *worker_pods(2, "Running")], NOW) == []
    )
    (write,) = workload_writes(j, queue, running, NOW)
    ready = next(c for c in obj(write)["status"]["conditions"] if c["type"] == "PodsReady")
    assert (ready["status"], ready["reason"]) == ("True", "Started")
    done = workload(j, 2, admitted=2, conditions=(("PodsReady", "Started"),))
    assert workload_writes(j, Queue(True, [done], FLAVOR), running, NOW) == []


class _Queued(Cluster):
    """A queue-labelled job against the simulated API server, its Workloads observed as
    the controller's Workload cache holds them."""

    def __init__(self) -> None:
        made = make_job(2)
        made["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q"}
        super().__init__(made)

    def plan(self, settings: Settings = SETTINGS) -> Writes:
        uid = self.job["metadata"]["uid"]
        workloads = [
            o
            for (kind, _), o in self.objects.items()
            if kind == kueue.WORKLOAD
            and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]
        observed = dataclasses.replace(self.observed(), queue=Queue(True, workloads))
        return plan_writes(observed, settings, self.now)


def test_a_refused_workload_write_is_reported_as_every_refused_write() -> None:
    """The Workload is written by the writer, in its step: the server's refusal reaches the
    job as WriteRefused and its Event, quoting the server; the queue condition says why
    the job waits. Once the write goes through, both clear."""
    c = _Queued()
    refusing = True
    message = 'workloads.kueue.x-k8s.io "x" is forbidden: exceeded quota'

    def gate(request: Request, apply: Callable[[], Obj]) -> Obj:
        if refusing and (request.verb, request.kind) == ("create", kueue.WORKLOAD):
            raise ApiError(403, "Forbidden", message)
        return apply()

    assert isinstance(c.writer.kube, FakeKube)
    c.writer.kube.gate = gate
    first = c.plan()
    steps = [phase.step for phase in first.phases]
    assert steps.index("Workload") < steps.index("status"), steps
    with pytest.raises(ApiError):
        c.apply(first)
    # The next turn is refused again, and reports it anyway (Writes.on_refusal).
    with pytest.raises(ApiError):
        c.apply(c.plan())
    refused = condition(c.job, "WriteRefused")
    assert (refused["status"], refused["reason"]) == ("True", "Forbidden")
    write = f"create Workload {kueue.workload_name(c.job)}"
    assert refused["message"] == f"{write}: {message}"
    assert condition(c.job, "QueueAdmitted")["reason"] == "WorkloadRefused"
    (event,) = [e for e in c.events if e.reason == "WriteRefused"]
    assert (event.type, event.message) == ("Warning", f"{write}: {message}")
    refusing = False
    c.apply(c.plan())
    assert c.get(kueue.WORKLOAD, kueue.workload_name(c.job)) is not None
    c.apply(c.plan())
    assert condition(c.job, "WriteRefused")["reason"] == "WritesAccepted"
    assert condition(c.job, "QueueAdmitted")["reason"] == "Pending"


def test_a_job_that_finishes_finishes_its_workload_in_the_same_turn_before_its_status() -> None:
    j = job(replicas=2, low=None)
    admitted = workload(j, 2, admitted=2)
    launcher = launcher_pod("Succeeded")
    launcher["metadata"].update(uid="l", namespace="ns", resourceVersion="3")
    launcher["spec"] = {"containers": [{"name": "main"}]}
    launcher["status"]["containerStatuses"] = [
        {"name": "main", "state": {"terminated": {"exitCode": 0}}}
    ]
    j["status"] = {"startTime": "2026-11-26T00:00:00Z"}
    observed = Observed(job=j, pods=[launcher], queue=Queue(True, [admitted], FLAVOR))
    p = plan_writes(observed, SETTINGS, datetime(2026, 11, 26, 0, 1, tzinfo=UTC))
    steps = [phase.step for phase in p.phases]
    assert steps.index("Workload") < steps.index("status"), steps
    (finish,) = next(phase for phase in p.phases if phase.step == "Workload").writes
    conditions = {c["type"]: c for c in obj(finish)["status"]["conditions"]}
    assert (conditions["Finished"]["status"], conditions["Finished"]["reason"]) == (
        "True",
        "Succeeded",
    )


def condition(job: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in job["status"]["conditions"] if c["type"] == type_)


def test_a_workload_name_someone_else_holds_is_reported_and_not_written_again() -> None:
    c = _Queued()
    name = kueue.workload_name(c.job)
    c.world.create(
        {"apiVersion": kueue.API_VERSION, "kind": kueue.WORKLOAD, "metadata": {"name": name}}
    )
    with pytest.raises(ApiError):
        c.apply(c.plan())
    p = c.plan()
    assert "Workload" not in [phase.step for phase in p.phases]
    c.apply(p)
    refused = condition(c.job, "WriteRefused")
    assert (refused["status"], refused["reason"]) == ("True", "AlreadyExists")
    assert refused["message"].startswith(f"Workload {name} already exists and is not this job's")


def gpus(j: dict[str, Any], n: int) -> dict[str, Any]:
    """``j`` with each worker asking for ``n`` GPUs (as a limit: the request it stands for)."""
    edited = copy.deepcopy(j)
    (container,) = edited["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    container["resources"] = {"limits": {"nvidia.com/gpu": str(n)}}
    return edited


def test_a_pod_is_charged_as_kueue_counts_it() -> None:
    template = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "500m"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
            "overhead": {"cpu": "100m"},
        }
    }
    charge = {k: str(v) for k, v in charges.pod_charge(template).items()}
    # cpu: max(1 + 0.5, 2) + 0.1; memory: the limit stands for the request, above the init's.
    assert charge == {"cpu": "2100m", "memory": "1Gi"}
    assert charges.pod_charge({"spec": {"containers": "x", "overhead": 7}}) == {}


def test_an_admitted_job_edited_to_ask_for_more_stops_and_is_queued_again() -> None:
    j = gpus(job(replicas=2, low=None), 1)
    admitted = workload(j, 2, admitted=2)
    edited = gpus(j, 8)
    queue = Queue(True, [admitted], FLAVOR)
    # Never more than Kueue admitted: held at once, and told why.
    assert kueue.gate(edited, queue)["spec"]["runPolicy"]["suspend"] is True
    standing = kueue.standing(edited, queue)
    assert (standing.admitted, standing.reason) == (False, "WorkloadOutdated")
    assert "worker: nvidia.com/gpu 8 > 1" in standing.message
    # The quota is held while any pod is there, then the Workload goes with it, and the
    # next one is written for the templates as they are now.
    assert workload_writes(edited, queue, worker_pods(2, "Running"), NOW) == []
    (write,) = workload_writes(edited, queue, (), NOW)
    assert isinstance(write, DeleteObject)
    assert write.name == admitted["metadata"]["name"]
    (write,) = workload_writes(edited, Queue(True, [], FLAVOR), (), NOW)
    worker = next(p for p in obj(write)["spec"]["podSets"] if p["name"] == "worker")
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8"
    }
    # Asking for less than was admitted is within it: the job runs on.
    fewer = gpus(j, 0)
    assert "suspend" not in kueue.gate(fewer, queue)["spec"].get("runPolicy", {})
    assert kueue.standing(fewer, queue).reason == "Admitted"


def test_a_waiting_workload_follows_an_edit_of_what_a_pod_requests() -> None:
    j = gpus(job(replicas=2, low=None), 1)
    waiting = workload(j, 2)
    assert workload_writes(j, Queue(True, [waiting], FLAVOR), (), NOW) == []
    (write,) = workload_writes(gpus(j, 4), Queue(True, [waiting], FLAVOR), (), NOW)
    assert verb(write) == "replace"
    worker = next(p for p in obj(write)["spec"]["podSets"] if p["name"] == "worker")
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "4"
    }


def test_a_workload_that_charges_less_than_the_pods_request_admits_nothing() -> None:
    # A Workload the controller did not write (a tenant allowed to create Workloads, owned
    # by its job) admitted for less than the job's pods ask: the job stays held.
    j = gpus(job(replicas=2, low=None), 4)
    forged = workload(gpus(j, 0), 2, admitted=2)
    assert kueue.gate(j, Queue(True, [forged], FLAVOR))["spec"]["runPolicy"]["suspend"] is True


def test_a_running_job_edited_beyond_its_admission_gets_its_notice_and_stops() -> None:
    c = _Queued()
    c.apply(c.plan())
    name = kueue.workload_name(c.job)
    admitted = workload(c.job, 2, admitted=2)
    stored = c.objects[(kueue.WORKLOAD, name)]
    stored["status"] = admitted["status"]
    c.converge()
    c.run_pods()
    c.converge()
    assert len([p for p in c.pods if p["metadata"]["name"].startswith("job-worker")]) == 2
    edited = gpus(c.job, 8)
    c.objects[(names.KIND, c.job["metadata"]["name"])]["spec"] = edited["spec"]
    c.apply(c.plan())
    assert condition(c.job, "QueueAdmitted")["reason"] == "WorkloadOutdated"
    notices = {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(names.ANN_NOTICE, "")
        for p in c.pods
    }
    assert notices
    assert all(" queue-requeued " in n for n in notices.values()), notices
    assert any(e.reason == "QueueWorkloadOutdated" for e in c.events)


def test_a_requeued_job_leaves_no_workload_behind_that_would_keep_a_new_one_from_it() -> None:
    j = gpus(job(), 1)
    replaced = workload(j, 2, 0, admitted=2, conditions=(("Finished", "WorkloadSliceReplaced"),))
    admitted = workload(j, 3, 1, admitted=3, replaces="ns/x")
    queue = Queue(True, [replaced, admitted], FLAVOR, slices=True)
    writes = workload_writes(gpus(j, 2), queue, (), NOW)
    assert sorted(w.name for w in writes if isinstance(w, DeleteObject)) == sorted(
        w["metadata"]["name"] for w in (replaced, admitted)
    )


def deleted(w: dict[str, Any]) -> dict[str, Any]:
    w["metadata"]["deletionTimestamp"] = NOW
    return w


def test_a_workload_carries_kueues_finalizer_as_its_own_integrations_write_it() -> None:
    w = kueue.render_workload(job(), Queue(True), 2)
    assert w["metadata"]["finalizers"] == [kueue.FINALIZER]


def test_a_deleted_workload_keeps_its_quota_until_the_jobs_last_pod_is_gone() -> None:
    j = job(2, low=None)
    held = deleted(workload(j, 2, admitted=2))
    running = [launcher_pod(), *worker_pods(2, "Running")]
    assert kueue_writes.released([held], running) == []
    # Terminating pods hold their devices too; ended ones hold nothing.
    ended = [launcher_pod("Succeeded"), *worker_pods(2, "Failed")]
    for pods in ([], ended):
        (write,) = kueue_writes.released([held], pods)
        assert write.obj["metadata"]["finalizers"] == []
        assert write.obj["metadata"]["resourceVersion"] == "7"
    # One that holds no quota goes at once; one not deleted, or without the finalizer,
    # is not touched.
    (write,) = kueue_writes.released([deleted(workload(j, 2))], running)
    assert write.obj["metadata"]["name"] == kueue.workload_name(j)
    assert kueue_writes.released([workload(j, 2, admitted=2)], []) == []
    foreign = deleted(workload(j, 2, admitted=2))
    foreign["metadata"]["finalizers"] = ["example.com/other"]
    assert kueue_writes.released([foreign], []) == []


def test_a_job_whose_workload_is_deleted_stops_and_is_queued_again_once_it_is_gone() -> None:
    j = job(2, low=None)
    queue = Queue(True, [deleted(workload(j, 2, admitted=2))], FLAVOR)
    # It counts for nothing: the job is held, told why, and no new Workload takes the name.
    assert kueue.gate(j, queue)["spec"]["runPolicy"]["suspend"] is True
    standing = kueue.standing(j, queue)
    assert (standing.admitted, standing.reason) == (False, "Pending")
    assert "is being deleted: it holds its quota" in standing.message
    assert workload_writes(j, queue, worker_pods(2, "Running"), NOW) == []
    (write,) = workload_writes(j, queue, [], NOW)
    assert verb(write) == "replace"
    assert obj(write)["metadata"]["finalizers"] == []
    (write,) = workload_writes(j, Queue(True, [], FLAVOR), [], NOW)
    assert verb(write) == "create"


def test_a_job_without_the_queue_label_is_kueues_only_with_manage_jobs_without_queue_name() -> None:
    plain = job(2, low=None)
    plain["metadata"]["labels"] = {}
    assert kueue.unlabelled_queue(SETTINGS) is None
    managing = dataclasses.replace(SETTINGS, kueue_manage_jobs_without_queue_name=True)
    default = kueue.unlabelled_queue(managing)
    assert default == kueue.DEFAULT_LOCAL_QUEUE
    assert kueue.queued(plain, Queue(True)) is None
    queue = Queue(True, unlabelled=default)
    assert kueue.queued(plain, queue) is queue
    (write,) = workload_writes(plain, queue, (), NOW)
    assert obj(write)["spec"]["queueName"] == "default"
    # The label still names the queue where there is one.
    assert kueue.render_workload(job(), queue, 2)["spec"]["queueName"] == "q"
    assert (
        "without --kueue-manage-jobs-without-queue-name"
        in kueue.standing(plain, Queue(installed=False, unlabelled=default)).message
    )


def test_a_workload_written_before_the_finalizer_gets_it_unless_replaced_in_the_same_turn() -> None:
    j = job(2, low=None)
    older = workload(j, 2, admitted=2)
    older["metadata"]["finalizers"] = []
    (write,) = workload_writes(j, Queue(True, [older], FLAVOR), worker_pods(2, "Running"), NOW)
    assert verb(write) == "replace"
    assert obj(write)["metadata"]["finalizers"] == [kueue.FINALIZER]
    # Waiting, not reserved: nothing to hold yet; its own write (following an edit) first.
    waiting = workload(j, 2)
    waiting["metadata"]["finalizers"] = []
    assert workload_writes(j, Queue(True, [waiting], FLAVOR), (), NOW) == []
    (write,) = workload_writes(job(3, low=None), Queue(True, [waiting], FLAVOR), (), NOW)
    assert obj(write)["spec"]["podSets"][1]["count"] == 3
    # Finished: it holds nothing.
    done = workload(j, 2, admitted=2, conditions=(("Finished", "Succeeded"),))
    done["metadata"]["finalizers"] = []
    assert workload_writes(j, Queue(True, [done], FLAVOR), (), NOW) == []


def test_an_opportunistic_job_asks_kueue_for_its_maximum_by_slices_only() -> None:
    j = job(2, low="1", high="6")
    j["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    sliced = Queue(True, [workload(j, 2, admitted=2)], FLAVOR, slices=True)
    assert kueue.wanted(j, sliced) == 6
    (write,) = workload_writes(j, sliced, worker_pods(2, "Running"), NOW)
    assert verb(write) == "create"
    assert kueue.render_workload(j, sliced, 3)["spec"]["podSets"][1]["count"] == 3
    assert obj(write)["spec"]["podSets"][1]["count"] == 3
    # It runs what was admitted, up to its maximum, above its own replicas.
    grown = Queue(True, [workload(j, 4, admitted=4)], FLAVOR, slices=True)
    assert kueue.gate(j, grown)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    # Without slices it asks for its replicas and runs no more than admitted.
    partial = Queue(True, [workload(j, 2, admitted=2)], FLAVOR)
    assert kueue.wanted(j, partial) == 2
    assert kueue.gate(j, partial)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2


def test_an_admitted_slice_finishes_the_slices_before_it_that_kueue_left_unfinished() -> None:
    # Kueue admitted slice 2 and failed to finish slice 1 (a conflict): it holds its quota
    # until the job's controller finishes it, as Kueue's jobframework would.
    j = job()
    old = workload(j, 3, 1, admitted=3, conditions=(("PodsReady", "Started"),))
    new = workload(
        j, 4, 2, admitted=4, conditions=(("PodsReady", "Started"),), replaces="ns/" + "x"
    )
    done = workload(j, 2, 0, admitted=2, conditions=(("Finished", "WorkloadSliceReplaced"),))
    queue = Queue(True, [done, old, new], FLAVOR, slices=True)
    pods = [launcher_pod(), *worker_pods(4, "Running")]
    writes = workload_writes(j, queue, pods, NOW)
    finished = [w for w in writes if isinstance(w, PatchStatus)]
    assert [obj(w)["metadata"]["name"] for w in finished] == [old["metadata"]["name"]]
    (cond,) = [c for c in obj(finished[0])["status"]["conditions"] if c["type"] == "Finished"]
    assert (cond["status"], cond["reason"]) == ("True", "WorkloadSliceReplaced")


def _admitted_with_workers_pending(settings: Settings) -> _Queued:
    """A queued job of 2 workers, admitted whole; its workers made, not running yet."""
    c = _Queued()
    c.apply(c.plan(settings))
    (made,) = c.world.workloads("job")
    c.world.admit(made["metadata"]["name"], made["metadata"]["uid"], 2)
    for _ in range(3):
        c.apply(c.plan(settings))
    return c


def test_under_kueue_the_launcher_is_made_with_its_workers_and_waits_in_its_pod() -> None:
    # Kueue's waitForPodsReady counts every pod from the admission: a launcher made only
    # once its workers run came 75 s (p50) after them in a wave of 1000 jobs.
    init = dataclasses.replace(SETTINGS, kubectl_delivery=KubectlDelivery.INIT_CONTAINER)
    c = _admitted_with_workers_pending(init)
    workers = [p for p in c.pods if p["metadata"]["name"].startswith("job-worker-")]
    assert len(workers) == 2
    assert all(p["status"]["phase"] == "Pending" for p in workers)
    launcher = c.get("Pod", "job-launcher")
    assert launcher is not None
    (delivery,) = launcher["spec"]["initContainers"]
    assert delivery["env"] == [{"name": "MIN_WORKERS", "value": "2"}]


def test_under_kueue_a_launcher_that_would_not_wait_still_waits_for_its_workers() -> None:
    # Without the init container nothing in the launcher's pod waits for the workers.
    none = dataclasses.replace(SETTINGS, kubectl_delivery=KubectlDelivery.NONE)
    c = _admitted_with_workers_pending(none)
    assert len([p for p in c.pods if p["metadata"]["name"].startswith("job-worker-")]) == 2
    assert c.get("Pod", "job-launcher") is None
    c.run_pods()
    c.apply(c.plan(none))
    assert c.get("Pod", "job-launcher") is not None
