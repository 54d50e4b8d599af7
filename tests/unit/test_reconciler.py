"""The shell's own logic: batching keeps the plan's order; memory is per job and confirmed."""

from mpijob_elastic.app.reconciler import _job_signature, _may_move_hosts
from mpijob_elastic.core.actions import (
    DELETE_MEMORY_SECONDS,
    Action,
    AnnotatePod,
    Create,
    DeletePod,
    Emit,
    Replace,
)
from mpijob_elastic.machinery.kube import ApiError
from mpijob_elastic.machinery.writer import (
    CONFLICT_RECHECK_SECONDS,
    JobMemory,
    batches,
    host_list_write,
    refusal,
)


def pod(name: str) -> Create:
    return Create({"kind": "Pod", "metadata": {"name": name}})


def test_runs_of_one_pod_write_kind_are_batched_in_order() -> None:
    role = Replace({"kind": "Role", "metadata": {"name": "r"}})
    cm = Create({"kind": "ConfigMap", "metadata": {"name": "c"}})
    actions: list[Action] = [
        role,
        cm,
        AnnotatePod("l", {}, "1"),
        DeletePod("a", "1"),
        DeletePod("b", "2"),
        pod("w0"),
        pod("w1"),
        pod("w2"),
        Emit("Normal", "ScaledUp", "x"),
    ]
    out = batches(actions)
    assert out == [
        [role],
        [cm],
        [AnnotatePod("l", {}, "1")],
        [DeletePod("a", "1"), DeletePod("b", "2")],
        [pod("w0"), pod("w1"), pod("w2")],
        [Emit("Normal", "ScaledUp", "x")],
    ]
    assert [a for b in out for a in b] == actions


def test_non_pod_creates_are_never_batched() -> None:
    sa = Create({"kind": "ServiceAccount", "metadata": {"name": "s"}})
    role = Create({"kind": "Role", "metadata": {"name": "r"}})
    assert batches([sa, role]) == [[sa], [role]]


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
    assert _job_signature(job) == _job_signature(with_status)
    assert _job_signature(job) != _job_signature({"metadata": {**job["metadata"], "generation": 2}})
    edited = {"metadata": {**job["metadata"], "annotations": {"a": "2"}}}
    assert _job_signature(job) != _job_signature(edited)


def test_host_lists_and_drain_marks_take_the_host_list_lane() -> None:
    assert host_list_write(Create({"kind": "ConfigMap", "metadata": {"name": "c"}}))
    assert host_list_write(Replace({"kind": "ConfigMap", "metadata": {"name": "c"}}))
    assert host_list_write(AnnotatePod("w0", {"mpijob-elastic.io/draining-since": "t"}, "1"))
    assert not host_list_write(pod("w0"))
    assert not host_list_write(DeletePod("w0", "1"))
    assert not host_list_write(Replace({"kind": "Role", "metadata": {"name": "r"}}))


def test_only_pod_changes_that_can_move_a_host_are_urgent() -> None:
    def worker(phase: str, **meta: str) -> dict[str, object]:
        return {"kind": "Pod", "metadata": {"name": "w", **meta}, "status": {"phase": phase}}

    assert _may_move_hosts("MODIFIED", worker("Running"))
    assert _may_move_hosts("MODIFIED", worker("Failed"))
    assert _may_move_hosts("MODIFIED", worker("Pending", deletionTimestamp="t"))
    assert _may_move_hosts("DELETED", worker("Pending"))
    assert not _may_move_hosts("ADDED", worker("Pending"))
    assert not _may_move_hosts("MODIFIED", {"kind": "ConfigMap", "metadata": {"name": "c"}})
