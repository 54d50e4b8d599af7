"""End to end: jobs whose workers all sit on one node, and the real Horovod driver's rules.

Small jobs fit on one GPU node, so the node that goes away (cordoned, drained) takes
every worker at once. Horovod's driver cannot reset onto a host set that shares no host
with its current assignment ("No hosts from previous set remaining"), loses a host update
sent while its ranks re-rendezvous, waits for every newly listed rank up to the Gloo
timeout, and blocks below --min-np (e2e/mockhorovod/README.md, "The real driver's
rules"). Each job here runs with the stricter mock driver against the controller, and the
driver's own record must show none of those ends (``events.FATAL_EVENTS``), no failure and
no blacklist. Each step's timeline goes to stdout and to e2e/out/.

Issue 30: every job here plays a slow training, whose ranks take ``SLOW_START`` (20 s) from
their start to joining (import torch, CUDA, the data set), during which Horovod's reset
runs and drops any host change; the cordon plays a training without the commit hook (the
controller waits out the reset bound), the drain and the crash one with it (the marker).

It runs on KWOK (the driver a local process, ``make e2e``) and on kind (``E2E_IN_CLUSTER=1``
from hack/e2e-kind.sh: the controller deployed, the launcher a real pod running the mock
launcher image). The node that holds every worker is one of the cluster's schedulable
nodes, with at least one other for the launcher and the replacements.

Rules and where they are checked here: 1 (a previous host kept) in the cordon and drain;
6 (horovodrun exits 1 on SIGTERM; a launcher its node stopped does not fail the job) at
the end of the cordon test;
2 (one rewrite per decision) in the quick scale; 3 (a listed host's rank joins in time)
and 5 (never every rank at once) by the fatal events in every test; 4 (never below
--min-np) in the drain of a job whose minimum is 2; 7 (the start probe) at submit; 8 (an
exit judged by (host, slot)) by the failure events in every test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest
import yaml

from e2e.harness import (
    EXIT_ANNOTATION,
    ElasticRun,
    Step,
    describe_moves,
    in_cluster_job,
    mock_driver_args,
    report,
)
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
DRAIN_SECONDS = 15
WORKERS = 3
RELOCATION_TIMEOUT = 120
# A rank's start to its joining: slower than the 5 s the controller once took as proof.
SLOW_START = 20.0
HOSTNAME = "kubernetes.io/hostname"
# hack/e2e-kind.sh sets these: the controller is deployed in the cluster, and the launcher
# is a real pod running the mock launcher image.
IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"


def colocation_node(cluster: Cluster) -> str:
    """The node to put every worker on: the last by name of the Ready nodes that take
    pods (not cordoned, no NoSchedule or NoExecute taint), of which there must be
    another for the launcher and the replacements. On KWOK: kwok-node-3 unless another
    test has it cordoned; on kind: the worker node (the control plane takes pods too,
    hack/kind-up.sh)."""
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    schedulable = sorted(
        n["metadata"]["name"]
        for n in nodes
        if not n["spec"].get("unschedulable")
        and not any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in n["spec"].get("taints") or ()
        )
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in n.get("status", {}).get("conditions", [])
        )
    )
    assert len(schedulable) >= 2, f"one node for the workers, another for the rest: {nodes}"
    return str(schedulable[-1])


def colocated_job(name: str, node: str, args: tuple[str, ...], min_replicas: int) -> dict[str, Any]:
    """The sample with every worker preferring ``node`` (one 8-GPU node holds the whole
    job) and the launcher kept off it. A preference, so replacements may go elsewhere."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    if IN_CLUSTER:
        in_cluster_job(job, os.environ["E2E_LAUNCHER_IMAGE"], os.environ["E2E_WORKER_IMAGE"], args)
    job["metadata"]["name"] = name
    annotations = job["metadata"]["annotations"]
    annotations[names.ANN_DRAIN_SECONDS] = str(DRAIN_SECONDS)
    annotations["mpijob-elastic.io/min-replicas"] = str(min_replicas)
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replicas"] = WORKERS
    specs["Worker"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]
                    },
                }
            ]
        }
    }
    specs["Launcher"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME, "operator": "NotIn", "values": [node]}]}
                ]
            }
        }
    }
    return job


