"""Hostile values on every object the controller reads and does not fully control, through
its own planning path: it never raises, a value read is within its bounds, and a refused
spec quantity names its field (issue 31).

test_plan_fuzz.py mutates the job; this mutates what others write beside it: (a) the
launcher's rank reports on ``<job>-ranks``, (b) the state annotations on ``<job>-config``
and the annotations, labels and times the controller reads on its pods, (c) the
quantities of the spec (container resources, ``schedulingPolicy.minResources``), planned
with a gang scheduler so the PodGroup's sum is made, and (d) Kueue's Workloads, the
Nodes' notices and Volcano's PodGroup phase. Each case runs ``observe`` and
``plan_writes`` as the controller calls them; a seeded generator, so a failure names its
case and replays; ``CASES`` per surface in every ``make test``. The core reads no Event:
(e) the scheduler's Preempted Events are read by app/preemptions.py, as its cache's
transform (which must not raise, or one Event would fail every relist) and then by victim;
their names reach an opportunistic job's plan. No node allocatable or Workload usage is
read.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import pytest

from mpijob_elastic.app import preemptions
from mpijob_elastic.app.render import render_children
from mpijob_elastic.core import names, nodes, numbers, quantity
from mpijob_elastic.core.actions import Writes, WriteStatus
from mpijob_elastic.core.hosts.membership import parse_indexes
from mpijob_elastic.core.inputs.growth_state import parse_growth
from mpijob_elastic.core.inputs.observe import Gathered, Listed, observe
from mpijob_elastic.core.inputs.ranks import RankSnapshot, pushed
from mpijob_elastic.core.lifecycle.notices import parse_notice
from mpijob_elastic.core.lifecycle.run_policy import parse_suspension
from mpijob_elastic.core.outputs.turn import count
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.queueing import kueue
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.sizing.capacity import parse_backoff
from mpijob_elastic.core.sizing.preemptors import parse_pending
from mpijob_elastic.core.times import EARLIEST, LATEST, format_time, parse_time
from mpijob_elastic.machinery.job_memory import JobMemory
from tests.unit.simulation import make_job, running_status
from tests.unit.test_kueue import FLAVOR, workload
from tests.unit.test_plan_fuzz import HOSTILE, NOW, refusal

CASES = 10_000
SETTINGS = Settings()
GANG = Settings(gang_scheduler_name="volcano")
Obj = dict[str, Any]
Children = dict[str, list[Obj]]

# Tokens the controller's own formats are made of, and the ways they go wrong.
NUMBERS = [
    "0", "1", "2", "3", "7", "12", "0042", str(2**31 - 1), str(2**31), str(2**63), "9" * 20,
    "9" * 4301, "9" * 5000, "0" * 5000 + "1", "-1", "+4", " 4", "1_0", "\u0661", "", "1.5",
    "1e3", "nan", "253402300800", "99999999999", str(int(NOW.timestamp()) - 60),
]  # fmt: skip
TIMES = [
    format_time(NOW - timedelta(seconds=30)), format_time(NOW + timedelta(seconds=30)),
    "2026-11-25T11:59:30.123456Z", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59.999999Z",
    "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2026-13-01T00:00:00Z", "-", "",
    "2026-11-25 12:00:00", "99999-01-01T00:00:00Z",
]  # fmt: skip
WORDS = ["why", "Unschedulable", "job-worker-0", "job-worker-1", "uid-1", "x" * 300, "\u00e9", ""]
QUANTITIES = [
    "1", "0", "100m", "1.5Gi", "2Gi", "1e3", "1E-3", "1e999", "1e1000", "1e-1000",
    "1e99999999999999", "1e" + "9" * 5000, "9" * 64, "9" * 65, "9" * 5000, "9" * 64 + "Ei",
    "0." + "0" * 70 + "1", "-1", "+1k", ".5", "5.", "1Ki", "1ki", "1KiB", "1e", "e3", "",
    " 1", "1 ", "0x10", "\u0661", "1e+-3", "1n", "1u",
]  # fmt: skip


# The JSON a field may hold where a quantity or a count belongs.
SCALARS = [h for h in HOSTILE if not isinstance(h, list | dict)]


def junk(rng: random.Random) -> str:
    """A string of the tokens above joined any way: none of the controller's formats."""
    parts = [rng.choice(rng.choice((NUMBERS, TIMES, WORDS))) for _ in range(rng.randint(1, 5))]
    return rng.choice((" ", ",", "-", "/", "_", "")).join(parts)


