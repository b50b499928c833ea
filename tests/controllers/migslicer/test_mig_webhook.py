"""The MIG slicer webhook over real HTTPS, called by the emulated apiserver exactly as kube-apiserver would:
the configuration from manifests/webhook/, our own CA, the caBundle patcher, failurePolicy, namespace
exclusions, reinvocation; plus the certificate helpers and the raw endpoint."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cryptography import x509
from prometheus_client import REGISTRY
from waiting import until_holds

from gpuops.controllers.migslicer.api import GATE
from gpuops.controllers.migslicer.webhook import FIELD_MANAGER, MUTATE_PATH, install, mig_server
from gpuops.kube.admission.cabundle import MUTATING_WEBHOOK_CONFIGURATIONS as MWC
from gpuops.kube.admission.cabundle import CABundlePatcher, merge_ca_bundle
from gpuops.kube.admission.certs import (
    CertKeeper,
    create_ca,
    issue_serving_cert,
    load_or_create,
    needs_rotation,
    service_dns_names,
)
from gpuops.kube.admission.review import JSONPatchOp, MutationResult
from gpuops.kube.admission.server import WebhookServer
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Forbidden
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import NAMESPACES, PODS
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests" / "webhook"
CONFIG = "gpuops-mig-slicer"
HOOK = "mig-slicer.gpuops.io"
MIG = "nvidia.com/mig-1g.10gb"
OURS = "gpuops.io/mig-1g.10gb"
NAMES = [*service_dns_names("gpuops-webhook", "gpuops-system"), "127.0.0.1"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Env:
    api: APIServer
    client: Client
    keeper: CertKeeper
    server: WebhookServer

    def patcher(self, **kw: Any) -> CABundlePatcher:
        return CABundlePatcher(self.client, CONFIG, self.keeper.ca_pem, FIELD_MANAGER, **kw)

    async def config(self) -> dict[str, Any]:
        return await self.client.get(MWC, CONFIG)

    async def set_hook(self, **changes: Any) -> None:
        cfg = await self.config()
        cfg["webhooks"][0].update(changes)
        await self.client.replace(MWC, cfg)


def manifest_config(client_config: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((MANIFESTS / "mutatingwebhookconfiguration.yaml").read_text())
    if client_config is not None:
        cfg["webhooks"][0]["clientConfig"] = client_config
    return cfg


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with APIServer() as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        client = await Client.from_kubeconfig(str(tmp_path / "kubeconfig"))
        keeper = CertKeeper(NAMES)
        server = mig_server(keeper, host="127.0.0.1", port=0)
        await server.start()
        try:
            for ns in ("ml", "gpuops-system"):
                await client.create(NAMESPACES, {"metadata": {"name": ns}})
            # as shipped, except that the apiserver reaches the webhook by URL (no cluster DNS here)
            await client.create(MWC, manifest_config({"url": server.url(MUTATE_PATH)}))
            yield Env(api, client, keeper, server)
        finally:
            await server.stop()
            await client.close()


def pod(name: str, resources: dict[str, Any] | None = None, ns: str = "ml", **spec: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "train", "image": "cuda"}
    if resources is not None:
        c["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [c], **spec}}


def mig_pod(name: str, ns: str = "ml") -> dict[str, Any]:
    return pod(name, {"limits": {MIG: "1", "cpu": "1"}}, ns)


def resources_of(p: Any, index: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    r = p.spec.containers[index].resources
    return dict(r.requests or {}), dict(r.limits or {})


def gates_of(p: Any) -> list[str]:
    return [g.name for g in p.spec.scheduling_gates or []]


def counter(result: str) -> float:
    return REGISTRY.get_sample_value("gpuops_migslicer_webhook_requests_total", {"result": result}) or 0.0


# ---------------------------------------------------------------------------------------------- end to end


async def test_empty_ca_bundle_fails_closed_until_the_patcher_fills_it(env: Env) -> None:
    with pytest.raises(ApiError) as e:
        await env.client.create(PODS, mig_pod("early"))
    assert e.value.status == 500
    assert f'failed calling webhook "{HOOK}"' in e.value.message
    assert "x509: certificate signed by unknown authority" in e.value.message

    patcher = env.patcher()
    assert await patcher.sync() is True
    rv = (await env.config())["metadata"]["resourceVersion"]
    assert await patcher.sync() is False, "no write while the bundle already trusts us"
    assert (await env.config())["metadata"]["resourceVersion"] == rv
    bundle = base64.b64decode((await env.config())["webhooks"][0]["clientConfig"]["caBundle"])
    assert bundle == env.keeper.ca_pem()

    before = counter("mutated")
    created = await env.client.create(PODS, mig_pod("train"))
    for got in (created, await env.client.get(PODS, "train", "ml")):
        requests, limits = resources_of(got)
        assert limits == {OURS: "1", "cpu": "1"}
        assert requests == {OURS: "1", "cpu": "1"}
        assert gates_of(got) == [GATE]
    assert counter("mutated") == before + 1


async def test_exclusions_non_mig_pods_and_denials(env: Env) -> None:
    await env.patcher().sync()
    # the operator's own namespace (and kube-system) are never sent to the webhook: it must be able to start
    for ns in ("gpuops-system", "kube-system"):
        untouched = await env.client.create(PODS, mig_pod("sys", ns))
        assert resources_of(untouched)[1] == {MIG: "1", "cpu": "1"}
        assert gates_of(untouched) == []

    before = counter("unchanged")
    plain = await env.client.create(PODS, pod("plain", {"limits": {"nvidia.com/gpu": "1"}}))
    assert resources_of(plain)[1] == {"nvidia.com/gpu": "1"} and gates_of(plain) == []
    assert counter("unchanged") == before, "a non-MIG pod is not even sent to the webhook (matchConditions)"

    before = counter("denied")
    with pytest.raises(Forbidden) as e:
        await env.client.create(PODS, pod("bad", {"limits": {"nvidia.com/mig-foo": "1"}}))
    assert e.value.message.startswith(f'admission webhook "{HOOK}" denied the request: container "train"')
    assert '"nvidia.com/mig-foo"' in e.value.message and "nvidia.com/mig-<compute>g.<memory>gb" in e.value.message
    with pytest.raises(Forbidden, match="not both"):
        await env.client.create(PODS, pod("both", {"limits": {MIG: "1", "nvidia.com/gpu": "1"}}))
    assert counter("denied") == before + 2
    with pytest.raises(ApiError):
        await env.client.get(PODS, "bad", "ml")


async def test_dry_run_is_mutated_without_side_effects(env: Env) -> None:
    await env.patcher().sync()
    raw = await env.client.request("POST", PODS.path("ml"), query={"dryRun": "All"},
                                   body=json.dumps(mig_pod("dry")).encode())
    got = json.loads(raw)
    assert got["spec"]["schedulingGates"] == [{"name": GATE}]
    assert got["spec"]["containers"][0]["resources"]["limits"] == {OURS: "1", "cpu": "1"}


async def test_a_reset_ca_bundle_is_repatched(env: Env) -> None:
    patcher = env.patcher(interval=0.1)
    checks: list[str] = []  # each check of the patcher begins with a GET of the configuration
    read = ("mutatingwebhookconfigurations", "get")
    env.api.audit_hooks.append(
        lambda d: checks.append(d.attrs.name) if (d.attrs.resource, d.attrs.verb) == read else None)
    task = asyncio.create_task(patcher.run())
    try:
        await until_holds("1 CA bundle writes", lambda: patcher.writes == 1)
        # `kubectl apply` of an old copy
        await env.set_hook(clientConfig={"url": env.server.url(MUTATE_PATH), "caBundle": ""})
        await until_holds("2 CA bundle writes", lambda: patcher.writes == 2)
        got = await env.client.create(PODS, mig_pod("after-reset"))
        assert gates_of(got) == [GATE]
        seen = len(checks)
        # two more checks: the first may have begun before this point, the second began after
        await until_holds("two more periodic checks", lambda: len(checks) >= seen + 2)
        assert patcher.writes == 2, "periodic checks must not write an unchanged bundle"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_webhook_down_fail_versus_ignore(env: Env) -> None:
    """Why we ship Fail: with Ignore, a MIG pod created while the webhook is down is admitted as written,
    asking for nvidia.com/mig-* with no gate, so the slicer never sees it (it waits for NVIDIA's static plugin)."""
    await env.patcher().sync()
    await env.server.stop()
    with pytest.raises(ApiError) as e:
        await env.client.create(PODS, mig_pod("down"))
    assert e.value.status == 500 and "connection refused" in e.value.message

    await env.set_hook(failurePolicy="Ignore")
    admitted = await env.client.create(PODS, mig_pod("down"))
    assert resources_of(admitted)[1] == {MIG: "1", "cpu": "1"}
    assert gates_of(admitted) == []


async def test_reinvocation_after_a_later_webhook_adds_a_mig_container(env: Env, tmp_path: Path) -> None:
    """A sidecar injector (configured after ours by name) adds a container asking for a slice; IfNeeded calls
    us again, and the second call renames only what is new and does not add the gate twice."""
    await env.patcher().sync()

    def inject(p: Mapping[str, Any]) -> MutationResult:
        if any(c.get("name") == "sidecar" for c in p["spec"]["containers"]):
            return MutationResult()
        sidecar = {"name": "sidecar", "image": "x", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}}
        ops: list[JSONPatchOp] = [{"op": "add", "path": "/spec/containers/-", "value": sidecar}]
        return MutationResult(patch=ops)

    injector_certs = load_or_create(["127.0.0.1"])
    injector = mig_server(injector_certs, host="127.0.0.1", port=0, mutate_pod=inject)
    await injector.start()
    try:
        second = manifest_config({"url": injector.url(MUTATE_PATH),
                                  "caBundle": base64.b64encode(injector_certs.ca_bundle_pem).decode()})
        second["metadata"]["name"] = "zz-sidecar-injector"
        second["webhooks"][0]["name"] = "sidecar.example.com"
        second["webhooks"][0]["reinvocationPolicy"] = "Never"
        await env.client.create(MWC, second)
        got = await env.client.create(PODS, mig_pod("with-sidecar"))
    finally:
        await injector.stop()
    assert [c.name for c in got.spec.containers or ()] == ["train", "sidecar"]
    assert resources_of(got, 0)[1] == {OURS: "1", "cpu": "1"}
    assert resources_of(got, 1) == ({"gpuops.io/mig-2g.20gb": "1"}, {"gpuops.io/mig-2g.20gb": "1"})
    assert gates_of(got) == [GATE]


