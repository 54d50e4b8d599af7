"""Executing one job's plan: its phases in order, refusals reported on the job.

The plan's order is its safety argument (see write_order.py): the writes of one phase go out
together, and the next phase starts only once every one of them was accepted. A phase
with a failed write ends the turn: nothing after it may run on an assumption that did not
hold. What happens next depends on why it failed:

* The server refused the write (400, 403, 413, 422, a name held by someone else's object):
  the user has to act. The refusal, with the server's message, is remembered for the job
  (``JobMemory.refused`` until a turn's writes all go through; ``conflicts`` for a taken
  name, until a read finds the name free or the job's own, see ``held_names.py``); the
  core reports it on the job (``core/reports/conditions.py``: a ``WriteRefused``
  condition, ``InvalidSpec`` for a pod template the server rejects, and one Warning Event,
  quoting the server). A turn that stops at a write refused again still sends what the
  core planned for that case (``Writes.on_refusal``: the status, the Events that report
  refusals), so the report is not held up by the write.
* A conflict (the cache was behind), a 5xx, a timeout or a dropped connection: routine;
  the turn is retried with backoff.

Either way the reconcile raises, so the work queue looks at the job again with backoff
until the world matches. A write is remembered as done only once the server confirmed
it: a delete lost on the network is planned again, never taken for issued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    Action,
    AnnotatePod,
    Claim,
    Create,
    DeleteObject,
    DeletePod,
    Emit,
    PatchStatus,
    Refusal,
    Replace,
    Writes,
    WriteStatus,
)
from mpijob_elastic.core.outputs.status import merge_patch
from mpijob_elastic.core.planning.write_order import BULK, HOST_LIST, STEP
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.core.workers import discovered_hosts
from mpijob_elastic.machinery import held_names, metrics
from mpijob_elastic.machinery.events import EventRecorder
from mpijob_elastic.machinery.job_memory import (
    IN_USE_RECHECK_SECONDS,
    JobMemory,
    describe,
    refusal,
)
from mpijob_elastic.machinery.kube import ApiError, Kube

log = logging.getLogger("mpijob_elastic.machinery.writer")

Obj = dict[str, Any]
Key = tuple[str, str]

# The writes of one phase go out together: a scale-up of 50 workers must not wait for 50
# round trips before the next host list is written. One turn has at most TURN_CONCURRENCY
# of them in flight, so a 1000-worker job's creates leave room for other jobs' writes.
TURN_CONCURRENCY = 16
# Writes go through two lanes with slots of their own, chosen by the write's step
# (write_order.STEPS; docs/design.md, "Write lanes"): the host lists and what goes with
# them, which say where ranks may run, never wait behind other jobs' pod creates, deletes,
# Roles and statuses.
HOST_LIST_WRITES = 32
BULK_WRITES = 32
# Events are sent in the background, a few at a time: a reconcile does not wait for them.
EVENT_WRITES = 4
# What the write client's connection pool must hold so that no write waits for one.
WRITE_CONCURRENCY = HOST_LIST_WRITES + BULK_WRITES + EVENT_WRITES


def _job(job: Mapping[str, Any]) -> str:
    """How log lines name a job: namespace/name."""
    return f"{job['metadata']['namespace']}/{job['metadata']['name']}"


def _log_annotations(key: Key, pod: str, annotations: Mapping[str, str | None]) -> None:
    job = "/".join(key)
    for annotation, value in annotations.items():
        if annotation == names.ANN_DRAINING_SINCE:
            if value is None:
                log.info("drain mark removed", extra={"job": job, "pod": pod})
            else:
                log.info("marked draining", extra={"job": job, "pod": pod, "since": value})
        elif annotation == names.ANN_CONFIG_HASH:
            log.info("launcher refreshed", extra={"job": job, "pod": pod, "config_hash": value})
        else:
            log.info(
                "annotated",
                extra={"job": job, "pod": pod, "annotation": annotation, "value": value},
            )


class Writer:
    """Runs plans against the API server and keeps each job's memory of what landed."""

    def __init__(
        self,
        kube: Kube,
        cache: Callable[[Obj], None],
        cached: Callable[[str, str, str], Obj | None] = lambda _kind, _ns, _name: None,
    ) -> None:
        """``cache`` takes every object the server returned from a write; ``cached`` reads
        the cache (kind, namespace, name), for logging what an update changed."""
        self.kube = kube
        self._cache = cache
        self._cached = cached
        self.memory: dict[Key, JobMemory] = {}
        self._lanes = {
            HOST_LIST: asyncio.Semaphore(HOST_LIST_WRITES),
            BULK: asyncio.Semaphore(BULK_WRITES),
        }
        self.events = EventRecorder(kube, EVENT_WRITES)

    def of(self, key: Key) -> JobMemory:
        return self.memory.setdefault(key, JobMemory())

    def forget(self, key: Key) -> None:
        self.memory.pop(key, None)

    async def run(self, job: Obj, plan: Writes) -> None:
        """Execute the plan; raise the first failure, after reporting it if it needs the user."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        turn = asyncio.Semaphore(TURN_CONCURRENCY)
        for phase in plan.phases:
            lane = STEP[phase.step].lane
            results = await asyncio.gather(
                *(self._one(turn, lane, key, job, a) for a in phase.writes),
                return_exceptions=True,
            )
            # The first failure in the plan's order, so that a retry meets the same one and
            # the condition it sets does not flip between two messages.
            failed = next(
                (
                    (a, r)
                    for a, r in zip(phase.writes, results, strict=True)
                    if isinstance(r, BaseException)
                ),
                None,
            )
            if failed is not None:
                action, err = failed
                await self._report(key, job, action, err, plan)
                raise err
        # Every write of the turn went through: no refusal is left to report. The plan that
        # just ran still reported it (WriteRefused, a Workload's in QueueAdmitted), and no
        # watch event of ours moves the job (predicates.job_signature): it looks again.
        memory = self.of(key)
        if memory.refused is not None:
            memory.refused = None
            memory.look_again = True

    async def _one(
        self, turn: asyncio.Semaphore, lane: str, key: Key, job: Obj, action: Action
    ) -> None:
        if isinstance(action, Emit):
            self.events.emit_soon(job, action)
            return
        async with turn, self._lanes[lane]:
            if isinstance(action, WriteStatus):
                await self._write_status(job, action.status, action.resource_version)
            else:
                await self._write(key, job, action)

    async def _write(self, key: Key, job: Obj, action: Action) -> None:
        ns = job["metadata"]["namespace"]
        if isinstance(action, Create):
            await self._create(key, job, action)
        elif isinstance(action, Replace):
            await self._replace(key, ns, action)
        elif isinstance(action, AnnotatePod):
            await self._annotate(key, ns, action)
        elif isinstance(action, DeletePod):
            await self._delete_pod(key, ns, action)
        elif isinstance(action, Claim):
            await self._claim(job, action)
        elif isinstance(action, DeleteObject):
            await self._delete_object(key, ns, action)
        elif isinstance(action, PatchStatus):
            await self._patch_status(key, ns, action)

    async def _create(self, key: Key, job: Obj, action: Create) -> None:
        kind, name = action.obj["kind"], action.obj["metadata"]["name"]
        try:
            created = await self.kube.create(action.obj)
        except ApiError as err:
            if err.reason == "AlreadyExists" and kind == "ServiceAccount":
                # A ServiceAccount grants nothing by itself, and the user may have made
                # it on purpose (named in the launcher template, or pre-made for its
                # imagePullSecrets): the launcher uses it as it is, as training-operator
                # does. Whether it is still there is checked again after a while, so
                # one removed meanwhile is made anew.
                self.of(key).in_use[(kind, name)] = time.monotonic() + IN_USE_RECHECK_SECONDS
                log.info(
                    "using an existing ServiceAccount",
                    extra={"job": "/".join(key), "object": name},
                )
                return
            if err.reason == "AlreadyExists":
                await held_names.learn(self.kube, self.of(key), job, action)
            raise
        self._cache(created)
        log.info(
            "created",
            extra={
                "job": "/".join(key),
                "kind": action.obj["kind"],
                "object": action.obj["metadata"]["name"],
            },
        )

    async def _replace(self, key: Key, ns: str, action: Replace) -> None:
        kind, name = action.obj["kind"], action.obj["metadata"]["name"]
        before = self._cached(kind, ns, name)
        self._cache(await self.kube.replace(action.obj))
        log.info("updated", extra={"job": "/".join(key), "kind": kind, "object": name})
        if kind == "ConfigMap":
            old = discovered_hosts((before or {}).get("data"))
            new = discovered_hosts(action.obj.get("data"))
            if old != new:
                log.info(
                    "host list rewritten",
                    extra={
                        "job": "/".join(key),
                        "added": ",".join(sorted(new - old)),
                        "removed": ",".join(sorted(old - new)),
                        "hosts": len(new),
                    },
                )

    async def _annotate(self, key: Key, ns: str, action: AnnotatePod) -> None:
        annotations = dict(action.annotations)
        if action.stamp is not None:
            sent = datetime.fromtimestamp(time.time(), UTC)
            annotations[action.stamp] = format_precise_time(sent)
        patch: Obj = {"metadata": {"annotations": annotations}}
        if action.labels:
            patch["metadata"]["labels"] = dict(action.labels)
        if action.resource_version:
            patch["metadata"]["resourceVersion"] = action.resource_version
        try:
            self._cache(await self.kube.patch("Pod", ns, action.name, patch))
        except ApiError as err:
            if not err.not_found:
                raise
            return
        _log_annotations(key, action.name, annotations)

    async def _delete_pod(self, key: Key, ns: str, action: DeletePod) -> None:
        try:
            result = await self.kube.delete(
                "Pod", ns, action.name, action.uid, action.grace_seconds, action.resource_version
            )
        except ApiError as err:
            # Gone already, or a successor with another UID: nothing of ours to delete. A
            # delete as seen that meets a newer version is a stale view, like any conflict:
            # the turn stops and is planned again.
            if not (err.not_found or err.conflict) or (err.conflict and action.resource_version):
                raise
            log.info("pod to delete was gone", extra={"job": "/".join(key), "pod": action.name})
        else:
            if result.get("kind") == "Pod":
                self._cache(result)
            self.of(key).deletes[action.uid] = time.monotonic()
            log.info("deleted pod", extra={"job": "/".join(key), "pod": action.name})

    async def _delete_object(self, key: Key, ns: str, action: DeleteObject) -> None:
        try:
            await self.kube.delete(action.kind, ns, action.name, action.uid)
        except ApiError as err:
            if not (err.not_found or err.conflict):
                raise
        log.info(
            "deleted",
            extra={"job": "/".join(key), "kind": action.kind, "object": action.name},
        )

    async def _patch_status(self, key: Key, ns: str, action: PatchStatus) -> None:
        kind, name = action.obj["kind"], action.obj["metadata"]["name"]
        # Read before the write: its own watch event may reach the cache before its answer.
        before = self._cached(kind, ns, name)
        patched = await self.kube.patch(kind, ns, name, action.obj, "status")
        metrics.workload_status_written(before, {**patched, "kind": kind})
        self._cache({**patched, "kind": kind})
        log.info("status updated", extra={"job": "/".join(key), "kind": kind, "object": name})

    async def _claim(self, job: Obj, action: Claim) -> None:
        meta = job["metadata"]
        # uid and resourceVersion make the patch conditional (the API server refuses a
        # patch that would change the UID, and a stale resourceVersion with 409).
        patch: Obj = {
            "metadata": {
                "uid": action.uid,
                "resourceVersion": action.resource_version,
                "labels": dict(action.labels),
            }
        }
        self._cache(await self.kube.patch(action.kind, meta["namespace"], action.name, patch))
        verb, kind, name = describe(action)
        log.info(verb, extra={"job": _job(job), "kind": kind, "object": name})

    async def recheck(self, key: Key, job: Obj) -> None:
        """Before a turn: whether the names held by someone else still are (held_names.py)."""
        await held_names.recheck(self.kube, self.memory, key, job)

    async def _report(
        self, key: Key, job: Obj, action: Action, err: BaseException, plan: Writes
    ) -> None:
        refused = refusal(err)
        verb, kind, name = describe(action)
        if refused is None:
            log.log(
                logging.INFO if isinstance(err, ApiError) else logging.WARNING,
                "write failed, retrying with backoff",
                extra={
                    "job": _job(job),
                    "write": f"{verb} {kind} {name}",
                    "error": str(err),
                },
            )
            return
        if refused.reason == "AlreadyExists":
            return  # the next plan knows the name is taken and reports it
        # The core reports it on the job (core/reports/conditions.py), from the next turn on.
        self.of(key).refused = Refusal(
            f"{verb} {kind} {name}",
            refused.reason or str(refused.status),
            refused.message,
            pod_template=refused.invalid and kind == "Pod" and verb == "create",
            kind=kind,
        )
        log.warning(
            "write refused",
            extra={"job": _job(job), "reason": refused.reason, "error": refused.message},
        )
        # The report the core planned for this (the condition of a refusal it knew of): a
        # write refused on every turn must not keep it from the job.
        for report in plan.on_refusal:
            if isinstance(report, Emit):
                self.events.emit_soon(job, report)
                continue
            try:
                await self._write_status(job, report.status, report.resource_version)
            except Exception as write_err:
                log.info(
                    "could not report a refused write",
                    extra={"job": _job(job), "error": str(write_err)},
                )
                return

    async def _write_status(self, job: Obj, status: Obj, resource_version: str) -> None:
        meta = job["metadata"]
        # The resourceVersion makes the merge patch conditional: a status computed from a
        # stale job is refused (409) and recomputed, never written over a newer one.
        patch = merge_patch(job.get("status") or {}, status)
        body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
        updated = await self.kube.patch(names.KIND, meta["namespace"], meta["name"], body, "status")
        metrics.status_written(job.get("status"), status, job)
        self._cache({**updated, "kind": names.KIND})
