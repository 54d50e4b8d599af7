"""runPolicy on the real local cluster (issue 7, part 4): the active deadline fails the job
and cleanPodPolicy cleans up; a finished job goes after its TTL; a launcher killed by a
signal is started again until backoffLimit; gang scheduling is reported as unsupported.
(runPolicy.suspend: tests/integration/test_suspend.py.)"""

from __future__ import annotations

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_membership import running_launcher

pytestmark = pytest.mark.usefixtures("crd")

# tests/cluster's KWOK stages end a pod with this exit code when it carries the annotation.
EXIT_CODE = "kwok.mpijob-elastic.io/exit-code"


@pytest.fixture
def job(cluster: Cluster, shared_namespace: str) -> Job:
    """A job in a namespace of the module's shared controller (tests/controller.py)."""
    return Job(cluster, shared_namespace, "policy")


def is_true(job: Job, type_: str) -> bool:
    return (job.condition(type_) or {}).get("status") == "True"


def end_launcher(cluster: Cluster, job: Job, code: int) -> str:
    """The launcher's program exits with ``code``; returns the pod's UID."""
    name = names.launcher_name(job.name)
    uid = str(job.pods(names.ROLE_LAUNCHER)[name]["metadata"]["uid"])
    cluster.kubectl("annotate", "pod", name, "-n", job.ns, f"{EXIT_CODE}={code}")
    return uid


def test_the_active_deadline_fails_the_job(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 2)
    manifest["spec"]["runPolicy"] = {"activeDeadlineSeconds": 4, "cleanPodPolicy": "Running"}
    job.create(manifest)
    job.wait_hosts(2)
    wait_for(lambda: is_true(job, "Failed"), 15, "Failed at the deadline")
    failed = job.condition("Failed") or {}
    assert failed["reason"] == "MPIJobFailed"
    assert "active longer than specified deadline" in failed["message"]
    wait_for(lambda: not job.pods() and not job.pods(names.ROLE_LAUNCHER), 15, "pods cleaned up")


def test_a_finished_job_is_deleted_after_its_ttl(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 1)
    manifest["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 2}
    job.create(manifest)
    job.wait_hosts(1)
    running_launcher(job)
    end_launcher(cluster, job, 0)
    wait_for(lambda: is_true(job, "Succeeded"), 15, "Succeeded")
    path = f"{job.path}/{job.name}"
    wait_for(lambda: cluster.raw("GET", path) is None, 20, "the job deleted after its TTL")


def test_a_launcher_killed_by_a_signal_restarts_until_the_backoff_limit(
    cluster: Cluster, job: Job
) -> None:
    manifest = elastic_job(job.name, 2)
    manifest["spec"]["runPolicy"] = {"backoffLimit": 1}
    manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "ExitCode"
    job.create(manifest)
    job.wait_hosts(2)
    running_launcher(job)
    workers = job.uids()
    first = end_launcher(cluster, job, 137)

    def restarted() -> bool:
        pods = job.pods(names.ROLE_LAUNCHER)
        return any(
            p["metadata"]["uid"] != first and (p.get("status") or {}).get("phase") == "Running"
            for p in pods.values()
        )

    wait_for(restarted, 30, "a new launcher running")
    wait_for(lambda: is_true(job, "Running"), 15, "Running again")
    assert (job.condition("Restarting") or {}).get("status") == "False"
    assert job.get()["status"]["elastic"]["launcherRestarts"] == 1
    assert job.uids() == workers, "the workers stayed"
    job.wait_event("MPIJobRestarting")
    end_launcher(cluster, job, 137)
    wait_for(lambda: is_true(job, "Failed"), 20, "Failed past the backoff limit")
    assert "reached the specified backoff limit" in (job.condition("Failed") or {})["message"]


def test_gang_scheduling_is_reported_as_unsupported(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 1)
    manifest["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 2}}
    job.create(manifest)
    job.wait_hosts(1)
    wait_for(lambda: is_true(job, "Unsupported"), 10, "Unsupported")
    assert (job.condition("Unsupported") or {})["reason"] == "SchedulingPolicyIgnored"
