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
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient

from mpijob_elastic import names
from mpijob_elastic.informer import Informer
from mpijob_elastic.kube import RESOURCES, ApiError, Kube
from mpijob_elastic.plan import (
    Action,
    AnnotatePod,
    Create,
    DeletePod,
    Emit,
    Observed,
    Replace,
    WriteStatus,
    format_time,
    plan,
    rejected_status,
)
from mpijob_elastic.settings import Settings
from mpijob_elastic.spec import managed_by
from mpijob_elastic.workqueue import ShutDownError, WorkQueue

log = logging.getLogger("mpijob_elastic.reconciler")

Key = tuple[str, str]
Obj = dict[str, Any]

# Children are all labelled with the job's name; watching only those keeps the caches to
# the objects this controller can own, not every pod in the cluster.
CHILD_SELECTOR = f"{names.LABEL_GROUP}={names.GROUP},{names.LABEL_JOB}"
CHILD_KINDS = ("Pod", "ConfigMap", "ServiceAccount", "Role", "RoleBinding")
# Pod writes of one kind that the plan puts side by side are independent of each other
# (the Role they depend on was written before them), so they go out together: a scale-up
# of 50 workers must not wait for 50 round trips before the next host list is written.
WRITE_CONCURRENCY = 16
_BATCHABLE = (AnnotatePod, DeletePod)


def _batchable(action: Action) -> str | None:
    if isinstance(action, Create) and action.obj["kind"] == "Pod":
        return "create-pod"
    return type(action).__name__ if isinstance(action, _BATCHABLE) else None


def _batches(actions: Sequence[Action]) -> list[list[Action]]:
    """Split the plan into runs that keep its order; a run of one batchable kind is one."""
    out: list[list[Action]] = []
    for action in actions:
        kind = _batchable(action)
        if out and kind is not None and _batchable(out[-1][0]) == kind:
            out[-1].append(action)
        else:
            out.append([action])
    return out


