"""Runs an elastic MPIJob the way a user does, and watches it from the launcher's side.

Shared by the end-to-end suite and ``make demo``. On a cluster with real kubelets (kind,
``in_cluster=True``) the launcher is a real pod running the mock launcher image, and the
driver's event lines are read from its log. On a KWOK cluster the launcher has no real
container, so its two halves run here as local processes:

* the mock Horovod driver (``e2e.mockhorovod``) with the launcher ServiceAccount's own
  token, so every ``kubexec.sh`` call goes through the API server's RBAC into KWOK's exec;
* the kubelet-volume stand-in (``e2e.kubelet_volume``), which keeps the driver's local
  ``/etc/mpi`` in step with the ConfigMap, when a kubelet would.

When the driver ends, the launcher pod is ended through a KWOK stage (the
``kwok.mpijob-elastic.io/exit-code`` annotation), not by writing pod status by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.mockhorovod import CRASH_FILE
from e2e.mockhorovod import events as ev
from mpijob_elastic import names
from tests.cluster import ROOT, Cluster
from tests.controller import wait_for

EXIT_ANNOTATION = "kwok.mpijob-elastic.io/exit-code"
# Where the mock images keep the mock driver and rank (e2e/images/*/Dockerfile).
IMAGE_REPO = "/opt/mockhorovod"
STOP_FILE_IN_POD = "/tmp/stop-training"


def in_cluster_job(job: dict[str, Any], launcher_image: str, worker_image: str) -> dict[str, Any]:
    """The job with the mock images, for a cluster whose kubelets run containers."""
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    launcher["image"] = launcher_image
    launcher["command"] = [
        "horovodrun", "-np", "2", "--min-np", "1", "--max-np", "5",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh",
        "--rank-repo", IMAGE_REPO, "--rank-python", "/usr/local/bin/python3",
        "--stop-file", STOP_FILE_IN_POD,
    ]  # fmt: skip
    launcher.pop("args", None)
    launcher.pop("resources", None)
    for container in specs["Worker"]["template"]["spec"]["containers"]:
        container["image"] = worker_image
        container.pop("resources", None)  # kind nodes have no GPUs
        container.pop("command", None)
        container.pop("args", None)
    return job


@dataclass
class Step:
    """One user action and everything observed after it."""

    label: str
    started: float
    lines: list[str] = field(default_factory=list)


@dataclass
class ElasticRun:
    cluster: Cluster
    namespace: str
    manifest: dict[str, Any]
    workdir: Path
    driver_args: tuple[str, ...] = ("-np", "2", "--min-np", "1", "--max-np", "5")
    in_cluster: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def job(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def etc_mpi(self) -> Path:
        return self.workdir / "etc-mpi"

    @property
    def driver_log(self) -> Path:
        return self.workdir / "driver.jsonl"

    @property
    def volume_log(self) -> Path:
        return self.workdir / "volume.jsonl"

    # -- setting up -------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, "-n", self.namespace, check=check, input=input).stdout

    def exec(self, pod: str, *command: str) -> str:
        """``kubectl exec`` into a pod; the namespace goes before ``--``, where kubectl reads
        it (after it, it would be part of the command)."""
        return self.cluster.kubectl("exec", "-n", self.namespace, pod, "--", *command).stdout

    def submit(self) -> Step:
        step = self.begin(f"kubectl apply: {self.job} with {self.workers_wanted()} workers")
        self.kubectl("apply", "-f", "-", input=json.dumps(self.manifest))
        return step

    def workers_wanted(self) -> int:
        return int(self.manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])

    def _spawn(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        out = log.open("ab")
        self.procs.append(
            subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        )
        out.close()

    def start_launcher(self, timeout: float = 60) -> None:
        """Once the controller created the launcher pod, start what runs "inside" it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        wait_for(
            lambda: self.kubectl("get", "pod", names.launcher_name(self.job), check=False),
            timeout,
            "the launcher pod",
        )
        self._spawn(
            [
                sys.executable,
                "-m",
                "e2e.kubelet_volume",
                "--kubeconfig",
                self.cluster.kubeconfig,
                "--namespace",
                self.namespace,
                "--job",
                self.job,
                "--log-file",
                str(self.volume_log),
                *([] if self.in_cluster else ["--dir", str(self.etc_mpi)]),
            ],
            self.workdir / "volume.out",
        )
        if self.in_cluster:
            return  # the launcher pod runs the driver itself
        wait_for(lambda: (self.etc_mpi / names.DISCOVER_HOSTS).exists(), 30, "the mounted files")
        sa_kubeconfig = self.cluster.service_account_kubeconfig(
            self.namespace, names.launcher_name(self.job), self.workdir / "launcher.kubeconfig"
        )
        kubectl_dir = str(Path(self.cluster.kubectl_path).parent)
        env = dict(os.environ, KUBECONFIG=sa_kubeconfig, PATH=f"{kubectl_dir}:{os.environ['PATH']}")
        self._spawn(
            [
                sys.executable,
                "-m",
                "e2e.mockhorovod",
                *self.driver_args,
                "--host-discovery-script",
                str(self.etc_mpi / names.DISCOVER_HOSTS),
                "--rsh-agent",
                str(self.etc_mpi / names.KUBEXEC),
                # The ranks' kill emulation plays the kubelet (it reads and annotates the
                # worker pods), so it gets the cluster's credentials, not the launcher's.
                "--rank-kubeconfig",
                self.cluster.kubeconfig,
                "--rank-namespace",
                self.namespace,
                "--rank-kubectl",
                self.cluster.kubectl_path,
                "--log-file",
                str(self.driver_log),
                "--stop-file",
                str(self.workdir / "stop"),
                "--work-dir",
                str(self.workdir / "ranks"),
            ],
            self.workdir / "driver.out",
            env,
        )

    # -- what the launcher saw --------------------------------------------------------------

    def driver_events(self, *kinds: str) -> list[dict[str, Any]]:
        if self.in_cluster:
            logs = self.kubectl("logs", names.launcher_name(self.job), check=False)
            # Once the job is deleted its launcher's log is gone; keep the last one read.
            if logs:
                self.driver_log.write_text(logs)
        records = ev.read_events(self.driver_log)
        return ev.of_kind(records, *kinds) if kinds else records

    def volume_events(self, *kinds: str) -> list[dict[str, Any]]:
        records = ev.read_events(self.volume_log)
        return ev.of_kind(records, *kinds) if kinds else records

    def discovered(self) -> list[str]:
        found = self.driver_events(ev.DISCOVERY)
        return list(found[-1]["hosts"]) if found else []

    def ranks_running_on(self) -> set[str]:
        """Hosts with a running rank, per the driver's own start/stop events."""
        hosts: dict[str, int] = {}
        for record in self.driver_events(
            ev.RANK_RUNNING, ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_FAILED
        ):
            delta = 1 if record["event"] == ev.RANK_RUNNING else -1
            hosts[record["host"]] = hosts.get(record["host"], 0) + delta
        return {h for h, n in hosts.items() if n > 0}

    def rank_ids_on(self, host: str) -> set[str]:
        """The driver's ids of the ranks still running on a host."""
        ended = {
            r["rank_id"]
            for r in self.driver_events(ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_FAILED)
        }
        return {
            r["rank_id"]
            for r in self.driver_events(ev.RANK_RUNNING)
            if r["host"] == host and r["rank_id"] not in ended
        }

    def hosts(self, n: int) -> list[str]:
        return [names.worker_name(self.job, i) for i in range(n)]

    def wait_for_ranks_on(self, n: int | set[str], timeout: float = 60) -> None:
        """Ranks on exactly these workers (the first ``n``, or a set of names)."""
        want = set(self.hosts(n)) if isinstance(n, int) else n
        wait_for(
            lambda: self.ranks_running_on() == want and set(self.discovered()) == want,
            timeout,
            f"ranks on exactly {sorted(want)}",
        )

    def worker_pods(self) -> list[str]:
        out = self.kubectl(
            "get", "pods", "-l", names.selector(self.job, names.ROLE_WORKER), "-o", "name"
        )
        pods = [line.split("/", 1)[1] for line in out.split()]
        return sorted(pods, key=lambda p: int(p.rsplit("-", 1)[1]))

    # -- user actions -----------------------------------------------------------------------

    def begin(self, label: str) -> Step:
        step = Step(label, time.time())
        self.steps.append(step)
        return step

    def scale(self, n: int, via: str = "patch") -> Step:
        step = self.begin(f"{'kubectl scale' if via == 'scale' else 'kubectl patch'}: {n} workers")
        if via == "scale":
            self.kubectl("scale", f"mpijob/{self.job}", f"--replicas={n}")
        else:
            patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": n}}}}
            self.kubectl("patch", "mpijob", self.job, "--type=merge", "-p", json.dumps(patch))
        return step

    def crash_rank(self, host: str, rank_id: str) -> Step:
        """Makes one rank crash, where it runs: inside the worker (on KWOK, this machine)."""
        step = self.begin(f"the rank on {host} crashes")
        self.exec(host, "touch", CRASH_FILE.format(rank_id=rank_id))
        return step

    def finish(self, timeout: float = 60) -> int:
        """End the training: the driver stops, and its exit code ends the launcher pod."""
        if self.in_cluster:
            self.exec(names.launcher_name(self.job), "touch", STOP_FILE_IN_POD)
            done = wait_for(lambda: self.driver_events(ev.DRIVER_EXIT), timeout, "driver exit")
            return int(done[-1]["exit_code"])
        (self.workdir / "stop").touch()
        driver = self.procs[-1]
        code = driver.wait(timeout)
        self.kubectl("annotate", "pod", names.launcher_name(self.job), f"{EXIT_ANNOTATION}={code}")
        return code

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        # Ranks notice their driver is gone and exit; give them a moment.
        time.sleep(0.5)

    # -- the timeline -----------------------------------------------------------------------

    def timeline(self, step: Step, until: float | None = None) -> list[tuple[float, str]]:
        """What happened after a step, in seconds since it, from every observer."""
        end = until or time.time()
        rows = sorted(
            (r["ts"], describe(r))
            for r in [*self.volume_events(), *self.driver_events()]
            if step.started <= r["ts"] <= end and r["event"] in TIMELINE_TEXT
        )
        return [(ts - step.started, text) for ts, text in rows]


