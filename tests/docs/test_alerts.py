"""deploy/prometheus/alerts.yml: its rules load, read series docs/metrics.md documents, and the
certificate alert fires 30 days before an expiry and not at 31 (promtool's rule tests, where the
Prometheus package's promtool is installed)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fixtures.promql import selectors

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DAY = 86400


def test_the_alerts_read_documented_series():
    documented = (ROOT / "docs" / "metrics.md").read_text()
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        for name, _ in selectors(rule["expr"]):
            assert f"| `{name}` |" in documented, f"{rule['alert']} reads {name}, which docs/metrics.md does not name"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (the Prometheus package) is not installed")
def test_the_certificate_alert_fires_at_30_days(tmp_path):
    # time() is 0 at the test's start: a value is the seconds left until that certificate expires
    series = [{"series": f'llmgw_certificate_expiry_timestamp_seconds{{job="llmgw-agents",instance="{i}",'
                         f'certificate="node"}}', "values": f"{days * DAY}x120"} for i, days in (("a", 29), ("b", 31))]
    fired = {"alertname": "LlmgwCertificateExpiresSoon", "severity": "warning", "job": "llmgw-agents",
             "instance": "a", "certificate": "node"}
    test = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "59m", "alertname": "LlmgwCertificateExpiresSoon", "exp_alerts": []},   # pending for 1h
            {"eval_time": "61m", "alertname": "LlmgwCertificateExpiresSoon",
             "exp_alerts": [{"exp_labels": fired, "exp_annotations": {
                 "summary": "llmgw-agents a: its node certificate expires in 28d 22h 59m 0s",
                 "description": "See `llmgw ca status` for every certificate's days left, and README "
                                "\"Certificate renewal\"."}}]},
            {"eval_time": "61m", "alertname": "LlmgwCertificateExpiresVerySoon", "exp_alerts": []},
        ]}]}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
