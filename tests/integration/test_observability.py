"""What an operator sees of a running controller: /metrics, its log lines, and
``kubectl get mpijob``, for a job driven through a scale-out and a scale-in."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpijob_elastic.core import names
from mpijob_elastic.machinery import metrics
from tests.cluster import Cluster
from tests.controller import StartController, free_port, scraper_tls, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.metric_names import every_family, family, total

pytestmark = pytest.mark.usefixtures("crd")

# Every series the controller registers (docs/operations.md lists them).
SERIES = every_family()
RECONCILES = total(metrics.RECONCILES)
RELISTS = total(metrics.RELISTS)
API_ERRORS = total(metrics.API_ERRORS)
SCALE_OPERATIONS = total(metrics.SCALE_OPERATIONS)
DRAINS = family(metrics.DRAIN_SECONDS)
LISTED = family(metrics.RUNNING_TO_LISTED_SECONDS)


class Scrape:
    def __init__(self, port: int, token: str) -> None:
        """/metrics as a Prometheus holding ``token`` reads it (metrics_guard.py)."""
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=5, context=scraper_tls()) as answer:
            self.text = answer.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}

    def value(self, sample: str, **labels: str) -> float:
        for found in self.families.values():
            for s in found.samples:
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
    cluster: Cluster, namespace: str, start_controller: StartController, metrics_token: str
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

    scrape = Scrape(port, metrics_token)
    for series in SERIES:
        assert series in scrape.families, f"{series} missing from /metrics"
    assert scrape.value(RECONCILES, result="success") > 0
    assert scrape.value(RECONCILES, result="error") > 0  # the refusal
    assert scrape.count(family(metrics.RECONCILE_SECONDS)) > 0
    assert scrape.count(family(metrics.QUEUE_WAIT_SECONDS)) > 0
    assert scrape.value(family(metrics.QUEUE_DEPTH)) >= 0
    for kind in (names.KIND, "Pod", "ConfigMap", "Node"):
        assert scrape.value(RELISTS, kind=kind) >= 1, kind
    assert scrape.value(API_ERRORS, code="422", verb="create", kind="Pod") >= 1
    # 0 -> 2 and 2 -> 4 are scale-outs; 4 -> 1 the scale-in.
    assert scrape.value(SCALE_OPERATIONS, direction="out") >= 2
    assert scrape.value(SCALE_OPERATIONS, direction="in") == 1
    # Each of the three victims: marked, then deleted.
    assert scrape.count(DRAINS) == 3
    assert scrape.value(f"{DRAINS}_sum") > 0
    # Every worker turned Running while the controller watched, and was listed.
    assert scrape.count(LISTED) >= 4
    assert scrape.value(family(metrics.JOBS), namespace=namespace, state="Running") == 1
    listed = scrape.count(LISTED)
    mean = scrape.value(f"{LISTED}_sum") / listed
    drained = scrape.value(f"{DRAINS}_sum") / 3
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


def test_a_controller_tells_where_it_waits_when_signalled(
    cluster: Cluster, namespace: str, start_controller: StartController
) -> None:
    """SIGUSR2 logs each task with the awaits it is suspended in, SIGUSR1 every thread's
    stack (docs/operations.md, "A controller that seems stuck"); the controller goes on."""
    proc = start_controller(namespace)
    assert proc.proc is not None
    before = len(proc.logs())
    proc.dump_stacks()
    tasks = wait_for(
        lambda: [e for e in proc.log_entries() if e.get("msg") == "task"], 10, "task lines"
    )
    # The reconcile workers wait on the work queue for a job to come.
    awaiting = [" ".join(e["awaits"]) for e in tasks]
    assert any("workqueue.py" in a for a in awaiting), awaiting
    assert all(e["level"] == "warning" and e["task"] for e in tasks), tasks
    dumped = proc.logs()[before:]
    assert "Current thread" in dumped, dumped[-2000:]
    assert "cli.py" in dumped, dumped[-2000:]
    assert proc.proc.poll() is None
    Job(cluster, namespace, "after-dump").create(elastic_job("after-dump", 1))
    Job(cluster, namespace, "after-dump").wait_hosts(1)
