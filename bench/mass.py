"""Benchmark: mass changes to a fleet of elastic MPIJobs, each beside the cluster's floor.

Issue 33. N elastic MPIJobs of W workers (min W/2, max 3W/2, drain 0) run on a pool of
ten fake KWOK nodes of the benchmark's own (every pod is pinned to the pool by a
nodeSelector); our controller runs as a process. Then, one after the other:

1. **Floor before the rescale** (``bench/floor.py``): as many plain pods as the rescale
   creates (it deletes as many), created by a client with 32 requests in flight, first
   create → last Running (``up``), then deleted the same way, first delete → last gone
   (``down``).
2. **Mass rescale**: half of the jobs edited at once (the issue's 500 of 1000), half of
   those W → W/2 and half W → 3W/2; per job, its edit's answer → its host list right.
3. **Node-pool loss, evicted**: the floor again, as many plain pods as the lost nodes
   hold, and **the eviction floor**: as many plain pods created to Running on two nodes of
   their own, which are then tainted NoExecute (``floor.evicted``): the cluster's own
   taint eviction, taint → last pod gone, with no controller in the way. Then a fifth of
   the pool's nodes tainted NoExecute: the cluster's taint eviction (kube-controller-
   manager) marks their pods DisruptionTarget and deletes them, as it does when a node is
   lost; per job that had a pod there, the first taint → its host list right, against
   both floors.
4. **Node-pool loss, deleted**: the floor again; another fifth tainted NoSchedule and
   every pod on it deleted by the floor's 32-request client (the issue's "tainted and
   their pods deleted"): pods deleted by someone, without the eviction's DisruptionTarget.

The Kueue admission wave and its eviction are bench/wave.py's.

**Host list right**: ``discover_hosts.sh`` (the ``<job>-config`` ConfigMap) lists exactly
the job's target number of workers, every one of them a pod that exists, is not being
deleted and is on no lost node, and the job's launcher pod exists, likewise. Both ends on
the benchmark's clock, from its own watches of the namespace.

**The floor a change is compared with** is ``up + down`` of the floor measured just before
it with the change's pod count: the time a 32-request client, with no controller in the
way, takes to create that many pods to Running and to delete as many to gone, one after
the other. The rescale creates and deletes ``W/2`` pods per edited job; the loss deletes
the pods on the lost nodes and the controller creates as many. The issue's goals: the
change's per-job p50 and max at most 1.5 times the floor; fair: max at most 1.5 times p50.
An evicted loss is paced by the cluster's taint eviction, not by a client, so it is also
set beside ``up`` plus the eviction floor's taint → last gone: the cluster's own time to
evict that many pods and to run as many again.

**Writes per changed job**: every ADDED/MODIFIED/DELETED the watches saw of the job's own
objects (its pods, ConfigMaps, Role, RoleBinding, ServiceAccount, budget, MPIJob and the
Events named after them), from the first edit (or taint) until the namespace was quiet
for 5 s, per job, by kind, beside what one change needs: the floor's own events per pod
(creation, scheduling, KWOK's Running, deletion: on the Pod and Event watches) for each
pod the change creates or deletes, plus the writes of the change itself (``NEEDS_DOWN``,
``NEEDS_UP``): the edit (an MPIJob MODIFIED); the status twice, while the change is under
way (``Scaling`` true) and once it is done; the Role once (exec on the new set of
workers); the launcher's refresh annotation once (a Pod MODIFIED); its ScaledUp or
WorkerDeleted Event. A scale-in writes its host list once (both files in one write) and
gives each victim its ``worker-leaving`` notice before its delete (a Pod MODIFIED each);
the benchmark's drain of 0 s adds its ``DrainDisabled`` warning. A scale-out writes the
``hostfile`` at its edit (as training-operator 1.9 does: a launcher that starts reads it)
and ``discover_hosts.sh`` once its workers run. Changes of the job's goodput state
(docs/operations.md) are written with the status when they come apart from it.

The pods run no processes (KWOK), so the mock driver is not part of this benchmark; its
"failures" here are jobs whose Failed condition is true; launcher restarts
(``MPIJobRestarting`` Events: a launcher lost with its node is started again) are counted.

**What each change cost the cluster**: the CPU seconds of the local cluster's processes
(API server, etcd, kube-controller-manager, scheduler, KWOK) and of our controller over the
change and over its floor, and the time kube-controller-manager's disruption controller
spent syncing PodDisruptionBudgets (from its /metrics); and what the API server served over
each, from its /metrics: the twenty requests it answered most, by verb and resource, and
the watch events it sent, by kind (one per watcher an object's change reached). Each
elastic job has a budget, and that controller syncs it on every change of a pod it selects
by listing every pod of the namespace: its cost grows with the pods of a namespace, so
``--namespaces K`` spreads the jobs over K namespaces (job i in the (i mod K)-th; the
floor's pods in the first).

    python -m bench.mass [--jobs 100] [--workers 8] [--namespaces 1] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import config as kube_config

from bench import floor
from bench.cluster import (
    ClusterCost,
    Controller,
    cluster,
    install_crd,
    job_manifest,
    kubectl_binary,
    machine,
    sh,
)
from bench.fleet import bounded, percentile, sizes_main, sizes_table, wait_for, watching
from mpijob_elastic.core import names
from mpijob_elastic.machinery.kube import MERGE_PATCH, ApiError, Kube

Obj = dict[str, Any]

POOL_LABEL = "mpijob-elastic.io/bench-pool"
POOL = "mass"
SELECTOR = {POOL_LABEL: POOL}
POOL_NODES = 10
LOST_SHARE = 5  # a fifth of the pool's nodes
LOSS_TAINT = "mpijob-elastic.io/bench-pool-lost"
# Two nodes of the eviction floor's own (no job pod goes there): as many as a loss takes.
EVICT_FLOOR = "evict-floor"
EVICT_FLOOR_NODES = 2
# Quiet: nothing changed in the namespace for this long.
QUIET_SECONDS = 5.0
QUIET_LIMIT = 180.0
CHANGE_LIMIT = 900.0
# Every object of a job is named after it: job-7, job-7-worker-3, job-7-config, and its
# Events job-7-worker-3.<hash>.
_JOB = re.compile(r"^(job-\d+)(?:[-.]|$)")
# Writes one change needs besides its pods' own (the module's docstring); a scale-in's
# Pod writes also count a notice per victim (``_needed``).
NEEDS_DOWN = {"ConfigMap": 1, "Role": 1, "MPIJob": 3, "Event": 2, "Pod": 1}
NEEDS_UP = {"ConfigMap": 2, "Role": 1, "MPIJob": 3, "Event": 1, "Pod": 1}


def slim(obj: Obj) -> Obj:
    """What the benchmark reads of an object."""
    meta = obj["metadata"]
    kept: Obj = {
        "metadata": {
            k: meta[k]
            for k in (
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "labels",
                "annotations",
                "ownerReferences",
                "deletionTimestamp",
            )
            if k in meta
        }
    }
    script = (obj.get("data") or {}).get(names.DISCOVER_HOSTS)
    if script is not None:
        kept["data"] = {names.DISCOVER_HOSTS: script}
    spec = obj.get("spec") or {}
    if isinstance(spec, dict) and spec.get("nodeName"):
        kept["spec"] = {"nodeName": spec["nodeName"]}
    status = obj.get("status")
    if isinstance(status, dict):
        kept["status"] = {k: status[k] for k in ("phase", "conditions") if k in status}
    if "reason" in obj:
        kept["reason"] = obj["reason"]
    fields = [f for f in meta.get("managedFields") or [] if isinstance(f, dict)]
    if fields:
        kept["writer"] = max(fields, key=lambda f: str(f.get("time", ""))).get("manager", "")
    return kept


def listed(script: str) -> list[str]:
    """The pod names a ``discover_hosts.sh`` lists (``echo <pod>[.<domain>][:<slots>]``)."""
    return [
        line.removeprefix("echo ").split(":")[0].split(".")[0]
        for line in script.splitlines()
        if line.startswith("echo ")
    ]


@dataclass
class Pod:
    node: str
    deleting: bool
    uid: str
    running: float | None = None  # when first seen Running
    created: float | None = None  # when first seen


@dataclass
class Job:
    name: str
    want: int
    namespace: str
    hosts: list[str] = field(default_factory=list)
    pods: dict[str, Pod] = field(default_factory=dict)
    converged: float | None = None
    started: float | None = None  # the change's start for this job (edit answered, taint)
    done: float | None = None
    failed: bool = False


@dataclass
class Mass:
    """The benchmark's view of its jobs, and every change it saw: when, kind, whose."""

    jobs: dict[str, Job] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    # (when, kind, the job it is of or "", the object's UID, who wrote it last: the
    # field manager of its newest managedFields entry, to the second)
    changes: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    gone: dict[str, float] = field(default_factory=dict)  # pod UID: when seen deleted
    # Pod UID: its labels, annotations and status as last seen (what its next event changed)
    seen: dict[str, dict[str, str]] = field(default_factory=dict)

    def handler(self, kind: str) -> Any:
        def on_event(type_: str, obj: Obj) -> None:
            now = time.monotonic()
            name = obj["metadata"]["name"]
            match = _JOB.match(name)
            owner = match.group(1) if match else ""
            writer = "" if type_ == "DELETED" else str(obj.get("writer", ""))
            if kind == "Pod" and type_ != "DELETED":
                what = self._changed(obj)
                writer = f"{writer} {what}" if type_ == "MODIFIED" else writer
            self.changes.append((now, kind, owner, obj["metadata"].get("uid", ""), writer))
            job = self.jobs.get(owner)
            if kind == "Event" and obj.get("reason") == "MPIJobRestarting" and type_ == "ADDED":
                self.restarts.append(now)
            if job is None:
                return
            if kind == "Pod":
                uid = obj["metadata"].get("uid", "")
                if type_ == "DELETED":
                    job.pods.pop(name, None)
                    self.gone[uid] = now
                else:
                    node = (obj.get("spec") or {}).get("nodeName") or ""
                    was = job.pods.get(name)
                    running = was.running if was is not None and was.uid == uid else None
                    if running is None and (obj.get("status") or {}).get("phase") == "Running":
                        running = now
                    created = was.created if was is not None and was.uid == uid else now
                    job.pods[name] = Pod(
                        node, "deletionTimestamp" in obj["metadata"], uid, running, created
                    )
            elif kind == "ConfigMap" and name == names.config_map_name(owner):
                script = (
                    "" if type_ == "DELETED" else (obj.get("data") or {}).get(names.DISCOVER_HOSTS)
                )
                job.hosts = listed(script or "")
            elif kind == "MPIJob" and name == owner:
                conditions = (obj.get("status") or {}).get("conditions") or []
                job.failed = any(
                    c.get("type") == "Failed" and c.get("status") == "True" for c in conditions
                )
            self.check(job, now)

        return on_event

    def _changed(self, pod: Obj) -> str:
        """What changed of a pod since its last event: its labels', annotations' keys
        (the last part of each), its status; "?" if nothing the benchmark keeps."""
        meta = pod["metadata"]
        now = {
            **{f"label {k}": v for k, v in (meta.get("labels") or {}).items()},
            **{f"annotation {k}": v for k, v in (meta.get("annotations") or {}).items()},
            "deleting": str(bool(meta.get("deletionTimestamp"))),
            "status": json.dumps(pod.get("status"), sort_keys=True),
        }
        before = self.seen.get(meta.get("uid", ""), now)
        self.seen[meta.get("uid", "")] = now
        keys = sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))
        return "+".join(k.rsplit("/", 1)[-1] for k in keys) or "?"

    def alive(self, job: Job, pod_name: str) -> bool:
        pod = job.pods.get(pod_name)
        return pod is not None and not pod.deleting and pod.node not in self.lost

    def right(self, job: Job) -> bool:
        return (
            len(job.hosts) == job.want
            and all(self.alive(job, h) for h in job.hosts)
            and self.alive(job, names.launcher_name(job.name))
        )

    def check(self, job: Job, now: float) -> None:
        if not self.right(job):
            return
        if job.converged is None:
            job.converged = now
        if job.started is not None and job.done is None:
            job.done = now

    def writes(self, start: float, end: float, jobs: Iterable[str]) -> Counter[str]:
        """Changes seen of these jobs' objects in [start, end), by kind."""
        wanted = set(jobs)
        return Counter(k for t, k, j, _, _ in self.changes if start <= t < end and j in wanted)

    def floor_events(self, start: float, end: float) -> Counter[str]:
        """Changes seen of objects of no job (the floor's pods and their Events)."""
        return Counter(k for t, k, j, _, _ in self.changes if start <= t < end and not j)

    def pod_uids(self, jobs: Iterable[Job]) -> set[str]:
        return {p.uid for j in jobs for p in j.pods.values()}

    def pod_writes(
        self, start: float, end: float, jobs: Iterable[Job], before: set[str]
    ) -> dict[str, Any]:
        """The Pod changes seen of these jobs' pods in [start, end): of the pods that left
        (there at ``start``, gone at the end), the new ones, and the ones kept; and how
        many pods each of those was."""
        jobs = list(jobs)
        wanted = {j.name for j in jobs}
        after = self.pod_uids(jobs)
        seen: Counter[str] = Counter()
        writers: Counter[str] = Counter()
        new: set[str] = set()
        for t, kind, job, uid, writer in self.changes:
            if kind != "Pod" or not start <= t < end or job not in wanted:
                continue
            if uid not in before:
                seen["new"] += 1
                new.add(uid)
            elif uid not in after:
                seen["left"] += 1
            else:
                seen["kept"] += 1
                writers[writer or "?"] += 1
        counts = {"left": len(before - after), "new": len(new), "kept": len(before & after)}
        found: dict[str, Any] = {
            way: {"pods": counts[way], "events": seen[way]} for way in ("left", "new", "kept")
        }
        found["kept"]["writers"] = dict(writers.most_common())
        return found

    async def quiet(self) -> float:
        """Waits until nothing changed for QUIET_SECONDS (at most QUIET_LIMIT); the time of
        the last change."""

        def last() -> float:
            return self.changes[-1][0] if self.changes else 0.0

        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: time.monotonic() - last() >= QUIET_SECONDS, QUIET_LIMIT, "")
        return last()


