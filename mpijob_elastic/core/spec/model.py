"""The typed spec the planner works from: what ``parse`` (parse.py) makes of an MPIJob.

Frozen values only; reading and checking the MPIJob's fields is ``fields.py``'s, and
putting them together into a ``JobSpec`` (or an ``InvalidSpec``) is ``parse.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.scheduling_policy import SchedulingPolicy

# mpijob-elastic.io/checkpoint-seconds unset: a minute to save a checkpoint, enough to
# write a model's weights to a volume; a suspension below the minimum waits that long.
DEFAULT_CHECKPOINT_SECONDS = 60.0
# Horovod's Gloo timeout: how long the ranks of a reset wait for every newly started rank
# before they all abort (reference 4a); Horovod's default where the launcher sets none.
DEFAULT_GLOO_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class ReplicaSpec:
    replicas: int
    restart_policy: str
    template: Mapping[str, Any]

    @property
    def containers(self) -> list[Mapping[str, Any]]:
        spec = self.template.get("spec") or {}
        return list(spec.get("containers") or [])


@dataclass(frozen=True)
class Bounds:
    """Per-job worker bounds; ``None`` means unbounded on that side."""

    min: int | None
    max: int | None

    def contains(self, replicas: int) -> bool:
        if replicas < 0:
            return False
        if self.min is not None and replicas < self.min:
            return False
        return self.max is None or replicas <= self.max

    def clamp(self, replicas: int) -> int:
        low = self.min if self.min is not None else 0
        value = max(replicas, low)
        return value if self.max is None else min(value, self.max)

    def describe(self) -> str:
        low = self.min if self.min is not None else 0
        high = "unbounded" if self.max is None else str(self.max)
        return f"[{low}, {high}]"


@dataclass(frozen=True)
class JobSpec:
    namespace: str
    name: str
    uid: str
    slots_per_worker: int
    main_container: str | None
    clean_pod_policy: str
    launcher: ReplicaSpec
    worker: ReplicaSpec
    bounds: Bounds
    drain_seconds: float
    # 0: wait forever for new workers to run.
    scale_out_timeout: float = Settings.default_scale_out_timeout_seconds
    # Worker pod names the user asked to remove (mpijob-elastic.io/remove-workers).
    remove: frozenset[str] = frozenset()
    # 0: never suspended for lack of capacity (run_policy.py).
    below_min_timeout: float = 0.0
    # How long a stop the controller decides waits after its notice (notices.py).
    checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS
    # Grows into idle capacity (opportunistic.py); its workers' PriorityClass if named.
    opportunistic: bool = False
    opportunistic_priority_class: str | None = None
    # runPolicy.suspend: the user suspended the job.
    suspend: bool = False
    # runPolicy: None where unset (no deadline, no TTL, no limit on launcher restarts).
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    backoff_limit: int | None = None
    # runPolicy.schedulingPolicy: what a gang scheduler's PodGroup takes from the job
    # (podgroups.py); None when unset.
    scheduling_policy: SchedulingPolicy | None = None
    # The Launcher template's serviceAccountName; None: unset, so <job>-launcher.
    launcher_service_account: str | None = None
    # Horovod's HOROVOD_GLOO_TIMEOUT_SECONDS in the launcher: the longest a reset may last
    # before its ranks abort (host_rules.py).
    gloo_timeout_seconds: float = DEFAULT_GLOO_TIMEOUT_SECONDS

    @property
    def service_account(self) -> str:
        """The launcher's ServiceAccount, which the launcher Role is bound to."""
        return self.launcher_service_account or names.launcher_name(self.name)
