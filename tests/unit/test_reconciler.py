"""The shell's own logic: batching keeps the plan's order; issued deletes stay per job."""

import time
from unittest.mock import ANY

from kubernetes_asyncio.client import ApiClient

from mpijob_elastic.plan import Action, AnnotatePod, Create, DeletePod, Emit, Replace
from mpijob_elastic.reconciler import Controller, _batches
from mpijob_elastic.settings import Settings


def pod(name: str) -> Create:
    return Create({"kind": "Pod", "metadata": {"name": name}})


def test_runs_of_one_pod_write_kind_are_batched_in_order() -> None:
    role = Replace({"kind": "Role", "metadata": {"name": "r"}})
    cm = Create({"kind": "ConfigMap", "metadata": {"name": "c"}})
    actions: list[Action] = [
        role,
        cm,
        AnnotatePod("l", {}),
        DeletePod("a", "1"),
        DeletePod("b", "2"),
        pod("w0"),
        pod("w1"),
        pod("w2"),
        Emit("Normal", "ScaledUp", "x"),
    ]
    batches = _batches(actions)
    assert batches == [
        [role],
        [cm],
        [AnnotatePod("l", {})],
        [DeletePod("a", "1"), DeletePod("b", "2")],
        [pod("w0"), pod("w1"), pod("w2")],
        [Emit("Normal", "ScaledUp", "x")],
    ]
    assert [a for b in batches for a in b] == actions


def test_non_pod_creates_are_never_batched() -> None:
    sa = Create({"kind": "ServiceAccount", "metadata": {"name": "s"}})
    role = Create({"kind": "Role", "metadata": {"name": "r"}})
    assert _batches([sa, role]) == [[sa], [role]]


async def test_one_jobs_reconcile_keeps_another_jobs_issued_deletes() -> None:
    api = ApiClient()
    controller = Controller(api, Settings())
    controller.deleting[("ns", "b")] = {"uid-of-b-worker": time.monotonic()}
    job_a = {"metadata": {"namespace": "ns", "name": "a", "uid": "a-uid"}}
    assert controller.observe(job_a).deleting == frozenset()
    assert controller.deleting[("ns", "b")] == {"uid-of-b-worker": ANY}
    await api.close()
