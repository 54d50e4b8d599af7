"""A thin, typed layer over the API server's REST interface for the writes we make.

It speaks plain dicts, as the caches and the planner do, and raises ApiError with the
server's status code and message, so callers can tell a conflict from a rejected object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp

from mpijob_elastic.machinery import decoding, metrics
from mpijob_elastic.machinery.clients import FIELD_MANAGER
from mpijob_elastic.machinery.kubeclient import ApiClient
from mpijob_elastic.machinery.write_health import WriteHealth

log = logging.getLogger("mpijob_elastic.machinery.kube")

Obj = dict[str, Any]

# kind -> (API path prefix, plural)
RESOURCES: Final[Mapping[str, tuple[str, str]]] = {
    "Pod": ("/api/v1", "pods"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Event": ("/api/v1", "events"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "MPIJob": ("/apis/kubeflow.org/v1", "mpijobs"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "Workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads"),
}

# Kubernetes' verbs for the methods we use; a GET of a collection is a list.
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# The writes that take a fieldManager (a delete changes no field).
_NAMED_WRITES = frozenset({"POST", "PUT", "PATCH"})
_KINDS = {plural: kind for kind, (_, plural) in RESOURCES.items()} | {
    "nodes": "Node",
    "podgroups": "PodGroup",
}

# The reviews: a POST the API server answers and stores nothing for (whether a token is
# valid, whether someone may do something). The start-up check and the metrics' guard make
# them; they are checks, not writes, in the log (docs/operations.md, "Only the leader writes").
REVIEWS: Final = frozenset({"selfsubjectaccessreviews", "subjectaccessreviews", "tokenreviews"})

MERGE_PATCH = "application/merge-patch+json"
WRITE_TIMEOUT = 30
# Seconds between tries of a start-up discovery the server does not answer, at most.
DISCOVERY_BACKOFF_MAX = 30.0


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        return self.status == 422


def kind_of(plural: str) -> str:
    return _KINDS.get(plural, plural)


def request_labels(method: str, path: str) -> tuple[str, str]:
    """(verb, kind) of a request, e.g. ("patch", "Pod") for
    ``PATCH /api/v1/namespaces/ns/pods/name/status``, for the API error metric."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        rest = parts[parts.index("namespaces") + 2 :]
    else:
        # Cluster-scoped: /api/v1/<plural>... or /apis/<group>/<version>/<plural>...
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    plural = rest[0] if rest else ""
    if method == "GET":
        verb = "get" if len(rest) > 1 else "list"
    else:
        verb = _VERBS.get(method, method.lower())
    return verb, kind_of(plural)


def is_review(path: str) -> bool:
    """Whether a request goes to a review resource (``REVIEWS``), which stores nothing."""
    return path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] in REVIEWS


def collection_path(
    kind: str, namespace: str, resources: Mapping[str, tuple[str, str]] = RESOURCES
) -> str:
    prefix, plural = resources[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}"


