"""Elastic by capacity: when a job grows above its Worker replicas into idle capacity, when
it stops, and when it gives workers back (docs/capacity.md).

A job with ``mpijob-elastic.io/opportunistic: "true"`` keeps ``Worker.replicas`` as its
baseline and adds *opportunistic* workers above it, up to ``max-replicas``. They run at a
low PriorityClass with ``preemptionPolicy: Never``: they never push anyone out, and any
pod of higher priority that needs the room preempts them. The scheduler decides who gets
room; this module never models the cluster's capacity. It only probes:

* Growth comes in steps, a slow start: each step doubles the opportunistic workers the job
  holds (at least ``GROWTH_STEP``, at most the room left), so an overshoot refuses at most
  as many probes as it runs. It grows only while the baseline is complete and the
  scheduler has placed every opportunistic pod (bound to a node: a bound pod has its room,
  its containers may still be starting); an unplaced pod is a probe not yet answered.
  The workers of a step enter ``discover_hosts.sh`` together, as any change's do
  (host_list.py, ``gathered``).
* An opportunistic pod the scheduler reports unschedulable (``PodScheduled=False``,
  ``Unschedulable``) is deleted at once (a Pending pod holds no rank), and growth backs
  off: 10 s doubling per failed probe up to ``--growth-backoff-max-seconds``. A probe
  after a failure adds one worker; a probe worker the scheduler binds ends the backoff. A capacity
  change (``Observed.capacity_changed``: a node that starts to take pods, a pod of ours
  that held a node deleted, another workload's bound pod deleted or ended) ends the pause
  at once, not the count of attempts.
* A worker the scheduler preempts (``DisruptionTarget``, ``PreemptionByScheduler``)
  leaves through the graceful path every deleted worker takes; growth backs off as after
  an unschedulable probe, so the job does not grow back into the room it just gave up.
  The Event names the preemptor (preemptors.py).
* Fair split among opportunistic jobs (``Observed.fleet``): a job that asks for more and
  was refused (its backoff is on) is *hungry*. A job does not grow while a hungry job
  holds fewer opportunistic workers than it does, and gives one worker back (a graceful
  drain) while a hungry job holds at least two fewer and failed to grow after the last
  capacity change, and none of its own is leaving already. The jobs converge to counts
  at most one apart; a newcomer takes workers from the jobs that grew before it.

The state lives in one annotation of the job's ConfigMap (``names.ANN_GROWTH``), which the
controller also reads for the fleet view of other jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.growth_state import GrowthState, parse_growth
from mpijob_elastic.core.objects import podgroups, render_pods
from mpijob_elastic.core.outputs.turn import Turn
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.sizing import preemptors
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.times import format_time, parse_time
from mpijob_elastic.core.workers import Worker, worker_index

GROWTH_STEP = 2
BACKOFF_SECONDS = 10.0
# Victims the scheduler preempts within this long of the first are one preemption: one
# backoff step.
WAVE = timedelta(seconds=5)
PREEMPTED = "preempted"


def _condition(worker: Worker, type_: str) -> Mapping[str, Any] | None:
    for condition in (worker.pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return condition  # type: ignore[no-any-return]
    return None


def unschedulable(worker: Worker) -> bool:
    """The scheduler found no room for the pod."""
    found = _condition(worker, "PodScheduled") or {}
    return (
        worker.phase == "Pending"
        and found.get("status") == "False"
        and found.get("reason") == "Unschedulable"
    )


def scheduled(worker: Worker) -> bool:
    """The scheduler found room: the pod is bound to a node, its containers perhaps still
    starting (phase Pending lasts until they run)."""
    found = _condition(worker, "PodScheduled") or {}
    return worker.phase != "Pending" or worker.node is not None or found.get("status") == "True"


def preempted(worker: Worker) -> bool:
    """The scheduler preempts the pod for a pod of higher priority."""
    found = _condition(worker, "DisruptionTarget") or {}
    return found.get("status") == "True" and found.get("reason") == "PreemptionByScheduler"


def _changed(worker: Worker, type_: str) -> float:
    """When the condition last changed, as a POSIX time (0 if unknown)."""
    at = parse_time((_condition(worker, type_) or {}).get("lastTransitionTime"))
    return at.timestamp() if at else 0.0


def _message(worker: Worker, type_: str) -> str:
    found = _condition(worker, type_) or {}
    text = ": ".join(str(p) for p in (found.get("reason"), found.get("message")) if p)
    return " ".join(text.split())[:200]


@dataclass(frozen=True)
class Growth:
    """How many opportunistic workers the job wants now, which go at once, its state."""

    extra: int
    # Unschedulable opportunistic pods: deleted now, without a drain (they hold no rank).
    refused: Sequence[Worker]
    state: GrowthState
    # Preempted victims whose Event waits for their preemptors (``names.ANN_PREEMPTED``).
    preempted: str = ""


def next_backoff(state: GrowthState, now: datetime, cap: float, why: str) -> GrowthState:
    attempts = state.attempts + 1
    delay = min(BACKOFF_SECONDS * 2 ** min(attempts - 1, 20), max(cap, 0.0))
    return replace(
        state, attempts=attempts, since=now, retry_at=now + timedelta(seconds=delay), why=why
    )


def grow(turn: Turn, spec: JobSpec, workers: Sequence[Worker], baseline: int, held: bool) -> Growth:
    """The opportunistic workers the job wants above ``baseline``; ``held``: the baseline
    pauses (failures, a scale-out backoff), so capacity is not there to grow into."""
    if not spec.opportunistic or spec.bounds.max is None or turn.queue is not None:
        # Any opportunistic worker left is surplus: scale-ins take them first. A job of a
        # Kueue queue runs only what Kueue admitted (kueue.gate): it grows through Kueue.
        return Growth(0, (), GrowthState())
    state = parse_growth(turn.state.get(names.ANN_GROWTH))
    ours = [w for w in workers if w.opportunistic and not turn.gone(w.uid)]
    refused = [w for w in ours if not w.terminating and unschedulable(w)]
    staying = [w for w in ours if not w.terminating and not w.marked and w not in refused]
    state, victims = _failed(turn, spec, [*ours, *_gone(turn, spec, ours)], refused, state)
    cause = state.why.partition(": ")[2] if _wave(state) else ""
    waiting = preemptors.parse_pending(turn.state.get(names.ANN_PREEMPTED))
    waiting = preemptors.announce(turn, waiting, victims, cause, state.retry_at or turn.now)
    main = spec.main_container
    since = state.since
    if since is not None and any(w.created > since.timestamp() and scheduled(w) for w in staying):
        # A probe the scheduler bound has its room: the answer is in. The last
        # preemption's victims stay counted (``why``) while they terminate.
        state = replace(state, attempts=0, since=None, retry_at=None)
    room = max(spec.bounds.max - baseline, 0)
    # A baseline worker a scale-in left above the baseline holds a place growth would
    # fill: counted, or a probe beside it would be the one worker too many, deleted
    # unscheduled and asked for again at the next turn (a fresh simulation seed found
    # that churn, a pod a turn).
    surplus = max(
        sum(1 for w in workers if not w.opportunistic and not w.terminating and not w.marked)
        - baseline,
        0,
    )
    have = min(len(staying) + surplus, room)
    ready = sum(1 for w in workers if not w.opportunistic and w.can_take_ranks(main))
    # Only a pod the scheduler has not placed yet is an unanswered probe.
    pending = any(not scheduled(w) and not w.terminating for w in ours)
    leaving = any(w.terminating or w.marked for w in ours if not preempted(w))
    if _yield_to(turn, have, leaving) is not None:
        extra = have - 1
    elif held or refused or pending or ready < baseline or have >= room:
        extra = have
    else:
        extra = have + _step(turn, state, room, have)
    return Growth(extra, refused, replace(state, workers=len(staying)), waiting.format())


def _gone(turn: Turn, spec: JobSpec, ours: Sequence[Worker]) -> list[Worker]:
    """The job's opportunistic workers preempted and gone before a turn saw them go."""
    known = {w.uid for w in ours}
    gone = []
    for pod in turn.observed.gone:
        index = worker_index(spec.name, str(pod["metadata"].get("name")))
        worker = Worker(index, dict(pod)) if index is not None else None
        if worker is not None and worker.opportunistic and worker.uid not in known:
            gone.append(worker)
    return gone


