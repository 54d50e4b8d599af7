"""Mutated jobs through the controller's own planning path: it never raises, and every
refused spec names its field (issue 24).

A reconcile that raised was retried with backoff for ever, with a traceback in the log
and no condition, Event or pod for the user: ``drain-seconds: "9223372036854775808"``
passed parsing and then made every plan raise OverflowError. test_spec_fuzz.py holds
``parse`` and the renderers to that; this holds the whole plan (``observe`` +
``plan_writes``, as the controller and ``render`` call them) to it, for jobs a user
edits while they run: the shipped sample and variants, each planned against no children,
its own running children, and more running workers than it asks for (a drain), with
values swapped for hostile ones, keys deleted and annotations garbled. A seeded
generator, so a failure names its case and replays; ``CASES`` of them in every
``make test``.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob_elastic.app.render import render_children
from mpijob_elastic.core import names
from mpijob_elastic.core.actions import WriteStatus
from mpijob_elastic.core.inputs.observe import Listed, observe
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.machinery.job_memory import JobMemory
from tests.unit.simulation import running_status
from tests.unit.test_spec_fuzz import paths as every_path

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "elastic-mpijob.yaml"
SETTINGS = Settings()
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
CASES = 10_000
Obj = dict[str, Any]
Path_ = tuple[str | int, ...]

HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2, 7, 1000, 1001, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1,
    2**63, 2**64, -(2**63), 10**30, 10**400, 0.5, -0.0, 1e308, float("inf"), float("nan"),
    "", "0", "1", "5", "-1", "2.5", "1e3", "nan", "inf", "9223372036854775808",
    "31536000", "31536001", "0" * 50 + "1", "9" * 5000, " 4 ", "4\n", "1_0", "\u0661",
    "\U0001f4a5", "x" * 10_000, "a,b", "elastic-horovod-worker-0",
    "elastic-horovod-worker-" + "9" * 5000, "$(NP)", "Never",
    "All", "OnFailure", [], [1], ["x"], [{}], [None], {}, {"a": 1}, {"name": 5},
]  # fmt: skip
# The annotations a job may carry, and garbled ones (typos, wrong prefix, wrong case).
KEYS = [
    names.ANN_MIN_REPLICAS, names.ANN_MAX_REPLICAS, names.ANN_DRAIN_SECONDS,
    names.ANN_SCALE_OUT_TIMEOUT, names.ANN_REMOVE_WORKERS, names.ANN_BELOW_MIN_TIMEOUT,
    "mpijob-elastic.io/min-replica", "mpijob-elastic.io/Max-Replicas", "mpijob-elastic/drain",
    "mpijob-elastic.io/", "mpijob-elastic.io/workers", "x" * 300,
]  # fmt: skip
# What the API server guarantees of every object it serves: never mutated.
FIXED: set[Path_] = {
    ("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"),
    ("metadata", "namespace"), ("metadata", "uid"),
}  # fmt: skip


def sample() -> Obj:
    job: Obj = yaml.safe_load(SAMPLE.read_text())
    job["metadata"].update(namespace="ns", uid="job-uid", generation=1)
    return job


def variants() -> dict[str, Obj]:
    """The sample, and the sample with everything else parse reads set."""
    plain = sample()
    plain["metadata"]["annotations"] = {}
    rich = sample()
    rich["metadata"]["annotations"].update(
        {
            names.ANN_DRAIN_SECONDS: "2.5",
            names.ANN_SCALE_OUT_TIMEOUT: "60",
            names.ANN_BELOW_MIN_TIMEOUT: "30",
            names.ANN_REMOVE_WORKERS: "elastic-horovod-worker-1",
        }
    )
    rich["spec"].update(slotsPerWorker=2, mainContainer="worker", cleanPodPolicy="All")
    rich["spec"]["runPolicy"].update(
        activeDeadlineSeconds=3600, ttlSecondsAfterFinished=60, backoffLimit=3, suspend=False
    )
    launcher = rich["spec"]["mpiReplicaSpecs"]["Launcher"]
    launcher["restartPolicy"] = "OnFailure"
    launcher["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    rich["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(
        env=[{"name": "A", "value": "1"}], volumeMounts=[{"name": "d", "mountPath": "/d"}]
    )
    rich["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"] = [
        {"name": "d", "emptyDir": {}}
    ]
    return {"sample": sample(), "plain": plain, "rich": rich}


def world(job: Obj, workers: int | None) -> dict[str, list[Obj]]:
    """The children ``job`` has once ``workers`` of its workers run (None: no children)."""
    if workers is None:
        return {}
    grown = copy.deepcopy(job)
    grown["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = workers
    found: dict[str, list[Obj]] = {}
    for obj in render_children(grown, SETTINGS):
        if obj["kind"] == "Pod":
            obj = {**obj, "status": running_status(obj)}
        found.setdefault(obj["kind"], []).append(obj)
    return found


def plan(job: Obj, children: dict[str, list[Obj]]) -> Any:
    observed = observe(
        job,
        lambda kind: Listed(children.get(kind, ())),
        lambda _: None,
        JobMemory(),
        0.0,
    )
    return plan_writes(observed, SETTINGS, NOW)


def paths(value: Any) -> list[Path_]:
    """Every path into ``value`` a mutation may hit: the fixed ones are walked through."""
    return [p for p in every_path(value) if p and p not in FIXED]


def field(path: Path_) -> str:
    """A path as parse names fields: ``a.b[0].c``, map keys in brackets."""
    text = ""
    for i, key in enumerate(path):
        if isinstance(key, int) or (i and path[i - 1] in ("annotations", "labels", "limits")):
            text += f"[{key}]"
        else:
            text += f".{key}" if text else str(key)
    return text


def mutate(job: Obj, rng: random.Random) -> list[tuple[str, Path_]]:
    """One to three mutations of ``job`` in place; what was done where."""
    done: list[tuple[str, Path_]] = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        how = rng.choice(("set", "set", "set", "delete", "annotation", "garble"))
        if how in ("annotation", "garble"):
            annotations = job["metadata"].setdefault("annotations", {})
            if not isinstance(annotations, dict):
                continue  # replaced by a hostile value already
            if how == "garble" and annotations:
                key, new = rng.choice(sorted(annotations)), rng.choice(KEYS)
                annotations[new] = annotations.pop(key)
                done += [(how, ("metadata", "annotations", k)) for k in (key, new)]
                continue
            key = rng.choice(KEYS)
            annotations[key] = (
                rng.choice(HOSTILE) if rng.random() < 0.3 else str(rng.choice(HOSTILE))
            )
            done.append(("set", ("metadata", "annotations", key)))
            continue
        path = rng.choice(paths(job))
        parent: Any = job
        for key in path[:-1]:
            parent = parent[key]
        if how == "delete":
            del parent[path[-1]]
            if isinstance(parent, list):
                path = path[:-1]  # the items after it moved: the list is what changed
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
        done.append((how, path))
    return done


def names_its_field(errors: tuple[Any, ...], path: Path_) -> bool:
    """Whether a refusal names the mutated field: the field itself, an enclosing one, one
    inside it, or the fields that are checked against it."""
    mutated = field(path)
    for error in errors:
        named = error.field
        if named == mutated or any(
            a.startswith(b) and a[len(b)] in ".[" for a, b in ((mutated, named), (named, mutated))
        ):
            return True
        # spec.mainContainer must name a Worker container: a container renamed or removed
        # is reported there.
        if named == "spec.mainContainer" and "containers" in path:
            return True
        # An annotation checked against another (min against max, below-min-timeout
        # against min) is reported on either, naming the other in the message.
        if len(path) > 2 and path[1] == "annotations" and str(path[2]) in str(error):
            return True
    return False


def refusal(job: Obj) -> InvalidSpec | None:
    """What the controller's parse says of the job (lifecycle.read_spec's call)."""
    try:
        parse(
            job,
            SETTINGS.default_drain_seconds,
            max_workers=SETTINGS.max_workers_per_job,
            default_scale_out_timeout=SETTINGS.default_scale_out_timeout_seconds,
        )
    except InvalidSpec as err:
        return err
    return None


def check(job: Obj, children: dict[str, list[Obj]], done: list[tuple[str, Path_]]) -> str:
    """Plan the job; the outcome, for the statistics. Raises on a broken property."""
    writes = plan(job, children)
    refused = refusal(job)
    if refused is None:
        return "planned"
    # The job says so, in a condition the plan writes, naming a mutated field.
    status = next(a.status for a in writes.actions if isinstance(a, WriteStatus))
    invalid = [c for c in status["conditions"] if c["type"] == "InvalidSpec"]
    assert invalid[0]["status"] == "True", invalid
    assert invalid[0]["message"] == str(refused)
    assert any(names_its_field(refused.errors, path) for _, path in done), (
        f"refused for {[e.field for e in refused.errors]}, mutated {done}"
    )
    return "refused"


BASES = variants()
WORLDS: dict[str, Callable[[Obj], dict[str, list[Obj]]]] = {
    "no children": lambda job: world(job, None),
    "running": lambda job: world(job, 2),
    "draining": lambda job: world(job, 5),
}


@pytest.mark.parametrize("world_name", sorted(WORLDS))
def test_planning_never_raises_and_every_refusal_names_its_field(world_name: str) -> None:
    rng = random.Random(f"issue-24-{world_name}")
    outcomes: dict[str, int] = {}
    bases = {name: (job, WORLDS[world_name](job)) for name, job in BASES.items()}
    for case in range(CASES // len(WORLDS) + 1):
        base_name = rng.choice(sorted(bases))
        base, children = bases[base_name]
        job = copy.deepcopy(base)
        done = mutate(job, rng)
        try:
            outcome = check(job, children, done)
        except Exception as err:
            raise AssertionError(
                f"case {case} ({base_name}, {world_name}): {done}\n"
                f"{json.dumps(job, default=repr)[:2000]}"
            ) from err
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Both outcomes, so neither side of the property was tested by chance alone.
    assert outcomes.get("refused", 0) > CASES // 20, outcomes
    assert outcomes.get("planned", 0) > CASES // 20, outcomes


def test_the_overflow_that_was_found_is_a_refusal_now() -> None:
    job = sample()
    job["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = "9223372036854775808"
    done: list[tuple[str, Path_]] = [("set", ("metadata", "annotations", names.ANN_DRAIN_SECONDS))]
    assert check(job, world(sample(), 5), done) == "refused"
