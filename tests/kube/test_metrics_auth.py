"""Secure metrics (gpuops/kube/metricsauth.py, tls.py; `gpuops run --metrics-secure`): HTTPS, TokenReview and
SubjectAccessReview against the emulated API server with RBAC enforced, over real HTTP.

The operator runs as a service account bound to manifests/rbac/metrics-auth-role.yaml only; the scraper as
one bound to manifests/rbac/metrics-reader-role.yaml. The emulator's review handlers are wrapped to count
the reviews it answers, which is how caching is shown; time is a fake clock, so TTLs need no sleeping.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import REGISTRY
from waiting import NotYet, until, wait_until

from gpuops import cli
from gpuops.kube.client import Client
from gpuops.kube.health import HTTPServer, metrics_app
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.metricsauth import ALLOW_TTL, DENY_TTL, TOKEN_FAILURE_TTL, TOKEN_TTL, MetricsAuth, TTLCache
from gpuops.kube.tls import CertError, CertKey, self_signed, server_context
from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver import auth as sim_auth

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    server: APIServer
    admin: Client
    operator: Client
    reader: str
    """A token of monitoring/prometheus, bound to gpuops-metrics-reader."""
    stranger: str
    """A token of monitoring/intruder: authenticated, bound to nothing."""
    reviews: collections.Counter[str]
    """TokenReviews and SubjectAccessReviews the emulator answered."""
    tmp: Path


async def _post(client: Client, path: str, body: Mapping[str, Any]) -> None:
    await client.request("POST", path, body=json.dumps(body).encode(), content_type="application/json")


def _binding(name: str, role: str, namespace: str, account: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}


def _manifest(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "manifests" / "rbac" / name).read_text())
    return doc


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    reviews: collections.Counter[str] = collections.Counter()
    token_review, access_review = sim_auth.token_review, sim_auth.subject_access_review

    def counted_token_review(body: Mapping[str, Any], authn: sim_auth.Authenticator) -> dict[str, Any]:
        reviews["TokenReview"] += 1
        return token_review(body, authn)

    def counted_access_review(body: Mapping[str, Any], rbac: sim_auth.RBACSource) -> dict[str, Any]:
        reviews["SubjectAccessReview"] += 1
        return access_review(body, rbac)

    monkeypatch.setattr(sim_auth, "token_review", counted_token_review)
    monkeypatch.setattr(sim_auth, "subject_access_review", counted_access_review)
    async with APIServer(authorization="RBAC", bookmark_interval=0.5) as server:
        server.write_kubeconfig(tmp_path / "admin")
        server.write_kubeconfig(tmp_path / "operator",
                                token=server.service_account_token("gpuops-system", "gpuops-controller"))
        admin = await Client.from_kubeconfig(str(tmp_path / "admin"))
        operator = await Client.from_kubeconfig(str(tmp_path / "operator"))
        try:
            for name in ("metrics-auth-role.yaml", "metrics-reader-role.yaml"):
                await _post(admin, f"{RBAC}/clusterroles", _manifest(name))
            await _post(admin, f"{RBAC}/clusterrolebindings",
                        _binding("gpuops-metrics-auth", "gpuops-metrics-auth", "gpuops-system", "gpuops-controller"))
            await _post(admin, f"{RBAC}/clusterrolebindings",
                        _binding("prometheus-gpuops", "gpuops-metrics-reader", "monitoring", "prometheus"))
            yield Env(server, admin, operator, server.service_account_token("monitoring", "prometheus"),
                      server.service_account_token("monitoring", "intruder"), reviews, tmp_path)
        finally:
            await operator.close()
            await admin.close()


@contextlib.asynccontextmanager
async def secure_metrics(auth: MetricsAuth, pair: CertKey) -> AsyncIterator[str]:
    """A metrics server guarded by `auth`, presenting `pair`; yields its URL."""
    server = HTTPServer("metrics", "127.0.0.1:0", metrics_app(guard=auth.check), ssl_context=server_context(pair))
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


def trusting(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


async def scrape(session: aiohttp.ClientSession, url: str, token: str | None = None,
                 header: str | None = None) -> tuple[int, str, str]:
    headers = {"Authorization": header if header is not None else f"Bearer {token}"} if token or header else {}
    async with session.get(url, headers=headers) as resp:
        return resp.status, await resp.text(), resp.headers.get("Content-Type", "")


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---------------------------------------------------------------------------------------------- authn/authz


async def test_only_a_bound_reader_gets_the_metrics(env: Env) -> None:
    pair = self_signed(["127.0.0.1"])
    before = {r: sample("gpuops_metrics_auth_requests_total", result=r)
              for r in ("allowed", "unauthenticated", "forbidden", "error")}
    async with secure_metrics(MetricsAuth(env.operator), pair) as url, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pair.ca_pem))) as session:
        assert url.startswith("https://")
        status, body, ctype = await scrape(session, f"{url}/metrics", env.reader)
        assert status == 200, body
        assert ctype.startswith("text/plain") and "# TYPE gpuops_metrics_auth_requests_total counter" in body

        status, body, _ = await scrape(session, f"{url}/metrics")
        assert (status, body) == (401, "Unauthorized: a bearer token is required\n")
        for header in ("Bearer", "Bearer ", "Basic cHJvbTpwdw==", env.reader):  # no bearer token in any of them
            assert (await scrape(session, f"{url}/metrics", header=header))[0] == 401, header
        assert (await scrape(session, f"{url}/metrics", "not-a-token"))[:2] == (401, "Unauthorized\n")
        assert (await scrape(session, f"{url}/metrics", header=f"bearer {env.reader}"))[0] == 200

        status, body, _ = await scrape(session, f"{url}/metrics", env.stranger)
        assert status == 403
        assert body == 'Forbidden: user "system:serviceaccount:monitoring:intruder" may not get path "/metrics"\n'
        # the SubjectAccessReview is about the path asked for: the reader may get /metrics and nothing else,
        # and unknown paths are refused before routing
        assert (await scrape(session, f"{url}/debug", env.reader))[0] == 403
        assert (await scrape(session, f"{url}/debug"))[0] == 401

        # HTTPS only: a plain-HTTP request gets no answer
        with pytest.raises(aiohttp.ClientError):
            await scrape(session, url.replace("https://", "http://") + "/metrics", env.reader)
    after = {r: sample("gpuops_metrics_auth_requests_total", result=r) - before[r] for r in before}
    assert after == {"allowed": 2, "unauthenticated": 7, "forbidden": 2, "error": 0}


async def test_reviews_are_cached_with_their_ttls(env: Env) -> None:
    clock = FakeClock()
    auth = MetricsAuth(env.operator, clock=clock)
    pair = self_signed(["127.0.0.1"])
    async with secure_metrics(auth, pair) as url, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pair.ca_pem))) as session:

        async def statuses(token: str, n: int = 4) -> set[int]:
            return {(await scrape(session, f"{url}/metrics", token))[0] for _ in range(n)}

        def counted() -> tuple[int, int]:
            return env.reviews["TokenReview"], env.reviews["SubjectAccessReview"]

        assert await statuses(env.reader) == {200}
        assert counted() == (1, 1)
        assert await statuses(env.stranger) == {403}
        assert counted() == (2, 2)  # a denial is cached too
        assert await statuses("not-a-token") == {401}
        assert counted() == (3, 2)  # and so is a rejected token (no SubjectAccessReview for it)

        # concurrent scrapes with a fresh token share one review of each kind
        other = env.server.service_account_token("monitoring", "prometheus")
        got = await asyncio.gather(*(scrape(session, f"{url}/metrics", other) for _ in range(8)))
        assert {s for s, _, _ in got} == {200}
        assert counted() == (4, 2)  # same user as the reader: its access answer was cached already

        clock.now += TOKEN_FAILURE_TTL + 0.1  # the rejected token is asked about again
        assert await statuses("not-a-token") == {401}
        assert counted() == (5, 2)
        clock.now += DENY_TTL  # > the deny TTL since the stranger was refused; < every other TTL
        assert min(ALLOW_TTL, TOKEN_TTL) > DENY_TTL + TOKEN_FAILURE_TTL
        assert await statuses(env.stranger) == {403}
        assert counted() == (5, 3)
        assert await statuses(env.reader) == {200}
        assert counted() == (5, 3)
        clock.now += max(ALLOW_TTL, TOKEN_TTL)  # everything expired
        assert await statuses(env.reader) == {200}
        assert counted() == (6, 4)

        # a cached allow outlives the binding until its TTL: the price of caching, bounded by ALLOW_TTL
        await env.admin.request("DELETE", f"{RBAC}/clusterrolebindings/prometheus-gpuops")
        assert await statuses(env.reader) == {200}
        clock.now += ALLOW_TTL + 0.1
        assert await statuses(env.reader) == {403}
    assert sample("gpuops_metrics_auth_cache_hits_total", kind="TokenReview") > 0


async def test_caches_are_bounded(env: Env) -> None:
    clock = FakeClock()
    cache: TTLCache[str, int] = TTLCache(max_entries=3, clock=clock)
    for i, key in enumerate("abcd"):
        cache.put(key, i, 10)
    assert len(cache) == 3 and cache.get("a") is None  # the oldest went
    assert cache.get("b") == 1  # b is now the most recently used
    cache.put("e", 4, 10)
    assert cache.get("c") is None and cache.get("b") == 1
    cache.put("b", 5, 0)  # ttl 0: not kept (and an older value is dropped)
    assert cache.get("b") is None
    clock.now += 10
    assert cache.get("d") is None and cache.get("e") is None and len(cache) == 0

    auth = MetricsAuth(env.operator, max_entries=2, clock=clock)
    tokens = [env.server.service_account_token("monitoring", f"scraper-{i}") for i in range(5)]
    for token in tokens:
        assert await auth.authenticate(token) is not None
    assert len(auth.tokens) == 2
    assert await auth.authenticate(tokens[-1]) is not None
    assert env.reviews["TokenReview"] == 5  # the newest stayed cached


async def test_an_api_outage_fails_closed_and_is_not_cached(env: Env) -> None:
    faults = env.server.faults
    auth = MetricsAuth(env.operator, retry_initial=0.02, timeout=5)
    pair = self_signed(["127.0.0.1"])
    errors = sample("gpuops_metrics_auth_requests_total", result="error")
    async with secure_metrics(auth, pair) as url, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pair.ca_pem))) as session:
        faults.add_error(503, resources=["tokenreviews"])
        status, body, _ = await scrape(session, f"{url}/metrics", env.reader)
        assert status == 503 and body.startswith("Service Unavailable: TokenReview failed: 503"), body
        assert env.reviews["TokenReview"] == 0 and faults.injected == 3  # tried three times, then gave up
        assert len(auth.tokens) == 0
        faults.clear()
        assert (await scrape(session, f"{url}/metrics", env.reader))[0] == 200  # nothing bad was cached

        auth.access.clear()
        faults.add_error(500, resources=["subjectaccessreviews"])
        status, body, _ = await scrape(session, f"{url}/metrics", env.reader)
        assert status == 503 and "SubjectAccessReview failed" in body, body
        assert len(auth.access) == 0
        faults.clear()

        # one failure is absorbed by a retry
        faults.add_error(503, resources=["subjectaccessreviews"], count=1)
        assert (await scrape(session, f"{url}/metrics", env.reader))[0] == 200
        assert faults.injected == 3 + 3 + 1

    # no API server at all
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    kubeconfig = (env.tmp / "operator").read_text().replace(env.server.url, f"http://127.0.0.1:{dead}")
    (env.tmp / "dead").write_text(kubeconfig)
    async with await Client.from_kubeconfig(str(env.tmp / "dead")) as unreachable:
        auth = MetricsAuth(unreachable, retry_initial=0.02, timeout=5)
        async with secure_metrics(auth, pair) as url, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pair.ca_pem))) as session:
            status, body, _ = await scrape(session, f"{url}/metrics", env.reader)
            assert status == 503 and "TokenReview failed" in body, body
            assert len(auth.tokens) == 0

    # an operator without gpuops-metrics-auth: the API server forbids the review -> 500, never allowed
    env.server.write_kubeconfig(env.tmp / "unbound", token=env.server.service_account_token("gpuops-system", "x"))
    unbound = await Client.from_kubeconfig(str(env.tmp / "unbound"))
    async with unbound, secure_metrics(MetricsAuth(unbound), pair) as url, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(pair.ca_pem))) as session:
        status, body, _ = await scrape(session, f"{url}/metrics", env.reader)
        assert status == 500 and "TokenReview failed: 403 Forbidden" in body, body
    assert sample("gpuops_metrics_auth_requests_total", result="error") - errors == 4


# ---------------------------------------------------------------------------------------------- certificates


def publish(directory: Path, pair: CertKey, version: str) -> None:
    """Write tls.crt/tls.key the way the kubelet updates a Secret volume: a new timestamped directory, then
    an atomic swap of the `..data` symlink the files point through."""
    data = directory / f"..{version}"
    data.mkdir()
    (data / "tls.crt").write_bytes(pair.cert_pem)
    (data / "tls.key").write_bytes(pair.key_pem)
    (directory / "..data_tmp").symlink_to(data.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


async def presented(url: str) -> bytes:
    """The DER certificate the server at `url` presents in a new handshake."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def leaf_der(pair: CertKey) -> bytes:
    return x509.load_pem_x509_certificate(pair.cert_pem).public_bytes(serialization.Encoding.DER)