class Kube:
    def __init__(
        self, api: ApiClient, resources: Mapping[str, tuple[str, str]] = RESOURCES
    ) -> None:
        """``resources``: RESOURCES and the kinds only some configurations write (the
        gang scheduler's PodGroup, whose group depends on the scheduler)."""
        self.api = api
        self.resources = resources
        self.writes = WriteHealth()

    def _path(self, kind: str, namespace: str) -> str:
        return collection_path(kind, namespace, self.resources)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        if method in _NAMED_WRITES:
            path += ("&" if "?" in path else "?") + urlencode({"fieldManager": FIELD_MANAGER})
        token = self.writes.started(time.monotonic())
        answered: bool | None = None  # None: cancelled, which says nothing of the server
        try:
            response = await self.api.call_api(
                path,
                method,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=WRITE_TIMEOUT,
            )
            async with response:
                raw = await response.read()
            answered = True
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            answered = False
            code = "timeout" if isinstance(err, TimeoutError) else "network"
            metrics.API_ERRORS.labels(code, *request_labels(method, path)).inc()
            raise
        finally:
            self.writes.finished(token, answered, time.monotonic())
        try:
            data = decoding.loads(raw) if raw else {}
        except ValueError:
            if 200 <= response.status < 300:
                raise
            # An error the server answers in plain text: a path it does not serve at all
            # (an API group whose CRD is not installed) says "404 page not found".
            text = raw.decode(errors="replace").strip()
            data = {"reason": "NotFound" if response.status == 404 else "", "message": text}
        if method != "GET":
            # Every request that can change the cluster, at debug level: which process of
            # two wrote what (docs/operations.md, leader election). A review changes nothing.
            what = "api check" if is_review(path) else "api write"
            log.debug(what, extra={"method": method, "path": path, "code": response.status})
        if not 200 <= response.status < 300:
            metrics.API_ERRORS.labels(str(response.status), *request_labels(method, path)).inc()
            raise ApiError(
                response.status, str(data.get("reason", "")), str(data.get("message", raw[:200]))
            )
        return dict(data)

    async def list(self, kind: str, namespace: str, name: str) -> Obj:
        """A fresh read of one object, off the hot path: who holds a name we could not
        create.

        A list narrowed to the name, not a GET: the controller may list every kind it
        reads, which already shows it every object of the kind, so RBAC's ``get`` would
        be one more verb granting nothing new (docs/rbac.md). A list without a
        resourceVersion is as fresh as a GET (a consistent read). 404 when nothing has
        the name, as a GET would say.
        """
        query = urlencode({"fieldSelector": f"metadata.name={name}"})
        found = await self.request("GET", f"{self._path(kind, namespace)}?{query}")
        items = found.get("items") or []
        if not items:
            raise ApiError(404, "NotFound", f"{kind} {name} not found")
        # A list's items leave out kind and apiVersion; callers expect a whole object.
        prefix, _ = self.resources[kind]
        return {
            "apiVersion": prefix.removeprefix("/apis/").removeprefix("/api/"),
            "kind": kind,
            **items[0],
        }

    async def discover(self, path: str, review: Obj | None = None) -> Obj:
        """What the server serves (a GET of an API group) or grants (a POSTed ``review``),
        asked once at start to choose the caches: there is nothing to go on without its
        answer, so an unreachable or failing server is waited out, as the informers wait
        it out. A SIGTERM meanwhile cancels the wait (cli.py)."""
        delay = 1.0
        while True:
            try:
                if review is None:
                    return await self.request("GET", path)
                return await self.request("POST", path, review)
            except ApiError as err:
                if err.status < 500:
                    raise
                problem = str(err)
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                problem = str(err) or type(err).__name__
            log.warning("API discovery: no answer yet", extra={"path": path, "error": problem})
            await asyncio.sleep(delay)
            delay = min(delay * 2, DISCOVERY_BACKOFF_MAX)

    async def get(self, kind: str, namespace: str, name: str) -> Obj:
        """A GET of one object: for what the controller may read by name only, its Lease
        (RBAC ``get`` on that one name, and no ``list``: docs/rbac.md)."""
        return await self.request("GET", f"{self._path(kind, namespace)}/{name}")

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        meta = obj["metadata"]
        return await self.request("POST", self._path(obj["kind"], meta["namespace"]), obj)

    async def replace(self, obj: Mapping[str, Any]) -> Obj:
        """PUT carrying the observed resourceVersion: a concurrent change makes it 409."""
        meta = obj["metadata"]
        path = f"{self._path(obj['kind'], meta['namespace'])}/{meta['name']}"
        return await self.request("PUT", path, obj)

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> Obj:
        path = f"{self._path(kind, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        return await self.request("PATCH", path, patch, MERGE_PATCH)

    async def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        uid: str,
        grace_seconds: int | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """Delete only the object with this UID, never a same-named successor; with
        ``resource_version``, only that version of it."""
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        return await self.request("DELETE", f"{self._path(kind, namespace)}/{name}", body)


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
