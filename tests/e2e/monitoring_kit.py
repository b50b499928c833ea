"""What the monitoring tests share: the Prometheus binaries (skip when absent unless CI requires them),
the PrometheusRule and dashboard of manifests/monitoring, PromQL metric-name extraction, the metric names our
process exports, and `OperatorRig`: `gpuops run` (all four controllers, leader-elected) against an emulated cluster
with a workload that exercises every controller, on a background thread so sync tests and subprocesses can use it.

The rig runs the shipped metrics path: the API server enforces RBAC with manifests/rbac and the monitoring
binding installed, the operator runs with a TokenRequest token of its installed ServiceAccount and serves
/metrics with `--metrics-secure` (HTTPS, self-signed; TokenReview + SubjectAccessReview), and scrapers use
TokenRequest tokens of Prometheus' ServiceAccount (bound to gpuops-metrics-reader) or of one bound to nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import pkgutil
import re
import shutil
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import yaml
from waiting import wait_until

if TYPE_CHECKING:  # imported lazily at run time (see OperatorRig._main)
    from gpuops_sim.apiserver.auth import Decision

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD_JSON = MONITORING / "gpuops-dashboard.json"
PROMTOOL_TESTS = MONITORING / "tests" / "prometheusrule_test.yaml"
RULE_FILE_NAME = "gpuops-rules.yaml"  # what PROMTOOL_TESTS' rule_files names
REQUIRE_ENV = "GPUOPS_REQUIRE_PROMETHEUS"
LEASE_NAME = "gpuops-controller-manager"
RBAC_DIR = ROOT / "manifests" / "rbac"
METRICS_READER_BINDING = MONITORING / "metrics-reader-rbac.yaml"
OPERATOR_SA = ("gpuops-system", "gpuops-controller-manager")  # manifests/rbac/service-account.yaml
STRANGER_SA = ("monitoring", "gpuops-test-stranger")  # authenticated, bound to nothing
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- binaries


def binary(name: str) -> str:
    """Path of `prometheus` / `promtool`; skips the test when missing, fails instead under GPUOPS_REQUIRE_PROMETHEUS=1
    (CI installs them with .ci/install-prometheus, so a missing binary there is an error, not a skip)."""
    path = shutil.which(name)
    if path is not None:
        return path
    why = f"{name} is not installed (.ci/install-prometheus installs Debian's prometheus package)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}")
    pytest.skip(why)


# ---------------------------------------------------------------------------------------------- manifests


def prometheus_rule() -> dict[str, Any]:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert isinstance(doc, dict) and doc.get("kind") == "PrometheusRule", PROMETHEUS_RULE
    return doc


def write_rule_file(directory: Path) -> Path:
    """The PrometheusRule's `spec` ({groups: [...]}) as a plain Prometheus rule file, as the operator loads it."""
    path = directory / RULE_FILE_NAME
    path.write_text(yaml.safe_dump(prometheus_rule()["spec"], sort_keys=False))
    return path


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in prometheus_rule()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD_JSON.read_text())
    assert isinstance(doc, dict)
    return doc


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    stack = list(dash.get("panels", []))
    while stack:
        p = stack.pop(0)
        yield p
        stack.extend(p.get("panels", []))


# ---------------------------------------------------------------------------------------------- PromQL

_TOKEN = re.compile(r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<range>\[[^\]]*\])
  | (?P<number>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?:ms|s|m|h|d|w|y)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<punct>[(){},=!~<>+\-*/%^@]+)
  | (?P<space>\s+)
""", re.VERBOSE)
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "inf", "nan", "atan2"}
_LABEL_LIST = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions, aggregations, keywords,
    label names (in `{...}` matchers, `by`/`without`/`on`/`ignoring`/`group_*` lists) or Grafana variables."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "space":
            continue
        if kind == "punct":  # split runs so "(" and "{" are tokens of their own
            tokens.extend(("punct", c) for c in re.findall(r"[(){},]|[^(){},]+", m.group()))
        else:
            tokens.append((kind, m.group()))
    names: set[str] = set()
    i = 0
    brace = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if text == "{":
            brace += 1
        elif text == "}":
            brace -= 1
        elif brace == 0 and kind == "ident":
            if text.lower() in _LABEL_LIST and nxt == "(":
                depth, i = 0, i + 1
                while i < len(tokens):  # skip the label list
                    depth += tokens[i][1] == "("
                    depth -= tokens[i][1] == ")"
                    if depth == 0:
                        break
                    i += 1
            elif nxt != "(" and nxt.lower() not in ("by", "without") and text.lower() not in _KEYWORDS:
                names.add(text)
        i += 1
    return names


def promql_label_names(expr: str) -> set[str]:
    """Label names an expression mentions: matchers' left-hand sides and by/without/on/ignoring/group_* lists."""
    found: set[str] = set()
    for block in re.findall(r"\{([^}]*)\}", _strip_strings(expr)):
        found.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    for block in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        found.update(x.strip() for x in block.split(",") if x.strip())
    return found


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)


