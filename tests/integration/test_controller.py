"""The controller on the real local cluster: one test per behaviour, asserting what the API
server holds (and what the launcher's own credentials are allowed to do)."""

from __future__ import annotations

import copy
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render
from mpijob_elastic.machinery import clients
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd")


class Job:
    """Reads one job and its children straight from the API server, as plain JSON."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.ns, self.name = cluster, namespace, name
        self.path = f"/apis/{names.API_VERSION}/namespaces/{namespace}/{names.PLURAL}"

    def create(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl("create", "-n", self.ns, "-f", "-", input=json.dumps(manifest))

    def get(self) -> dict[str, Any]:
        job = self.cluster.raw("GET", f"{self.path}/{self.name}")
        assert job is not None, f"MPIJob {self.name} not found"
        return job

    def patch(self, patch: dict[str, Any]) -> None:
        self.cluster.raw("PATCH", f"{self.path}/{self.name}", patch)

    def set_workers(self, n: int) -> None:
        self.patch({"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": n}}}})

    def config(self) -> dict[str, str]:
        cm = self.cluster.raw(
            "GET", f"/api/v1/namespaces/{self.ns}/configmaps/{names.config_map_name(self.name)}"
        )
        return dict((cm or {}).get("data") or {})

    def hosts(self) -> list[str]:
        script = self.config().get(names.DISCOVER_HOSTS, "")
        return [line.split()[1] for line in script.splitlines() if line.startswith("echo ")]

    def exec_names(self) -> list[str]:
        role = self.cluster.raw(
            "GET",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{self.ns}/roles/"
            f"{names.launcher_name(self.name)}",
        )
        for rule in (role or {}).get("rules") or []:
            if "pods/exec" in rule["resources"]:
                return list(rule.get("resourceNames") or [])
        return []

    def pods(self, role: str = names.ROLE_WORKER) -> dict[str, dict[str, Any]]:
        selector = names.selector(self.name, role).replace(",", "%2C").replace("=", "%3D")
        listed = self.cluster.raw(
            "GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector={selector}"
        )
        return {p["metadata"]["name"]: p for p in (listed or {}).get("items", [])}

    def uids(self) -> dict[str, str]:
        return {n: p["metadata"]["uid"] for n, p in self.pods().items()}

    def workers(self) -> list[str]:
        return sorted(self.pods(), key=lambda n: int(n.rsplit("-", 1)[1]))

    def condition(self, type_: str) -> dict[str, Any] | None:
        for cond in self.get().get("status", {}).get("conditions", []):
            if cond["type"] == type_:
                return dict(cond)
        return None

    def events(self) -> list[tuple[str, str, str]]:
        listed = self.cluster.raw("GET", f"/api/v1/namespaces/{self.ns}/events") or {}
        return [
            (e.get("type", ""), e.get("reason", ""), e.get("message", ""))
            for e in listed.get("items", [])
            if e["involvedObject"].get("kind") == names.KIND
            and e["involvedObject"].get("name") == self.name
        ]

    def wait_event(self, reason: str, type_: str = "", text: str = "", timeout: float = 30) -> str:
        """The message of this job's first Event with ``reason`` (and ``type_``, and
        ``text`` in its message), waited for: Events are recorded in the background, after
        the status that a test has just seen (machinery/events.py)."""

        def found() -> str:
            return next(
                (m for t, r, m in self.events() if r == reason and type_ in ("", t) and text in m),
                "",
            )

        wait_for(found, timeout, f"a {type_ or 'any'} Event {reason} ({text!r})")
        return found()

    def wait_hosts(self, n: int, timeout: float = 30) -> list[str]:
        want = [f"{self.name}-worker-{i}:1" for i in range(n)]
        try:
            wait_for(lambda: self.hosts() == want, timeout, f"discover_hosts.sh == {want}")
        except AssertionError as err:
            # Most often the cluster's side: say where each pod stands.
            raise AssertionError(
                f"{err}; listed {self.hosts()}; pods: {self.pod_states()}"
            ) from None
        return want

    def pod_states(self) -> dict[str, str]:
        """Each of the job's pods: its phase, node, and why it is not scheduled if so."""
        states = {}
        for name, pod in {**self.pods(), **self.pods(names.ROLE_LAUNCHER)}.items():
            status = pod.get("status") or {}
            unscheduled = [
                c.get("message", "")
                for c in status.get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") != "True"
            ]
            gone = " deleting" if pod["metadata"].get("deletionTimestamp") else ""
            node = pod["spec"].get("nodeName", "-")
            states[name] = f"{status.get('phase')} on {node}{gone} {' '.join(unscheduled)}".strip()
        return states


