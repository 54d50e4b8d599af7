"""A turn that raises before its writes (issue 31): the job reports it, once, and the stops
it asks for still happen (core/planning/fallback.py), decided as the normal turn decides
them."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import Configuration

from mpijob_elastic.app import controller as controller_module
from mpijob_elastic.app.controller import Controller
from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    AnnotatePod,
    Create,
    DeletePod,
    Emit,
    Failure,
    PatchStatus,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.outputs.status import TURN_FAILED
from mpijob_elastic.core.planning.fallback import stop_only
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.reports.conditions import FAILURE_TEXT_LIMIT
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.kube import Kube
from mpijob_elastic.machinery.kubeclient import ApiClient
from tests.unit.simulation import SETTINGS, Cluster, make_job, merge_patch
from tests.unit.test_kueue import FLAVOR, NOW, job, workload

BUG = Failure("KeyError", "'containers'")


def running(**spec: Any) -> Cluster:
    """A job whose launcher and workers run, a few seconds after its start (``converge``
    would wait out its deadline)."""
    c = Cluster(make_job(2, **spec))
    for _ in range(6):
        c.run_pods()
        c.apply(c.plan())
        c.tick(1)
    assert len(c.pods) == 3
    return c


def fallback(c: Cluster, failure: Failure = BUG) -> Writes:
    """The stop-only turn from the least the shell has: the job and its pods."""
    return stop_only(Observed(c.job, list(c.pods)), SETTINGS, c.now, failure)


def status_of(writes: Writes) -> dict[str, Any]:
    (write,) = writes.of_type(WriteStatus)
    return dict(write.status)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def warnings(writes: Writes) -> list[Emit]:
    return [e for e in writes.of_type(Emit) if e.reason == TURN_FAILED]


def deleted(writes: Writes) -> set[str]:
    return {d.name for d in writes.of_type(DeletePod)}


def noticed(writes: Writes) -> set[str]:
    return {p.name for p in writes.of_type(AnnotatePod) if p.annotations.get(names.ANN_NOTICE)}


def test_a_running_job_reports_the_failure_once_and_is_left_running() -> None:
    c = running()
    writes = fallback(c)
    cond = condition(status_of(writes), TURN_FAILED)
    assert (cond["status"], cond["reason"]) == ("True", "KeyError")
    assert "raised KeyError: 'containers'" in cond["message"]
    (event,) = warnings(writes)
    assert (event.type, event.message) == ("Warning", cond["message"])
    # Nothing but the report: no pod made or deleted, no host list written.
    assert not writes.of_type(DeletePod)
    assert not writes.of_type(Create)
    assert not writes.of_type(Replace)
    c.apply(writes)
    # Retried with backoff, the same failure: no second Event, no status write.
    again = fallback(c)
    assert not warnings(again)
    assert not again.of_type(WriteStatus)
    # Another failure is another report.
    assert warnings(fallback(c, Failure("TypeError", "unhashable type: 'dict'")))


def test_the_next_turn_that_completes_turns_the_condition_false() -> None:
    c = running()
    c.apply(fallback(c))
    c.apply(c.plan())
    cond = condition(c.job["status"], TURN_FAILED)
    assert (cond["status"], cond["reason"]) == ("False", "TurnCompleted")


def test_a_long_exception_text_is_cut() -> None:
    c = running()
    cond = condition(status_of(fallback(c, Failure("ValueError", "x" * 100_000))), TURN_FAILED)
    assert len(cond["message"]) < FAILURE_TEXT_LIMIT + 400
    assert "(100000 characters)" in cond["message"]


def test_a_suspended_job_loses_its_pods_as_the_normal_turn_would_delete_them() -> None:
    c = running()
    c.job["spec"]["runPolicy"] = {"suspend": True}
    normal = c.plan()
    writes = fallback(c)
    assert deleted(writes) == deleted(normal) == {"job-launcher", "job-worker-0", "job-worker-1"}
    status = status_of(writes)
    assert condition(status, "Suspended")["status"] == "True"
    assert condition(status, "Running")["status"] == "False"
    assert condition(status, TURN_FAILED)["status"] == "True"
    # The pods are told why before they go, as in the normal turn.
    assert noticed(writes) == noticed(normal) == deleted(normal)


def test_a_job_past_its_deadline_fails_and_its_clean_pod_policy_applies() -> None:
    c = running(runPolicy={"activeDeadlineSeconds": 3600, "cleanPodPolicy": "All"})
    c.tick(3600)
    normal = c.plan()
    writes = fallback(c)
    assert deleted(writes) == deleted(normal) == {"job-launcher", "job-worker-0", "job-worker-1"}
    assert condition(status_of(writes), "Failed")["reason"] == "MPIJobFailed"


def test_a_job_before_its_deadline_comes_back_at_it() -> None:
    c = running(runPolicy={"activeDeadlineSeconds": 3600})
    writes = fallback(c)
    assert not deleted(writes)
    assert writes.requeue_after is not None
    assert writes.requeue_after <= 3600


def _pod(name: str, role: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"{name}-uid",
            "resourceVersion": "3",
            "labels": {names.LABEL_ROLE: role},
        },
        "status": {"phase": phase},
    }


def test_a_kueue_eviction_stops_the_job_and_then_gives_the_quota_back() -> None:
    j = job(replicas=2, low=None)
    j["status"] = {"startTime": NOW}
    evicted = workload(j, 2, admitted=2, conditions=(("Evicted", "Preempted"),))
    evicted["status"]["conditions"][0]["lastTransitionTime"] = NOW
    queue = Queue(True, [evicted], FLAVOR)
    pods = [_pod("job-launcher", names.ROLE_LAUNCHER), _pod("job-worker-0", "worker")]
    start = datetime(2026, 11, 26, tzinfo=UTC)
    # Within the checkpoint window the job runs on, its pods told; it comes back at its end.
    early = stop_only(Observed(j, pods, queue=queue), SETTINGS, start, BUG)
    assert not deleted(early)
    assert noticed(early) == {"job-launcher", "job-worker-0"}
    assert early.requeue_after is not None
    assert early.requeue_after <= 61
    late = start + timedelta(minutes=5)
    writes = stop_only(Observed(j, pods, queue=queue), SETTINGS, late, BUG)
    assert deleted(writes) == {"job-launcher", "job-worker-0"}
    assert condition(status_of(writes), "Suspended")["status"] == "True"
    # Its pods gone, the Workload's admission is cleared: the quota goes back.
    (release,) = stop_only(Observed(j, [], queue=queue), SETTINGS, late, BUG).of_type(PatchStatus)
    assert release.obj["status"]["admission"] is None


def test_a_job_being_deleted_is_left_to_the_garbage_collector() -> None:
    c = running()
    c.job["spec"]["runPolicy"] = {"suspend": True}
    c.job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not deleted(fallback(c))


JUNK = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats()
VALUES = st.recursive(
    JUNK,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(spec=VALUES, policy=VALUES, annotations=st.dictionaries(st.text(max_size=40), VALUES))
def test_the_stop_only_turn_reads_any_spec(spec: Any, policy: Any, annotations: Any) -> None:
    """Itself total: whatever the tenant wrote where a stop reads, it plans."""
    j = make_job(2)
    j["metadata"]["annotations"] = {**annotations, names.ANN_CHECKPOINT_SECONDS: str(spec)[:8]}
    j["spec"] = spec if not isinstance(spec, dict) else {**spec, "runPolicy": policy}
    stop_only(Observed(j), SETTINGS, datetime(2026, 11, 26, tzinfo=UTC), BUG)


class _Server(Kube):
    """Takes every write: a status patch merges into the job, a delete answers a Status."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.sent: list[tuple[str, str, str]] = []
        self.events: list[dict[str, Any]] = []

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.events.append(dict(obj))
        return dict(obj)

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        self.sent.append(("patch", kind, name))
        if kind == names.KIND and subresource == "status":
            version = str(int(self.job["metadata"]["resourceVersion"]) + 1)
            self.job = {
                **self.job,
                "metadata": {**self.job["metadata"], "resourceVersion": version},
                "status": merge_patch(self.job.get("status"), patch["status"]),
            }
            return self.job
        return {"kind": kind, "metadata": {"name": name, "namespace": namespace}}

    async def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        uid: str,
        grace_seconds: int | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        self.sent.append(("delete", kind, name))
        return {"kind": "Status", "status": "Success"}


