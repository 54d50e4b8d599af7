"""The vocabulary between the pure core and the shell: what is observed, what to write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob_elastic.core.ranks import RankSnapshot

Obj = dict[str, Any]

# How long an accepted delete is taken for done while the cache still shows its pod alive.
# Then the pod is planned again: a delete the server accepted but whose pod never went is
# not left to chance.
DELETE_MEMORY_SECONDS = 60.0


@dataclass(frozen=True)
class Create:
    obj: Obj


@dataclass(frozen=True)
class Replace:
    """A full update of an object we own, made conditional on the observed resourceVersion."""

    obj: Obj


@dataclass(frozen=True)
class AnnotatePod:
    """Merge-patch pod annotations; a value of None removes the annotation. The patch
    carries the observed resourceVersion: one planned from a stale view (a former leader's,
    or a cache behind) is refused with 409 and planned again, never lands over a newer
    state."""

    name: str
    annotations: Mapping[str, str | None]
    resource_version: str


@dataclass(frozen=True)
class DeletePod:
    """Delete with a UID precondition, so a same-named successor is never hit."""

    name: str
    uid: str
    # None: the pod's own grace period.
    grace_seconds: int | None = None


@dataclass(frozen=True)
class DeleteObject:
    """Delete a child that is not a pod and is no longer wanted, with a UID precondition."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Claim:
    """Merge our labels into a child and, to adopt it, write its ownerReferences with ours
    as controller. A merge patch carrying the observed UID and resourceVersion: a change
    made since (another controller adopting it first) or a same-named successor makes it
    fail instead of being overwritten."""

    kind: str
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    # The child's ownerReferences with ours added; None: a child we control already.
    owner_references: Sequence[Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Emit:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class WriteStatus:
    status: Obj
    resource_version: str


Action = Create | Replace | AnnotatePod | DeletePod | DeleteObject | Claim | Emit | WriteStatus


def is_child_write(action: Action) -> bool:
    return not isinstance(action, Emit | WriteStatus)


@dataclass(frozen=True)
class Observed:
    """What the caches hold for one job: only children it controls, in its namespace."""

    job: Mapping[str, Any]
    pods: Sequence[Mapping[str, Any]] = ()
    config_map: Mapping[str, Any] | None = None
    service_account: Mapping[str, Any] | None = None
    role: Mapping[str, Any] | None = None
    role_binding: Mapping[str, Any] | None = None
    disruption_budget: Mapping[str, Any] | None = None
    # UIDs of pods whose delete the server accepted while the cache still shows them
    # without a deletionTimestamp (a pod removed at once answers with a Status, not the
    # pod), for at most DELETE_MEMORY_SECONDS.
    deleting: frozenset[str] = frozenset()
    # (kind, name) of children whose name an object this job does not control already
    # holds, with a description of that object for the user.
    conflicts: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # (kind, name) of objects the job uses without controlling them: a ServiceAccount of
    # the launcher's name that someone else made (the user's own, named in the template).
    in_use: frozenset[tuple[str, str]] = frozenset()
    # Which workers the launcher's remote shells reach, from its reports (ranks.py); None
    # while no launcher runs.
    ranks: RankSnapshot | None = None
    # The job's ranks ConfigMap, if it exists as the job's; and the last exec read of the
    # launcher, asked for only where the reports say nothing (ranks.py).
    ranks_report: Mapping[str, Any] | None = None
    ranks_read: RankSnapshot | None = None
    # Nodes that are going away (nodes.py), with why.
    leaving_nodes: Mapping[str, str] = field(default_factory=dict)
    # Candidates for a hand-over (handover.py), not among the children above: objects
    # this job controls that carry only another controller's labels, and objects in its
    # namespace that no controller owns.
    strays: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Probe:
    """Read the launcher's remote shells (ranks.py): victims wait on the answer."""

    pod: str
    container: str | None


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    # Reconcile again after this many seconds even if nothing changes (a drain deadline).
    requeue_after: float | None = None
    probe: Probe | None = None

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]