@pytest.fixture
def job(cluster: Cluster, shared_namespace: str) -> Job:
    """A job in a namespace of the module's shared controller (tests/controller.py)."""
    return Job(cluster, shared_namespace, "elastic")


def launcher_kubectl(cluster: Cluster, job: Job, tmp_path: Path) -> Cluster:
    wait_for(
        lambda: (
            cluster.kubectl(
                "get", "serviceaccount", names.launcher_name(job.name), "-n", job.ns, check=False
            ).returncode
            == 0
        ),
        what="launcher ServiceAccount",
    )
    kubeconfig = cluster.service_account_kubeconfig(
        job.ns, names.launcher_name(job.name), tmp_path / "launcher.kubeconfig"
    )
    return Cluster(kubeconfig, cluster.kubectl_path)


def can_exec(launcher: Cluster, pod: str) -> bool:
    proc = launcher.kubectl("exec", pod, "--", "echo", "ok", check=False)
    if proc.returncode == 0:
        assert proc.stdout.strip() == "ok"
        return True
    assert "forbidden" in proc.stderr.lower() or "notfound" in proc.stderr.lower().replace(
        " ", ""
    ), proc.stderr
    return False


ELASTIC = {"min_replicas": "1", "max_replicas": "5"}


def elastic_job(name: str, workers: int, drain: str = "2", **kw: Any) -> dict[str, Any]:
    manifest = mpijob(name, workers, **{**ELASTIC, **kw})
    manifest["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = drain
    return manifest


# Horovod's Gloo timeout of ``short_resets``: the reset bound becomes 10 s, not 35 s.
SHORT_GLOO_TIMEOUT = 5


def short_resets(manifest: dict[str, Any]) -> dict[str, Any]:
    """The launcher sets Horovod's Gloo timeout to ``SHORT_GLOO_TIMEOUT``, as a user may
    (docs/membership.md): where no rank signal says that a reset ended (no remote shell
    runs in these tests), the next host-list change waits out the reset bound, the Gloo
    timeout + 5 s (host_rules.reset_bound), and the test need not wait the default's 35 s."""
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]
    # ``mpijob`` shares one template between the roles: the launcher gets its own.
    launcher["template"] = copy.deepcopy(launcher["template"])
    for container in launcher["template"]["spec"]["containers"]:
        env = container.setdefault("env", [])
        env.append({"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": str(SHORT_GLOO_TIMEOUT)})
    return manifest


def test_scale_2_4_1_3_host_lists_role_and_exec(cluster: Cluster, job: Job, tmp_path: Path) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    config = job.config()
    assert config[names.HOSTFILE] == "elastic-worker-0 slots=1\nelastic-worker-1 slots=1\n"
    # v1's exec command, between the rank reports, its output through the commit marker's
    # watch (docs/formats.md).
    assert 'kubectl exec ${POD_NAME} -- /bin/sh -c "$*" 3>&- 4>&-;' in config[names.KUBEXEC]
    assert job.exec_names() == ["elastic-worker-0", "elastic-worker-1"]
    launcher = launcher_kubectl(cluster, job, tmp_path)
    assert can_exec(launcher, "elastic-worker-1")

    job.set_workers(4)
    job.wait_hosts(4)
    assert job.config()[names.HOSTFILE].count("slots=1\n") == 4
    assert job.exec_names() == [f"elastic-worker-{i}" for i in range(4)]
    for i in (2, 3):
        assert can_exec(launcher, f"elastic-worker-{i}")

    job.set_workers(1)
    job.wait_hosts(1, timeout=10)
    assert job.config()[names.HOSTFILE] == "elastic-worker-0 slots=1\n"
    wait_for(lambda: job.workers() == ["elastic-worker-0"], 20, "drained workers deleted")
    wait_for(lambda: job.exec_names() == ["elastic-worker-0"], 10, "exec revoked")
    for i in (1, 2, 3):
        assert not can_exec(launcher, f"elastic-worker-{i}")

    job.set_workers(3)
    job.wait_hosts(3)
    assert job.exec_names() == [f"elastic-worker-{i}" for i in range(3)]
    assert can_exec(launcher, "elastic-worker-2")
    for reason in ("ScaledUp", "Draining", "WorkerDeleted"):
        job.wait_event(reason)


