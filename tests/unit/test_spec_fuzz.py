"""Fuzzed specs: parse raises nothing but InvalidSpec, and whatever it accepts renders.

A reconcile that raised would retry for ever without a condition or an Event (issue 11,
item 7), so this holds for any JSON at all: arbitrary values put at any path of a valid,
fully featured job, and whole random jobs.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render, render_pods
from mpijob_elastic.core.reports import spec_warnings
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.model import JobSpec
from mpijob_elastic.core.spec.parse import InvalidSpec, parse

Path = tuple[str | int, ...]

# Keys parse and render read, so that random objects reach the checks behind them.
KEYS = (
    "metadata",
    "spec",
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "slotsPerWorker",
    "mainContainer",
    "cleanPodPolicy",
    "runPolicy",
    "managedBy",
    "mpiReplicaSpecs",
    "Launcher",
    "Worker",
    "replicas",
    "restartPolicy",
    "template",
    "containers",
    "initContainers",
    "volumes",
    "volumeMounts",
    "mountPath",
    "env",
    "value",
    "command",
    "args",
    "resources",
    "limits",
    "requests",
    "nvidia.com/gpu",
    names.ANN_MIN_REPLICAS,
    names.ANN_MAX_REPLICAS,
    names.ANN_DRAIN_SECONDS,
)
STRINGS = (
    st.sampled_from(
        ["", "main", "side", "Never", "ExitCode", "All", "0", "1", "4", "1_0", "\u0661", " 4 "]
    )
    | st.sampled_from(["4\n", "-1", "2.5", "nan", "inf", "1e3", "x", "9" * 30, "Upper", "a" * 70])
    | st.text(max_size=12)
)
INTS = st.sampled_from([0, 1, 2, -1, 1000, 1001, 2**31, -(2**31) - 1, 2**70]) | st.integers()
SCALARS = st.none() | st.booleans() | INTS | st.floats() | STRINGS
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=16,
)


def rich_job() -> dict[str, Any]:
    """A valid job that has every field parse checks, so each is a path to mutate."""

    def role(replicas: int, extra_env: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "restartPolicy": "OnFailure",
            "template": {
                "metadata": {"labels": {"app": "train"}, "annotations": {"note": "x"}},
                "spec": {
                    "serviceAccountName": "sa",
                    "initContainers": [{"name": "init", "image": "img", "env": []}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "img",
                            "command": ["python"],
                            "args": ["train.py"],
                            "env": [{"name": "A", "value": "1"}, *extra_env],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "resources": {
                                "limits": {"nvidia.com/gpu": 1},
                                "requests": {"cpu": "1"},
                            },
                        },
                        {"name": "side", "image": "img"},
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        }

    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": "u",
            "annotations": {
                names.ANN_MIN_REPLICAS: "1",
                names.ANN_MAX_REPLICAS: "4",
                names.ANN_DRAIN_SECONDS: "2.5",
            },
        },
        "spec": {
            "slotsPerWorker": 2,
            "mainContainer": "main",
            "cleanPodPolicy": "Running",
            "runPolicy": {"cleanPodPolicy": "All", "managedBy": names.MANAGED_BY},
            "mpiReplicaSpecs": {
                "Launcher": role(1, [{"name": "OMPI_MCA_plm_rsh_agent", "value": "ssh"}]),
                "Worker": role(3, []),
            },
        },
    }


def paths(value: Any, prefix: Path = ()) -> list[Path]:
    found: list[Path] = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += paths(child, (*prefix, i))
    return found


PATHS = [p for p in paths(rich_job()) if p]


def mutate(job: dict[str, Any], path: Path, how: str, value: Any) -> None:
    parent: Any = job
    for key in path[:-1]:
        try:
            parent = parent[key]
        except (KeyError, IndexError, TypeError):
            return  # an earlier mutation removed the way there
    last = path[-1]
    if isinstance(parent, dict) and isinstance(last, str):
        if how == "delete":
            parent.pop(last, None)
        elif how == "add" and isinstance(value, dict):
            # A key the rich job lacks, beside the existing ones.
            parent.update(value)
        else:
            parent[last] = value
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        if how == "delete":
            del parent[last]
        else:
            parent[last] = value


def as_text(value: Any) -> str:
    # json, not ==: NaN in a job would make a job unequal to itself.
    return json.dumps(value, sort_keys=True, default=repr)


def check(job: Any) -> None:
    """The property: InvalidSpec naming fields, or a spec every renderer accepts."""
    before = as_text(job)
    invalid: InvalidSpec | None = None
    try:
        spec = parse(job, 30.0)
    except InvalidSpec as err:
        invalid = err
    if currently_in_test_context():
        event("rejected" if invalid else "accepted")  # see --hypothesis-show-statistics
    # The warnings are looked for in every turn, valid spec or not (spec_warnings.py).
    warnings = spec_warnings.check(job, None if invalid else spec, queue=None)
    assert all(w.field and w.message for w in warnings), warnings
    if invalid is not None:
        assert invalid.errors, "InvalidSpec without a field"
        assert all(e.field and e.message for e in invalid.errors), invalid.errors
        return
    assert as_text(job) == before, "parse changed the job"
    render_everything(spec)
    assert as_text(job) == before, "rendering changed the job"


def render_everything(spec: JobSpec) -> None:
    count = max(0, min(spec.worker.replicas, 3))
    workers = [names.worker_name(spec.name, i) for i in range(count)]
    for delivery in KubectlDelivery:
        config = Settings(kubectl_delivery=delivery)
        data = render.config_data(spec, config, workers, workers)
        hash_ = render.config_hash(data)
        pods = [
            render_pods.launcher_pod(spec, config, hash_, count),
            *(render_pods.worker_pod(spec, i) for i in range(count)),
        ]
        others = [
            render.config_map(spec, data),
            render.role(spec, workers),
            render.role_binding(spec),
            render.service_account(spec),
        ]
        for obj in pods + others:
            json.dumps(obj)  # what the API client will do with it
        for pod in pods:
            volumes = [v["name"] for v in pod["spec"]["volumes"]]
            assert render_pods.CONFIG_VOLUME in volumes
            mounts = [m for c in pod["spec"]["containers"] for m in c.get("volumeMounts", [])]
            assert names.CONFIG_MOUNT in [m.get("mountPath") for m in mounts]


FUZZ = settings(
    max_examples=200,
    deadline=None,  # a busy machine must not turn slowness into a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(PATHS),
            st.sampled_from(["set", "set", "delete", "add"]),
            VALUES | st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=2),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_value_anywhere_in_a_valid_job(mutations: list[tuple[Path, str, Any]]) -> None:
    # Each mutation alone, then all together: generating examples costs far more than
    # checking them, and alone each reaches its check without an earlier one's rejection.
    for chosen in [[m] for m in mutations] + [mutations]:
        job = rich_job()
        for path, how, value in chosen:
            mutate(job, path, how, copy.deepcopy(value))
        check(job)


@FUZZ
@given(
    VALUES
    | st.fixed_dictionaries({"metadata": VALUES, "spec": VALUES})
    | st.fixed_dictionaries(
        {
            "metadata": st.fixed_dictionaries({"name": STRINGS, "annotations": VALUES}),
            "spec": st.fixed_dictionaries(
                {"mpiReplicaSpecs": st.fixed_dictionaries({"Launcher": VALUES, "Worker": VALUES})}
            ),
        }
    )
)
def test_any_whole_job(job: Any) -> None:
    check(job)


# One of each JSON type, empty and not: what a wrong type in YAML most often turns into.
WRONG_TYPES: list[Any] = [None, True, 0, 5, -1, 2.5, "", "x", [], ["x"], [1], [{}], {}, {"a": 1}]


def test_every_path_with_every_json_type() -> None:
    # The exhaustive sweep of single substitutions, which random sampling may miss.
    for path in PATHS:
        job = rich_job()
        mutate(job, path, "delete", None)
        check(job)
        for value in WRONG_TYPES:
            job = rich_job()
            mutate(job, path, "set", copy.deepcopy(value))
            check(job)


def test_the_rich_job_is_valid_and_renders() -> None:
    # Otherwise the mutations above would start from a rejected job and test little.
    spec = parse(rich_job(), 30.0)
    assert spec.worker.replicas == 3
    render_everything(spec)