async def test_certificates_from_a_directory_are_reloaded_as_they_rotate(env: Env) -> None:
    certs = env.tmp / "certs"
    certs.mkdir()
    first, second, third = (self_signed(["127.0.0.1", "localhost"]) for _ in range(3))
    publish(certs, first, "v1")
    mgr = Manager(env.operator, ManagerOptions(metrics_bind_address="127.0.0.1:0", metrics_secure=True,
                  metrics_cert_dir=str(certs), metrics_cert_poll_interval=0.05, health_probe_bind_address="0"))
    task = asyncio.create_task(mgr.run())
    try:
        await until("the manager started", mgr.elected.wait, 10)
        assert mgr.metrics_server is not None
        url = mgr.metrics_server.url
        assert await presented(url) == leaf_der(first)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/metrics", ssl=trusting(first.ca_pem),
                                   headers={"Authorization": f"Bearer {env.reader}"}) as resp:
                assert resp.status == 200

            publish(certs, second, "v2")

            async def rotated() -> bool:
                return await presented(url) == leaf_der(second)

            await until("the rotated certificate is served", rotated, 10)
            async with session.get(f"{url}/metrics", ssl=trusting(second.ca_pem),
                                   headers={"Authorization": f"Bearer {env.reader}"}) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"{url}/metrics", ssl=trusting(first.ca_pem))

            # a half-updated Secret (a key that does not match): ignored, the current pair keeps serving
            errors = sample("gpuops_tls_certificate_reloads_total", server="metrics", result="error")
            publish(certs, CertKey(third.cert_pem, second.key_pem), "v3")

            async def rejected() -> bool:
                return sample("gpuops_tls_certificate_reloads_total", server="metrics", result="error") > errors

            await until("the mismatched pair is rejected", rejected, 10)
            assert await presented(url) == leaf_der(second)
            publish(certs, third, "v4")

            async def recovered() -> bool:
                return await presented(url) == leaf_der(third)

            await until("the completed update is served", recovered, 10)
    finally:
        mgr.request_stop()
        await asyncio.wait_for(task, 15)