def test_drain_then_delete_order(job: Job) -> None:
    # A drain long enough to read the pods and then the condition inside it, also on a
    # loaded machine (at 3 s it ended between the two reads once, under a load of 17).
    job.create(elastic_job(job.name, 3, drain="8"))
    job.wait_hosts(3)
    job.set_workers(1)
    left_at = time.monotonic()
    job.wait_hosts(1, timeout=10)
    victims = ("elastic-worker-1", "elastic-worker-2")

    def marked() -> bool:
        pods = job.pods()
        return all(
            names.ANN_DRAINING_SINCE in (pods[v]["metadata"].get("annotations") or {})
            for v in victims
        )

    # Marked right after the host lists changed, and still there, not terminating; the
    # status says so (the turn's last write: it may land a moment after the marks).
    wait_for(marked, 5, "victims marked draining")
    wait_for(
        lambda: (job.condition("Scaling") or {}).get("reason") == "ScalingDown", 5, "ScalingDown"
    )
    pods = job.pods()
    for victim in victims:
        assert not pods[victim]["metadata"].get("deletionTimestamp")
    assert "to 1" in (job.condition("Scaling") or {}).get("message", "")
    wait_for(lambda: job.workers() == ["elastic-worker-0"], 30, "victims deleted")
    assert time.monotonic() - left_at >= 7.5


def test_scale_up_during_drain_keeps_the_victims(job: Job) -> None:
    job.create(elastic_job(job.name, 3, drain="30"))
    job.wait_hosts(3)
    uids = job.uids()
    job.set_workers(1)
    job.wait_hosts(1)
    job.set_workers(3)
    job.wait_hosts(3)

    def unmarked() -> bool:
        return not any(
            names.ANN_DRAINING_SINCE in (p["metadata"].get("annotations") or {})
            for p in job.pods().values()
        )

    wait_for(unmarked, 5, "drain marks removed")
    assert job.uids() == uids


def test_config_change_touches_the_launcher(job: Job) -> None:
    job.create(elastic_job(job.name, 1))
    job.wait_hosts(1)
    job.set_workers(2)
    job.wait_hosts(2)

    def launcher_hash() -> str | None:
        launcher = job.pods(names.ROLE_LAUNCHER).get(names.launcher_name(job.name))
        if launcher is None:
            return None
        return (launcher["metadata"].get("annotations") or {}).get(names.ANN_CONFIG_HASH)

    wait_for(lambda: launcher_hash() == render.config_hash(job.config()), 10, "launcher hash")


