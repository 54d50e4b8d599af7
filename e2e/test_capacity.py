"""End to end: elastic by capacity (issue 21, docs/capacity.md), judged from the launcher's
side by the mock Horovod driver.

A job with Worker replicas 2 and max-replicas 8, opportunistic, on a node with room for
exactly 8 workers: it grows into the 6 idle places. A workload of higher priority (plain
pods at priority 0, the default) arrives and needs 6 places; the scheduler preempts the
opportunistic workers (priority -100, the shipped PriorityClass), they leave gracefully
(no failure, no blacklist in the driver's record) and the higher-priority pods run. They
finish; the job grows back.

The scarce resource is the node's GPUs on KWOK (``nvidia.com/gpu``, 8 a node) and its
CPU requests on kind (what the node has free, in eighths). It runs on KWOK (``make e2e``,
the driver a local process) and on kind (``hack/e2e-kind.sh -k capacity``: the controller
deployed from config/default, the launcher a real pod, the kubelet's grace period real).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.harness import ElasticRun, in_cluster_job, mock_driver_args
from e2e.mockhorovod import RANK_ANNOTATION_PREFIX
from e2e.mockhorovod import events as ev
from e2e.test_relocation import colocation_node, nothing_fatal
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for
from tests.manifests import TEST_NAMESPACE_PREFIX

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
PRIORITY_CLASS = ROOT / "config" / "default" / "priority_class.yaml"
IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"
BASELINE, MAXIMUM = 2, 8
DRIVER_ARGS = ("-np", str(BASELINE), "--min-np", "1", "--max-np", str(MAXIMUM))
# How long the growth step's ranks take to join: slow, as real ones are, and still well
# inside Horovod's 30 s Gloo timeout once starting a rank through kubectl exec costs its
# own seconds on a loaded machine. At 20 s, under a load of 17 (the suite in 4 processes
# and more), one rank took 29.6 s from its start and the job failed at the Gloo timeout
# before the preemption the test plays.
STEP_START = 15.0
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def controller(
    cluster: Cluster, e2e_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess | None]:
    # The PriorityClass config/default ships (on kind, installed with it already).
    cluster.kubectl("apply", "-f", str(PRIORITY_CLASS))
    if IN_CLUSTER:
        yield None
        return
    proc = ControllerProcess(
        cluster,
        (e2e_namespace,),
        tmp_path_factory.mktemp("controller") / "controller.log",
        args=("--growth-backoff-max-seconds", "20"),
    )
    proc.start()
    yield proc
    proc.stop()


def scarce(cluster: Cluster, node: str) -> tuple[str, str]:
    """The resource the workers compete for on ``node``, and one worker's share of what
    is free there: an eighth (GPUs on KWOK, CPU millicores on kind)."""
    resource = "cpu" if IN_CLUSTER else "nvidia.com/gpu"
    status = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)["status"]
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-A", "-o", "json", f"--field-selector=spec.nodeName={node}"
        ).stdout
    )["items"]
    # An earlier test's pods still on the node (deleted without waiting, or not yet reached
    # by the garbage collector) free their room later: a share measured now would be too
    # small, and the filler pods sized from it would leave room the job grows into.
    leaving = sorted(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if p["metadata"].get("deletionTimestamp")
        or p["metadata"]["namespace"].startswith(TEST_NAMESPACE_PREFIX)
    )
    assert not leaving, f"{node} still holds pods of tests: {leaving}"
    used = sum(
        cpu_quantity(c.get("resources", {}).get("requests", {}).get(resource, "0"))
        for p in pods
        if p["status"].get("phase") not in ("Succeeded", "Failed")
        for c in p["spec"]["containers"]
    )
    free = cpu_quantity(status["allocatable"].get(resource, "0")) - used
    share = int(free // MAXIMUM)
    assert share >= 1, f"{node} has {free} {resource} free, too little for {MAXIMUM} workers"
    return resource, (f"{share}m" if IN_CLUSTER else str(share))


def room(cluster: Cluster, node: str) -> tuple[str, str]:
    """``scarce`` once the pods of the tests before have left ``node``."""

    def measured() -> tuple[str, str] | None:
        try:
            return scarce(cluster, node)
        except AssertionError:
            return None

    found: tuple[str, str] = wait_for(measured, 180, f"room for {MAXIMUM} workers on {node}")
    return found


def cpu_quantity(text: str) -> float:
    """A CPU quantity in millicores, or a count."""
    return float(text[:-1]) if text.endswith("m") else float(text) * (1000 if IN_CLUSTER else 1)


def _times(share: str, n: int) -> str:
    return f"{int(share[:-1]) * n}m" if share.endswith("m") else str(int(share) * n)


def opportunistic_job(
    name: str, node: str, resource: str, share: str, args: tuple[str, ...] = DRIVER_ARGS
) -> dict[str, Any]:
    """The sample, opportunistic, bounds 1..8, every worker on ``node`` asking for one
    share of the scarce resource, the launcher elsewhere; ``args``: the mock driver's."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    if IN_CLUSTER:
        in_cluster_job(job, os.environ["E2E_LAUNCHER_IMAGE"], os.environ["E2E_WORKER_IMAGE"], args)
    job["metadata"]["name"] = name
    job["metadata"]["annotations"].update(
        {
            names.ANN_MAX_REPLICAS: str(MAXIMUM),
            names.ANN_OPPORTUNISTIC: "true",
            names.ANN_DRAIN_SECONDS: "15",
        }
    )
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replicas"] = BASELINE
    worker = specs["Worker"]["template"]["spec"]
    worker["affinity"] = node_affinity(node, "In")
    for container in worker["containers"]:
        container["resources"] = scarce_resources(resource, share)
    specs["Launcher"]["template"]["spec"]["affinity"] = node_affinity(node, "NotIn")
    return job


