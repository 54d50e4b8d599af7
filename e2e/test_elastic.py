"""End to end: a user's elastic MPIJob, seen from the launcher (a mock Horovod driver).

The steps run in order on one job, as a user would walk them: submit with 2 workers
(bounds 1..5), scale to 4, to 1, back to 3, delete a worker with a grace period (a
graceful removal), crash a rank (a failure), try an out-of-range edit,
`kubectl scale`, a named scale-in, a Pending worker removed, `kubectl drain` of a node
with workers and a node tainted as going away (spot), let the training finish, delete
the job. After each step the driver's
own record says what Horovod would have seen: hosts gained, hosts removed gracefully,
failures and blacklists. Every scale step's timeline goes to stdout and to e2e/out/.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.harness import (
    ElasticRun,
    Step,
    describe_moves,
    in_cluster_job,
    report,
    spread_workers,
)
from e2e.mockhorovod import CRASH_EXIT_CODE
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for

# hack/e2e-kind.sh sets these: the controller is deployed in the cluster, and the launcher
# is a real pod running the mock launcher image.
IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"
SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
# The drain is only the upper bound: a victim goes once the launcher no longer reaches it
# (mpijob_elastic/core/inputs/ranks.py), about a second after its rank left at its next
# commit. A long bound shows that the early end works: waiting it out would fail the
# step's timing.
DRAIN_SECONDS = 15
# The floor of every drain (core/hosts/drain.py's DRAIN_FLOOR_SECONDS), and how soon after
# its rank left a victim must be gone: one launcher read a second, plus the delete reaching
# the cache.
DRAIN_FLOOR_SECONDS = 3.0
GONE_AFTER_RANKS_LEFT_SECONDS = 3.0


def sample_job() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = str(DRAIN_SECONDS)
    job["spec"].setdefault("runPolicy", {})["cleanPodPolicy"] = "Running"
    spread_workers(job)
    if IN_CLUSTER:
        in_cluster_job(job, os.environ["E2E_LAUNCHER_IMAGE"], os.environ["E2E_WORKER_IMAGE"])
    return job


@pytest.fixture(scope="module")
def run(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ElasticRun]:
    elastic = ElasticRun(
        cluster,
        e2e_namespace,
        sample_job(),
        tmp_path_factory.mktemp("launcher"),
        in_cluster=IN_CLUSTER,
    )
    yield elastic
    elastic.close()
    report(elastic, "elastic")


def no_failures(run: ElasticRun, since: float = 0.0) -> None:
    """No failure, blacklist or refused exec, and none of the real driver's ends: a reset
    with no previous host, a host update lost in a reset, a new rank past the Gloo
    timeout, a reset blocked below --min-np past the elastic timeout, every rank lost."""
    bad = [e for e in run.driver_events(*ev.FAILURE_EVENTS, *ev.FATAL_EVENTS) if e["ts"] >= since]
    assert bad == [], bad


def worker(run: ElasticRun, *indexes: int) -> set[str]:
    return {names.worker_name(run.job, i) for i in indexes}


def test_submit_starts_ranks_on_both_workers(run: ElasticRun) -> None:
    run.submit()
    run.start_launcher()
    run.wait_for_ranks_on(2)
    no_failures(run)


def test_scale_up_to_4_gains_both_hosts_without_forbidden_exec(run: ElasticRun) -> None:
    run.scale(4)
    run.wait_for_ranks_on(4)
    added = {e["host"] for e in run.driver_events(ev.HOST_ADDED)}
    assert added == set(run.hosts(4))
    no_failures(run)


def test_scale_in_to_1_is_graceful_and_deletes_after_discovery(run: ElasticRun) -> None:
    step = run.scale(1)
    run.wait_for_ranks_on(1)
    wait_for(lambda: run.worker_pods() == run.hosts(1), 30, "surplus pods deleted")
    victims = set(run.hosts(4)) - set(run.hosts(1))
    removed = {
        e["host"]: e["ts"]
        for e in run.driver_events(ev.HOST_REMOVED)
        if e["ts"] >= step.started and e["graceful"]
    }
    assert set(removed) == victims
    wait_for(
        lambda: victims <= {e["pod"] for e in run.volume_events("pod_deleted")},
        10,
        "deletions observed",
    )
    deleted = {
        e["pod"]: e["ts"] for e in run.volume_events("pod_deleted") if e["ts"] >= step.started
    }
    listed_until = min(
        e["ts"] for e in run.volume_events("configmap_updated") if e["ts"] >= step.started
    )
    left = {
        e["host"]: e["ts"] for e in run.driver_events(ev.RANK_STOPPED) if e["ts"] >= step.started
    }
    for victim in victims:
        # The driver let the host go, and its rank left, before its pod was deleted; the
        # controller waited at least the floor after taking the host out of the files and
        # deleted it soon after the rank left, long before the drain's bound.
        assert removed[victim] < left[victim] <= deleted[victim], victim
        assert deleted[victim] - listed_until >= DRAIN_FLOOR_SECONDS - 0.5, victim
        assert deleted[victim] - left[victim] <= GONE_AFTER_RANKS_LEFT_SECONDS, victim
        print(
            f"FIGURE {victim}: rank left {left[victim] - step.started:.2f}s after the edit, "
            f"pod deleted {deleted[victim] - step.started:.2f}s after the edit "
            f"({deleted[victim] - left[victim]:.2f}s after the rank; drain bound "
            f"{DRAIN_SECONDS}s)"
        )
    no_failures(run)


def test_scale_back_to_3_reuses_names_and_uses_them_all(run: ElasticRun) -> None:
    run.scale(3)
    run.wait_for_ranks_on(3)
    no_failures(run)
    assert run.driver_events(ev.HOST_BLACKLISTED) == []


# The grace period of the hand-made delete: longer than it takes the removal to reach the
# driver and the rank to leave (the controller drops the terminating pod from
# discover_hosts.sh at once; the launcher's files refresh, the driver polls them every
# second, the rank leaves at its next commit: a few seconds), and short enough that a
# worker whose rank does not leave by itself is not waited on for the default 30 s.
DELETE_GRACE_SECONDS = 10


def test_worker_deleted_with_a_grace_period_leaves_gracefully_and_is_replaced(
    run: ElasticRun,
) -> None:
    victim = names.worker_name(run.job, 1)
    step = run.begin(f"kubectl delete pod {victim} --grace-period={DELETE_GRACE_SECONDS}")
    run.kubectl("delete", "pod", victim, f"--grace-period={DELETE_GRACE_SECONDS}", "--wait=false")

    def since_step(*kinds: str) -> list[dict[str, Any]]:
        return [
            e for e in run.driver_events(*kinds) if e["host"] == victim and e["ts"] >= step.started
        ]

    # The default worker command keeps the rank alive after SIGTERM, so Horovod sees the
    # host leave discovery first and lets its rank go at the next commit.
    wait_for(lambda: since_step(ev.HOST_REMOVED), 20, "the host removed from the job")
    stopped = wait_for(lambda: since_step(ev.RANK_STOPPED), 20, "the rank let go")
    assert [s["reason"] for s in stopped] == ["host_removed"]
    # A terminating worker's ranks may not outlive a short grace period, so the controller
    # takes no chance on its name: the replacement, created at once without waiting for
    # the old pod to go, has a name never used in this job, and Horovod uses it.
    run.wait_for_ranks_on(worker(run, 0, 2, 3))
    no_failures(run)


def test_crashed_rank_is_one_failure_and_blacklists_its_host(run: ElasticRun) -> None:
    victim = names.worker_name(run.job, 2)
    (rank_id,) = run.rank_ids_on(victim)
    wait_for(lambda: goodput(run).get("state") == "training_full", 90, "training at 3")
    before = goodput(run)["seconds"]
    run.crash_rank(victim, rank_id)
    failures = wait_for(lambda: run.driver_events(ev.RANK_FAILED), 20, "the rank failure")
    assert [(f["host"], f["rank_id"], f["exit_code"]) for f in failures] == [
        (victim, rank_id, CRASH_EXIT_CODE)
    ]
    assert not failures[0]["exec_refused"]
    wait_for(
        lambda: [b["host"] for b in run.driver_events(ev.HOST_BLACKLISTED)] == [victim],
        10,
        "the host blacklisted",
    )
    # Only the process died and the pod runs on, but Horovod never gives a blacklisted host
    # a rank again. The controller's watch of the launcher sees the remote shell into a
    # listed worker end while the others go on: it retires the name and replaces the
    # worker under a fresh one, which Horovod uses.
    want = worker(run, 0, 3, 4)
    run.wait_for_ranks_on(want, timeout=60)
    wait_for(lambda: set(run.worker_pods()) == want, 30, "the crashed worker's pod gone")
    assert run.driver_events(ev.EXEC_FAILED) == []
    assert [b["host"] for b in run.driver_events(ev.HOST_BLACKLISTED)] == [victim]
    # Goodput (docs/operations.md): the loss and the time back at the target, counted.
    wait_for(lambda: goodput(run).get("state") == "training_full", 90, "training at 3 again")
    spent = goodput(run)["seconds"]

    def short(seconds: dict[str, float]) -> float:
        return sum(v for s, v in seconds.items() if s != "training_full")

    assert short(spent) > short(before), (before, spent)
    assert "lostAt" not in goodput(run)


def goodput(run: ElasticRun) -> dict[str, Any]:
    path = f"/apis/{names.API_VERSION}/namespaces/{run.namespace}/{names.PLURAL}/{run.job}"
    return dict(((run.cluster.raw("GET", path) or {}).get("status") or {}).get("goodput") or {})


def test_out_of_range_edit_is_refused_with_the_policy_message(run: ElasticRun) -> None:
    patch = json.dumps({"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 9}}}})
    refused = run.cluster.kubectl(
        "patch", "mpijob", run.job, "-n", run.namespace, "--type=merge", "-p", patch, check=False
    )
    assert refused.returncode != 0
    assert "above the maximum 5" in refused.stderr
    scaled = run.cluster.kubectl(
        "scale", f"mpijob/{run.job}", "-n", run.namespace, "--replicas=0", check=False
    )
    assert scaled.returncode != 0
    assert "below the minimum 1" in scaled.stderr
    assert set(run.worker_pods()) == worker(run, 0, 3, 4)


def test_kubectl_scale_works(run: ElasticRun) -> None:
    step = run.scale(4, via="scale")
    # 1 and 2 are retired: the new worker takes 5.
    run.wait_for_ranks_on(worker(run, 0, 3, 4, 5))
    no_failures(run, since=step.started)


def test_named_scale_in_removes_exactly_the_named_workers(run: ElasticRun) -> None:
    named = sorted(worker(run, 0, 4))
    step = run.begin(f"kubectl patch: remove {', '.join(named)}, 2 workers")
    patch = {
        "metadata": {"annotations": {names.ANN_REMOVE_WORKERS: ",".join(named)}},
        "spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}},
    }
    run.kubectl("patch", "mpijob", run.job, "--type=merge", "-p", json.dumps(patch))
    run.wait_for_ranks_on(worker(run, 3, 5))
    wait_for(lambda: set(run.worker_pods()) == worker(run, 3, 5), 30, "named pods deleted")
    removed = {e["host"] for e in run.driver_events(ev.HOST_REMOVED) if e["ts"] >= step.started}
    assert removed == set(named)
    no_failures(run, since=step.started)


def patch_replicas(run: ElasticRun, n: int, label: str) -> Step:
    """A scale whose host list does not change, kept out of the timeline check below."""
    step = run.begin(label)
    patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": n}}}}
    run.kubectl("patch", "mpijob", run.job, "--type=merge", "-p", json.dumps(patch))
    return step


def test_a_pending_worker_is_the_first_victim_and_goes_at_once(run: ElasticRun) -> None:
    nodes = [n.split("/", 1)[1] for n in run.kubectl("get", "nodes", "-o", "name").split()]
    # A taint nobody tolerates, which says nothing about the node going away: new pods
    # stay Pending, running ones stay (a cordon would make the job move its workers).
    try:
        for node in nodes:
            run.kubectl("taint", "nodes", node, "example.com/full=:NoSchedule")
        patch_replicas(run, 3, "nodes full: scale to 3, the new worker stays Pending")
        # Not 0 or 4 (still named for removal), nor the retired 1 and 2.
        pending = names.worker_name(run.job, 6)
        wait_for(lambda: pending in run.worker_pods(), 20, f"{pending} created")
        time.sleep(2)
        phase = run.kubectl("get", "pod", pending, "-o", "jsonpath={.status.phase}")
        assert phase == "Pending"
        step = patch_replicas(run, 2, f"nodes full: scale to 2, {pending} Pending")
        wait_for(lambda: pending not in run.worker_pods(), 10, f"{pending} deleted at once")
        print(f"FIGURE Pending {pending} gone {time.time() - step.started:.2f}s after the edit")
    finally:
        for node in nodes:
            run.kubectl("taint", "nodes", node, "example.com/full-", check=False)
    assert set(run.worker_pods()) == worker(run, 3, 5)
    run.wait_for_ranks_on(worker(run, 3, 5))
    no_failures(run, since=step.started)


# kubectl drain waits until the evicted pods are gone (a worker's ranks hold it up to its
# grace period, the default 30 s) and, when a disruption budget refuses an eviction,
# retries every 5 s until the replacements are Ready. Generous: not a timing check.
DRAIN_TIMEOUT_SECONDS = 120
# The controller's namespace in config/default: on kind its node is drained of the job's
# workers only, so the walk never waits on the controller restarting.
CONTROLLER_NAMESPACE = "mpijob-elastic-system"
# One of the controller's default --leaving-node-taints (mpijob_elastic/core/nodes.py).
LEAVING_TAINT = "karpenter.sh/disrupted"


def test_scale_to_3_for_the_node_steps(run: ElasticRun) -> None:
    step = run.scale(3)
    # The Pending worker-6 was never listed, so its name was not retired: it comes back.
    run.wait_for_ranks_on(worker(run, 3, 5, 6))
    no_failures(run, since=step.started)


def gracefully_removed(run: ElasticRun, step: Step, workers: set[str]) -> None:
    """Horovod let each of these hosts go (out of discovery first), and each rank there
    left because its host was removed: no failure."""
    removed = {
        e["host"]
        for e in run.driver_events(ev.HOST_REMOVED)
        if e["ts"] >= step.started and e["graceful"]
    }
    assert workers <= removed, (workers, removed)
    stopped = [e for e in run.driver_events(ev.RANK_STOPPED) if e["ts"] >= step.started]
    for name in workers:
        assert [e["reason"] for e in stopped if e["host"] == name] == ["host_removed"], name


def test_kubectl_drain_moves_the_workers_off_gracefully(run: ElasticRun) -> None:
    before = run.worker_nodes()
    assert len(before) == 3, before
    node, selector = run.node_to_drain((CONTROLLER_NAMESPACE,) if IN_CLUSTER else ())
    leaving = {w: n for w, n in before.items() if n == node}
    staying = set(before) - set(leaving)
    how = f" --pod-selector=<{run.job}'s workers>" if selector else ""
    step = run.begin(f"kubectl drain {node}{how}: {', '.join(sorted(leaving))} on it")
    step.lines.append(
        "placement before: "
        + ", ".join(f"{w} on {n}" for w, n in sorted(before.items()))
        + f"; launcher on {run.launcher_node()}"
    )
    try:
        drained = run.drain(step, node, selector, DRAIN_TIMEOUT_SECONDS)
        assert drained.returncode == 0, drained.output
        # The workers went through the eviction API, not only through the controller.
        assert {f"{run.namespace}/{w}" for w in leaving} <= set(drained.evicted), drained.output
        listed = run.wait_for_size(3)
        placement = run.worker_nodes()
    finally:
        run.cluster.kubectl("uncordon", node, check=False)
    # The job kept its size, on other nodes, and only the drained node's workers moved.
    assert not listed & set(leaving), listed
    assert staying <= listed, (staying, listed)
    assert all(placement[w] != node for w in listed), placement
    assert not set(leaving) & set(run.worker_pods())
    gracefully_removed(run, step, set(leaving))
    no_failures(run, since=step.started)
    moves = run.moves(step, leaving)
    arrivals = run.arrivals(step, set(before))
    assert {a.worker for a in arrivals} == listed - set(before), arrivals
    step.lines += [
        f"kubectl drain took {step.marks[-1][0] - step.started:.2f}s, "
        f"{drained.refused} evictions refused by the disruption budget (retried); "
        f"evicted {', '.join(sorted(set(drained.evicted)))}",
        *describe_moves(moves, arrivals),
    ]
    for line in step.lines:
        print(f"FIGURE drain: {line}")


def test_a_leaving_taint_moves_the_workers_off_before_they_go(run: ElasticRun) -> None:
    before = run.worker_nodes()
    assert len(before) == 3, before
    node, _ = run.node_to_drain((CONTROLLER_NAMESPACE,) if IN_CLUSTER else ())
    leaving = {w: n for w, n in before.items() if n == node}
    step = run.begin(
        f"kubectl taint node {node} {LEAVING_TAINT}=:NoSchedule: {', '.join(sorted(leaving))} on it"
    )
    step.lines.append(
        "placement before: " + ", ".join(f"{w} on {n}" for w, n in sorted(before.items()))
    )

    def moved() -> set[str] | None:
        listed = set(run.discovered())
        settled = len(listed) == 3 and run.ranks_running_on() == listed
        gone = not set(leaving) & (listed | set(run.worker_pods()))
        return listed if settled and gone else None

    try:
        run.cluster.kubectl("taint", "node", node, f"{LEAVING_TAINT}=:NoSchedule")
        listed: set[str] = wait_for(moved, 60, f"{sorted(leaving)} moved off {node}")
        placement = run.worker_nodes()
    finally:
        run.cluster.kubectl("taint", "node", node, f"{LEAVING_TAINT}-", check=False)
    assert set(before) - set(leaving) <= listed
    assert all(placement[w] != node for w in listed), placement
    # Make before break: nothing was evicted, so the workers on the going node stayed
    # listed until their replacements were; Horovod never had fewer hosts than asked for.
    sizes = [len(e["hosts"]) for e in run.driver_events(ev.DISCOVERY) if e["ts"] >= step.started]
    assert min(sizes) >= 3, sizes
    gracefully_removed(run, step, set(leaving))
    no_failures(run, since=step.started)
    moves = run.moves(step, leaving)
    arrivals = run.arrivals(step, set(before))
    assert {a.worker for a in arrivals} == listed - set(before), arrivals
    for m in moves:
        # Deleted only once its rank had left (the launcher read), not while it ran.
        assert m.out_of_discovery is not None, m
        assert m.rank_left is not None, m
        assert m.deleted is not None, m
        assert m.out_of_discovery <= m.rank_left <= m.deleted, m
    step.lines += describe_moves(moves, arrivals)
    for line in step.lines:
        print(f"FIGURE taint: {line}")


def lease_holder(run: ElasticRun) -> str:
    return run.cluster.kubectl(
        "get",
        "lease",
        "mpijob-elastic",
        "-n",
        CONTROLLER_NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    ).stdout.strip()


def test_the_controller_going_mid_scale_up_loses_nothing(
    run: ElasticRun, controller: ControllerProcess | None
) -> None:
    """On kind, the leader's pod is deleted right after a scale-up: it releases the Lease
    and the standby finishes the scale (docs/operations.md). Without kind, the one
    controller process is restarted instead. Either way the job grows, with no failure."""
    before = set(run.discovered())
    step = run.scale(4)
    if controller is None:
        leader = lease_holder(run)
        assert leader, "no replica holds the Lease"
        run.cluster.kubectl(
            "delete", "pod", leader.rsplit("_", 1)[0], "-n", CONTROLLER_NAMESPACE, "--wait=false"
        )
        wait_for(lambda: lease_holder(run) not in ("", leader), 60, "the standby to lead")
        print(f"FIGURE failover: the standby led {time.time() - step.started:.2f}s after the scale")
    else:
        controller.stop()
        controller.start()
    listed = run.wait_for_size(4)
    assert before <= listed, (before, listed)
    no_failures(run, since=step.started)
    if controller is None:
        # Two replicas again, both ready (the Deployment's readiness probes), for what follows.
        run.cluster.kubectl(
            "rollout",
            "status",
            "deployment/mpijob-elastic",
            "-n",
            CONTROLLER_NAMESPACE,
            "--timeout=180s",
        )


def test_launcher_finishing_succeeds_the_job_and_cleans_up(run: ElasticRun) -> None:
    run.begin("training finishes")
    assert run.finish() == 0
    exits = run.driver_events(ev.DRIVER_EXIT)
    assert exits
    assert exits[-1].get("failures") == 1

    def succeeded() -> bool:
        job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
        return any(
            c["type"] == "Succeeded" and c["status"] == "True"
            for c in job.get("status", {}).get("conditions", [])
        )

    wait_for(succeeded, 30, "the job to succeed")
    # cleanPodPolicy Running: the running workers go, the finished launcher stays.
    wait_for(lambda: run.worker_pods() == [], 30, "workers cleaned up")


def test_deleting_the_job_leaves_nothing_behind(run: ElasticRun) -> None:
    run.kubectl("delete", "mpijob", run.job)

    def leftovers() -> str:
        return run.kubectl(
            "get",
            "pods,configmaps,serviceaccounts,roles,rolebindings",
            "-l",
            f"{names.LABEL_JOB}={run.job}",
            "-o",
            "name",
        ).strip()

    wait_for(lambda: leftovers() == "", 60, "every child garbage-collected")


def test_timeline_files_are_written(run: ElasticRun) -> None:
    # Every scale step saw its change reach the driver; the timeline says how fast.
    for step in run.steps:
        if "workers" in step.label and "kubectl" in step.label:
            rows = run.timeline(step)
            assert any("driver: discover_hosts.sh lists" in text for _, text in rows), step.label


def _mpijob(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "mpijob", name, "-n", namespace, "-o", "json").stdout
    return dict(json.loads(out))


def _refused(job: dict[str, Any]) -> dict[str, Any] | None:
    conditions = job.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "WriteRefused"), None)


def test_a_worker_name_held_by_someone_else_is_skipped_and_reported_while_held(
    cluster: Cluster, e2e_namespace: str, controller: ControllerProcess | None
) -> None:
    """Issue 20 §2, on KWOK and on kind: a pod the job does not control holds
    ``<job>-worker-0``. The job skips that name (its workers are worker-1 and worker-2,
    its launcher starts), never grants exec on the pod, never lists it, never touches it,
    and says so (``WriteRefused``, one Warning naming the pod, its owner and that the name
    is skipped; no ``WorkerReplaced``) for as long as the pod is there: past the 30 s after
    which it used to forget. Once the pod is deleted the report clears."""
    ns, name = e2e_namespace, "taken-name"
    taken = names.worker_name(name, 0)
    # Pending for good on any cluster: a holder needs no node to hold the name.
    foreign_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": taken},
        "spec": {
            "nodeSelector": {"e2e.mpijob-elastic.io/no-such-node": "true"},
            "containers": [{"name": "main", "image": "registry.invalid/none"}],
        },
    }
    created = cluster.kubectl(
        "create", "-n", ns, "-o", "json", "-f", "-", input=json.dumps(foreign_pod)
    )
    foreign = json.loads(created.stdout)["metadata"]
    job = sample_job()
    job["metadata"]["name"] = name
    spread_workers(job)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    want = ["Pod", taken, "(no owner)", "worker name skipped"]

    def reported() -> bool:
        cond = _refused(_mpijob(cluster, ns, name))
        return bool(cond and cond["status"] == "True" and all(w in cond["message"] for w in want))

    wait_for(reported, 60, f"WriteRefused naming {taken}")
    config = f"configmap/{names.config_map_name(name)}"

    def listed() -> str:
        return str(
            cluster.kubectl(
                "get", config, "-n", ns, "-o", "jsonpath={.data.discover_hosts\\.sh}"
            ).stdout
        )

    others = [names.worker_name(name, i) for i in (1, 2)]
    wait_for(lambda: all(w in listed() for w in others), 120, f"{others} listed")
    launcher = names.launcher_name(name)
    wait_for(
        lambda: cluster.kubectl("get", "pod", launcher, "-n", ns, check=False).returncode == 0,
        60,
        "the launcher, as for any job",
    )
    held_until = time.monotonic() + 40
    while time.monotonic() < held_until:
        assert reported(), _refused(_mpijob(cluster, ns, name))
        assert taken not in listed()
        time.sleep(3)
    role = json.loads(cluster.kubectl("get", "role", launcher, "-n", ns, "-o", "json").stdout)
    granted = {n for rule in role["rules"] for n in rule.get("resourceNames") or []}
    assert taken not in granted, granted
    pod = json.loads(cluster.kubectl("get", "pod", taken, "-n", ns, "-o", "json").stdout)
    for key in ("uid", "labels", "annotations", "ownerReferences", "deletionTimestamp"):
        assert pod["metadata"].get(key) == foreign.get(key), key
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", ns, "--field-selector",
            f"involvedObject.kind=MPIJob,involvedObject.name={name}", "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    warned = [e["message"] for e in events if e["reason"] == "WriteRefused"]
    assert len(warned) == 1, warned
    assert all(w in warned[0] for w in want), warned
    assert not [e for e in events if e["reason"] == "WorkerReplaced"], events
    cluster.kubectl("delete", "pod", taken, "-n", ns, "--wait=false")

    def cleared() -> bool:
        cond = _refused(_mpijob(cluster, ns, name))
        return cond is not None and cond["status"] == "False"

    wait_for(cleared, 60, "WriteRefused False once the holder is gone")
    cluster.kubectl("delete", "mpijob", name, "-n", ns)
