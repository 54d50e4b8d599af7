"""Warnings about what a job says and nothing reads (spec_warnings.py), and about a
launcher command that contradicts the job's bounds (launcher_command.py): the exact
words, the SpecWarnings condition and Event, and silence where the command is opaque."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob_elastic.core import names
from mpijob_elastic.core.reports.launcher_command import argv
from mpijob_elastic.core.reports.spec_warnings import check, unsupported_version
from mpijob_elastic.core.shapes import FieldError
from mpijob_elastic.core.spec.parse import parse
from tests.unit.simulation import Cluster, make_job

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "elastic-mpijob.yaml"
COMMAND = "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command"
ARGS = "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].args"


def sample() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    job["metadata"].update(namespace="ns", uid="u")
    return job


def warnings_of(job: dict[str, Any]) -> list[str]:
    return [str(w) for w in check(job, parse(job, 30), queue=None)]


def with_command(
    command: list[str] | None, args: list[str] | None = None, **annotations: str
) -> dict[str, Any]:
    job = sample()
    container = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    container.pop("command")
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    job["metadata"]["annotations"].update(
        {f"mpijob-elastic.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    )
    return job


def test_the_shipped_sample_has_no_warning() -> None:
    assert warnings_of(sample()) == []


def test_unknown_annotations_and_fields_are_named_with_what_was_meant() -> None:
    job = sample()
    job["metadata"]["annotations"].update(
        {
            "mpijob-elastic.io/min-replica": "1",
            "mpijob-elastic.io/retired-workers": "0",  # the controller's, on its ConfigMap
            "mpijob-elastic.io/zzz": "x",
            "example.com/other": "not ours: never warned about",
        }
    )
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["Worker"]["replica"] = 3
    specs["Worker"]["maxReplicas"] = 5
    specs["Workers"] = {"replicas": 2}
    job["spec"]["min_replicas"] = 1
    assert warnings_of(job) == [
        "metadata.annotations[mpijob-elastic.io/min-replica]: unknown annotation, ignored; "
        "did you mean mpijob-elastic.io/min-replicas?",
        "metadata.annotations[mpijob-elastic.io/retired-workers]: unknown annotation, "
        "ignored; did you mean mpijob-elastic.io/remove-workers?",
        "metadata.annotations[mpijob-elastic.io/zzz]: unknown annotation, ignored",
        "spec.min_replicas: unknown field, ignored; "
        "did you mean the annotation mpijob-elastic.io/min-replicas?",
        "spec.mpiReplicaSpecs.Workers: unknown replica type, ignored; did you mean Worker?",
        "spec.mpiReplicaSpecs.Worker.replica: unknown field, ignored; did you mean replicas?",
        "spec.mpiReplicaSpecs.Worker.maxReplicas: unknown field, ignored; "
        "did you mean the annotation mpijob-elastic.io/max-replicas?",
    ]


def test_an_invalid_spec_still_gets_the_hint_that_explains_it() -> None:
    job = sample()
    specs = job["spec"]["mpiReplicaSpecs"]
    specs["worker"] = specs.pop("Worker")
    assert [str(w) for w in check(job, None, queue=None)] == [
        "spec.mpiReplicaSpecs.worker: unknown replica type, ignored; did you mean Worker?"
    ]


def test_v2beta1_is_refused_naming_the_controller_that_serves_it() -> None:
    job = sample()
    assert unsupported_version(job) is None
    job["apiVersion"] = "kubeflow.org/v2beta1"
    assert unsupported_version(job) == (
        "apiVersion kubeflow.org/v2beta1 is not served by mpijob-elastic, which runs "
        "kubeflow.org/v1 MPIJobs only; kubeflow.org/v2beta1 MPIJobs are run by the Kubeflow "
        "MPI Operator v2 (github.com/kubeflow/mpi-operator)"
    )
    job["apiVersion"] = "kubeflow.org/v1alpha2"
    assert unsupported_version(job) == (
        "apiVersion 'kubeflow.org/v1alpha2' is not kubeflow.org/v1, the only version "
        "mpijob-elastic runs"
    )


DISCOVERY = ["--host-discovery-script", "/etc/mpi/discover_hosts.sh"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["horovodrun", "-np", "2", "python", "train.py"],
            [
                "horovodrun has no --host-discovery-script: it never sees a worker added or "
                "removed; add --host-discovery-script /etc/mpi/discover_hosts.sh"
            ],
        ),
        (
            ["horovodrun", "-np", "1", "--host-discovery-script=/opt/hosts.sh", "python"],
            [
                "--host-discovery-script is /opt/hosts.sh, not /etc/mpi/discover_hosts.sh, the "
                "host list this controller writes: Horovod sees the job's workers only if that "
                "script prints it"
            ],
        ),
        (
            ["horovodrun", "-np", "2", "--min-np", "3", *DISCOVERY, "python"],
            [
                "--min-np 3 is above the 1 slot of the job at its min-replicas (1 worker x "
                "1 slot): at that size Horovod stops training, and fails after --elastic-timeout"
            ],
        ),
        (
            ["horovodrun", "-np", "2", *DISCOVERY, "python"],
            [
                "-np 2 (Horovod's --min-np when none is given) is above the 1 slot of the job "
                "at its min-replicas (1 worker x 1 slot): at that size Horovod stops training, "
                "and fails after --elastic-timeout"
            ],
        ),
        (
            ["/usr/local/bin/horovodrun", "--num-proc=6", "--min-np=1", *DISCOVERY, "python"],
            [
                "--num-proc 6 is above the 5 slots of the job at its max-replicas (5 workers x "
                "1 slot): Horovod waits for 6 slots before training starts, and never gets them"
            ],
        ),
        (
            ["horovodrun", "-np", "2", "--min-np", "1", "--max-np", "4", *DISCOVERY, "python"],
            [
                "--max-np 4 is below the 5 slots of the job at its max-replicas (5 workers x "
                "1 slot): Horovod starts no rank beyond 4, so the workers above that idle"
            ],
        ),
        (
            ["mpirun", "-np", "2", "--allow-run-as-root", "python", "train.py"],
            [
                "mpirun is not elastic: it reads /etc/mpi/hostfile once, at start, so a worker "
                "added later gets no rank and one removed fails the run; run horovodrun with "
                "--host-discovery-script /etc/mpi/discover_hosts.sh instead"
            ],
        ),
    ],
)
def test_plain_commands_that_contradict_the_bounds(command: list[str], expected: list[str]) -> None:
    assert warnings_of(with_command(command)) == [f"{COMMAND}: {m}" for m in expected]


def test_options_after_the_program_are_the_programs_own() -> None:
    command = ["horovodrun", "-np", "1", "--min-np", "1", *DISCOVERY, "python", "-np", "99"]
    assert warnings_of(with_command(command)) == []
    # An unknown option's value is not the program: --min-np after it is still read.
    command = ["horovodrun", "--network-interface", "eth0", "-np", "1", "--min-np", "3"]
    assert len(warnings_of(with_command([*command, *DISCOVERY, "python"]))) == 1


def test_args_without_a_command_and_sh_c_with_one_simple_command_are_read() -> None:
    args = ["horovodrun", "-np", "9", "--min-np", "1", *DISCOVERY, "python"]
    found = warnings_of(with_command(None, args))
    assert [f.split(": ", 1)[0] for f in found] == [ARGS]
    script = "exec HOROVOD_LOG_LEVEL=info horovodrun -np 9 --min-np 1 " + " ".join(DISCOVERY)
    found = warnings_of(with_command(["/bin/bash", "-lc"], [script + " python 'train.py'"]))
    assert len(found) == 1
    assert found[0].startswith(f"{COMMAND}: -np 9 is above the 5 slots")


@pytest.mark.parametrize(
    "command",
    [
        ["/scripts/train.sh"],
        ["python", "-m", "horovod.runner.launch", "-np", "99"],
        ["sh", "-c", "cd /work && horovodrun -np 99 python train.py"],
        ["sh", "-c", "horovodrun -np $NP python train.py"],
        ["sh", "/scripts/run.sh", "horovodrun", "-np", "99"],
        ["horovodrun", "--config-file", "/etc/hvd.yaml", "-np", "99", "python"],
        ["horovodrun", "-np", "$(NP)", "--host-discovery-script", "/etc/mpi/discover_hosts.sh"],
        ["horovodrun", "-np", "99", "--host-discovery-script", "$(SCRIPT)", "python"],
    ],
)
def test_opaque_commands_get_no_word(command: list[str]) -> None:
    assert warnings_of(with_command(command)) == []


def test_an_unbounded_job_is_not_held_to_bounds() -> None:
    job = with_command(["horovodrun", "-np", "64", "python", "train.py"])
    job["metadata"]["annotations"] = {}
    assert warnings_of(job) == []


def test_mpirun_asking_for_more_slots_than_the_hostfile_lists() -> None:
    job = with_command(["mpirun", "--mca", "btl", "tcp", "-n", "8", "python", "train.py"])
    job["metadata"]["annotations"] = {}
    job["spec"]["slotsPerWorker"] = 2
    assert warnings_of(job) == [
        f"{COMMAND}: -n 8 is above the 4 slots /etc/mpi/hostfile lists (2 workers x 2 slots): "
        "mpirun refuses to start"
    ]
    job = with_command(["mpirun", "--oversubscribe", "-n", "8", "python", "train.py"])
    job["metadata"]["annotations"] = {}
    assert warnings_of(job) == []


def test_a_launcher_with_a_gpu_is_a_host_and_its_slots_count() -> None:
    job = with_command(["horovodrun", "-np", "2", "--min-np", "2", *DISCOVERY, "python"])
    assert len(warnings_of(job)) == 1
    container = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    assert warnings_of(job) == []
    container["command"] = ["horovodrun", "-np", "7", "--min-np", "1", "--max-np", "5"]
    container["command"] += [*DISCOVERY, "python"]
    assert warnings_of(job) == [
        f"{COMMAND}: -np 7 is above the 6 slots of the job at its max-replicas (5 workers x "
        "1 slot + 1 on the launcher): Horovod waits for 7 slots before training starts, and "
        "never gets them",
        f"{COMMAND}: --max-np 5 is below the 6 slots of the job at its max-replicas (5 workers "
        "x 1 slot + 1 on the launcher): Horovod starts no rank beyond 5, so the workers above "
        "that idle",
    ]


def test_argv_never_raises_on_odd_shapes() -> None:
    odd: list[dict[str, Any]] = [
        {},
        {"command": "horovodrun"},
        {"args": [1, 2]},
        {"command": ["sh", "-c"]},
    ]
    for container in odd:
        assert argv(container) is None


def test_the_job_says_its_warnings_once_and_clears_them_when_fixed() -> None:
    job = make_job(
        2, annotations={names.ANN_MIN_REPLICAS: "1", "mpijob-elastic.io/max-replica": "4"}
    )
    c = Cluster(job)
    c.converge()
    found = condition(c)
    assert found is not None
    message = (
        "metadata.annotations[mpijob-elastic.io/max-replica]: unknown annotation, ignored; "
        "did you mean mpijob-elastic.io/max-replicas?"
    )
    assert (found["status"], found["reason"], found["message"]) == ("True", "SpecWarnings", message)
    assert [(e.type, e.message) for e in c.events if e.reason == "SpecWarnings"] == [
        ("Warning", message)
    ]
    c.tick(5)
    c.converge()
    assert len([e for e in c.events if e.reason == "SpecWarnings"]) == 1, "said once"
    annotations = c.job["metadata"]["annotations"]
    annotations[names.ANN_MAX_REPLICAS] = annotations.pop("mpijob-elastic.io/max-replica")
    c.converge()
    found = condition(c)
    assert found is not None
    assert (found["status"], found["reason"]) == ("False", "NoWarnings")
    # Running stays the job's state, shown last: a warning is not a stage of its life.
    assert c.job["status"]["conditions"][-1]["type"] == "Running"


def test_a_job_without_warnings_never_gets_the_condition() -> None:
    c = Cluster(make_job(2))
    c.converge()
    assert condition(c) is None


def test_an_opportunistic_job_is_not_told_its_annotations_are_unknown() -> None:
    # Issue 29: the warnings had a list of their own that missed both.
    annotations = {
        names.ANN_MIN_REPLICAS: "1",
        names.ANN_MAX_REPLICAS: "4",
        names.ANN_OPPORTUNISTIC: "true",
        names.ANN_OPPORTUNISTIC_PRIORITY_CLASS: "spot-low",
    }
    job = make_job(2, annotations=annotations)
    assert warnings_of(job) == []
    c = Cluster(job)
    c.converge()
    assert condition(c) is None
    assert [e for e in c.events if e.reason == "SpecWarnings"] == []


def condition(c: Cluster) -> dict[str, Any] | None:
    for found in c.job.get("status", {}).get("conditions", []):
        if found["type"] == "SpecWarnings":
            return dict(found)
    return None


def test_warnings_are_field_errors() -> None:
    # The condition's message and render's lines are "<field>: <message>", as errors are.
    assert str(FieldError("a.b", "unknown field, ignored")) == "a.b: unknown field, ignored"