async def test_service_client_config_as_shipped_verifies_the_service_name(env: Env) -> None:
    await env.client.delete(MWC, CONFIG)
    await env.client.create(MWC, manifest_config())
    env.api.service_endpoints[("gpuops-system", "gpuops-webhook")] = f"127.0.0.1:{env.server.port}"
    await env.patcher().sync()
    got = await env.client.create(PODS, mig_pod("via-service"))
    assert gates_of(got) == [GATE]


async def test_replicas_with_their_own_cas_share_the_bundle(env: Env) -> None:
    other = CertKeeper(NAMES)
    mine, theirs = env.patcher(), CABundlePatcher(env.client, CONFIG, other.ca_pem, FIELD_MANAGER)
    assert await mine.sync() and await theirs.sync()
    assert not await mine.sync() and not await theirs.sync(), "replicas must not fight over the order"
    bundle = base64.b64decode((await env.config())["webhooks"][0]["clientConfig"]["caBundle"])
    assert bundle == env.keeper.ca_pem() + other.ca_pem()
    got = await env.client.create(PODS, mig_pod("two-replicas"))
    assert gates_of(got) == [GATE]


# ---------------------------------------------------------------------------------------------- the endpoint


@pytest.fixture
async def raw(env: Env) -> AsyncIterator[aiohttp.ClientSession]:
    ctx = ssl.create_default_context(cadata=env.keeper.ca_pem().decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield session


def review(obj: Any, uid: str = "u-1", **request: Any) -> dict[str, Any]:
    req = {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE", "object": obj,
           **request}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


async def test_endpoint_answers_reviews_and_rejects_garbage(env: Env, raw: aiohttp.ClientSession) -> None:
    url = env.server.url(MUTATE_PATH)
    async with raw.post(url, json=review(mig_pod("p"), uid="abc")) as resp:
        assert resp.status == 200
        body = await resp.json()
    response = body["response"]
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert (response["uid"], response["allowed"], response["patchType"]) == ("abc", True, "JSONPatch")
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]} in \
        json.loads(base64.b64decode(response["patch"]))

    async with raw.post(url, json=review(pod("bad", {"limits": {"nvidia.com/mig-x": 1}}))) as resp:
        denied = (await resp.json())["response"]
    assert denied["allowed"] is False and "patch" not in denied
    assert denied["status"]["code"] == 403 and "nvidia.com/mig-x" in denied["status"]["message"]

    async with raw.post(url, json=review(mig_pod("p"), operation="UPDATE", oldObject=mig_pod("p"))) as resp:
        assert (await resp.json())["response"] == {"uid": "u-1", "allowed": True}

    before = counter("error")
    for bad in (b"not json", b"[]", json.dumps({"kind": "AdmissionReview"}).encode(),
                json.dumps(review(mig_pod("p"), uid="")).encode(),
                json.dumps(review("a string")).encode()):
        async with raw.post(url, data=bad, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400, bad
    assert counter("error") == before + 5
    async with raw.get(url.replace("/mutate-pods", "/healthz")) as resp:
        assert resp.status == 200 and await resp.text() == "ok"
    assert (REGISTRY.get_sample_value("gpuops_migslicer_webhook_request_duration_seconds_count") or 0) >= 8


async def test_serving_certificate_is_swapped_in_place(env: Env) -> None:
    async def presented_serial() -> int:
        ctx = ssl.create_default_context(cadata=env.keeper.ca_pem().decode())
        _, writer = await asyncio.open_connection("127.0.0.1", env.server.port, ssl=ctx)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der).serial_number

    first, ca = await presented_serial(), env.keeper.current.ca
    assert not await env.server.refresh_certificates(), "nothing is due yet"
    env.keeper.margin = datetime.timedelta(days=366)  # the leaf is now "due"; the 10-year CA is not
    assert await env.server.refresh_certificates()
    second = await presented_serial()
    assert second != first and second == env.keeper.current.serving.cert.serial_number
    assert env.keeper.current.ca == ca, "same CA: the caBundle the apiserver has stays valid"


