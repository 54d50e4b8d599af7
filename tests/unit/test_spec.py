"""Validation: every bad field is named, every good spec parses, nothing reaches a shell."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpijob_elastic.core import names
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.model import Bounds
from mpijob_elastic.core.spec.parse import InvalidSpec, managed_by, parse


def make_job(
    replicas: int = 2, *, name: str = "job", annotations: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    # Its own, not the simulation's: validation is tested apart from the planner.
    def role(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "template": {"spec": {"containers": [{"name": "main", "image": "img"}]}},
        }

    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": "job-uid",
            "resourceVersion": "1",
            "annotations": annotations or {},
        },
        "spec": {
            "slotsPerWorker": 1,
            "mpiReplicaSpecs": {"Launcher": role(1), "Worker": role(replicas)},
            **spec,
        },
    }


LAUNCHER = "spec.mpiReplicaSpecs.Launcher.template"
WORKER = "spec.mpiReplicaSpecs.Worker.template"
MIN = f"metadata.annotations[{names.ANN_MIN_REPLICAS}]"
MAX = f"metadata.annotations[{names.ANN_MAX_REPLICAS}]"
DRAIN = f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]"


def errors_of(job: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30)
    return [e.field for e in info.value.errors]


def messages_of(job: Any, **kwargs: Any) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30, **kwargs)
    return [str(e) for e in info.value.errors]


def template(job: dict[str, Any], role: str) -> dict[str, Any]:
    result: dict[str, Any] = job["spec"]["mpiReplicaSpecs"][role]["template"]
    return result


def container(job: dict[str, Any], role: str) -> dict[str, Any]:
    result: dict[str, Any] = template(job, role)["spec"]["containers"][0]
    return result


def with_spec(**changes: Any) -> dict[str, Any]:
    job = make_job(2)
    job["spec"].update(changes)
    return job


def test_a_good_job_parses_with_v1_defaults() -> None:
    job = make_job(3)
    del job["spec"]["slotsPerWorker"]
    spec = parse(job, 30)
    assert (spec.slots_per_worker, spec.clean_pod_policy, spec.drain_seconds) == (1, "None", 30)
    assert spec.worker.replicas == 3
    assert spec.worker.restart_policy == "Never"
    assert spec.bounds == Bounds(None, None)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda j: j["spec"]["mpiReplicaSpecs"].pop("Worker"), "spec.mpiReplicaSpecs.Worker"),
        (lambda j: j["spec"].pop("mpiReplicaSpecs"), "spec.mpiReplicaSpecs"),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=2.5),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas="2"),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=True),
            "spec.mpiReplicaSpecs.Worker.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
            "spec.mpiReplicaSpecs.Launcher.replicas",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Sometimes"),
            "spec.mpiReplicaSpecs.Worker.restartPolicy",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].update(
                containers=[]
            ),
            "spec.mpiReplicaSpecs.Worker.template.spec.containers",
        ),
        (lambda j: j["spec"].update(slotsPerWorker=0), "spec.slotsPerWorker"),
        (lambda j: j["spec"].update(slotsPerWorker="1"), "spec.slotsPerWorker"),
        (lambda j: j["spec"].update(cleanPodPolicy="Some"), "spec.cleanPodPolicy"),
        (
            lambda j: j["spec"].update(runPolicy={"cleanPodPolicy": "Some"}),
            "spec.runPolicy.cleanPodPolicy",
        ),
        (lambda j: j["spec"].update(mainContainer="main; rm -rf /"), "spec.mainContainer"),
        (lambda j: j["spec"].update(mainContainer="$(reboot)"), "spec.mainContainer"),
        (lambda j: j["spec"].update(mainContainer="sidecar"), "spec.mainContainer"),
        (lambda j: j["metadata"].update(name="Upper"), "metadata.name"),
        (lambda j: j["metadata"].update(name="a" * 60), "metadata.name"),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_MIN_REPLICAS: "two"}),
            f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_MAX_REPLICAS: "0"}),
            f"metadata.annotations[{names.ANN_MAX_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update(
                {names.ANN_MIN_REPLICAS: "4", names.ANN_MAX_REPLICAS: "2"}
            ),
            f"metadata.annotations[{names.ANN_MIN_REPLICAS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_DRAIN_SECONDS: "-1"}),
            f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_DRAIN_SECONDS: "nan"}),
            f"metadata.annotations[{names.ANN_DRAIN_SECONDS}]",
        ),
    ],
)
def test_each_invalid_field_is_named(mutate: Any, field: str) -> None:
    job = make_job(2)
    mutate(job)
    assert field in errors_of(job)


def test_all_errors_are_reported_at_once() -> None:
    job = with_spec(slotsPerWorker=0, mainContainer="BAD")
    assert errors_of(job) == ["spec.slotsPerWorker", "spec.mainContainer"]


def test_name_length_counts_the_largest_worker_index() -> None:
    # 50 + len("-worker-99999") = 63, the most a hostname takes; one more digit is too long.
    job = make_job(10, name="n" * 50, annotations={names.ANN_MAX_REPLICAS: "100000"})
    parse(job, 30, max_workers=10**7)
    job["metadata"]["annotations"][names.ANN_MAX_REPLICAS] = "1000000"
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30, max_workers=10**7)
    assert [e.field for e in info.value.errors] == ["metadata.name"]


def test_out_of_range_replicas_are_not_a_parse_error() -> None:
    job = make_job(9, annotations={names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "5"})
    spec = parse(job, 30)
    assert not spec.bounds.contains(9)
    assert spec.bounds.clamp(9) == 5


@given(
    st.integers(min_value=-5, max_value=20),
    st.one_of(st.none(), st.integers(min_value=0, max_value=10)),
    st.one_of(st.none(), st.integers(min_value=1, max_value=10)),
)
def test_bounds_clamp_lands_inside(replicas: int, low: int | None, high: int | None) -> None:
    if low is not None and high is not None and low > high:
        return
    bounds = Bounds(low, high)
    assert bounds.contains(bounds.clamp(replicas))
    if bounds.contains(replicas):
        assert bounds.clamp(replicas) == replicas


@given(st.text(min_size=1, max_size=70))
def test_no_main_container_that_could_carry_shell_is_accepted(name: str) -> None:
    job = make_job(2)
    job["spec"]["mainContainer"] = name
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = name
    try:
        spec = parse(copy.deepcopy(job), 30)
    except InvalidSpec:
        return
    assert spec.main_container is not None
    assert set(spec.main_container) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


# -- wrong shapes are reported, never raised (issue 11, item 7) ---------------------------


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda j: template(j, "Worker").update(spec="x"),
            f'{WORKER}.spec: must be an object, got "x"',
        ),
        (
            lambda j: template(j, "Launcher").update(spec=[{"containers": []}]),
            f"{LAUNCHER}.spec: must be an object, got a list",
        ),
        (
            lambda j: template(j, "Worker").update(metadata="x"),
            f'{WORKER}.metadata: must be an object, got "x"',
        ),
        (
            lambda j: template(j, "Worker").update(metadata={"labels": ["a=b"]}),
            f"{WORKER}.metadata.labels: must be an object, got a list",
        ),
        (
            lambda j: template(j, "Worker").update(metadata={"labels": {"a": 1}}),
            f"{WORKER}.metadata.labels[a]: must be a string, got 1",
        ),
        (
            lambda j: template(j, "Launcher").update(metadata={"annotations": "x"}),
            f'{LAUNCHER}.metadata.annotations: must be an object, got "x"',
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(volumes="x"),
            f'{WORKER}.spec.volumes: must be a list of volume objects, got "x"',
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(volumes={}),
            f"{WORKER}.spec.volumes: must be a list of volume objects, got an object",
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(volumes=[{"emptyDir": {}}]),
            f"{WORKER}.spec.volumes[0].name: Required value",
        ),
        (
            lambda j: container(j, "Worker").update(volumeMounts="x"),
            f"{WORKER}.spec.containers[0].volumeMounts: "
            'must be a list of {name, mountPath} objects, got "x"',
        ),
        (
            lambda j: container(j, "Launcher").update(env="x"),
            f"{LAUNCHER}.spec.containers[0].env: "
            'must be a list of {name, value} objects, got "x"',
        ),
        (
            lambda j: container(j, "Launcher").update(env=["x"]),
            f'{LAUNCHER}.spec.containers[0].env[0]: must be a {{name, value}} object, got "x"',
        ),
        (
            lambda j: container(j, "Launcher").update(env=[{"name": ["A"], "value": "1"}]),
            f"{LAUNCHER}.spec.containers[0].env[0].name: must be a string, got a list",
        ),
        (
            lambda j: container(j, "Launcher").update(env=[{"name": "A", "value": 1}]),
            f"{LAUNCHER}.spec.containers[0].env[0].value: must be a string, got 1",
        ),
        (
            lambda j: container(j, "Worker").update(command="sleep 1"),
            f'{WORKER}.spec.containers[0].command: must be a list of strings, got "sleep 1"',
        ),
        (
            lambda j: container(j, "Worker").update(args=["-n", 2]),
            f"{WORKER}.spec.containers[0].args[1]: must be a string, got 2",
        ),
        (
            lambda j: container(j, "Launcher").update(resources={"limits": 1}),
            f"{LAUNCHER}.spec.containers[0].resources.limits: must be an object, got 1",
        ),
        (
            lambda j: container(j, "Launcher").update(resources="big"),
            f'{LAUNCHER}.spec.containers[0].resources: must be an object, got "big"',
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(containers="main"),
            f'{WORKER}.spec.containers: must be a list of container objects, got "main"',
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(containers=[{"image": "img"}]),
            f"{WORKER}.spec.containers[0].name: Required value",
        ),
        (
            lambda j: template(j, "Worker")["spec"].update(containers=[{"name": 7}]),
            f"{WORKER}.spec.containers[0].name: must be a string, got 7",
        ),
        (
            lambda j: template(j, "Launcher")["spec"].update(initContainers="x"),
            f'{LAUNCHER}.spec.initContainers: must be a list of container objects, got "x"',
        ),
        (
            lambda j: template(j, "Launcher")["spec"].update(
                initContainers=[{"name": "i", "env": "x"}]
            ),
            f"{LAUNCHER}.spec.initContainers[0].env: "
            'must be a list of {name, value} objects, got "x"',
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(template="x"),
            f'{WORKER}: must be an object, got "x"',
        ),
        (lambda j: j.update(spec="x"), 'spec: must be an object, got "x"'),
        (lambda j: j.update(metadata=["x"]), "metadata: must be an object, got a list"),
        (lambda j: j["metadata"].update(name=123), "metadata.name: must be a string, got 123"),
        (
            lambda j: j["metadata"].update(namespace={}),
            "metadata.namespace: must be a string, got an object",
        ),
        (
            lambda j: j["metadata"].update(annotations=["x"]),
            "metadata.annotations: must be an object, got a list",
        ),
        (
            lambda j: j["metadata"]["annotations"].update({names.ANN_MAX_REPLICAS: 4}),
            f"{MAX}: must be a string, got 4",
        ),
        (lambda j: j["spec"].update(runPolicy="x"), 'spec.runPolicy: must be an object, got "x"'),
        (
            lambda j: j["spec"].update(mpiReplicaSpecs=["Worker"]),
            "spec.mpiReplicaSpecs: must be an object, got a list",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy=["Never"]),
            "spec.mpiReplicaSpecs.Worker.restartPolicy: unsupported value a list: "
            "must be one of Always, OnFailure, Never, ExitCode",
        ),
        (
            lambda j: j["spec"].update(slotsPerWorker=2**40),
            "spec.slotsPerWorker: must be a 32-bit integer >= 1, got 1099511627776",
        ),
        (
            lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=-(2**40)),
            "spec.mpiReplicaSpecs.Worker.replicas: must be a 32-bit integer, got -1099511627776",
        ),
    ],
)
def test_a_wrong_shape_is_reported_with_its_field(mutate: Any, message: str) -> None:
    job = make_job(2)
    mutate(job)
    assert message in messages_of(job)


def test_a_job_that_is_not_an_object_is_reported() -> None:
    assert messages_of(["x"]) == ["MPIJob: must be an object, got a list"]


def test_an_unusable_spec_is_reported_once() -> None:
    job = make_job(2)
    job["spec"] = "x"
    assert messages_of(job) == ['spec: must be an object, got "x"']


def test_managed_by_tolerates_any_shape() -> None:
    assert managed_by({"spec": "x"}) is None
    assert managed_by({"spec": {"runPolicy": ["x"]}}) is None
    assert managed_by({"spec": {"runPolicy": {"managedBy": names.MANAGED_BY}}}) == names.MANAGED_BY


def test_a_template_nested_too_deep_to_copy_is_reported() -> None:
    job = make_job(2)
    deep: Any = "leaf"
    for _ in range(1000):
        deep = [deep]
    container(job, "Worker")["x-deep"] = deep
    assert messages_of(job) == [f"{WORKER}: must not nest more than 64 levels"]


def test_null_lists_render_as_unset() -> None:
    # A YAML `volumes:` with every entry commented out arrives as null.
    job = make_job(2)
    for role in ("Launcher", "Worker"):
        template(job, role)["spec"]["volumes"] = None
        container(job, role)["volumeMounts"] = None
        container(job, role)["env"] = None
        template(job, role)["metadata"] = {"labels": None, "annotations": None}
    spec = parse(job, 30)
    worker = render_pods.worker_pod(spec, 0)
    launcher = render_pods.launcher_pod(spec, Settings(), "h", 1)
    for pod in (worker, launcher):
        assert pod["spec"]["volumes"][0]["name"] == render_pods.CONFIG_VOLUME
        assert pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == names.CONFIG_MOUNT
    # The job itself is left as the user wrote it.
    assert template(job, "Worker")["spec"]["volumes"] is None


@pytest.mark.parametrize("kubectl", list(KubectlDelivery))
def test_a_full_template_renders(kubectl: KubectlDelivery) -> None:
    job = make_job(2, mainContainer="main")
    for role in ("Launcher", "Worker"):
        t = template(job, role)
        t["metadata"] = {"labels": {"app": "x"}, "annotations": {"a": "b"}}
        t["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
        t["spec"]["initContainers"] = [{"name": "init", "image": "img", "command": ["true"]}]
        t["spec"]["containers"].append({"name": "side", "image": "img"})
        c = container(job, role)
        c.update(
            command=["python"],
            args=["train.py"],
            env=[{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {}}}],
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
            resources={"limits": {"cpu": "1"}, "requests": {"cpu": 1}},
        )
    spec = parse(job, 30)
    pod = render_pods.launcher_pod(spec, Settings(kubectl_delivery=kubectl), "h", 1)
    assert pod["metadata"]["labels"]["app"] == "x"
    assert [e["name"] for e in pod["spec"]["containers"][0]["env"]][:2] == ["A", "B"]
    assert render_pods.worker_pod(spec, 1)["spec"]["containers"][0]["command"] == ["python"]


# -- annotation numbers are plain ASCII digits --------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        # Accepted before: int() and float() take these.
        (names.ANN_MIN_REPLICAS, "1_0"),
        (names.ANN_MIN_REPLICAS, "\u0661"),
        (names.ANN_MAX_REPLICAS, " 4 "),
        (names.ANN_MAX_REPLICAS, "4\n"),
        (names.ANN_MAX_REPLICAS, "+4"),
        (names.ANN_DRAIN_SECONDS, "1_0"),
        (names.ANN_DRAIN_SECONDS, " 3"),
        (names.ANN_DRAIN_SECONDS, "1e3"),
        (names.ANN_DRAIN_SECONDS, "\u0663"),
        (names.ANN_DRAIN_SECONDS, ".5"),
        (names.ANN_DRAIN_SECONDS, "5\n"),
        # Refused before too, for other reasons.
        (names.ANN_MAX_REPLICAS, "-1"),
        (names.ANN_MAX_REPLICAS, "4.0"),
        (names.ANN_MIN_REPLICAS, ""),
        (names.ANN_DRAIN_SECONDS, "inf"),
        (names.ANN_DRAIN_SECONDS, "-1"),
    ],
)
def test_annotation_numbers_take_ascii_digits_only(key: str, value: str) -> None:
    job = make_job(2, annotations={key: value})
    what = (
        "a number of seconds in ASCII digits"
        if key == names.ANN_DRAIN_SECONDS
        else "a whole number"
    )
    expected = f"metadata.annotations[{key}]: must be {what}"
    assert [m.split(" (like")[0].split(", got")[0] for m in messages_of(job)] == [expected]


def test_annotation_messages_show_what_was_written() -> None:
    job = make_job(2, annotations={names.ANN_MIN_REPLICAS: "1_0", names.ANN_MAX_REPLICAS: " 4 "})
    assert messages_of(job) == [
        f'{MIN}: must be a whole number, got "1_0"',
        f'{MAX}: must be a whole number, got " 4 "',
    ]
    job = make_job(2, annotations={names.ANN_MIN_REPLICAS: "\u0661"})
    assert messages_of(job) == [f'{MIN}: must be a whole number, got "\\u0661"']


def test_drain_seconds_too_large_to_be_finite() -> None:
    job = make_job(2, annotations={names.ANN_DRAIN_SECONDS: "9" * 400})
    assert [m.split(", got")[0] for m in messages_of(job)] == [
        f"{DRAIN}: must be at most 31536000 seconds (365 days)"
    ]


@pytest.mark.parametrize(
    "key",
    [names.ANN_DRAIN_SECONDS, names.ANN_SCALE_OUT_TIMEOUT, names.ANN_BELOW_MIN_TIMEOUT],
)
def test_durations_beyond_a_year_are_refused_by_name(key: str) -> None:
    # 2**63 passed parsing once, and every reconcile then raised OverflowError.
    annotations = {names.ANN_MIN_REPLICAS: "1", key: "9223372036854775808"}
    assert messages_of(make_job(2, annotations=annotations)) == [
        f"metadata.annotations[{key}]: must be at most 31536000 seconds (365 days), "
        'got "9223372036854775808"'
    ]
    annotations[key] = "31536000"
    parse(make_job(2, annotations=annotations), 30)


@pytest.mark.parametrize(
    ("key", "minimum"),
    [("activeDeadlineSeconds", 1), ("ttlSecondsAfterFinished", 0), ("backoffLimit", 0)],
)
def test_run_policy_counts_beyond_int32_are_refused_by_name(key: str, minimum: int) -> None:
    job = make_job(2)
    job["spec"]["runPolicy"] = {key: 2**63 - 1}
    assert messages_of(job) == [
        f"spec.runPolicy.{key}: must be a whole number from {minimum} to 2147483647, "
        "got 9223372036854775807"
    ]


def test_plain_annotation_numbers_still_parse() -> None:
    job = make_job(
        2,
        annotations={
            names.ANN_MIN_REPLICAS: "007",
            names.ANN_MAX_REPLICAS: "1000",
            names.ANN_DRAIN_SECONDS: "2.50",
        },
    )
    spec = parse(job, 30)
    assert (spec.bounds, spec.drain_seconds) == (Bounds(7, 1000), 2.5)


# -- the controller's cap on one job's size (issue 11, item 8) ----------------------------


def test_worker_replicas_above_the_cap_are_invalid() -> None:
    assert messages_of(make_job(200000)) == [
        "spec.mpiReplicaSpecs.Worker.replicas: must be at most 1000 "
        "(the controller's --max-workers-per-job), got 200000"
    ]
    assert parse(make_job(1000), 30).worker.replicas == 1000


def test_bound_annotations_above_the_cap_are_invalid() -> None:
    job = make_job(2, annotations={names.ANN_MAX_REPLICAS: "200000"})
    assert messages_of(job) == [
        f'{MAX}: must be at most 1000 (the controller\'s --max-workers-per-job), got "200000"'
    ]
    # A min above the cap would make the planner ask for it however the job is scaled.
    job = make_job(2, annotations={names.ANN_MIN_REPLICAS: "1001"})
    assert [m.split(":")[0] for m in messages_of(job)] == [MIN.split(":")[0]]
    # int() refuses more than 4300 digits; the check must not raise anything else.
    job = make_job(2, annotations={names.ANN_MAX_REPLICAS: "9" * 5000})
    assert [m.split(": must")[0] for m in messages_of(job)] == [MAX]


def test_the_cap_is_the_controllers_setting() -> None:
    assert Settings().max_workers_per_job == 1000
    job = make_job(5, annotations={names.ANN_MAX_REPLICAS: "8"})
    assert [m.split(": must")[0] for m in messages_of(job, max_workers=4)] == [
        "spec.mpiReplicaSpecs.Worker.replicas",
        MAX,
    ]
    assert parse(job, 30, max_workers=8).bounds.max == 8


# -- the controller's own ServiceAccount ----------------------------------------------------

OWN = ("ns", "mpijob-elastic")


@pytest.mark.parametrize("role", ["Launcher", "Worker"])
@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_a_template_naming_the_controllers_service_account_is_refused(
    role: str, field: str
) -> None:
    job = make_job()
    job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"][field] = OWN[1]
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30, protected_service_account=OWN)
    (error,) = info.value.errors
    assert error.field == f"spec.mpiReplicaSpecs.{role}.template.spec.{field}"
    assert "controller's own ServiceAccount 'mpijob-elastic'" in error.message


def test_the_same_name_elsewhere_is_someone_elses_service_account() -> None:
    job = make_job()
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAccountName"] = OWN[1]
    parse(job, 30, protected_service_account=("controller-ns", OWN[1]))
    # Unknown (outside a cluster): nothing to protect.
    parse(job, 30)


def test_a_job_whose_default_launcher_account_is_the_controllers_is_refused() -> None:
    job = make_job(name="mpijob")
    with pytest.raises(InvalidSpec) as info:
        parse(job, 30, protected_service_account=("ns", names.launcher_name("mpijob")))
    assert [e.field for e in info.value.errors] == ["metadata.name"]
    # Naming another ServiceAccount for the launcher is the way out.
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["serviceAccountName"] = "x"
    parse(job, 30, protected_service_account=("ns", names.launcher_name("mpijob")))


# -- Horovod's Gloo timeout: how long a reset may last (issue 30) --------------------------


def with_launcher_env(*env: dict[str, Any], container: int = 0) -> dict[str, Any]:
    job = make_job(2)
    containers = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    containers.append({"name": "sidecar", "image": "img"})
    containers[container]["env"] = [{"name": "OTHER", "value": "x"}, *env]
    return job


def test_the_gloo_timeout_is_read_from_the_launcher() -> None:
    assert parse(make_job(2), 30).gloo_timeout_seconds == 30
    env = {"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": "90"}
    assert parse(with_launcher_env(env), 30).gloo_timeout_seconds == 90
    assert parse(with_launcher_env(env, container=1), 30).gloo_timeout_seconds == 90
    shorter = {"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": "10"}
    assert parse(with_launcher_env(shorter), 30).gloo_timeout_seconds == 10
    # Where two containers set it, the longer one: the rules must not act too early.
    job = with_launcher_env(shorter)
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][1]["env"] = [env]
    assert parse(job, 30).gloo_timeout_seconds == 90


@pytest.mark.parametrize(
    "var",
    [
        {"value": "0"},
        {"value": "30s"},
        {"value": "1e3"},
        {"value": "9" * 5000},
        {"value": ""},
        {"value": 30},
        {"valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
    ],
)
def test_a_gloo_timeout_the_controller_cannot_read_is_refused(var: dict[str, Any]) -> None:
    job = with_launcher_env({"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", **var})
    assert errors_of(job) == [f"{LAUNCHER}.spec.containers[0].env[1].value"]