@dataclass
class Options:
    jobs: int = 100
    workers: int = 8
    nodes: int = POOL_NODES
    # Job i goes to the (i mod n)-th of n namespaces: the cluster's cost of the jobs'
    # PodDisruptionBudgets grows with a namespace's pods (docs/benchmarks.md).
    namespaces: int = 1


def ratios(lags: list[float], floor_s: float) -> dict[str, float]:
    p50, worst = statistics.median(lags), max(lags)
    return {
        "p50_s": round(p50, 2),
        "p99_s": round(percentile(lags, 0.99), 2),
        "max_s": round(worst, 2),
        "floor_s": round(floor_s, 2),
        "p50_x_floor": round(p50 / floor_s, 2),
        "max_x_floor": round(worst / floor_s, 2),
        "max_x_p50": round(worst / p50, 2),
    }


def new_pod_steps(
    jobs: Iterable[Job], before: set[str], start: dict[str, float | None]
) -> dict[str, str]:
    """Per job, from its change's ``start``: its last new pod (not in ``before``) seen
    created; from then, the last seen Running; from then, its host list right."""
    steps: dict[str, list[float]] = {"created": [], "running": [], "listed": []}
    for j in jobs:
        new = [p for p in j.pods.values() if p.uid not in before]
        made = [p.created for p in new if p.created]
        runs = [p.running for p in new if p.running]
        began = start.get(j.name)
        if j.done is None or began is None or not made or not runs:
            continue
        steps["created"].append(max(made) - began)
        steps["running"].append(max(runs) - max(made))
        steps["listed"].append(j.done - max(runs))
    return {k: p50_max(v) for k, v in steps.items()}


