"""`mpijob-elastic render`: every child of a job without a cluster, or the field errors."""

from __future__ import annotations

import platform
import socket
import tomllib
from pathlib import Path

import pytest
import yaml

from mpijob_elastic.app import build, flags, leader
from mpijob_elastic.app.cli import main

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "elastic-mpijob.yaml"


def test_render_prints_every_child(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(SAMPLE)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("ConfigMap", "elastic-horovod-config"),
        ("ConfigMap", "elastic-horovod-ranks"),
        ("Pod", "elastic-horovod-launcher"),
        ("Pod", "elastic-horovod-worker-0"),
        ("Pod", "elastic-horovod-worker-1"),
        ("PodDisruptionBudget", "elastic-horovod-workers"),
        ("Role", "elastic-horovod-launcher"),
        ("RoleBinding", "elastic-horovod-launcher"),
        ("ServiceAccount", "elastic-horovod-launcher"),
    ]
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["discover_hosts.sh"].splitlines()[1:] == [
        "echo elastic-horovod-worker-0:1",
        "echo elastic-horovod-worker-1:1",
    ]


def test_render_reports_field_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = yaml.safe_load(SAMPLE.read_text())
    job["spec"]["slotsPerWorker"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 1
    assert "spec.slotsPerWorker" in capsys.readouterr().err


def kubeconfig(tmp_path: Path) -> str:
    """A kubeconfig naming a server nobody listens on: these runs stop before any request."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--leader-elect-renew-deadline", "15"], "lease duration must exceed the renew deadline"),
        (["--leader-elect-retry-period", "9"], "renew deadline must exceed"),
        ([], "--leader-elect-resource-namespace is needed"),
    ],
)
def test_leader_election_that_could_not_work_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], needle: str
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(leader, "IN_CLUSTER_NAMESPACE", tmp_path / "not-in-a-pod")
    namespace = [] if not flags else ["--leader-elect-resource-namespace", "ns"]
    args = ["run", "--kubeconfig", kubeconfig(tmp_path), "--leader-elect", *namespace, *flags]
    with pytest.raises(SystemExit, match=needle):
        main(args)


def fails_with(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a failing command prints, and that it fails: a SystemExit's message
    (printed by Python, without a traceback) or a non-zero return with stderr."""
    try:
        code: object = main(argv)
        err = capsys.readouterr().err
    except SystemExit as exit_:
        code, err = exit_.code, str(exit_.code)
    assert code not in (0, None), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_render_of_a_missing_file_or_a_directory_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "job.yaml"
    assert fails_with(["render", str(missing)], capsys) == (
        f"{missing}: cannot read: No such file or directory"
    )
    assert (
        fails_with(["render", str(tmp_path)], capsys) == f"{tmp_path}: cannot read: Is a directory"
    )
    binary = tmp_path / "job.bin"
    binary.write_bytes(b"kind: MPIJob\n\xff")
    assert fails_with(["render", str(binary)], capsys) == f"{binary}: not UTF-8 text (byte 13)"


def test_render_of_broken_yaml_names_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("kind: MPIJob\nmetadata:\n  name: x\n   bad: indent\n")
    assert fails_with(["render", str(path)], capsys) == (
        f"{path}: line 4, column 7: mapping values are not allowed here"
    )
    path.write_text("kind: MPIJob\nspec: [1, 2\n")
    assert fails_with(["render", str(path)], capsys).startswith(f"{path}: line 3, column 1: ")


def test_render_refuses_v2beta1_naming_who_serves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(SAMPLE.read_text())
    job["apiVersion"] = "kubeflow.org/v2beta1"
    path = tmp_path / "v2.yaml"
    path.write_text(yaml.safe_dump(job))
    assert fails_with(["render", str(path)], capsys) == (
        f"{path}: MPIJob elastic-horovod: apiVersion kubeflow.org/v2beta1 is not served by "
        "mpijob-elastic, which runs kubeflow.org/v1 MPIJobs only; kubeflow.org/v2beta1 MPIJobs "
        "are run by the Kubeflow MPI Operator v2 (github.com/kubeflow/mpi-operator)"
    )
    assert capsys.readouterr().out == "", "no children printed as if it were v1"


def test_render_warns_on_stderr_and_still_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["annotations"]["mpijob-elastic.io/min-replica"] = "1"
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replica"] = 3
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "MPIJob elastic-horovod: warning: metadata.annotations[mpijob-elastic.io/min-replica]: "
        "unknown annotation, ignored; did you mean mpijob-elastic.io/min-replicas?",
        "MPIJob elastic-horovod: warning: spec.mpiReplicaSpecs.Worker.replica: unknown field, "
        "ignored; did you mean replicas?",
    ]
    assert len(list(yaml.safe_load_all(out))) == 9


