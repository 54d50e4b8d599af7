"""Membership on the real local cluster (issue 12): a fresh name after a crash, a Pending
victim removed first and at once, a named scale-in, and a drain that ends when the
launcher no longer reaches the victim.

The launcher's remote shells are played by ``RemoteShells`` (tests/controller.py).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.hosts import host_rules
from mpijob_elastic.core.inputs import ranks
from tests.cluster import Cluster
from tests.controller import RemoteShells, StartController, free_port, wait_for
from tests.integration.test_controller import (
    SHORT_GLOO_TIMEOUT,
    Job,
    elastic_job,
    short_resets,
)
from tests.integration.test_observability import Scrape

pytestmark = pytest.mark.usefixtures("crd")

NODES = [f"kwok-node-{i}" for i in range(4)]
# A taint no pod tolerates and that says nothing about the node going away: new pods stay
# Pending, running ones stay (a cordon would make elastic jobs move their workers).
FULL_KEY = "example.com/full"
FULL = f"{FULL_KEY}=:NoSchedule"


def fill(cluster: Cluster) -> None:
    """Taint every node, and return once the scheduler has seen every taint. It learns of
    them by its Node watch, which a loaded API server delivers seconds late: a pod created
    in between was bound to a node already tainted (a CI run, 2026-12-07). A probe pod that
    asks for nothing proves it: found no node, or, bound, tried again."""
    for node in NODES:
        cluster.kubectl("taint", "node", node, FULL)
    path = "/api/v1/namespaces/default/pods"

    def probe_refused() -> bool:
        name = f"fill-probe-{uuid.uuid4().hex[:8]}"
        container = {"name": "probe", "image": "probe"}
        pod = {"metadata": {"name": name}, "spec": {"containers": [container]}}
        cluster.raw("POST", path, {"apiVersion": "v1", "kind": "Pod", **pod})
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got = cluster.raw("GET", f"{path}/{name}") or {}
                if (got.get("spec") or {}).get("nodeName"):
                    return False
                for c in (got.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                        return True
                time.sleep(0.2)
            return False
        finally:
            cluster.raw("DELETE", f"{path}/{name}", {"gracePeriodSeconds": 0})

    wait_for(probe_refused, 60, f"the scheduler to find no node for a pod once {NODES} are tainted")


def unfill(cluster: Cluster) -> None:
    for node in NODES:
        cluster.kubectl("taint", "node", node, f"{FULL_KEY}-", check=False)


@pytest.fixture
def job(cluster: Cluster, shared_namespace: str) -> Job:
    # A name no other test uses: the remote shells are this machine's processes. In a
    # namespace of the module's shared controller (tests/controller.py).
    return Job(cluster, shared_namespace, "member")


def running_launcher(job: Job) -> None:
    wait_for(
        lambda: any(
            (p.get("status") or {}).get("phase") == "Running"
            for p in job.pods(names.ROLE_LAUNCHER).values()
        ),
        30,
        "launcher running",
    )


def running_with_shells(job: Job, shells: RemoteShells, workers: int) -> None:
    """An elastic job with a 30 s drain, its launcher running, a remote shell into each
    worker (a controller watches ``job.ns``)."""
    job.create(elastic_job(job.name, workers, drain="30"))
    job.wait_hosts(workers)
    running_launcher(job)
    shells.attach(job.ns, job.name)
    for i in range(workers):
        shells.start(names.worker_name(job.name, i))


def hosts(job: Job, *indexes: int) -> list[str]:
    return [f"{job.name}-worker-{i}:1" for i in indexes]


def test_a_crashed_worker_is_replaced_under_a_fresh_name(cluster: Cluster, job: Job) -> None:
    manifest = short_resets(elastic_job(job.name, 3))
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    job.create(manifest)
    job.wait_hosts(3)
    cluster.kubectl(
        "annotate",
        "pod",
        f"{job.name}-worker-1",
        "-n",
        job.ns,
        "kwok.mpijob-elastic.io/exit-code=137",
    )
    wait_for(lambda: job.hosts() == hosts(job, 0, 2, 3), 20, "worker-3 in place of worker-1")
    cm = cluster.raw(
        "GET", f"/api/v1/namespaces/{job.ns}/configmaps/{names.config_map_name(job.name)}"
    )
    assert cm is not None
    assert cm["metadata"]["annotations"][names.ANN_RETIRED_WORKERS] == "1"
    assert job.get()["status"]["elastic"]["retired"] == "1"
    job.wait_event("WorkerRetired")
    # A later scale-up never hands the retired name out again.
    job.set_workers(4)
    # No launcher runs ranks here, so nothing shows that worker-3 joined Horovod's reset:
    # the next host-list change waits out the reset bound (host_rules.reset_bound) from its start.
    wait_for(
        lambda: job.hosts() == hosts(job, 0, 2, 3, 4),
        host_rules.reset_bound(SHORT_GLOO_TIMEOUT).total_seconds() + 20,
        "scaled up to 4",
    )


def test_a_pending_victim_goes_first_and_at_once(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 2, drain="60"))
    job.wait_hosts(2)
    try:
        fill(cluster)
        job.set_workers(3)
        wait_for(lambda: f"{job.name}-worker-2" in job.workers(), 10, "worker-2 created")
        time.sleep(1)
        assert (job.pods()[f"{job.name}-worker-2"].get("status") or {}).get("phase") == "Pending"
        edited = time.monotonic()
        job.set_workers(2)
        wait_for(lambda: f"{job.name}-worker-2" not in job.workers(), 10, "Pending victim gone")
        took = time.monotonic() - edited
    finally:
        unfill(cluster)
    print(f"FIGURE pending victim deleted {took:.2f}s after the edit (drain 60s)")
    assert took < 10
    assert job.hosts() == hosts(job, 0, 1)
    assert job.workers() == [f"{job.name}-worker-0", f"{job.name}-worker-1"]


def test_a_named_scale_in_removes_exactly_the_named_workers(job: Job, shells: RemoteShells) -> None:
    # A drain of 10 s: long enough to see the Scaling condition name the workers.
    job.create(short_resets(elastic_job(job.name, 4, drain="10")))
    job.wait_hosts(4)
    uids = job.uids()
    named = [f"{job.name}-worker-0", f"{job.name}-worker-2"]
    job.patch(
        {
            "metadata": {"annotations": {names.ANN_REMOVE_WORKERS: ",".join(named)}},
            "spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 2}}},
        }
    )
    # No rank signal (no remote shell runs): the workers just listed count as holding
    # ranks only the reset bound (host_rules.reset_bound) after they started, and until
    # then the list does not change again (one change at a time).
    wait_for(
        lambda: job.hosts() == hosts(job, 1, 3),
        host_rules.reset_bound(SHORT_GLOO_TIMEOUT).total_seconds() + 20,
        "named workers out of discovery",
    )
    # The status is written after the host list, in the same turn.
    wait_for(
        lambda: (
            f"{named[0]} (named for removal, until"
            in (job.condition("Scaling") or {}).get("message", "")
        ),
        10,
        "the Scaling condition naming the workers",
    )
    # No remote shell of the launcher reaches them (none runs at all here: signal
    # unreadable), so they wait out their drain; the others are never touched.
    wait_for(lambda: sorted(job.uids()) == sorted(set(uids) - set(named)), 45, "named deleted")
    assert job.uids() == {n: u for n, u in uids.items() if n not in named}


def test_a_drain_ends_once_the_launcher_no_longer_reaches_the_victim(
    job: Job, shells: RemoteShells
) -> None:
    running_with_shells(job, shells, 3)
    job.set_workers(1)
    edited = time.monotonic()
    wait_for(lambda: job.hosts() == hosts(job, 0), 10, "victims out of discovery")
    # worker-1's rank leaves at once; worker-2's stays for a while.
    left = shells.end(f"{job.name}-worker-1")
    wait_for(lambda: f"{job.name}-worker-1" not in job.workers(), 15, "worker-1 deleted")
    gone = time.monotonic()
    assert f"{job.name}-worker-2" in job.workers(), "a victim still reached was deleted"
    time.sleep(3)
    assert f"{job.name}-worker-2" in job.workers(), "a victim still reached was deleted"
    left2 = shells.end(f"{job.name}-worker-2")
    wait_for(lambda: f"{job.name}-worker-2" not in job.workers(), 15, "worker-2 deleted")
    gone2 = time.monotonic()
    print(
        f"FIGURE drain 30s: worker-1 deleted {gone - edited:.2f}s after the edit, "
        f"{gone - left:.2f}s after its rank left; worker-2 {gone2 - left2:.2f}s after its "
        f"rank left ({gone2 - edited:.2f}s after the edit)"
    )
    assert gone - edited < 10
    # Past its floor, a victim goes as soon as the launcher reports its rank's end, not at
    # its deadline (30 s). The report takes a watch event and a turn: 2.04 s on a loaded
    # machine (load 15), hence the margin.
    assert gone2 - left2 < 5
    assert job.workers() == [f"{job.name}-worker-0"]


def test_without_reports_a_drain_ends_on_an_exec_read_of_the_launcher(
    job: Job, shells: RemoteShells
) -> None:
    """The reports say nothing of the victims (their remote shells report nothing): the
    controller reads the launcher's process list instead, as before the reports."""
    job.create(elastic_job(job.name, 3, drain="30"))
    job.wait_hosts(3)
    running_launcher(job)
    for i in range(3):
        shells.start_silent(names.worker_name(job.name, i))
    job.set_workers(1)
    wait_for(lambda: job.hosts() == hosts(job, 0), 10, "victims out of discovery")
    time.sleep(4)  # past the floor, with both victims still reached
    assert {f"{job.name}-worker-1", f"{job.name}-worker-2"} <= set(job.workers())
    left = shells.end(f"{job.name}-worker-1")
    wait_for(lambda: f"{job.name}-worker-1" not in job.workers(), 10, "worker-1 deleted")
    print(f"FIGURE no reports: victim deleted {time.monotonic() - left:.2f}s after its rank left")
    assert f"{job.name}-worker-2" in job.workers(), "a victim still reached was deleted"


