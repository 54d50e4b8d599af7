"""Pure planning: (MPIJob, the children we observe, now) -> the ordered writes to make.

The controller's functional core, in two steps: ``desired.py`` decides what the job's
children and status should be (every scaling rule lives there), ``write_order.py`` turns the
difference from what is observed into writes in the one order that keeps scaling safe.
It reads nothing and writes nothing; the shell (app/controller.py) executes the writes and
feeds their results back through the caches, so it is all tested without a cluster.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from mpijob_elastic.core.actions import Phase, Writes, WriteStatus
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.outputs.status import StatusBuilder
from mpijob_elastic.core.planning import handover
from mpijob_elastic.core.planning.desired import desired
from mpijob_elastic.core.planning.write_order import diff
from mpijob_elastic.core.queueing.kueue import WORKLOAD
from mpijob_elastic.core.reports import conditions
from mpijob_elastic.core.settings import Settings


def plan_writes(observed: Observed, settings: Settings, now: datetime | None = None) -> Writes:
    """The writes, in order, that move one job's children towards its spec."""
    now = now or datetime.now(UTC)
    observed = _without_our_own_names(observed)
    # Children to take over first: until then the job sees only part of them.
    claiming = handover.claim_writes(observed)
    if claiming is not None:
        return _with_refusal(claiming, observed, now)
    return diff(desired(observed, settings, now), observed, now)


def _with_refusal(claiming: Writes, observed: Observed, now: datetime) -> Writes:
    """The claims, and the job's report of a write the server refused (a claim, say),
    which ``desired`` makes on every other turn."""
    status = StatusBuilder(observed.job, now)
    event = conditions.refused(status, observed.refused)
    if event is None:
        return claiming
    rv = str(observed.job["metadata"].get("resourceVersion", ""))
    write = WriteStatus(status.build(), rv)
    # The report goes after the claims, in the write order's own steps (write_order.py).
    claims = tuple(p for p in claiming.phases if p.step != "events")
    events = tuple(a for p in claiming.phases if p.step == "events" for a in p.writes)
    phases = (*claims, Phase("status", (write,)), Phase("events", (*events, event)))
    return dataclasses.replace(claiming, phases=phases, on_refusal=(write, event))


def _without_our_own_names(observed: Observed) -> Observed:
    """A name the writer took for someone else's (a create answered 409 whose holder it
    could not read, say after our own create timed out once the server had applied it)
    is ours after all if the caches show the job controlling an object of that name."""
    if not observed.conflicts:
        return observed
    ours = {("Pod", p["metadata"]["name"]) for p in observed.pods}
    for kind, obj in (
        ("ConfigMap", observed.config_map),
        ("ServiceAccount", observed.service_account),
        ("Role", observed.role),
        ("RoleBinding", observed.role_binding),
        ("PodDisruptionBudget", observed.disruption_budget),
        ("PodGroup", observed.pod_group),
        ("ConfigMap", observed.ranks_report),
    ):
        if obj is not None:
            ours.add((kind, obj["metadata"]["name"]))
    for workload in observed.queue.workloads if observed.queue is not None else ():
        ours.add((WORKLOAD, workload["metadata"]["name"]))
    conflicts = {k: v for k, v in observed.conflicts.items() if k not in ours}
    return dataclasses.replace(observed, conflicts=conflicts)
