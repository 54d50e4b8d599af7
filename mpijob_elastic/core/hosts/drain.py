"""How workers leave: drained victims, workers moved off going nodes, failed ones replaced.

Victims of a scale-in (chosen in ``membership.py``) leave ``hostfile`` and
``discover_hosts.sh`` first. A drain mark on the pod records when; a mark on a worker that
the observed host list still names is stale (a scale-up took the worker back and a restart
lost the clean-up), so its drain starts again instead of ending at once. A victim is
deleted once the launcher's reports (or, where they name it not, an exec read of the
launcher; where they still show its shell, a read every ``CONFIRM_INTERVAL_SECONDS``, for an
exit report may be lost) show its ranks have left (``ranks.py``), no sooner
than ``DRAIN_FLOOR_SECONDS`` after the mark and no later than ``drain-seconds`` after it;
one that cannot run ranks goes at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Probe
from mpijob_elastic.core.hosts.membership import Leaving, describe
from mpijob_elastic.core.inputs.ranks import reported, seen_by
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.outputs.turn import POD_WRITES_PER_TURN, Turn
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.workers import Worker

# A victim must have been out of the host list this long before an empty read counts:
# the launcher's mounted files refresh (well under a second with the config-hash
# annotation), then Horovod's next discovery poll (1 s) must see the removal, or it could
# still be starting a rank there.
DRAIN_FLOOR_SECONDS = 3.0
# How often a job with victims in their drain window reads the launcher.
PROBE_INTERVAL_SECONDS = 1.0
# How often, where the launcher's reports still show a remote shell that should have
# ended (a victim past its floor, a former pod of a name taken back), a read checks
# them (ranks.corrected): an exit report comes within a second unless it is lost.
CONFIRM_INTERVAL_SECONDS = 5.0
# A victim whose ranks have left is deleted with this grace period rather than the pod's
# own: nothing of the training runs there any more, and a `sleep` that ignores SIGTERM
# would hold its GPUs for the pod's full grace period (30 s by default).
RANK_FREE_GRACE_SECONDS = 1


@dataclass(frozen=True)
class Victim:
    worker: Worker
    # Why it leaves (membership.py): named, not in discovery, or the newest.
    why: str
    # When the drain ends at the latest; None: it has not begun (the worker is still
    # listed, or unmarked), or it needs none (no rank can run there).
    deadline: datetime | None
    # This turn's write for it: "mark" (its drain starts), "delete" (its drain is over), or
    # None (waiting, or left for a later turn).
    action: str | None = None
    # The delete's grace period; None: the pod's own.
    grace_seconds: int | None = None
    # Deleted at its deadline while the launcher still reached it: Horovod counts a
    # failure and blacklists the name, so it is never used again.
    retire: bool = False
    # Deleted only as the turn saw it (actions.DeletePod.resource_version): the delete
    # rests on its state, no rank can run there.
    as_seen: bool = False


def drain(
    turn: Turn,
    spec: JobSpec,
    leaving: Sequence[Leaving],
    listed: set[str],
    launcher: Mapping[str, Any] | None,
) -> list[Victim]:
    """Each leaving worker's drain: unlisted first, deleted once its ranks have left.

    A worker that cannot be running ranks (not started, failed) goes at once. Any other
    is marked when the host list drops it; from the floor on, it is deleted as soon as a
    read of the launcher no longer shows a remote shell into it, and at the latest when
    ``drain-seconds`` are over. At most ``POD_WRITES_PER_TURN`` marks and deletes each.
    """
    victims: list[Victim] = []
    marking: list[Leaving] = []
    due: list[Victim] = []
    for item in leaving:
        victim = _step(turn, spec, item, listed, launcher, len(marking) < POD_WRITES_PER_TURN)
        if victim.action == "mark":
            marking.append(item)
        elif victim.action == "delete" and len(due) >= POD_WRITES_PER_TURN:
            turn.requeue(0)
            victim = replace(victim, action=None)
        elif victim.action == "delete":
            due.append(victim)
        victims.append(victim)
    _report(turn, spec, marking, due)
    return victims


def _step(
    turn: Turn,
    spec: JobSpec,
    item: Leaving,
    listed: set[str],
    launcher: Mapping[str, Any] | None,
    may_mark: bool,
) -> Victim:
    """Where one leaving worker's drain stands, and its write this turn."""
    w, now = item.worker, turn.now
    floor = timedelta(seconds=min(DRAIN_FLOOR_SECONDS, spec.drain_seconds))
    if not w.main_running(spec.main_container):
        # No rank runs there (ranks live in the main container): nothing to wait for.
        # This turn's host-list write, made before any delete, drops it.
        return Victim(w, item.why, None, "delete", as_seen=True)
    if spec.drain_seconds == 0:
        return Victim(w, item.why, now, "delete")
    since = w.draining_since
    if since is None or w.name in listed:
        # Unmarked, a mark edited into nonsense, or a mark from a drain that a scale-up
        # undid: the drain starts with this turn's host-list write.
        turn.requeue(floor.total_seconds() if may_mark else 0)
        return Victim(w, item.why, None, "mark" if may_mark else None)
    deadline = since + timedelta(seconds=spec.drain_seconds)
    reached = since + floor
    seen = seen_by(w.name, turn.observed.ranks, turn.observed.ranks_read, reached)
    if now >= deadline:
        # Deleted under a running rank: Horovod counts a failure.
        return Victim(w, item.why, deadline, "delete", retire=seen is not None and w.name in seen)
    if now < reached:
        turn.requeue((reached - now).total_seconds())
        return Victim(w, item.why, deadline)
    if seen is not None and w.name not in seen:
        return Victim(w, item.why, deadline, "delete", RANK_FREE_GRACE_SECONDS)
    # Where the reports say nothing of it, an exec read must (ranks.py); where they still
    # show its shell, one now and then catches an exit report that is late or lost.
    covered = reported(w.name, turn.observed.ranks)
    every = CONFIRM_INTERVAL_SECONDS if covered else PROBE_INTERVAL_SECONDS
    read_launcher(turn, spec, launcher, every)
    turn.requeue((deadline - now).total_seconds())
    return Victim(w, item.why, deadline)


