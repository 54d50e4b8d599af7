"""Training progress kept across a spot trace, with notices and without (issue 22).

``make bench-spot``: one elastic job (launcher on an on-demand node, workers on three spot
nodes, min-replicas 2) on the local KWOK cluster, through a seeded trace of spot reclaims:
a reclaim taints its nodes with ``aws-node-termination-handler/spot-itn`` (the notice),
force-deletes their pods ``--notice-seconds`` later (the reclaim) and gives the nodes back
``--down-seconds`` after that. Reclaims of two nodes at once take the job below its
minimum, which suspends it (``below-min-timeout-seconds`` 3) until capacity returns.

The same trace runs twice, on a fresh job each time:

* ``with notices``: ``checkpoint-seconds`` ``--window``; rank 0 saves a checkpoint at every
  commit while a ``job-stopping`` notice is up, and once when it appears (the state of its
  last commit: below the minimum Horovod commits nothing), as docs/spot.md recommends;
* ``without notices``: ``checkpoint-seconds`` 0, the notices ignored.

Both also save every ``--checkpoint-every`` seconds, the user's own periodic checkpoint.

Rank 0 is a stand-in here, a thread of this process: it commits every ``--commit-seconds``
while the job trains (its launcher runs and ``discover_hosts.sh`` lists at least
min-replicas workers), reads its launcher's notice from the API (KWOK has no kubelet, so
there is no file; on kind the file is read, e2e/test_notices.py), and when the launcher is
gone (a suspension) counts the steps since its last checkpoint as lost; a new launcher
resumes from the checkpoint. Steps lost per stop, stops and resumes, and time suspended
are reported per row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.cluster import ROOT, Controller, cluster, install_crd, kubectl_binary, machine, sh
from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle.notices import parse_notice
from tests.cluster import Cluster

ON_DEMAND = "kwok-node-0"
SPOT = ("kwok-node-1", "kwok-node-2", "kwok-node-3")
NOTICE_TAINT = "aws-node-termination-handler/spot-itn"
# What keeps a reclaimed node's capacity away until it comes back.
GONE_TAINT = "example.com/reclaimed"
MIN = 2
# A pod as `kubectl get -o jsonpath` names it for the reclaim's deletes.
REF = "{.metadata.namespace}/{.metadata.name} "


@dataclass(frozen=True)
class Reclaim:
    at: float
    nodes: tuple[str, ...]


def trace(seed: int, rounds: int, gap: float) -> list[Reclaim]:
    """Alternating single and double reclaims (a double takes the job below its minimum),
    shuffled and jittered by the seed."""
    rng = random.Random(seed)
    kinds = [2 if i % 2 == 0 else 1 for i in range(rounds)]
    rng.shuffle(kinds)
    found, at = [], 5.0
    for k in kinds:
        found.append(Reclaim(at, tuple(sorted(rng.sample(SPOT, k)))))
        at += gap + rng.uniform(-3, 3)
    return found


def manifest(name: str, window: float) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    launcher = json.loads(json.dumps(template))
    launcher["spec"]["nodeSelector"] = {"kubernetes.io/hostname": ON_DEMAND}
    worker = json.loads(json.dumps(template))
    worker["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": SPOT}
                        ]
                    }
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": names.labels(name, names.ROLE_WORKER)},
                }
            ]
        },
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "annotations": {
                names.ANN_MIN_REPLICAS: str(MIN),
                names.ANN_MAX_REPLICAS: "3",
                names.ANN_DRAIN_SECONDS: "2",
                names.ANN_BELOW_MIN_TIMEOUT: "3",
                names.ANN_SCALE_OUT_TIMEOUT: "0",
                names.ANN_CHECKPOINT_SECONDS: f"{window:g}",
            },
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": launcher},
                "Worker": {"replicas": 3, "template": worker},
            }
        },
    }


@dataclass
class Rank0:
    """The stand-in rank 0 (module docstring); its figures, in commits."""

    api: Cluster
    ns: str
    job: str
    notices: bool
    commit_seconds: float
    checkpoint_every: float
    step: int = 0
    saved: int = 0
    saved_at: float = 0.0
    launcher_uid: str | None = None
    lost: list[int] = field(default_factory=list)
    resumes: int = 0
    noticed: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def look(self) -> tuple[str | None, bool, bool]:
        """The running launcher's uid (None: none runs), whether the job trains, and
        whether a job-stopping notice is up."""
        pods = self.api.raw("GET", f"/api/v1/namespaces/{self.ns}/pods") or {}
        launcher = next(
            (
                p
                for p in pods.get("items", [])
                if p["metadata"]["name"] == names.launcher_name(self.job)
                and not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") == "Running"
            ),
            None,
        )
        if launcher is None:
            return None, False, False
        notice = parse_notice((launcher["metadata"].get("annotations") or {}).get(names.ANN_NOTICE))
        path = f"/api/v1/namespaces/{self.ns}/configmaps/{names.config_map_name(self.job)}"
        data = (self.api.raw("GET", path) or {}).get("data") or {}
        listed = data.get(names.DISCOVER_HOSTS, "").count(names.WORKER_INFIX)
        stopping = notice is not None and notice[0] == "job-stopping"
        return str(launcher["metadata"]["uid"]), listed >= MIN, stopping

    def _save(self, now: float) -> None:
        self.saved, self.saved_at = self.step, now

    def run(self) -> None:
        next_commit = time.monotonic() + self.commit_seconds
        stopping_before = False
        while not self.stop.is_set():
            uid, training, stopping = self.look()
            now = time.monotonic()
            if uid != self.launcher_uid:
                if self.launcher_uid is not None:
                    self.lost.append(self.step - self.saved)  # the run stopped
                if uid is not None:
                    if self.launcher_uid is not None or self.lost:
                        self.resumes += 1
                    self.step = self.saved  # a new run starts from the checkpoint
                    self.saved_at = now
                self.launcher_uid = uid
            if self.notices and stopping and not stopping_before:
                self.noticed.append(now)
                self._save(now)  # the last commit's state, from a thread
            stopping_before = stopping
            if uid is not None and now >= next_commit:
                next_commit = now + self.commit_seconds
                if training:
                    self.step += 1
                    if (self.notices and stopping) or now - self.saved_at >= self.checkpoint_every:
                        self._save(now)
            time.sleep(0.2)


def suspended(api: Cluster, ns: str, job: str) -> bool:
    path = f"/apis/{names.API_VERSION}/namespaces/{ns}/{names.PLURAL}/{job}"
    conditions = ((api.raw("GET", path) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions)


def play(k: list[str], reclaims: list[Reclaim], notice: float, down: float) -> None:
    """The trace, in real time: notice taints, reclaims, nodes back."""
    start = time.monotonic()
    actions: list[tuple[float, str, tuple[str, ...]]] = []
    for r in reclaims:
        actions += [(r.at, "notice", r.nodes), (r.at + notice, "reclaim", r.nodes)]
        actions.append((r.at + notice + down, "back", r.nodes))
    for at, what, nodes in sorted(actions):
        time.sleep(max(0.0, start + at - time.monotonic()))
        for node in nodes:
            if what == "notice":
                sh(*k, "taint", "node", node, f"{NOTICE_TAINT}=:NoSchedule", "--overwrite")
            elif what == "reclaim":
                sh(*k, "taint", "node", node, f"{GONE_TAINT}=:NoSchedule", "--overwrite")
                pods = sh(
                    *k, "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}",
                    "-o", f"jsonpath={{range .items[*]}}{REF}{{end}}",
                )  # fmt: skip
                for ref in pods.split():
                    ns, pod = ref.split("/")
                    sh(*k, "delete", "pod", pod, "-n", ns, "--grace-period=0", "--force")
            else:
                sh(*k, "taint", "node", node, f"{NOTICE_TAINT}-", f"{GONE_TAINT}-")


def row(kubeconfig: str, args: argparse.Namespace, notices: bool) -> dict[str, Any]:
    k = [kubectl_binary(), "--kubeconfig", kubeconfig]
    ns = f"bench-spot-{'with' if notices else 'without'}-{os.getpid()}"
    sh(*k, "create", "namespace", ns)
    controller = Controller(kubeconfig, namespaces=ns)
    controller.start()
    job = "spot"
    window = args.window if notices else 0.0
    sh(*k, "apply", "-n", ns, "-f", "-", input=json.dumps(manifest(job, window)))
    api = Cluster(kubeconfig, k[0])
    rank0 = Rank0(api, ns, job, notices, args.commit_seconds, args.checkpoint_every)
    thread = threading.Thread(target=rank0.run, daemon=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    try:
        deadline = time.monotonic() + 120
        while not rank0.look()[1]:
            if time.monotonic() > deadline:
                raise TimeoutError("the job never trained")
            time.sleep(0.5)
        thread.start()
        reclaims = trace(args.seed, args.rounds, args.gap)
        samples: list[bool] = []
        sampler_stop = threading.Event()

        def sample() -> None:
            sampler_api = Cluster(kubeconfig, k[0])
            while not sampler_stop.is_set():
                samples.append(suspended(sampler_api, ns, job))
                time.sleep(1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        play(k, reclaims, args.notice_seconds, args.down_seconds)
        time.sleep(args.settle)
        sampler_stop.set()
    finally:
        rank0.stop.set()
        controller.stop()
        sh(*k, "delete", "namespace", ns, "--wait=false")
    stops = rank0.lost
    return {
        "row": "with notices" if notices else "without notices",
        "window": window,
        "stops": len(stops),
        "resumes": rank0.resumes,
        "lost": stops,
        "lost_mean": round(sum(stops) / len(stops), 1) if stops else 0,
        "lost_max": max(stops, default=0),
        "steps": rank0.step,
        "suspended_s": sum(samples),
        "reclaims": sum(len(r.nodes) for r in reclaims),
        "below_min": sum(1 for r in reclaims if len(r.nodes) >= MIN),
        "load": load,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"Seed {args.seed}: {results[0]['reclaims']} node reclaims in {args.rounds} rounds, "
        f"{results[0]['below_min']} of them below the minimum; notice {args.notice_seconds:g} s "
        f"before each reclaim, nodes back {args.down_seconds:g} s after; commit every "
        f"{args.commit_seconds:g} s, periodic checkpoint every {args.checkpoint_every:g} s.\n\n"
    )
    lines = [
        "| | stops (suspensions) | resumes | steps lost per stop (each) | mean / max "
        "| time suspended | steps at the end | load before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['row']} (checkpoint-seconds {r['window']:g}) | {r['stops']} | {r['resumes']} "
            f"| {', '.join(map(str, r['lost'])) or '-'} | {r['lost_mean']} / {r['lost_max']} "
            f"| {r['suspended_s']} s | {r['steps']} | {r['load']} / {r['load_after']} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gap", type=float, default=30.0, help="seconds between reclaims")
    parser.add_argument("--notice-seconds", type=float, default=4.0)
    parser.add_argument("--down-seconds", type=float, default=12.0)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--commit-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint-every", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=15.0)
    args = parser.parse_args()
    with cluster(args.kubeconfig) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        results = [row(config, args, True), row(config, args, False)]
    text = table(results, args)
    print(text)
    print(json.dumps({"machine": machine(), "results": results}, indent=1))
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "spot.md").write_text(text)


if __name__ == "__main__":
    main()