async def test_a_new_ca_is_trusted_before_it_is_presented(env: Env) -> None:
    patcher = env.patcher()
    await patcher.sync()
    old = env.keeper.current

    async def unreachable() -> None:
        raise ApiError(0, "TransportError", "apiserver down")

    env.keeper.before_new_ca.append(unreachable)
    env.keeper.margin = datetime.timedelta(days=3651)  # the CA itself is now due
    assert not await env.server.refresh_certificates(), "the bundle does not trust the new CA yet"
    assert env.keeper.ca_pending and env.keeper.current.ca != old.ca
    assert gates_of(await env.client.create(PODS, mig_pod("still-old-cert"))) == [GATE]

    env.keeper.before_new_ca[:] = [patcher.sync]
    env.keeper.margin = datetime.timedelta(days=30)
    assert await env.server.refresh_certificates()
    bundle = base64.b64decode((await env.config())["webhooks"][0]["clientConfig"]["caBundle"])
    assert bundle == old.ca.cert_pem + env.keeper.ca_pem(), "both CAs while the old one is still valid"
    assert gates_of(await env.client.create(PODS, mig_pod("new-cert"))) == [GATE]


# ---------------------------------------------------------------------------------------------- certificates


def test_certificates_cover_the_service_names_and_expire_as_intended() -> None:
    now = datetime.datetime.now(datetime.UTC)
    certs = load_or_create([*service_dns_names("svc", "ns"), "127.0.0.1", "::1"], now=now)
    leaf, ca = certs.serving.cert, certs.ca.cert
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.ns.svc", "svc.ns.svc.cluster.local"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert 364 <= (leaf.not_valid_after_utc - now).days <= 365
    assert 3649 <= (ca.not_valid_after_utc - now).days <= 3650
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(ca)
    assert not needs_rotation(leaf, now)
    assert needs_rotation(leaf, now + datetime.timedelta(days=340))
    assert needs_rotation(leaf, now - datetime.timedelta(days=1)), "not yet valid"
    assert not needs_rotation(certs.serving.cert_pem, now + datetime.timedelta(days=300),
                              datetime.timedelta(days=1))