def grafana_query_metric_names(query: str) -> set[str]:
    """Metric names of a Grafana template variable query: `label_values(metric, label)`, `query_result(expr)`,
    `metrics(regex)` (none) or plain PromQL."""
    m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query, re.S)
    if m:
        return promql_metric_names(m.group(1))
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    if m:
        return promql_metric_names(m.group(1))
    if re.fullmatch(r"\s*(label_names|metrics)\(.*\)\s*", query, re.S):
        return set()
    return promql_metric_names(query)


# ---------------------------------------------------------------------------------------------- our metrics

METRIC_PACKAGES = ("gpuops.kube", "gpuops.controllers")
"""Everything `gpuops run` can import; its metrics register on the default registry at import."""
TARGET_LABELS = frozenset({"job", "instance", "le", "quantile", "__name__"})
"""Labels Prometheus adds (job, instance) or that belong to the exposition format (le, quantile)."""

_SUFFIXES = {  # no `_created`: gpuops turns those series off (gpuops/__init__.py)
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "gauge": ("",),
    "unknown": ("",),
}


def _import_metric_modules() -> None:
    for package in METRIC_PACKAGES:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            importlib.import_module(info.name)


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name (`_total`, `_bucket`... included) our `gpuops run` process can export -> its label
    names, from the prometheus_client default registry once all of gpuops.kube and gpuops.controllers is
    imported (custom collectors included: they describe their families even with nothing to report)."""
    from prometheus_client import REGISTRY

    _import_metric_modules()
    out: dict[str, frozenset[str]] = {}
    for family in REGISTRY.collect():
        labels = set(getattr(family, "_labelnames", ()))
        for sample in family.samples:
            labels.update(sample.labels)
        owner = REGISTRY._names_to_collectors.get(family.name + ("_total" if family.type == "counter" else ""))
        labels.update(getattr(owner, "_labelnames", ()))
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out[family.name + suffix] = frozenset(labels)
    return out


def scraped_series_names(text: str) -> set[str]:
    """Series names with at least one sample in a Prometheus text exposition."""
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


# ---------------------------------------------------------------------------------------------- the rig

# Small and fast: every controller has work within seconds. team-a's budget is exceeded at once (AlertOnly), a
# pod needing the powered-off L4 machine makes autoprovision power it on, the spot pool keeps one instance, and
# two MIG pods get slices from the MIG slicer on the A100-40GB machine (via the webhook and the node agent).
SCENARIO: dict[str, Any] = {
    "name": "monitoring",
    "description": "every controller busy within seconds, for the monitoring tests",
    "seed": 10,
    "namespaces": ["team-a", "gpuops-system", "monitoring"],
    "kubelet": {"startLatencySeconds": 0.2, "leaseSeconds": 5},
    "nodeGroups": [
        {"name": "a100", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 1, "bootSeconds": 0.5,
         "devicePluginSeconds": 0.2, "labels": {"nvidia.com/mig.config": "all-disabled"}},
        {"name": "l4", "gpuModel": "L4-24GB", "gpusPerNode": 4, "count": 1, "poweredOff": 1, "bootSeconds": 1,
         "devicePluginSeconds": 0.5},
        {"name": "mig", "gpuModel": "A100-40GB", "gpusPerNode": 2, "count": 1, "bootSeconds": 0.5,
         "devicePluginSeconds": 0.2, "taints": [{"key": "gpuops.io/mig", "value": "true", "effect": "NoSchedule"}]},
        {"name": "system", "count": 1},
    ],
    "cloud": {"launchSeconds": 0.5, "bootSeconds": 1, "devicePluginSeconds": 0.5,
              "instanceTypes": [{"name": "sim.gpu.a10g.4x", "gpuModel": "L4-24GB", "gpus": 4, "capacity": 4}]},
    "workload": [
        {"name": "train", "namespace": "team-a", "arrival": {"at": [0, 0.2]}, "gpus": 2, "runtimeSeconds": 600,
         "labels": {"team": "team-a"}, "nodeSelector": {"gpuops.io/gpu-model": "A100-80GB"}},
        {"name": "wants-l4", "namespace": "team-a", "arrival": {"at": [0]}, "gpus": 4, "runtimeSeconds": 600,
         "nodeSelector": {"gpuops.io/gpu-model": "L4-24GB"}},
        {"name": "mig-small", "namespace": "team-a", "arrival": {"at": [0, 0.3]}, "gpus": 0,
         "resources": {"nvidia.com/mig-1g.5gb": "1"}, "runtimeSeconds": 600,
         "tolerations": [{"key": "gpuops.io/mig", "operator": "Exists", "effect": "NoSchedule"}]},
    ],
    "objects": [
        {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
         "metadata": {"name": "team-a-training", "namespace": "team-a"},
         "spec": {"selector": {"matchLabels": {"team": "team-a"}}, "quota": {"gpuHours": "0.0001", "windowHours": 1},
                  "enforcement": {"action": "AlertOnly", "delaySeconds": 1}}},
        {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "l4-0"},
         "spec": {"nodeName": "l4-0", "gpuCount": 4,
                  "scaleUp": {"url": "${SIM_CLOUD_URL}/power/v1/machines/l4-0/start"},
                  "scaleDown": {"url": "${SIM_CLOUD_URL}/power/v1/machines/l4-0/stop"},
                  "template": {"labels": {"gpuops.io/gpu-model": "L4-24GB"}},
                  "bootTimeoutSeconds": 60, "scaleDownUnneededSeconds": 600}},
        {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "spot-l4"},
         "spec": {"provider": "sim", "endpoint": "${SIM_CLOUD_URL}/spot/v1", "minimum": 1, "maximum": 2,
                  "template": {"instanceTypes": ["sim.gpu.a10g.4x"], "gpusPerInstance": 4,
                               "taints": [{"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}]}}},
    ],
}


def _insecure() -> ssl.SSLContext:
    """What `tls_config.insecure_skip_verify` / the ServiceMonitor's `insecureSkipVerify` do: encrypt, trust any
    certificate (the operator's is self-signed, made at start)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_get(url: str, timeout: float = 5.0, token: str | None = None) -> str:
    """The body of a GET (HTTPError on a 4xx/5xx); with `token` as a bearer token, and any certificate accepted
    over HTTPS."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ctx = _insecure() if url.startswith("https://") else None
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout, context=ctx) as r:
        body: bytes = r.read()
    return body.decode()


def http_status(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET, errors included."""
    try:
        return 200, http_get(url, timeout, token)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def token_subject(path: Path) -> tuple[str, str]:
    """(namespace, name) of the ServiceAccount a ClusterRoleBinding manifest binds (its only subject)."""
    doc = yaml.safe_load(path.read_text())
    (subject,) = doc["subjects"]
    assert subject["kind"] == "ServiceAccount", subject
    return str(subject["namespace"]), str(subject["name"])


READER_SA = token_subject(METRICS_READER_BINDING)  # monitoring/prometheus-k8s, as kube-prometheus names it


def wait_for(what: str, probe: Callable[[], T | None], within: float) -> T:
    """tests/waiting.py's `wait_until` for probes of servers that may still be starting: any exception from the
    probe (connection refused, a 503) counts as not yet, and each probe is a round trip, so every 0.2 s."""
    return wait_until(what, probe, within, every=0.2, ignoring=(Exception,))


class OperatorRig:
    """`gpuops run` (all controllers, --leader-elect, --metrics-secure) against the SCENARIO cluster with RBAC
    enforced, on its own event loop thread.

    The cluster starts with manifests/rbac (the operator's ServiceAccount, per-controller ClusterRoles, the Lease
    Role, gpuops-metrics-auth and gpuops-metrics-reader, their bindings) and manifests/monitoring's binding of
    the reader role to Prometheus' ServiceAccount. The operator runs with a TokenRequest token of its own
    ServiceAccount, so it reconciles and reviews scrapers with exactly the installed permissions; the MIG node
    agents, which are not under test here, use the admin kubeconfig.

    `start()` returns once the operator answers on /metrics (HTTPS, to the reader's token) and the workload runs;
    `metrics_url` is its /metrics, `reader_token` a token allowed to read it, `stranger_token` one that is
    authenticated but bound to nothing; `denied` lists the operator's requests the API server refused;
    `stop()` ends the agents, the operator and the cluster."""

    CONTROLLERS = ("budget", "autoprovision", "spotpool", "migslicer")

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.reader_token = ""
        self.stranger_token = ""
        self.operator_user = "system:serviceaccount:{}:{}".format(*OPERATOR_SA)
        self.denied: list[str] = []
        """The operator's requests the API server refused ("verb resource/subresource ns/name" or a path)."""
        self.reviews: list[str] = []
        """TokenReviews and SubjectAccessReviews the operator created (the --metrics-secure filter at work)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="operator-rig", daemon=True)

    @property
    def metrics_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/metrics"

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    def start(self, within: float = 90.0) -> None:
        self._thread.start()
        if not self._ready.wait(within):
            raise AssertionError(f"the operator rig did not start within {within:g}s")
        if self._error is not None:
            raise AssertionError(f"the operator rig failed to start: {self._error!r}") from self._error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def scrape(self) -> str:
        """/metrics as Prometheus gets it: over HTTPS with the reader's token."""
        return http_get(self.metrics_url, token=self.reader_token)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported by start() (or lost after a stop, when nobody waits)
            self._error = e
        finally:
            self._ready.set()

    def _manifests(self) -> list[Path]:
        """What the cluster starts with besides the CRDs: our RBAC as installed, the reader binding of
        manifests/monitoring, and the scrapers' ServiceAccounts (Prometheus' and the stranger's)."""
        accounts = self.workdir / "scraper-accounts.yaml"
        accounts.write_text(yaml.safe_dump_all(
            [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}
             for ns, name in (READER_SA, STRANGER_SA)]))
        return [*sorted(RBAC_DIR.glob("*.yaml")), METRICS_READER_BINDING, accounts]

    def _audit(self, decision: Decision) -> None:
        """The API server's audit hook (its loop thread): the operator's refusals and reviews."""
        a = decision.attrs
        if a.user.username != self.operator_user:
            return
        if not decision.allowed:
            what = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
            self.denied.append(f"{a.verb} {what} {a.namespace}/{a.name}" if a.resource_request else
                               f"{a.verb} {a.path}")
        elif a.resource in ("tokenreviews", "subjectaccessreviews") and a.verb == "create":
            self.reviews.append(a.resource)

    async def _main(self) -> None:
        from gpuops_sim.cluster.cluster import SimCluster
        from gpuops_sim.demo import repo_crds
        from gpuops_sim.demo_mig import WEBHOOK_CONFIG, WEBHOOK_SERVICE, MigSide
        from gpuops_sim.harness import OperatorHarness, now_us
        from gpuops_sim.scenario import parse

        rig = self

        class SecureHarness(OperatorHarness):
            """The harness with the operator as its ServiceAccount and /metrics probed over HTTPS with the
            reader's token (so `start_operator` returns once a scrape is authenticated and authorized)."""

            async def token(self, namespace: str, name: str) -> str:
                """A TokenRequest (what `kubectl create token` and the kubelet's projected tokens use)."""
                body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}}
                got = await self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
                return str(got["status"]["token"])

            async def start_operator(self) -> None:
                self.cluster.server.write_kubeconfig(self.kubeconfig, token=await self.token(*OPERATOR_SA))
                rig.reader_token = rig.reader_token or await self.token(*READER_SA)
                rig.stranger_token = rig.stranger_token or await self.token(*STRANGER_SA)
                await super().start_operator()

            async def scrape(self) -> tuple[str, int, int]:
                if self.http is None:
                    raise RuntimeError("the harness is not started")
                before = now_us()
                async with self.http.get(f"https://127.0.0.1:{self.port}/metrics", ssl=_insecure(),
                                         headers={"Authorization": f"Bearer {rig.reader_token}"}) as r:
                    r.raise_for_status()  # a ClientError: not up yet
                    text = await r.text()
                return text, before, now_us()

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        agents_kubeconfig = self.workdir / "agents.kubeconfig"
        mig = MigSide(str(agents_kubeconfig), log_path=str(self.workdir / "agents.log"))
        # the webhook's configuration exists before the operator starts, so it patches its CA in at once
        cluster = SimCluster(parse(SCENARIO, "monitoring scenario"), authorization="RBAC",
                             manifests=[*repo_crds(), WEBHOOK_CONFIG, *self._manifests()],
                             device_plugin_root=mig.root, hold_workload=True)
        cluster.server.audit_hooks.append(self._audit)
        cluster.server.service_endpoints[WEBHOOK_SERVICE] = f"127.0.0.1:{mig.webhook_port}"
        args = [*mig.operator_args(), "--leader-elect", "--leader-elect-namespace", "gpuops-system",
                "--leader-elect-lease-name", LEASE_NAME, "--spotpool-resync", "5", "--metrics-secure"]
        async with SecureHarness(cluster, self.workdir, controllers=self.CONTROLLERS, log_level="INFO",
                                 extra_args=args) as harness:
            self.port = harness.port
            cluster.write_kubeconfig(agents_kubeconfig)
            try:  # the agents go first, before the operator and the cluster they talk to
                await mig.start(cluster)
                if not await mig.webhook_ready(cluster, 30):
                    raise TimeoutError("the operator's MIG webhook was not ready within 30 s")
                cluster.start_workload()
                self._ready.set()
                await self._stop.wait()
            finally:
                await mig.stop()
