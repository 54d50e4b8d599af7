"""A list+watch cache of one resource kind, holding objects as the API server's JSON dicts.

This is client-go's reflector + indexer, shaped for asyncio and for a controller whose pure
logic works on plain dicts. The parts that matter on real clusters:

* The first list sets ``synced``; a controller must not act on an empty cache it has not
  filled yet, or it would recreate everything that already exists.
* The watch resumes from the last resourceVersion it saw (including bookmarks, which the
  server sends so that a quiet watch still has a recent resourceVersion to resume from).
  A normal end of a watch (the server's timeoutSeconds) costs only a new watch, never a
  relist.
* When the server no longer has the history we ask for, it says 410 Gone, either as the
  HTTP status or as an ERROR event. Only then do we relist, and we diff the list against
  the cache so the handler learns about objects changed or deleted while we were blind.
* Every other failure (network, apiserver restart, 5xx, 403 while RBAC catches up) is
  retried with capped exponential backoff: the informer never dies while it runs.
* A watch connection whose peer vanished without a FIN (a node or load balancer gone)
  would otherwise hang forever; the client-side read timeout, just longer than the
  server's own timeout, cuts it.

The HTTP is done through the ApiClient (so its authentication, including refreshed tokens,
applies) with ``_preload_content=False``, and the JSON is parsed here: kubernetes_asyncio's
Watch would turn objects into models, which is both slower and the wrong shape.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import random
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, cast

import aiohttp
from kubernetes_asyncio.client import ApiClient

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]
Query = list[tuple[str, str | int]]
EventHandler = Callable[[str, Obj], None]

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

LIST_PAGE_SIZE = 500
CONNECT_TIMEOUT_SECONDS = 30.0
# The apiserver itself gives up on a list after a minute (its --request-timeout).
LIST_READ_TIMEOUT_SECONDS = 60.0
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# UIDs of recently deleted objects, so a write result that arrives after the DELETED event
# cannot resurrect its object in the cache; the race lasts one request, a few thousand
# deletions are plenty.
DELETED_UIDS_KEPT = 4096


class StatusError(Exception):
    """A failure the API server reported as a Status (an HTTP error or a watch ERROR event)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code

    @classmethod
    def from_status(cls, status: Any, http_status: int) -> StatusError:
        if not isinstance(status, dict):
            return cls(http_status, "", str(status)[:500])
        code = status.get("code")
        return cls(
            code if isinstance(code, int) else http_status,
            str(status.get("reason", "")),
            str(status.get("message", "")),
        )


def object_key(obj: Obj) -> Key:
    """(namespace, name); the namespace is "" for cluster-scoped objects."""
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def controller_uid(obj: Obj) -> str | None:
    """The UID in the ownerReference marked ``controller: true``, if any."""
    for ref in obj["metadata"].get("ownerReferences", ()):
        if ref.get("controller"):
            return cast(str, ref["uid"])
    return None


