"""A tiny in-memory stand-in for the API server, to run plans against in unit tests.

It applies a plan's actions the way the API server would (names unique per kind, deletes
honour the UID precondition) and records the history the tests check invariants against:
which Role existed when each pod was created, and when each host left discovery.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from mpijob_elastic import names
from mpijob_elastic.actions import (
    AnnotatePod,
    Create,
    DeletePod,
    Emit,
    Observed,
    Plan,
    Replace,
    WriteStatus,
)
from mpijob_elastic.plan import plan
from mpijob_elastic.settings import KubectlDelivery, Settings

Obj = dict[str, Any]
SETTINGS = Settings(kubectl_delivery=KubectlDelivery.NONE, default_drain_seconds=30)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_job(
    replicas: int = 2,
    *,
    name: str = "job",
    namespace: str = "ns",
    annotations: dict[str, str] | None = None,
    slots: int = 1,
    **spec: Any,
) -> Obj:
    container = {"name": "main", "image": "img"}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "job-uid",
            "resourceVersion": "1",
            "annotations": annotations or {},
        },
        "spec": {
            "slotsPerWorker": slots,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [container]}}},
                "Worker": {"replicas": replicas, "template": {"spec": {"containers": [container]}}},
            },
            **spec,
        },
    }


def running_status(pod: Obj) -> Obj:
    """What a kubelet reports once every container of the pod runs."""
    return {
        "phase": "Running",
        "containerStatuses": [
            {"name": c["name"], "ready": True, "state": {"running": {}}}
            for c in pod["spec"]["containers"]
        ],
    }


def exec_names(role: Obj | None) -> set[str]:
    for rule in (role or {}).get("rules", []):
        if "pods/exec" in rule["resources"]:
            return set(rule.get("resourceNames", []))
    return set()


def discovered(config_map: Obj | None) -> list[str]:
    text = ((config_map or {}).get("data") or {}).get(names.DISCOVER_HOSTS, "")
    return [line.split()[1].split(":")[0] for line in text.splitlines() if line.startswith("echo")]


@dataclass
class Cluster:
    job: Obj
    now: datetime = T0
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    events: list[Emit] = field(default_factory=list)
    # (pod name, exec names of the Role at the moment the pod was created)
    creations: list[tuple[str, set[str]]] = field(default_factory=list)
    # (pod name, when it was deleted, its phase then); when each host last left discovery
    deletions: list[tuple[str, datetime, str]] = field(default_factory=list)
    left_discovery: dict[str, datetime] = field(default_factory=dict)
    _uids: itertools.count[int] = field(default_factory=itertools.count)

    def get(self, kind: str, name: str) -> Obj | None:
        return self.objects.get((kind, name))

    @property
    def pods(self) -> list[Obj]:
        return [o for (k, _), o in self.objects.items() if k == "Pod"]

    def observed(self) -> Observed:
        job = self.job["metadata"]["name"]
        return Observed(
            job=copy.deepcopy(self.job),
            pods=copy.deepcopy(self.pods),
            config_map=self.get("ConfigMap", names.config_map_name(job)),
            service_account=self.get("ServiceAccount", names.launcher_name(job)),
            role=self.get("Role", names.launcher_name(job)),
            role_binding=self.get("RoleBinding", names.launcher_name(job)),
            deleting=frozenset(self.deleting),
        )

    def plan(self, settings: Settings = SETTINGS) -> Plan:
        return plan(self.observed(), settings, self.now)

    def apply(self, p: Plan) -> None:
        before = set(discovered(self.get("ConfigMap", names.config_map_name(self.name))))
        for action in p.actions:
            self._apply(action)
        after = set(discovered(self.get("ConfigMap", names.config_map_name(self.name))))
        for host in before - after:
            self.left_discovery[host] = self.now

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    def _apply(self, action: Any) -> None:
        if isinstance(action, Create):
            obj = copy.deepcopy(action.obj)
            key = (obj["kind"], obj["metadata"]["name"])
            assert key not in self.objects, f"create of existing {key}"
            obj["metadata"]["uid"] = f"uid-{next(self._uids)}"
            if obj["kind"] == "Pod":
                obj["status"] = {"phase": "Pending"}
                role = self.get("Role", names.launcher_name(self.name))
                self.creations.append((obj["metadata"]["name"], exec_names(role)))
            self.objects[key] = obj
        elif isinstance(action, Replace):
            key = (action.obj["kind"], action.obj["metadata"]["name"])
            assert key in self.objects, f"replace of missing {key}"
            self.objects[key] = copy.deepcopy(action.obj)
        elif isinstance(action, AnnotatePod):
            pod = self.objects[("Pod", action.name)]
            ann = pod["metadata"].setdefault("annotations", {})
            for k, v in action.annotations.items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v
        elif isinstance(action, DeletePod):
            victim = self.objects.get(("Pod", action.name))
            assert victim is not None, f"delete of missing {action.name}"
            assert victim["metadata"]["uid"] == action.uid, "stale delete"
            assert action.uid not in self.deleting, f"second delete of {action.name}"
            self.deleting.add(action.uid)
            self.deletions.append((action.name, self.now, victim["status"]["phase"]))
            # KWOK, like a kubelet with grace, sets deletionTimestamp before removal.
            victim["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        elif isinstance(action, WriteStatus):
            self.job["status"] = copy.deepcopy(action.status)
        elif isinstance(action, Emit):
            self.events.append(action)

    # -- the world moving ----------------------------------------------------------------

    def set_replicas(self, n: int) -> None:
        self.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = n

    def run_pods(self) -> None:
        for pod in self.pods:
            if pod["status"]["phase"] == "Pending" and not pod["metadata"].get("deletionTimestamp"):
                pod["status"] = running_status(pod)

    def finalize_deletions(self) -> None:
        for key, pod in list(self.objects.items()):
            if pod["metadata"].get("deletionTimestamp"):
                del self.objects[key]
                self.deleting.discard(pod["metadata"]["uid"])

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def converge(self, rounds: int = 20) -> None:
        """Let pods start, deletions finish and time pass until the plan is empty."""
        for _ in range(rounds):
            self.run_pods()
            self.finalize_deletions()
            p = self.plan()
            if not p.actions and p.requeue_after is None:
                return
            self.apply(p)
            self.tick(p.requeue_after if p.requeue_after else 1)
        raise AssertionError(f"did not converge: {self.plan()}")
