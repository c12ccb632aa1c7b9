"""deploy/'s Prometheus alert rules and Grafana dashboard are checked, not trusted: the rules by
``promtool check rules`` when promtool is installed (the dashboard's queries too, as recording
rules), and always, in Python, every metric an expression names against what ``/metrics``
actually exposes (a renamed metric or label must not leave an alert that never fires); the
dashboard against the shape Grafana imports (JSON, a schemaVersion, panels placed on the grid,
each with Prometheus targets)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test.utils import override_settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from tests import factories
from tests.api.test_metrics_latency import _approve_one, _run_three_attempts

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
TOKEN = "scraper-secret-observability-files"
_METRIC = re.compile(r"\bagent_console_[a-z0-9_]+\b")
# The sample names each metric type exposes beside (or instead of) its family's name.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
}
# Labels each family's samples carry, as /metrics writes them (filled by ``exposed``).
_LABELS_IN_EXPR = re.compile(r"(agent_console_[a-z0-9_]+)\{([^}]*)\}")


def _rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(ALERTS.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panel_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


@pytest.fixture
def exposed(db) -> dict[str, set[str]]:
    """Every sample name ``/metrics`` exposes, with the label names of its family, once work
    has run (so that the families of labelled series have samples to read the labels from): an
    operation retried and run, an approval decided and one pending, a refused request."""
    with override_settings(METRICS_TOKEN=TOKEN, APPROVAL_SEAL_KEYS=["seal-key-1"]):
        _run_three_attempts()
        _approve_one()
        owner = factories.agent()
        factories.operation(owner, factories.task(owner), tool="demo.payments.charge",
                            params={"account": "a", "amount_cents": 25000})  # fmt: skip
        assert owner.client().get("/api/v1/operations/op_nope").status_code == 404
        response = APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        labels = {k for s in family.samples for k in s.labels} - {"le"}
        for name in (family.name, *(family.name + s for s in _SUFFIXES.get(family.type, ()))):
            names.setdefault(name, set()).update(labels)
    return names


def _check_expr(expr: str, exposed: dict[str, set[str]], where: str) -> None:
    named = set(_METRIC.findall(expr))
    assert named, f"{where}: names no agent_console metric: {expr}"
    missing = sorted(n for n in named if n not in exposed)
    assert not missing, f"{where}: /metrics exposes no {missing}: {expr}"
    for name, matchers in _LABELS_IN_EXPR.findall(expr):
        used = {m.split("=")[0].strip().rstrip("!~") for m in matchers.split(",") if m.strip()}
        known = exposed[name] | _LABELS_OF.get(name.rsplit("_", 1)[0], set())
        assert used <= known | {"le"}, f"{where}: {name} has no label {used - known}: {expr}"


# Labels of the web's own metrics, which have no sample in a fresh test process.
_LABELS_OF = {
    "agent_console_http_request_duration_seconds": {"route", "method", "code"},
    "agent_console_api_refusals": {"error"},
    "agent_console_budget_refusals": {"route"},
}


def test_every_alert_names_only_metrics_and_labels_that_metrics_exposes(exposed):
    rules = _rules()
    assert len(rules) >= 8
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule
        assert rule["annotations"]["summary"], rule
        _check_expr(rule["expr"], exposed, rule["alert"])
    # What an SRE asked to be told of (issue 40), each by the metric that shows it.
    text = ALERTS.read_text()
    for metric in (
        "agent_console_workers_live",
        "agent_console_outbox_due",
        "agent_console_approval_oldest_pending_seconds",
        'agent_console_operations{status="unresolved"}',
        'code=~"5.."',
    ):
        assert metric in text, metric


def test_the_dashboard_is_one_grafana_imports_and_queries_exposed_metrics(exposed):
    dashboard = _dashboard()
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        where = f"panel {panel['id']} ({panel['title']})"
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}, where
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, where
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{where} overlaps another panel"
        cells |= covered
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            _check_expr(target["expr"], exposed, where)
    # The latency histograms and the build are on it.
    exprs = " ".join(_panel_exprs(dashboard))
    for name in (
        "agent_console_operation_schedule_to_start_seconds_bucket",
        "agent_console_operation_run_seconds_bucket",
        "agent_console_approval_decision_seconds_bucket",
        "agent_console_build_info",
    ):
        assert name in exprs, name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules_and_the_dashboards_queries(tmp_path):
    checked = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The dashboard's queries, as recording rules: promtool parses each one.
    recording = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": expr}
                    for i, expr in enumerate(_panel_exprs(_dashboard()))
                ],
            }
        ]
    }
    queries = tmp_path / "dashboard-queries.yml"
    queries.write_text(yaml.safe_dump(recording))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(queries)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