def _failed(
    turn: Turn,
    spec: JobSpec,
    ours: Sequence[Worker],
    refused: Sequence[Worker],
    state: GrowthState,
) -> tuple[GrowthState, Sequence[Worker]]:
    """The backoff after a refused probe (with its Event) or a preemption, and the
    victims of a preemption counted now (their Event: preemptors.py)."""
    cap = turn.settings.growth_backoff_max_seconds
    if refused:
        why = _message(refused[0], "PodScheduled")
        state = next_backoff(state, turn.now, cap, why)
        turn.event(
            "Normal",
            "GrowthBackedOff",
            f"opportunistic workers {', '.join(w.name for w in refused)} are unschedulable "
            f"({why}): deleting them; the job grows again at "
            f"{format_time(state.retry_at or turn.now)} or when capacity changes "
            f"(attempt {state.attempts})",
            counts=(("withdrawn", len(refused)),),
        )
        return state, ()
    # Each victim once. The scheduler preempts a wave of victims within a second or so,
    # conditions carry whole seconds and reach us a moment later: a victim whose
    # condition changed up to 2 s before the backoff began is new unless already counted.
    wave = _wave(state)
    start = state.since.timestamp() - 2 if state.since else 0.0
    victims = [
        w
        for w in ours
        if preempted(w) and w.uid not in wave and _changed(w, "DisruptionTarget") > start
    ]
    if not victims:
        return state, ()
    why = _message(victims[0], "DisruptionTarget")
    named = ",".join(sorted({*wave, *(w.uid for w in victims)}))
    if wave and state.since is not None and turn.now - state.since < WAVE:
        return replace(state, why=f"{PREEMPTED} {named}: {why}"), victims
    return next_backoff(state, turn.now, cap, f"{PREEMPTED} {named}: {why}"), victims