def scarce_resources(resource: str, amount: str) -> dict[str, Any]:
    """Requests only for CPU (a limit would throttle the ranks), a limit for GPUs (which
    a pod must ask for as one)."""
    if resource == "cpu":
        return {"requests": {resource: amount}}
    return {"limits": {resource: amount}}


def node_affinity(node: str, operator: str) -> dict[str, Any]:
    """Required node affinity: on ``node`` (``In``) or off it (``NotIn``)."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": operator, "values": [node]}]}
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]
        }}
    }  # fmt: skip


def higher_priority_pod(name: str, node: str, resource: str, amount: str) -> dict[str, Any]:
    """A pod of the default priority (0), above the opportunistic workers' -100."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "capacity-e2e"}},
        "spec": {
            "affinity": node_affinity(node, "In"),
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    # On kind an image every node has loaded already (hack/images.sh).
                    "image": os.environ.get("E2E_WORKER_IMAGE", "busybox"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "resources": scarce_resources(resource, amount),
                }
            ],
        },
    }


def events(run: ElasticRun, reason: str) -> list[str]:
    out = json.loads(
        run.kubectl(
            "get", "events", "-o", "json",
            f"--field-selector=involvedObject.name={run.job},reason={reason}",
        )
    )  # fmt: skip
    return [e["message"] for e in out["items"]]


def elastic_status(run: ElasticRun) -> dict[str, Any]:
    job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
    return dict(job.get("status", {}).get("elastic") or {})


def opportunistic_pods(run: ElasticRun) -> dict[str, dict[str, Any]]:
    out = json.loads(
        run.kubectl("get", "pods", "-l", f"{names.LABEL_OPPORTUNISTIC}=true", "-o", "json")
    )
    return {
        p["metadata"]["name"]: p
        for p in out["items"]
        if p["metadata"]["labels"].get(names.LABEL_JOB) == run.job
    }


def place_filler(run: ElasticRun, name: str, node: str, resource: str, amount: str) -> None:
    """A pod of priority 0 holding ``amount`` of the room, Running before the job is made:
    else the job's workers take the room and it preempts them later. Deleted once the
    job trains at its baseline, it makes the job's growth a reset of a running job, not
    part of its first start (which has a case of its own: the driver's first reset)."""
    pod = higher_priority_pod(name, node, resource, amount)
    run.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def running() -> bool:
        found = json.loads(run.kubectl("get", "pod", name, "-o", "json"))
        return bool(found.get("status", {}).get("phase") == "Running")

    wait_for(running, 60, f"the filler pod {name} running")