# How each observed event reads in a timeline; events not listed here are left out.
TIMELINE_TEXT = {
    "configmap_updated": "ConfigMap updated by the controller",
    "files_synced": "launcher's /etc/mpi refreshed ({trigger})",
    "pod_running": "pod {pod} Running",
    "pod_deleted": "pod {pod} deleted (Terminating)",
    "pod_removed": "pod {pod} gone from the API",
    ev.DISCOVERY: "driver: discover_hosts.sh lists {count}: {hosts}",
    ev.JOB_STARTED: "driver: training started on {count} hosts",
    ev.HOST_ADDED: "driver: host {host} added",
    ev.RANK_RUNNING: "driver: rank running on {host} (via kubexec.sh)",
    ev.HOST_REMOVED: "driver: host {host} removed gracefully",
    ev.RANK_STOPPED: "driver: rank on {host} let go ({reason}), exit {exit_code}",
    ev.RANK_FAILED: "driver: FAILURE of a rank on {host} (exit {exit_code})",
    ev.HOST_BLACKLISTED: "driver: host {host} BLACKLISTED",
    ev.EXEC_FAILED: "driver: exec into {host} FAILED: {stderr_head}",
}


def describe(record: dict[str, Any]) -> str:
    hosts = record.get("hosts") or []
    return TIMELINE_TEXT[record["event"]].format(
        **{
            **record,
            "count": len(hosts),
            "hosts": ", ".join(hosts) or "-",
            "stderr_head": str(record.get("stderr", "")).strip()[:80],
        }
    )


def format_timeline(step: Step, rows: list[tuple[float, str]]) -> str:
    lines = [f"== {step.label}"]
    lines += [f"   +{offset:6.2f}s  {text}" for offset, text in rows]
    return "\n".join(lines)