def driver_args(
    min_replicas: int, marker: bool, rank_start_seconds: float = SLOW_START
) -> tuple[str, ...]:
    """A slow training, with the commit hook (``marker``) or without; bench.relocation
    plays other start times."""
    base = ("-np", str(WORKERS), "--min-np", str(min_replicas), "--max-np", "5")
    return mock_driver_args(base, rank_start_seconds=rank_start_seconds, commit_marker=marker)


def start_job(
    cluster: Cluster,
    namespace: str,
    workdir: Any,
    name: str,
    node: str,
    min_replicas: int,
    *,
    marker: bool,
    rank_start_seconds: float = SLOW_START,
) -> ElasticRun:
    args = driver_args(min_replicas, marker, rank_start_seconds)
    run = ElasticRun(
        cluster,
        namespace,
        colocated_job(name, node, args, min_replicas),
        workdir,
        driver_args=args,
        in_cluster=IN_CLUSTER,
    )
    step = run.submit()
    run.start_launcher()
    listed = run.wait_for_size(WORKERS, timeout=90)
    wait_for(lambda: run.ranks_running_on() == listed, 60, "the first ranks joined")
    placement = run.worker_nodes()
    assert {placement[w] for w in listed} == {node}, placement
    assert run.launcher_node() != node
    # Rule 7: every host answered the interface probe through kubexec.sh before any rank
    # started, and the probe's short-lived shells did not read as ranks lost: the workers
    # that were probed are the ones that train.
    (probe,) = run.driver_events(ev.PROBE_DONE)
    first_rank = run.driver_events(ev.RANK_STARTED)[0]
    assert probe["ts"] < first_rank["ts"], (probe, first_rank)
    assert set(probe["hosts"]) == listed, (probe, listed)
    step.lines.append(f"probe done {probe['ts'] - step.started:+.2f}s, ranks on {sorted(listed)}")
    # The PodDisruptionBudget is the controller's own, untouched by the test.
    budget = json.loads(
        run.kubectl("get", "pdb", names.disruption_budget_name(run.job), "-o", "json")
    )
    step.lines.append(f"PodDisruptionBudget spec as shipped: {json.dumps(budget['spec'])}")
    return run


def nothing_fatal(run: ElasticRun, since: float = 0.0) -> None:
    """No failure, blacklist or refused exec, and nothing after which Horovod ends the job
    or trains on hosts no longer listed."""
    bad = [
        e
        for e in run.driver_events(*ev.FAILURE_EVENTS, *ev.FATAL_EVENTS, ev.DRIVER_EXIT)
        if e["ts"] >= since
    ]
    assert bad == [], bad
    conditions = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
    ended = [
        c
        for c in conditions.get("status", {}).get("conditions", [])
        if c["type"] in ("Failed", "Succeeded") and c["status"] == "True"
    ]
    assert ended == [], ended


def relocated(run: ElasticRun, old: set[str]) -> set[str] | None:
    listed = set(run.discovered())
    settled = len(listed) == WORKERS and run.ranks_running_on() == listed
    return listed if settled and not listed & old else None


def timeline_figures(run: ElasticRun, step: Step, old: set[str]) -> tuple[float, float]:
    """Seconds from the step to the first replacement's rank and to the moment the last
    old host left discover_hosts.sh."""
    ranks = [
        e["ts"] - step.started
        for e in run.driver_events(ev.RANK_RUNNING)
        if e["ts"] >= step.started and e["host"] not in old
    ]
    unlisted = [
        min(
            e["ts"] - step.started
            for e in run.driver_events(ev.DISCOVERY)
            if e["ts"] >= step.started and host not in e["hosts"]
        )
        for host in old
    ]
    return min(ranks), max(unlisted)


