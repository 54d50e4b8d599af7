"""Issue 31 §1 on the real local cluster: what a tenant can write with the rights it has
(its launcher's report, its job spec, a ConfigMap in its namespace) parses to a value or a
refusal naming the field, so the job can still be stopped and /metrics still answers.

Each attack is the issue's own, and one found on the way: a job nested deeper than
Python's decoder goes, which the API server stores. Before the inputs were read totally
(core/numbers.py), the first left a suspended job's pods running for as long as the
launcher ran, the second gave the job no condition and no Event, and turned the scrape it
was part of into a 500.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpijob_elastic.core import names
from tests import hostile
from tests.cluster import Cluster
from tests.controller import StartController, free_port, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_membership import running_launcher
from tests.integration.test_observability import Scrape

pytestmark = pytest.mark.usefixtures("crd")


def running(cluster: Cluster, namespace: str, name: str) -> Job:
    """A job of 2 workers, listed, its launcher running."""
    job = Job(cluster, namespace, name)
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    running_launcher(job)
    return job


def stops_when_suspended(job: Job) -> None:
    job.patch({"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: not job.pods() and not job.pods(names.ROLE_LAUNCHER), 30, "every pod gone")
    wait_for(lambda: (job.condition("Suspended") or {}).get("status") == "True", 15, "Suspended")


def test_a_launchers_report_out_of_range_does_not_freeze_its_job(
    cluster: Cluster, namespace: str, start_controller: StartController, tmp_path: Path
) -> None:
    start_controller(namespace)
    job = running(cluster, namespace, "frozen")
    hostile.report_out_of_range(cluster, namespace, job.name, tmp_path)
    stops_when_suspended(job)
    assert (job.condition("TurnFailed") or {}).get("status") != "True"


def test_a_state_annotation_of_5000_digits_does_not_freeze_its_job(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    start_controller(namespace)
    job = running(cluster, namespace, "digits")
    hostile.state_of_5000_digits(cluster, namespace, job.name)
    stops_when_suspended(job)


def test_a_quantity_out_of_range_is_refused_by_name_and_metrics_answer(
    cluster: Cluster, namespace: str, start_controller: StartController, metrics_token: str
) -> None:
    port = free_port()
    start_controller(namespace, args=("--metrics-port", str(port)))
    job = Job(cluster, namespace, "huge")
    manifest = elastic_job(job.name, 2)
    # The CRD keeps schedulingPolicy as written and the admission policy does not look.
    huge = {"minResources": {"cpu": "1e99999999999999"}}
    manifest["spec"].setdefault("runPolicy", {})["schedulingPolicy"] = huge
    job.create(manifest)
    message = job.wait_event("InvalidSpec", "Warning", "minResources.cpu")
    assert "spec.runPolicy.schedulingPolicy.minResources.cpu" in message, message
    # A job beside it runs, and the scrape that reads both answers.
    beside = Job(cluster, namespace, "beside")
    beside.create(elastic_job(beside.name, 1))
    beside.wait_hosts(1)
    assert Scrape(port, metrics_token).value("mpijob_elastic_reconciles_total", result="success")


def test_a_job_nested_deeper_than_the_decoder_goes_stops_no_other_job(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    # The API server stores 10,000 levels in a pod template (the CRD keeps it unpruned);
    # Python's decoder gives up near 1,000. Before machinery/decoding.py, every relist of
    # the namespace's MPIJobs failed on this one, and no job there was reconciled.
    deep = Job(cluster, namespace, "deep")
    manifest = elastic_job(deep.name, 1)
    value: object = "leaf"
    for _ in range(9000):
        value = {"x": value}
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["deep"] = value
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(30_000)
    try:
        deep.create(manifest)
    finally:
        sys.setrecursionlimit(limit)
    start_controller(namespace)
    beside = Job(cluster, namespace, "beside")
    beside.create(elastic_job(beside.name, 2))
    beside.wait_hosts(2)
    field = "spec.mpiReplicaSpecs.Worker.template: must not nest more than 64 levels"
    deep.wait_event("InvalidSpec", "Warning", field)
