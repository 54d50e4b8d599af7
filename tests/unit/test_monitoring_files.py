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
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    assert len(panels) >= 10
    assert all(exprs)
    named = {s for expr in exprs for s in SERIES.findall(expr)}
    assert named <= served(), named - served()
    # Every shipped series has a panel.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", s) for s in named}
    assert set(every_family()) - families == set()


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
    }
    for r in rules:
        named = set(SERIES.findall(r["expr"]))
        assert named, r["alert"]
        assert named <= served(), (r["alert"], named - served())
        assert r["labels"]["severity"] in ("critical", "warning")
        assert r["annotations"]["summary"]
        assert r["annotations"]["description"]
