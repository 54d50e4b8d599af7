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
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import wait_for

EXIT_ANNOTATION = "kwok.mpijob-elastic.io/exit-code"
# Where the mock images keep the mock driver and rank (e2e/images/*/Dockerfile).
IMAGE_REPO = "/opt/mockhorovod"
STOP_FILE_IN_POD = "/tmp/stop-training"
# The driver's size flags, as the sample's launcher gives them to horovodrun.
DRIVER_ARGS = ("-np", "2", "--min-np", "1", "--max-np", "5")


def mock_driver_args(
    base: tuple[str, ...] = DRIVER_ARGS,
    *,
    rank_start_seconds: float | None = None,
    commit_marker: bool | None = None,
) -> tuple[str, ...]:
    """The mock driver's flags: ``base`` plus the training the ranks play, how long each
    takes from its start to joining (``--rank-start-seconds``: import torch, hvd.init) and
    whether it prints the commit hook's marker (``--commit-marker``). None keeps the
    driver's default (2 s, with the hook; e2e/mockhorovod/README.md). Give the result as
    ``driver_args`` to ``in_cluster_job`` and ``ElasticRun`` alike, e.g.
    ``mock_driver_args(rank_start_seconds=20, commit_marker=False)``: a slow training
    without the hook."""
    args = list(base)
    if rank_start_seconds is not None:
        args += ["--rank-start-seconds", f"{rank_start_seconds:g}"]
    if commit_marker is not None:
        args.append("--commit-marker" if commit_marker else "--no-commit-marker")
    return tuple(args)


def in_cluster_job(
    job: dict[str, Any],
    launcher_image: str,
    worker_image: str,
    driver_args: tuple[str, ...] = DRIVER_ARGS,
) -> dict[str, Any]:
    """The job with the mock images, for a cluster whose kubelets run containers."""
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    launcher["image"] = launcher_image
    launcher["command"] = [
        "horovodrun", *driver_args,
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


def spread_workers(job: dict[str, Any]) -> dict[str, Any]:
    """The job's workers spread over the nodes where the scheduler can, as a job on spot
    capacity asks for: a node that goes away then takes one worker, not the whole job.
    A preference only, so a scale-out never waits for an empty node."""
    name = job["metadata"]["name"]
    pod_spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"].setdefault("spec", {})
    pod_spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": names.labels(name, names.ROLE_WORKER)},
        }
    ]
    return job


@dataclass
class Step:
    """One user action and everything observed after it."""

    label: str
    started: float
    # Figures worked out after the step, printed under its timeline.
    lines: list[str] = field(default_factory=list)
    # Moments only the user sees (a command returning), as (time, text) for the timeline.
    marks: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Drain:
    """What one ``kubectl drain`` did."""

    node: str
    returncode: int
    output: str
    # Evictions the API server refused for the disruption budget (429); kubectl retries
    # each one every 5 s until the timeout.
    refused: int

    @property
    def evicted(self) -> list[str]:
        """The pods kubectl evicted, as namespace/name."""
        return [
            line.removeprefix("evicting pod ").strip()
            for line in self.output.splitlines()
            if line.startswith("evicting pod ")
        ]


@dataclass
class Move:
    """When one worker leaving a node passed each mark, in seconds since its step began."""

    worker: str
    node: str
    out_of_discovery: float | None = None
    deleted: float | None = None
    rank_left: float | None = None
    gone: float | None = None


@dataclass
class Arrival:
    """When one new worker passed each mark, in seconds since its step began."""

    worker: str
    node: str | None
    running: float | None = None
    listed: float | None = None
    rank_running: float | None = None