# How long an issued delete is remembered if its pod never shows up as gone.
DELETE_MEMORY_SECONDS = 300.0


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
        self, api: ApiClient, settings: Settings, *, watch_api: ApiClient | None = None
    ) -> None:
        """``api`` carries the writes; ``watch_api``, if given, the long-lived watches, so
        open watches can never take the connections a write needs."""
        self.settings = settings
        self.kube = Kube(api)
        watches = watch_api or api
        self.queue: WorkQueue[Key] = WorkQueue()
        self.caches = _Caches()
        namespaces: list[str | None] = list(settings.namespaces) or [None]
        for ns in namespaces:
            path, plural = RESOURCES[names.KIND]
            jobs = Informer(watches, path, plural, self._on_job, namespace=ns)
            self.caches.add(names.KIND, ns, jobs)
            for kind in CHILD_KINDS:
                path, plural = RESOURCES[kind]
                informer = Informer(
                    watches,
                    path,
                    plural,
                    self._on_child,
                    namespace=ns,
                    label_selector=CHILD_SELECTOR,
                )
                self.caches.add(kind, ns, informer)
        # Per job: UIDs of pods whose delete was issued, and when.
        self.deleting: dict[Key, dict[str, float]] = {}
        self._write_slots = asyncio.Semaphore(WRITE_CONCURRENCY)
        self._workers: list[asyncio.Task[None]] = []

    # -- events -> keys ---------------------------------------------------------------------

    def _on_job(self, _type: str, job: Obj) -> None:
        meta = job["metadata"]
        self.queue.add((meta["namespace"], meta["name"]))

    def _on_child(self, _type: str, obj: Obj) -> None:
        meta = obj["metadata"]
        for ref in meta.get("ownerReferences") or []:
            if (
                ref.get("controller")
                and ref.get("kind") == names.KIND
                and ref.get("apiVersion", "").startswith(f"{names.GROUP}/")
            ):
                self.queue.add((meta["namespace"], ref["name"]))

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        for informer in self.caches.all():
            informer.start()
        await asyncio.gather(*(i.synced.wait() for i in self.caches.all()))
        log.info("caches synced", extra={"informers": len(self.caches.all())})
        self._workers = [
            asyncio.create_task(self._worker(), name=f"reconcile-{n}")
            for n in range(self.settings.reconcile_workers)
        ]

    async def stop(self) -> None:
        self.queue.shutdown()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await asyncio.gather(*(i.stop() for i in self.caches.all()))

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDownError:
                return
            try:
                requeue = await self.reconcile(key)
            except Exception as err:  # one bad job must never stop the controller
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

        pods = owned("Pod")
        deleting = self._forget_deletes((ns, meta["name"]), pods)
        launcher = names.launcher_name(meta["name"])
        return Observed(
            job=job,
            pods=pods,
            config_map=named("ConfigMap", names.config_map_name(meta["name"])),
            service_account=named("ServiceAccount", launcher),
            role=named("Role", launcher),
            role_binding=named("RoleBinding", launcher),
            deleting=frozenset(deleting),
        )

    def _forget_deletes(self, key: Key, pods: list[Obj]) -> dict[str, float]:
        """The job's issued deletes, minus those whose pods have left the cache."""
        present = {p["metadata"].get("uid") for p in pods}
        horizon = time.monotonic() - DELETE_MEMORY_SECONDS
        issued = self.deleting.setdefault(key, {})
        for uid, at in list(issued.items()):
            # Gone from the cache means gone from the server: the watch saw it leave.
            if at < horizon or uid not in present:
                del issued[uid]
        return issued

    async def reconcile(self, key: Key) -> float | None:
        namespace, name = key
        jobs = self.caches.pick(names.KIND, namespace)
        job = jobs.get(namespace, name) if jobs else None
        if job is None or not manages(job, self.settings):
            self.deleting.pop(key, None)
            return None
        the_plan = plan(self.observe(job), self.settings)
        for batch in _batches(the_plan.actions):
            if len(batch) == 1:
                await self.execute(job, batch[0])
                continue
            results = await asyncio.gather(
                *(self._bounded(self.execute(job, a)) for a in batch), return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
        return the_plan.requeue_after

    async def _bounded(self, write: Any) -> None:
        async with self._write_slots:
            await write

    async def execute(self, job: Obj, action: Action) -> None:
        meta = job["metadata"]
        ns = meta["namespace"]
        if isinstance(action, Create):
            try:
                created = await self.kube.create(action.obj)
            except ApiError as err:
                if err.invalid and action.obj["kind"] == "Pod":
                    await self._pod_rejected(job, err)
                raise
            self._cache(created)
            log.info(
                "created",
                extra={
                    "job": f"{ns}/{meta['name']}",
                    "kind": action.obj["kind"],
                    "object": created["metadata"]["name"],
                },
            )
        elif isinstance(action, Replace):
            self._cache(await self.kube.replace(action.obj))
        elif isinstance(action, AnnotatePod):
            patch = {"metadata": {"annotations": dict(action.annotations)}}
            try:
                self._cache(await self.kube.patch("Pod", ns, action.name, patch))
            except ApiError as err:
                if not err.not_found:
                    raise
        elif isinstance(action, DeletePod):
            issued = self.deleting.setdefault((ns, meta["name"]), {})
            issued[action.uid] = time.monotonic()
            try:
                result = await self.kube.delete("Pod", ns, action.name, action.uid)
            except ApiError as err:
                # Gone already, or a successor with another UID: nothing of ours to delete.
                if not (err.not_found or err.conflict):
                    issued.pop(action.uid, None)
                    raise
            else:
                if result.get("kind") == "Pod":
                    self._cache(result)
            log.info("deleted pod", extra={"job": f"{ns}/{meta['name']}", "pod": action.name})
        elif isinstance(action, WriteStatus):
            await self._write_status(job, action.status, action.resource_version)
        elif isinstance(action, Emit):
            await self.emit(job, action)

    def _cache(self, obj: Obj) -> None:
        cache = self.caches.pick(obj.get("kind", ""), obj["metadata"]["namespace"])
        if cache is not None:
            cache.upsert(obj)

    async def _write_status(self, job: Obj, status: Obj, resource_version: str) -> None:
        meta = job["metadata"]
        # The resourceVersion makes the merge patch conditional: a status computed from a
        # stale job is refused (409) and recomputed, never written over a newer one.
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        updated = await self.kube.patch("MPIJob", meta["namespace"], meta["name"], body, "status")
        self._cache({**updated, "kind": names.KIND})

    async def _pod_rejected(self, job: Obj, err: ApiError) -> None:
        status = rejected_status(job, err.message)
        if status is not None:
            await self._write_status(job, status, job["metadata"]["resourceVersion"])
            await self.emit(job, Emit("Warning", "PodTemplateRejected", err.message))

    async def emit(self, job: Obj, event: Emit) -> None:
        meta = job["metadata"]
        now = format_time(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": event.reason,
            "message": event.message,
            "type": event.type,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "mpijob-elastic"},
            "reportingComponent": "mpijob-elastic",
        }
        try:
            await self.kube.create(body)
        except ApiError as err:
            # An Event is a courtesy; losing one must not fail the reconcile that made it.
            log.warning("could not record event", extra={"reason": event.reason, "error": str(err)})
