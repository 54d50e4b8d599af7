"""The MPIJob's status: conditions that change only when what a reader sees changes.

A condition whose status, reason and message are unchanged is never rewritten: a status
write is a watch event for every client of the job, and a controller that rewrites an
unchanged condition on every retry hammers the API server (one job wrote its status 13
times a second that way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.times import format_time
from mpijob_elastic.core.workers import Worker

Obj = dict[str, Any]

# Condition types: the v1 ones, plus Scaling, InvalidSpec, Unsupported, SpecWarnings,
# WriteRefused and TurnFailed. The True ones
# are kept in this order after the False ones (StatusBuilder.build), so that the last
# condition, which `kubectl get mpijob` shows as the job's state, is the latest stage of
# its lifecycle that holds: a jsonPath cannot filter on status and then take the last.
CREATED = "Created"
INVALID = "InvalidSpec"
REFUSED = "WriteRefused"
SCALING = "Scaling"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
RESTARTING = "Restarting"
UNSUPPORTED = "Unsupported"
SPEC_WARNINGS = "SpecWarnings"
POD_REJECTED = "PodTemplateRejected"
# Where a job labelled for a Kueue queue stands there (kueue.py).
QUEUE_ADMITTED = "QueueAdmitted"
# The job's last turn raised before its writes (planning/fallback.py).
TURN_FAILED = "TurnFailed"
CONDITION_ORDER = (
    CREATED,
    QUEUE_ADMITTED,
    INVALID,
    UNSUPPORTED,
    SPEC_WARNINGS,
    REFUSED,
    TURN_FAILED,
    SCALING,
    RUNNING,
    RESTARTING,
    SUCCEEDED,
    FAILED,
)


def replica_counts(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """A replica type's active, succeeded and failed pods, as status.replicaStatuses counts."""
    phases = [
        ((p.get("status") or {}).get("phase"), p["metadata"].get("deletionTimestamp")) for p in pods
    ]
    return {
        "active": sum(1 for phase, deleting in phases if phase == "Running" and not deleting),
        "succeeded": sum(1 for phase, _ in phases if phase == "Succeeded"),
        "failed": sum(1 for phase, _ in phases if phase == "Failed"),
    }


def replica_statuses(
    job_name: str, workers: Sequence[Worker], launcher: Mapping[str, Any] | None
) -> Obj:
    return {
        "Launcher": replica_counts([launcher] if launcher else []),
        "Worker": {
            **replica_counts([w.pod for w in workers]),
            "selector": names.selector(job_name, names.ROLE_WORKER),
        },
    }


class StatusBuilder:
    """Builds the next status from the observed one, touching timestamps only on change."""

    def __init__(self, job: Mapping[str, Any], now: datetime) -> None:
        self.observed: Obj = dict(job.get("status") or {})
        self.now = format_time(now)
        self.conditions: dict[str, Obj] = {
            c["type"]: dict(c)
            for c in self.observed.get("conditions") or []
            if isinstance(c, Mapping) and "type" in c
        }
        self.fields: Obj = {}
        # The spec this status was decided from: a client that changed the spec knows the
        # controller has seen the change once this reaches its metadata.generation.
        generation = (job.get("metadata") or {}).get("generation")
        if isinstance(generation, int):
            self.fields["observedGeneration"] = generation

    def get(self, type_: str) -> Obj | None:
        return self.conditions.get(type_)

    def is_true(self, type_: str) -> bool:
        c = self.conditions.get(type_)
        return c is not None and c.get("status") == "True"

    def set(self, type_: str, status: bool, reason: str, message: str) -> bool:
        """Set a condition; return whether anything a reader sees changed."""
        value = "True" if status else "False"
        old = self.conditions.get(type_)
        if old and (old.get("status"), old.get("reason"), old.get("message")) == (
            value,
            reason,
            message,
        ):
            return False
        transition = (
            self.now
            if not old or old.get("status") != value
            else old.get("lastTransitionTime", self.now)
        )
        self.conditions[type_] = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastUpdateTime": self.now,
            "lastTransitionTime": transition,
        }
        return True

    def clear(self, type_: str, reason: str, message: str) -> bool:
        """Turn a problem condition False, if it was ever set; never add it just to say no."""
        return self.is_true(type_) and self.set(type_, False, reason, message)

    def build(self) -> Obj:
        status = {**self.observed, **self.fields}
        order = {t: i for i, t in enumerate(CONDITION_ORDER)}

        def position(c: Obj) -> tuple[bool, float]:
            # False ones first: a condition turned False (Restarting once the launcher
            # runs again, Running once the job finished) must not be shown as the state.
            holds = c.get("status") == "True"
            if c["type"] == SUSPENDED:
                # Last while it holds, so `kubectl get mpijob` shows it as the state; a job
                # that resumed shows Running again.
                return holds, len(order) if holds else order[SCALING] + 0.5
            return holds, order.get(c["type"], len(order))

        status["conditions"] = sorted(self.conditions.values(), key=position)
        return status


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: a key ``new`` no
    longer has is sent as null, at every level. A status is written as a merge patch, which
    keeps whatever the patch leaves out: sent whole, a key the turn dropped (a count back
    to none, a time cleared) would stay on the server, and the status would differ from
    the turn's again at every turn."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return new
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch
