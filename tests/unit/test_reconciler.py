"""The shell's own logic: phases run in the plan's order; memory is per job and confirmed."""

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest

from mpijob_elastic.app.predicates import job_signature, may_move_hosts, starts_pods
from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    DELETE_MEMORY_SECONDS,
    AnnotatePod,
    Create,
    Phase,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.machinery import writer as writer_module
from mpijob_elastic.machinery.job_memory import CONFLICT_RECHECK_SECONDS, JobMemory, refusal
from mpijob_elastic.machinery.kube import ApiError, Kube
from mpijob_elastic.machinery.writer import BULK_WRITES, Writer


def pod(name: str) -> Create:
    return Create({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name}})


class _Recording(Kube):
    """Answers every write after a few loop turns, recording when each started and ended,
    and refuses the writes named in ``refuse``."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.log: list[tuple[str, str]] = []
        self.refuse = refuse

    async def _answer(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.log.append(("start", name))
        for _ in range(3):
            await asyncio.sleep(0)
        self.log.append(("end", name))
        if name in self.refuse:
            raise ApiError(403, "Forbidden", f"{name} refused")
        return obj

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self._answer(
            obj["metadata"]["name"], {**obj, "metadata": {**obj["metadata"], "namespace": "ns"}}
        )

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        return await self._answer(
            name, {"kind": kind, "metadata": {"name": name, "namespace": namespace}}
        )


JOB = {"kind": "MPIJob", "metadata": {"name": "job", "namespace": "ns", "uid": "u"}}


def test_each_phase_starts_once_the_one_before_was_accepted() -> None:
    kube = _Recording()
    phases = (
        Phase("config hash", (AnnotatePod("launcher", {}, "1"),)),
        Phase("pod marks", (AnnotatePod("w0", {}, "1"), AnnotatePod("w1", {}, "1"))),
        Phase("creates", (pod("w2"), pod("w3"))),
    )
    asyncio.run(Writer(kube, lambda _: None).run(JOB, Writes(phases)))
    assert kube.log == [
        ("start", "launcher"),
        ("end", "launcher"),
        # The writes of one phase go out together.
        ("start", "w0"),
        ("start", "w1"),
        ("end", "w0"),
        ("end", "w1"),
        ("start", "w2"),
        ("start", "w3"),
        ("end", "w2"),
        ("end", "w3"),
    ]


class _SlowPatches(_Recording):
    """Each patch takes a second of ``clock``, the writer's time; records what it sent."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
        self.sent: dict[str, tuple[float, Mapping[str, Any]]] = {}

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        self.clock += 1
        self.sent[name] = (self.clock, patch)
        return await super().patch(kind, namespace, name, patch, subresource)


def test_a_drain_mark_is_stamped_as_it_is_sent() -> None:
    """A victim's drain counts from the host-list write that dropped it: the mark is
    stamped after the writes above it landed, however long they took."""
    kube = _SlowPatches()
    phases = (
        Phase("notices", (AnnotatePod("w1", {names.ANN_NOTICE: "leaving"}, "1"),)),
        Phase("config hash", (AnnotatePod("launcher", {names.ANN_CONFIG_HASH: "h"}, "1"),)),
        Phase("pod marks", (AnnotatePod("w1", {}, "", stamp=names.ANN_DRAINING_SINCE),)),
    )
    clock = mock.Mock(time=lambda: kube.clock, monotonic=lambda: 0.0)
    with mock.patch.object(writer_module, "time", clock):
        asyncio.run(Writer(kube, lambda _: None).run(JOB, Writes(phases)))
    sent_at, patch = kube.sent["w1"]
    mark = parse_time(patch["metadata"]["annotations"][names.ANN_DRAINING_SINCE])
    launcher_at, _ = kube.sent["launcher"]
    assert mark is not None
    assert mark.timestamp() == sent_at - 1 >= launcher_at


def test_the_writer_stops_at_the_first_phase_with_a_refused_write() -> None:
    kube = _Recording(refuse=("w1",))
    phases = (
        Phase("pod marks", (AnnotatePod("w0", {}, "1"), AnnotatePod("w1", {}, "1"))),
        Phase("creates", (pod("w2"),)),
        Phase("status", (WriteStatus({"phase": "x"}, "1"),)),
    )
    with pytest.raises(ApiError):
        asyncio.run(Writer(kube, lambda _: None).run(JOB, Writes(phases)))
    # The refusal is reported on the job (a condition and an Event), but no write of a
    # later phase is made.
    assert [name for what, name in kube.log if what == "start" and name[0] == "w"] == ["w0", "w1"]


def test_a_turn_that_puts_a_refusal_behind_it_looks_again_at_once() -> None:
    """Its plan still reported the refusal, and its own status write moves no job."""
    writer = Writer(_Recording(refuse=("w1",)), lambda _: None)
    refused = Writes((Phase("pod marks", (AnnotatePod("w1", {}, "1"),)),))
    with pytest.raises(ApiError):
        asyncio.run(writer.run(JOB, refused))
    memory = writer.of(("ns", "job"))
    assert memory.refused is not None
    assert memory.next_retry() is None, "a refusal waits for the backoff"
    asyncio.run(writer.run(JOB, Writes((Phase("status", (WriteStatus({"phase": "x"}, "1"),)),))))
    assert memory.refused is None
    assert memory.next_retry() == 0.0
    assert memory.next_retry() is None, "once"