def test_kubectl_scale(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    cluster.kubectl("scale", f"mpijob/{job.name}", "-n", job.ns, "--replicas=4")
    job.wait_hosts(4)
    scale = json.loads(
        cluster.kubectl(
            "get", "--raw", f"/apis/kubeflow.org/v1/namespaces/{job.ns}/mpijobs/{job.name}/scale"
        ).stdout
    )
    wait_for(
        lambda: (
            json.loads(
                cluster.kubectl(
                    "get",
                    "--raw",
                    f"/apis/kubeflow.org/v1/namespaces/{job.ns}/mpijobs/{job.name}/scale",
                ).stdout
            )["status"].get("replicas")
            == 4
        ),
        what="scale status replicas",
    )
    assert scale["spec"]["replicas"] == 4
    assert "mpi-job-role=worker" in scale["status"]["selector"]


def test_worker_deleted_by_hand_leaves_discovery_and_is_replaced(
    cluster: Cluster, job: Job
) -> None:
    job.create(elastic_job(job.name, 3))
    job.wait_hosts(3)
    cluster.kubectl("delete", "pod", "elastic-worker-1", "-n", job.ns, "--wait=false")
    # Its ranks may have died while it was listed, so Horovod may have blacklisted the
    # name: the replacement gets one never used in this job.
    want = ["elastic-worker-0:1", "elastic-worker-2:1", "elastic-worker-3:1"]
    wait_for(lambda: job.hosts() == want, 20, f"hosts {want}")
    assert "elastic-worker-1" not in job.workers()


def test_failed_worker_is_replaced_per_restart_policy(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 2)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "ExitCode"
    job.create(manifest)
    job.wait_hosts(2)
    # A signal (137) is worth retrying under ExitCode, under a fresh name.
    cluster.kubectl(
        "annotate", "pod", "elastic-worker-1", "-n", job.ns, "kwok.mpijob-elastic.io/exit-code=137"
    )
    want = ["elastic-worker-0:1", "elastic-worker-2:1"]
    wait_for(lambda: job.hosts() == want, 20, "worker-1 replaced by worker-2")
    job.wait_event("WorkerFailed")
    # A program error (1) is final under ExitCode: the host leaves and is not replaced.
    uids = job.uids()
    cluster.kubectl(
        "annotate", "pod", "elastic-worker-2", "-n", job.ns, "kwok.mpijob-elastic.io/exit-code=1"
    )
    wait_for(lambda: job.hosts() == ["elastic-worker-0:1"], 10, "failed host out of discovery")
    time.sleep(1)
    assert job.uids() == {
        "elastic-worker-0": uids["elastic-worker-0"],
        **{"elastic-worker-2": uids["elastic-worker-2"]},
    }


def test_same_named_jobs_in_two_namespaces(
    cluster: Cluster, shared_namespace: str, other_shared_namespace: str
) -> None:
    a, b = Job(cluster, shared_namespace, "twin"), Job(cluster, other_shared_namespace, "twin")
    a.create(elastic_job("twin", 3, drain="0"))
    b.create(elastic_job("twin", 2, drain="0"))
    a.wait_hosts(3)
    b.wait_hosts(2)
    b_uids = b.uids()
    a.set_workers(1)
    wait_for(lambda: a.workers() == ["twin-worker-0"], 20, "a scaled in")
    assert b.uids() == b_uids
    assert b.hosts() == ["twin-worker-0:1", "twin-worker-1:1"]
    assert a.hosts() == ["twin-worker-0:1"]


def test_restart_in_the_middle_of_a_drain(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    job = Job(cluster, namespace, "elastic")  # the test starts and kills its own controller
    controller = start_controller(job.ns)
    drain = 10.0  # long enough that the kill lands inside it on a loaded machine
    job.create(elastic_job(job.name, 3, drain=str(int(drain))))
    job.wait_hosts(3)
    job.set_workers(1)
    job.wait_hosts(1)
    victims = ["elastic-worker-1", "elastic-worker-2"]

    def marked_since() -> dict[str, float]:
        pods = job.pods()
        since = {
            n: (pods[n]["metadata"].get("annotations") or {}).get(names.ANN_DRAINING_SINCE)
            for n in victims
            if n in pods
        }
        if len(since) < len(victims) or None in since.values():
            return {}
        return {n: datetime.fromisoformat(str(v)).timestamp() for n, v in since.items()}

    since = wait_for(marked_since, 10, "victims marked")
    controller.stop(kill=True)
    assert time.time() < min(since.values()) + drain, "killed after the drain's deadline"
    time.sleep(1)
    assert len(job.pods()) == 3  # nothing deletes while the controller is down
    restarted_at = len(controller.log_entries())
    controller.start()
    wait_for(
        lambda: job.workers() == ["elastic-worker-0"], 3 * drain, "drain finished after restart"
    )

    def deleted() -> dict[str, float]:
        found = {
            e["pod"]: e["ts"]
            for e in controller.log_entries()[restarted_at:]
            if e.get("msg") == "deleted pod"
        }
        return found if len(found) >= len(victims) else {}

    # A pod is gone for the test as soon as the server took its delete, a moment before
    # the controller logs the answer.
    deletes = wait_for(deleted, 10, "the restarted controller's deletes logged")
    assert sorted(deletes) == victims
    # The restarted controller honoured the drain deadline that was set before the crash
    # (the log's clock is this machine's, as is the annotation's).
    for name, deleted_at in deletes.items():
        assert deleted_at >= since[name] + drain - 0.1, name


def test_out_of_range_replicas_are_refused_without_deleting(job: Job) -> None:
    job.create(elastic_job(job.name, 3))
    job.wait_hosts(3)
    uids = job.uids()

    def refused(bad: int) -> bool:
        c = job.condition("InvalidSpec")
        return (
            c is not None
            and c["status"] == "True"
            and f"replicas: {bad} is outside" in c["message"]
        )

    for bad in (9, 0):
        job.set_workers(bad)
        wait_for(lambda: refused(bad), 10, f"condition for replicas={bad}")  # noqa: B023
        assert job.uids() == uids
        assert len(job.hosts()) == 3
    job.wait_event("ReplicasOutOfRange", "Warning")
    job.set_workers(2)
    wait_for(lambda: job.condition("InvalidSpec")["status"] == "False", 10, "condition cleared")  # type: ignore[index]
    job.wait_hosts(2)


def test_out_of_range_replicas_keep_the_size_when_workers_fail(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 3)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "ExitCode"
    job.create(manifest)
    job.wait_hosts(3)
    job.set_workers(0)
    wait_for(
        lambda: "keeping 3 workers" in (job.condition("InvalidSpec") or {}).get("message", ""),
        10,
        "refused",
    )
    # Two failures at once: the second waits out the replacement pause, during which
    # neither is listed; the job still wants the 3 it was last given, not the 1 it has.
    for name in ("elastic-worker-0", "elastic-worker-1"):
        cluster.kubectl(
            "annotate", "pod", name, "-n", job.ns, "kwok.mpijob-elastic.io/exit-code=137"
        )
    want = ["elastic-worker-2:1", "elastic-worker-3:1", "elastic-worker-4:1"]
    wait_for(lambda: job.hosts() == want, 40, f"hosts {want}")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"spec": {"slotsPerWorker": 0}}, "spec.slotsPerWorker"),
        ({"spec": {"mainContainer": "main; rm -rf /"}}, "spec.mainContainer"),
        ({"spec": {"mainContainer": "sidecar"}}, "spec.mainContainer"),
        ({"spec": {"mpiReplicaSpecs": {"Worker": None}}}, "spec.mpiReplicaSpecs.Worker"),
    ],
)
def test_invalid_spec_names_the_field_and_keeps_workers(
    job: Job, patch: dict[str, Any], field: str
) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    uids = job.uids()
    job.patch(patch)
    cond = wait_for(
        lambda: (c := job.condition("InvalidSpec")) and c["status"] == "True" and c,
        10,
        "InvalidSpec condition",
    )
    assert field in cond["message"]
    # The Event follows the status write that set the condition.
    wait_for(
        lambda: any(r == "InvalidSpec" and field in m for _, r, m in job.events()),
        10,
        "InvalidSpec Event",
    )
    assert job.uids() == uids
    assert "rm -rf" not in job.config()[names.KUBEXEC]


