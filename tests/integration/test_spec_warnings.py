"""What a real API server lets the controller see of a mistaken job (issue 24), and what
the controller says about what it sees.

* This project's CRD serves kubeflow.org/v1 only: a v2beta1 MPIJob cannot be created, so
  the controller never receives one (``render`` refuses it: tests/unit/test_cli.py).
* Unknown fields where the CRD's schema lists the fields (``spec``, a replica spec) are
  pruned by the API server before admission and before any watch: kubectl's default
  (strict) field validation refuses them naming the field; a client that asks for
  warnings only gets a Warning and the field dropped. The controller never sees them.
* Annotations and the keys of ``mpiReplicaSpecs`` are kept: the controller warns about
  them with the ``SpecWarnings`` condition and Event, and clears it once they are fixed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import StartController, wait_for
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")


@pytest.fixture
def job(cluster: Cluster, namespace: str) -> Job:
    return Job(cluster, namespace, "typos")


def create(cluster: Cluster, namespace: str, manifest: dict[str, Any], *flags: str) -> Any:
    return cluster.kubectl(
        "create", "-n", namespace, *flags, "-f", "-", input=json.dumps(manifest), check=False
    )


def test_v2beta1_is_not_served(cluster: Cluster, namespace: str) -> None:
    assert cluster.raw("GET", f"/apis/{names.GROUP}/v2beta1/namespaces/{namespace}/mpijobs") is None
    manifest = elastic_job("v2", 2)
    manifest["apiVersion"] = f"{names.GROUP}/v2beta1"
    proc = create(cluster, namespace, manifest)
    assert proc.returncode != 0
    assert 'no matches for kind "MPIJob" in version "kubeflow.org/v2beta1"' in proc.stderr


def test_fields_in_the_schema_are_pruned_so_only_render_can_warn(
    cluster: Cluster, job: Job
) -> None:
    manifest = elastic_job(job.name, 2)
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]
    worker["replica"] = 3
    worker["maxReplicas"] = 5
    manifest["spec"]["maxReplicas"] = 5
    strict = create(cluster, job.ns, manifest)
    assert strict.returncode != 0
    for field in ("spec.maxReplicas", "spec.mpiReplicaSpecs.Worker.replica"):
        assert f'unknown field "{field}"' in strict.stderr, strict.stderr
    warned = create(cluster, job.ns, manifest, "--validate=warn")
    assert warned.returncode == 0, warned.stderr
    assert 'Warning: unknown field "spec.mpiReplicaSpecs.Worker.maxReplicas"' in warned.stderr
    stored = job.get()
    assert "maxReplicas" not in stored["spec"]
    assert sorted(stored["spec"]["mpiReplicaSpecs"]["Worker"]) == ["replicas", "template"]


def test_the_controller_warns_about_what_it_can_see_and_clears_it(
    cluster: Cluster, job: Job, start_controller: StartController
) -> None:
    start_controller(job.ns)
    manifest = elastic_job(job.name, 2)
    manifest["metadata"]["annotations"]["mpijob-elastic.io/max-replica"] = "4"
    specs = manifest["spec"]["mpiReplicaSpecs"]
    specs["Workers"] = {"replicas": 4, "template": specs["Worker"]["template"]}
    created = create(cluster, job.ns, manifest)
    assert created.returncode == 0, created.stderr
    message = (
        "metadata.annotations[mpijob-elastic.io/max-replica]: unknown annotation, ignored; "
        "did you mean mpijob-elastic.io/max-replicas?; spec.mpiReplicaSpecs.Workers: unknown "
        "replica type, ignored; did you mean Worker?"
    )
    cond = wait_for(
        lambda: (c := job.condition("SpecWarnings")) and c["status"] == "True" and c,
        15,
        "SpecWarnings condition",
    )
    assert (cond["reason"], cond["message"]) == ("SpecWarnings", message)
    wait_for(lambda: ("Warning", "SpecWarnings", message) in job.events(), 15, "SpecWarnings Event")
    # The job runs meanwhile: a warning refuses nothing.
    job.wait_hosts(2)
    job.patch(
        {
            "metadata": {"annotations": {"mpijob-elastic.io/max-replica": None}},
            "spec": {"mpiReplicaSpecs": {"Workers": None}},
        }
    )
    cond = wait_for(
        lambda: (c := job.condition("SpecWarnings")) and c["status"] == "False" and c,
        15,
        "SpecWarnings cleared",
    )
    assert cond["reason"] == "NoWarnings"
    job.wait_event("SpecWarnings")
    assert [e for e in job.events() if e[1] == "SpecWarnings"] == [
        ("Warning", "SpecWarnings", message)
    ]