def _pod(uid: str, terminating: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"uid": uid}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_an_accepted_delete_is_remembered_until_the_cache_shows_it() -> None:
    memory = JobMemory()
    memory.deletes["a"] = 100.0
    assert memory.deleting([_pod("a")], 101.0) == {"a"}
    # Terminating or gone in the cache: the cache speaks for itself now.
    assert memory.deleting([_pod("a", terminating=True)], 101.0) == frozenset()
    memory.deletes["b"] = 100.0
    assert memory.deleting([], 101.0) == frozenset()
    # A pod that never shows the delete is planned again after a while.
    memory.deletes["c"] = 100.0
    assert memory.deleting([_pod("c")], 100.0 + DELETE_MEMORY_SECONDS + 1) == frozenset()


def test_a_taken_name_is_looked_at_again_only_while_one_is_held() -> None:
    memory = JobMemory()
    assert memory.next_retry() is None
    memory.conflicts[("Pod", "job-worker-0")] = "no owner"
    # No expiry: the conflict lasts until a read finds the name free (Writer.recheck).
    assert memory.taken() == {("Pod", "job-worker-0"): "no owner"}
    assert memory.next_retry() == CONFLICT_RECHECK_SECONDS


def test_which_failures_need_the_user() -> None:
    assert refusal(ApiError(403, "Forbidden", "exceeded quota")) is not None
    assert refusal(ApiError(400, "BadRequest", "quantities")) is not None
    assert refusal(ApiError(413, "RequestEntityTooLarge", "too large")) is not None
    assert refusal(ApiError(409, "AlreadyExists", "taken")) is not None
    assert refusal(ApiError(409, "Conflict", "the object has been modified")) is None
    assert refusal(ApiError(429, "TooManyRequests", "slow down")) is None
    assert refusal(ApiError(503, "ServiceUnavailable", "")) is None
    assert refusal(TimeoutError()) is None


def test_a_status_write_does_not_trigger_a_reconcile_but_an_edit_does() -> None:
    job = {"metadata": {"uid": "u", "generation": 1, "annotations": {"a": "1"}}}
    with_status = {**job, "status": {"conditions": []}}
    assert job_signature(job) == job_signature(with_status)
    assert job_signature(job) != job_signature({"metadata": {**job["metadata"], "generation": 2}})
    edited = {"metadata": {**job["metadata"], "annotations": {"a": "2"}}}
    assert job_signature(job) != job_signature(edited)


class _Held(Kube):
    """Holds every write until ``release`` is set; records the names written."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.started.append(obj["metadata"]["name"])
        await self.release.wait()
        return {**obj, "metadata": {**obj["metadata"], "namespace": "ns"}}


def test_a_write_takes_the_lane_of_its_step_not_of_its_kind() -> None:
    """With every bulk slot taken by other jobs' turns, a host-list step still writes; a
    ConfigMap written by a bulk step would wait."""

    def job(i: int) -> dict[str, Any]:
        return {"kind": "MPIJob", "metadata": {"name": f"j{i}", "namespace": "ns", "uid": "u"}}

    def replace(kind: str, name: str) -> Replace:
        return Replace({"kind": kind, "metadata": {"name": name}})

    async def scenario() -> list[str]:
        kube = _Held()
        writer = Writer(kube, lambda _: None)
        per_turn = 16  # writer.TURN_CONCURRENCY
        busy = [
            writer.run(
                job(i),
                Writes(
                    (Phase("Role", tuple(replace("Role", f"r{i}-{n}") for n in range(per_turn))),)
                ),
            )
            for i in range(BULK_WRITES // per_turn)
        ]
        tasks = [asyncio.create_task(t) for t in busy]
        tasks.append(
            asyncio.create_task(
                writer.run(job(8), Writes((Phase("Role", (replace("ConfigMap", "bulk-cm"),)),)))
            )
        )
        tasks.append(
            asyncio.create_task(
                writer.run(job(9), Writes((Phase("ConfigMap", (replace("ConfigMap", "hosts"),)),)))
            )
        )
        for _ in range(10):
            await asyncio.sleep(0)
        started = list(kube.started)
        kube.release.set()
        await asyncio.gather(*tasks)
        return started

    started = asyncio.run(scenario())
    assert "hosts" in started
    assert "bulk-cm" not in started
    assert len(started) == BULK_WRITES + 1


def test_only_pod_changes_that_can_move_a_host_are_urgent() -> None:
    def worker(phase: str, **meta: str) -> dict[str, object]:
        return {"kind": "Pod", "metadata": {"name": "w", **meta}, "status": {"phase": phase}}

    assert may_move_hosts("MODIFIED", worker("Running"))
    assert may_move_hosts("MODIFIED", worker("Failed"))
    assert may_move_hosts("MODIFIED", worker("Pending", deletionTimestamp="t"))
    assert may_move_hosts("DELETED", worker("Pending"))
    assert not may_move_hosts("ADDED", worker("Pending"))
    assert not may_move_hosts("MODIFIED", {"kind": "ConfigMap", "metadata": {"name": "c"}})


def test_an_edit_that_asks_for_more_workers_than_there_are_pods_starts_pods() -> None:
    def job(replicas: object) -> dict[str, Any]:
        worker = {"replicas": replicas, "template": {}}
        return {"metadata": {"name": "j"}, "spec": {"mpiReplicaSpecs": {"Worker": worker}}}

    def pod(name: str, role: str, **meta: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {names.LABEL_ROLE: role}, **meta}}

    two = [
        pod("j-worker-0", names.ROLE_WORKER),
        pod("j-worker-1", names.ROLE_WORKER),
        pod("j-launcher", names.ROLE_LAUNCHER),
    ]
    assert starts_pods(job(3), two)
    assert not starts_pods(job(2), two)
    assert not starts_pods(job(1), two)
    # A worker going is not one the job has.
    going = pod("j-worker-0", names.ROLE_WORKER, deletionTimestamp="t")
    assert starts_pods(job(2), [*two[1:], going])
    # A count that is not one is the default's, never an exception.
    assert not starts_pods(job("three"), two)