def test_bad_job_does_not_stop_others(job: Job, cluster: Cluster) -> None:
    bad = elastic_job("bad", 2)
    bad["metadata"]["name"] = "a" * 60  # worker pod names would exceed 63 characters
    long = Job(cluster, job.ns, bad["metadata"]["name"])
    long.create(bad)
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    cond = wait_for(lambda: long.condition("InvalidSpec"), 10, "condition on the long name")
    assert "metadata.name" in cond["message"]
    assert "too long" in cond["message"]
    assert long.pods() == {}


def test_pod_template_rejected_by_the_api_server(job: Job) -> None:
    manifest = elastic_job(job.name, 1)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = ""
    job.create(manifest)
    cond = wait_for(
        lambda: (c := job.condition("InvalidSpec")) and c["status"] == "True" and c,
        15,
        "PodTemplateRejected",
    )
    assert cond["reason"] == "PodTemplateRejected"
    assert "spec.containers[0].image" in cond["message"]


def test_launcher_end_decides_the_job_then_clean_pod_policy(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 2)
    manifest["spec"]["runPolicy"] = {"cleanPodPolicy": "Running"}
    job.create(manifest)
    job.wait_hosts(2)
    wait_for(lambda: job.pods(names.ROLE_LAUNCHER), 10, "launcher")
    cluster.kubectl(
        "annotate",
        "pod",
        names.launcher_name(job.name),
        "-n",
        job.ns,
        "kwok.mpijob-elastic.io/exit-code=0",
    )
    wait_for(lambda: (c := job.condition("Succeeded")) and c["status"] == "True", 15, "Succeeded")
    wait_for(lambda: job.pods() == {}, 15, "running workers cleaned up")
    assert job.pods(names.ROLE_LAUNCHER)  # a finished launcher is not Running: kept
    status = job.get()["status"]
    assert status["completionTime"]
    assert status["conditions"][-1]["type"] == "Succeeded"