async def test_secure_metrics_configuration(env: Env) -> None:
    # self-signed when no directory is given
    mgr = Manager(env.operator, ManagerOptions(metrics_bind_address="127.0.0.1:0", metrics_secure=True,
                  health_probe_bind_address="0"))
    assert mgr.metrics_certs is None and mgr.metrics_auth is not None
    task = asyncio.create_task(mgr.run())
    try:
        await until("the manager started", mgr.elected.wait, 10)
        assert mgr.metrics_server is not None
        cert = x509.load_der_x509_certificate(await presented(mgr.metrics_server.url))
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in names.get_values_for_type(x509.DNSName)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session:
            assert (await scrape(session, f"{mgr.metrics_server.url}/metrics", env.reader))[0] == 200
            assert (await scrape(session, f"{mgr.metrics_server.url}/metrics"))[0] == 401
    finally:
        mgr.request_stop()
        await asyncio.wait_for(task, 15)
    with pytest.raises(ValueError, match="needs secure metrics"):
        Manager(env.operator, ManagerOptions(metrics_cert_dir=str(env.tmp), health_probe_bind_address="0"))
    with pytest.raises(CertError, match="cannot read"):
        Manager(env.operator, ManagerOptions(metrics_secure=True, metrics_cert_dir=str(env.tmp / "nowhere"),
                health_probe_bind_address="0"))
    plain = Manager(env.operator, ManagerOptions(metrics_bind_address="127.0.0.1:0", health_probe_bind_address="0"))
    assert plain.metrics_server is not None and plain.metrics_server.url.startswith("http://")
    assert plain.metrics_auth is None