def test_a_turn_that_raises_reports_on_the_job_and_still_stops_it() -> None:
    """The shell: a turn whose planning raises (a bug, played by a patched core) still
    writes the job's report and carries out its suspension, counts it, and raises on so
    the job is retried with backoff; the retry sends no second Event."""
    c = running()
    c.job["spec"]["runPolicy"] = {"suspend": True}
    server = _Server(copy.deepcopy(c.job))

    async def turns() -> list[BaseException]:
        api = ApiClient(Configuration(host="http://127.0.0.1:1"))
        try:
            ctl = Controller(api, Settings(namespaces=("ns",)), watch_api=api)
            ctl.writer.kube = ctl.writer.events.kube = server
            jobs, pods = ctl.caches.pick(names.KIND, "ns"), ctl.caches.pick("Pod", "ns")
            assert jobs is not None
            assert pods is not None
            jobs.upsert(copy.deepcopy(c.job))
            for pod in c.pods:
                pods.upsert(copy.deepcopy(pod))
            raised: list[BaseException] = []
            bug = KeyError("containers")
            with mock.patch.object(controller_module, "plan_writes", side_effect=bug):
                for _ in range(2):
                    try:
                        await ctl.reconcile(("ns", "job"))
                    except KeyError as err:
                        raised.append(err)
                    await ctl.writer.events.close()
            return raised
        finally:
            await api.close()

    before = _value(metrics.FAILED_TURNS)
    # The controller hands the scrape its caches: the other tests' scrapes keep theirs.
    with (
        mock.patch.object(metrics.JOBS, "jobs", metrics.JOBS.jobs),
        mock.patch.object(metrics.JOB_DETAILS, "config_map", metrics.JOB_DETAILS.config_map),
        mock.patch.object(metrics.JOB_DETAILS, "settings", metrics.JOB_DETAILS.settings),
    ):
        raised = asyncio.run(turns())
    assert len(raised) == 2
    assert _value(metrics.FAILED_TURNS) == before + 2
    assert {name for verb, kind, name in server.sent if verb == "delete"} == {
        "job-launcher",
        "job-worker-0",
        "job-worker-1",
    }
    cond = condition(server.job["status"], TURN_FAILED)
    assert (cond["status"], cond["reason"]) == ("True", "KeyError")
    assert [e["type"] for e in server.events if e["reason"] == TURN_FAILED] == ["Warning"]
    assert condition(server.job["status"], "Suspended")["status"] == "True"


def _value(counter: Any) -> float:
    (family,) = counter.collect()
    return float(next(s.value for s in family.samples if s.name.endswith("_total")))
