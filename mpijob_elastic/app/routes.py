"""Watch events to job keys: which change of a job, a child or a node wakes which job, and
in which lane of the work queue (docs/design.md, "Which job goes next"). What may wake
a job is ``predicates.py``'s; this module routes it, and keeps the little it needs to: the
jobs' last seen signatures, when each was first seen, and which nodes are going away.
"""

from __future__ import annotations

import time
from typing import Any

from mpijob_elastic.app.fleet import Fleet
from mpijob_elastic.app.predicates import job_signature, manages, may_move_hosts, starts_pods
from mpijob_elastic.app.watches import JOB_LABELS, Caches
from mpijob_elastic.core import names, nodes
from mpijob_elastic.core.objects import podgroups
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.machinery import metrics
from mpijob_elastic.machinery.workqueue import FIRST, RANKED, URGENT, WorkQueue

Key = tuple[str, str]
Obj = dict[str, Any]


class Routes:
    def __init__(
        self, settings: Settings, caches: Caches, queue: WorkQueue[Key], fleet: Fleet
    ) -> None:
        self.settings = settings
        self.caches = caches
        self.queue = queue
        self.fleet = fleet
        self.latency = metrics.HostListLatency()
        # Nodes going away, and why (nodes.py): observe.py moves workers off them.
        self.leaving_nodes: dict[str, str] = {}
        # Nodes that take new pods (nodes.takes_pods): one that starts to is room.
        self.open_nodes: set[str] = set()
        self._job_signatures: dict[Key, tuple[Any, ...]] = {}
        self._first_seen: dict[Key, float] = {}

    def rank(self, key: Key) -> float:
        """Older jobs first (docs/design.md, "Which job goes next"); one not in the cache
        (deleted, or not seen yet) after all that are.

        creationTimestamp has whole seconds, and a hundred jobs submitted together share
        one: within the second, the order this controller first saw them in decides (after
        a restart, when all are seen at once, the order they were queued in)."""
        namespace, name = key
        jobs = self.caches.pick(names.KIND, namespace)
        job = jobs.get(namespace, name) if jobs else None
        created = parse_time(job["metadata"].get("creationTimestamp")) if job else None
        if created is None:
            return time.time()
        seconds = created.timestamp()
        seen = self._first_seen.get(key, seconds + 1)
        return seconds + min(max(seen - seconds, 0.0), 0.999)

    def on_job(self, type_: str, job: Obj) -> None:
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        if type_ == "DELETED":
            self._job_signatures.pop(key, None)
            self._first_seen.pop(key, None)
        else:
            self._first_seen.setdefault(key, time.time())
            signature = job_signature(job)
            if self._job_signatures.get(key) == signature:
                return
            self._job_signatures[key] = signature
        # An edit of a job that has host lists already may shorten them: urgent, and first
        # if it asks for pods. A new job's first turn waits its turn behind older jobs.
        config_maps = self.caches.pick("ConfigMap", meta["namespace"])
        listed = config_maps is not None and (
            config_maps.get(meta["namespace"], names.config_map_name(meta["name"])) is not None
        )
        if type_ == "DELETED" or not listed:
            self.queue.add(key)
            return
        pods = self.caches.pick("Pod", meta["namespace"])
        owned = pods.by_owner(str(meta.get("uid"))) if pods is not None else []
        self.queue.add(key, lane=FIRST if starts_pods(job, owned) else URGENT)

    def on_child(self, type_: str, obj: Obj) -> None:
        meta = obj["metadata"]
        if obj.get("kind") == "Pod":
            self.latency.pod(type_, obj, time.monotonic())
            if type_ == "DELETED":
                self.wake(self.fleet.pod_deleted(obj))
        elif obj.get("kind") == "ConfigMap":
            self.wake(self.fleet.config_map(type_, obj, self._job_uid(obj)))
        refs = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
        if obj.get("kind") == podgroups.KIND and not any(r.get("kind") == names.KIND for r in refs):
            # Named as its job (podgroups.py): one that another object holds keeps the
            # job from making pods (held_names.py); its going frees the name.
            self._wake_if_job(meta["namespace"], meta["name"])
        lane = URGENT if may_move_hosts(type_, obj) else RANKED
        for ref in refs:
            if ref.get("kind") == names.KIND and ref.get("apiVersion", "").startswith(
                f"{names.GROUP}/"
            ):
                self.queue.add((meta["namespace"], ref["name"]), lane=lane)
        if refs:
            return
        # An orphan that the job its labels name is not: it may hold one of that job's
        # names (held_names.py), and its change may free it.
        labels = meta.get("labels") or {}
        for name in {labels[k] for k in JOB_LABELS if k in labels}:
            self._wake_if_job(meta["namespace"], name)

    def _wake_if_job(self, namespace: str, name: str) -> None:
        jobs = self.caches.pick(names.KIND, namespace)
        if jobs is not None and jobs.get(namespace, name) is not None:
            self.queue.add((namespace, name))

    def _job_uid(self, config_map: Obj) -> str | None:
        """The UID of the job a ``<job>-config`` ConfigMap is named for, None if no such
        job is cached."""
        meta = config_map["metadata"]
        suffix = names.config_map_name("")
        name = str(meta["name"])
        jobs = self.caches.pick(names.KIND, meta["namespace"])
        if not name.endswith(suffix) or jobs is None:
            return None
        job = jobs.get(meta["namespace"], name[: -len(suffix)])
        return str(job["metadata"].get("uid")) if job is not None else None

    def on_preempted(self, type_: str, event: Obj) -> None:
        """The scheduler's Event on a pod it preempted: the victim's job may be waiting for
        it to name the preemptor (core/sizing/preemptors.py). A victim already gone from the pod
        cache is named at the end of that wait, from the Events cache."""
        if type_ == "DELETED":
            return
        namespace = event["metadata"]["namespace"]
        pods = self.caches.pick("Pod", namespace)
        victim = pods.get(namespace, event["involvedObject"].get("name") or "") if pods else None
        for ref in (victim or {"metadata": {}})["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == names.KIND:
                self.queue.add((namespace, ref["name"]))

    def wake(self, keys: list[Key]) -> None:
        for key in keys:
            self.queue.add(key)

    def on_node(self, type_: str, node: Obj) -> None:
        name = node["metadata"]["name"]
        taints = self.settings.leaving_node_taints
        why = None if type_ == "DELETED" else nodes.leaving(node, taints)
        if type_ != "DELETED" and nodes.takes_pods(node, taints):
            if name not in self.open_nodes:
                # Room the opportunistic jobs may use: a new node once it is Ready, one
                # uncordoned, one whose taint went.
                self.open_nodes.add(name)
                self.wake(self.fleet.changed())
        else:
            self.open_nodes.discard(name)
        if self.leaving_nodes.get(name) == why:
            return
        if why is None:
            self.leaving_nodes.pop(name, None)
        else:
            self.leaving_nodes[name] = why
        # The jobs with workers there move them (or stop moving them).
        for cache in self.caches.by_kind.get("Pod", {}).values():
            for pod in cache.list():
                if (pod.get("spec") or {}).get("nodeName") == name:
                    self.on_child("MODIFIED", pod)

    def managed_jobs(self) -> list[Obj]:
        return [
            job
            for cache in self.caches.by_kind.get(names.KIND, {}).values()
            for job in cache.list()
            if manages(job, self.settings)
        ]
