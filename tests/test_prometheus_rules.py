"""The Prometheus alert rules and the Grafana dashboard under deploy/: Prometheus' own tool checks
the rules and runs their unit tests (each alert fires on its series, not before its time), and
every metric either names is one /metrics exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from evidence.models import Call
from receipts import protocol
from tests.helpers import PROJECT

RULES = PROJECT / "deploy" / "prometheus" / "callproof-alerts.yml"
RULE_TESTS = PROJECT / "deploy" / "prometheus" / "callproof-alerts.test.yml"
DASHBOARD = PROJECT / "deploy" / "grafana" / "callproof.json"
METRIC = re.compile(r"\bcallproof_[a-z_]+\b")
ALERTS = {
    "CallproofCallsInDoubt",
    "CallproofHostSilent",
    "CallproofDecisionUndelivered",
    "CallproofTaskQueueStuck",
    "CallproofRunsNotArriving",
    "CallproofShipperRefused",
    "CallproofHostClockOff",
}

# Debian's prometheus package has promtool; `make test-packages` (CI's second step) installs it.
promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed here (make test-packages installs prometheus)"
)


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def exported_names(client) -> set[str]:
    """Every series name /metrics exports, a counter's with its ``_total``; a family with no row
    yet (no host watching) still says its name."""
    response = client.get("/metrics")
    assert response.status_code == 200
    names = set()
    for family in text_string_to_metric_families(response.content.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_the_rules_alert_on_the_seven_things_an_operator_is_paged_for():
    assert set(rule_expressions()) == ALERTS


@promtool
def test_promtool_checks_the_rules():
    checked = run_promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


@promtool
def test_each_alert_fires_in_promtools_unit_tests():
    tested = run_promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a case where it fires, and one where it does not yet.
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"][0]["alert_rule_test"]
    assert {case["alertname"] for case in cases if case["exp_alerts"]} == ALERTS
    assert {case["alertname"] for case in cases if not case["exp_alerts"]} == ALERTS


@promtool
def test_promtool_fails_a_rule_whose_alert_does_not_fire(tmp_path):
    """The unit tests can fail: with a threshold raised past the series, the same file fails."""
    shutil.copy(RULE_TESTS, tmp_path)
    raised = RULES.read_text(encoding="utf-8").replace(
        "callproof_task_oldest_waiting_seconds > 300", "callproof_task_oldest_waiting_seconds > 3000"
    )
    (tmp_path / RULES.name).write_text(raised, encoding="utf-8")
    tested = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "CallproofTaskQueueStuck" in tested.stdout + tested.stderr


@promtool
def test_every_dashboard_expression_is_valid_promql(tmp_path):
    """promtool has no query checker without a server, so each panel's query becomes a recording
    rule, which ``check rules`` parses."""
    rules = [{"record": f"callproof_panel_{n}", "expr": expr} for n, expr in enumerate(dashboard_expressions())]
    recorded = tmp_path / "panels.yml"
    recorded.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}), encoding="utf-8")
    checked = run_promtool("check", "rules", str(recorded), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_metric_the_rules_and_the_dashboard_name_is_exported(db, client):
    named = {name for expr in [*rule_expressions().values(), *dashboard_expressions()] for name in METRIC.findall(expr)}
    assert "callproof_call_oldest_in_doubt_seconds" in named
    missing = named - exported_names(client)
    assert missing == set()


def test_the_dashboard_parses_and_each_panel_asks_prometheus():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "callproof"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["type"] == "prometheus"
        assert panel["targets"] and all(METRIC.search(target["expr"]) for target in panel["targets"])


def test_the_oldest_call_in_doubt_is_its_receipts_age(demo, client):
    before = protocol.utc_now()
    response = client.get("/metrics")
    after = protocol.utc_now()
    [family] = [f for f in text_string_to_metric_families(response.content.decode())
                if f.name == "callproof_call_oldest_in_doubt_seconds"]  # fmt: skip
    [sample] = family.samples
    written = [call.updated_at for call in Call.objects.all() if call.in_doubt and call.updated_at is not None]
    assert written, "the demo has calls in doubt"
    oldest = min(written)
    assert (before - oldest).total_seconds() <= sample.value <= (after - oldest).total_seconds()


def test_no_call_in_doubt_is_an_age_of_zero(db, client):
    response = client.get("/metrics")
    values = {s.name: s.value for f in text_string_to_metric_families(response.content.decode()) for s in f.samples}
    assert values["callproof_call_oldest_in_doubt_seconds"] == 0
