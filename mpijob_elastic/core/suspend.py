"""Below the minimum for too long: suspend the job, and resume it when capacity returns.

Horovod's elastic driver trains only while at least ``--min-np`` slots are there; below
that it waits ``--elastic-timeout`` (600 s by default) and then fails the whole run. A
spot job that lost its nodes would end ``Failed`` although capacity may come back minutes
later. With ``mpijob-elastic.io/below-min-timeout-seconds`` set, a running elastic job
that has had fewer than ``min-replicas`` workers listed for that long is suspended
instead: its launcher and workers are deleted, the job, its ConfigMap, Role and
ServiceAccount are kept, and the job says ``Suspended`` (reason ``WaitingForCapacity``).

The probe for capacity is the workers themselves: the suspended job creates its workers at
once (Pending pods are what a cluster autoscaler or Karpenter provisions nodes for), and
starts a new launcher, resuming from the user's last checkpoint, as soon as
``min-replicas`` of them run. If the scale-out timeout passes first, every worker of the
attempt is deleted (the ones that do run would otherwise hold GPUs for nothing), and the
next attempt waits out the scale-out backoff (the timeout, doubling, at most an hour). A
user who changes the job (its spec, or ``min-replicas``) gets a new attempt at once.

The state lives in annotations of the job's ConfigMap, so a restart keeps the clock and the
suspension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mpijob_elastic.core.spec import JobSpec
from mpijob_elastic.core.times import format_time, parse_time


@dataclass(frozen=True)
class Suspension:
    since: datetime
    # What the user had set when the job was suspended or last retried (``intent``): a
    # change is the user asking for a new attempt now.
    intent: str

    def format(self) -> str:
        return f"{format_time(self.since)} {self.intent}"


def parse_suspension(value: object) -> Suspension | None:
    """The annotation's value, or None if unset or unreadable (then: not suspended)."""
    if not isinstance(value, str):
        return None
    since, _, intent = value.partition(" ")
    at = parse_time(since)
    return Suspension(at, intent) if at is not None else None


def intent(job: Mapping[str, Any], spec: JobSpec) -> str:
    """What the user controls that may let the job run: its spec (the generation counts
    every edit of it) and its bounds, which live in annotations."""
    generation = (job.get("metadata") or {}).get("generation")
    return f"{generation}/{spec.bounds.min}/{spec.bounds.max}"