@dataclass
class ElasticRun:
    cluster: Cluster
    namespace: str
    manifest: dict[str, Any]
    workdir: Path
    driver_args: tuple[str, ...] = DRIVER_ARGS
    in_cluster: bool = False
    # In the cluster: the driver's record is no longer the launcher pod's log (that
    # launcher ended; its successor's run would replace the record), see ``ended``.
    record_kept: bool = False
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def job(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def etc_mpi(self) -> Path:
        return self.workdir / "etc-mpi"

    @property
    def notice_file(self) -> Path:
        """The launcher's notice file: the kubelet stand-in writes it on KWOK."""
        return self.workdir / "notice"

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
                *(
                    []
                    if self.in_cluster
                    else ["--dir", str(self.etc_mpi), "--notice-file", str(self.notice_file)]
                ),
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
                "--notice-file",
                str(self.notice_file),
            ],
            self.workdir / "driver.out",
            env,
        )

    # -- what the launcher saw --------------------------------------------------------------

    def ended(self, log: bytes) -> None:
        """The launcher pod's driver ended with ``log`` (read to its end): that stays the
        driver's record, whatever launcher runs next."""
        self.driver_log.write_bytes(log)
        self.record_kept = True

    def driver_events(self, *kinds: str) -> list[dict[str, Any]]:
        if self.in_cluster and not self.record_kept:
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
        """Hosts with a running rank, per the driver's own start/stop events, rank by rank:
        a rank stopped before it ever ran (a shutdown during its start) takes nothing from
        a later rank on the same host."""
        ended = {
            r["rank_id"]
            for r in self.driver_events(ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_FAILED)
        }
        return {r["host"] for r in self.driver_events(ev.RANK_RUNNING) if r["rank_id"] not in ended}

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

    def wait_for_size(self, n: int, timeout: float = 60) -> set[str]:
        """Ranks on exactly the listed workers, ``n`` of them, whatever their names."""

        def settled() -> set[str] | None:
            listed = set(self.discovered())
            return listed if len(listed) == n and self.ranks_running_on() == listed else None

        try:
            found: set[str] = wait_for(settled, timeout, f"ranks on {n} listed workers")
        except AssertionError as exc:
            # What the driver last saw and did, for a failure in CI that cannot be rerun.
            seen = [
                {k: e.get(k) for k in ("ts", "event", "hosts", "host", "commit", "reason")}
                for e in self.driver_events()
                if e.get("event") not in (ev.CHECKPOINT_SAVED, ev.COMMIT_MARKER_PRINTED)
            ]
            raise AssertionError(
                f"{exc}; listed {sorted(self.discovered())}, ranks on "
                f"{sorted(self.ranks_running_on())}; the driver's last events: {seen[-15:]}"
            ) from exc
        return found

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

    def pod_nodes(self, selector: str, namespace: str | None = None) -> dict[str, str]:
        """The node of each scheduled, not terminating pod matching the selector (every
        pod of the namespace for an empty one)."""
        match = ["-l", selector] if selector else []
        pods = json.loads(
            self.cluster.kubectl(
                "get", "pods", "-n", namespace or self.namespace, *match, "-o", "json"
            ).stdout
        )
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in pods["items"]
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }

    def worker_nodes(self) -> dict[str, str]:
        return self.pod_nodes(names.selector(self.job, names.ROLE_WORKER))

    def launcher_node(self) -> str | None:
        return self.pod_nodes(names.selector(self.job, names.ROLE_LAUNCHER)).get(
            names.launcher_name(self.job)
        )

    def node_to_drain(self, keep_namespaces: tuple[str, ...] = ()) -> tuple[str, str | None]:
        """A node holding some of the job's workers, to drain, and the pod selector the
        drain needs (None: the whole node). A node with the launcher or a pod of
        ``keep_namespaces`` (the controller's) is drained only of the job's workers:
        the walk is about the workers, not about the launcher or the controller
        restarting. A node holding every worker comes last: with all of them evicted at
        once the job would have nobody left to train."""
        placement = self.worker_nodes()
        keep = {self.launcher_node()}
        for namespace in keep_namespaces:
            keep |= set(self.pod_nodes("", namespace).values())
        counts: dict[str, int] = {}
        for node in placement.values():
            counts[node] = counts.get(node, 0) + 1
        # Whole nodes first, then nodes that leave a worker elsewhere, then more workers.
        node = min(counts, key=lambda n: (n in keep, counts[n] == len(placement), -counts[n], n))
        selector = names.selector(self.job, names.ROLE_WORKER) if node in keep else None
        return node, selector

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

    def drain(self, step: Step, node: str, pod_selector: str | None, timeout: int = 120) -> Drain:
        """``kubectl drain`` as an operator runs it, waiting for it to finish: it cordons
        the node, evicts its pods through the eviction API (retrying those a disruption
        budget refuses) and waits until they are gone."""
        args = [
            self.cluster.kubectl_path, "--kubeconfig", self.cluster.kubeconfig, "drain", node,
            "--ignore-daemonsets", "--delete-emptydir-data", "--force", f"--timeout={timeout}s",
            *([f"--pod-selector={pod_selector}"] if pod_selector else []),
        ]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 60)
        output = proc.stdout + proc.stderr
        step.marks.append((time.time(), f"kubectl drain returned, exit {proc.returncode}"))
        return Drain(node, proc.returncode, output, output.count("disruption budget"))

    def moves(self, step: Step, leaving: dict[str, str]) -> list[Move]:
        """When each worker that left (name to node) was unlisted, deleted, let go by the
        driver and gone from the API, as the observers recorded it."""
        since = step.started

        def first(records: list[dict[str, Any]], **match: Any) -> float | None:
            times = [
                r["ts"] - since
                for r in records
                if r["ts"] >= since and all(r.get(k) == v for k, v in match.items())
            ]
            return min(times, default=None)

        discoveries = [e for e in self.driver_events(ev.DISCOVERY) if e["ts"] >= since]
        moves = []
        for worker, node in sorted(leaving.items()):
            unlisted = [e["ts"] - since for e in discoveries if worker not in e["hosts"]]
            moves.append(
                Move(
                    worker,
                    node,
                    out_of_discovery=min(unlisted, default=None),
                    deleted=first(self.volume_events("pod_deleted"), pod=worker),
                    rank_left=first(self.driver_events(ev.RANK_STOPPED), host=worker),
                    gone=first(self.volume_events("pod_removed"), pod=worker),
                )
            )
        return moves

    def arrivals(self, step: Step, before: set[str]) -> list[Arrival]:
        """When each worker that is new since ``before`` ran, was listed and got a rank."""
        since = step.started
        nodes = self.worker_nodes()
        running = {
            e["pod"]: e["ts"] - since
            for e in self.volume_events("pod_running")
            if e["ts"] >= since and e["pod"] not in before
        }
        arrivals = []
        for worker, at in sorted(running.items(), key=lambda kv: kv[1]):
            listed = [
                e["ts"] - since
                for e in self.driver_events(ev.DISCOVERY)
                if e["ts"] >= since and worker in e["hosts"]
            ]
            ranks = [
                e["ts"] - since
                for e in self.driver_events(ev.RANK_RUNNING)
                if e["ts"] >= since and e["host"] == worker
            ]
            arrivals.append(
                Arrival(
                    worker,
                    nodes.get(worker),
                    running=at,
                    listed=min(listed, default=None),
                    rank_running=min(ranks, default=None),
                )
            )
        return arrivals

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
            [
                *(
                    (r["ts"], describe(r))
                    for r in [*self.volume_events(), *self.driver_events()]
                    if step.started <= r["ts"] <= end and r["event"] in TIMELINE_TEXT
                ),
                *((ts, text) for ts, text in step.marks if ts <= end),
            ]
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
    lines += [f"   {line}" for line in step.lines]
    return "\n".join(lines)


