"""The PrometheusRule of manifests/monitoring: promtool accepts its rule groups, every alert carries a
severity, summary, description and runbook hint, and the promtool unit tests see every alert firing and not
firing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from monitoring_kit import PROMTOOL_TESTS, RULE_FILE_NAME, alert_rules, binary, prometheus_rule, write_rule_file

SEVERITIES = {"critical", "warning", "info"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_rule_groups_pass_promtool_check_rules(tmp_path: Path) -> None:
    rules = write_rule_file(tmp_path)
    out = _promtool("check", "rules", str(rules), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


def test_the_promtool_check_fails_on_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: a rule file with a PromQL syntax error is refused."""
    spec = prometheus_rule()["spec"]
    spec["groups"][0]["rules"][0]["expr"] = "sum by (namespace (gpuops_budget_over_quota)"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(spec))
    out = _promtool("check", "rules", str(broken), cwd=tmp_path)
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    doc = prometheus_rule()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["metadata"]["namespace"] == "gpuops-system"
    names = [r["alert"] for r in alert_rules()]
    assert len(names) == len(set(names)), names
    for rule in alert_rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        for key in ("summary", "description", "runbook"):
            assert len(rule["annotations"].get(key, "").strip()) > 20, (rule["alert"], key)
    wanted = {  # the alerts we ship, by what they watch
        "GPUBudgetNearlyExhausted", "GPUBudgetExceeded", "GPUNodePowerOnFailing", "GPUNodeBootTimeout",
        "SpotPoolCapacityError", "MigPodsWaitingForSlices", "GpuopsReconcileErrors", "GpuopsInformerWatchStalled",
        "GpuopsLeaderAbsent", "GpuopsOperatorAbsent",
    }
    assert wanted <= set(names), wanted - set(names)
    absent = next(r for r in alert_rules() if r["alert"] == "GpuopsOperatorAbsent")
    assert absent["expr"].strip().startswith("absent(leader_election_master_status{")


def test_the_unit_tests_see_every_alert_firing_and_not_firing() -> None:
    tests: list[dict[str, Any]] = yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {r["alert"] for r in alert_rules()}
    assert alerts - firing == set(), f"no promtool test sees these alerts firing: {sorted(alerts - firing)}"
    assert alerts - quiet == set(), f"no promtool test sees these alerts not firing: {sorted(alerts - quiet)}"
    assert (firing | quiet) <= alerts, f"tests for alerts that do not exist: {sorted((firing | quiet) - alerts)}"


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    assert write_rule_file(tmp_path).name == RULE_FILE_NAME
    out = _promtool("test", "rules", PROMTOOL_TESTS.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_promtool_unit_tests_fail_when_an_alert_no_longer_fires(tmp_path: Path) -> None:
    """The unit tests can fail: with GPUBudgetExceeded's threshold out of reach, promtool reports it."""
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    spec = prometheus_rule()["spec"]
    for group in spec["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GPUBudgetExceeded":
                rule["expr"] = rule["expr"].replace("== 1", "== 2")
    (tmp_path / RULE_FILE_NAME).write_text(yaml.safe_dump(spec))
    out = _promtool("test", "rules", PROMTOOL_TESTS.name, cwd=tmp_path)
    assert out.returncode != 0
    assert "GPUBudgetExceeded" in out.stdout + out.stderr
