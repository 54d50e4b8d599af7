"""`mpijob-elastic render`: every child of a job without a cluster, or the field errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mpijob_elastic.cli import main

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "elastic-mpijob.yaml"


def test_render_prints_every_child(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(SAMPLE)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("ConfigMap", "elastic-horovod-config"),
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