# Where the e2e timelines are written (``report``).
OUT = ROOT / "e2e" / "out"


def report(run: ElasticRun, tag: str, out: Path = OUT) -> None:
    """Each step's timeline, printed and written to ``<out>/timeline-<tag>-<time>.txt``."""
    out.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(
        format_timeline(step, run.timeline(step, until=nxt.started if nxt else None))
        for step, nxt in zip(run.steps, [*run.steps[1:], None], strict=True)
    )
    path = out / f"timeline-{tag}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    path.write_text(text + "\n")
    print(f"\n{text}\n(timeline written to {path})")


def seconds(offset: float | None) -> str:
    return "never" if offset is None else f"+{offset:.2f}s"


def describe_moves(moves: list[Move], arrivals: list[Arrival]) -> list[str]:
    """One line per worker that left and per worker that came, for the step's figures."""
    lines = [
        f"{m.worker} on {m.node}: out of discover_hosts.sh {seconds(m.out_of_discovery)}, "
        f"deleted (Terminating) {seconds(m.deleted)}, rank left {seconds(m.rank_left)}, "
        f"gone from the API {seconds(m.gone)}"
        for m in moves
    ]
    lines += [
        f"replacement {a.worker} on {a.node or '?'}: Running {seconds(a.running)}, listed "
        f"{seconds(a.listed)}, rank running {seconds(a.rank_running)}"
        for a in arrivals
    ]
    return lines
