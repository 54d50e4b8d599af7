"""Room freed by other workloads: bound pods of the cluster going away, which ends hungry
opportunistic jobs' growth backoff (docs/capacity.md, "Growth, probes and the backoff").

One watch per watched namespace (all namespaces: one), and only while some opportunistic
job is hungry (``Fleet`` says so with ``wanted``). It asks for metadata alone
(PartialObjectMetadata, a few hundred bytes an event) and keeps nothing: no cache, no
per-pod state. The field selector keeps the pods that hold a node and have not ended, so
the API server reports a pod that is deleted *or* reaches Succeeded or Failed as DELETED:
it left the selection. Our own pods are left out by label: the pod cache sees them whole,
and ``Fleet.pod_deleted`` knows that a preempted one's room is someone else's, which
metadata cannot tell.

The wakes are spaced by ``QUIET_SECONDS`` (the first backoff step), the last one deferred,
so that on a cluster where pods end every second a hungry job probes at most once per
that period, not at every pod; one timer for the whole fleet, none per job. Each wake
comes ``SETTLE_SECONDS`` after the first pod of its burst: a workload's pods end within a
moment of each other, and a probe sent at the first would meet only part of the room, be
refused, and the rest would wait for the next period (seen in ``make bench-capacity``:
three higher-priority pods deleted over half a second, 1 GPU idle for 10 s).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any, cast

import aiohttp

from mpijob_elastic.core import names
from mpijob_elastic.core.sizing.opportunistic import BACKOFF_SECONDS
from mpijob_elastic.machinery import decoding, watch_stream
from mpijob_elastic.machinery.kubeclient import ApiClient

log = logging.getLogger("mpijob_elastic.machinery.capacity_watch")

FIELDS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
LABELS = f"!{names.LABEL_JOB}"
_META = ";g=meta.k8s.io;v=v1"
ACCEPT_LIST = f"application/json;as=PartialObjectMetadataList{_META}"
ACCEPT_WATCH = f"application/json;as=PartialObjectMetadata{_META}"
QUIET_SECONDS = BACKOFF_SECONDS
SETTLE_SECONDS = 1.0
# The server ends each watch after this long; a watch no longer wanted (no job hungry)
# ends at its next event or bookmark, or at this timeout, whichever comes first.
WATCH_SECONDS = 60
RETRY_MAX_SECONDS = 30.0


class Spacer:
    """Calls ``fire`` ``settle`` seconds after a call, for every call meanwhile, and at
    most once per ``quiet`` seconds: a call that comes too soon is deferred to the end of
    the period (at most one pending)."""

    def __init__(self, fire: Callable[[], None], quiet: float, settle: float) -> None:
        self._fire = fire
        self._quiet = quiet
        self._settle = settle
        self._last = -quiet
        self._pending: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        if self._pending is not None:
            return
        wait = max(self._last + self._quiet - time.monotonic(), self._settle)
        self._pending = asyncio.get_running_loop().call_later(wait, self._run)

    def _run(self) -> None:
        self._pending = None
        self._last = time.monotonic()
        self._fire()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


class CapacityWatch:
    """Calls ``changed`` (the fleet sets it) when capacity may have come free, while it
    is wanted."""

    def __init__(self, api: ApiClient, namespaces: tuple[str, ...]) -> None:
        self._api = api
        self._paths = [f"/api/v1/namespaces/{ns}/pods" for ns in namespaces] or ["/api/v1/pods"]
        self.changed: Callable[[], None] = lambda: None
        self._signal = Spacer(lambda: self.changed(), QUIET_SECONDS, SETTLE_SECONDS)
        self._wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def wanted(self, on: bool) -> None:
        """Watch (from the first call on, in the running loop) or pause."""
        if not on:
            self._wanted.clear()
            return
        self._wanted.set()
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._run(p), name=f"capacity {p}") for p in self._paths
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._signal.cancel()

    async def _run(self, path: str) -> None:
        failures = 0
        resource_version: str | None = None
        while True:
            await self._wanted.wait()
            try:
                resource_version = await self._watch(
                    path, resource_version or await self._list(path)
                )
                failures = 0
            except Exception as err:
                resource_version = None
                failures += 1
                delay = min(RETRY_MAX_SECONDS, 2.0**failures)
                # 410 Gone included: the next round lists afresh. A pod that ended while we
                # were not watching reaches hungry jobs at their next probe, as without us.
                log.warning("capacity watch %s: %s; retrying in %.0fs", path, err, delay)
                await asyncio.sleep(delay)

    async def _get(self, path: str, accept: str, query: list[tuple[str, Any]]) -> Any:
        query = [("fieldSelector", FIELDS), ("labelSelector", LABELS), *query]
        timeout = aiohttp.ClientTimeout(sock_connect=30, sock_read=WATCH_SECONDS + 15)
        response = cast(
            aiohttp.ClientResponse,
            await self._api.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            ),
        )
        if response.status != 200:
            body = await response.text()
            response.close()
            raise ConnectionError(f"HTTP {response.status}: {body[:300]}")
        return response

    async def _list(self, path: str) -> str:
        """The resourceVersion to watch from: one item's list (the rest is not needed)."""
        response = await self._get(path, ACCEPT_LIST, [("limit", 1)])
        async with response:
            found = decoding.loads(await response.read())
        return str(found["metadata"]["resourceVersion"])

    async def _watch(self, path: str, resource_version: str) -> str | None:
        """Until the server ends the watch: the version to resume from; or None, if it was
        left because no job is hungry any more (the next one lists afresh)."""
        seconds = round(WATCH_SECONDS * random.uniform(0.9, 1.1))
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", seconds),
        ]
        started, first = time.monotonic(), resource_version
        response = await self._get(path, ACCEPT_WATCH, query)
        try:
            async for line in watch_stream.lines(response.content):
                event = decoding.loads(line)
                if event.get("type") == "ERROR":
                    raise ConnectionError(str(event.get("object"))[:300])
                if event.get("type") == "DELETED":
                    self._signal()
                resource_version = event["object"]["metadata"]["resourceVersion"]
                if not self._wanted.is_set():
                    return None
        finally:
            response.close()
        if resource_version == first and time.monotonic() - started < seconds / 2:
            # Cut short with nothing said: something in between ends watches; back off.
            raise ConnectionError("watch closed early without any event")
        return resource_version
