"""A list+watch cache of one resource kind, holding objects as the API server's JSON dicts.

This is client-go's reflector over a store (``store.py`` holds the objects and every rule
about what an input does to them; this module is the I/O), shaped for asyncio and for a
controller whose pure logic works on plain dicts. The parts that matter on real clusters:

* The first list sets ``synced``; a controller must not act on an empty cache it has not
  filled yet, or it would recreate everything that already exists.
* The watch resumes from the last resourceVersion it saw (including bookmarks). A normal
  end of a watch (the server's timeoutSeconds) costs only a new watch, never a relist.
* When the server no longer has the history we ask for, it says 410 Gone, either as the
  HTTP status or as an ERROR event. Only then do we relist, and the store diffs the list
  against what it holds so the handler learns about objects changed or deleted while we
  were blind.
* Every other failure (network, apiserver restart, 5xx, 403 while RBAC catches up) is
  retried with capped exponential backoff: the informer never dies while it runs.

A dead watch is noticed by its silence. The apiserver's watch cache sends every watch that
allows bookmarks a BOOKMARK about once a minute (and one just before its timeoutSeconds),
however quiet the resource, so a healthy watch never goes longer than that without data,
and a read timeout a little longer than the bookmark period cuts a dead one: within
about ``WATCH_IDLE_SECONDS`` of the last byte, instead of after the server's whole
timeoutSeconds plus a margin (5.5 minutes before). The alternatives do less: TCP
keepalive only proves that the next hop's kernel is alive, so it misses a proxy or load
balancer that keeps the connection but stopped relaying, and a hung apiserver; a short
server timeoutSeconds would reconnect every quiet watch every few tens of seconds (12
per watched namespace) to get the same bound. The price here is one extra watch request
when a bookmark comes late, resumed from the last resourceVersion, never a relist; a
server without a watch cache sends no bookmarks, and its quiet watches are reconnected
once per ``WATCH_IDLE_SECONDS`` with a warning that says why. A bookmark late under load
(seen with 1000 jobs changing at once at a load of 6-13) looks the same as a dead
connection once: the first silence after the server was heard is logged at INFO and the
watch resumed at once; only a second in a row, with nothing heard on either connection,
is a WARNING (a server that sends no bookmarks, a relay that keeps dropping the stream).
Events are served without one by default (kube-apiserver disables the watch cache for
them): an informer of Events sets a server timeout under ``WATCH_IDLE_SECONDS``, so that
its quiet watches end cleanly and start again instead (app/preemptions.py).

The HTTP is done through the ApiClient (so its authentication, including refreshed tokens,
applies) with ``_preload_content=False``, and the JSON is parsed here: kubernetes_asyncio's
Watch would turn objects into models, which is both slower and the wrong shape.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import cast

import aiohttp

from mpijob_elastic.machinery import decoding, metrics, watch_stream
from mpijob_elastic.machinery.kube import StatusError, kind_of
from mpijob_elastic.machinery.kubeclient import ApiClient
from mpijob_elastic.machinery.store import (
    ADDED,
    DELETED,
    MODIFIED,
    Obj,
    Store,
    Transform,
    object_key,
    slim,
)

__all__ = ["ADDED", "DELETED", "MODIFIED", "EventHandler", "Informer", "Obj", "StatusError"]

logger = logging.getLogger(__name__)

Query = list[tuple[str, str | int]]
EventHandler = Callable[[str, Obj], None]

LIST_PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = 300.0
CONNECT_TIMEOUT_SECONDS = 30.0
# The apiserver itself gives up on a list after a minute (its --request-timeout).
LIST_READ_TIMEOUT_SECONDS = 60.0
# The watch cache's bookmark period is a minute (k8s.io/apiserver's cacher); the margin
# covers its one-second dispatch tick and a loaded apiserver.
WATCH_IDLE_SECONDS = 65.0
# A view older than this is not trusted: two missed heartbeats in a row.
STALE_AFTER_SECONDS = 2 * WATCH_IDLE_SECONDS
# A watch the server ends sooner than this with nothing on it is a failure that backs off
# (a tight reconnect loop otherwise); a longer one is a routine end, as client-go's
# reflector takes it. A loaded API server ends quiet watches after a few seconds: seen at
# the start of every bench/mass.py and bench/idle.py run, on the one watch that carries no
# events, which warned 2-4 times each run when anything under half its timeout failed.
SHORT_WATCH_SECONDS = 1.0
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0


class WatchSilent(ConnectionError):
    """A watch heard nothing, not even a bookmark, for ``WATCH_IDLE_SECONDS``."""


class Informer:
    """Keeps a cache of the objects of one kind and reports their changes.

    ``on_event(type, obj)`` is called with "ADDED", "MODIFIED" or "DELETED" once the cache
    holds the change; for DELETED, ``obj`` is the last state known. It must not block: an
    exception in it is logged and otherwise ignored.

    Objects handed out are the cache's own dicts, shared with every caller: never mutate
    them (deep-copy before building a modified version).
    """

    def __init__(
        self,
        api: ApiClient,
        api_path: str,
        plural: str,
        on_event: EventHandler,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        watch_timeout_seconds: float = WATCH_TIMEOUT_SECONDS,
        transform: Transform | None = slim,
    ) -> None:
        """Watch ``{api_path}/[namespaces/{namespace}/]{plural}``, e.g. "/api/v1", "pods".

        ``namespace=None`` watches all namespaces. ``watch_timeout_seconds`` is the server
        side timeout of one watch request, jittered by ±10% so that many informers started
        together do not all reconnect at the same moment. ``transform`` is applied to
        every object before it is cached and handed out, upserts included; the default
        drops managedFields and kubectl's last-applied annotation, None keeps objects
        whole.
        """
        self._api = api
        ns = f"/namespaces/{namespace}" if namespace else ""
        self._path = f"{api_path}{ns}/{plural}"
        self._kind = kind_of(plural)
        # Exported at 0 from the start: a rate over a series made at its first increment
        # misses that increment (metrics.py).
        metrics.WATCH_RESTARTS.labels(self._kind)
        self._selector: list[tuple[str, str]] = (
            [("labelSelector", label_selector)] if label_selector else []
        )
        self._on_event = on_event
        self._watch_timeout = watch_timeout_seconds
        self._store = Store(transform)
        self._resource_version: str | None = None
        # Whether the current watch has delivered anything: if it did, the connection was
        # healthy, and whatever ended it is not a repeat of an earlier failure.
        self._watch_progressed = False
        # Idle cuts in a row with nothing heard between them (see the module's docstring).
        self._silences = 0
        self._watching = False
        self._last_contact: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()

    def __repr__(self) -> str:
        selector = f"?{self._selector[0][1]}" if self._selector else ""
        return f"Informer({self._path}{selector})"

    def narrow(self, field_selector: str) -> Informer:
        """List and watch only the objects ``field_selector`` selects too (before start).
        The API server reads one fieldSelector parameter, so narrowing again adds to it."""
        fields = [f for key, f in self._selector if key == "fieldSelector"]
        self._selector = [
            *((k, v) for k, v in self._selector if k != "fieldSelector"),
            ("fieldSelector", ",".join([*fields, field_selector])),
        ]
        return self

    # -- reading the cache ----------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._store.get(namespace, name)

    def list(self, namespace: str | None = None) -> builtins.list[Obj]:
        """All cached objects, or those in ``namespace``, ordered by (namespace, name)."""
        return self._store.list(namespace)

    def by_owner(self, uid: str) -> builtins.list[Obj]:
        """The objects whose controller ownerReference names ``uid``, ordered by key."""
        return self._store.by_owner(uid)

    def upsert(self, obj: Obj) -> None:
        """Put the result of the controller's own successful write into the cache.

        This gives read-your-writes: the next reconcile sees the write even if its watch
        event has not arrived yet, so it does not, say, create the same pod twice. An
        older version than the cached one is ignored, as is an object whose deletion was
        already seen. No event is reported: the watch will report the change itself.
        """
        self._store.upsert(obj)

    # -- health -----------------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        """Whether a watch stream is open right now (false while listing or backing off)."""
        return self._watching

    @property
    def healthy(self) -> bool:
        """Running, synced, and heard from the server within two bookmark periods.

        A healthy quiet watch hears a bookmark every minute, and a dead one is cut and
        replaced within ``WATCH_IDLE_SECONDS``, so only an informer that cannot get a
        working watch back goes stale. Cheap enough for every readiness probe.
        """
        return (
            self._task is not None
            and not self._task.done()
            and self.synced.is_set()
            and self._last_contact is not None
            and time.monotonic() - self._last_contact < STALE_AFTER_SECONDS
        )

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start listing and watching in a task; a restart resumes where it stopped."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=repr(self))

    async def stop(self) -> None:
        """Stop the watch and wait for it to end. The cache stays readable."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            # Re-raise only if it is our caller being cancelled, not the task we cancelled.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    async def _run(self) -> None:
        failures = 0
        while True:
            self._watch_progressed = False
            try:
                resource_version = self._resource_version
                if resource_version is None:
                    resource_version = await self._relist()
                await self._watch(resource_version)
                failures = 0
                continue
            except WatchSilent as err:
                metrics.WATCH_RESTARTS.labels(self._kind).inc()
                self._silences += 1
                if self._silences == 1:
                    # Most likely a bookmark late under load: resume at once, no backoff.
                    logger.info("%r: %s; resuming", self, err)
                    continue
                delay = self._backoff(failures)
                logger.warning(
                    "%r: %s, %d times in a row; retrying in %.1fs", self, err, self._silences, delay
                )
            except StatusError as err:
                metrics.WATCH_RESTARTS.labels(self._kind).inc()
                if self._watch_progressed:
                    failures = 0
                if err.code != 410:
                    delay = self._backoff(failures)
                    logger.warning("%r: %s; retrying in %.1fs", self, err, delay)
                else:
                    # A relist right away, unless it keeps happening (a server whose
                    # lists are older than its watch window would otherwise spin us).
                    delay = self._backoff(failures - 1) if failures else 0.0
                    logger.info("%r: %s; relisting in %.1fs", self, err, delay)
                    self._resource_version = None
            except Exception as err:
                metrics.WATCH_RESTARTS.labels(self._kind).inc()
                if self._watch_progressed:
                    failures = 0
                delay = self._backoff(failures)
                # Network trouble is routine and its traceback says nothing; anything else
                # (a malformed response, a failing token refresh) gets one.
                routine = isinstance(err, aiohttp.ClientError | OSError | TimeoutError)
                logger.warning(
                    "%r: %s: %s; retrying in %.1fs",
                    self,
                    type(err).__name__,
                    err,
                    delay,
                    exc_info=not routine,
                )
            failures += 1
            await asyncio.sleep(delay)

    @staticmethod
    def _backoff(failures: int) -> float:
        return min(BACKOFF_MAX_SECONDS, BACKOFF_INITIAL_SECONDS * 2.0 ** min(failures, 32))

    async def _request(
        self, query: Query, client_timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        response = cast(
            aiohttp.ClientResponse,
            await self._api.call_api(
                self._path,
                "GET",
                query_params=[*query, *self._selector],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            ),
        )
        if response.status != 200:
            try:
                body = await response.read()
            finally:
                response.release()
            try:
                status = decoding.loads(body)
            except ValueError:
                status = body.decode(errors="replace")
            verb = "watch" if ("watch", "true") in query else "list"
            metrics.API_ERRORS.labels(str(response.status), verb, self._kind).inc()
            raise StatusError.from_status(status, response.status)
        self._last_contact = time.monotonic()
        return response

    async def _relist(self) -> str:
        timeout = aiohttp.ClientTimeout(
            sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=LIST_READ_TIMEOUT_SECONDS
        )
        metrics.RELISTS.labels(self._kind).inc()
        items: builtins.list[Obj] = []
        resource_version = ""
        query: Query = [("limit", LIST_PAGE_SIZE)]
        while True:
            response = await self._request(query, timeout)
            async with response:
                page = decoding.loads(await response.read())
            # Items in a list come without kind and apiVersion, unlike watch events; fill
            # them in so that every cached object looks the same to the controller.
            kind, meta = page["kind"].removesuffix("List"), page["metadata"]
            for item in page["items"]:
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", page["apiVersion"])
                items.append(self._store.transform(item))
            del page  # before the next page is read: one page of whole objects at a time
            # Every page is cut from the same snapshot; the first page's version is its.
            resource_version = resource_version or meta["resourceVersion"]
            token = meta.get("continue")
            if not token:
                break
            query = [("limit", LIST_PAGE_SIZE), ("continue", token)]
        for event_type, obj in self._store.replace(items, resource_version, transformed=True):
            self._notify(event_type, obj)
        self._resource_version = resource_version
        self._silences = 0
        logger.info("%r: listed %d at resourceVersion %s", self, len(items), resource_version)
        self.synced.set()
        return resource_version

    async def _watch(self, resource_version: str) -> None:
        server_timeout = max(1, round(self._watch_timeout * random.uniform(0.9, 1.1)))
        query: Query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", server_timeout),
        ]
        timeout = aiohttp.ClientTimeout(
            sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=WATCH_IDLE_SECONDS
        )
        logger.debug("%r: watching from resourceVersion %s", self, resource_version)
        started = time.monotonic()
        response = await self._request(query, timeout)
        self._watching = True
        try:
            async with aclosing(watch_stream.lines(response.content)) as lines:
                async for line in lines:
                    self._last_contact = time.monotonic()
                    self._silences = 0
                    self._handle_watch_event(decoding.loads(line))
                    self._watch_progressed = True
        except TimeoutError as err:
            raise WatchSilent(
                f"watch silent for {WATCH_IDLE_SECONDS:.0f}s, not even a bookmark: "
                "taking the connection for dead"
            ) from err
        finally:
            self._watching = False
            # Never reuse a watch connection: closing is the only way to end a stream
            # midway, and one new connection per watch is cheap.
            response.close()
        lasted = time.monotonic() - started
        if cut_short(lasted, self._watch_progressed):
            raise ConnectionError(f"watch closed after {lasted:.1f}s without any event")
        logger.debug("%r: watch ended at resourceVersion %s", self, self._resource_version)

    def _handle_watch_event(self, event: Obj) -> None:
        event_type = event["type"]
        obj = event["object"]
        if event_type == "ERROR":
            raise StatusError.from_status(obj, 200)
        if event_type in (ADDED, MODIFIED, DELETED):
            reported = self._store.apply(event_type, obj)
            if reported is not None:
                self._notify(event_type, reported)
        elif event_type != "BOOKMARK":
            logger.warning("%r: ignoring watch event of type %s", self, event_type)
        self._resource_version = obj["metadata"]["resourceVersion"]

    def _notify(self, event_type: str, obj: Obj) -> None:
        try:
            self._on_event(event_type, obj)
        except Exception:
            logger.exception("%r: event handler failed on %s %s", self, event_type, object_key(obj))


def cut_short(lasted: float, progressed: bool) -> bool:
    """Whether a watch that ended by itself after ``lasted`` seconds failed: something
    between us and the server ends watches at once, and reconnecting at once would hammer
    it in a tight loop."""
    return not progressed and lasted < SHORT_WATCH_SECONDS