def test_a_directory_keeps_the_ca_across_restarts(tmp_path: Path) -> None:
    first = load_or_create(NAMES, tmp_path / "certs")
    assert sorted(os.listdir(tmp_path / "certs")) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert (tmp_path / "certs" / "ca.key").stat().st_mode & 0o077 == 0
    again = load_or_create(NAMES, tmp_path / "certs")
    assert again == first
    widened = load_or_create([*NAMES, "extra.example"], tmp_path / "certs")
    assert widened.ca == first.ca and widened.serving != first.serving, "new names: same CA, new leaf"
    (tmp_path / "certs" / "ca.key").write_bytes(create_ca().key_pem)  # a mismatched key is not trusted
    assert load_or_create(NAMES, tmp_path / "certs").ca != first.ca


def test_an_unwritable_directory_still_serves_from_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    certs = load_or_create(NAMES, blocker / "certs")  # cannot be created: a file is in the way
    assert certs.ssl_context() is not None
    # without memory files (not Linux), keys pass through a private temporary directory instead
    monkeypatch.setattr(os, "memfd_create", lambda *_: (_ for _ in ()).throw(OSError("unsupported")))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert certs.ssl_context() is not None
    assert os.listdir(tmp_path) == ["file"], "nothing is left behind"
    assert issue_serving_cert(certs.ca, ["a.b"]).cert.issuer == certs.ca.cert.subject