def _wave(state: GrowthState) -> frozenset[str]:
    """The pods (UIDs) the last preemption took (``why``: "preempted <uids>: ...")."""
    if not state.why.startswith(f"{PREEMPTED} "):
        return frozenset()
    return frozenset(state.why[len(PREEMPTED) + 1 :].split(":", 1)[0].split(","))


def _step(turn: Turn, state: GrowthState, room: int, have: int) -> int:
    """How many workers to add now to a job that may grow."""
    if state.waiting(turn.now, turn.observed.capacity_changed):
        if state.retry_at is not None:
            turn.requeue((state.retry_at - turn.now).total_seconds())
        return 0
    if any(s.hungry_since is not None and s.workers < have for s in turn.observed.fleet):
        return 0  # a job with fewer asks for more: the next room is its
    if state.attempts:
        return 1
    # Slow start: double what it holds, so an overshoot refuses at most as many probes as
    # the job runs already.
    return min(max(GROWTH_STEP, have), room - have)


def _yield_to(turn: Turn, have: int, leaving: bool) -> str | None:
    """The hungry job this one gives a worker back to now, if any (with its Event)."""
    if leaving or have == 0:
        return None
    changed = turn.observed.capacity_changed
    for other in turn.observed.fleet:
        since = other.hungry_since
        if since is None or other.workers + 2 > have:
            continue
        if changed is not None and since <= changed:
            continue  # it has not tried the room freed last yet
        turn.event(
            "Normal",
            "FairShare",
            f"giving one opportunistic worker back: job {other.job} holds {other.workers} "
            f"and cannot grow, this one holds {have}",
        )
        return other.job
    return None


def mark(pod: dict[str, Any], spec: JobSpec, settings: Settings) -> dict[str, Any]:
    """An opportunistic worker: labelled so, at the job's or the controller's low
    PriorityClass. A priority the template sets would contradict the class (the API server
    refuses a pod whose priority is not its class's), so it goes."""
    pod["metadata"].setdefault("labels", {})[names.LABEL_OPPORTUNISTIC] = "true"
    pod_spec = pod["spec"]
    pod_spec["priorityClassName"] = (
        spec.opportunistic_priority_class or settings.opportunistic_priority_class
    )
    pod_spec.pop("priority", None)
    pod_spec.pop("preemptionPolicy", None)
    return pod


def grown(turn: Turn, workers: Sequence[Worker], listed: Sequence[str], old: set[str]) -> None:
    """The Event of opportunistic workers that entered the host list this turn."""
    by_name = {w.name: w for w in workers}
    new = sorted(n for n in listed if n not in old and n in by_name and by_name[n].opportunistic)
    if new:
        turn.event(
            "Normal",
            "Grew",
            f"+{len(new)} into idle capacity: opportunistic workers {', '.join(new)}",
            counts=(("grown", len(new)),),
        )


def paced(
    spec: JobSpec,
    keep: Sequence[Worker],
    create_now: Sequence[int],
    baseline: int,
    gang: podgroups.Gang | None,
) -> list[int]:
    """The workers to create this turn: while the job holds opportunistic workers, the
    baseline's missing ones one at a time, each once the scheduler placed the last. A
    baseline worker outranks the job's own opportunistic ones, so where it finds no room
    it preempts one of them: created together, two replacements took both rank-holders
    of a job whose baseline a node's loss had taken, the host-list rules kept the last
    one listed while it terminated, the replacements waited for its room, and its ranks
    were killed at the end of its grace period (a failure: docs/benchmarks.md). One at a
    time, a preemption takes one victim, and the next waits until a new host took its
    room. A gang's pods are placed together: they are left as they are."""
    missing = baseline - sum(1 for w in keep if not w.opportunistic)
    if gang is not None or missing <= 0 or not any(w.opportunistic for w in keep):
        return list(create_now)
    unplaced = any(not w.opportunistic and not scheduled(w) for w in keep)
    return [] if unplaced else list(create_now[:1])


def new_pods(
    turn: Turn,
    spec: JobSpec,
    keep: Sequence[Worker],
    create_now: Sequence[int],
    baseline: int,
    gang: podgroups.Gang | None,
) -> list[dict[str, Any]]:
    """The workers to create: the baseline's missing ones first, the rest opportunistic."""
    missing = max(baseline - sum(1 for w in keep if not w.opportunistic), 0)
    pods = [render_pods.worker_pod(spec, i, gang) for i in create_now]
    return [p if n < missing else mark(p, spec, turn.settings) for n, p in enumerate(pods)]


def split(spec: JobSpec, keep: Sequence[Worker], listed: Sequence[str]) -> dict[str, int]:
    """Listed workers of the baseline and above it, for ``status.elastic``."""
    extra = {w.name for w in keep if w.opportunistic}
    grown = sum(1 for name in listed if name in extra)
    if not spec.opportunistic and not grown:
        return {}
    return {"baseline": len(listed) - grown, "opportunistic": grown}
