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
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic.app import preemptions
from mpijob_elastic.app.fleet import Fleet
from mpijob_elastic.app.kueue import KueueShell
from mpijob_elastic.app.predicates import manages
from mpijob_elastic.app.preflight import RECHECK_SECONDS, Preflight
from mpijob_elastic.app.routes import Routes
from mpijob_elastic.app.watches import (
    CHILD_KINDS,
    CHILD_SELECTOR,
    HANDOVER_SELECTORS,
    POD_GROUP_SELECTOR,
    Caches,
    pod_groups_served,
    resources,
)
from mpijob_elastic.core import names, nodes
from mpijob_elastic.core.actions import Failure
from mpijob_elastic.core.inputs.observe import (
    Gathered,
    Observed,
    launcher_report,
    observe,
    reads_fleet,
)
from mpijob_elastic.core.inputs.ranks import PROBE_COMMAND, PROBE_TIMEOUT_SECONDS
from mpijob_elastic.core.objects import podgroups
from mpijob_elastic.core.planning.fallback import stop_only
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.capacity_watch import CapacityWatch
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import RESOURCES, ApiError, Kube
from mpijob_elastic.machinery.kubeclient import ApiClient
from mpijob_elastic.machinery.podexec import PodExec
from mpijob_elastic.machinery.rankprobe import RankProbes
from mpijob_elastic.machinery.store import (
    compact,
    metadata_only,
    slim_pod,
    whole_if_controlled_by,
)
from mpijob_elastic.machinery.workqueue import ShutDownError, WorkQueue
from mpijob_elastic.machinery.writer import Writer

log = logging.getLogger("mpijob_elastic.app.controller")

Key = tuple[str, str]
Obj = dict[str, Any]