def test_a_rank_that_dies_under_a_live_pod_retires_its_worker(
    cluster: Cluster, job: Job, shells: RemoteShells
) -> None:
    """A rank process crashes (an OOM kill of the rank, not of the container): the pod runs
    on and stays listed, but Horovod has blacklisted its name. The launcher's kubexec.sh
    reports the remote shell into it ending while the others go on."""
    running_with_shells(job, shells, 3)
    ranks = names.ranks_name(job.name)
    path = f"/api/v1/namespaces/{job.ns}/configmaps/{ranks}"

    def reported() -> list[str]:
        report = cluster.raw("GET", path) or {}
        return sorted(report.get("data") or {})

    def starts() -> list[str]:
        return [k for k in reported() if not k.endswith(("_exit", "_committed"))]

    wait_for(lambda: len(starts()) == 3, 20, "three starts reported")
    crashed = shells.end(f"{job.name}-worker-1")
    wait_for(lambda: job.hosts() == hosts(job, 0, 2, 3), 20, "replaced")
    print(f"FIGURE dead rank's worker replaced {time.monotonic() - crashed:.2f}s after")
    assert f"{job.name}-worker-1" not in job.workers()
    job.wait_event("WorkerRetired")
    exits = [key for key in reported() if key.endswith("_exit")]
    assert len(exits) == 1
    assert exits[0].startswith(f"{job.name}-worker-1_")


