"""End to end: gangs of the minimum under the scheduler-plugins coscheduling scheduler
(issue 23, docs/scheduling.md), on KWOK and on kind.

Two elastic jobs (3 to 4 workers each) whose minimums do not both fit on one node never
deadlock: one runs at its minimum or more, the other has no pod bound to a node; when the
first is deleted the waiting one starts, at 4 workers. The scheduler is scheduler-plugins'
``cmd/scheduler`` as a host process against the cluster's API server (tests/gang.py), the
controller runs with ``--gang-scheduler-name scheduler-plugins-scheduler``.

The node has room for exactly 5 workers: 5 GPUs on KWOK (a tainted node of the test's own,
each worker 1 GPU), a fifth of the kind worker node's free CPU each on kind (requests
only, as test_capacity.py does). On KWOK the controller is a local process; on kind
(``hack/e2e-kind.sh -k gang``) the installed Deployment gets the flag for the test (a patch
of its args, restored afterwards) and the launchers are real pods running the mock driver.
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.harness import in_cluster_job
from e2e.test_capacity import cpu_quantity, node_affinity, scarce_resources
from e2e.test_relocation import colocation_node
from mpijob_elastic.core import names
from mpijob_elastic.core.objects import podgroups
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for
from tests.gang import GANG_TAINT, bound, gang_node_manifest
from tests.integration.test_controller import Job

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"
MINIMUM, WANTED, ROOM = 3, 4, 5
DRIVER_ARGS = ("-np", str(WANTED), "--min-np", str(MINIMUM), "--max-np", str(WANTED))
CONTROLLER_NAMESPACE = "mpijob-elastic-system"
FLAG = "--gang-scheduler-name=scheduler-plugins-scheduler"


@pytest.fixture(scope="module")
def gang_controller(
    cluster: Cluster,
    e2e_namespace: str,
    scheduler_plugins: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """The controller with the gang flag, started after the PodGroup CRD is installed (it
    reads whether the CRD is served at its start)."""
    if not IN_CLUSTER:
        proc = ControllerProcess(
            cluster,
            (e2e_namespace,),
            tmp_path_factory.mktemp("controller") / "controller.log",
            args=(FLAG,),
        )
        proc.start()
        yield
        proc.stop()
        return
    deployment = ("-n", CONTROLLER_NAMESPACE, "deployment/mpijob-elastic")
    spec = json.loads(cluster.kubectl("get", *deployment, "-o", "json").stdout)
    args = spec["spec"]["template"]["spec"]["containers"][0]["args"]
    _set_args(cluster, [*args, FLAG])
    try:
        yield
    finally:
        _set_args(cluster, args)


def _set_args(cluster: Cluster, args: list[str]) -> None:
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    deployment = ("-n", CONTROLLER_NAMESPACE, "deployment/mpijob-elastic")
    cluster.kubectl("patch", *deployment, "--type=json", "-p", json.dumps(patch))
    cluster.kubectl("rollout", "status", *deployment, "--timeout=180s")
    # Ready is not leading: a new pod takes the Lease up to a lease period later, and
    # hack/e2e-kind.sh checks its holder after the suite.
    wait_for(functools.partial(_leader_is_current, cluster), 120, "a new pod leading")


def _leader_is_current(cluster: Cluster) -> bool:
    lease = json.loads(
        cluster.kubectl(
            "get", "lease", "mpijob-elastic", "-n", CONTROLLER_NAMESPACE, "-o", "json"
        ).stdout
    )
    holder = str(lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", CONTROLLER_NAMESPACE, "-o", "json",
            "-l", "app.kubernetes.io/name=mpijob-elastic",
        ).stdout
    )["items"]  # fmt: skip
    return any(
        p["metadata"]["name"] == holder and not p["metadata"].get("deletionTimestamp") for p in pods
    )


@pytest.fixture
def room(cluster: Cluster) -> Iterator[tuple[str, str, str]]:
    """The node with room for exactly ``ROOM`` workers, the scarce resource and one
    worker's share of it."""
    if not IN_CLUSTER:
        name = f"gang-{uuid.uuid4().hex[:8]}"
        cluster.apply(gang_node_manifest(name, ROOM))
        cluster.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")
        yield name, "nvidia.com/gpu", "1"
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        return
    node = colocation_node(cluster)
    # What earlier tests' jobs leave would free more room once gone: they go first.
    wait_for(functools.partial(_settled, cluster), 180, "earlier tests' namespaces and pods gone")
    status = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)["status"]
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-A", "-o", "json", f"--field-selector=spec.nodeName={node}"
        ).stdout
    )["items"]
    used = sum(
        cpu_quantity(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
        for p in pods
        if p["status"].get("phase") not in ("Succeeded", "Failed")
        for c in p["spec"]["containers"]
    )
    share = int((cpu_quantity(status["allocatable"]["cpu"]) - used) // ROOM)
    assert share >= 10, f"{node}: {share}m a worker is too little"
    yield node, "cpu", f"{share}m"


def _settled(cluster: Cluster) -> bool:
    """No namespace being deleted and no pod terminating."""
    namespaces = json.loads(cluster.kubectl("get", "namespaces", "-o", "json").stdout)["items"]
    pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    return not any(n["status"].get("phase") == "Terminating" for n in namespaces) and not any(
        p["metadata"].get("deletionTimestamp") for p in pods
    )


def gang_job(name: str, node: str, resource: str, share: str) -> dict[str, Any]:
    """The sample, 3 to 4 workers, wanting 4, every worker on ``node`` asking for one
    share, the launcher elsewhere."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    if IN_CLUSTER:
        in_cluster_job(
            job, os.environ["E2E_LAUNCHER_IMAGE"], os.environ["E2E_WORKER_IMAGE"], DRIVER_ARGS
        )
    job["metadata"]["name"] = name
    job["metadata"]["annotations"].update(
        {names.ANN_MIN_REPLICAS: str(MINIMUM), names.ANN_MAX_REPLICAS: str(WANTED)}
    )
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replicas"] = WANTED
    worker = specs["Worker"]["template"]["spec"]
    worker["affinity"] = node_affinity(node, "In")
    worker["tolerations"] = [{"key": GANG_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    for container in worker["containers"]:
        container["resources"] = scarce_resources(resource, share)
    specs["Launcher"]["template"]["spec"]["affinity"] = node_affinity(node, "NotIn")
    return job


def _at_size(job: Job, n: int) -> bool:
    """``n`` workers listed in discover_hosts.sh, each Running."""
    pods = job.pods()
    return (
        len(job.hosts()) == n
        and sum(p["status"].get("phase") == "Running" for p in pods.values()) >= n
    )


def _all_pods(job: Job) -> dict[str, dict[str, Any]]:
    return {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}


def test_gang_two_jobs_whose_minimums_do_not_both_fit_never_deadlock(
    cluster: Cluster,
    e2e_namespace: str,
    gang_controller: None,
    room: tuple[str, str, str],
) -> None:
    node, resource, share = room
    first, second = Job(cluster, e2e_namespace, "gang-a"), Job(cluster, e2e_namespace, "gang-b")
    created = time.monotonic()
    first.create(gang_job(first.name, node, resource, share))
    second.create(gang_job(second.name, node, resource, share))
    try:
        for job in (first, second):
            # Generous: under a load of 14 the two gangs' pods took longer than 60 s.
            wait_for(functools.partial(_all_pods, job), 150, f"{job.name} pods")
            for pod in _all_pods(job).values():
                assert pod["metadata"]["labels"][podgroups.SCHEDULER_PLUGINS_LABEL] == job.name
                assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"

        # One job runs at its minimum or more; the other has no pod on a node.
        def one_runs() -> bool:
            return max(len(first.hosts()), len(second.hosts())) >= MINIMUM

        wait_for(one_runs, 180, "one job at its minimum")
        running, waiting = (first, second) if len(first.hosts()) >= MINIMUM else (second, first)
        wait_for(lambda: _at_size(running, WANTED), 120, f"{running.name} at {WANTED}")
        started = time.monotonic() - created
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert len(running.hosts()) >= MINIMUM, running.hosts()
            assert bound(_all_pods(waiting)) == [], bound(_all_pods(waiting))
            assert waiting.hosts() == []
            time.sleep(1)

        # Room appears: the running job goes; the waiting one starts at 4.
        deleted = time.monotonic()
        cluster.kubectl("delete", names.PLURAL, running.name, "-n", e2e_namespace, "--wait=false")
        gone: float | None = None
        while not _at_size(waiting, WANTED):
            assert time.monotonic() - deleted < 180, f"{waiting.name}: {waiting.hosts()}"
            if gone is None and not running.pods() and not running.pods(names.ROLE_LAUNCHER):
                gone = time.monotonic()
            time.sleep(0.2)
        grown = time.monotonic()
        assert len(bound(waiting.pods())) == WANTED
        # ROOM holds WANTED and one more: the last of the deleted job's pods may still be
        # terminating when the other job is at its size. It goes all the same.
        if gone is None:
            wait_for(
                lambda: not running.pods() and not running.pods(names.ROLE_LAUNCHER),
                120,
                f"{running.name}'s pods gone",
            )
            gone = time.monotonic()
        print(
            f"FIGURE ({'kind' if IN_CLUSTER else 'KWOK'}) {running.name} at {WANTED} "
            f"{started:.1f}s after create; {waiting.name} held no node; "
            f"{running.name} deleted -> its pods gone {gone - deleted:.2f}s -> "
            f"{waiting.name} at {WANTED} workers Running and listed {grown - gone:+.2f}s from then "
            f"({grown - deleted:.2f}s from the delete)"
        )
    finally:
        for job in (first, second):
            cluster.kubectl("delete", names.PLURAL, job.name, "-n", e2e_namespace, check=False)
