"""A thin, typed layer over the API server's REST interface for the writes we make.

It speaks plain dicts, as the caches and the planner do, and raises ApiError with the
server's status code and message, so callers can tell a conflict from a rejected object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

log = logging.getLogger("mpijob_elastic.kube")

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
}

MERGE_PATCH = "application/merge-patch+json"
WRITE_TIMEOUT = 30


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


def collection_path(kind: str, namespace: str) -> str:
    prefix, plural = RESOURCES[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}"


class Kube:
    def __init__(self, api: ApiClient) -> None:
        self.api = api

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
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
        data = json.loads(raw) if raw else {}
        if method != "GET":
            # Every request that can change the cluster, at debug level: which process of
            # two wrote what (docs/operations.md, leader election).
            log.debug("api write", extra={"method": method, "path": path, "code": response.status})
        if not 200 <= response.status < 300:
            raise ApiError(
                response.status, str(data.get("reason", "")), str(data.get("message", raw[:200]))
            )
        return dict(data)

    async def get(self, kind: str, namespace: str, name: str) -> Obj:
        """A read off the hot path: only to learn who holds a name we could not create."""
        return await self.request("GET", f"{collection_path(kind, namespace)}/{name}")

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        meta = obj["metadata"]
        return await self.request("POST", collection_path(obj["kind"], meta["namespace"]), obj)

    async def replace(self, obj: Mapping[str, Any]) -> Obj:
        """PUT carrying the observed resourceVersion: a concurrent change makes it 409."""
        meta = obj["metadata"]
        path = f"{collection_path(obj['kind'], meta['namespace'])}/{meta['name']}"
        return await self.request("PUT", path, obj)

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any], subresource: str = ""
    ) -> Obj:
        path = f"{collection_path(kind, namespace)}/{name}" + (
            f"/{subresource}" if subresource else ""
        )
        return await self.request("PATCH", path, patch, MERGE_PATCH)

    async def delete(
        self, kind: str, namespace: str, name: str, uid: str, grace_seconds: int | None = None
    ) -> Obj:
        """Delete only the object with this UID, never a same-named successor."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        return await self.request("DELETE", f"{collection_path(kind, namespace)}/{name}", body)
