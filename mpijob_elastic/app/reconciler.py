"""The imperative shell: caches in, plan out, writes made in the plan's order.

Shaped like a client-go controller: informers (list+watch caches) turn every change of an
MPIJob or of a child it controls into the job's key on a deduplicating work queue;
reconcile workers read only from the caches, ask the planner what to do, and execute it.
Failures back off per key; success forgets the key's failures. A burst of pod events for
one job collapses into one reconcile instead of delaying it (an upstream defect enqueued
every event rate-limited).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from mpijob_elastic.app.preflight import RECHECK_SECONDS, Preflight
from mpijob_elastic.core import names, nodes
from mpijob_elastic.core.actions import Observed
from mpijob_elastic.core.plan import plan_writes
from mpijob_elastic.core.ranks import PROBE_COMMAND, PROBE_TIMEOUT_SECONDS
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec import launcher_service_account, managed_by
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import RESOURCES, ApiError, Kube
from mpijob_elastic.machinery.kubeclient import ApiClient
from mpijob_elastic.machinery.podexec import PodExec
from mpijob_elastic.machinery.rankprobe import RankProbes
from mpijob_elastic.machinery.store import compact, metadata_only, slim_pod
from mpijob_elastic.machinery.workqueue import ShutDownError, WorkQueue
from mpijob_elastic.machinery.writer import Writer

log = logging.getLogger("mpijob_elastic.app.reconciler")

Key = tuple[str, str]
Obj = dict[str, Any]

# Children are all labelled with the job's name; watching only those keeps the caches to
# the objects this controller can own, not every pod in the cluster.
CHILD_SELECTOR = f"{names.LABEL_GROUP}={names.GROUP},{names.LABEL_JOB}"
CHILD_KINDS = ("Pod", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget")
# Children that training-operator 1.9 made carry its labels, not the v1 ones, until their
# hand-over (handover.py) merges ours in. A label selector cannot say "either set", so a
# second cache per kind watches training-operator's, without the v1 job label: disjoint
# from the main caches, so nothing is held twice, and a child moves from one to the
# other when it is relabelled. Training-operator labels the launcher's ServiceAccount,
# Role, RoleBinding and the ConfigMap only `app=<job>`, which many unrelated objects carry,
# so these caches keep metadata alone: a claim is a patch and needs no more.
HANDOVER_SELECTORS = {
    "Pod": f"{names.LABEL_TO_OPERATOR}={names.TO_OPERATOR},!{names.LABEL_JOB}",
    **{
        kind: f"{names.LABEL_APP},!{names.LABEL_JOB}"
        for kind in ("ConfigMap", "ServiceAccount", "Role", "RoleBinding")
    },
}
# Where an orphan names the job it may belong to.
_JOB_LABELS = (names.LABEL_JOB, names.LABEL_TO_JOB, names.LABEL_APP)


def _job_signature(job: Obj) -> tuple[Any, ...]:
    """What of a job can change its plan; its status cannot, it is our own output.

    A status write is a watch event like any other; reconciling on it would make every
    retry of a failing job trigger the next one at once, bypassing the backoff.
    """
    meta = job["metadata"]
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        json.dumps(meta.get("annotations") or {}, sort_keys=True),
        json.dumps(meta.get("labels") or {}, sort_keys=True),
    )


def _may_move_hosts(type_: str, obj: Obj) -> bool:
    """Whether a child's change can add a host to its job's lists or take one off: a pod
    that runs, ended, or is going. Such changes go to the front of the queue; a pod
    created or scheduled only moves its job along."""
    if obj.get("kind") != "Pod":
        return False
    if type_ == "DELETED" or obj["metadata"].get("deletionTimestamp"):
        return True
    return (obj.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")


def manages(job: Mapping[str, Any], settings: Settings) -> bool:
    value = managed_by(job)
    if settings.only_managed_by:
        return value == names.MANAGED_BY
    return value in (None, names.MANAGED_BY, names.TRAINING_OPERATOR)


class _Caches:
    """One informer per kind and watched namespace (``None``: all namespaces)."""

    def __init__(self) -> None:
        self.by_kind: dict[str, dict[str | None, Informer]] = {}

    def add(self, kind: str, namespace: str | None, informer: Informer) -> None:
        self.by_kind.setdefault(kind, {})[namespace] = informer

    def all(self) -> list[Informer]:
        return [i for group in self.by_kind.values() for i in group.values()]

    def pick(self, kind: str, namespace: str) -> Informer | None:
        group = self.by_kind.get(kind, {})
        return group.get(None) or group.get(namespace)


class Controller:
    def __init__(
        self,
        api: ApiClient,
        settings: Settings,
        *,
        watch_api: ApiClient | None = None,
        lease: tuple[str, str] | None = None,
    ) -> None:
        """``api`` carries the writes; ``watch_api``, if given, the long-lived watches, so
        open watches can never take the connections a write needs; ``lease``, with leader
        election, the Lease's namespace and name, whose grants the start-up check asks for."""
        self.settings = settings
        self.kube = Kube(api)
        watches = watch_api or api
        self.queue: WorkQueue[Key] = WorkQueue(
            rank=self._rank, observe_wait=metrics.QUEUE_WAIT_SECONDS.observe
        )
        metrics.QUEUE_DEPTH.set_function(lambda: len(self.queue))
        metrics.JOBS.jobs = self._managed_jobs
        self.latency = metrics.HostListLatency()
        self.caches = _Caches()
        self.handover = _Caches()
        namespaces: list[str | None] = list(settings.namespaces) or [None]
        for ns in namespaces:
            path, plural = RESOURCES[names.KIND]
            jobs = Informer(watches, path, plural, self._on_job, namespace=ns, transform=compact)
            self.caches.add(names.KIND, ns, jobs)
            # What each cache keeps, and why: docs/design.md, "What the caches hold".
            watched = [
                (kind, CHILD_SELECTOR, self.caches, slim_pod if kind == "Pod" else compact)
                for kind in CHILD_KINDS
            ]
            watched += [
                (kind, selector, self.handover, metadata_only)
                for kind, selector in HANDOVER_SELECTORS.items()
            ]
            for kind, selector, caches, transform in watched:
                path, plural = RESOURCES[kind]
                informer = Informer(
                    watches,
                    path,
                    plural,
                    self._on_child,
                    namespace=ns,
                    label_selector=selector,
                    transform=transform,
                )
                caches.add(kind, ns, informer)
        # Nodes are cluster-wide; only whether each is going away is kept (nodes.py).
        self.caches.add(
            "Node",
            None,
            Informer(watches, "/api/v1", "nodes", self._on_node, transform=nodes.slim),
        )
        self._leaving_nodes: dict[str, str] = {}
        self.writer = Writer(self.kube, self._cache, self._cached)
        self.pod_exec = PodExec(api.configuration)
        self.probes = RankProbes(self._read_launcher, self.queue.add)
        self._job_signatures: dict[Key, tuple[Any, ...]] = {}
        self._first_seen: dict[Key, float] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.preflight = Preflight(self.kube, settings.namespaces, lease)
        self._rechecks: asyncio.Task[None] | None = None
        self._synced = False
        # Leader election (leader.py): a standby keeps its caches and makes no writes.
        self.standby = False

    # -- events -> keys ---------------------------------------------------------------------

    def _rank(self, key: Key) -> float:
        """Older jobs first (docs/design.md, "Which job goes next"); one not in the cache
        (deleted, or not seen yet) after all that are.

        creationTimestamp has whole seconds, and a hundred jobs submitted together share
        one: within the second, the order this controller first saw them in decides (after
        a restart, when all are seen at once, the order they were queued in)."""
        namespace, name = key
        jobs = self.caches.pick(names.KIND, namespace)
        job = jobs.get(namespace, name) if jobs else None
        created = parse_time(job["metadata"].get("creationTimestamp")) if job else None
        if created is None:
            return time.time()
        seconds = created.timestamp()
        seen = self._first_seen.get(key, seconds + 1)
        return seconds + min(max(seen - seconds, 0.0), 0.999)

    def _on_job(self, type_: str, job: Obj) -> None:
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        if type_ == "DELETED":
            self._job_signatures.pop(key, None)
            self._first_seen.pop(key, None)
        else:
            self._first_seen.setdefault(key, time.time())
            signature = _job_signature(job)
            if self._job_signatures.get(key) == signature:
                return
            self._job_signatures[key] = signature
        # An edit of a job that has host lists already may shorten them: urgent. A new
        # job's first turn waits its turn behind older jobs.
        config_maps = self.caches.pick("ConfigMap", meta["namespace"])
        listed = config_maps is not None and (
            config_maps.get(meta["namespace"], names.config_map_name(meta["name"])) is not None
        )
        self.queue.add(key, urgent=type_ != "DELETED" and listed)

    def _on_child(self, type_: str, obj: Obj) -> None:
        meta = obj["metadata"]
        if obj.get("kind") == "Pod":
            self.latency.pod(type_, obj, time.monotonic())
        refs = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
        urgent = _may_move_hosts(type_, obj)
        for ref in refs:
            if ref.get("kind") == names.KIND and ref.get("apiVersion", "").startswith(
                f"{names.GROUP}/"
            ):
                self.queue.add((meta["namespace"], ref["name"]), urgent=urgent)
        if refs:
            return
        # An orphan: the job its labels name may adopt it, if there is such a job.
        labels = meta.get("labels") or {}
        jobs = self.caches.pick(names.KIND, meta["namespace"])
        for name in {labels[k] for k in _JOB_LABELS if k in labels}:
            if jobs is not None and jobs.get(meta["namespace"], name) is not None:
                self.queue.add((meta["namespace"], name))

    def _on_node(self, type_: str, node: Obj) -> None:
        name = node["metadata"]["name"]
        why = None if type_ == "DELETED" else nodes.leaving(node, self.settings.leaving_node_taints)
        if self._leaving_nodes.get(name) == why:
            return
        if why is None:
            self._leaving_nodes.pop(name, None)
        else:
            self._leaving_nodes[name] = why
        # The jobs with workers there move them (or stop moving them).
        for cache in self.caches.by_kind.get("Pod", {}).values():
            for pod in cache.list():
                if (pod.get("spec") or {}).get("nodeName") == name:
                    self._on_child("MODIFIED", pod)

    def _managed_jobs(self) -> list[Obj]:
        return [
            job
            for cache in self.caches.by_kind.get(names.KIND, {}).values()
            for job in cache.list()
            if manages(job, self.settings)
        ]

    def informers(self) -> list[Informer]:
        return self.caches.all() + self.handover.all()

    # -- lifecycle --------------------------------------------------------------------------

    async def sync(self) -> None:
        """Fill the caches and keep them current; no writes. A standby stops here: the
        jobs' keys pile up in the queue (once each), for its workers if it comes to lead."""
        # Before the caches: a missing list or an MPI Operator v2 CRD keeps them from ever
        # syncing, and the log must say why first.
        await self._check()
        if self.preflight.problems:
            self._rechecks = asyncio.create_task(self._recheck(), name="preflight")
        for informer in self.informers():
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in self.informers()))
        self._synced = True
        log.info("caches synced", extra={"informers": len(self.informers())})

    def start_workers(self) -> None:
        self.standby = False
        self._workers = [
            asyncio.create_task(self._worker(), name=f"reconcile-{n}")
            for n in range(self.settings.reconcile_workers)
        ]

    async def _check(self) -> None:
        for problem in await self.preflight.run():
            log.error("start-up check failed", extra={"error": problem})

    async def _recheck(self) -> None:
        while self.preflight.problems:
            await asyncio.sleep(RECHECK_SECONDS)
            await self._check()
        log.info("start-up checks pass now")

    def problems(self) -> list[str]:
        """What keeps the controller from doing its job now (empty: ready), for /readyz."""
        found = list(self.preflight.problems)
        found += [f"{i!r}: not synced or not heard from" for i in self.informers() if not i.healthy]
        if not self._synced:
            found.append("caches not synced yet")
        elif not self._workers and not self.standby:
            found.append("reconcile workers not started")
        found += [f"{t.get_name()} has stopped" for t in self._workers if t.done()]
        stalled = self.kube.writes.problem(time.monotonic())
        if stalled is not None:
            found.append(stalled)
        return found

    async def stop_workers(self, grace: float) -> None:
        """Take no more work; let reconciles in flight finish for ``grace`` seconds, then
        cancel them (a cancelled write may or may not have reached the server; the next
        leader's level-triggered reconcile finds out which)."""
        self.queue.shutdown()
        if self._workers and grace > 0:
            await asyncio.wait(self._workers, timeout=grace)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.probes.stop()

    async def stop(self) -> None:
        if self._rechecks is not None:
            self._rechecks.cancel()
        await self.stop_workers(0)
        # Events change nothing a plan reads, so they need no fencing: let those being
        # sent finish.
        await self.writer.close()
        await self.pod_exec.close()
        await asyncio.gather(*(i.stop() for i in self.informers()))

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDownError:
                return
            started = time.monotonic()
            try:
                requeue = await self.reconcile(key)
            except Exception as err:  # one bad job must never stop the controller
                metrics.reconciled("error", time.monotonic() - started)
                # A conflict only means the cache was behind: routine, not a warning.
                level = (
                    logging.INFO if isinstance(err, ApiError) and err.conflict else logging.WARNING
                )
                log.log(
                    level,
                    "reconcile failed, retrying with backoff",
                    extra={"job": "/".join(key), "error": str(err)},
                    exc_info=not isinstance(err, ApiError),
                )
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)
                result = "success" if requeue is None else "requeue"
                metrics.reconciled(result, time.monotonic() - started)
                if requeue is not None:
                    # A hair late rather than early, so the deadline has passed on arrival.
                    self.queue.add_after(key, requeue + 0.05)
            finally:
                self.queue.done(key)

    # -- reconcile --------------------------------------------------------------------------

    def observe(self, job: Obj) -> Observed:
        meta = job["metadata"]
        ns, uid = meta["namespace"], meta["uid"]

        def owned(kind: str) -> list[Obj]:
            cache = self.caches.pick(kind, ns)
            return (
                [o for o in cache.by_owner(uid) if o["metadata"]["namespace"] == ns]
                if cache
                else []
            )

        def named(kind: str, name: str) -> Obj | None:
            return next((o for o in owned(kind) if o["metadata"]["name"] == name), None)

        def strays(kind: str) -> list[Obj]:
            """Hand-over candidates (handover.py): orphans, and children of this job that
            only the hand-over caches hold."""
            main, other = self.caches.pick(kind, ns), self.handover.pick(kind, ns)
            found = list(main.orphans(ns)) if main else []
            if other is not None:
                for obj in (*other.by_owner(uid), *other.orphans(ns)):
                    obj_meta = obj["metadata"]
                    seen = main.get(ns, obj_meta["name"]) if main else None
                    # Relabelled already: our write put it in the main cache, and the
                    # hand-over cache's view of it is on its way out.
                    if obj_meta["namespace"] == ns and not (
                        seen is not None and seen["metadata"].get("uid") == obj_meta.get("uid")
                    ):
                        found.append(obj)
            return found

        pods = owned("Pod")
        memory = self.writer.of((ns, meta["name"]))
        now = time.monotonic()
        launcher = names.launcher_name(meta["name"])
        return Observed(
            job=job,
            pods=pods,
            config_map=named("ConfigMap", names.config_map_name(meta["name"])),
            service_account=named("ServiceAccount", launcher_service_account(job)),
            role=named("Role", launcher),
            role_binding=named("RoleBinding", launcher),
            disruption_budget=named(
                "PodDisruptionBudget", names.disruption_budget_name(meta["name"])
            ),
            deleting=memory.deleting(pods, now),
            conflicts=memory.taken(),
            in_use=memory.used(now),
            refused=memory.refused,
            ranks=self.probes.answer((ns, meta["name"])),
            leaving_nodes=dict(self._leaving_nodes),
            strays=[o for kind in HANDOVER_SELECTORS for o in strays(kind)],
        )

    async def reconcile(self, key: Key) -> float | None:
        """One turn for one job; raises if a write failed, so the queue backs off."""
        namespace, name = key
        jobs = self.caches.pick(names.KIND, namespace)
        job = jobs.get(namespace, name) if jobs else None
        if job is None or not manages(job, self.settings):
            self.writer.forget(key)
            self.probes.forget(key)
            return None
        await self.writer.recheck(key, job)
        observed = self.observe(job)
        writes = plan_writes(observed, self.settings)
        await self.writer.run(job, writes)
        self.probes.acted_on(key, observed.ranks)
        if writes.probe is not None:
            self.probes.request(key, writes.probe)
        retry = self.writer.of(key).next_retry()
        requeue = [t for t in (writes.requeue_after, retry) if t is not None]
        return min(requeue) if requeue else None

    async def _read_launcher(self, namespace: str, pod: str, container: str | None) -> bytes:
        result = await self.pod_exec.run(
            namespace, pod, container, PROBE_COMMAND, PROBE_TIMEOUT_SECONDS
        )
        if not result.succeeded:
            # The probe command always exits 0: this is a shell or runtime that failed.
            raise RuntimeError(result.failure or f"exit status {result.exit_code}")
        return result.stdout

    def _cached(self, kind: str, namespace: str, name: str) -> Obj | None:
        cache = self.caches.pick(kind, namespace)
        return cache.get(namespace, name) if cache is not None else None

    def _cache(self, obj: Obj) -> None:
        # Every object the server returned from a write passes here.
        metrics.observe_write(obj, self.latency)
        cache = self.caches.pick(obj.get("kind", ""), obj["metadata"]["namespace"])
        if cache is not None:
            cache.upsert(obj)