class Controller:
    def __init__(
        self,
        api: ApiClient,
        settings: Settings,
        *,
        watch_api: ApiClient,
        lease: tuple[str, str] | None = None,
        guard_metrics: bool = False,
    ) -> None:
        """``api`` carries the writes; ``watch_api`` the long-lived watches, so open
        watches can never take the connections a write needs (clients.py); ``lease``, with leader
        election, the Lease's namespace and name, whose grants the start-up check asks for;
        ``guard_metrics``: /metrics is served, so the check asks for the reviews' grants too."""
        self.settings = settings
        self.kube = Kube(api, resources(settings))
        self._watch_api = watch_api
        self.caches = Caches()
        # Opportunistic jobs' growth states and capacity changes (fleet.py).
        self.fleet = Fleet(
            CapacityWatch(watch_api, settings.namespaces), lambda keys: self.routes.wake(keys)
        )
        self.queue: WorkQueue[Key] = WorkQueue(
            rank=lambda key: self.routes.rank(key),
            observe_wait=metrics.QUEUE_WAIT_SECONDS.observe,
        )
        self.routes = Routes(settings, self.caches, self.queue, self.fleet)
        metrics.QUEUE_DEPTH.set_function(lambda: len(self.queue))
        metrics.JOBS.jobs = self.routes.managed_jobs
        metrics.JOB_DETAILS.config_map = lambda ns, name: self._cached("ConfigMap", ns, name)
        metrics.JOB_DETAILS.settings = settings
        self.handover = Caches()
        namespaces: list[str | None] = list(settings.namespaces) or [None]
        for ns in namespaces:
            path, plural = RESOURCES[names.KIND]
            jobs = Informer(
                watch_api, path, plural, self.routes.on_job, namespace=ns, transform=compact
            )
            self.caches.add(names.KIND, ns, jobs)
            # What each cache keeps, and why: docs/design.md, "What the caches hold".
            watched = [
                (
                    kind,
                    CHILD_SELECTOR,
                    self.caches,
                    whole_if_controlled_by(
                        names.KIND, names.GROUP, slim_pod if kind == "Pod" else compact
                    ),
                )
                for kind in CHILD_KINDS
            ]
            watched += [
                (kind, selector, self.handover, metadata_only)
                for kind, selector in HANDOVER_SELECTORS.items()
            ]
            for kind, selector, caches, transform in watched:
                self._watch(kind, ns, selector, caches, transform)
        # Nodes are cluster-wide; only whether each is going away is kept (nodes.py).
        self.caches.add(
            "Node",
            None,
            Informer(watch_api, "/api/v1", "nodes", self.routes.on_node, transform=nodes.slim),
        )
        self.kueue = KueueShell(
            self.kube,
            self.caches,
            settings.kueue_workload_slices,
            kueue.unlabelled_queue(settings),
        )
        metrics.QUEUE.queue = self.kueue.queue
        metrics.QUEUE.pods = self._owned_pods
        self.writer = Writer(self.kube, self._cache, self._cached)
        self.pod_exec = PodExec(api.configuration)
        self.probes = RankProbes(self._read_launcher, self.queue.add)
        self._workers: list[asyncio.Task[None]] = []
        gang = podgroups.gang(settings)
        self.preflight = Preflight(
            self.kube,
            settings.namespaces,
            lease,
            guard_metrics,
            gang.api_version.split("/")[0] if gang is not None else None,
        )
        self._rechecks: asyncio.Task[None] | None = None
        self._synced = False
        # Whether the scheduler's Preempted Events are watched (preemptions.py).
        self.preemptions = False
        # Leader election (leader.py): a standby keeps its caches and makes no writes.
        self.standby = False

    def _watch(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = CHILD_SELECTOR,
        caches: Caches | None = None,
        transform: Callable[[Obj], Obj] = compact,
    ) -> None:
        """A cache of one kind of child in one namespace (None: all of them)."""
        path, plural = self.kube.resources[kind]
        informer = Informer(
            self._watch_api,
            path,
            plural,
            self.routes.on_child,
            namespace=namespace,
            label_selector=selector,
            transform=transform,
        )
        (self.caches if caches is None else caches).add(kind, namespace, informer)

    def informers(self) -> list[Informer]:
        return self.caches.all() + self.handover.all()

    # -- lifecycle --------------------------------------------------------------------------

    async def sync(self) -> None:
        """Fill the caches and keep them current; no writes. A standby stops here: the
        jobs' keys pile up in the queue (once each), for its workers if it comes to lead."""
        # Before the caches: a missing list or an MPI Operator v2 CRD keeps them from ever
        # syncing, and the log must say why first.
        await self._check()
        await self.kueue.discover(
            self._watch_api, list(self.settings.namespaces) or [None], self.routes.on_child
        )
        self.preemptions = await preemptions.watch(
            self.kube,
            self._watch_api,
            list(self.settings.namespaces) or [None],
            self.caches,
            self.routes.on_preempted,
        )
        if self.preflight.problems:
            self._rechecks = asyncio.create_task(self._recheck(), name="preflight")
        if await pod_groups_served(self.kube, self.settings):
            namespaces: list[str | None] = [*self.settings.namespaces] or [None]
            for ns in namespaces:
                self._watch("PodGroup", ns, POD_GROUP_SELECTOR)
        if not self.settings.namespaces:
            for caches in (self.caches, self.handover):
                caches.skip(self.settings.skipped_namespaces)
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
        await self.writer.events.close()
        await self.pod_exec.close()
        await asyncio.gather(*(i.stop() for i in self.informers()))
        await self.fleet.watch.stop()

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

    def gathered(self, job: Obj) -> Gathered:
        """What the turn reads besides the caches of the job's children, as plain values:
        ``observe`` takes what applies to the job."""
        meta = job["metadata"]
        ns = meta["namespace"]
        key = (ns, meta["name"])
        # The launcher's reports (ranks.py), kept per job so that losses add up.
        report, running = launcher_report(job, lambda kind: self.caches.pick(kind, ns))
        pushed = self.probes.pushed(key, report, running, datetime.now(UTC))
        return Gathered(
            ranks=pushed,
            ranks_read=self.probes.answer(key),
            leaving_nodes=self.routes.leaving_nodes,
            fleet=self.fleet.others(key),
            capacity_changed=self.fleet.capacity_changed,
            gone=self.fleet.gone(key),
            preemptors=preemptions.preemptors(self.caches.pick(preemptions.KIND, ns), ns)
            if self.preemptions and reads_fleet(job)
            else None,
            queue=self.kueue.queue(job),
        )

    def observe(self, job: Obj) -> Observed:
        ns = job["metadata"]["namespace"]
        return observe(
            job,
            lambda kind: self.caches.pick(kind, ns),
            lambda kind: self.handover.pick(kind, ns),
            self.writer.of((ns, job["metadata"]["name"])),
            time.monotonic(),
            self.gathered(job),
        )

    async def reconcile(self, key: Key) -> float | None:
        """One turn for one job; raises if a write failed, so the queue backs off."""
        namespace, name = key
        jobs = self.caches.pick(names.KIND, namespace)
        job = jobs.get(namespace, name) if jobs else None
        await self.kueue.release_left_behind(
            namespace, name, job["metadata"]["uid"] if job is not None else None
        )
        if job is None or not manages(job, self.settings):
            self.writer.forget(key)
            self.probes.forget(key)
            return None
        await self.writer.recheck(key, job)
        try:
            observed = self.observe(job)
            writes = plan_writes(observed, self.settings)
        except Exception as err:
            await self._stop_only(key, job, err)
            raise
        await self.writer.run(job, writes)
        self.probes.acted_on(key, observed.ranks)
        if writes.probe is not None:
            self.probes.request(key, writes.probe)
        retry = self.writer.of(key).next_retry()
        requeue = [t for t in (writes.requeue_after, retry) if t is not None]
        return min(requeue) if requeue else None

    async def _stop_only(self, key: Key, job: Obj, err: Exception) -> None:
        """The turn raised before its writes: the job reports it, and the stops it asks for
        are made from the job and its pods alone (core/planning/fallback.py). The caller
        raises ``err`` on, so the job is retried with backoff like any failed turn."""
        metrics.FAILED_TURNS.inc()
        pods = self._owned_pods(key[0], job["metadata"]["uid"])
        memory = self.writer.of(key)
        # The writer's memory too: a delete it saw accepted is not made again, and a name
        # someone else holds stays reported (WriteRefused, read back by held_names).
        try:
            observed = Observed(
                job,
                pods,
                deleting=memory.deleting(pods, time.monotonic()),
                conflicts=memory.taken(),
                queue=self.kueue.queue(job),
            )
            failure = Failure(type(err).__name__, str(err))
            await self.writer.run(
                job, stop_only(observed, self.settings, datetime.now(UTC), failure)
            )
        except Exception as fallback_err:  # the turn's own error is the one to retry on
            log.warning(
                "the stop-only turn failed too",
                extra={"job": "/".join(key), "error": str(fallback_err)},
                exc_info=not isinstance(fallback_err, ApiError),
            )

    async def _read_launcher(self, namespace: str, pod: str, container: str | None) -> bytes:
        result = await self.pod_exec.run(
            namespace, pod, container, PROBE_COMMAND, PROBE_TIMEOUT_SECONDS
        )
        if not result.succeeded:
            # The probe command always exits 0: this is a shell or runtime that failed.
            raise RuntimeError(result.failure or f"exit status {result.exit_code}")
        return result.stdout

    def _owned_pods(self, namespace: str, uid: str) -> list[Obj]:
        """The pods the job of this UID controls, from the cache."""
        cache = self.caches.pick("Pod", namespace)
        return [
            p
            for p in (cache.by_owner(uid) if cache is not None else [])
            if p["metadata"]["namespace"] == namespace
        ]

    def _cached(self, kind: str, namespace: str, name: str) -> Obj | None:
        cache = self.caches.pick(kind, namespace)
        return cache.get(namespace, name) if cache is not None else None

    def _cache(self, obj: Obj) -> None:
        # Every object the server returned from a write passes here.
        metrics.observe_write(obj, self.routes.latency)
        cache = self.caches.pick(obj.get("kind", ""), obj["metadata"]["namespace"])
        if cache is not None:
            cache.upsert(obj)
