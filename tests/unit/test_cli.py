"""`mpijob-elastic render`: every child of a job without a cluster, or the field errors."""

from __future__ import annotations

import platform
import tomllib
from pathlib import Path

import pytest
import yaml

from mpijob_elastic.app import build, leader
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
