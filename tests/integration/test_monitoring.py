"""The shipped monitoring, checked with Prometheus's own tools: the PrometheusRule's groups
pass ``promtool check rules`` and the alert cases of tests/alerts_test.yaml pass ``promtool
test rules``; then a real Prometheus server scrapes a running controller while jobs run,
and every query of the Grafana dashboard returns a series and every rule evaluates.

promtool and the server are built from the Prometheus Go module, pinned and cached by
hack/build-promtool.sh (about 7 minutes for the first, 4 more for the second on this
machine; nothing after that).
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob_elastic.core import names
from mpijob_elastic.machinery import metrics
from tests.cluster import ROOT, Cluster
from tests.controller import StartController, free_port, wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_faults import create, sleeping_pod, wait_refused
from tests.integration.test_leader_election import became_leader, elected, holder, identity
from tests.integration.test_observability import Scrape
from tests.metric_names import families, family, total

RULE = ROOT / "config" / "prometheus" / "prometheusrule.yaml"
DASHBOARD = ROOT / "config" / "grafana" / "mpijob-elastic.json"
ALERT_TESTS = ROOT / "tests" / "alerts_test.yaml"
TRANSITIONS = total(metrics.JOB_TRANSITIONS)
CHANGES = total(metrics.WORKER_CHANGES)
WORKER = re.compile(r"\b[\w-]+-worker-\d+\b")
# Where the panels' results go: docs/operations.md's measured table is copied from it.
FIGURES = ROOT / "e2e" / "out" / "dashboard-values.json"


def shipped_alerts() -> int:
    """How many alerts the shipped PrometheusRule holds: promtool and Prometheus must
    find each."""
    (rule,) = [d for d in yaml.safe_load_all(RULE.read_text()) if d["kind"] == "PrometheusRule"]
    return sum("alert" in r for g in rule["spec"]["groups"] for r in g["rules"])


def built(tool: str) -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-promtool.sh"), tool],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip())


def rules_file(cluster: Cluster, directory: Path) -> Path:
    """The PrometheusRule's groups as `kubectl apply -k config/prometheus` installs them,
    written as the plain rules file Prometheus and promtool read."""
    built = cluster.kubectl("kustomize", str(RULE.parent)).stdout
    (rule,) = [d for d in yaml.safe_load_all(built) if d["kind"] == "PrometheusRule"]
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (f"{panel['title']} / {target.get('legendFormat') or target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())  # a row queries nothing
    ]


def test_promtool_checks_and_tests_the_rules(cluster: Cluster, tmp_path: Path) -> None:
    promtool = built("promtool")
    rules = rules_file(cluster, tmp_path)
    checked = subprocess.run(
        [promtool, "check", "rules", rules], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {shipped_alerts()} rules found" in checked.stdout
    (tmp_path / "alerts_test.yaml").write_text(ALERT_TESTS.read_text())
    tested = subprocess.run(
        [promtool, "test", "rules", tmp_path / "alerts_test.yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert of the rule has cases.
    alerts = {r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]}
    for alert in alerts:
        assert f"alertname: {alert}" in ALERT_TESTS.read_text(), alert


class Prometheus:
    """A Prometheus server scraping one controller every second, evaluating the rules."""

    def __init__(self, binary: Path, directory: Path, target: str, token: str, rules: Path) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [scrape_job(target, token)],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, 30, "Prometheus ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def scrape_job(target: str, token: str) -> dict[str, Any]:
    """How the test's Prometheus scrapes the controller: over TLS with the bearer token of
    a ServiceAccount bound to the shipped metrics-reader role, as the ServiceMonitor does
    (the controller's certificate is its own, self-signed)."""
    return {
        "job_name": "mpijob-elastic",
        "scheme": "https",
        "tls_config": {"insecure_skip_verify": True},
        "authorization": {"type": "Bearer", "credentials": token},
        "static_configs": [{"targets": [target]}],
    }


@pytest.fixture
def prometheus_server() -> Iterator[Any]:
    servers: list[Prometheus] = []
    binary = built("prometheus")

    def start(directory: Path, target: str, token: str, rules: Path) -> Prometheus:
        servers.append(Prometheus(binary, directory, target, token, rules))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def run_jobs(cluster: Cluster, namespace: str) -> tuple[Job, Job, Job]:
    """A job that grows, shrinks (two drains), loses a worker (retired and replaced) and
    succeeds; one whose worker name someone else holds (its writes refused); one whose pod
    template the API server rejects."""
    job = Job(cluster, namespace, "watched")
    job.create(elastic_job(job.name, 2))
    job.wait_hosts(2)
    job.set_workers(3)
    job.wait_hosts(3)
    job.set_workers(1)
    job.wait_hosts(1)
    wait_for(lambda: len(job.workers()) == 1, 30, "drained workers deleted")
    (survivor,) = job.workers()
    cluster.kubectl("delete", "pod", survivor, "-n", namespace, "--wait=false")
    wait_for(
        lambda: (hosts := job.hosts()) and not hosts[0].startswith(f"{survivor}:"),
        30,
        "a replacement listed",
    )
    held = Job(cluster, namespace, "held")
    create(cluster, namespace, sleeping_pod(names.worker_name(held.name, 0)))
    held.create(elastic_job(held.name, 1))
    wait_refused(held, "AlreadyExists", "worker name skipped")
    bad = Job(cluster, namespace, "rejected")
    manifest = elastic_job(bad.name, 1)
    manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = ""
    bad.create(manifest)
    wait_for(lambda: (c := bad.condition("InvalidSpec")) and c["status"] == "True", 15, "refusal")
    wait_for(lambda: job.pods(names.ROLE_LAUNCHER), 10, "launcher")
    cluster.kubectl(
        "annotate",
        "pod",
        names.launcher_name(job.name),
        "-n",
        namespace,
        "kwok.mpijob-elastic.io/exit-code=0",
    )
    wait_for(lambda: (c := job.condition("Succeeded")) and c["status"] == "True", 15, "Succeeded")
    return job, held, bad


def named(jobs: tuple[Job, ...], reason: str) -> int:
    """The workers the jobs' Events of this reason name."""
    return sum(
        len(WORKER.findall(message)) for j in jobs for _, r, message in j.events() if r == reason
    )


@pytest.mark.usefixtures("crd")
def test_dashboard_queries_and_rules_on_a_scraped_controller(
    cluster: Cluster,
    namespace: str,
    start_controller: StartController,
    prometheus_server: Any,
    tmp_path: Path,
    metrics_token: str,
) -> None:
    port = free_port()
    start_controller(namespace, args=("--metrics-port", str(port)))
    prometheus = prometheus_server(
        tmp_path, f"127.0.0.1:{port}", metrics_token, rules_file(cluster, tmp_path)
    )
    # Its first scrape comes about 5 s after start (target discovery's first update): the
    # counters' values before the jobs must be in it, for increase() to see them move.
    wait_for(lambda: prometheus.query("up == 1"), 30, "Prometheus's first scrape")

    jobs = run_jobs(cluster, namespace)
    job, _, bad = jobs

    # The counters moved as the jobs did, in the controller's own /metrics.
    scrape = Scrape(port, metrics_token)
    assert scrape.value(TRANSITIONS, transition="created") == 3
    assert scrape.value(TRANSITIONS, transition="succeeded") == 1
    assert scrape.value(TRANSITIONS, transition="failed") == 0
    # The hand-deleted worker of the first job: retired once, and replaced (a scale-out
    # whose turn was cut short by a conflict after its ConfigMap write is reported as a
    # replacement too, by the next turn: docs/operations.md, "What the counters count")...
    wait_for(
        lambda: named((job,), "WorkerRetired") == 1 and named((job,), "WorkerReplaced") >= 1,
        30,
        "the Events of the retirement and its replacement",
    )
    assert named((job,), "WorkerRetired") == 1

    # ...and the counters count what the Events of all three jobs say (sent in the
    # background: the last may reach the cluster after the scrape).
    def counted() -> list[tuple[float, int]]:
        now = Scrape(port, metrics_token)
        return [
            (now.value(CHANGES, change=change), named(jobs, reason))
            for change, reason in (("retired", "WorkerRetired"), ("replaced", "WorkerReplaced"))
        ]

    wait_for(lambda: all(c == n for c, n in counted()), 30, "the counters to match the Events")
    # 3 -> 1: two workers drained, each either after its ranks left or at the deadline.
    assert (
        scrape.value(CHANGES, change="drained") + scrape.value(CHANGES, change="drain_timed_out")
        == 2
    )
    assert scrape.value(family(metrics.IS_LEADER)) == 1
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert scrape.value(family(metrics.BUILD_INFO), version=version) == 1
    held_refused = {"namespace": namespace, "type": "WriteRefused", "reason": "AlreadyExists"}
    conditions, _, _ = families(metrics.JOB_DETAILS)
    assert scrape.value(conditions, **held_refused) == 1

    # Prometheus has scraped all of it...
    wait_for(
        lambda: prometheus.query(f'{TRANSITIONS}{{transition="succeeded"}} == 1'),
        30,
        "Prometheus to scrape the succeeded job",
    )
    # ...and every panel's query returns a series.
    values: dict[str, dict[str, Any]] = {}
    for title, expr in panel_queries():
        # A rate needs two samples of a series: an api_errors_total series is made at its
        # first error, so it may take the next scrape.
        result = wait_for(partial(prometheus.query, expr), 10, f"panel {title}: {expr}")
        series = sorted(result, key=lambda r: sorted(r["metric"].items()))
        values[title] = {"expr": expr, "result": [(r["metric"], r["value"][1]) for r in series]}
        shown = ", ".join(
            f"{' '.join(v for k, v in labels.items() if k not in ('job', 'instance'))}={value}"
            for labels, value in values[title]["result"]
        )
        print(f"FIGURE panel {title}: {shown}")
    # The row "Queue" (Kueue seen from outside) answers too, with no job in a queue here.
    assert {title.split(" / ")[0] for title in values} >= {
        "Admission wait",
        "Evictions by reason",
        "Workers above admission",
    }
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(values, indent=2))

    # Every rule evaluates without error on the real series; the refused writes match
    # (pending: they must last 5 minutes to fire), a drain that ran out pages at once (on
    # KWOK no rank reports its leaving unless a test runs the launcher's shells), and a
    # leader is there.
    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if all(r["lastEvaluation"] > "2000" for r in rules) else []

    rules = {r["name"]: r for r in wait_for(evaluated, 10, "the rules evaluated")}
    assert len(rules) == shipped_alerts()
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
    assert rules["MPIJobElasticNoLeader"]["state"] == "inactive"
    assert rules["MPIJobAboveAdmission"]["state"] == "inactive"
    # The job whose pod template is rejected has no worker: below its minimum (pending:
    # 10 minutes to fire).
    expected = {("MPIJobWritesRefused", "pending"), ("MPIJobBelowMinimum", "pending")}
    if scrape.value(CHANGES, change="drain_timed_out"):
        expected.add(("MPIJobDrainsTimingOut", "firing"))

    def alerts() -> set[tuple[str, str]]:
        found = prometheus.api("alerts")["alerts"]
        return {(a["labels"]["alertname"], a["state"]) for a in found}

    wait_for(lambda: alerts() >= expected, 10, f"alerts {expected}")
    assert alerts() == expected

    def below() -> set[str]:
        found = prometheus.api("alerts")["alerts"]
        return {
            a["labels"]["mpijob"] for a in found if a["labels"]["alertname"] == "MPIJobBelowMinimum"
        }

    # The rejected job for good; the held one too while its first worker (under the next
    # free name) was not yet listed.
    wait_for(lambda: bad.name in below(), 10, "the rejected job below its minimum")
    assert below() <= {bad.name, "held"}
    (refused,) = [
        a
        for a in prometheus.api("alerts")["alerts"]
        if a["labels"]["alertname"] == "MPIJobWritesRefused"
    ]
    assert refused["labels"]["namespace"] == namespace


@pytest.mark.usefixtures("crd")
def test_is_leader_is_1_on_the_lease_holder_only_and_moves_with_it(
    cluster: Cluster, namespace: str, start_controller: StartController, metrics_token: str
) -> None:
    ports = [free_port(), free_port()]
    # /metrics on the health port: one server per replica.
    procs = [
        start_controller(namespace, args=(*elected(namespace, p), "--metrics-port", str(p)))
        for p in ports
    ]
    ids = [identity(p) for p in procs]
    lead = wait_for(lambda: holder(cluster, namespace) in ids and holder(cluster, namespace))
    first = ids.index(lead)
    wait_for(lambda: became_leader(procs[first]), what="the holder to log that it leads")
    leading = family(metrics.IS_LEADER)
    assert [Scrape(p, metrics_token).value(leading) for p in ports] == [
        float(i == first) for i in range(2)
    ]

    procs[first].stop()
    wait_for(lambda: became_leader(procs[1 - first]), 60, "the standby to take the lease")
    assert Scrape(ports[1 - first], metrics_token).value(leading) == 1
