"""No secret value ever leaves the operator, whatever the far end answers.

Every credential gets a unique canary value (power webhook tokens and HMAC keys; the webhook, aws and tencent
spot providers' keys), and every endpoint is hostile: it answers 401, 403 or 500 echoing our request (headers
included) in the body, 200 with a body no client can parse (echoing too), never answers, or fails the TLS
handshake. `gpuops run` (autoprovision and spotpool, log level DEBUG) meets every one of them; then the
canaries, and their base64 and URL-quoted forms, are searched for in every GPUNodeGroup and SpotPool (status and
conditions), every Event, the whole operator log and /metrics: zero hits. The hostile server records what it was
sent, so the test also proves the canaries did go out (to the endpoints the objects name, over https or with
insecureAllowHTTP) and were echoed back: a client that leaked nothing because it sent nothing would fail here.
Every object must end with a failing condition that says why, and no reconcile may end in an exception (library
debug logs, which quote the exceptions the SDKs handle themselves, are allowed: they are searched for canaries
like everything else).
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from waiting import NotYet, until

from gpuops.kube.controller import RESULTS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
CRDS = [ROOT / "manifests" / "crds" / f"{n}.gpuops.io.yaml" for n in ("gpunodegroups", "spotpools")]
NS = "gpuops-system"
LABEL = "gpuops.io/canary-case"
SCENARIO = {
    "name": "secret-canary", "namespaces": [NS, "work"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "cpu", "gpuModel": "A100-80GB", "gpusPerNode": 1, "count": 1}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MODES = ("s401", "s403", "s500", "garbage", "hang", "tls")
BY_HOST = {"127.0.0.2": "s500", "127.0.0.3": "garbage", "127.0.0.4": "s401", "127.0.0.5": "s403",
           "127.0.0.6": "hang"}
"""For clients that always POST to / (the tencent SDK): the mode is the loopback address called."""


class Hostile:
    """Answers every request as its path (or BY_HOST) says: s401, s403, s500 that status; garbage 200 with an
    unparsable body; hang never. Always echoes the request line, headers and body; records what it got."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.host_urls: dict[str, str] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        echo = f"{request.method} {request.path_qs}\n" + "".join(f"{k}: {v}\n" for k, v in request.headers.items())
        echo += body.decode("utf-8", "replace")
        self.seen.append(echo)
        first = request.path.strip("/").split("/")[0]
        mode = first if first in MODES else BY_HOST.get(request.url.host or "", "s500")
        if mode == "hang":
            await asyncio.sleep(60)
        status = int(mode[1:]) if mode in ("s401", "s403", "s500") else 200
        prefix = "<<not json, not xml>> " if mode == "garbage" else ""
        return web.Response(status=status, text=prefix + echo, content_type="text/plain")


@asynccontextmanager
async def hostile_servers() -> AsyncIterator[tuple[Hostile, str, str]]:
    """The hostile app on plain HTTP and on HTTPS with a certificate nobody trusts: (app, http url, https url)."""
    hostile = Hostile()
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", hostile.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(ctx)
    sites = [web.TCPSite(runner, "127.0.0.1", 0), web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx),
             *(web.TCPSite(runner, host, 0) for host in BY_HOST)]
    for site in sites:
        await site.start()
    ports = [int(address[1]) for address in runner.addresses]
    hostile.host_urls = {host: f"http://{host}:{port}" for host, port in zip(BY_HOST, ports[2:], strict=True)}
    try:
        yield hostile, f"http://127.0.0.1:{ports[0]}", f"https://127.0.0.1:{ports[1]}"
    finally:
        await runner.cleanup()


def canary(case: str) -> str:
    return f"CANARY{case.replace('-', '')}{uuid.uuid4().hex[:12]}"


def forms(value: str) -> list[str]:
    return [value, base64.b64encode(value.encode()).decode(), urllib.parse.quote(value, safe="")]


