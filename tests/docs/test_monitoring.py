"""docs/monitoring/: the Grafana dashboard and the alert rules use only metric names a
real gatewayd exports (scraped from /metrics, with a bridge and a rule so their families
have series), the rules pass ``promtool check rules`` and their unit tests
(``promtool test rules tests/docs/alerts_test.yml``), and the checkers refuse broken input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.admin.gatewayd import Gatewayd, free_port

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "docs" / "monitoring"
DASHBOARD = KIT / "grafana-dashboard.json"
ALERTS = KIT / "alerts.yml"
ALERT_TESTS = Path(__file__).resolve().parent / "alerts_test.yml"
# series Prometheus makes itself, not gatewayd
PROMETHEUS_OWN = {"up"}
PROMQL_WORDS = {"sum", "by", "rate", "increase", "delta", "deriv", "and", "or", "unless",
                "label_values", "instance", "max", "min", "avg", "count", "without", "on",
                "ignoring", "group_left", "group_right", "bool", "offset", "humanizePercentage"}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers not inside label matchers or
    strings, not functions, keywords or label names in by()/without()."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    names = set()
    for m in _IDENT.finditer(expr):
        word = m.group(0)
        after = expr[m.end():].lstrip()
        if word in PROMQL_WORDS or after.startswith("("):
            continue
        names.add(word)
    return names


def dashboard_names(dashboard: dict[str, object]) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        for target in panel.get("targets", []):
            names |= metric_names(target["expr"])
    for var in dashboard.get("templating", {}).get("list", []):  # type: ignore[attr-defined]
        if var.get("type") == "query":
            names |= metric_names(var["query"].replace("label_values(", "(").split(",")[0])
    return names


def alert_names(rules: dict[str, object]) -> set[str]:
    names: set[str] = set()
    for group in rules["groups"]:  # type: ignore[attr-defined]
        for rule in group["rules"]:
            names |= metric_names(rule["expr"])
    return names


def unknown(names: set[str], exported: set[str]) -> set[str]:
    return {n for n in names if n not in exported and n not in PROMETHEUS_OWN}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every series name a real gatewayd exports (families without samples count with
    the names their samples would have)."""
    gw = Gatewayd(tmp_path_factory.mktemp("metrics"), {
        "GATEWAY_BRIDGES__MQTT__CLOUD__SERVER": f"127.0.0.1:{free_port()}",  # nobody there
        "GATEWAY_BRIDGES__MQTT__CLOUD__FORWARDS": '[{local = "up/#"}]'})
    gw.start()
    try:
        status, _, _ = gw.http("POST", "/api/v5/rules", body={
            "id": "hot", "sql": 'SELECT * FROM "t/#"',
            "actions": [{"function": "republish", "args": {"topic": "x"}}]})
        assert status == 201
        status, _, body = gw.http("GET", "/metrics", auth=False)
        assert status == 200
    finally:
        gw.stop()
    names: set[str] = set()
    for family in text_string_to_metric_families(body.decode()):
        names |= {s.name for s in family.samples}
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    yield names


def test_metric_name_extraction() -> None:
    expr = ('sum by (instance) (rate(gateway_messages_received_total{instance=~"$x"}[1m]))'
            ' / (gateway_listener_max_connections > 0) or up{job="gateway"} == 0')
    assert metric_names(expr) == {"gateway_messages_received_total",
                                  "gateway_listener_max_connections", "up"}


def test_dashboard_and_alerts_use_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = dashboard_names(dashboard)
    assert len(used) >= 20 and "gateway_cluster_peer_up" in used
    assert unknown(used, exported) == set()
    rules = yaml.safe_load(ALERTS.read_text())
    used_by_alerts = alert_names(rules)
    assert {"gateway_cluster_peer_up", "gateway_rule_failed_total",
            "gateway_bridge_queue_messages", "gateway_listener_max_connections"} <= used_by_alerts
    assert unknown(used_by_alerts, exported) == set()
    # the check catches a name gatewayd does not export
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][0]["targets"][0]["expr"] = "sum(gateway_connections_total)"
    assert unknown(dashboard_names(broken), exported) == {"gateway_connections_total"}
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Messages per second", "Cluster links", "Bridge outbox"} <= titles


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 7 rules found" in check.stdout
    unit = subprocess.run([promtool, "test", "rules", str(ALERT_TESTS)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    # promtool refuses a broken expression, and the unit tests catch a wrong threshold
    bad = tmp_path / "bad.yml"
    bad.write_text(ALERTS.read_text().replace("gateway_cluster_peer_up == 0",
                                              "gateway_cluster_peer_up == == 0"))
    assert subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True,
                          timeout=60, check=False).returncode != 0
    loose = tmp_path / "docs" / "monitoring"
    loose.mkdir(parents=True)
    (loose / "alerts.yml").write_text(ALERTS.read_text().replace("> 0.8", "> 0.95"))
    tests_dir = tmp_path / "tests" / "docs"
    tests_dir.mkdir(parents=True)
    shutil.copy(ALERT_TESTS, tests_dir / "alerts_test.yml")
    failed = subprocess.run([promtool, "test", "rules", str(tests_dir / "alerts_test.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode != 0
