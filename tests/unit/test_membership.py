"""Membership (issue 12): retired names, victim choice, named scale-in, drains that end
when the ranks have left. Pure functions and the planner through the in-memory cluster."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import AnnotatePod, Create, DeletePod
from mpijob_elastic.core.hosts.drain import (
    CONFIRM_INTERVAL_SECONDS,
    DRAIN_FLOOR_SECONDS,
    RANK_FREE_GRACE_SECONDS,
)
from mpijob_elastic.core.hosts.membership import (
    DISRUPTED,
    NAMED,
    NEWEST,
    NOT_LISTED,
    Facts,
    choose_members,
    format_indexes,
    parse_indexes,
)
from mpijob_elastic.core.inputs.ranks import (
    RankSnapshot,
    pushed,
    remote_shell_hosts,
)
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.workers import Worker
from tests.unit.simulation import Cluster, discovered, make_job, running_status

ELASTIC = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "8"}


def pod(index: int, *, phase: str = "Running", created: int = 0, **meta: Any) -> Worker:
    body: dict[str, Any] = {
        "metadata": {
            "name": f"job-worker-{index}",
            "uid": f"u{index}",
            "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z",
            **meta,
        },
        "spec": {"containers": [{"name": "main"}]},
    }
    body["status"] = running_status(body) if phase == "Running" else {"phase": phase}
    return Worker(index, body)


def members(workers: list[Worker], target: int, main: str | None = None, **kw: Any) -> Any:
    return choose_members("job", workers, target, main, Facts(**kw))


# -- pure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("indexes", "text"), [({1, 4, 5, 6}, "1,4-6"), (set(), ""), ({0}, "0"), ({2, 3}, "2-3")]
)
def test_retired_indexes_round_trip_compactly(indexes: set[int], text: str) -> None:
    assert format_indexes(indexes) == text
    assert parse_indexes(text) == indexes


def test_an_edited_retired_annotation_keeps_what_it_can_read() -> None:
    assert parse_indexes("3, x, 7-5, 9-10, 0-999999999") == {3, 9, 10}
    assert parse_indexes(None) == frozenset()


def test_a_worker_whose_ranks_died_while_listed_is_retired_and_replaced_by_a_fresh_name() -> None:
    listed = {"job-worker-0", "job-worker-1", "job-worker-2"}
    crashed = pod(1, phase="Failed")
    m = members([pod(0), crashed, pod(2)], 3, listed=listed, retired={4})
    assert m.newly_retired == {1}
    assert m.retired == {1, 4}
    assert [w.name for w in m.replace] == ["job-worker-1"]
    # Not 1 (retired now, and its pod still holds it), not 4 (retired before).
    assert m.new_indexes == (3,)


def test_a_worker_gone_while_listed_is_retired_one_never_listed_is_not() -> None:
    m = members([pod(0)], 3, listed={"job-worker-0", "job-worker-1"})
    assert m.newly_retired == {1}
    assert m.new_indexes == (2, 3)
    # A worker that left through the drain was unlisted first: its name is reused.
    m = members([pod(0)], 2, listed={"job-worker-0"})
    assert m.newly_retired == frozenset()
    assert m.new_indexes == (1,)


def test_a_scale_in_victim_whose_rank_failed_is_not_taken_back_by_a_scale_out() -> None:
    # 3 -> 2 unlisted worker 2; its rank ended non-zero; then 3 again (rule 8, kind).
    listed = {"job-worker-0", "job-worker-1"}
    m = members([pod(0), pod(1), pod(2)], 3, listed=listed, lost={"job-worker-2"})
    assert [w.name for w in m.keep] == ["job-worker-0", "job-worker-1"]
    assert [w.name for w in m.replace] == ["job-worker-2"]
    assert m.newly_retired == {2}
    assert m.new_indexes == (3,)
    # Its rank gone without a failure, it is taken back under its name.
    m = members([pod(0), pod(1), pod(2)], 3, listed=listed)
    assert [w.name for w in m.keep] == ["job-worker-0", "job-worker-1", "job-worker-2"]
    assert m.newly_retired == frozenset()


def test_a_listed_worker_that_is_only_not_ready_is_not_retired() -> None:
    w = pod(1)
    w.pod["status"]["containerStatuses"][0]["ready"] = False
    m = members([pod(0), w], 2, listed={"job-worker-0", "job-worker-1"})
    assert m.newly_retired == frozenset()
    assert not m.replace


def test_victims_not_in_discovery_go_before_the_newest() -> None:
    workers = [pod(0, created=1), pod(1, phase="Pending", created=2), pod(2, created=3)]
    listed = {"job-worker-0", "job-worker-2"}
    m = members(workers, 2, listed=listed)
    assert [(v.worker.name, v.why) for v in m.leaving] == [("job-worker-1", NOT_LISTED)]
    m = members(workers, 1, listed=listed)
    assert [(v.worker.name, v.why) for v in m.leaving] == [
        ("job-worker-1", NOT_LISTED),
        ("job-worker-2", NEWEST),
    ]


def test_the_newest_is_by_creation_not_by_index() -> None:
    workers = [pod(0, created=1), pod(1, created=9), pod(5, created=4)]
    listed = {w.name for w in workers}
    m = members(workers, 2, listed=listed)
    assert [v.worker.name for v in m.leaving] == ["job-worker-1"]


def test_named_workers_leave_first_and_are_replaced_if_the_count_stays() -> None:
    workers = [pod(0), pod(1), pod(2)]
    listed = {w.name for w in workers}
    m = members(workers, 2, listed=listed, named={"job-worker-0"})
    assert [(v.worker.name, v.why) for v in m.leaving] == [("job-worker-0", NAMED)]
    assert not m.new_indexes
    m = members(workers, 3, listed=listed, named={"job-worker-1"})
    assert [v.worker.name for v in m.leaving] == ["job-worker-1"]
    # A replacement, never under a name still listed for removal.
    assert m.new_indexes == (3,)


def test_remote_shell_hosts_reads_every_form_horovod_and_mpirun_use() -> None:
    output = (
        b"/bin/sh\0-c\0/etc/mpi/kubexec.sh job-worker-1 'cd /x && python train.py'\0"
        b"/bin/sh\0/etc/mpi/kubexec.sh\0job-worker-2\0orted\0-mca\0"
        b"/opt/kube/kubectl\0exec\0job-worker-2\0--\0/bin/sh\0-c\0orted\0"
        b"python\0-m\0horovod.runner.launch\0-np\0" + b"x" * 10
    )
    assert remote_shell_hosts(output, "job") == frozenset({"job-worker-1", "job-worker-2"})
    # No remote shell of ours at all: the launcher uses ssh, or runs nothing: unknown.
    assert remote_shell_hosts(b"python\0train.py\0sleep\0", "job") is None
    assert remote_shell_hosts(b"", "job") is None
    # Another job's shells (KWOK runs every exec on one machine) say nothing of this one.
    assert remote_shell_hosts(output, "other") is None
    # Nor do those of a job whose name starts with this one's: "job" is not "job-worker"'s
    # job "job-worker" (nor "elastic" the e2e suite's "elastic-horovod").
    longer = b"/bin/sh\0/etc/mpi/kubexec.sh\0job-worker-worker-0\0orted\0"
    longer += b"/bin/sh\0/etc/mpi/kubexec.sh\0job-x-worker-1\0orted\0"
    assert remote_shell_hosts(longer, "job") is None
    assert remote_shell_hosts(longer, "job-worker") == frozenset({"job-worker-worker-0"})


def test_the_start_up_interface_probe_is_no_rank() -> None:
    probe = (
        b"/bin/sh\0-c\0/etc/mpi/kubexec.sh job-worker-1 "
        b"/usr/bin/python -m horovod.runner.task_fn 0 2 abc def\0"
        b"/bin/sh\0/etc/mpi/kubexec.sh\0job-worker-2\0python -m horovod.runner.task_fn 1 2\0"
    )
    # Our remote shell runs, but reaches no rank: its end is no loss.
    assert remote_shell_hosts(probe, "job") == frozenset()
    rank = b"/bin/sh\0-c\0/etc/mpi/kubexec.sh job-worker-3 'cd /x ; python train.py'\0"
    assert remote_shell_hosts(probe + rank, "job") == frozenset({"job-worker-3"})


def test_remove_workers_must_name_workers_of_the_job() -> None:
    job = make_job(2, annotations={names.ANN_REMOVE_WORKERS: "job-worker-1, job-worker-3,"})
    assert parse(job, 30).remove == {"job-worker-1", "job-worker-3"}
    job["metadata"]["annotations"][names.ANN_REMOVE_WORKERS] = "job-worker-1,other-worker-2"
    with pytest.raises(InvalidSpec, match=r"remove-workers\]: must list worker pod names"):
        parse(job, 30)


# -- through the planner ------------------------------------------------------------------


def started(replicas: int, **annotations: str) -> Cluster:
    c = Cluster(make_job(replicas, annotations={**ELASTIC, **annotations}))
    c.converge()
    return c


def test_a_drain_ends_once_the_launcher_no_longer_reaches_the_victim() -> None:
    c = started(3)
    c.set_replicas(1)
    c.apply(c.plan())  # unlisted and marked
    marked_at = c.now
    c.tick(DRAIN_FLOOR_SECONDS - 1)
    # An answer from before the floor proves nothing: Horovod may not have looked yet.
    c.ranks = RankSnapshot(c.now, frozenset({"job-worker-0"}))
    assert not c.plan().of_type(DeletePod)
    c.tick(1)
    p = c.plan()
    assert p.probe is not None
    assert not p.of_type(DeletePod)
    c.ranks = RankSnapshot(c.now, frozenset({"job-worker-0", "job-worker-2"}))
    p = c.plan()
    deletes = p.of_type(DeletePod)
    assert [(d.name, d.grace_seconds) for d in deletes] == [
        ("job-worker-1", RANK_FREE_GRACE_SECONDS)
    ]
    c.apply(p)
    # worker-2 still runs a rank: it waits, at most for the drain.
    c.tick(30 - DRAIN_FLOOR_SECONDS)
    assert c.now - marked_at == timedelta(seconds=30)
    p = c.plan()
    assert [(d.name, d.grace_seconds) for d in p.of_type(DeletePod)] == [("job-worker-2", None)]
    c.apply(p)
    # Deleted under a running rank: Horovod counts a failure, so the name is retired.
    state = dict(c.get("ConfigMap", "job-config")["metadata"]["annotations"])  # type: ignore[index]
    state.pop(names.ANN_HOSTS_ADDED)  # when the workers were first listed
    assert state == {names.ANN_RETIRED_WORKERS: "2", names.ANN_WORKERS: "1"}


def test_a_drain_on_the_launchers_reports_reads_the_launcher_only_now_and_then() -> None:
    c = started(4)
    c.set_replicas(1)
    c.apply(c.plan())  # worker-1, 2 and 3 unlisted and marked
    c.tick(DRAIN_FLOOR_SECONDS)
    # worker-1's rank has ended, worker-2's runs, worker-3 was never reported.
    c.reports = pushed(
        {
            "job-worker-0_1_5": "start",
            "job-worker-1_2_5": "start",
            "job-worker-1_2_5_exit": "134",
            "job-worker-2_3_5": "start",
        },
        c.now,
    )
    p = c.plan()
    assert [(d.name, d.grace_seconds) for d in p.of_type(DeletePod)] == [
        ("job-worker-1", RANK_FREE_GRACE_SECONDS)
    ]
    # Only worker-3, which no report names, needs the exec read.
    assert p.probe is not None
    c.apply(p)
    c.ranks = RankSnapshot(c.now, frozenset({"job-worker-0", "job-worker-2"}))
    p = c.plan()
    assert [d.name for d in p.of_type(DeletePod)] == ["job-worker-3"]
    c.apply(p)
    # worker-2 waits for its report; a read checks it only now and then.
    c.tick(1)
    p = c.plan()
    assert p.probe is None
    assert not p.of_type(DeletePod)
    c.tick(CONFIRM_INTERVAL_SECONDS - 1)
    assert c.plan().probe is not None


def test_a_lost_exit_report_ends_the_drain_at_the_next_read_and_retires_nobody() -> None:
    c = started(2)
    c.set_replicas(1)
    c.apply(c.plan())  # worker-1 unlisted and marked
    c.tick(DRAIN_FLOOR_SECONDS)
    # worker-1's rank has left, but the report of its shell's exit never came.
    c.reports = pushed({"job-worker-0_1_5": "start", "job-worker-1_2_5": "start"}, c.now)
    p = c.plan()
    assert not p.of_type(DeletePod)
    assert p.probe is not None
    c.apply(p)
    c.ranks = RankSnapshot(c.now, frozenset({"job-worker-0"}))
    p = c.plan()
    assert [(d.name, d.grace_seconds) for d in p.of_type(DeletePod)] == [
        ("job-worker-1", RANK_FREE_GRACE_SECONDS)
    ]
    c.apply(p)
    c.converge()
    state = c.get("ConfigMap", "job-config")["metadata"]["annotations"]  # type: ignore[index]
    assert names.ANN_RETIRED_WORKERS not in state


def worker_1_replaced(c: Cluster) -> None:
    """After the turn that read worker-1's rank lost: it was retired, and once the loss is
    acted on the job converges with a fresh name in its place."""
    assert "WorkerRetired" in [e.reason for e in c.events]
    c.reports = None
    c.converge()
    assert discovered(c.get("ConfigMap", "job-config")) == [
        "job-worker-0",
        "job-worker-2",
        "job-worker-3",
    ]


def test_a_worker_whose_reported_rank_died_is_retired_and_replaced() -> None:
    c = started(3)
    t = int(c.now.timestamp())  # the shells started once the pods ran
    before = {f"job-worker-{i}_{i + 1}_{t}": "start" for i in range(3)}
    first = pushed(before, c.now)
    c.reports = pushed({**before, f"job-worker-1_2_{t}_exit": "1"}, c.now, first)
    assert c.reports.lost == frozenset({"job-worker-1"})
    c.apply(c.plan())
    assert discovered(c.get("ConfigMap", "job-config")) == ["job-worker-0", "job-worker-2"]
    worker_1_replaced(c)


def test_a_failed_shell_of_a_former_pod_of_the_name_loses_no_rank() -> None:
    """Names are reused: the drained pod's rank failed (137), the new pod of that name ran
    a rank that has left gracefully (a scale-in, exit 0). Only the shells the previous
    snapshot saw running judge the host."""
    c = started(2)
    before = {
        "job-worker-0_1_5": "start",
        "job-worker-1_2_5": "start",
        "job-worker-1_2_5_exit": "137",
        "job-worker-1_3_9": "start",
    }
    first = pushed(before, c.now)
    assert first.lost == frozenset()
    later = pushed({**before, "job-worker-1_3_9_exit": "0"}, c.now, first)
    assert later.lost == frozenset()
    # The new pod's own rank failing is a loss.
    failed = pushed({**before, "job-worker-1_3_9_exit": "1"}, c.now, first)
    assert failed.lost == frozenset({"job-worker-1"})


def test_a_rank_that_fails_while_another_shell_into_its_host_runs_is_lost() -> None:
    """Seen on kind: the mock driver asks a rank for its commit marker through a second
    remote shell into the same worker; the rank crashed while that shell still ran, whose
    exit 0 came in the next report. Judged by host, the crash was never a loss: no
    replacement, the blacklisted name kept listed."""
    c = started(3)
    t = int(c.now.timestamp())
    ranks = {f"job-worker-{i}_{i + 1}_{t}": "start" for i in range(3)}
    first = pushed({**ranks, f"job-worker-1_9_{t + 1}": "start"}, c.now)
    crashed = {**ranks, f"job-worker-1_9_{t + 1}": "start", f"job-worker-1_2_{t}_exit": "1"}
    second = pushed(crashed, c.now, first)
    third = pushed({**crashed, f"job-worker-1_9_{t + 1}_exit": "0"}, c.now, second)
    assert second.lost == third.lost == frozenset({"job-worker-1"})
    # A shell that started after the last read and failed before this one is a loss too.
    late = f"job-worker-2_7_{t + 2}"
    quick = pushed({**ranks, late: "start", f"{late}_exit": "1"}, c.now, first)
    assert quick.lost == frozenset({"job-worker-2"})
    c.reports = second
    c.apply(c.plan())
    worker_1_replaced(c)


def test_an_unreadable_launcher_keeps_the_full_drain() -> None:
    c = started(2)
    c.set_replicas(1)
    c.apply(c.plan())
    c.tick(DRAIN_FLOOR_SECONDS + 1)
    c.ranks = RankSnapshot(c.now, None, "exec refused")
    assert not c.plan().of_type(DeletePod)
    c.tick(30)
    assert [d.grace_seconds for d in c.plan().of_type(DeletePod)] == [None]


def test_a_pending_victim_goes_at_once_and_a_running_one_stays() -> None:
    c = started(2)
    c.set_replicas(3)
    c.apply(c.plan())  # worker-2 is created and stays Pending (no capacity)
    # ...and is older than worker-1, so "the newest" alone would remove worker-1.
    c.objects[("Pod", "job-worker-2")]["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    c.objects[("Pod", "job-worker-1")]["metadata"]["creationTimestamp"] = "2026-06-01T00:00:00Z"
    c.set_replicas(2)
    p = c.plan()
    assert [(d.name, d.grace_seconds) for d in p.of_type(DeletePod)] == [("job-worker-2", None)]
    assert not [a for a in p.of_type(AnnotatePod) if a.stamp == names.ANN_DRAINING_SINCE]
    c.apply(p)
    assert discovered(c.get("ConfigMap", "job-config")) == ["job-worker-0", "job-worker-1"]
    deleted = [e.message for e in c.events if e.reason == "WorkerDeleted"]
    assert deleted == ["deleted worker pods job-worker-2 (no rank could run there)"]


def test_named_scale_in_removes_exactly_the_named_workers() -> None:
    c = started(4)
    c.job["metadata"]["annotations"][names.ANN_REMOVE_WORKERS] = "job-worker-0,job-worker-2"
    c.set_replicas(2)
    p = c.plan()
    assert not [a for a in p.of_type(Create) if a.obj["kind"] == "Pod"]
    c.apply(p)
    assert discovered(c.get("ConfigMap", "job-config")) == ["job-worker-1", "job-worker-3"]
    scaling = next(x for x in c.job["status"]["conditions"] if x["type"] == "Scaling")
    assert "job-worker-0 (named for removal, until" in scaling["message"]
    bounds = {"minReplicas": 1, "maxReplicas": 8}
    assert c.job["status"]["elastic"] == {"listed": 2, "draining": 2, "retired": "", **bounds}
    c.converge(rounds=60)
    remaining = sorted(p["metadata"]["name"] for p in c.pods if "-worker-" in p["metadata"]["name"])
    assert remaining == ["job-worker-1", "job-worker-3"]


def test_zero_drain_warns_that_horovod_counts_failures() -> None:
    c = started(2, **{names.ANN_DRAIN_SECONDS: "0"})
    c.set_replicas(1)
    c.apply(c.plan())
    assert "DrainDisabled" in [e.reason for e in c.events if e.type == "Warning"]


def test_a_finished_job_lists_and_drains_nobody() -> None:
    c = started(2)
    assert c.job["status"]["elastic"]["listed"] == 2
    c.objects[("Pod", "job-launcher")]["status"] = {"phase": "Succeeded"}
    c.apply(c.plan())
    bounds = {"minReplicas": 1, "maxReplicas": 8}
    assert c.job["status"]["elastic"] == {"listed": 0, "draining": 0, "retired": "", **bounds}


def test_a_worker_about_to_be_disrupted_goes_before_the_newest() -> None:
    workers = [pod(0, created=1), pod(1, created=2), pod(2, created=3)]
    workers[0].pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    m = members(workers, 2, listed={w.name for w in workers})
    assert [(v.worker.name, v.why) for v in m.leaving] == [("job-worker-0", DISRUPTED)]


def test_one_scale_up_straddling_a_second_is_one_cohort() -> None:
    # worker-0 and worker-1 came from one batch of creates that crossed a second boundary.
    workers = [pod(0, created=11), pod(1, created=10), pod(2, created=40)]
    m = members(workers, 1, listed={w.name for w in workers})
    assert [v.worker.name for v in m.leaving] == ["job-worker-2", "job-worker-1"]