def test_an_idle_running_job_makes_no_request(
    cluster: Cluster,
    namespace: str,
    start_controller: StartController,
    shells: RemoteShells,
    metrics_token: str,
) -> None:
    """Ranks run, nothing changes: no reconcile (so no exec into the launcher, no write),
    where the launcher used to be read every 15 s."""
    # Its own controller: the count of reconciles is the whole process's.
    job = Job(cluster, namespace, "member")
    port = free_port()
    start_controller(job.ns, args=("--metrics-port", str(port)))
    job.create(elastic_job(job.name, 2, drain="30"))
    job.wait_hosts(2)
    running_launcher(job)
    shells.attach(job.ns, job.name)
    for i in range(2):
        shells.start(names.worker_name(job.name, i))
    time.sleep(3)
    before = Scrape(port, metrics_token).value("mpijob_elastic_reconciles_total", result="success")
    time.sleep(20)
    after = Scrape(port, metrics_token).value("mpijob_elastic_reconciles_total", result="success")
    assert before > 0
    assert after == before


def test_a_long_runs_reports_are_compacted_while_the_launcher_runs(
    cluster: Cluster, job: Job, shells: RemoteShells, tmp_path: Path
) -> None:
    """Issue 31 §2: every remote shell leaves its reports in ``<job>-ranks``; a long
    elastic run filled its 1 MiB, and the launcher's reports stopped. The launcher (its
    own ServiceAccount, its own right) reports a thousand and more shells that ended: the
    controller keeps the running ones and each host's latest, and the ranks read the same."""
    running_with_shells(job, shells, 2)
    path = f"/api/v1/namespaces/{job.ns}/configmaps/{names.ranks_name(job.name)}"

    def reported() -> dict[str, str]:
        return dict((cluster.raw("GET", path) or {}).get("data") or {})

    running = {k for k in reported() if not k.endswith(("_exit", "_committed"))}
    old = int(time.time()) - 86_400
    ended = {
        f"{job.name}-worker-{n % 2}_{100 + n}_{old + n}{suffix}": value
        for n in range(ranks.COMPACT_AT // 2)
        for suffix, value in (("", "start"), ("_committed", str(old + n)), ("_exit", "0"))
    }
    kubeconfig = cluster.service_account_kubeconfig(
        job.ns, f"{job.name}-launcher", tmp_path / "launcher.kubeconfig"
    )
    cluster.kubectl(
        "--kubeconfig", kubeconfig, "patch", "configmap", names.ranks_name(job.name),
        "-n", job.ns, "--type=merge", "-p", json.dumps({"data": ended}),
    )  # fmt: skip
    wait_for(lambda: len(reported()) < 20, 20, "the reports compacted")
    kept = reported()
    assert running <= set(kept), (running, sorted(kept))
    latest = {f"{job.name}-worker-{n % 2}_{100 + n}_{old + n}" for n in (498, 499)}
    assert latest <= set(kept), sorted(kept)
    # Nothing the ranks said changed: both workers still hold ranks, none was lost.
    assert job.hosts() == hosts(job, 0, 1)
    labelled = {
        n
        for n, p in job.pods().items()
        if (p["metadata"].get("labels") or {}).get(names.LABEL_HOLDS_RANKS) == "true"
    }
    assert labelled == {names.worker_name(job.name, i) for i in range(2)}