def rank_holders(run: ElasticRun, at: float) -> set[str]:
    """Hosts with a running rank just before ``at``, per the driver's record."""
    count: dict[str, int] = {}
    for r in run.driver_events(ev.RANK_RUNNING, ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_FAILED):
        if r["ts"] < at:
            count[r["host"]] = count.get(r["host"], 0) + (
                1 if r["event"] == ev.RANK_RUNNING else -1
            )
    return {h for h, n in count.items() if n > 0}


def resets_open(run: ElasticRun, since: float) -> list[tuple[float, float]]:
    """The driver's resets that started ranks, from the reset to the last new rank's
    joining, as (start, end) times; one still open ends now."""
    spans = []
    open_at: float | None = None
    for e in run.driver_events(ev.RESET, ev.RESET_COMPLETED):
        if e["ts"] < since:
            continue
        if e["event"] == ev.RESET:
            open_at = e["ts"]
        elif open_at is not None:
            spans.append((open_at, e["ts"]))
            open_at = None
    return spans


def no_change_during_a_reset(run: ElasticRun, since: float) -> None:
    """Issue 30: no host-list change the driver saw while a reset that started new ranks
    still ran (the driver drops such a change): every change after ``since`` came before
    a reset began or after its last new rank had joined."""
    spans = resets_open(run, since)
    assert spans, "no reset started ranks"
    # The driver records a discovery only when the host set changed.
    for change in run.driver_events(ev.DISCOVERY):
        if change["ts"] >= since:
            assert not any(start < change["ts"] < end for start, end in spans), (change, spans)


def check_relocation(run: ElasticRun, step: Step, old: set[str], before: set[str]) -> set[str]:
    listed: set[str] = wait_for(
        lambda: relocated(run, old), RELOCATION_TIMEOUT, f"{sorted(old)} replaced, with ranks"
    )
    nothing_fatal(run)
    # Rule 1: a host of the current assignment stays listed until a new host holds a rank.
    first_rank, last_unlisted = timeline_figures(run, step, old)
    assert first_rank <= last_unlisted, (first_rank, last_unlisted)
    no_change_during_a_reset(run, step.started)
    for e in run.driver_events(ev.DISCOVERY):
        if e["ts"] >= step.started:
            assert set(e["hosts"]) & rank_holders(run, e["ts"]), e
    # Every old host left gracefully: let go by the driver, never failed.
    stopped = {e["host"] for e in run.driver_events(ev.RANK_STOPPED) if e["ts"] >= step.started}
    assert old <= stopped, (old, stopped)
    arrivals = run.arrivals(step, before)
    moves = run.moves(step, {w: "" for w in old})
    joined = max(a.rank_running for a in arrivals if a.rank_running is not None)
    deleted = [m.deleted for m in moves]
    gone = "not yet" if None in deleted else f"{max(d for d in deleted if d is not None):+.2f}s"
    step.lines += [
        f"TIMELINE: {step.label} at +0.00s -> first replacement rank {first_rank:+.2f}s -> "
        f"every replacement rank joined {joined:+.2f}s -> "
        f"last old host unlisted {last_unlisted:+.2f}s -> old workers deleted {gone}",
        *describe_moves(moves, arrivals),
    ]
    for line in step.lines:
        print(f"FIGURE {run.job}: {line}")
    return listed


def drain(run: ElasticRun, step: Step, node: str) -> Any:
    """``kubectl drain`` of the node. In the cluster only of the job's pods: the node also
    runs a replica of the controller and the cluster's add-ons, which are not what this
    test is about."""
    selector = names.selector(run.job, names.ROLE_WORKER) if IN_CLUSTER else None
    return run.drain(step, node, selector, 120)