def number(rng: random.Random) -> str:
    return rng.choice(NUMBERS)


def time(rng: random.Random) -> str:
    return rng.choice(TIMES)


def word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def retired(rng: random.Random) -> str:
    parts = [number(rng) + (f"-{number(rng)}" if rng.random() < 0.4 else "") for _ in range(3)]
    return ",".join(parts[: rng.randint(1, 3)])


# Each state annotation in the controller's own format, any part hostile.
STATE: dict[str, Callable[[random.Random], list[str]]] = {
    names.ANN_RETIRED_WORKERS: lambda r: [retired(r)],
    names.ANN_SCALE_OUT_BACKOFF: lambda r: [number(r), time(r), word(r)],
    names.ANN_BELOW_MIN_SINCE: lambda r: [time(r)],
    names.ANN_SUSPENDED: lambda r: [time(r), f"1/{number(r)}/{number(r)}"],
    names.ANN_LAUNCHER_RESTARTS: lambda r: [number(r)],
    names.ANN_WORKER_FAILURES: lambda r: [number(r), time(r), f"uid-1,{word(r)}"],
    names.ANN_WORKERS: lambda r: [number(r)],
    names.ANN_GROWTH: lambda r: [number(r), number(r), time(r), time(r), word(r)],
    names.ANN_PREEMPTED: lambda r: [time(r), f"uid-1/{word(r)}", f"{word(r)}/{word(r)}"],
    names.ANN_HOSTS_ADDED: lambda r: [time(r)],
}
POD_ANNOTATIONS: dict[str, Callable[[random.Random], list[str]]] = {
    names.ANN_DRAINING_SINCE: lambda r: [time(r)],
    names.ANN_NOTICE: lambda r: [r.choice(("preempt", "stop", word(r))), time(r), word(r)],
    names.ANN_CONFIG_HASH: lambda r: [word(r)],
}
POD_LABELS = [
    names.LABEL_ROLE, names.LABEL_TO_REPLICA_TYPE, names.LABEL_OPPORTUNISTIC,
    names.LABEL_HOLDS_RANKS, names.LABEL_INDEX,
]  # fmt: skip
LABEL_VALUES = ["worker", "launcher", "Worker", "true", "false", "0", "1", "", "x" * 63]


def value(rng: random.Random, parts: Callable[[random.Random], list[str]]) -> str:
    """The format with hostile parts, parts dropped, or junk."""
    if rng.random() < 0.15:
        return junk(rng)
    found = parts(rng)
    if rng.random() < 0.2:
        del found[rng.randrange(len(found)) :]
    return " ".join(found)


