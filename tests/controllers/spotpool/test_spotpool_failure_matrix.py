"""Every failure class of the spot pool controller, seen in the four places an on-call engineer looks: the pool's
condition (with its reason), a Warning Event on the pool, the `gpuops_spotpool_*` series on /metrics, and a JSON
log line carrying the pool's name. The operator is a real `gpuops run --controllers spotpool` process against the
emulated cluster and cloud (`OperatorHarness`); each class is induced the way it happens (a missing Secret, a host
that does not resolve, a closed port, TLS to a plain-HTTP server, the cloud's own injected answers), one pool per
class, one class at a time. The expected sightings are tests/failure_matrix.py's rows, which the README's
"What you see when ..." table is generated from.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from failure_matrix import (
    SPOTPOOL,
    Seen,
    closed_port,
    conditions,
    expected_conditions,
    log_lines,
    still_missing,
)
from waiting import until

from gpuops_sim.cluster.access import POOLS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "spotpools.gpuops.io.yaml"
POOLS_PATH = "/apis/gpuops.io/v1alpha1/spotpools"
SCENARIO = {
    "name": "spotpool-failures",
    "namespaces": ["gpuops-system"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "cloud": {"launchSeconds": 0.1, "bootSeconds": 0.2, "devicePluginSeconds": 0.05, "terminateSeconds": 0.1,
              "instanceTypes": [{"name": "gpu.l4.1x", "gpuModel": "L4-24GB", "gpus": 1}]},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Case:
    """One failure class: how to induce it around the pool's creation, and how to clear it after."""

    def __init__(self, rig: OperatorHarness, name: str, html_url: str) -> None:
        self.rig = rig
        self.html_url = html_url
        self.name = name
        self.pool = f"mx-{name}"
        self.cloud = rig.cluster.cloud
        self.rules: list[int] = []

    def body(self, **spec: Any) -> dict[str, Any]:
        base = {"provider": "sim", "endpoint": f"{self.cloud.url}/spot/v1", "minimum": 1, "maximum": 1,
                "template": {"instanceTypes": ["gpu.l4.1x"]}}
        return {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": self.pool},
                "spec": {**base, **spec}}

    def fault(self, **kwargs: Any) -> None:
        self.rules.append(self.cloud.faults.add(api="spot", **kwargs).id)

    async def secret(self, token: str) -> dict[str, Any]:
        name = f"keys-{self.name}"
        await self.rig.request("POST", "/api/v1/namespaces/gpuops-system/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {"token": base64.b64encode(token.encode()).decode()}})
        return {"name": name, "namespace": "gpuops-system"}

    def clear(self) -> None:
        for rule in self.rules:
            self.cloud.faults.remove(rule)
        self.cloud.options.token = None


async def induce(case: Case) -> dict[str, Any]:
    """The pool to create for `case`, with its failure in place."""
    name = case.name
    if name == "secret-missing":
        return case.body(credentialsSecretRef={"name": "no-such-secret", "namespace": "gpuops-system"},
                         insecureAllowHTTP=True)
    if name == "secret-not-allowed":
        return case.body(credentialsSecretRef={"name": "cloud-root", "namespace": "kube-system"})
    if name == "plain-http-credentials":
        return case.body(credentialsSecretRef=await case.secret("a-token"))
    if name == "wrong-credentials":
        case.cloud.options.token = "right-token"
        return case.body(credentialsSecretRef=await case.secret("wrong-token"), insecureAllowHTTP=True)
    if name == "dns":
        return case.body(endpoint="http://spot-api.invalid/spot/v1")
    if name == "refused":
        return case.body(endpoint=f"http://127.0.0.1:{closed_port()}/spot/v1")
    if name == "tls":
        return case.body(endpoint=case.cloud.url.replace("http://", "https://") + "/spot/v1")
    if name == "malformed":
        return case.body(endpoint=f"{case.html_url}/spot/v1")
    if name == "timeout":
        case.fault(op="describe", delay=16.0)
    elif name in ("forbidden", "not-found", "throttled", "server-error"):
        status = {"forbidden": 403, "not-found": 404, "throttled": 429, "server-error": 503}[name]
        case.fault(op="describe", status=status)
    elif name == "capacity":
        case.fault(op="run", error="InsufficientInstanceCapacity")
    elif name == "quota":
        case.fault(op="run", error="InstanceLimitExceeded")
    elif name == "invalid-spec":  # 6145 characters (the schema counts those) but 12290 bytes: over 12 KiB
        return case.body(template={"instanceTypes": ["gpu.l4.1x"], "userData": "\u00e9" * 6145})
    return case.body()


@contextlib.asynccontextmanager
async def html_server() -> AsyncIterator[str]:
    """A server answering every request 200 with an HTML page: what a captive proxy or a wrong URL gives."""
    async def page(_: web.Request) -> web.Response:
        return web.Response(text="<html><body>Welcome</body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def deletion_blocked(case: Case) -> None:
    """A pool with a running instance, deleted while every terminate fails."""
    rig = case.rig

    async def ready() -> bool:
        pool = await rig.request("GET", f"{POOLS_PATH}/{case.pool}")
        return (pool.get("status") or {}).get("ready") == 1

    await until(f"{case.pool} has its instance", ready, 30)
    case.fault(op="terminate", status=500)
    await rig.request("DELETE", f"{POOLS_PATH}/{case.pool}")


async def four_places(rig: OperatorHarness, case: Case, seen: Seen) -> Callable[[], Awaitable[str]]:
    """A probe: "" once the condition, the Event, the metric and the log line all show the failure, else what
    is still missing (the wait's report)."""
    want = expected_conditions(seen)
    ready_reason = want["Ready"][1]

    async def probe() -> str:
        missing = []
        pool = await rig.request("GET", f"{POOLS_PATH}/{case.pool}")
        have = conditions(pool)
        if any(have.get(k) != v for k, v in want.items()):
            missing.append(f"conditions {have}")
        events = (await rig.request("GET", "/api/v1/namespaces/default/events"))["items"]
        if not any(e["involvedObject"].get("name") == case.pool and e["reason"] == seen.event
                   and e["type"] == "Warning" for e in events):
            missing.append(f"a Warning Event {seen.event}")
        text, _, _ = await rig.scrape()
        if metric_value(text, "gpuops_spotpool_not_ready", {"pool": case.pool, "reason": ready_reason}) != 1:
            missing.append(f"gpuops_spotpool_not_ready{{reason={ready_reason}}} 1")
        if 'result="' in seen.metric:
            result = seen.metric.rsplit('result="', 1)[1].split('"')[0]
            if not (metric_value(text, "gpuops_spotpool_provider_calls_total", {"result": result}) or 0) > 0:
                missing.append(f"gpuops_spotpool_provider_calls_total{{result={result}}}")
        if not any(r.get("event") == seen.log and r.get("pool") == case.pool and r.get("level") == "warning"
                   and r.get("reason", ready_reason) == ready_reason for r in log_lines(rig.log_path)):
            missing.append(f"a warning log line {seen.log!r} with pool={case.pool} (reason={ready_reason})")
        return "; ".join(missing)

    return probe


async def test_every_spot_pool_failure_shows_as_condition_event_metric_and_log(tmp_path: Path) -> None:
    cluster = SimCluster(parse(SCENARIO), workload=False)
    async with OperatorHarness(cluster, tmp_path, crds=[CRD], controllers=["spotpool"], log_level="INFO",
                               extra_args=["--spotpool-resync", "2"]) as rig, html_server() as html_url:
        failed = []
        for name, seen in SPOTPOOL.items():
            case = Case(rig, name, html_url)
            began = time.monotonic()
            await rig.request("POST", POOLS_PATH, await induce(case))
            if name == "deletion-blocked":
                await deletion_blocked(case)
            probe = await four_places(rig, case, seen)
            missing = await still_missing(f"{name} shown in the four places", probe)
            if missing:
                failed.append(f"{name}: missing {missing}")
            case.clear()
            await rig.cluster.access.patch(POOLS, "", case.pool, {"spec": {"deletionPolicy": "Retain"}})
            with contextlib.suppress(RuntimeError):  # already being deleted: Retain lets it go
                await rig.request("DELETE", f"{POOLS_PATH}/{case.pool}")
            print(f"{name}: {time.monotonic() - began:.1f} s")
        assert not failed, "\n".join(failed)