async def secret(rig: OperatorHarness, name: str, data: dict[str, str]) -> dict[str, str]:
    await rig.request("POST", f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})
    return {"name": name, "namespace": NS}


GROUP_MODES = MODES
POOL_MODES = {provider: MODES for provider in ("webhook", "aws", "tencent")}


async def create_groups(rig: OperatorHarness, http: str, https: str, canaries: dict[str, str]) -> list[str]:
    names = []
    for mode in GROUP_MODES:
        name = f"canary-{mode}"
        canaries[name] = canary(name)
        base = https if mode == "tls" else http
        canaries[f"{name}-hmac"] = canary(f"{name}-hmac")  # never sent (it signs): it must not leak either
        hook = {"url": f"{base}/{mode}/power", "timeoutSeconds": 1,
                "secretRef": await secret(rig, f"{name}-token", {"token": canaries[name],
                                                                 "hmacKey": canaries[f"{name}-hmac"]}),
                "insecureAllowHTTP": mode != "tls"}
        await rig.request("POST", "/apis/gpuops.io/v1alpha1/gpunodegroups", {
            "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": name},
            "spec": {"nodeName": name, "gpuCount": 1, "scaleUp": hook, "scaleDown": dict(hook),
                     "template": {"labels": {LABEL: name}}}})
        await rig.request("POST", "/api/v1/namespaces/work/pods", {  # only this group could serve it: power on
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"wants-{name}"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {LABEL: name},
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        names.append(name)
    return names


def pool_keys(provider: str, value: str) -> dict[str, str]:
    if provider == "aws":
        return {"accessKeyId": f"AKIA{value}", "secretAccessKey": f"{value}sak"}
    if provider == "tencent":
        return {"secretId": f"AKID{value}", "secretKey": f"{value}sk"}
    return {"token": value}


def pool_endpoint(hostile: Hostile, provider: str, mode: str, http: str, https: str) -> str:
    if mode == "tls":
        return https if provider == "tencent" else f"{https}/tls/{provider}"
    if provider == "tencent":  # the SDK keeps only host:port: the address tells the mode
        return next(url for host, url in hostile.host_urls.items() if BY_HOST[host] == mode)
    return f"{http}/{mode}/{provider}"


async def create_pools(rig: OperatorHarness, hostile: Hostile, http: str, https: str,
                       canaries: dict[str, str]) -> list[str]:
    names = []
    for provider, modes in POOL_MODES.items():
        for mode in modes:
            name = f"canary-{provider}-{mode}"
            canaries[name] = canary(name)
            spec: dict[str, Any] = {
                "provider": provider, "endpoint": pool_endpoint(hostile, provider, mode, http, https),
                "minimum": 1, "maximum": 1,
                "credentialsSecretRef": await secret(rig, f"{name}-keys", pool_keys(provider, canaries[name])),
                "insecureAllowHTTP": mode != "tls", "template": {"instanceTypes": ["gpu.l4.1x"]}}
            if provider in ("aws", "tencent"):
                spec["template"].update(region="ap-guangzhou" if provider == "tencent" else "us-east-1",
                                        zones=["ap-guangzhou-3"] if provider == "tencent" else [])
            await rig.request("POST", "/apis/gpuops.io/v1alpha1/spotpools", {
                "apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": name}, "spec": spec})
            names.append(name)
    return names


FAILING = {("Ready", "False"), ("WebhookFailing", "True"), ("CredentialsInvalid", "True")}


async def failing(rig: OperatorHarness, path: str, names: list[str]) -> list[str]:
    """Names of the objects that do not yet show a failing condition with a reason and a message."""
    items = {o["metadata"]["name"]: o for o in (await rig.request("GET", path))["items"]}
    pending = []
    for name in names:
        conds = (items.get(name, {}).get("status") or {}).get("conditions") or []
        if not any((c["type"], c["status"]) in FAILING and c.get("reason") and c.get("message")
                   and c.get("reason") not in ("Observed",) for c in conds):
            pending.append(name)
    return pending


def reconciles(metrics: str, controller: str) -> float:
    """How many reconciles `controller` has finished, whatever their result, from the operator's /metrics."""
    return sum(metric_value(metrics, "controller_runtime_reconcile_total", {"controller": controller,
                                                                            "result": result}) or 0.0
               for result in RESULTS)


@pytest.mark.timeout(300)
async def test_no_secret_value_reaches_status_events_logs_or_metrics(tmp_path: Path) -> None:
    cluster = SimCluster(parse(SCENARIO), workload=False)
    canaries: dict[str, str] = {}
    async with hostile_servers() as (hostile, http, https), OperatorHarness(
            cluster, tmp_path, crds=CRDS, controllers=["autoprovision", "spotpool"], log_level="DEBUG",
            extra_args=["--spotpool-resync", "2", "--spotpool-call-timeout", "2"]) as rig:
        groups = await create_groups(rig, http, https, canaries)
        pools = await create_pools(rig, hostile, http, https, canaries)

        async def all_failing() -> bool:
            left = (await failing(rig, "/apis/gpuops.io/v1alpha1/gpunodegroups", groups)
                    + await failing(rig, "/apis/gpuops.io/v1alpha1/spotpools", pools))
            return not left

        await until("every object showing a failing condition", all_failing, 120)
        # a round of retries and resyncs more, each a chance to leak: every object's controller reconciles
        # as many more times as it has objects
        text, _, _ = await rig.scrape()
        wanted = {"autoprovision": reconciles(text, "autoprovision") + len(groups),
                  "spotpool": reconciles(text, "spotpool") + len(pools)}

        async def another_round() -> bool | NotYet:
            text, _, _ = await rig.scrape()
            seen = {name: reconciles(text, name) for name in wanted}
            return all(seen[name] >= n for name, n in wanted.items()) or NotYet((seen, wanted))

        await until("another round of reconciles", another_round, 60)

        echoed = "\n".join(hostile.seen)
        sent = [n for n, v in canaries.items() if v in echoed]
        # TLS fails before anything is sent; an HMAC key signs the body and never travels itself
        expected_sent = [n for n in canaries if not n.endswith(("-tls", "-hmac"))]
        assert sorted(sent) == sorted(expected_sent), f"canaries that never went out: {set(expected_sent) - set(sent)}"

        places = {
            "GPUNodeGroups": json.dumps(await rig.request("GET", "/apis/gpuops.io/v1alpha1/gpunodegroups")),
            "SpotPools": json.dumps(await rig.request("GET", "/apis/gpuops.io/v1alpha1/spotpools")),
            "Events": json.dumps(await rig.request("GET", "/api/v1/events")),
            "operator log": rig.log_path.read_text(),
            "/metrics": (await rig.scrape())[0],
        }
        leaks = [f"{name} in {where}" for where, text in places.items() for name, value in canaries.items()
                 for form in forms(value) if form in text]
        leaks += [f"'CANARY' in {where}: ...{text[max(0, i - 80):i + 40]!r}" for where, text in places.items()
                  if (i := text.find("CANARY")) >= 0]
        assert not leaks, "secret values leaked:\n" + "\n".join(sorted(set(leaks)))

        log = places["operator log"]
        assert "[redacted]" in log or "[redacted]" in places["Events"] or "[redacted]" in places["SpotPools"], \
            "nothing was ever redacted: the echoes did not reach any sink, so this test proves nothing"
        for controller in ("spotpool", "autoprovision"):
            errors = metric_value(places["/metrics"], "controller_runtime_reconcile_errors_total",
                                  {"controller": controller}) or 0
            assert errors == 0, f"{controller} reconciles ended in {errors} unhandled errors"
        raised = [line for line in log.splitlines() if '"event": "reconcile failed' in line
                  or '"event": "reconcile panicked' in line or '"event": "unexpected provider failure"' in line]
        assert not raised, "an exception escaped a reconcile:\n" + "\n".join(raised[:3])