def is_older(obj: Obj, than: Obj) -> bool:
    """Whether ``obj`` is an older version than ``than``.

    resourceVersions are opaque by contract, but every apiserver backed by etcd serves
    integers; when either one is not, we cannot tell and say "not older", so newer data is
    never refused.
    """
    try:
        return int(obj["metadata"]["resourceVersion"]) < int(than["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


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
        watch_timeout_seconds: float = 300.0,
    ) -> None:
        """Watch ``{api_path}/[namespaces/{namespace}/]{plural}``, e.g. "/api/v1", "pods".

        ``namespace=None`` watches all namespaces. ``watch_timeout_seconds`` is the server
        side timeout of one watch request, jittered by ±10% so that many informers started
        together do not all reconnect at the same moment.
        """
        self._api = api
        ns = f"/namespaces/{namespace}" if namespace else ""
        self._path = f"{api_path}{ns}/{plural}"
        self._selector: list[tuple[str, str]] = (
            [("labelSelector", label_selector)] if label_selector else []
        )
        self._on_event = on_event
        self._watch_timeout = watch_timeout_seconds
        self._objects: dict[Key, Obj] = {}
        self._owned: dict[str, set[Key]] = {}
        self._deleted_uids: OrderedDict[str, None] = OrderedDict()
        self._resource_version: str | None = None
        # Whether the current watch has delivered anything: if it did, the connection was
        # healthy, and whatever ended it is not a repeat of an earlier failure.
        self._watch_progressed = False
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()

    def __repr__(self) -> str:
        selector = f"?{self._selector[0][1]}" if self._selector else ""
        return f"Informer({self._path}{selector})"

    # -- reading the cache ----------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._objects.get((namespace, name))

    def list(self, namespace: str | None = None) -> builtins.list[Obj]:
        """All cached objects, or those in ``namespace``, ordered by (namespace, name)."""
        return [
            obj
            for key, obj in sorted(self._objects.items())
            if namespace is None or key[0] == namespace
        ]

    def by_owner(self, uid: str) -> builtins.list[Obj]:
        """The objects whose controller ownerReference names ``uid``, ordered by key."""
        return [self._objects[key] for key in sorted(self._owned.get(uid, ()))]

    def upsert(self, obj: Obj) -> None:
        """Put the result of the controller's own successful write into the cache.

        This gives read-your-writes: the next reconcile sees the write even if its watch
        event has not arrived yet, so it does not, say, create the same pod twice. An
        older version than the cached one is ignored, as is an object whose deletion was
        already seen. No event is reported: the watch will report the change itself.
        """
        if _uid(obj) in self._deleted_uids:
            return
        key = object_key(obj)
        current = self._objects.get(key)
        if current is None or not is_older(obj, current):
            self._store(key, obj)

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
            except StatusError as err:
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
                status = json.loads(body)
            except ValueError:
                status = body.decode(errors="replace")
            raise StatusError.from_status(status, response.status)
        return response

    async def _relist(self) -> str:
        timeout = aiohttp.ClientTimeout(
            sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=LIST_READ_TIMEOUT_SECONDS
        )
        items: builtins.list[Obj] = []
        resource_version = ""
        query: Query = [("limit", LIST_PAGE_SIZE)]
        while True:
            response = await self._request(query, timeout)
            async with response:
                page = json.loads(await response.read())
            # Items in a list come without kind and apiVersion, unlike watch events; fill
            # them in so that every cached object looks the same to the controller.
            kind = page["kind"].removesuffix("List")
            for item in page["items"]:
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", page["apiVersion"])
            items.extend(page["items"])
            # Every page is cut from the same snapshot; the first page's version is its.
            resource_version = resource_version or page["metadata"]["resourceVersion"]
            token = page["metadata"].get("continue")
            if not token:
                break
            query = [("limit", LIST_PAGE_SIZE), ("continue", token)]
        self._replace(items, resource_version)
        self._resource_version = resource_version
        logger.info("%r: listed %d at resourceVersion %s", self, len(items), resource_version)
        self.synced.set()
        return resource_version

    def _replace(self, items: builtins.list[Obj], resource_version: str) -> None:
        """Make the cache equal a fresh list, then report the differences."""
        listed = {object_key(obj): obj for obj in items}
        snapshot = {"metadata": {"resourceVersion": resource_version}}
        events: builtins.list[tuple[str, Obj]] = []
        for key, obj in listed.items():
            current = self._objects.get(key)
            if current is None:
                events.append((ADDED, obj))
            elif current["metadata"].get("resourceVersion") == obj["metadata"].get(
                "resourceVersion"
            ) or is_older(obj, current):
                # Unchanged, or the controller upserted a newer write meanwhile.
                continue
            else:
                events.append((MODIFIED, obj))
            self._store(key, obj)
        for key, current in list(self._objects.items()):
            # An object missing from the list is gone, unless the controller upserted it
            # after the snapshot was taken (it is then newer than the snapshot).
            if key not in listed and not is_older(snapshot, current):
                self._delete(key, current)
                events.append((DELETED, current))
        for event_type, obj in events:
            self._notify(event_type, obj)

    async def _watch(self, resource_version: str) -> None:
        server_timeout = max(1, round(self._watch_timeout * random.uniform(0.9, 1.1)))
        query: Query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", server_timeout),
        ]
        # The server ends the watch at server_timeout even when it has sent nothing; a
        # tenth more and a second is ample for that end to reach us, and past it the
        # connection is dead.
        timeout = aiohttp.ClientTimeout(
            sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=server_timeout * 1.1 + 1
        )
        logger.debug("%r: watching from resourceVersion %s", self, resource_version)
        started = asyncio.get_running_loop().time()
        response = await self._request(query, timeout)
        try:
            async with aclosing(_lines(response.content)) as lines:
                async for line in lines:
                    self._handle_watch_event(json.loads(line))
                    self._watch_progressed = True
        finally:
            # Never reuse a watch connection: closing is the only way to end a stream
            # midway, and one new connection per watch is cheap.
            response.close()
        lasted = asyncio.get_running_loop().time() - started
        if not self._watch_progressed and lasted < server_timeout / 2:
            # Something between us and the server cuts watches short; reconnecting at once
            # would hammer it in a tight loop, so make this a failure that backs off.
            raise ConnectionError(f"watch closed after {lasted:.1f}s without any event")
        logger.debug("%r: watch ended at resourceVersion %s", self, self._resource_version)

    def _handle_watch_event(self, event: Obj) -> None:
        event_type = event["type"]
        obj = event["object"]
        if event_type == "ERROR":
            raise StatusError.from_status(obj, 200)
        if event_type in (ADDED, MODIFIED):
            key = object_key(obj)
            current = self._objects.get(key)
            # Skip a version older than one the controller upserted; the watch will
            # deliver that newer version shortly.
            if current is None or not is_older(obj, current):
                self._store(key, obj)
                self._notify(event_type, obj)
        elif event_type == DELETED:
            key = object_key(obj)
            current = self._objects.get(key)
            # The cache may already hold a successor of the same name that the controller
            # created and upserted; only the deleted incarnation goes.
            if current is not None and _uid(current) == _uid(obj):
                self._delete(key, current)
            self._remember_deleted(obj)
            self._notify(DELETED, obj)
        elif event_type != "BOOKMARK":
            logger.warning("%r: ignoring watch event of type %s", self, event_type)
        self._resource_version = obj["metadata"]["resourceVersion"]

    def _store(self, key: Key, obj: Obj) -> None:
        current = self._objects.get(key)
        if current is not None:
            self._unindex(key, current)
            if _uid(current) != _uid(obj):
                # Replaced by a new incarnation while we were not watching.
                self._remember_deleted(current)
        self._objects[key] = obj
        owner = controller_uid(obj)
        if owner is not None:
            self._owned.setdefault(owner, set()).add(key)

    def _delete(self, key: Key, current: Obj) -> None:
        del self._objects[key]
        self._unindex(key, current)
        self._remember_deleted(current)

    def _unindex(self, key: Key, obj: Obj) -> None:
        owner = controller_uid(obj)
        if owner is None:
            return
        keys = self._owned[owner]
        keys.discard(key)
        if not keys:
            del self._owned[owner]

    def _remember_deleted(self, obj: Obj) -> None:
        uid = _uid(obj)
        if uid is None:
            return
        self._deleted_uids[uid] = None
        self._deleted_uids.move_to_end(uid)
        if len(self._deleted_uids) > DELETED_UIDS_KEPT:
            self._deleted_uids.popitem(last=False)

    def _notify(self, event_type: str, obj: Obj) -> None:
        try:
            self._on_event(event_type, obj)
        except Exception:
            logger.exception("%r: event handler failed on %s %s", self, event_type, object_key(obj))


def _uid(obj: Obj) -> str | None:
    return cast(str | None, obj["metadata"].get("uid"))


async def _lines(stream: aiohttp.StreamReader) -> AsyncGenerator[bytes, None]:
    """Split a watch stream into its newline-terminated JSON events, however large.

    aiohttp's readline refuses lines longer than its buffer limit, and one event holds a
    whole object, which can be megabytes.
    """
    buffer = bytearray()
    async for chunk in stream.iter_any():
        scanned = len(buffer)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", scanned)) >= 0:
            line = bytes(buffer[start:end])
            if line.strip():
                yield line
            start = scanned = end + 1
        del buffer[:start]
    if bytes(buffer).strip():
        raise ValueError("watch stream ended in the middle of an event")