def p50_max(lags: list[float]) -> str:
    """``p50 / max`` of seconds, or "-" for none."""
    return f"{statistics.median(lags):.2f} / {max(lags):.2f}" if lags else "-"


def per_job(counts: Counter[str], jobs: int) -> dict[str, float]:
    return {k: round(v / jobs, 2) for k, v in sorted(counts.items())} if jobs else {}


def _needed(
    floor_counts: Counter[str], floor_pods: int, pods_per_job: float, down: bool
) -> dict[str, float]:
    """What one change of ``pods_per_job`` pods up or down needs, per kind: the floor's
    events per pod for each (creation to Running, or deletion to gone), its own writes,
    and a scale-in's notice to each victim."""
    need = {k: v / max(floor_pods, 1) * pods_per_job for k, v in floor_counts.items()}
    for kind, n in (NEEDS_DOWN if down else NEEDS_UP).items():
        need[kind] = need.get(kind, 0.0) + n
    if down:
        need["Pod"] += pods_per_job
    return {k: round(v, 2) for k, v in sorted(need.items())}


async def floor_with_events(
    api: Any, namespace: str, mass: Mass, count: int, cost: ClusterCost
) -> dict[str, Any]:
    before, served = cost.read(), cost.requests()
    result = await floor.measure(api, namespace, count, node_selector=SELECTOR)
    result["cpu_s"] = cost.since(before)
    result["requests"] = cost.requests_since(served)
    marks = result.pop("marks")
    up = mass.floor_events(marks["created"], marks["deleted"])
    down = mass.floor_events(marks["deleted"], marks["ended"] + 1.0)
    result["events_up"] = dict(up)
    result["events_down"] = dict(down)
    await mass.quiet()
    return result