def test_deleting_the_job_leaves_nothing(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    cluster.kubectl("delete", "mpijob", job.name, "-n", job.ns)
    selector = f"{names.LABEL_JOB}={job.name}"

    def leftovers() -> str:
        return cluster.kubectl(
            "get",
            "pods,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
            "-n",
            job.ns,
            "-l",
            selector,
            "-o",
            "name",
        ).stdout.strip()

    wait_for(lambda: leftovers() == "", 30, "children garbage-collected")


def test_managed_by_selects_the_jobs(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    job = Job(cluster, namespace, "elastic")  # a controller of its own, with the flag
    start_controller(job.ns, args=("--only-managed-by",))
    ours = elastic_job("ours", 1)
    ours["spec"]["runPolicy"] = {"managedBy": names.MANAGED_BY}
    theirs = elastic_job("theirs", 1)
    Job(cluster, job.ns, "theirs").create(theirs)
    mine = Job(cluster, job.ns, "ours")
    mine.create(ours)
    mine.wait_hosts(1)
    time.sleep(1)
    assert Job(cluster, job.ns, "theirs").config() == {}


def test_worker_without_index_label_is_still_known(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    uids = job.uids()
    cluster.kubectl("label", "pod", "elastic-worker-1", "-n", job.ns, f"{names.LABEL_INDEX}-")
    time.sleep(1.5)
    assert job.uids() == uids
    assert len(job.hosts()) == 2


def test_horizontal_pod_autoscaler_scales_the_job(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    # No metrics server here, but an HPA raises a target below its minReplicas without
    # metrics: that is enough to prove it reads and writes the MPIJob's scale subresource.
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": job.name},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": job.name,
            },
            "minReplicas": 3,
            "maxReplicas": 5,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 50},
                    },
                }
            ],
        },
    }
    cluster.apply(hpa, job.ns)
    job.wait_hosts(3, timeout=60)
    assert job.get()["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3


def test_a_settled_job_is_not_rewritten(job: Job) -> None:
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)

    def settled() -> bool:
        scaling, running = job.condition("Scaling"), job.condition("Running")
        return bool(
            running and running["status"] == "True" and scaling and scaling["status"] == "False"
        )

    wait_for(settled, 15, "the job to settle")

    def versions() -> list[str]:
        paths = [
            f"{job.path}/{job.name}",
            f"/api/v1/namespaces/{job.ns}/configmaps/{names.config_map_name(job.name)}",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{job.ns}/roles/"
            f"{names.launcher_name(job.name)}",
            f"/api/v1/namespaces/{job.ns}/pods/{names.launcher_name(job.name)}",
        ]
        return [(job.cluster.raw("GET", p) or {})["metadata"]["resourceVersion"] for p in paths]

    before = versions()
    time.sleep(3)
    assert versions() == before