def test_grows_into_idle_capacity_and_gives_it_back_to_higher_priority(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node = colocation_node(cluster)
    resource, share = room(cluster, node)
    run = ElasticRun(
        cluster,
        e2e_namespace,
        opportunistic_job("capacity", node, resource, share),
        tmp_path_factory.mktemp("capacity"),
        driver_args=DRIVER_ARGS,
        in_cluster=IN_CLUSTER,
    )
    high = [f"high-{i}" for i in range(2)]
    filler = "filler-idle"
    try:
        place_filler(run, filler, node, resource, _times(share, MAXIMUM - BASELINE))
        run.submit()
        run.start_launcher()
        run.wait_for_size(BASELINE, timeout=120)
        # 1. Into the 6 idle places, once they are idle.
        started = time.monotonic()
        run.kubectl("delete", "pod", filler, "--wait=false")
        run.wait_for_size(MAXIMUM, timeout=180)
        grew_after = time.monotonic() - started
        pods = opportunistic_pods(run)
        assert len(pods) == MAXIMUM - BASELINE, sorted(pods)
        assert {p["spec"].get("priorityClassName") for p in pods.values()} == {
            "mpijob-elastic-opportunistic"
        }
        assert {p["spec"].get("priority") for p in pods.values()} == {-100}
        wait_for(
            lambda: elastic_status(run).get("opportunistic") == MAXIMUM - BASELINE,
            20,
            "status.elastic.opportunistic",
        )
        assert elastic_status(run)["baseline"] == BASELINE
        grew = events(run, "Grew")
        assert grew
        assert all("into idle capacity" in m for m in grew), grew
        table = run.kubectl("get", "mpijob", run.job, "-o", "wide")
        assert "OPPORTUNISTIC" in table.splitlines()[0], table
        # 2. A workload of higher priority needs 6 places: the scheduler preempts.
        since = time.time()
        created = time.monotonic()
        for name in high:
            run.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(higher_priority_pod(name, node, resource, _times(share, 3))),
            )

        def high_running() -> bool:
            out = json.loads(run.kubectl("get", "pods", "-l", "app=capacity-e2e", "-o", "json"))
            return len(out["items"]) == len(high) and all(
                p["status"].get("phase") == "Running" for p in out["items"]
            )

        wait_for(high_running, 120, "the higher-priority pods running")
        waited = time.monotonic() - created
        run.wait_for_size(BASELINE, timeout=60)
        nothing_fatal(run, since)
        assert run.driver_events(ev.HOST_BLACKLISTED) == []
        preempted = events(run, "Preempted")
        assert preempted
        # Each victim named once, in one Event or another, with the higher-priority pod
        # the scheduler preempted it for (its own Event names it: docs/capacity.md).
        named = [
            (victim, by)
            for m in preempted
            for group in m.removeprefix("opportunistic workers ")
            .split("; they leave")[0]
            .split("; ")
            for victim in group.partition(" preempted by ")[0].split(", ")
            for by in [group.partition(" preempted by ")[2]]
        ]
        assert sorted(n for n, _ in named) == sorted(pods), preempted
        # By name where the scheduler's Event carries the preemptor as its related object,
        # by UID where it does not (kind's scheduler starts before the API server serves
        # events.k8s.io and records through core/v1: app/preemptions.py).
        listed = json.loads(run.kubectl("get", "pods", "-l", "app=capacity-e2e", "-o", "json"))
        uids = [p["metadata"]["uid"] for p in listed["items"]]
        takers = {f"{run.namespace}/{name}" for name in high} | {f"pod {u}" for u in uids}
        # Or, where the scheduler's Event came more than preemptors.WAIT (5 s) after the
        # condition, the documented stand-in (docs/capacity.md; seen once on kind).
        unnamed = {by for _, by in named if by.startswith("the scheduler for a pod of higher")}
        assert {by for _, by in named} - unnamed <= takers, preempted
        by_name = sum(by not in unnamed for _, by in named)
        print(f"FIGURE preemptors named: {by_name} of {len(named)} victims")
        # 3. They finish: the job grows back into the room.
        run.kubectl("delete", "pod", *high, "--wait=true")
        back = time.monotonic()
        run.wait_for_size(MAXIMUM, timeout=240)
        regrown = time.monotonic() - back
        nothing_fatal(run)
        assert run.driver_events(ev.HOST_BLACKLISTED) == []
        print(
            f"FIGURE grew to {MAXIMUM} in {grew_after:.1f}s; higher-priority pods Running "
            f"{waited:.1f}s after create; grew back {regrown:.1f}s after they went"
        )
    finally:
        run.kubectl("delete", "pod", filler, *high, "--ignore-not-found", check=False)
        run.close()
        # Its workers fill the node: the next test needs the room.
        run.kubectl("delete", "mpijob", run.job, "--ignore-not-found", "--wait=false", check=False)