async def eviction_floor(
    api: Any, namespace: str, mass: Mass, count: int, cost: ClusterCost
) -> dict[str, Any]:
    """The cluster's own taint eviction of ``count`` plain pods on nodes of their own."""
    before = cost.read()
    nodes = [f"kwok-{EVICT_FLOOR}-{i}" for i in range(EVICT_FLOOR_NODES)]
    result = await floor.evicted(api, namespace, count, nodes, LOSS_TAINT)
    result["cpu_s"] = cost.since(before)
    await mass.quiet()
    return result


def _beside_eviction(lags: list[float], evict_base: dict[str, Any]) -> dict[str, Any]:
    """An evicted loss beside the cluster's own pace for it: its taint eviction of as many
    plain pods, then as many created to Running."""
    floor_s = round(evict_base["up_s"] + evict_base["evict_s"], 2)
    p50, top = statistics.median(lags), max(lags)
    return {
        "evict_floor": evict_base,
        "evict_floor_s": floor_s,
        "p50_x_evict_floor": round(p50 / floor_s, 2),
        "max_x_evict_floor": round(top / floor_s, 2),
    }


def progress(step: str) -> None:
    """A line on stderr as each step starts: a run takes half an hour at 1000 jobs."""
    print(f"[bench.mass {time.strftime('%H:%M:%S')}] {step}", file=sys.stderr, flush=True)


async def measure(kubeconfig: str, spaces: list[str], opts: Options) -> dict[str, Any]:
    """``spaces``: the jobs' namespaces; the floor's pods go to the first."""
    namespace = spaces[0]
    api = await kube_config.new_client_from_config(config_file=kubeconfig)
    kube = Kube(api)
    mass = Mass()
    cost = ClusterCost(kubeconfig)
    informers = [i for ns in spaces for i in watching(api, mass.handler, ns, slim)]
    controller = Controller(kubeconfig)
    result: dict[str, Any] = {"jobs": opts.jobs, "workers": opts.workers, **machine()}
    try:
        for informer in informers:
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in informers))
        controller.start()
        await controller.ready()
        progress(f"{opts.jobs} jobs created")
        await _create(kube, spaces, mass, opts, result)
        await mass.quiet()
        progress("the mass rescale, after its floor")
        await _rescale(api, kube, namespace, mass, opts, result, cost)
        progress("the evicted loss, after its floors")
        result["loss"] = await _loss(api, kube, namespace, mass, opts, cost, "evict", 0)
        progress("the deleted loss, after its floor")
        result["loss_delete"] = await _loss(api, kube, namespace, mass, opts, cost, "delete", 1)
        progress("done")
        result["failed_jobs"] = sum(1 for j in mass.jobs.values() if j.failed)
        result["all_right_at_end"] = all(mass.right(j) for j in mass.jobs.values())
    finally:
        controller.stop()
        for informer in informers:
            await informer.stop()
        await api.close()
    result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return result


