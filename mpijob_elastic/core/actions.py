"""The vocabulary between the pure core and the shell: what to write (what is observed:
observe.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    # Labels merged the same way (the rank-holder label).
    labels: Mapping[str, str | None] = field(default_factory=dict)
    # An annotation the Writer sets to the moment it sends the patch (the drain mark):
    # after every write of the phases above, which the plan's own time predates by as
    # long as they took.
    stamp: str | None = None


@dataclass(frozen=True)
class DeletePod:
    """Delete with a UID precondition, so a same-named successor is never hit."""

    name: str
    uid: str
    # None: the pod's own grace period.
    grace_seconds: int | None = None
    # Set: only this version of the pod, for a delete decided on its state (no rank can run
    # there). A probe the scheduler bound after our view saw it unschedulable is kept; the
    # refused delete (409) ends the turn, planned again on the new version.
    resource_version: str | None = None


@dataclass(frozen=True)
class DeleteObject:
    """Delete a child that is not a pod and is no longer wanted, with a UID precondition."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class PatchStatus:
    """Merge-patch a child's status subresource (a Workload's conditions and admission),
    carrying the observed resourceVersion in ``obj``'s metadata: a patch planned from a
    stale view is refused with 409 and planned again."""

    obj: Obj


@dataclass(frozen=True)
class Claim:
    """Merge our labels into a child the job controls. A merge patch carrying the observed
    UID and resourceVersion: a change made since or a same-named successor makes it fail
    instead of being overwritten."""

    kind: str
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Emit:
    type: str
    reason: str
    message: str
    # The workers the Event reports, by change ("replaced", "retired", ...), for the
    # metrics (machinery/metrics.py counts them as the Event is sent).
    counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class WriteStatus:
    status: Obj
    resource_version: str


Action = (
    Create
    | Replace
    | AnnotatePod
    | DeletePod
    | DeleteObject
    | PatchStatus
    | Claim
    | Emit
    | WriteStatus
)


@dataclass(frozen=True)
class Refusal:
    """The last write of the job the API server refused and only the user can fix (a 4xx
    other than a stale view, throttling or a name held by someone else), as the writer
    remembers it until a turn's writes all go through. The core reports it on the job."""

    # What was written, e.g. "create Pod job-worker-0".
    write: str
    # The server's reason (Forbidden, Invalid, ...), or its status code.
    reason: str
    # The server's message, quoted to the user.
    message: str
    # A pod create rejected as invalid: the user's pod template needs fixing.
    pod_template: bool = False
    # The kind of the object written (a refused Workload write is also the job's standing
    # in its queue, kueue.py).
    kind: str = ""


@dataclass(frozen=True)
class Failure:
    """An exception a turn raised before its writes, as the shell caught it: a bug or an
    input the core cannot read. The core reports it on the job (planning/fallback.py)."""

    # The exception's class, e.g. "KeyError".
    kind: str
    # Its text, as str() gave it.
    message: str


@dataclass(frozen=True)
class Probe:
    """Read the launcher's remote shells (ranks.py): victims wait on the answer."""

    pod: str
    container: str | None


@dataclass(frozen=True)
class Phase:
    """Writes that may go out together: none relies on another of the same phase. The
    next phase starts only once the server accepted every write of this one."""

    # Which step of the write order (write_order.STEPS) these writes make.
    step: str
    writes: tuple[Action, ...]


@dataclass(frozen=True)
class Writes:
    """One turn's writes in phases, the order they are made in, and what comes after."""

    # The turn's writes in the order the shell must make them (write_order.py).
    phases: tuple[Phase, ...]
    # Reconcile again after this many seconds even if nothing changes (a drain deadline).
    requeue_after: float | None = None
    probe: Probe | None = None
    # What the writer sends when a write of this turn is refused, before the turn ends: the
    # status and the Events that report refusals, so that a write refused on every turn
    # never keeps its report from the job.
    on_refusal: tuple[WriteStatus | Emit, ...] = ()

    @property
    def actions(self) -> tuple[Action, ...]:
        """Every write of the plan, in its order."""
        return tuple(a for phase in self.phases for a in phase.writes)

    def of_type(self, kind: type[Any]) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]