def _report(turn: Turn, spec: JobSpec, marking: list[Leaving], due: list[Victim]) -> None:
    if marking:
        # Workers on nodes going away (relocate) are the ones moved, not dropped.
        leaving = turn.observed.leaving_nodes
        moved = sum(1 for m in marking if m.worker.node in leaving)
        turn.event(
            "Normal",
            "Draining",
            f"draining worker pods {describe(marking)}"
            f": removed from discover_hosts.sh, deleting each once its ranks have left, "
            f"within {spec.drain_seconds:g}s",
            (("relocated", moved),) if moved else (),
        )
    if not due:
        return
    whys = [_gone_why(v) for v in due]
    turn.event(
        "Normal",
        "WorkerDeleted",
        "deleted worker pods "
        + ", ".join(f"{v.worker.name} ({why})" for v, why in zip(due, whys, strict=True)),
        (("drained", whys.count(_RANKS_LEFT)), ("drain_timed_out", whys.count(_DRAIN_OVER))),
    )
    if spec.drain_seconds == 0 and any(v.deadline is not None for v in due):
        turn.event(
            "Warning",
            "DrainDisabled",
            f"{names.ANN_DRAIN_SECONDS} is 0: worker pods are deleted while Horovod may "
            "still run ranks there, which it counts as failures, blacklisting the names",
        )


_RANKS_LEFT = "its ranks have left"
_DRAIN_OVER = "drain over"


def _gone_why(victim: Victim) -> str:
    if victim.deadline is None:
        return "no rank could run there"
    if victim.grace_seconds is not None:
        return _RANKS_LEFT
    return _DRAIN_OVER


def read_launcher(
    turn: Turn, spec: JobSpec, launcher: Mapping[str, Any] | None, every: float
) -> None:
    """Read the launcher if the last read is ``every`` seconds old; come back then."""
    if launcher is None or launcher["metadata"].get("deletionTimestamp"):
        return
    if (launcher.get("status") or {}).get("phase") != "Running":
        return
    last = turn.observed.ranks_read
    age = (turn.now - last.at).total_seconds() if last is not None else every
    if age < every:
        turn.requeue(every - age)
        return
    turn.requeue(every)
    containers = (launcher.get("spec") or {}).get("containers") or []
    index = render_pods.main_container_index(spec, containers) if containers else None
    container = containers[index].get("name") if index is not None else None
    turn.probe = Probe(str(launcher["metadata"]["name"]), container)


def relocate(turn: Turn, spec: JobSpec, workers: Sequence[Worker]) -> dict[str, str]:
    """Workers of an elastic job on nodes that are going away: they leave gracefully and
    are replaced elsewhere, keeping the job at its size. A job without elastic bounds (v1)
    cannot lose a worker gracefully, so it is left as it is."""
    leaving = turn.observed.leaving_nodes
    if spec.bounds.min is None or not leaving:
        return {}
    return {
        w.name: f"node {node} {leaving[node]}"
        for w in workers
        if (node := w.node) is not None and node in leaving and not w.terminating
    }


def failed_to_replace(turn: Turn, spec: JobSpec, failed: Sequence[Worker]) -> list[Worker]:
    """The failed workers the restart policy replaces (the others keep their place)."""
    replacing = [w for w in failed if _replaces(turn, spec, w)]
    for w in replacing:
        why = w.reason or f"exit code {w.exit_code(spec.main_container)}"
        turn.event("Warning", "WorkerFailed", f"worker pod {w.name} failed ({why}); replacing it")
    return replacing


def _replaces(turn: Turn, spec: JobSpec, worker: Worker) -> bool:
    if worker.phase != "Failed" or worker.terminating or turn.gone(worker.uid):
        return False
    if worker.reason == "Evicted":
        return True  # the node's doing, not the program's
    if spec.worker.restart_policy == "Never":
        return False
    if spec.worker.restart_policy == "ExitCode":
        # v1 semantics: 1-127 is the program's own error, 128+ a signal worth retrying.
        code = worker.exit_code(spec.main_container)
        return code is not None and code >= 128
    return True
