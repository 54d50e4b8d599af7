"""Names someone else's object holds: who holds each, learned when a create meets it and
read again before each turn of the job, so that the job reports a conflict for as long
as it lasts (core/reports/conditions.py) and takes a freed name back. The caches cannot
tell: they hold only objects with our labels, so each such name costs one read per turn,
and a job without one costs none.
"""

from __future__ import annotations

from typing import Any

from mpijob_elastic.core.actions import Create
from mpijob_elastic.core.reports import conditions
from mpijob_elastic.machinery.job_memory import JobMemory, owner_description
from mpijob_elastic.machinery.kube import ApiError, Kube

Obj = dict[str, Any]
Key = tuple[str, str]


async def recheck(kube: Kube, memory: dict[Key, JobMemory], key: Key, job: Obj) -> None:
    """Is each name remembered as held by someone else still held? A read that fails keeps
    what was known. The first turn of a job in this process starts from the names its
    status reports held (a restarted controller remembers nothing)."""
    known = memory.get(key)
    if known is None:
        held = conditions.held_names(job)
        if not held:
            return
        known = memory.setdefault(key, JobMemory())
        known.conflicts = dict.fromkeys(held, "owner unknown: not read yet")
    for kind, name in list(known.conflicts):
        try:
            holder = await _holder(kube, kind, name, job)
        except ApiError:
            continue
        if holder is None:
            del known.conflicts[(kind, name)]
        else:
            known.conflicts[(kind, name)] = holder


async def learn(kube: Kube, memory: JobMemory, job: Obj, action: Create) -> None:
    """Learn who holds a name we wanted, unless it is our own object the cache missed."""
    kind, name = action.obj["kind"], action.obj["metadata"]["name"]
    try:
        holder = await _holder(kube, kind, name, job)
    except ApiError as read_err:
        # Refused (a role without list here) or failed: the holder stays unknown, but
        # the name is still taken, and the user must hear of it.
        holder = f"owner unknown: it could not be read ({read_err})"
    if holder is not None:
        memory.conflicts[(kind, name)] = holder


async def _holder(kube: Kube, kind: str, name: str, job: Obj) -> str | None:
    """Who controls the object holding ``name``, for the user; None when nothing holds
    it (gone meanwhile: the next create simply makes it) or the job's own does."""
    try:
        holder = await kube.list(kind, job["metadata"]["namespace"], name)
    except ApiError as read_err:
        if read_err.not_found:
            return None
        raise
    refs = holder["metadata"].get("ownerReferences") or []
    if any(r.get("controller") and r.get("uid") == job["metadata"]["uid"] for r in refs):
        return None
    return owner_description(holder)
