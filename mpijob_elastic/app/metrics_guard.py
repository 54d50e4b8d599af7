"""``/metrics`` behind the API server's authentication and authorization, the design of
controller-runtime's ``WithAuthenticationAndAuthorization`` filter.

A scrape must carry a bearer token (``Authorization: Bearer <token>``). The API server
says whose it is (a TokenReview) and whether they may ``get`` the non-resource URL
``/metrics`` (a SubjectAccessReview), which RBAC grants with a ClusterRole such as the
shipped ``mpijob-elastic-metrics-reader``. No token, or one the server does not accept:
401. A valid token without that grant: 403. A review that gets no answer within
``REVIEW_TIMEOUT_SECONDS`` (the server unreachable or silent, the controller without the
grants to ask): 500, logged, and not remembered. More than ``WAITING_AT_MOST`` scrapes
waiting for reviews: 503 at once.

Each decision is remembered for ``DECISION_TTL_SECONDS`` under the token's SHA-256 (the
token itself is not kept), so a Prometheus scraping every 15 to 30 s costs the API server
one TokenReview and one SubjectAccessReview a minute per replica, not two calls a scrape.
The price: a token revoked, or a grant removed, still scrapes for up to that minute
(controller-runtime keeps an allow for up to 5 minutes). ``/healthz`` and ``/readyz`` are
not guarded: the kubelet probes them without a token (health.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from aiohttp import web

from mpijob_elastic.app.health import Handler
from mpijob_elastic.machinery.kube import ApiError, Kube

log = logging.getLogger("mpijob_elastic.app.metrics_guard")

PATH: Final = "/metrics"
TOKEN_REVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Longer than two scrape intervals, so a scraper's token costs a review pair a minute;
# short enough that a revoked token or grant stops working within that minute.
DECISION_TTL_SECONDS: Final = 60.0
# Tokens remembered at once: a scraper or two in practice. The bound keeps a stream of
# made-up tokens from growing the memory; each of those costs a TokenReview anyway.
MAX_DECISIONS: Final = 256
# Reviews in flight at once. They go over the write client, whose pool has this many
# connections more (cli.py), so scrapes with new tokens never take a write's connection.
REVIEWS_AT_ONCE: Final = 2
# The longest a scrape waits for its token's review, its turn included: past it, 500. And
# how many scrapes may wait at once: past that, 503 at once. A slow or silent API server
# then holds neither connections nor memory for each made-up token sent (issue 31).
REVIEW_TIMEOUT_SECONDS: Final = 5.0
WAITING_AT_MOST: Final = 16


@dataclass(frozen=True)
class Decision:
    status: int  # 200, 401 or 403
    user: str  # the token's user; "" when the token was not accepted
    reason: str  # the API server's words, for the log and the refusal's body


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if that is what it is."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review(token: str) -> dict[str, Any]:
    # No audiences: the API server checks the token against its own, as for any request.
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }


def access_review(user: Mapping[str, Any]) -> dict[str, Any]:
    """May the user a TokenReview found ``get`` ``/metrics``?"""
    spec: dict[str, Any] = {
        "user": user.get("username", ""),
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": PATH, "verb": "get"},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = dict(user["extra"])
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def authenticated(token_status: Mapping[str, Any]) -> Decision | None:
    """The refusal of a token the TokenReview did not accept; None when it did."""
    if token_status.get("authenticated"):
        return None
    return Decision(401, "", str(token_status.get("error") or "the token was not accepted"))


def authorized(user: str, access_status: Mapping[str, Any]) -> Decision:
    if access_status.get("allowed"):
        return Decision(200, user, "")
    reason = str(access_status.get("reason") or "no RBAC rule grants get on /metrics")
    return Decision(403, user, reason)


class Decisions:
    """Decisions by token digest, each good for ``ttl`` seconds (monotonic ``now``)."""

    def __init__(self, ttl: float = DECISION_TTL_SECONDS, size: int = MAX_DECISIONS) -> None:
        self.ttl, self.size = ttl, size
        self._kept: dict[str, tuple[float, Decision]] = {}

    def get(self, key: str, now: float) -> Decision | None:
        kept = self._kept.get(key)
        if kept is None or kept[0] <= now:
            return None
        return kept[1]

    def put(self, key: str, decision: Decision, now: float) -> None:
        self._kept = {k: v for k, v in self._kept.items() if v[0] > now and k != key}
        while len(self._kept) >= self.size:  # the oldest goes first
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (now + self.ttl, decision)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def refusal(decision: Decision) -> web.Response:
    if decision.status == 401:
        return web.Response(
            status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Bearer"}
        )
    return web.Response(status=403, text=f"Forbidden: {decision.user} may not get {PATH}\n")


class MetricsGuard:
    """An aiohttp handler: ``serve`` for a token allowed to get /metrics, else 401/403."""

    def __init__(self, kube: Kube, serve: Handler) -> None:
        self.kube = kube
        self.serve = serve
        self.decisions = Decisions()
        self._reviews = asyncio.Semaphore(REVIEWS_AT_ONCE)
        self._waiting = 0

    async def __call__(self, request: web.Request) -> web.Response:
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            return refusal(Decision(401, "", "no bearer token"))
        key = digest(token)
        decision = self.decisions.get(key, time.monotonic())
        if decision is None:
            if self._waiting >= WAITING_AT_MOST:
                return web.Response(status=503, text="too many scrapes wait for a review\n")
            self._waiting += 1
            try:
                async with asyncio.timeout(REVIEW_TIMEOUT_SECONDS):
                    decision = await self._decide(key, token)
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as err:
                log.warning("metrics scrape not reviewed", extra={"error": str(err) or repr(err)})
                return web.Response(status=500, text="the review of the token failed\n")
            finally:
                self._waiting -= 1
        if decision.status != 200:
            return refusal(decision)
        return await self.serve(request)

    async def _decide(self, key: str, token: str) -> Decision:
        async with self._reviews:
            # A scrape with the same token may have asked while this one waited.
            decision = self.decisions.get(key, time.monotonic())
            if decision is not None:
                return decision
            decision = await self._review(token)
            self.decisions.put(key, decision, time.monotonic())
            if decision.status != 200:
                log.info(
                    "metrics scrape refused",
                    extra={
                        "code": decision.status,
                        "user": decision.user,
                        "reason": decision.reason,
                    },
                )
            return decision

    async def _review(self, token: str) -> Decision:
        answer = await self.kube.request("POST", TOKEN_REVIEWS, token_review(token))
        status = answer.get("status") or {}
        refused = authenticated(status)
        if refused is not None:
            return refused
        user = status.get("user") or {}
        access = await self.kube.request("POST", ACCESS_REVIEWS, access_review(user))
        return authorized(str(user.get("username", "")), access.get("status") or {})