def test_merge_ca_bundle_prunes_expired_and_caps() -> None:
    now = datetime.datetime.now(datetime.UTC)
    ours = create_ca().cert_pem
    expired = create_ca(now=now - datetime.timedelta(days=20), validity=datetime.timedelta(days=10)).cert_pem
    others = [create_ca(now=now - datetime.timedelta(hours=i)).cert_pem for i in range(5)]
    assert merge_ca_bundle(b"", ours) == ours
    assert merge_ca_bundle(b"garbage", ours) == ours
    assert merge_ca_bundle(expired + others[0], ours) == others[0] + ours
    capped = merge_ca_bundle(b"".join(others), ours, max_cas=3)
    assert capped == others[0] + others[1] + ours, "the oldest others go first, ours always stays"
    assert merge_ca_bundle(capped, ours, max_cas=3) == capped


# ---------------------------------------------------------------------------------------------- wiring


async def test_install_adds_both_runnables_without_leadership(env: Env) -> None:
    manager = Manager(env.client, ManagerOptions(leader_election=True))
    hook = install(manager, port=0, host="127.0.0.1", extra_names=["127.0.0.1"], ca_check_interval=0.1)
    runnables = {r.name: r for r in manager.runnables()}
    assert set(runnables) == {"migslicer-webhook", "migslicer-webhook-cabundle"}
    assert not any(r.need_leader_election for r in runnables.values())
    # not ready before it serves and before the API server trusts its CA (failurePolicy Fail: the Service would
    # route pod creations to a replica that refuses them)
    before = await manager.readyz.run_one("migslicer-webhook")
    assert not before.ok and "not listening" in before.reason
    tasks = [asyncio.create_task(r.run()) for r in runnables.values()]
    try:
        await hook.server.wait_started()
        assert hook.patcher is not None
        await until_holds("the first CA bundle write", lambda: hook.patcher is not None and hook.patcher.writes == 1)
        assert (await manager.readyz.run_one("migslicer-webhook")).ok
        await env.set_hook(clientConfig={"url": hook.server.url(MUTATE_PATH),
                                         "caBundle": (await env.config())["webhooks"][0]["clientConfig"]["caBundle"]})
        got = await env.client.create(PODS, mig_pod("installed"))
        assert gates_of(got) == [GATE]
    finally:
        for r in runnables.values():
            r.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


# ---------------------------------------------------------------------------------------------- helpers


