"""The shell of Kueue admission (core/queueing/kueue.py decides; docs/scheduling.md,
"Kueue"): whether Kueue's API is served and granted, and the caches of Workloads,
ResourceFlavors and WorkloadPriorityClasses. The writes of a job's Workloads are steps of
its plan (core/planning/write_order.py), made by the writer as every other write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mpijob_elastic.app.preflight import REVIEWS_PATH, Permission, review
from mpijob_elastic.app.watches import CHILD_SELECTOR, Caches
from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import WORKLOAD, Queue
from mpijob_elastic.core.queueing.kueue_writes import released
from mpijob_elastic.machinery.informer import Informer
from mpijob_elastic.machinery.kube import ApiError, Kube
from mpijob_elastic.machinery.kubeclient import ApiClient
from mpijob_elastic.machinery.store import compact

log = logging.getLogger("mpijob_elastic.app.kueue")

Obj = dict[str, Any]
API_PATH = f"/apis/{kueue.API_VERSION}"
GROUP = "kueue.x-k8s.io"
# What the Workload writes and the caches need (config/rbac/kueue.yaml; docs/rbac.md).
PERMISSIONS = (
    *(Permission(v, "workloads", GROUP) for v in ("list", "watch", "create", "update", "delete")),
    Permission("patch", "workloads", GROUP, "status"),
    *(
        Permission(v, r, GROUP, cluster_scoped=True)
        for r in ("resourceflavors", "workloadpriorityclasses")
        for v in ("list", "watch")
    ),
)


class KueueShell:
    def __init__(self, kube: Kube, caches: Caches, slices: bool, unlabelled: str | None) -> None:
        """``slices``: Kueue runs with ElasticJobsViaWorkloadSlices; ``unlabelled``: the
        LocalQueue of a job without the queue label (core/queueing/kueue.py)."""
        self.kube = kube
        self.caches = caches
        self.slices = slices
        self.unlabelled = unlabelled
        self.installed = False
        # Kueue's API is served but this controller may not use it: why.
        self.denied = ""
        self._flavors: Informer | None = None
        self._priorities: Informer | None = None

    async def discover(
        self,
        watch_api: ApiClient,
        namespaces: Sequence[str | None],
        on_workload: Callable[[str, Obj], None],
    ) -> None:
        """Whether Kueue's API is served; if so, add its caches (started with the others).
        Without it the controller runs as before, and only queue-labelled jobs hear of it."""
        # The list of API groups: a group that is not served has no document of its own
        # to 404 with (the server answers plain text there).
        try:
            groups = await self.kube.discover("/apis")
        except ApiError as err:
            log.warning("cannot tell whether Kueue's API is served", extra={"error": str(err)})
            return
        served = any(
            g.get("name") == GROUP
            and any(v.get("groupVersion") == kueue.API_VERSION for v in g.get("versions") or [])
            for g in groups.get("groups") or []
        )
        if not served:
            log.info("Kueue's API is not served: jobs labelled for a queue are held")
            return
        # Granted cluster-wide (config/rbac/kueue.yaml binds it so, the namespaced install
        # too): one review per permission, whatever the namespaces watched.
        allowed = await asyncio.gather(*(self._allowed(p, "") for p in PERMISSIONS))
        missing = [p.describe("") for p, ok in zip(PERMISSIONS, allowed, strict=True) if not ok]
        if missing:
            # Kueue's caches would never fill: the controller runs without them, and only
            # queue-labelled jobs hear of it.
            self.denied = f"missing {', '.join(missing)} (config/rbac/kueue.yaml)"
            log.error("Kueue's API is served but not granted", extra={"error": self.denied})
            return
        self.installed = True
        for ns in namespaces:
            self.caches.add(
                WORKLOAD,
                ns,
                Informer(
                    watch_api,
                    API_PATH,
                    "workloads",
                    on_workload,
                    namespace=ns,
                    label_selector=CHILD_SELECTOR,
                    transform=compact,
                ),
            )
        # Cluster-wide and few; their changes move no job by themselves (a flavor's labels
        # reach the pods a job creates next).
        self._flavors = Informer(watch_api, API_PATH, "resourceflavors", _ignore, transform=compact)
        self._priorities = Informer(
            watch_api, API_PATH, "workloadpriorityclasses", _ignore, transform=compact
        )
        self.caches.add("ResourceFlavor", None, self._flavors)
        self.caches.add("WorkloadPriorityClass", None, self._priorities)

    def queue(self, job: Mapping[str, Any]) -> Queue | None:
        """The job's standing in Kueue's caches; None if the job is not Kueue's."""
        if not kueue.local_queue(job, self.unlabelled):
            return None
        meta = job["metadata"]
        if not self.installed:
            return Queue(installed=False, denied=self.denied, unlabelled=self.unlabelled)
        cache = self.caches.pick(WORKLOAD, meta["namespace"])
        workloads = [
            w
            for w in (cache.by_owner(meta["uid"]) if cache else [])
            if w["metadata"]["namespace"] == meta["namespace"]
        ]
        flavors = {f["metadata"]["name"]: f.get("spec") or {} for f in self._list(self._flavors)}
        priorities = {
            p["metadata"]["name"]: int(p.get("value", 0)) for p in self._list(self._priorities)
        }
        return Queue(True, workloads, flavors, priorities, self.slices, unlabelled=self.unlabelled)

    async def release_left_behind(self, namespace: str, name: str, uid: str | None) -> None:
        """Takes the finalizer off the deleted Workloads of a job of this name that is gone
        (``uid``: the job there now, if any) once that job's last pod is gone: the turns of
        the job itself (kueue_writes.released) cannot, as it has none. Its Workloads' and
        pods' events name the job, so its key comes here."""
        cache = self.caches.pick(WORKLOAD, namespace)
        pods = self.caches.pick("Pod", namespace)
        if not self.installed or cache is None or pods is None:
            return
        owners = {
            str(ref.get("uid"))
            for w in cache.list(namespace)
            if (w["metadata"].get("labels") or {}).get(names.LABEL_JOB) == name
            for ref in w["metadata"].get("ownerReferences") or ()
            if ref.get("controller") and ref.get("kind") == names.KIND and ref.get("uid") != uid
        }
        for owner in sorted(owners):
            for write in released(cache.by_owner(owner), pods.by_owner(owner)):
                try:
                    cache.upsert(await self.kube.replace(write.obj))
                except ApiError as err:
                    if err.status in (404, 409):
                        continue  # gone already, or changed: its event comes back here
                    log.warning(
                        "cannot release a deleted job's Workload",
                        extra={
                            "job": f"{namespace}/{name}",
                            "object": write.obj["metadata"]["name"],
                            "error": str(err),
                        },
                    )
                    raise

    async def _allowed(self, permission: Permission, namespace: str) -> bool:
        answer = await self.kube.discover(REVIEWS_PATH, review(permission, namespace))
        return bool((answer.get("status") or {}).get("allowed"))

    @staticmethod
    def _list(informer: Informer | None) -> list[Obj]:
        return informer.list() if informer is not None else []


def _ignore(type_: str, obj: Obj) -> None:
    """Changes of ResourceFlavors and WorkloadPriorityClasses are read when a job needs them."""
