"""The scheduler's ``Preempted`` Events, for the job's Event to name who took a worker's
room (core/sizing/preemptors.py; docs/capacity.md, "Giving capacity back: preemption").

The kube-scheduler records one on each pod it preempts: reason ``Preempted``, the victim as
``involvedObject`` (``regarding`` in events.k8s.io), the preemptor as ``related``. One cache
per watched namespace (all namespaces: one), narrowed by the API server to those Events on
pods and trimmed to the two references, a couple of hundred bytes each; Events live an hour
(the API server's ``--event-ttl``), so the cache holds at most the last hour's preemptions.

Reading Events needs ``list`` and ``watch`` on them (docs/rbac.md). A controller that may
not is asked once, at start (SelfSubjectAccessReviews): without them it runs as before,
without this cache, and its Events say so.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mpijob_elastic.app.preflight import REVIEWS_PATH, SCHEDULER_EVENTS, review
from mpijob_elastic.app.watches import Caches
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import Kube
from mpijob_elastic.machinery.kubeclient import ApiClient

log = logging.getLogger("mpijob_elastic.app.preemptions")

Obj = dict[str, Any]
# Its own name among the caches: not the kind of the Events the controller writes.
KIND = "PreemptedEvent"
FIELDS = "reason=Preempted,involvedObject.kind=Pod"
# The API server serves Events without its watch cache by default (kube-apiserver's
# DefaultWatchCacheSizes sets events to 0), so their watches get no bookmarks. A quiet one
# was cut as dead at the informer's idle bound, with a warning every 65 s in a quiet
# cluster (issue 33); ended by the server first, it starts again quietly: one watch
# request a minute per watched namespace.
WATCH_SECONDS = 50.0


# The note the scheduler writes (pkg/scheduler/framework/preemption, 1.34).
NOTE = re.compile(r"Preempted by pod ([0-9a-fA-F-]{1,64}) on node")


def slim(event: Obj) -> Obj:
    """What the cache keeps of one: its key, the victim's name and UID, the preemptor (by
    name, or by the UID of the scheduler's note where ``related`` is missing), and when it
    was first recorded (``eventTime`` from events.k8s.io, else ``firstTimestamp``, else its
    creation)."""
    meta, victim, related = (_map(event.get(k)) for k in ("metadata", "involvedObject", "related"))
    note = NOTE.search(str(event.get("message") or ""))
    return {
        "apiVersion": event.get("apiVersion"),
        "kind": event.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "involvedObject": {k: victim.get(k) for k in ("name", "uid")},
        "related": {k: related.get(k) for k in ("namespace", "name")},
        "preemptorUID": note.group(1) if note else None,
        "at": event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp"),
    }


def _map(value: object) -> Mapping[str, Any]:
    # The server types an Event's fields; the cache's transform must not raise all the
    # same, or one Event would fail every relist of its namespace's Events (issue 31).
    return value if isinstance(value, Mapping) else {}


def preemptor(event: Obj) -> str | None:
    """``<namespace>/<pod>`` of the pod the victim made room for, if the Event names it.

    A scheduler that records its Events through the core/v1 recorder (it does when the API
    server did not yet serve events.k8s.io/v1 as it started: kind's, which starts with the
    API server) leaves ``related`` out; its note still carries the preemptor's UID, and
    the Event says ``pod <uid>`` then, as the scheduler does."""
    related = event.get("related") or {}
    if related.get("namespace") and related.get("name"):
        return f"{related['namespace']}/{related['name']}"
    uid = event.get("preemptorUID")
    return f"pod {uid}" if uid else None


def preemptors(informer: Informer | None, namespace: str) -> dict[str, str]:
    """The preemptor by victim UID, of the pods of ``namespace``."""
    return first_preemptors(informer.list(namespace) if informer is not None else [])


def first_preemptors(events: Iterable[Obj]) -> dict[str, str]:
    """The preemptor by victim UID: the first that preempted it. A victim that terminates
    can be chosen again by the next preemptor, and the scheduler records a second Event on
    it (issue 33: a job's Event credited both victims of two preemptors to the second, in
    4 of 6 runs); the room it freed went to the first. An Event whose time cannot be read
    comes after those whose time can."""
    found: dict[str, tuple[tuple[int, float], str]] = {}
    for event in events:
        uid, who = event["involvedObject"].get("uid"), preemptor(event)
        if not uid or not who:
            continue
        at = parse_time(event.get("at"))
        order = (0, at.timestamp()) if at is not None else (1, 0.0)
        if str(uid) not in found or order < found[str(uid)][0]:
            found[str(uid)] = (order, who)
    return {uid: who for uid, (_, who) in found.items()}


async def watch(
    kube: Kube,
    watch_api: ApiClient,
    namespaces: Sequence[str | None],
    caches: Caches,
    on_event: Callable[[str, Obj], None],
) -> bool:
    """Add the caches (started with the others) if this controller may read Events in
    every namespace it serves; whether it may."""
    wanted = [(p, ns or "") for ns in namespaces for p in SCHEDULER_EVENTS]
    answers = await asyncio.gather(
        *(kube.discover(REVIEWS_PATH, review(p, ns)) for p, ns in wanted)
    )
    missing = [
        p.describe(ns)
        for (p, ns), answer in zip(wanted, answers, strict=True)
        if not (answer.get("status") or {}).get("allowed")
    ]
    if missing:
        # The cache would never fill: the controller runs without it.
        log.error(
            "may not read the scheduler's Preempted Events: the Events of preempted "
            "opportunistic workers will not name their preemptors",
            extra={"error": f"missing {', '.join(missing)} (config/rbac/role.yaml)"},
        )
        return False
    for ns in namespaces:
        caches.add(
            KIND,
            ns,
            Informer(
                watch_api,
                "/api/v1",
                "events",
                on_event,
                namespace=ns,
                transform=slim,
                watch_timeout_seconds=WATCH_SECONDS,
            ).narrow(FIELDS),
        )
    return True