async def _create(
    kube: Kube, spaces: list[str], mass: Mass, opts: Options, result: dict[str, Any]
) -> None:
    w = opts.workers
    for i in range(opts.jobs):
        mass.jobs[f"job-{i}"] = Job(f"job-{i}", w, spaces[i % len(spaces)])

    async def create(job: Job) -> None:
        manifest = job_manifest(job.name, w, max_workers=w + w // 2, min_workers=w // 2)
        manifest["metadata"]["namespace"] = job.namespace
        for role in manifest["spec"]["mpiReplicaSpecs"].values():
            role["template"]["spec"]["nodeSelector"] = dict(SELECTOR)
        await kube.create(manifest)

    t0 = time.monotonic()
    await bounded([lambda j=j: create(j) for j in mass.jobs.values()])
    await wait_for(
        lambda: all(j.converged is not None for j in mass.jobs.values()), CHANGE_LIMIT, "converge"
    )
    done = [j.converged - t0 for j in mass.jobs.values() if j.converged is not None]
    result["converge_p50_s"] = round(statistics.median(done), 1)
    result["converge_max_s"] = round(max(done), 1)


async def _rescale(
    api: Any,
    kube: Kube,
    namespace: str,
    mass: Mass,
    opts: Options,
    result: dict[str, Any],
    cost: ClusterCost,
) -> None:
    w = opts.workers
    edited = list(mass.jobs.values())[: opts.jobs // 2]
    down = edited[0::2]
    up = edited[1::2]
    deletes = len(down) * (w - w // 2)
    creates = len(up) * (w // 2)
    base = await floor_with_events(api, namespace, mass, max(creates, deletes), cost)

    for job in down:
        job.want = w // 2
    for job in up:
        job.want = w + w // 2

    before = mass.pod_uids(edited)

    async def edit(job: Job) -> None:
        job.done = None
        patch = {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": job.want}}}}
        await kube.patch(names.KIND, job.namespace, job.name, patch)
        job.started = time.monotonic()
        mass.check(job, job.started)

    spent, served = cost.read(), cost.requests()
    t0 = time.monotonic()
    await bounded([lambda j=j: edit(j) for j in edited])
    await wait_for(lambda: all(j.done is not None for j in edited), CHANGE_LIMIT, "rescale")
    t1 = time.monotonic()
    end = await mass.quiet()
    lags = [j.done - j.started for j in edited if j.done is not None and j.started is not None]
    floor_s = base["up_s"] + base["down_s"]

    def lag(jobs: list[Job]) -> str:
        return p50_max(
            [j.done - j.started for j in jobs if j.done is not None and j.started is not None]
        )

    result["rescale"] = {
        "floor": base,
        "jobs": len(edited),
        "pods_created": creates,
        "pods_deleted": deletes,
        "all_s": round(t1 - t0, 2),
        "down_p50_max_s": lag(down),
        "up_p50_max_s": lag(up),
        "up_steps_s": new_pod_steps(up, before, {j.name: j.started for j in up}),
        **ratios(lags, floor_s),
        "writes_per_job_down": per_job(mass.writes(t0, end + 1, (j.name for j in down)), len(down)),
        "writes_per_job_up": per_job(mass.writes(t0, end + 1, (j.name for j in up)), len(up)),
        "needed_per_job_down": _needed(
            Counter(base["events_down"]), base["pods"], w - w // 2, down=True
        ),
        "needed_per_job_up": _needed(Counter(base["events_up"]), base["pods"], w // 2, down=False),
        "pod_writes": mass.pod_writes(t0, end + 1, edited, before),
        "cpu_s": cost.since(spent),
        "requests": cost.requests_since(served),
    }
    for job in edited:
        job.started = job.done = None


async def _loss(
    api: Any,
    kube: Kube,
    namespace: str,
    mass: Mass,
    opts: Options,
    cost: ClusterCost,
    way: str,
    fifth: int,
) -> dict[str, Any]:
    """The loss of the ``fifth``-th fifth of the pool's nodes, ``way`` "evict" (a NoExecute
    taint: the cluster's taint eviction deletes their pods, marked DisruptionTarget first)
    or "delete" (NoSchedule, and the pods deleted by a 32-request client)."""
    pool = sorted(
        (f"kwok-mass-{i}" for i in range(opts.nodes)), key=lambda n: int(n.rsplit("-")[-1])
    )
    share = max(1, opts.nodes // LOST_SHARE)
    lost = set(pool[fifth * share : (fifth + 1) * share])
    victims = [
        (job, name, pod.uid)
        for job in mass.jobs.values()
        for name, pod in job.pods.items()
        if pod.node in lost and not pod.deleting
    ]
    hit = {job.name: job for job, _, _ in victims}
    base = await floor_with_events(api, namespace, mass, len(victims), cost)
    evict_base = None
    if way == "evict":
        evict_base = await eviction_floor(api, namespace, mass, len(victims), cost)
    before = mass.pod_uids(hit.values())

    spent, served = cost.read(), cost.requests()
    t0 = time.monotonic()
    mass.lost |= lost
    for job in hit.values():
        job.started, job.done = t0, None
    effect = "NoExecute" if way == "evict" else "NoSchedule"
    taint = {"spec": {"taints": [{"key": LOSS_TAINT, "effect": effect}]}}
    await asyncio.gather(
        *(kube.request("PATCH", f"/api/v1/nodes/{n}", taint, MERGE_PATCH) for n in lost)
    )

    async def delete(job: Job, name: str, uid: str) -> None:
        try:
            await kube.delete("Pod", job.namespace, name, uid)
        except ApiError as err:
            if not (err.not_found or err.conflict):
                raise

    restarts0 = len(mass.restarts)
    answered = None
    if way == "delete":
        await floor.bounded([lambda j=j, n=n, u=u: delete(j, n, u) for j, n, u in victims])
        answered = round(time.monotonic() - t0, 2)
    await wait_for(lambda: all(j.done is not None for j in hit.values()), CHANGE_LIMIT, "loss")
    t1 = time.monotonic()
    end = await mass.quiet()
    lags = [j.done - t0 for j in hit.values() if j.done is not None]
    spent = cost.since(spent)
    requests = cost.requests_since(served)
    gone = [mass.gone.get(u) for _, _, u in victims]
    # The controller's own share: per job, its last lost pod seen gone → its host list right.
    last_gone: dict[str, float] = {}
    for job, _, uid in victims:
        if uid in mass.gone:
            last_gone[job.name] = max(last_gone.get(job.name, 0.0), mass.gone[uid])
    lost_launcher = {job.name for job, n, _ in victims if n.endswith("-launcher")}
    after_gone = [
        j.done - last_gone[j.name] for j in hit.values() if j.done and j.name in last_gone
    ]
    workers_only = [
        j.done - last_gone[j.name]
        for j in hit.values()
        if j.done and j.name in last_gone and j.name not in lost_launcher
    ]
    steps = new_pod_steps(hit.values(), before, {j: t0 for j in hit})
    for job in hit.values():
        job.started = job.done = None
    return {
        "way": way,
        "cpu_s": spent,
        "requests": requests,
        "new_pod_steps_s": steps,
        "floor": base,
        "nodes": len(pool),
        "nodes_lost": len(lost),
        "pods_deleted": len(victims),
        "launchers_lost": sum(1 for _, n, _ in victims if n.endswith("-launcher")),
        "jobs_hit": len(hit),
        "last_gone_s": round(max(g for g in gone if g is not None) - t0, 2)
        if all(g is not None for g in gone)
        else None,
        "deletes_answered_s": answered,
        "first_gone_s": round(min(g for g in gone if g is not None) - t0, 2),
        "all_s": round(t1 - t0, 2),
        "restarts": len(mass.restarts) - restarts0,
        "gone_to_right_p50_s": round(statistics.median(after_gone), 2),
        "gone_to_right_max_s": round(max(after_gone), 2),
        "workers_only_gone_to_right_p50_s": round(statistics.median(workers_only), 2)
        if workers_only
        else None,
        **ratios(lags, base["up_s"] + base["down_s"]),
        **(_beside_eviction(lags, evict_base) if evict_base else {}),
        "writes_per_job": per_job(mass.writes(t0, end + 1, hit), len(hit)),
        "pods_per_job": round(len(victims) / max(len(hit), 1), 2),
        "pod_writes": mass.pod_writes(t0, end + 1, hit.values(), before),
        "kept_launcher_pod_writes": mass.pod_writes(
            t0, end + 1, (j for j in hit.values() if j.name not in lost_launcher), before
        )["kept"],
    }


def pool_nodes(kubectl: list[str], count: int, pods_each: int, pool: str = POOL) -> None:
    """The benchmark's own fake nodes, labelled for its pods' nodeSelector."""
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(pods_each)}
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"kwok-{pool}-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": f"kwok-{pool}-{i}",
                    "type": "kwok",
                    POOL_LABEL: pool,
                },
            },
            "status": {"allocatable": capacity, "capacity": capacity},
        }
        for i in range(count)
    ]
    listing = {"apiVersion": "v1", "kind": "List", "items": nodes}
    sh(*kubectl, "apply", "-f", "-", input=json.dumps(listing))
    sh(
        *kubectl,
        "wait",
        "--for=condition=Ready",
        "node",
        "-l",
        f"{POOL_LABEL}={pool}",
        "--timeout=300s",
    )


def run(kubeconfig: str | None, opts: Options) -> dict[str, Any]:
    """One size on the given cluster (which must run KWOK for the pool's fake nodes), or on
    a fresh local one."""
    w = opts.workers
    # Room for every pod at the rescale's peak, plus a floor's, on the nodes left after both losses.
    peak = opts.jobs * (w + w // 2 + 1) + opts.jobs * w
    left = opts.nodes - 2 * max(1, opts.nodes // LOST_SHARE)
    with cluster(kubeconfig) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        pool_nodes(k, opts.nodes, -(-peak // left) + 110)
        pool_nodes(k, EVICT_FLOOR_NODES, opts.jobs * w, EVICT_FLOOR)
        install_crd(k)
        spaces = [f"bench-mass-{os.getpid()}-{i}" for i in range(opts.namespaces)]
        for namespace in spaces:
            sh(*k, "create", "namespace", namespace)
        for namespace in spaces:
            floor.wait_default_service_account(k, namespace)
        try:
            result = asyncio.run(measure(config, spaces, opts))
            return {**result, "namespaces": opts.namespaces}
        finally:
            # A given cluster is someone's: leave it as found (the local one goes anyway).
            if kubeconfig is not None:
                sh(*k, "delete", "namespace", *spaces, "--wait=false")
                for pool in (POOL, EVICT_FLOOR):
                    sh(*k, "delete", "node", "-l", f"{POOL_LABEL}={pool}", "--wait=false")


def _goal(x: float) -> str:
    return f"{x} {'✓' if x <= 1.5 else '✗'}"


def _kinds(counts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in counts.items()) or "0"


def _counts(change: dict[str, Any], jobs: str, *pods: str) -> str:
    return f"{change[jobs]}; " + " / ".join(str(change[p]) for p in pods)


def _seen_needed(change: dict[str, Any], way: str) -> str:
    seen = _kinds(change[f"writes_per_job_{way}"])
    return f"{seen} / {_kinds(change[f'needed_per_job_{way}'])}"


def _floor_cell(f: dict[str, Any]) -> str:
    return (
        f"{f['pods']} pods: up {f['up_s']} s ({f['up_pods_per_s']}/s), "
        f"down {f['down_s']} s ({f['down_pods_per_s']}/s)"
    )


def _change_rows(key: str, what: str) -> list[tuple[str, Any]]:
    return [
        (
            f"{what}: per job → host list right, p50 / p99 / max",
            lambda r: f"{r[key]['p50_s']} / {r[key]['p99_s']} / {r[key]['max_s']} s",
        ),
        (f"{what}: first change → all right", lambda r: f"{r[key]['all_s']} s"),
        (f"{what}: floor (up + down, same pod count)", lambda r: f"{r[key]['floor_s']} s"),
        (f"{what}: p50 / floor (goal ≤ 1.5)", lambda r: _goal(r[key]["p50_x_floor"])),
        (f"{what}: max / floor (goal ≤ 1.5)", lambda r: _goal(r[key]["max_x_floor"])),
        (f"{what}: max / p50 (fair: ≤ 1.5)", lambda r: _goal(r[key]["max_x_p50"])),
        (
            f"{what}: CPU seconds of the cluster's processes, the change / its floor",
            lambda r: f"{_cpu(r[key]['cpu_s'])} / {_cpu(r[key]['floor']['cpu_s'])}",
        ),
        (
            f"{what}: the API server's most served requests and watch events, the change"
            " / its floor",
            lambda r: f"{_kinds(r[key]['requests'])} / {_kinds(r[key]['floor']['requests'])}",
        ),
    ]


def _cpu(spent: dict[str, float]) -> str:
    return ", ".join(f"{k} {v}" for k, v in spent.items()) or "-"


def _loss_rows(key: str, what: str) -> list[tuple[str, Any]]:
    return [
        (f"floor before the {what}", lambda r: _floor_cell(r[key]["floor"])),
        (
            f"{what}: nodes lost; pods on them (launchers); jobs hit; launcher restarts",
            lambda r: (
                f"{r[key]['nodes_lost']} of {r[key]['nodes']}; {r[key]['pods_deleted']}"
                f" ({r[key]['launchers_lost']}); {r[key]['jobs_hit']}; {r[key]['restarts']}"
            ),
        ),
        (
            f"{what}: first taint → deletes answered / first / last of those pods gone",
            lambda r: (
                f"{r[key]['deletes_answered_s'] or '-'} / {r[key]['first_gone_s']}"
                f" / {r[key]['last_gone_s']} s"
            ),
        ),
        (
            f"{what}: per job, its last lost pod gone → host list right, p50 / max",
            lambda r: (
                f"{r[key]['gone_to_right_p50_s']} / {r[key]['gone_to_right_max_s']} s (p50 of"
                f" jobs that kept their launcher: {r[key]['workers_only_gone_to_right_p50_s']} s)"
            ),
        ),
        (
            f"{what}: per job, first taint → last new pod created; → last Running; → host"
            " list right, p50 / max",
            lambda r: "; ".join(f"{v} s" for v in r[key]["new_pod_steps_s"].values()),
        ),
        *_change_rows(key, what),
        *(_eviction_rows(key, what) if key == "loss" else []),
        (
            f"{what}: writes per job hit (pods lost per job)",
            lambda r: f"{_kinds(r[key]['writes_per_job'])} ({r[key]['pods_per_job']})",
        ),
        (f"{what}: Pod events per pod that left / new / kept", lambda r: pod_events(r[key])),
        (
            f"{what}: of those, the kept pods of jobs that kept their launcher, by writer",
            lambda r: _by_writer(r[key]["kept_launcher_pod_writes"]),
        ),
    ]


def _eviction_rows(key: str, what: str) -> list[tuple[str, Any]]:
    def cell(r: dict[str, Any]) -> str:
        e = r[key]["evict_floor"]
        return (
            f"{e['pods']} pods on {e['nodes']} nodes: up {e['up_s']} s; taint → first / half"
            f" / last gone {e['evict_first_s']} / {e['evict_half_s']} / {e['evict_s']} s"
            f" ({e['evict_pods_per_s']}/s)"
        )

    return [
        (f"{what}: the cluster's own eviction of as many plain pods", cell),
        (
            f"{what}: eviction floor (up + taint → last gone)",
            lambda r: f"{r[key]['evict_floor_s']} s",
        ),
        (
            f"{what}: p50 / eviction floor; max / eviction floor (≤ 1.5)",
            lambda r: f"{_goal(r[key]['p50_x_evict_floor'])}; {_goal(r[key]['max_x_evict_floor'])}",
        ),
        (
            f"{what}: CPU seconds over the eviction floor",
            lambda r: _cpu(r[key]["evict_floor"]["cpu_s"]),
        ),
    ]


def _by_writer(kept: dict[str, Any]) -> str:
    by = ", ".join(f"{k} {v}" for k, v in kept.get("writers", {}).items())
    return f"{kept['events'] / max(kept['pods'], 1):.2f} per pod ({kept['pods']} pods): {by}"


def pod_events(change: dict[str, Any]) -> str:
    """Pod events per pod of each sort, and the floor's per pod (created to Running, deleted
    to gone) beside them."""
    f = change["floor"]
    up, down = f["events_up"].get("Pod", 0) / f["pods"], f["events_down"].get("Pod", 0) / f["pods"]
    cells = []
    for way in ("left", "new", "kept"):
        w = change["pod_writes"][way]
        cells.append(f"{w['events'] / max(w['pods'], 1):.2f} ({w['pods']} pods)")
    by = _by_writer(change["pod_writes"]["kept"])
    return " / ".join(cells) + f"; floor: {down:.2f} down, {up:.2f} up; kept pods: {by}"


def _end(r: dict[str, Any]) -> str:
    return f"{r['failed_jobs']}; {'yes' if r['all_right_at_end'] else 'NO'}"


ROWS: list[tuple[str, Any]] = [
    ("jobs x workers; namespaces", lambda r: f"{r['jobs']} x {r['workers']}; {r['namespaces']}"),
    (
        "first create → converged, p50 / max",
        lambda r: f"{r['converge_p50_s']} / {r['converge_max_s']} s",
    ),
    (
        "floor before the rescale (32 requests in flight)",
        lambda r: _floor_cell(r["rescale"]["floor"]),
    ),
    (
        "mass rescale: jobs edited (half ↓ W/2, half ↑ 3W/2); pods created / deleted",
        lambda r: _counts(r["rescale"], "jobs", "pods_created", "pods_deleted"),
    ),
    *_change_rows("rescale", "rescale"),
    (
        "rescale: p50 / max of the jobs ↓, of the jobs ↑",
        lambda r: f"{r['rescale']['down_p50_max_s']} s, {r['rescale']['up_p50_max_s']} s",
    ),
    (
        "rescale: per job ↑, edit → last new pod created; → last Running; → host list right,"
        " p50 / max",
        lambda r: "; ".join(f"{v} s" for v in r["rescale"]["up_steps_s"].values()),
    ),
    (
        "rescale: writes per job ↓ seen / one change needs",
        lambda r: _seen_needed(r["rescale"], "down"),
    ),
    (
        "rescale: writes per job ↑ seen / one change needs",
        lambda r: _seen_needed(r["rescale"], "up"),
    ),
    ("rescale: Pod events per pod that left / new / kept", lambda r: pod_events(r["rescale"])),
    *_loss_rows("loss", "loss, evicted (NoExecute)"),
    *_loss_rows("loss_delete", "loss, deleted (NoSchedule + deletes)"),
    ("jobs failed at the end; all host lists right", lambda r: _end(r)),
    ("load average before / after", lambda r: f"{r['load']} / {r['load_after']}"),
]


def table(results: list[dict[str, Any]]) -> str:
    return sizes_table(ROWS, results)


def main() -> None:
    spread = argparse.ArgumentParser(add_help=False)
    spread.add_argument("--namespaces", type=int, default=1, help="jobs spread over this many")
    known, rest = spread.parse_known_args()
    sys.argv[1:] = rest
    sizes_main(
        __doc__ or "",
        lambda kubeconfig, jobs, workers: run(
            kubeconfig, Options(jobs=jobs, workers=workers, namespaces=known.namespaces)
        ),
        table,
    )


if __name__ == "__main__":
    main()