# ---------------------------------------------------------------------------------------------- gpuops run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _https_get(url: str, token: str | None = None) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_run_flags_are_checked(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n"
        "users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
        "current-context: c\n")
    base = ["run", "--kubeconfig", str(tmp_path / "kubeconfig"), "--health-probe-bind-address", "0"]
    assert cli.main([*base, "--metrics-cert-dir", str(tmp_path)]) == 2
    assert cli.main([*base, "--metrics-secure", "--metrics-cert-dir", str(tmp_path / "nowhere")]) == 2


def test_gpuops_run_metrics_secure(rbac_apiserver: Any) -> None:
    """The real entrypoint: `gpuops run --metrics-secure` serves HTTPS to the bound reader only."""
    server: APIServer = rbac_apiserver.server
    reader = rbac_apiserver.run(server.service_account_token, "monitoring", "prometheus")

    def post(path: str, body: Mapping[str, Any]) -> None:
        req = urllib.request.Request(f"{rbac_apiserver.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {rbac_apiserver.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 201

    post(f"{RBAC}/clusterroles", _manifest("metrics-reader-role.yaml"))
    post(f"{RBAC}/clusterrolebindings", _binding("prom", "gpuops-metrics-reader", "monitoring", "prometheus"))
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuops", "run", "--kubeconfig", str(rbac_apiserver.kubeconfig),
         "--controllers=-budget,-autoprovision,-spotpool,-migslicer", "--metrics-secure",
         "--metrics-bind-address", f"127.0.0.1:{port}", "--health-probe-bind-address", "0", "--log-format", "json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        url = f"https://127.0.0.1:{port}/metrics"

        def served() -> bool | NotYet:
            assert proc.poll() is None, proc.communicate()[0]
            status = _https_get(url, reader)
            return status == 200 or NotYet(f"status {status}")

        wait_until("gpuops run serving metrics", served, 60, every=0.1)
        assert _https_get(url) == 401
        assert _https_get(url, "not-a-token") == 401
        stranger = rbac_apiserver.run(server.service_account_token, "monitoring", "intruder")
        assert _https_get(url, stranger) == 403
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "self-signed certificate" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
