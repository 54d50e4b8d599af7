"""What the writer remembers of one job between its turns, and how it names a write.

The caches cannot show everything a turn learned: a delete the server accepted before the
pod shows it, a name someone else's object holds (that object carries none of our labels,
so no cache holds it), the last write the server refused. The core gets them as inputs
(``core/inputs/observe.py``'s ``Memory``); the writer (``writer.py``) fills them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import (
    DELETE_MEMORY_SECONDS,
    Action,
    AnnotatePod,
    Claim,
    Create,
    DeleteObject,
    DeletePod,
    PatchStatus,
    Refusal,
    Replace,
)
from mpijob_elastic.machinery.kube import ApiError

# While a name is held by someone else's object, how often its job looks again whether it
# still is: the caches hold only objects with our labels, so the holder's delete may reach
# no cache, and the job's report of the conflict must end when the conflict does. Only
# jobs with a conflict are looked at again; no other job has a timer.
CONFLICT_RECHECK_SECONDS = 30.0
# How long a ServiceAccount someone else made is taken as still there. Its create is tried
# again after that (one 409 per job every ten minutes in a steady state), so one removed
# meanwhile is made anew before a launcher restart needs it.
IN_USE_RECHECK_SECONDS = 600.0


def describe(action: Action) -> tuple[str, str, str]:
    """(verb, kind, name) of a child write, for messages."""
    if isinstance(action, Create | Replace):
        verb = "create" if isinstance(action, Create) else "update"
        return verb, action.obj["kind"], action.obj["metadata"]["name"]
    if isinstance(action, AnnotatePod):
        return "annotate", "Pod", action.name
    if isinstance(action, DeletePod):
        return "delete", "Pod", action.name
    if isinstance(action, DeleteObject):
        return "delete", action.kind, action.name
    if isinstance(action, PatchStatus):
        return "update the status of", action.obj["kind"], action.obj["metadata"]["name"]
    if isinstance(action, Claim):
        return "label", action.kind, action.name
    return "write", names.KIND, "status"


def refusal(err: BaseException) -> ApiError | None:
    """The server's refusal that needs the user, or None for a failure worth retrying."""
    if not isinstance(err, ApiError):
        return None
    if err.status in (409, 429) and err.reason != "AlreadyExists":
        return None  # a stale view or throttling: routine
    return err if 400 <= err.status < 500 else None


def owner_description(obj: Mapping[str, Any]) -> str:
    """Who controls an object, for the user: ``owner ReplicaSet/web``, or ``no owner``."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return f"owner {ref.get('kind')}/{ref.get('name')}"
    return "no owner"


@dataclass
class JobMemory:
    """What one job's earlier turns learned that the caches cannot show yet."""

    # UID -> when the server accepted its delete (monotonic seconds).
    deletes: dict[str, float] = field(default_factory=dict)
    # (kind, name) -> who holds the name (its owner), for as long as a read finds it held.
    conflicts: dict[tuple[str, str], str] = field(default_factory=dict)
    # (kind, name) of objects used as someone else made them -> when to look again.
    in_use: dict[tuple[str, str], float] = field(default_factory=dict)
    # The last write the server refused, until a turn's writes all go through.
    refused: Refusal | None = None
    # A turn put the refusal behind it: the next turn, at once, reports it gone.
    look_again: bool = False

    def deleting(self, pods: Sequence[Mapping[str, Any]], now: float) -> frozenset[str]:
        """Accepted deletes whose pods the cache still shows alive."""
        alive = {
            p["metadata"].get("uid") for p in pods if not p["metadata"].get("deletionTimestamp")
        }
        for uid, at in list(self.deletes.items()):
            if uid not in alive or at < now - DELETE_MEMORY_SECONDS:
                del self.deletes[uid]
        return frozenset(self.deletes)

    def taken(self) -> dict[tuple[str, str], str]:
        return dict(self.conflicts)

    def used(self, now: float) -> frozenset[tuple[str, str]]:
        for key, until in list(self.in_use.items()):
            if until <= now:
                del self.in_use[key]
        return frozenset(self.in_use)

    def next_retry(self) -> float | None:
        """Seconds until the job looks again: at once after a turn put a refusal behind it,
        or in a while whether its names are still held. Read once per turn."""
        if self.look_again:
            self.look_again = False
            return 0.0
        return CONFLICT_RECHECK_SECONDS if self.conflicts else None
