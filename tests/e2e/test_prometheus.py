"""A real Prometheus scraping a real `gpuops run` the way it is shipped: the operator runs as a
subprocess with all four controllers against an emulated cluster that enforces RBAC (manifests/rbac installed; the
operator uses its ServiceAccount's token) and whose workload keeps every controller busy, serving /metrics with
`--metrics-secure` (HTTPS with a self-signed certificate; bearer tokens checked by TokenReview and
SubjectAccessReview). `promtool check metrics` accepts its /metrics (fetched with the reader's token), and a
Prometheus (temp config and TSDB, 1 s scrape and rule evaluation) configured as the ServiceMonitor configures it
(https, a ServiceAccount token bound to gpuops-metrics-reader, insecure_skip_verify) scrapes it, answers queries
for our series and evaluates the PrometheusRule's alerts on them; a second job whose token is not bound to the
reader role is refused with a 403."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_kit import (
    LEASE_NAME,
    OperatorRig,
    alert_rules,
    binary,
    http_get,
    http_status,
    prometheus_rule,
    wait_for,
    write_rule_file,
)

from gpuops_sim.harness import free_port, metric_value

JOB = "gpuops-controller-manager-metrics"  # the job the ServiceMonitor gives us, which the alerts select
DENIED_JOB = "gpuops-metrics-not-a-reader"  # a token that authenticates but is not bound to gpuops-metrics-reader
BUDGET = {"namespace": "team-a", "name": "team-a-training"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorRig]:
    binary("prometheus")  # skip (or fail under GPUOPS_REQUIRE_PROMETHEUS=1) before starting anything
    binary("promtool")
    r = OperatorRig(tmp_path_factory.mktemp("operator"))
    r.start()
    try:
        yield r
    finally:
        r.stop()


def busy_scrape(rig: OperatorRig) -> str:
    """A scrape once every controller has done its work: budget over quota, the L4 machine powered on, the
    spot pool's instance Ready, MIG slices made; and the shared framework series present."""

    def probe() -> str | None:
        text = rig.scrape()
        done = (
            metric_value(text, "gpuops_budget_over_quota", BUDGET) == 1
            and metric_value(text, "gpuops_autoprovision_node_groups", {"state": "Ready"}) == 1
            and (metric_value(text, "gpuops_spotpool_ready_instances", {"pool": "spot-l4"}) or 0) >= 1
            and (metric_value(text, "gpuops_migslicer_slices", {"state": "claimed"}) or 0) >= 1
            and metric_value(text, "leader_election_master_status", {"name": LEASE_NAME}) == 1
            and metric_value(text, "workqueue_depth") is not None
        )
        return text if done else None

    try:
        return wait_for("every controller to have worked", probe, 60)
    except AssertionError:
        print(rig.logs())
        raise


def assert_operator_never_refused(rig: OperatorRig) -> None:
    """The installed roles were enough: no request of the operator's ServiceAccount got a 403."""
    assert not rig.denied, f"the API server refused the operator: {rig.denied[:20]}\n{rig.logs()}"


def test_promtool_check_metrics_accepts_our_metrics(rig: OperatorRig) -> None:
    text = busy_scrape(rig)  # over HTTPS, with the reader's token
    assert rig.metrics_url.startswith("https://")
    # only the reader gets it: no token is a 401, an authenticated stranger a 403, plain HTTP no answer at all
    assert http_status(rig.metrics_url)[0] == 401
    status, body = http_status(rig.metrics_url, rig.stranger_token)
    assert status == 403 and 'may not get path "/metrics"' in body, (status, body)
    with pytest.raises((OSError, http.client.HTTPException)):  # reset, or TLS bytes where a status line goes
        http_get(rig.metrics_url.replace("https://", "http://"), token=rig.reader_token)
    # and each scrape was reviewed by the API server, asked by the operator's ServiceAccount
    assert {"tokenreviews", "subjectaccessreviews"} <= set(rig.reviews), rig.reviews
    assert_operator_never_refused(rig)
    promtool = binary("promtool")
    # The whole /metrics must pass the lint: budget amounts are exported in GPU-seconds only (the deprecated
    # *_gpu_hours aliases are gone), so nothing is left out of it.
    assert not re.search(r"^# HELP \S+ Deprecated", text, re.M), "a deprecated family is exported"
    assert not re.findall(r"^# TYPE (\S*hours\S*) ", text, re.M), "a family in hours is exported"
    for what in ("consumed", "quota", "remaining"):
        assert metric_value(text, f"gpuops_budget_{what}_gpu_seconds", BUDGET) is not None, what
    # monitoring_kit's team-a budget allows 0.0001 GPU-hours = 0.36 GPU-seconds
    assert metric_value(text, "gpuops_budget_quota_gpu_seconds", BUDGET) == pytest.approx(0.0001 * 3600)
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr
    # and the lint can fail: a gauge in hours added to the same text is flagged
    bad = text.rstrip("\n") + "\n# HELP gpuops_test_gpu_hours A gauge in hours.\n# TYPE gpuops_test_gpu_hours gauge\n" \
        "gpuops_test_gpu_hours 1.0\n"
    out = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and 'use base unit "seconds" instead of "hours"' in out.stdout + out.stderr


def secure_job(name: str, target: str, token_file: Path) -> dict[str, Any]:
    """A scrape job as the ServiceMonitor's endpoint becomes one (port https, path /metrics, honorLabels,
    bearerTokenFile, tlsConfig.insecureSkipVerify), the job named as its relabeling pins it."""
    return {"job_name": name, "scheme": "https", "metrics_path": "/metrics", "honor_labels": True,
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "tls_config": {"insecure_skip_verify": True},
            "static_configs": [{"targets": [target]}]}