def test_every_write_names_the_controller_as_its_field_manager(job: Job) -> None:
    """managedFields (and so `kubectl apply`'s conflicts) say which fields the controller
    set: every object it wrote lists it as the manager of its writes."""
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    wait_for(lambda: job.pods(names.ROLE_LAUNCHER), 10, "the launcher")
    ns, launcher = job.ns, names.launcher_name(job.name)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    written = {
        "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps/{names.config_map_name(job.name)}",
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts/{launcher}",
        "Role": f"{rbac}/roles/{launcher}",
        "RoleBinding": f"{rbac}/rolebindings/{launcher}",
        "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/"
        f"{names.disruption_budget_name(job.name)}",
        "launcher": f"/api/v1/namespaces/{ns}/pods/{launcher}",
        "worker": f"/api/v1/namespaces/{ns}/pods/{names.worker_name(job.name, 0)}",
    }
    for what, path in written.items():
        fields = (job.cluster.raw("GET", path) or {})["metadata"]["managedFields"]
        # The kubelet (KWOK's) and the disruption controller write status beside us.
        assert clients.FIELD_MANAGER in {f["manager"] for f in fields}, (what, fields)
    # The status, written through its subresource by the controller alone.
    status = [
        f["manager"]
        for f in job.get()["metadata"]["managedFields"]
        if f.get("subresource") == "status"
    ]
    assert status == [clients.FIELD_MANAGER]
    listed = job.cluster.raw("GET", f"/api/v1/namespaces/{ns}/events") or {}
    ours = [e for e in listed["items"] if e["involvedObject"].get("kind") == names.KIND]
    assert ours
    managers = {f["manager"] for e in ours for f in e["metadata"]["managedFields"]}
    assert managers == {clients.FIELD_MANAGER}


def test_a_worker_template_edit_reaches_new_workers_only(job: Job) -> None:
    """docs/configuration.md: running workers and the launcher are left as they are;
    workers created after the edit get the new template. status.observedGeneration says
    when the controller has seen the edit."""
    job.create(elastic_job(job.name, 1))
    job.wait_hosts(1)
    wait_for(lambda: job.pods(names.ROLE_LAUNCHER), 10, "the launcher")

    def observed() -> bool:
        got = job.get()
        return bool(
            got.get("status", {}).get("observedGeneration") == got["metadata"]["generation"]
        )

    wait_for(observed, 10, "status.observedGeneration to reach the generation")
    before = {
        **job.uids(),
        **{n: p["metadata"]["uid"] for n, p in job.pods(names.ROLE_LAUNCHER).items()},
    }
    template = job.get()["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    template["spec"]["containers"][0]["env"] = [{"name": "EDITED", "value": "1"}]
    job.patch({"spec": {"mpiReplicaSpecs": {"Worker": {"template": template}}}})
    generation = job.get()["metadata"]["generation"]
    wait_for(observed, 10, "status.observedGeneration to reach the edit")
    assert job.get()["status"]["observedGeneration"] == generation
    job.set_workers(2)
    job.wait_hosts(2)
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    assert {n: pods[n]["metadata"]["uid"] for n in before} == before, "a pod was replaced"

    def env(name: str) -> list[dict[str, str]]:
        return list(pods[name]["spec"]["containers"][0].get("env") or [])

    assert {"name": "EDITED", "value": "1"} in env(names.worker_name(job.name, 1))
    assert {"name": "EDITED", "value": "1"} not in env(names.worker_name(job.name, 0))
    assert {"name": "EDITED", "value": "1"} not in env(names.launcher_name(job.name))
