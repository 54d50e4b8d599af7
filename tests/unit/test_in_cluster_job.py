"""The kind-only transform of the sample job: mock images in, GPUs out, still a valid job."""

from pathlib import Path

import yaml

from e2e.harness import DRIVER_ARGS, STOP_FILE_IN_POD, in_cluster_job, mock_driver_args
from e2e.mockhorovod.cli import parse_args
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.spec.parse import parse

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "elastic-mpijob.yaml"


def test_sample_runs_the_mock_images_without_gpus() -> None:
    job = in_cluster_job(yaml.safe_load(SAMPLE.read_text()), "launcher:e2e", "worker:e2e")
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["image"] == "launcher:e2e"
    assert launcher["command"][0] == "horovodrun"
    assert launcher["command"][-2:] == ["--stop-file", STOP_FILE_IN_POD]
    assert "resources" not in launcher
    for worker in specs["Worker"]["template"]["spec"]["containers"]:
        assert worker["image"] == "worker:e2e"
        assert "resources" not in worker
        assert "command" not in worker
    spec = parse(job, 30)
    assert spec.worker.replicas == 2
    # Command-less, so the real workers run the default command, which keeps exec'd ranks
    # alive through a deletion's grace period: what the e2e walk's graceful delete needs.
    (worker,) = render_pods.worker_pod(spec, 0)["spec"]["containers"]
    assert worker["command"] == render_pods.WORKER_COMMAND


def test_the_driver_gets_the_size_flags_a_test_asks_for() -> None:
    """e2e/test_relocation.py runs 3 workers with --min-np 1 or 2 on kind."""
    flags = ("-np", "3", "--min-np", "2", "--max-np", "5")
    job = in_cluster_job(yaml.safe_load(SAMPLE.read_text()), "launcher:e2e", "worker:e2e", flags)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][: len(flags) + 1] == ["horovodrun", *flags]
    assert launcher["command"][-2:] == ["--stop-file", STOP_FILE_IN_POD]


def test_a_test_asks_for_a_slow_training_without_the_commit_hook() -> None:
    flags = mock_driver_args(rank_start_seconds=20, commit_marker=False)
    assert flags == (*DRIVER_ARGS, "--rank-start-seconds", "20", "--no-commit-marker")
    job = in_cluster_job(yaml.safe_load(SAMPLE.read_text()), "launcher:e2e", "worker:e2e", flags)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    config = parse_args(launcher["command"][1:])
    assert (config.rank_start_seconds, config.commit_marker) == (20.0, False)
    assert mock_driver_args() == DRIVER_ARGS  # the driver's defaults: 2 s, with the hook
    default = parse_args(list(DRIVER_ARGS))
    assert (default.rank_start_seconds, default.commit_marker) == (2.0, True)
    assert mock_driver_args(("-np", "3"), commit_marker=True) == ("-np", "3", "--commit-marker")