def evicted_by_its_node(run: ElasticRun) -> int:
    """KWOK: the launcher's node stops it (node-pressure eviction): the harness SIGTERMs
    the driver, as the kubelet would, and the pod ends Failed with reason Evicted through
    the KWOK exit stage. The driver's exit code, returned."""
    driver = run.procs[-1]
    driver.send_signal(signal.SIGTERM)
    code = driver.wait(30)
    run.kubectl(
        "annotate",
        "pod",
        names.launcher_name(run.job),
        f"{EXIT_ANNOTATION}={code}",
        "kwok.mpijob-elastic.io/reason=Evicted",
    )
    return code


def evicted_through_the_api(run: ElasticRun) -> int:
    """In the cluster: an eviction through the Eviction API (what a drain or an autoscaler
    sends; the launcher is not under the budget): the kubelet SIGTERMs horovodrun and the
    pod goes. The driver's exit code, from its log followed to its end."""
    name = names.launcher_name(run.job)
    followed = run.workdir / "evicted-launcher.jsonl"
    cluster = run.cluster
    logs = ["logs", "-f", "-n", run.namespace, name]
    with followed.open("wb") as out:
        follow = subprocess.Popen(
            [cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, *logs],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
    wait_for(lambda: followed.stat().st_size > 0, 30, "the launcher's log followed")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": run.namespace},
    }
    path = f"/api/v1/namespaces/{run.namespace}/pods/{name}/eviction"
    cluster.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction))
    follow.wait(90)
    run.ended(followed.read_bytes())
    (done,) = run.driver_events(ev.DRIVER_EXIT)
    return int(done["exit_code"])


def launcher_stopped_by_its_node(run: ElasticRun) -> None:
    """Rule 6: an eviction stops the launcher: horovodrun gets SIGTERM and exits 1. A
    launcher ended by a disruption must not fail the job: it is started again."""
    step = run.begin("the launcher is evicted: horovodrun gets SIGTERM")
    code = evicted_through_the_api(run) if IN_CLUSTER else evicted_by_its_node(run)
    assert code == 1, code  # horovodrun's exit on SIGTERM
    step.marks.append((time.time(), f"launcher pod ended: exit {code}, evicted"))
    deadline = time.time() + 15
    while time.time() < deadline:
        job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
        failed = [
            c
            for c in job.get("status", {}).get("conditions", [])
            if c["type"] == "Failed" and c["status"] == "True"
        ]
        assert failed == [], failed
        time.sleep(1)

    def restarts() -> int:
        job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
        return int(job.get("status", {}).get("elastic", {}).get("launcherRestarts", 0))

    wait_for(lambda: restarts() >= 1, 30, "the launcher started again")


