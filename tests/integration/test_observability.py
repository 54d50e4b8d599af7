"""What an operator sees of a running controller: /metrics, its log lines, and
``kubectl get mpijob``, for a job driven through a scale-out and a scale-in."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpijob_elastic.core import names
from tests.cluster import Cluster
from tests.controller import StartController, free_port, wait_for
from tests.integration.test_controller import Job, elastic_job

pytestmark = pytest.mark.usefixtures("crd")

# The series docs/operations.md lists, by family name (a counter's samples end in _total).
SERIES = (
    "mpijob_elastic_reconciles",
    "mpijob_elastic_reconcile_duration_seconds",
    "mpijob_elastic_queue_depth",
    "mpijob_elastic_queue_wait_seconds",
    "mpijob_elastic_watch_restarts",
    "mpijob_elastic_relists",
    "mpijob_elastic_api_errors",
    "mpijob_elastic_jobs",
    "mpijob_elastic_scale_operations",
    "mpijob_elastic_drain_duration_seconds",
    "mpijob_elastic_running_to_listed_seconds",
)


class Scrape:
    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            self.text = answer.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}

    def value(self, sample: str, **labels: str) -> float:
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0

    def count(self, histogram: str) -> float:
        return self.value(f"{histogram}_count")


def columns(cluster: Cluster, job: Job) -> dict[str, str]:
    """``kubectl get mpijob``'s table, header -> cell, as a user sees it."""
    out = cluster.kubectl("get", "mpijob", job.name, "-n", job.ns).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    # AGE is the last column and one word ("12s"); every other cell is one word too, or
    # "<none>" for a missing value.
    return dict(zip(header, row, strict=True))


def entries(logs: list[dict[str, Any]], msg: str, job: str) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("msg") == msg and e.get("job") == job]


def test_scale_out_and_in_seen_in_metrics_logs_and_kubectl(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    job = Job(cluster, namespace, "observed")
    port = free_port()
    controller = start_controller(namespace, args=("--metrics-port", str(port)))
    # A drain long enough to see it in kubectl, short enough for the test.
    job.create(elastic_job(job.name, 2, drain="8"))
    job.wait_hosts(2)
    job.set_workers(4)
    job.wait_hosts(4)
    steady = {"NAME": job.name, "DESIRED": "4", "READY": "4", "DRAINING": "0", "MIN": "1"}
    steady |= {"MAX": "5", "STATE": "Running"}
    wait_for(
        lambda: columns(cluster, job) == {**steady, "AGE": columns(cluster, job)["AGE"]},
        30,
        "kubectl get mpijob to show the running job",
    )

    job.set_workers(1)
    job.wait_hosts(1)
    draining = {"DESIRED": "1", "READY": "1", "DRAINING": "3", "MIN": "1", "MAX": "5"}
    wait_for(
        lambda: {k: columns(cluster, job)[k] for k in draining} == draining,
        8,
        "kubectl get mpijob to show three workers draining",
    )
    # Scaling down is a True condition too, but Running comes later in the lifecycle.
    assert columns(cluster, job)["STATE"] == "Running"
    wait_for(lambda: job.workers() == ["observed-worker-0"], 30, "drained workers deleted")

    # A pod template the API server refuses: one API error of a known code.
    bad = Job(cluster, namespace, "refused")
    manifest = elastic_job(bad.name, 1)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = ""
    bad.create(manifest)
    wait_for(lambda: (c := bad.condition("InvalidSpec")) and c["status"] == "True", 15, "refusal")

    scrape = Scrape(port)
    for family in SERIES:
        assert family in scrape.families, f"{family} missing from /metrics"
    assert scrape.value("mpijob_elastic_reconciles_total", result="success") > 0
    assert scrape.value("mpijob_elastic_reconciles_total", result="error") > 0  # the refusal
    assert scrape.count("mpijob_elastic_reconcile_duration_seconds") > 0
    assert scrape.count("mpijob_elastic_queue_wait_seconds") > 0
    assert scrape.value("mpijob_elastic_queue_depth") >= 0
    for kind in (names.KIND, "Pod", "ConfigMap", "Node"):
        assert scrape.value("mpijob_elastic_relists_total", kind=kind) >= 1, kind
    assert (
        scrape.value("mpijob_elastic_api_errors_total", code="422", verb="create", kind="Pod") >= 1
    )
    # 0 -> 2 and 2 -> 4 are scale-outs; 4 -> 1 the scale-in.
    assert scrape.value("mpijob_elastic_scale_operations_total", direction="out") >= 2
    assert scrape.value("mpijob_elastic_scale_operations_total", direction="in") == 1
    # Each of the three victims: marked, then deleted.
    assert scrape.count("mpijob_elastic_drain_duration_seconds") == 3
    assert scrape.value("mpijob_elastic_drain_duration_seconds_sum") > 0
    # Every worker turned Running while the controller watched, and was listed.
    assert scrape.count("mpijob_elastic_running_to_listed_seconds") >= 4
    assert scrape.value("mpijob_elastic_jobs", namespace=namespace, state="Running") == 1
    listed = scrape.count("mpijob_elastic_running_to_listed_seconds")
    mean = scrape.value("mpijob_elastic_running_to_listed_seconds_sum") / listed
    drained = scrape.value("mpijob_elastic_drain_duration_seconds_sum") / 3
    print(f"FIGURE running->listed mean {mean:.3f}s over {listed:.0f}; drain mean {drained:.1f}s")

    # The scale-in, step by step in the log, every line naming the job.
    logs = controller.log_entries()
    key = f"{namespace}/{job.name}"
    victims = {f"{job.name}-worker-{i}" for i in (1, 2, 3)}
    assert {e["pod"] for e in entries(logs, "marked draining", key)} == victims
    assert {e["pod"] for e in entries(logs, "deleted pod", key)} >= victims
    rewrites = entries(logs, "host list rewritten", key)
    assert any(set(e["removed"].split(",")) == victims and e["added"] == "" for e in rewrites)
    assert any(e["added"] for e in rewrites)  # the scale-out's
    assert entries(logs, "launcher refreshed", key)
    # No line about a job names it without its namespace.
    for entry in logs:
        if "job" in entry:
            assert "/" in str(entry["job"]), entry
