"""Two controller processes on one Lease: one writes, the other takes over when it goes.

Both run with ``--leader-elect`` and debug logs, where every request that can change the
cluster is one ``api write`` line, and every access or token review, which changes
nothing, one ``api check`` line (kube.py): who wrote what is read from the two logs, and
what the API server holds is read from the server itself. The Lease has client-go's
default timings (15 s lease, 10 s renew deadline, 2 s retry).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.app.leader import Timings
from mpijob_elastic.core import names
from mpijob_elastic.core.actions import AnnotatePod, Phase, Writes
from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.kube import ApiError, Kube
from mpijob_elastic.machinery.writer import Writer
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, StartController, free_port, wait_for
from tests.faults import proxied_kubeconfig, tcp_proxy
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_health import get

pytestmark = pytest.mark.usefixtures("crd")

LEASE = "mpijob-elastic"
TIMINGS = Timings()
# Generous, from the lease duration: a take-over must not need the lease to expire twice.
TAKE_OVER_BOUND = 3 * TIMINGS.lease_duration


@pytest.fixture
def job(cluster: Cluster, namespace: str) -> Job:
    return Job(cluster, namespace, "ha")


def elected(namespace: str, port: int) -> tuple[str, ...]:
    return (
        "--leader-elect",
        "--leader-elect-resource-namespace",
        namespace,
        "--log-level",
        "debug",
        "--health-port",
        str(port),
    )


def identity(proc: ControllerProcess) -> str:
    # A process that has just started may not have said it yet (a loaded machine).
    def said() -> str | None:
        entries = proc.log_entries()
        return next((e["identity"] for e in entries if e.get("msg") == "waiting to lead"), None)

    return str(wait_for(said, what="its 'waiting to lead' line"))


def holder(cluster: Cluster, namespace: str) -> str:
    lease = cluster.raw(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"
    )
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def writes(proc: ControllerProcess, since: float = 0.0) -> list[dict[str, Any]]:
    """The process's writes, the Lease's own left out."""
    return [
        e
        for e in proc.log_entries()
        if e.get("msg") == "api write" and "/leases" not in e["path"] and e["ts"] >= since
    ]


def lines(proc: ControllerProcess, msg: str) -> list[dict[str, Any]]:
    return [e for e in proc.log_entries() if e.get("msg") == msg]


def became_leader(proc: ControllerProcess) -> float | None:
    found = [e["ts"] for e in proc.log_entries() if e.get("msg") == "became the leader"]
    return float(found[-1]) if found else None


def pair(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> tuple[ControllerProcess, ControllerProcess, dict[str, int]]:
    """Two elected controllers; (leader, standby, health port by identity)."""
    ports = [free_port(), free_port()]
    procs = [start_controller(namespace, args=elected(namespace, port)) for port in ports]
    ids = [identity(p) for p in procs]
    lead = wait_for(lambda: holder(cluster, namespace) in ids and holder(cluster, namespace))
    leader, standby = procs if ids[0] == lead else procs[::-1]
    wait_for(lambda: became_leader(leader), what="the holder to log that it leads")
    return leader, standby, dict(zip(ids, ports, strict=True))


def victims_marked(job: Job, victims: list[str]) -> bool:
    pods = job.pods()
    return all(
        names.ANN_DRAINING_SINCE in (pods.get(v, {}).get("metadata", {}).get("annotations") or {})
        for v in victims
    )


def deletes(procs: list[ControllerProcess], pod: str) -> list[dict[str, Any]]:
    return [
        e
        for p in procs
        for e in writes(p)
        if e["method"] == "DELETE" and e["path"].endswith(f"/pods/{pod}")
    ]


def test_only_the_lease_holder_writes_and_both_are_ready(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    leader, standby, ports = pair(cluster, job.ns, start_controller)
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    job.set_workers(3)
    job.wait_hosts(3)
    assert {e["method"] for e in writes(leader)} >= {"POST", "PATCH"}
    # Not one write line, the Lease's included (it found the Lease held, and only reads it):
    # its start-up check's access reviews are checks, which store nothing.
    assert lines(standby, "api write") == [], lines(standby, "api write")[:5]
    checks = lines(standby, "api check")
    assert checks, "the standby's start-up check made no access review"
    assert {e["path"].split("?")[0].rsplit("/", 1)[-1] for e in checks} == {
        "selfsubjectaccessreviews"
    }
    assert holder(cluster, job.ns) == identity(leader)
    # Both serve: the standby's caches are what a fast take-over needs.
    assert get(ports[identity(leader)], "/readyz") == (200, "ok\nleader\n")
    assert get(ports[identity(standby)], "/readyz") == (200, "ok\nstandby\n")


def test_sigkill_mid_scale_in_the_standby_finishes_it_deleting_each_victim_once(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    # Long enough that the leader is killed between the drain marks and the deletes, even
    # when the marks are seen late on a loaded machine (a delete went out as the leader
    # died, unlogged: once with 10 s, and once with 20 s in a full run at a load of 42).
    drain = 40.0
    leader, standby, _ = pair(cluster, job.ns, start_controller)
    job.create(elastic_job(job.name, 4, drain=f"{drain:g}"))
    job.wait_hosts(4)
    victims = [names.worker_name(job.name, i) for i in (1, 2, 3)]
    job.set_workers(1)
    wait_for(lambda: victims_marked(job, victims), 30, "the victims' drain marks")
    leader.stop(kill=True)
    killed = time.time()
    standing = [p for p, pod in job.pods().items() if not pod["metadata"].get("deletionTimestamp")]
    assert sorted(p for p in standing if p in victims) == victims, (
        "the leader deleted victims before it was killed: not a take-over mid-scale"
    )
    taken = wait_for(
        lambda: became_leader(standby), TAKE_OVER_BOUND, "the standby to take the lease"
    )
    print(f"FIGURE SIGKILL: the standby led {taken - killed:.1f}s after the kill")
    assert holder(cluster, job.ns) == identity(standby)
    job.wait_hosts(1, timeout=60)
    wait_for(lambda: job.workers() == [names.worker_name(job.name, 0)], 60, "victims gone")
    for victim in victims:
        found = deletes([leader, standby], victim)
        assert len(found) == 1, (victim, found)
        assert found[0]["ts"] >= taken  # the new leader's, after it took over
    assert deletes([leader], victims[0]) == []


def test_sigterm_releases_the_lease_and_the_standby_takes_over_at_once(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    leader, standby, _ = pair(cluster, job.ns, start_controller)
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    assert leader.proc is not None
    leader.stop()
    assert leader.proc.returncode == 0, leader.logs()[-3000:]
    released = [e["ts"] for e in leader.log_entries() if e.get("msg") == "released the lease"]
    assert released, "the leader did not release the lease"
    taken = wait_for(
        lambda: became_leader(standby), TAKE_OVER_BOUND, "the standby to take the lease"
    )
    print(f"FIGURE SIGTERM: the standby led {taken - released[0]:.1f}s after the release")
    # An expired lease would take a whole lease duration from the last renewal.
    assert taken - released[0] < TIMINGS.lease_duration
    # And it works: a scale the old leader never saw.
    job.set_workers(3)
    job.wait_hosts(3)
    assert writes(leader, since=released[0]) == []


def test_a_leader_that_cannot_renew_stops_and_exits_non_zero(
    cluster: Cluster, job: Job, start_controller: StartController, tmp_path: Path
) -> None:
    """The leader reaches the API server through a proxy that is cut: it cannot renew,
    gives up at the renew deadline, exits 1, and the other one takes over."""
    with tcp_proxy(cluster.kubeconfig) as proxy:
        via_proxy = Cluster(
            proxied_kubeconfig(cluster.kubeconfig, proxy.port, tmp_path / "proxied.kubeconfig"),
            cluster.kubectl_path,
        )
        first = ControllerProcess(
            via_proxy, (job.ns,), tmp_path / "first.log", elected(job.ns, free_port())
        )
        try:
            first.start()
            wait_for(lambda: became_leader(first), 30, "the first controller to lead")
            second = start_controller(job.ns, args=elected(job.ns, free_port()))
            proxy.cut()
            cut = time.time()
            assert first.proc is not None
            wait_for(lambda: first.proc is not None and first.proc.poll() is not None, 60)
            assert first.proc.returncode == 1
            (lost,) = [e for e in first.log_entries() if e.get("msg") == "lost the lease; exiting"]
            # It gave up at its renew deadline, before anyone could take its lease over.
            assert lost["ts"] - cut < TIMINGS.lease_duration
            taken = wait_for(lambda: became_leader(second), TAKE_OVER_BOUND, "a take-over")
            assert taken > lost["ts"]
            job.create(elastic_job(job.name, 2))
            job.wait_hosts(2)
        finally:
            first.stop()
            print(f"--- first controller log ---\n{first.logs()[-20000:]}")


def test_sigterm_before_the_caches_sync_ends_the_process_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A controller whose first lists cannot finish (the API server unreachable) holds no
    Lease and has written nothing: a rollout's SIGTERM must end it, not wait for a sync
    that may never come."""
    with tcp_proxy(cluster.kubeconfig) as proxy:
        proxy.cut()
        kubeconfig = proxied_kubeconfig(cluster.kubeconfig, proxy.port, tmp_path / "k")
        port = free_port()
        proc = subprocess.Popen(
            [
                *(
                    sys.executable,
                    "-m",
                    "mpijob_elastic.app.cli",
                    "run",
                    "--kubeconfig",
                    kubeconfig,
                ),
                *("--health-port", str(port), "--leader-elect"),
                *("--leader-elect-resource-namespace", "default"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: _answers(port), 60, "the health server")
            status, body = get(port, "/readyz")
            assert status == 503
            assert "caches not synced yet" in body
            proc.terminate()
            assert proc.wait(15) == 0
        finally:
            proc.kill()
            proc.wait()


def _answers(port: int) -> bool:
    try:
        return get(port, "/healthz")[0] == 200
    except OSError:
        return False


# -- fencing: a write planned on a stale view does not land -----------------------------------


async def test_a_drain_mark_planned_on_a_stale_pod_is_refused_and_not_reported(
    cluster: Cluster, job: Job
) -> None:
    """A former leader's drain mark, planned before someone else changed the pod, gets 409
    from the server instead of landing; the turn fails for a retry, with no condition or
    Event for the user (nothing is wrong with their job)."""
    job.create(elastic_job(job.name, 2))
    apis = clients.connect(
        await clients.load_configuration(cluster.kubeconfig), write_connections=2
    )
    try:
        kube = Kube(apis.write)
        pod = names.worker_name(job.name, 0)
        seen = await kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": job.ns},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            }
        )
        await kube.patch("Pod", job.ns, pod, {"metadata": {"labels": {"changed": "since"}}})
        mark = AnnotatePod(
            pod,
            {names.ANN_DRAINING_SINCE: "2026-01-01T00:00:00.000000Z"},
            seen["metadata"]["resourceVersion"],
        )
        writer = Writer(kube, lambda _obj: None)
        with pytest.raises(ApiError) as refused:
            await writer.run(
                await kube.list(names.KIND, job.ns, job.name),
                Writes((Phase("pod marks", (mark,)),)),
            )
        assert refused.value.conflict
    finally:
        await apis.close()
    now = cluster.raw("GET", f"/api/v1/namespaces/{job.ns}/pods/{pod}") or {}
    annotations = now["metadata"].get("annotations") or {}
    assert names.ANN_DRAINING_SINCE not in annotations
    assert job.get().get("status", {}).get("conditions") is None
    assert job.events() == []


# -- the shipped RBAC ------------------------------------------------------------------------

SYSTEM_NAMESPACE = "mpijob-elastic-system"
CONTROLLER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:mpijob-elastic"
CONFIG = Path(__file__).resolve().parents[2] / "config"


def can_i(cluster: Cluster, verb: str, what: str, namespace: str) -> str:
    proc = cluster.kubectl(
        "auth", "can-i", verb, what, "-n", namespace, "--as", CONTROLLER, check=False
    )
    return proc.stdout.strip()


@pytest.fixture
def shipped_rbac(cluster: Cluster) -> str:
    cluster.kubectl("apply", "-f", str(CONFIG / "manager" / "namespace.yaml"))
    cluster.kubectl("apply", "-k", str(CONFIG / "rbac"))
    return SYSTEM_NAMESPACE


@pytest.mark.parametrize(
    ("verb", "what", "where", "allowed"),
    [
        ("get", f"leases/{LEASE}", SYSTEM_NAMESPACE, "yes"),
        ("update", f"leases/{LEASE}", SYSTEM_NAMESPACE, "yes"),
        ("create", "leases", SYSTEM_NAMESPACE, "yes"),
        ("get", "leases/another", SYSTEM_NAMESPACE, "no"),
        ("update", "leases/another", SYSTEM_NAMESPACE, "no"),
        ("delete", f"leases/{LEASE}", SYSTEM_NAMESPACE, "no"),
        ("patch", f"leases/{LEASE}", SYSTEM_NAMESPACE, "no"),
        ("list", "leases", SYSTEM_NAMESPACE, "no"),
        ("create", "leases", "kube-system", "no"),
        ("update", f"leases/{LEASE}", "kube-system", "no"),
    ],
)
def test_the_lease_grants_are_this_name_in_this_namespace(
    cluster: Cluster, shipped_rbac: str, verb: str, what: str, where: str, allowed: str
) -> None:
    assert can_i(cluster, verb, what, where) == allowed


def test_the_shipped_service_account_can_lead(
    cluster: Cluster, shipped_rbac: str, job: Job, tmp_path: Path
) -> None:
    """With the ServiceAccount's own token (no admin rights), the Lease in its namespace is
    created and held, and the job is served."""
    as_controller = Cluster(
        cluster.service_account_kubeconfig(
            SYSTEM_NAMESPACE, "mpijob-elastic", tmp_path / "controller.kubeconfig"
        ),
        cluster.kubectl_path,
    )
    path = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE}"
    controller = ControllerProcess(
        as_controller,
        (job.ns,),
        tmp_path / "controller.log",
        ("--leader-elect", "--leader-elect-resource-namespace", SYSTEM_NAMESPACE),
    )
    try:
        controller.start()
        wait_for(lambda: became_leader(controller), 30, "the controller to lead")
        job.create(elastic_job(job.name, 2))
        job.wait_hosts(2)
        assert not [
            e
            for e in controller.log_entries()
            if e.get("msg") == "could not read or write the lease"
        ]
    finally:
        controller.stop()
        cluster.raw("DELETE", path)
        print(f"--- controller log ---\n{controller.logs()[-20000:]}")