def world(job: Obj, workers: int, settings: Settings) -> Children:
    """The children ``job`` has once ``workers`` of its workers run."""
    grown = copy.deepcopy(job)
    grown["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = workers
    found: Children = {}
    for obj in render_children(grown, settings):
        if obj["kind"] == "Pod":
            obj = {**obj, "status": running_status(obj)}
        found.setdefault(obj["kind"], []).append(obj)
    return found


def plan(
    job: Obj,
    children: Children,
    settings: Settings = SETTINGS,
    *,
    ranks: RankSnapshot | None = None,
    leaving: Mapping[str, str] | None = None,
    queue: Queue | None = None,
) -> Writes:
    observed = observe(
        job,
        lambda kind: Listed(children.get(kind, ())),
        lambda _: None,
        JobMemory(),
        0.0,
        Gathered(ranks=ranks, leaving_nodes=leaving or {}),
    )
    if queue is not None:
        observed = dataclasses.replace(observed, queue=queue)
    return plan_writes(observed, settings, NOW)


def bounds(annotations: Mapping[str, str]) -> dict[str, str]:
    return {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "4", **annotations}


def state_bases() -> dict[str, tuple[Obj, Children]]:
    """A running job, one above its bounds (the kept count is read), one draining, and an
    opportunistic one (its growth state is read)."""
    steady = make_job(2, annotations=bounds({}))
    above = copy.deepcopy(steady)
    above["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 6
    growing = make_job(2, annotations=bounds({names.ANN_OPPORTUNISTIC: "true"}))
    return {
        "steady": (steady, world(steady, 2, SETTINGS)),
        "above bounds": (above, world(steady, 2, SETTINGS)),
        "draining": (steady, world(steady, 4, SETTINGS)),
        "opportunistic": (growing, world(growing, 2, SETTINGS)),
    }


STATE_BASES = state_bases()


def within(found: object) -> None:
    """What a parser read of a hostile value: numbers and times within their bounds."""
    if isinstance(found, bool) or found is None or isinstance(found, str):
        return
    if isinstance(found, int):
        assert 0 <= found <= numbers.INT32_MAX, found
    elif isinstance(found, datetime):
        assert EARLIEST <= found <= LATEST, found
    elif isinstance(found, (tuple, frozenset, list)):
        for item in found:
            within(item)
    elif dataclasses.is_dataclass(found):
        for item in dataclasses.fields(found):
            within(getattr(found, item.name))


PARSERS: dict[str, Callable[[str], object]] = {
    names.ANN_RETIRED_WORKERS: parse_indexes,
    names.ANN_SCALE_OUT_BACKOFF: parse_backoff,
    names.ANN_BELOW_MIN_SINCE: parse_time,
    names.ANN_SUSPENDED: parse_suspension,
    names.ANN_LAUNCHER_RESTARTS: count,
    names.ANN_WORKERS: numbers.whole,
    names.ANN_GROWTH: parse_growth,
    names.ANN_PREEMPTED: parse_pending,
    names.ANN_HOSTS_ADDED: parse_time,
    names.ANN_DRAINING_SINCE: parse_time,
    names.ANN_NOTICE: parse_notice,
}


def with_meta(obj: Obj, field: str, key: str, text: str) -> Obj:
    """``obj`` with one annotation or label set; the shared original is left alone."""
    meta = {**obj["metadata"], field: {**(obj["metadata"].get(field) or {}), key: text}}
    return {**obj, "metadata": meta}


Done = list[tuple[str, str]]


def state_case(rng: random.Random, base: tuple[Obj, Children], done: Done) -> str:
    job, children = base
    config_name = names.config_map_name("job")
    maps = list(children.get("ConfigMap", ()))
    pods = list(children.get("Pod", ()))
    for _ in range(rng.choice((1, 1, 2, 3))):
        if rng.random() < 0.1:
            # The host lists, read back to know who was listed: any line a tenant adds.
            key = rng.choice((names.HOSTFILE, names.DISCOVER_HOSTS))
            host = f"job-worker-{number(rng)}"
            text = f"{host} slots=1\n" if key == names.HOSTFILE else f"\necho {host}:1"
            maps = [
                {**m, "data": {**m["data"], key: m["data"].get(key, "") + text}}
                if m["metadata"]["name"] == config_name
                else m
                for m in maps
            ]
        elif rng.random() < 0.6:
            key = rng.choice(sorted(STATE))
            text = value(rng, STATE[key])
            maps = [
                with_meta(m, "annotations", key, text)
                if m["metadata"]["name"] == config_name
                else m
                for m in maps
            ]
        else:
            i = rng.randrange(len(pods))
            if rng.random() < 0.5:
                key = rng.choice(sorted(POD_ANNOTATIONS))
                text = value(rng, POD_ANNOTATIONS[key])
                pods[i] = with_meta(pods[i], "annotations", key, text)
            else:
                key, text = rng.choice(POD_LABELS), rng.choice(LABEL_VALUES)
                pods[i] = with_meta(pods[i], "labels", key, text)
            if rng.random() < 0.2:
                # The kubelet's and the API server's times, which the rules read too.
                pods[i] = copy.deepcopy(pods[i])
                pods[i]["metadata"]["creationTimestamp"] = time(rng)
                for status in pods[i]["status"].get("containerStatuses") or []:
                    status["state"]["running"] = {"startedAt": time(rng)}
            if rng.random() < 0.1:
                # A pod being taken: its notice's deadline adds the grace period the
                # template sets, any int64 to the API.
                pods[i] = copy.deepcopy(pods[i])
                grace = rng.choice([h for h in SCALARS if isinstance(h, int)])
                pods[i]["spec"]["terminationGracePeriodSeconds"] = grace
                taken = {"type": "DisruptionTarget", "status": "True", "reason": word(rng)}
                pods[i]["status"].setdefault("conditions", []).append(taken)
                done.append(("terminationGracePeriodSeconds", repr(grace)))
        done.append((key, text))
        if key in PARSERS:
            within(PARSERS[key](text))
    plan(job, {**children, "ConfigMap": maps, "Pod": pods})
    return "planned"


def reports(workers: int, second: int) -> dict[str, str]:
    return {f"job-worker-{i}_{100 + i}_{second}": "start" for i in range(workers)}


def rank_key(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return junk(rng)
    host = rng.choice(("job-worker-0", "job-worker-1", "job-worker-3", "job-launcher", word(rng)))
    suffix = rng.choice(("", "", "_exit", "_committed", "_" + word(rng)))
    return f"{host}_{number(rng)}_{number(rng)}{suffix}"


def ranks_case(rng: random.Random, base: tuple[Obj, Children], done: Done) -> str:
    job, children = base
    before = reports(2, int(NOW.timestamp()) - 60)
    data = dict(before)
    for _ in range(rng.choice((1, 1, 2, 3))):
        how = rng.choice(("add", "add", "value", "delete"))
        if how != "add" and data:
            key = rng.choice(sorted(data))
            if how == "delete":
                del data[key]
                done.append(("delete", key))
                continue
        else:
            key = rank_key(rng)
        data[key] = rng.choice(("start", "0", "1", "137", " 0 ", "", junk(rng)))
        done.append((key, data[key]))
    previous = pushed(before, NOW - timedelta(seconds=5))
    snapshot = pushed(data, NOW, previous)
    # A start no later than a day past the read (the clock-skew bound), never unbounded.
    for starts in (snapshot.since, snapshot.latest, snapshot.started):
        for at in starts.values():
            assert EARLIEST <= at <= NOW + timedelta(days=1), (at, data)
    plan(job, children, ranks=snapshot)
    return "planned"


RANKS_BASES = {name: STATE_BASES[name] for name in ("steady", "draining")}


def resourced(min_resources: bool) -> Obj:
    job = make_job(2, annotations=bounds({}))
    for role, gpus in (("Launcher", 0), ("Worker", 1)):
        container = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        container["resources"] = {
            "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": gpus},
            "limits": {"memory": "2Gi"},
        }
    if min_resources:
        policy = {"minResources": {"cpu": "2", "nvidia.com/gpu": "2"}}
        job["spec"]["runPolicy"] = {"schedulingPolicy": policy}
    return job


QUANTITY_BASES = {
    name: (job, world(job, 2, GANG))
    for name, job in (("pods", resourced(False)), ("minResources", resourced(True)))
}
POLICY_FIELD = "spec.runPolicy.schedulingPolicy.minResources"


def quantity_case(rng: random.Random, base: tuple[Obj, Children], done: Done) -> str:
    job = copy.deepcopy(base[0])
    unreadable: set[str] = set()
    for _ in range(rng.choice((1, 1, 2))):
        text: Any = rng.choice(QUANTITIES) if rng.random() < 0.8 else rng.choice(SCALARS)
        name = rng.choice(("cpu", "memory", "nvidia.com/gpu", "example.com/x"))
        where = rng.choice(("Launcher", "Worker", "policy"))
        if where == "policy":
            field = f"{POLICY_FIELD}.{name}"
            done.append((field, repr(text)[:80]))
            policy = job["spec"].setdefault("runPolicy", {}).setdefault("schedulingPolicy", {})
            policy.setdefault("minResources", {})[name] = text
            if quantity.parse(text) is None:
                unreadable.add(field)
            else:
                unreadable.discard(field)
        else:
            kind = rng.choice(("requests", "limits"))
            done.append((f"spec.mpiReplicaSpecs.{where}...{kind}.{name}", repr(text)[:80]))
            spec = job["spec"]["mpiReplicaSpecs"][where]["template"]["spec"]
            spec["containers"][0]["resources"][kind][name] = text
    writes = plan(job, base[1], GANG)
    statuses = [a.status for a in writes.actions if isinstance(a, WriteStatus)]
    invalid = [
        c
        for s in statuses
        for c in s["conditions"]
        if c["type"] == "InvalidSpec" and c["status"] == "True"
    ]
    # A quantity the controller cannot read in minResources refuses the spec, naming it;
    # nothing else does here (the pods' own are the API server's to refuse). The spec is
    # parsed apart only when the plan says it was refused: a parse is a fifth of a case.
    if not invalid:
        assert not unreadable, unreadable
        return "planned"
    refused = refusal(job)
    assert refused is not None
    assert invalid[0]["message"] == str(refused)
    assert {e.field for e in refused.errors} == unreadable, (refused, unreadable)
    return "refused"


def queued() -> Obj:
    job = make_job(4, annotations=bounds({}))
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q", kueue.PRIORITY_LABEL: "high"}
    return job


QUEUED = queued()
KUEUE_BASES = {
    "admitted": (QUEUED, world(QUEUED, 2, GANG)),
    "waiting": (QUEUED, {}),
}
# Where a Workload holds what the core reads; Kueue's schema keeps each a scalar.
WORKLOAD_PATHS: list[tuple[str | int, ...]] = [
    ("metadata", "annotations", kueue.SLICE_ANNOTATION),
    ("spec", "podSets", 1, "count"),
    ("spec", "podSets", 1, "minCount"),
    ("spec", "podSets", 0, "count"),
    ("status", "admission", "podSetAssignments", 1, "count"),
    ("status", "admission", "podSetAssignments", 1, "name"),
    ("status", "admission", "clusterQueue"),
    ("status", "conditions", -1, "lastTransitionTime"),
    ("status", "conditions", -1, "status"),
    ("status", "conditions", -1, "reason"),
]
CONDITIONS = (("Evicted", "Preempted"), ("PodsReady", "Started"), ("Finished", "Succeeded"))


def at(obj: Any, path: tuple[str | int, ...]) -> Any:
    """What ``path`` leads to in ``obj``; None where it leads nowhere."""
    for key in path:
        if isinstance(key, int):
            obj = obj[key] if isinstance(obj, list) and obj else None
        else:
            obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def kueue_case(rng: random.Random, base: tuple[Obj, Children], done: Done) -> str:
    job, children = base
    admitted = rng.choice((None, 2, 4))
    conditions = tuple(c for c in CONDITIONS if rng.random() < 0.3)
    workloads = [workload(job, 2, admitted=admitted, conditions=conditions)]
    if rng.random() < 0.3:
        workloads.append(workload(job, 3, 1, replaces=workloads[0]["metadata"]["name"]))
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(WORKLOAD_PATHS)
        parent = at(rng.choice(workloads), path[:-1])
        if isinstance(parent, dict):
            new = (
                rng.choice(SCALARS) if rng.random() < 0.5 else rng.choice((number, time, word))(rng)
            )
            parent[path[-1]] = new
            done.append((".".join(map(str, path)), repr(new)[:80]))
    # Volcano's PodGroup phase and a Node's notices, written by others too.
    found = dict(children)
    if "PodGroup" in found and rng.random() < 0.3:
        phase = rng.choice(("Pending", "Inqueue", word(rng)))
        found["PodGroup"] = [{**found["PodGroup"][0], "status": {"phase": phase}}]
        done.append(("PodGroup status.phase", phase))
    taint = {"key": rng.choice(("karpenter.sh/disrupted", word(rng))), "effect": word(rng)}
    node = {
        "metadata": {"name": "n1"},
        "spec": {"unschedulable": rng.random() < 0.2, "taints": [taint]},
    }
    why = nodes.leaving(node, SETTINGS.leaving_node_taints)
    nodes.takes_pods(node, SETTINGS.leaving_node_taints)
    queue = Queue(True, workloads, FLAVOR, slices=rng.random() < 0.5)
    plan(job, found, GANG, leaving={"n1": why} if why else None, queue=queue)
    return "planned"


# A case's outcome: refused (the spec, naming the field) or planned.
Case = Callable[[random.Random, tuple[Obj, Children], Done], str]
SURFACES: dict[str, tuple[Case, dict[str, tuple[Obj, Children]]]] = {
    "rank reports": (ranks_case, RANKS_BASES),
    "state annotations and pods": (state_case, STATE_BASES),
    "quantities": (quantity_case, QUANTITY_BASES),
    "workloads, nodes and podgroups": (kueue_case, KUEUE_BASES),
}


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_what_others_write_plans_without_raising(surface: str) -> None:
    case_of, bases = SURFACES[surface]
    rng = random.Random(f"issue-31-{surface}")
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        base_name = rng.choice(sorted(bases))
        done: Done = []
        try:
            outcome = case_of(rng, bases[base_name], done)
        except Exception as err:
            raise AssertionError(f"case {case} ({surface}, {base_name}): {done}") from err
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Where a case can end either way, both do, so neither side was tested by chance alone.
    assert min(outcomes.values()) > CASES // 20, outcomes


def scheduler_event(rng: random.Random) -> Obj:
    """A Preempted Event as the scheduler writes it, with its fields hostile by chance."""
    fields: Obj = {
        "metadata": {"name": word(rng), "namespace": "ns", "creationTimestamp": time(rng)},
        "involvedObject": {"kind": "Pod", "name": word(rng), "uid": rng.choice(WORDS)},
        "related": {"namespace": word(rng), "name": word(rng)},
        "message": rng.choice(
            ("Preempted by pod 0a1b-2c on node n1", f"Preempted by pod {junk(rng)} on node", "")
        ),
        "eventTime": time(rng),
        "firstTimestamp": time(rng),
    }
    for key in rng.sample(sorted(fields), rng.randint(0, 3)):
        fields[key] = rng.choice(HOSTILE)
    return fields


def test_the_schedulers_events_read_without_raising() -> None:
    rng = random.Random("issue-31-events")
    job = make_job(2)
    job["metadata"]["annotations"].update(
        {names.ANN_OPPORTUNISTIC: "true", names.ANN_MAX_REPLICAS: "4"}
    )
    named = 0
    for case in range(CASES // 10):
        events = [scheduler_event(rng) for _ in range(10)]
        try:
            found = preemptions.first_preemptors(map(preemptions.slim, events))
            observed = observe(
                job, lambda kind: Listed(()), lambda kind: Listed(()), JobMemory(), 0.0
            )
            plan_writes(dataclasses.replace(observed, preemptors=found), SETTINGS, NOW)
        except Exception as err:
            raise AssertionError(f"case {case}: {str(events)[:2000]}") from err
        assert all(isinstance(who, str) for who in found.values()), found
        named += len(found)
    # Many batches name preemptors (of at most 8 victims each): read, not all refused.
    assert named > CASES // 5, named