def slow_run(
    cluster: Cluster,
    namespace: str,
    name: str,
    node: str,
    resource: str,
    share: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> ElasticRun:
    """An opportunistic job whose ranks take ``STEP_START`` to join and print the commit
    marker."""
    args = mock_driver_args(DRIVER_ARGS, rank_start_seconds=STEP_START, commit_marker=True)
    return ElasticRun(
        cluster,
        namespace,
        opportunistic_job(name, node, resource, share, args),
        tmp_path_factory.mktemp(name),
        driver_args=args,
        in_cluster=IN_CLUSTER,
    )


def test_growth_into_room_there_from_the_start_joins_the_first_ranks(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Issue 30, the driver's first reset: the idle room comes as the driver starts (on
    kind it was there from the job's creation, and the growth came 2 s after the driver
    started), so the growth is written while the driver's first ranks start, which take
    ``STEP_START`` to join. Written during that reset, the change was lost: the grown
    workers stayed idle until the next change. It must wait for the reset to end, and no
    host update may be lost."""
    node = colocation_node(cluster)
    resource, share = room(cluster, node)
    run = slow_run(cluster, e2e_namespace, "first-reset", node, resource, share, tmp_path_factory)
    filler = "filler-first-reset"
    try:
        place_filler(run, filler, node, resource, _times(share, MAXIMUM - BASELINE))
        run.submit()
        run.start_launcher()
        wait_for(lambda: run.driver_events(ev.PROBE_STARTED), 120, "the driver's start-up probe")
        run.kubectl("delete", "pod", filler, "--wait=false")
        run.wait_for_size(MAXIMUM, timeout=240)
        nothing_fatal(run)
        (first, *_) = run.driver_events(ev.JOB_STARTED)
        (joined, *_) = run.driver_events(ev.RANK_RUNNING)
        grown = [e for e in run.driver_events(ev.DISCOVERY) if len(e["hosts"]) > BASELINE]
        assert grown, "the driver never saw the growth"
        assert grown[0]["ts"] >= joined["ts"], "the growth was listed during the first reset"
        print(
            f"\nFIGURE first reset: job started at 0, first rank joined at "
            f"{joined['ts'] - first['ts']:.1f} s, growth seen by the driver at "
            f"{grown[0]['ts'] - first['ts']:.1f} s"
        )
    finally:
        run.kubectl("delete", "pod", filler, "--ignore-not-found", check=False)
        run.close()
        run.kubectl("delete", "mpijob", run.job, "--ignore-not-found", "--wait=false", check=False)


def test_a_growth_step_preempted_while_its_ranks_start_costs_no_failure(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess | None,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Issue 30: a growth step's workers are listed, Horovod's reset starts their ranks,
    which take ``STEP_START`` to join, and a higher-priority workload preempts them at
    once. Unlisted during the reset, the notice would be dropped and the ranks would die
    assigned at the end of their grace period; so they stay listed until the reset ends
    (their commit marker), then leave at their next commit, inside the grace period.
    A pod of priority 0 holds the idle room until the job trains at its baseline, so that
    the growth step is a reset of a running job, not part of its first start."""
    node = colocation_node(cluster)
    resource, share = room(cluster, node)
    run = slow_run(
        cluster, e2e_namespace, "growth-preempted", node, resource, share, tmp_path_factory
    )
    idle = MAXIMUM - BASELINE
    filler, high = "filler-growth", "high-growth"
    try:
        place_filler(run, filler, node, resource, _times(share, idle))
        run.submit()
        run.start_launcher()
        baseline = run.wait_for_size(BASELINE, timeout=120)
        # 1. The room comes back: a growth step, whose ranks Horovod's reset starts.
        freed = time.time()
        run.kubectl("delete", "pod", filler, "--wait=false")

        def step_starting() -> set[str] | None:
            started = {
                e["host"]
                for e in run.driver_events(ev.RANK_STARTED)
                if e["ts"] >= freed and e["host"] not in baseline
            }
            step = set(run.discovered()) - baseline
            return started if step and step <= started else None

        growth = wait_for(step_starting, 120, "a growth step's ranks starting on all its hosts")
        if IN_CLUSTER:
            # The case is ranks in their slow start. A preemption before a rank's exec has
            # reached its container is another: nothing runs in it yet, so the worker's
            # command ends at SIGTERM and the exec is refused, which ends the job at the
            # Gloo timeout (seen on kind; docs/membership.md, "What is left").
            ids = {
                e["host"]: e["rank_id"]
                for e in run.driver_events(ev.RANK_STARTED)
                if e["host"] in growth
            }

            def in_containers() -> bool:
                # A process of the container whose command line names the rank; the
                # bracket keeps grep's own command line from matching.
                return all(
                    run.cluster.kubectl(
                        "exec", "-n", run.namespace, host, "--",
                        "sh", "-c", f"grep -qs '[{rank_id[0]}]{rank_id[1:]}' /proc/[0-9]*/cmdline",
                        check=False,
                    ).returncode == 0
                    for host, rank_id in ids.items()
                )  # fmt: skip

            wait_for(in_containers, 30, "the step's ranks running in their containers")
        else:
            # KWOK keeps a deleted pod Terminating only while a rank marks it: a container
            # with a rank exec'd in it does so on a real node from the exec's start.
            def marked() -> bool:
                pods = opportunistic_pods(run)
                return all(
                    any(
                        k.startswith(RANK_ANNOTATION_PREFIX)
                        for k in p["metadata"].get("annotations", {})
                    )
                    for n, p in pods.items()
                    if n in growth
                )

            try:
                wait_for(marked, 30, "the step's ranks marking their pods")
            except AssertionError as exc:
                out = (run.workdir / "driver.out").read_text(errors="replace")
                said = [
                    line
                    for line in out.splitlines()
                    if any(f"[{host}/" in line and "!]" in line for host in growth)
                ]
                raise AssertionError(f"{exc}; the ranks' stderr: {said[-20:]}") from exc
        since = time.time()
        joined = {e["host"] for e in run.driver_events(ev.RANK_RUNNING)}
        assert not growth & joined, "the ranks joined before the preemption"
        # 2. At once, a higher-priority pod takes every idle and opportunistic place.
        pod = higher_priority_pod(high, node, resource, _times(share, idle))
        run.kubectl("apply", "-f", "-", input=json.dumps(pod))
        run.wait_for_size(BASELINE, timeout=120)
        wait_for(
            lambda: run.ranks_running_on() == set(run.discovered()) == baseline,
            60,
            "the baseline alone trains",
        )
        nothing_fatal(run, since)
        assert run.driver_events(ev.HOST_BLACKLISTED) == []
        # The step's ranks joined the reset and were let go by the driver, never failed.
        stopped = {e["host"] for e in run.driver_events(ev.RANK_STOPPED) if e["ts"] >= since}
        assert growth <= stopped, (growth, stopped)
        assert events(run, "Preempted")
        print(f"FIGURE growth step {sorted(growth)} preempted while starting: let go, 0 failures")
    finally:
        run.kubectl("delete", "pod", filler, high, "--ignore-not-found", check=False)
        run.close()
        run.kubectl("delete", "mpijob", run.job, "--ignore-not-found", "--wait=false", check=False)
