"""The Grafana dashboard and the PrometheusRule only query series we export: every panel's PromQL,
every template variable's query and every alert expression is parsed, and each metric name (with its
_total/_bucket/_sum/_count suffix) and label name must be one our `gpuops run` process exports. Plus the
dashboard's shape (datasource variable, schema, layout) and the monitoring kustomization that ships it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_kit import (
    DASHBOARD_JSON,
    MONITORING,
    ROOT,
    TARGET_LABELS,
    alert_rules,
    dashboard,
    exported_series,
    grafana_query_metric_names,
    panels,
    promql_label_names,
    promql_metric_names,
)

KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest.fixture(scope="module")
def exported() -> dict[str, frozenset[str]]:
    return exported_series()


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    dash = dashboard()
    for p in panels(dash):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            yield f"variable {var['name']}", q


def check_query(where: str, expr: str, names: set[str], exported: dict[str, frozenset[str]]) -> list[str]:
    problems = []
    if not names:
        problems.append(f"{where}: no metric found in {expr!r}")
    for name in sorted(names - exported.keys()):
        problems.append(f"{where}: {name} is not a series gpuops exports")
    known = set(TARGET_LABELS).union(*(exported.get(n, frozenset()) for n in names))
    for label in sorted(promql_label_names(expr) - known):
        problems.append(f"{where}: label {label!r} is on none of {sorted(names)}")
    return problems


def test_the_promql_parser_finds_metrics_not_functions_labels_or_variables() -> None:
    expr = ('histogram_quantile(0.9, sum by (le, name) (rate(workqueue_queue_duration_seconds_bucket{job=~"$job",'
            ' name="a{b}"}[$__rate_interval]))) / on (name) group_left (x) max without (pod) (up offset 5m) > bool 1e3'
            ' or vector(0) unless absent(leader_election_master_status{name="x"}) and sum(a:b:rate5m) by (c)')
    assert promql_metric_names(expr) == {"workqueue_queue_duration_seconds_bucket", "up",
                                         "leader_election_master_status", "a:b:rate5m"}
    assert promql_label_names(expr) == {"le", "name", "job", "x", "pod", "c"}
    assert grafana_query_metric_names('label_values(controller_runtime_reconcile_total{job=~"$job"}, controller)') \
        == {"controller_runtime_reconcile_total"}


def test_the_registry_holds_the_suffixed_series_names(exported: dict[str, frozenset[str]]) -> None:
    for name in ("workqueue_depth", "workqueue_adds_total", "controller_runtime_reconcile_time_seconds_bucket",
                 "gpuops_budget_over_quota", "gpuops_spotpool_launches_total", "gpuops_migslicer_slices",
                 "gpuops_autoprovision_boot_timeouts_total", "gpuops_informer_last_event_age_seconds"):
        assert name in exported, name
    assert "workqueue_adds" not in exported  # a counter is only exposed with its _total suffix
    assert exported["gpuops_migslicer_slices"] == {"node", "profile", "state"}
    assert exported["controller_runtime_reconcile_total"] == {"controller", "result"}


def test_dashboard_queries_use_only_exported_metrics_and_labels(exported: dict[str, frozenset[str]]) -> None:
    problems: list[str] = []
    used: set[str] = set()
    for where, expr in dashboard_queries():
        names = grafana_query_metric_names(expr)
        used |= names
        problems += check_query(where, expr, names, exported)
    assert not problems, "\n".join(problems)
    # the views the dashboard exists for
    wanted = {
        "gpuops_budget_consumed_gpu_seconds", "gpuops_budget_quota_gpu_seconds", "gpuops_budget_remaining_gpu_seconds",
        "gpuops_budget_over_quota", "gpuops_budget_usage_cost", "gpuops_autoprovision_node_groups",
        "gpuops_spotpool_size",
        "gpuops_spotpool_ready_instances", "gpuops_spotpool_desired_instances", "gpuops_spotpool_launches_total",
        "gpuops_spotpool_capacity_error", "gpuops_migslicer_slices", "gpuops_migslicer_pods_waiting",
        "gpuops_migslicer_gpu_fragmentation", "workqueue_depth", "workqueue_queue_duration_seconds_bucket",
        "controller_runtime_reconcile_total", "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket", "gpuops_informer_synced",
        "gpuops_informer_last_event_age_seconds", "leader_election_master_status",
    }
    assert wanted <= used, sorted(wanted - used)


def test_alert_expressions_use_only_exported_metrics_and_labels(exported: dict[str, frozenset[str]]) -> None:
    problems: list[str] = []
    for rule in alert_rules():
        problems += check_query(f"alert {rule['alert']}", rule["expr"], promql_metric_names(rule["expr"]), exported)
    assert not problems, "\n".join(problems)


def test_an_unknown_metric_or_label_is_reported(exported: dict[str, frozenset[str]]) -> None:
    """The two checks above can fail."""
    expr = 'sum by (outcome) (rate(gpuops_migslicer_webhook_requests_total[5m])) + gpuops_budget_consumed_gpu_hourz'
    problems = check_query("x", expr, promql_metric_names(expr), exported)
    assert any("gpuops_budget_consumed_gpu_hourz is not a series" in p for p in problems), problems
    assert any("label 'outcome'" in p for p in problems), problems


def test_dashboard_shape() -> None:
    dash = dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids: list[int] = []
    rows = 0
    for p in panels(dash):
        ids.append(p["id"])
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            rows += 1
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t["expr"].strip(), p["title"]
        assert p.get("description"), p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert rows >= 6


def _kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_the_monitoring_kustomization_ships_monitor_rules_and_dashboard() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _kustomize(MONITORING)}
    sm = docs[("ServiceMonitor", "gpuops-controller-manager-metrics")]
    endpoint = sm["spec"]["endpoints"][0]
    assert sm["metadata"]["namespace"] == "gpuops-system"
    assert endpoint["port"] == "https" and endpoint["scheme"] == "https" and endpoint["honorLabels"] is True
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert {"targetLabel": "job", "replacement": "gpuops-controller-manager-metrics", "action": "replace"} \
        in endpoint["relabelings"]  # the job the alerts select
    assert ("PrometheusRule", "gpuops") in docs
    # the operator's metrics Service (manifests/, installed by `kubectl apply -k manifests`) is the one selected
    services = [d for path in sorted((ROOT / "manifests").rglob("*.yaml")) if MONITORING not in path.parents
                for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == "Service"]
    wanted = sm["spec"]["selector"]["matchLabels"].items()
    selected = [s for s in services if wanted <= s["metadata"].get("labels", {}).items()
                and s["metadata"].get("namespace") in sm["spec"]["namespaceSelector"]["matchNames"]]
    assert len(selected) == 1, [s["metadata"]["name"] for s in selected]
    assert any(p["name"] == "https" and p["port"] == 8443 for p in selected[0]["spec"]["ports"]), selected[0]
    cm = docs[("ConfigMap", "gpuops-grafana-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][DASHBOARD_JSON.name]) == dashboard()


def test_the_top_level_kustomization_leaves_monitoring_out() -> None:
    """The emulator (and clusters without the Prometheus Operator) serve no monitoring.coreos.com API."""
    top = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    assert not any(str(r).startswith("monitoring") for r in top.get("resources", []))