def test_cordon_then_drain_of_the_node_holding_every_worker(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node = colocation_node(cluster)
    # Without the commit hook: the controller waits out the reset bound (Gloo timeout + 5 s).
    run = start_job(
        cluster,
        e2e_namespace,
        tmp_path_factory.mktemp("cordon"),
        "colocated",
        node,
        1,
        marker=False,
    )
    try:
        old = set(run.discovered())
        before = set(run.worker_pods())
        step = run.begin(f"kubectl cordon {node}: {', '.join(sorted(old))} on it")
        cluster.kubectl("cordon", node)
        listed = check_relocation(run, step, old, before)
        assert not listed & old

        # The drain that follows the cordon: the node's pods (the old workers, if any
        # are left) are evicted; the job trains on.
        drain_step = run.begin(f"kubectl drain {node}")
        drained = drain(run, drain_step, node)
        assert drained.returncode == 0, drained.output
        time.sleep(3)
        assert set(run.discovered()) == listed
        assert run.ranks_running_on() == listed
        assert not set(run.worker_nodes().values()) & {node}
        nothing_fatal(run)
        launcher_stopped_by_its_node(run)
    finally:
        cluster.kubectl("uncordon", node, check=False)
        run.close()
        report(run, "colocated-cordon")


def test_drain_of_the_node_holding_every_worker_never_goes_below_min(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node = colocation_node(cluster)
    run = start_job(
        cluster,
        e2e_namespace,
        tmp_path_factory.mktemp("drain"),
        "colocated-drain",
        node,
        2,
        marker=True,
    )
    try:
        old = set(run.discovered())
        before = set(run.worker_pods())
        step = run.begin(f"kubectl drain {node}: {', '.join(sorted(old))} on it")
        drained = drain(run, step, node)
        assert drained.returncode == 0, drained.output
        check_relocation(run, step, old, before)
        step.lines.append(
            f"kubectl drain took {step.marks[-1][0] - step.started:.2f}s, "
            f"{drained.refused} evictions refused by the disruption budget (retried)"
        )
        # Rule 4: never fewer listed slots than the minimum, and the driver never blocked.
        sizes = [len(e["hosts"]) for e in run.driver_events(ev.DISCOVERY)]
        assert min(sizes) >= 2, sizes
        assert run.driver_events(ev.RESET_WAITING) == []

        # Rule 2: a second decision right after a first (a scale-in as soon as the driver
        # sees the scale-up): the controller must not rewrite the host list while the
        # ranks re-rendezvous with the new hosts, or the driver loses the second change.
        quick = run.begin("kubectl patch: 5 workers, then 4 as soon as the driver lists 5")
        for n in (5, 4):
            patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": n}}}}
            run.kubectl("patch", "mpijob", run.job, "--type=merge", "-p", json.dumps(patch))
            if n == 5:
                wait_for(lambda: len(run.discovered()) == 5, 60, "5 listed")
        run.wait_for_size(4, timeout=120)
        time.sleep(3)
        assert len(set(run.discovered())) == 4
        assert run.ranks_running_on() == set(run.discovered())
        nothing_fatal(run, since=quick.started)
    finally:
        cluster.kubectl("uncordon", node, check=False)
        run.close()
        report(run, "colocated-drain")


def test_a_crash_replacement_and_a_scale_in_at_once_wait_for_the_slow_reset(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A rank crashes (Horovod's failure and blacklist: the one loss nothing can avoid);
    the controller replaces its worker under a fresh name, and a scale-in arrives as soon
    as the driver lists the replacement, whose rank takes ``SLOW_START`` to join: the
    scale-in must wait until that reset has ended, or the driver drops it."""
    node = colocation_node(cluster)
    workdir = tmp_path_factory.mktemp("crash")
    run = start_job(cluster, e2e_namespace, workdir, "slow-crash", node, 1, marker=True)
    try:
        old = set(run.discovered())
        victim = names.worker_name(run.job, 1)
        (rank_id,) = run.rank_ids_on(victim)
        step = run.crash_rank(victim, rank_id)
        replacement = names.worker_name(run.job, WORKERS)
        wait_for(lambda: replacement in run.discovered(), 90, "the replacement listed")
        wait_for(
            lambda: any(replacement in e["hosts"] for e in run.driver_events(ev.DISCOVERY)),
            30,
            "the driver sees the replacement",
        )
        patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": WORKERS - 1}}}}
        run.kubectl("patch", "mpijob", run.job, "--type=merge", "-p", json.dumps(patch))
        run.wait_for_size(WORKERS - 1, timeout=120)
        wait_for(lambda: run.ranks_running_on() == set(run.discovered()), 60, "ranks on the listed")
        # The crash is the one failure and the one blacklist; nothing else is lost.
        failed = [(e["host"], e["rank_id"]) for e in run.driver_events(ev.RANK_FAILED)]
        assert failed == [(victim, rank_id)], failed
        assert [b["host"] for b in run.driver_events(ev.HOST_BLACKLISTED)] == [victim]
        bad = run.driver_events(ev.EXEC_FAILED, *ev.FATAL_EVENTS, ev.DRIVER_EXIT)
        assert bad == [], bad
        assert victim not in run.discovered()
        no_change_during_a_reset(run, step.started)
        step.lines.append(
            f"crashed {victim}; replaced by {replacement}; listed now {sorted(run.discovered())}"
            f" (was {sorted(old)})"
        )
    finally:
        run.close()
        report(run, "slow-crash")