def token_file(directory: Path, name: str, token: str) -> Path:
    path = directory / name
    path.write_text(token)
    path.chmod(0o600)
    return path


class Prometheus:
    """prometheus with a temp config and TSDB on a free loopback port; stop() ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path, jobs: list[dict[str, Any]]) -> None:
        rules = write_rule_file(workdir)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": jobs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={self.url.removeprefix('http://')}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.log_path = workdir / "prometheus.log"

    def api(self, path: str, **params: str) -> Any:
        assert self.proc.poll() is None, f"prometheus exited: {self.log_path.read_text()[-2000:]}"
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = json.loads(http_get(f"{self.url}/api/v1/{path}{query}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def test_prometheus_scrapes_our_series_and_evaluates_our_alerts(rig: OperatorRig, tmp_path: Path) -> None:
    busy_scrape(rig)
    scrape_target = f"127.0.0.1:{rig.port}"
    prom = Prometheus(tmp_path, [
        secure_job(JOB, scrape_target, token_file(tmp_path, "reader.token", rig.reader_token)),
        secure_job(DENIED_JOB, scrape_target, token_file(tmp_path, "stranger.token", rig.stranger_token)),
    ])
    try:
        wait_for("prometheus ready", lambda: http_get(f"{prom.url}/-/ready"), 30)

        def target(job: str, health: str, error: str = "") -> dict[str, Any]:
            """The job's target once its last scrape had `health` and `error` in its lastError (else an
            AssertionError showing the target, which wait_for reports on timeout)."""
            got: list[dict[str, Any]] = [t for t in prom.api("targets")["activeTargets"] if t["labels"]["job"] == job]
            assert len(got) == 1 and got[0]["health"] == health and error in got[0]["lastError"], got
            return got[0]

        # the reader's job: up, over HTTPS
        up = wait_for("the gpuops target up", lambda: target(JOB, "up"), 20)
        assert up["scrapeUrl"] == f"https://{scrape_target}/metrics" and not up["lastError"], up
        # the stranger's: authenticated, not authorized
        wait_for("the stranger's target down with a 403", lambda: target(DENIED_JOB, "down", "403"), 20)
        wait_for(f"up{{job={DENIED_JOB!r}}} 0", lambda: [s for s in prom.query(f'up{{job="{DENIED_JOB}"}}')
                                                          if s["value"][1] == "0"], 10)

        # our series, back from Prometheus' query API
        synced = wait_for("gpuops_informer_synced", lambda: prom.query(f'gpuops_informer_synced{{job="{JOB}"}}'), 20)
        resources = {s["metric"]["resource"] for s in synced}
        assert {"pods", "nodes", "gpuworkloadbudgets", "spotpools", "gpunodegroups"} <= resources, resources
        assert all(s["value"][1] == "1" for s in synced), synced
        depth = prom.query(f'workqueue_depth{{job="{JOB}"}}')
        assert {s["metric"]["controller"] for s in depth} >= {"budget", "autoprovision", "spotpool", "migslicer"}
        ready = prom.query('gpuops_spotpool_ready_instances{pool="spot-l4"}')
        assert ready and float(ready[0]["value"][1]) >= 1, ready
        over = prom.query('gpuops_budget_over_quota{namespace="team-a", name="team-a-training"}')
        assert over and over[0]["value"][1] == "1", over  # the budget's namespace kept (honor_labels)
        rate = wait_for("a reconcile rate", lambda: prom.query(
            f'sum by (controller) (rate(controller_runtime_reconcile_total{{job="{JOB}"}}[10s])) > 0'), 20)
        assert {s["metric"]["controller"] for s in rate}, rate

        # the PrometheusRule's groups loaded and evaluated
        def groups() -> dict[str, Any] | None:
            loaded = {g["name"]: g for g in prom.api("rules")["groups"]}
            evaluated = loaded and all(r.get("lastEvaluation", "").startswith("2") and
                                       not r["lastEvaluation"].startswith("0001") for g in loaded.values()
                                       for r in g["rules"])
            return loaded if evaluated else None

        loaded = wait_for("the rule groups evaluated", groups, 20)
        assert set(loaded) == {g["name"] for g in prometheus_rule()["spec"]["groups"]}
        rules = {r["name"]: r for g in loaded.values() for r in g["rules"]}
        assert set(rules) == {r["alert"] for r in alert_rules()}
        assert all(r["health"] == "ok" for r in rules.values()), [r for r in rules.values() if r["health"] != "ok"]

        def budget_alert() -> dict[str, Any] | None:
            return next((a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "GPUBudgetExceeded"
                         and a["labels"].get("namespace") == "team-a" and a["state"] == "firing"), None)

        alert = wait_for("GPUBudgetExceeded firing for team-a/team-a-training", budget_alert, 20)
        assert alert["labels"]["name"] == "team-a-training" and alert["labels"]["severity"] == "warning"
        assert "team-a/team-a-training" in alert["annotations"]["summary"]

        # a leader is there and so are our series: the leader alerts stay quiet, as do the stalls
        rules = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
        for quiet in ("GpuopsLeaderAbsent", "GpuopsOperatorAbsent", "GpuopsInformerWatchStalled",
                      "GpuopsInformerNotSynced", "SpotPoolCapacityError"):
            assert rules[quiet]["state"] == "inactive", rules[quiet]

        # still refused, still up: neither was a blip
        target(JOB, "up")
        target(DENIED_JOB, "down", "403")
    finally:
        prom.stop()
    assert prom.proc.returncode is not None
    assert_operator_never_refused(rig)