def test_render_of_an_opportunistic_job_prints_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["annotations"]["mpijob-elastic.io/opportunistic"] = "true"
    job["metadata"]["annotations"]["mpijob-elastic.io/opportunistic-priority-class"] = "spot"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["render", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_render_of_a_job_whose_metadata_is_not_an_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: kubeflow.org/v1\nkind: MPIJob\nmetadata: 5\nspec: {}\n")
    assert main(["render", str(path)]) == 1
    assert "MPIJob ?: metadata: must be an object, got 5" in capsys.readouterr().err


def test_run_with_a_missing_or_broken_kubeconfig_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert fails_with(["run", "--kubeconfig", str(missing)], capsys) == (
        f"mpijob-elastic run: --kubeconfig {missing}: no such file"
    )
    broken = tmp_path / "broken"
    broken.write_text("clusters: [\n")
    assert fails_with(["run", "--kubeconfig", str(broken)], capsys).startswith(
        f"mpijob-elastic run: kubeconfig {broken}: while parsing a flow node"
    )
    empty = tmp_path / "empty"
    empty.write_text("{}\n")
    assert fails_with(["run", "--kubeconfig", str(empty)], capsys) == (
        f"mpijob-elastic run: kubeconfig {empty}: Invalid kube-config file. Expected key "
        f"current-context in {empty}"
    )
    # No kubeconfig anywhere and not in a pod.
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fails_with(["run"], capsys) == (
        "mpijob-elastic run: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config), and "
        "in-cluster: Service host/port is not set."
    )


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = fails_with(
            ["run", "--kubeconfig", kubeconfig(tmp_path), "--health-port", str(port)], capsys
        )
    assert line.startswith("mpijob-elastic run: cannot serve a port: "), line
    assert str(port) in line


@pytest.mark.parametrize("value", ["9223372036854775808", "-1", "nan", "soon"])
def test_duration_flags_are_bounded(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["render", str(SAMPLE), "--default-drain-seconds", value])
    assert exit_.value.code == 2
    assert (
        f"argument --default-drain-seconds: must be a number of seconds from 0 to 31536000, "
        f"got '{value}'"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "bounds"),
    [
        ("--workers", "0", "of at least 1"),
        ("--workers", "\u00b2", "of at least 1"),
        ("--max-workers-per-job", "-5", "of at least 1"),
        ("--health-port", "70000", "from 0 to 65535"),
        ("--metrics-port", "http", "from 0 to 65535"),
    ],
)
def test_whole_number_flags_are_bounded(
    flag: str, value: str, bounds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a whole number {bounds}, got {value!r}" in err
    assert "Traceback" not in err


def test_version_names_the_package_the_commit_when_known_and_python(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    python = platform.python_version()
    # The version is pyproject.toml's, as installed.
    version = tomllib.loads(SAMPLE.parents[2].joinpath("pyproject.toml").read_text())["project"][
        "version"
    ]
    monkeypatch.delenv(build.COMMIT_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"mpijob-elastic {version} (Python {python})\n"
    monkeypatch.setenv(build.COMMIT_ENV, "1a2b3c4d5e6f\n")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert (
        capsys.readouterr().out
        == f"mpijob-elastic {version} (commit 1a2b3c4d5e6f, Python {python})\n"
    )


def test_skipped_namespaces_are_the_system_ones_and_the_controllers_own_unless_told() -> None:
    assert flags.skipped_namespaces(None, {"POD_NAMESPACE": "ops"}) == (
        "kube-system",
        "kube-public",
        "ops",
    )
    # The flag replaces the list; '' empties it.
    assert flags.skipped_namespaces("", {"POD_NAMESPACE": "ops"}) == ()
    assert flags.skipped_namespaces("a,,b", {"POD_NAMESPACE": "ops"}) == ("a", "b")
