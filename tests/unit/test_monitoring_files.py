"""The dashboard and the alerts name only series the controller serves, so a renamed series
fails here instead of leaving an empty panel or an alert that can never fire."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

from tests.metric_names import every_family

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "mpijob-elastic.json"
RULE = ROOT / "config" / "prometheus" / "prometheusrule.yaml"
SERIES = re.compile(r"\bmpijob_elastic_\w+")


def served() -> set[str]:
    """Every sample name the registry's families are scraped as."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    types = {m.name: m.type for m in REGISTRY.collect()}
    return {
        f"{name}{suffix}" for name in every_family() for suffix in suffixes.get(types[name], ("",))
    }


def test_every_panel_queries_series_the_controller_serves() -> None:
    # Rows (Grafana's "row" panels) group the panels after them and query nothing.
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    assert len(panels) >= 10
    assert all(exprs)
    named = {s for expr in exprs for s in SERIES.findall(expr)}
    assert named <= served(), named - served()
    # Every shipped series has a panel.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", s) for s in named}
    assert set(every_family()) - families == set()


def test_the_queue_row_shows_kueue_seen_from_outside() -> None:
    """The row "Queue" holds a panel for each of the three Kueue series, below it and
    before any other row."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (row,) = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Queue"]
    after = panels[row + 1 :]
    end = next((i for i, p in enumerate(after) if p["type"] == "row"), len(after))
    shown = {s for p in after[:end] for t in p["targets"] for s in SERIES.findall(t["expr"])}
    queue = {
        "mpijob_elastic_queue_admission_wait_seconds_bucket",
        "mpijob_elastic_queue_evictions_total",
        "mpijob_elastic_queue_workers_above_admission",
    }
    assert shown == queue
    assert all(p["gridPos"]["y"] > panels[row]["gridPos"]["y"] for p in after[:end])


def test_every_alert_reads_series_the_controller_serves() -> None:
    rule = yaml.safe_load(RULE.read_text())
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == {
        "MPIJobElasticNoLeader",
        "MPIJobBelowMinimum",
        "MPIJobWaitingForCapacity",
        "MPIJobDrainsTimingOut",
        "MPIJobWritesRefused",
        "MPIJobTurnsFailing",
        "MPIJobElasticWritesForbidden",
        "MPIJobAboveAdmission",
    }
    for r in rules:
        named = set(SERIES.findall(r["expr"]))
        assert named, r["alert"]
        assert named <= served(), (r["alert"], named - served())
        assert r["labels"]["severity"] in ("critical", "warning")
        assert r["annotations"]["summary"]
        assert r["annotations"]["description"]
