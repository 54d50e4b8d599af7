"""What the job says about itself: conditions and Events that no other decision owns.

Unsupported fields, warnings about the spec (``SpecWarnings``), membership changes
(scaled up, replaced, retired), names held by someone else's objects, the ``Scaling``
condition (``WaitingForRanks`` while the host-list rules hold a change back), and every
write the API server refused: the writer only remembers the server's refusal
(``Observed.refused``), the job's condition and Event are decided here, as for every
other condition. Each condition is set only when what a reader sees changes, and its
Event goes with that change, so a refusal repeated every turn is reported once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Emit, Failure, Refusal
from mpijob_elastic.core.hosts.drain import Victim
from mpijob_elastic.core.hosts.membership import Membership
from mpijob_elastic.core.objects import podgroups
from mpijob_elastic.core.outputs.status import (
    INVALID,
    POD_REJECTED,
    REFUSED,
    SCALING,
    SPEC_WARNINGS,
    TURN_FAILED,
    UNSUPPORTED,
    StatusBuilder,
)
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.shapes import FieldError
from mpijob_elastic.core.sizing.capacity import Backoff
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_time
from mpijob_elastic.core.workers import hostfile_workers, split_pods, worker_index

# The reasons of the Events that report a refused write: sent even when the turn stops at
# a write refused again (``Writes.on_refusal``), so the report is not held up by it.
REFUSAL_EVENTS = frozenset({REFUSED, POD_REJECTED})


def unsupported(turn: Turn, spec: JobSpec) -> None:
    s = turn.status
    # With a gang scheduler the policy goes to the job's PodGroup (podgroups.py).
    if spec.scheduling_policy and podgroups.gang(turn.settings) is None:
        message = (
            "spec.runPolicy.schedulingPolicy is ignored: the controller runs without a gang "
            "scheduler (--gang-scheduler-name), so no PodGroup is made and the pods are "
            "scheduled one by one (an elastic job starts with what it gets); remove the "
            "field to clear this"
        )
        if s.set(UNSUPPORTED, True, "SchedulingPolicyIgnored", message):
            turn.event("Warning", "SchedulingPolicyIgnored", message)
    else:
        s.clear(UNSUPPORTED, "Supported", "every field in use is supported")


def spec_warnings(turn: Turn, found: Sequence[FieldError]) -> None:
    """``SpecWarnings`` True with every warning (spec_warnings.py) while there are any,
    with a Warning Event when they change; False once there are none."""
    s = turn.status
    if found:
        message = "; ".join(str(w) for w in found)
        if s.set(SPEC_WARNINGS, True, SPEC_WARNINGS, message):
            turn.event("Warning", SPEC_WARNINGS, message)
    else:
        s.clear(SPEC_WARNINGS, "NoWarnings", NO_WARNINGS)


NO_WARNINGS = "no unknown field or annotation, and the launcher's command agrees with the bounds"


def membership(
    turn: Turn, spec: JobSpec, m: Membership, create_now: Sequence[int], target: int
) -> None:
    if m.newly_retired:
        _retired(turn, spec, m)
    old_data = (turn.observed.config_map or {}).get("data")
    # A member whose name someone else's pod turned out to hold never was one: the worker
    # made instead of it is growth, not a replacement.
    taken = {name for kind, name in turn.observed.conflicts if kind == "Pod"}
    previous = len(hostfile_workers(spec.name, old_data) - taken)
    growth = max(target - previous, 0)
    new = [names.worker_name(spec.name, i) for i in create_now]
    if new[:growth]:
        turn.event(
            "Normal",
            "ScaledUp",
            f"created worker pods {', '.join(new[:growth])}: scaling to {target} workers",
        )
    if new[growth:]:
        turn.event(
            "Normal",
            "WorkerReplaced",
            f"created worker pods {', '.join(new[growth:])} "
            "in place of workers that failed or left",
            (("replaced", len(new[growth:])),),
        )


def _retired(turn: Turn, spec: JobSpec, m: Membership) -> None:
    """A terminating worker may still leave gracefully (its ranks go at their next
    commit): it is retired in case they do not, not said to have lost them."""
    observed = turn.observed
    leaving = {w.index for w in split_pods(spec.name, observed.pods)[0] if w.terminating}
    lost = observed.ranks.lost if observed.ranks else frozenset()
    going = sorted(
        i for i in m.newly_retired if i in leaving and names.worker_name(spec.name, i) not in lost
    )
    dead = sorted(set(m.newly_retired) - set(going))
    tail = "Horovod blacklists such names, so their replacements get names never used in this job"
    if dead:
        turn.event(
            "Warning",
            "WorkerRetired",
            f"worker pods {', '.join(names.worker_name(spec.name, i) for i in dead)} lost "
            f"their ranks while listed in discover_hosts.sh; {tail}",
            (("retired", len(dead)),),
        )
    if going:
        turn.event(
            "Normal",
            "WorkerRetired",
            f"worker pods {', '.join(names.worker_name(spec.name, i) for i in going)} are "
            "being deleted while listed in discover_hosts.sh (evicted, preempted or "
            "deleted): their ranks may still leave gracefully, but if the grace period "
            f"ends first, {tail}",
            (("retired", len(going)),),
        )


def conflicts(turn: Turn, spec: JobSpec) -> None:
    """Names held by objects the job does not control (a create answered 409), for as
    long as the writer's reads find them held: ``WriteRefused`` stays True, and its Warning
    Event names each holder and its owner. A worker name is skipped (the job runs under the
    next free names); any other name the job waits for. Cleared by ``diff`` once no name is
    held and every write goes through."""
    taken = turn.observed.conflicts
    if not taken:
        return
    message = "; ".join(
        f"{kind} {name} already exists and is not this job's ({owner}): "
        + _consequence(spec, kind, name)
        for (kind, name), owner in sorted(taken.items())
    )
    if turn.status.set(REFUSED, True, "AlreadyExists", message):
        turn.event("Warning", REFUSED, message)


# How ``conflicts`` names a held name in the condition's message, read back by
# ``held_names``.
_HELD = re.compile(r"(?:^|; )(\w+) (\S+) already exists and is not this job's \(")


def held_names(job: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of the names the job's ``WriteRefused`` condition says someone else's
    objects hold. A restarted controller remembers none, and nothing would try a skipped
    worker name again to learn it anew: it reads these names again before its first turn
    of the job, so the report lasts as long as the conflict, whoever reconciles."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        held = (cond.get("type"), cond.get("status"), cond.get("reason"))
        if held == (REFUSED, "True", "AlreadyExists"):
            return {(m[0], m[1]) for m in _HELD.findall(str(cond.get("message", "")))}
    return set()


def _consequence(spec: JobSpec, kind: str, name: str) -> str:
    if kind == "Pod" and worker_index(spec.name, name) is not None:
        return (
            "worker name skipped, the job's workers take other names; that pod is never "
            "granted exec, listed or touched"
        )
    if kind == podgroups.KIND:
        return (
            "the job waits: no pod is made until it is renamed or removed (pods join a "
            "gang by its name: they would be that object's members)"
        )
    return "the job waits: no launcher starts until it is renamed or removed"


def refused(status: StatusBuilder, refusal: Refusal | None) -> Emit | None:
    """The last write the server refused, on the job: ``WriteRefused`` quoting the server,
    or ``InvalidSpec`` for a pod template it rejects (its message names the field to fix).
    The Event that goes with a change of the condition, returned."""
    if refusal is None:
        return None
    if refusal.pod_template:
        type_, reason, message, event = INVALID, POD_REJECTED, refusal.message, POD_REJECTED
    else:
        type_, reason, event = REFUSED, refusal.reason, REFUSED
        message = f"{refusal.write}: {refusal.message}"
        if refusal.write.startswith("create PodGroup") and refusal.reason == "NotFound":
            message += (
                " (the gang scheduler's PodGroup CRD is not installed: install it and restart "
                "the controller; no pod is made until then, docs/scheduling.md)"
            )
    if status.set(type_, True, reason, message):
        return Emit("Warning", event, message)
    return None


# An exception's text may quote a whole input (a repr of the job, of a template): the
# condition and its Event keep enough of it to find the input, and stay readable.
FAILURE_TEXT_LIMIT = 400


def turn_failed(status: StatusBuilder, failure: Failure) -> Emit | None:
    """``TurnFailed`` True naming the exception; the Event that goes with a change of the
    condition, returned: a turn that fails the same way on every retry is reported once."""
    text = failure.message
    if len(text) > FAILURE_TEXT_LIMIT:
        text = text[:FAILURE_TEXT_LIMIT] + f"... ({len(failure.message)} characters)"
    message = (
        f"the controller's turn of this job raised {failure.kind}: {text or '(no message)'}; "
        "until a turn completes only a stop is carried out (runPolicy.suspend, "
        "activeDeadlineSeconds, Kueue's eviction), the controller's log has the traceback"
    )
    if status.set(TURN_FAILED, True, failure.kind, message):
        return Emit("Warning", TURN_FAILED, message)
    return None


def turn_completed(status: StatusBuilder) -> None:
    """``TurnFailed`` False once a turn got through its planning."""
    status.clear(TURN_FAILED, "TurnCompleted", "the controller's last turn of this job completed")


def spec_valid(turn: Turn, spec: JobSpec, creating: bool) -> None:
    """Clear ``InvalidSpec`` once the spec is valid. A pod template the API server refused
    stays reported until a pod create goes through, which a turn without pod creates
    implies."""
    s = turn.status
    invalid = s.get(INVALID)
    if (
        spec.bounds.contains(spec.worker.replicas)
        and invalid is not None
        and not (invalid.get("reason") == POD_REJECTED and creating)
    ):
        s.clear(INVALID, "SpecValid", "The spec is valid.")


def scaling(
    turn: Turn,
    spec: JobSpec,
    target: int,
    hosts: Sequence[str],
    victims: Sequence[Victim],
    backoff: Backoff | None,
    moving: Mapping[str, str],
) -> None:
    """The ``Scaling`` condition: why the job is not at ``target`` listed workers yet."""
    s = turn.status
    if moving:
        s.set(SCALING, True, "Relocating", _relocating(moving, len(hosts), target))
    elif backoff is not None and turn.now < backoff.retry_at:
        s.set(
            SCALING,
            True,
            "ScaleOutBackoff",
            f"running {len(hosts)} of {target} workers: new workers were not running "
            f"within {spec.scale_out_timeout:g}s ({backoff.reason}); trying again at "
            f"{format_time(backoff.retry_at)} (attempt {backoff.attempts + 1})",
        )
    elif len(hosts) < target or victims:
        removing = _removing(turn.now, spec, victims)
        if len(hosts) < target:
            starting = f"{target - len(hosts)} not running yet"
            message = f"scaling workers from {len(hosts)} to {target}: " + "; ".join(
                p for p in (starting, removing) if p
            )
            s.set(SCALING, True, "ScalingUp", message)
        else:
            s.set(
                SCALING,
                True,
                "ScalingDown",
                f"scaling workers from {len(hosts) + len(victims)} to {target}: {removing}",
            )
    elif s.get(SCALING) is not None:
        s.set(SCALING, False, "ScalingComplete", f"{target} workers ready")


def waiting_for_ranks(turn: Turn, why: str, moving: Mapping[str, str]) -> None:
    """``Scaling`` while the host-list rules (host_rules.py) hold a change back, unless a
    relocation already says so."""
    if why and not moving:
        message = f"{why}: Horovod would lose or refuse a host-list change now"
        turn.status.set(SCALING, True, "WaitingForRanks", message)


def _relocating(moving: Mapping[str, str], listed: int, target: int) -> str:
    workers = ", ".join(f"{name} ({why})" for name, why in sorted(moving.items()))
    return (
        f"moving workers {workers} to other nodes: they stay until their replacements "
        f"take ranks ({listed} of {target} workers listed)"
    )


def _removing(now: datetime, spec: JobSpec, victims: Sequence[Victim]) -> str:
    parts = []
    for v in victims:
        deadline = v.deadline
        if v.action == "mark":
            deadline = now + timedelta(seconds=spec.drain_seconds)
        until = f", until {format_time(deadline)} at the latest" if deadline else ""
        parts.append(f"{v.worker.name} ({v.why}{until})")
    return f"removing {', '.join(parts)}" if parts else ""
