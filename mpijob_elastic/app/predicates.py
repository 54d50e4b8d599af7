"""Which watch events move a job: what the controller's event handlers decide from a
changed object alone (pure, so tested without informers)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import managed_by
from mpijob_elastic.core.workers import split_pods

Obj = dict[str, Any]


def job_signature(job: Obj) -> tuple[Any, ...]:
    """What of a job can change its plan; its status cannot, it is our own output.

    A status write is a watch event like any other; reconciling on it would make every
    retry of a failing job trigger the next one at once, bypassing the backoff.
    """
    meta = job["metadata"]
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        json.dumps(meta.get("annotations") or {}, sort_keys=True),
        json.dumps(meta.get("labels") or {}, sort_keys=True),
    )


def starts_pods(job: Obj, pods: list[Obj]) -> bool:
    """Whether a job asks for more workers than it has pods (``pods``: its own, from the
    cache): its next turn creates pods, and the cluster bringing them up is the slowest part
    of any change, so that turn goes before the turns that only write (docs/design.md,
    "Which job goes next")."""
    workers, _ = split_pods(str(job["metadata"]["name"]), pods)
    return kueue.replicas(job) > sum(1 for w in workers if not w.terminating)


def may_move_hosts(type_: str, obj: Obj) -> bool:
    """Whether a child's change can add a host to its job's lists or take one off: a pod
    that runs, ended, or is going. Such changes go to the front of the queue; a pod
    created or scheduled only moves its job along."""
    if obj.get("kind") != "Pod":
        return False
    if type_ == "DELETED" or obj["metadata"].get("deletionTimestamp"):
        return True
    return (obj.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")


def manages(job: Mapping[str, Any], settings: Settings) -> bool:
    value = managed_by(job)
    if settings.only_managed_by:
        return value == names.MANAGED_BY
    return value in (None, names.MANAGED_BY, names.TRAINING_OPERATOR)
