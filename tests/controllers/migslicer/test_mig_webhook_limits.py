"""The MIG webhook cannot be starved: every phase of a connection has a deadline, heads and bodies a size, JSON a
depth (400, never 500), and under 200 slow clients plus 4 senders of 1 MB reviews the webhook's /healthz answers
within 100 ms, small reviews within 50 ms at p99, and the caller's event loop (the controllers') never stalls.

The load comes from two other processes (as the API server and attackers are): one holds slow connections open
(reconnecting when cut), one posts 1 MB reviews from four threads. Measured side by side on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpuops.controllers.migslicer.webhook import MUTATE_PATH, mig_server
from gpuops.kube.admission.certs import load_or_create
from gpuops.kube.admission.http import Limits
from gpuops.kube.admission.server import WebhookServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def review(pod: dict[str, Any], uid: str = "u-1") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                        "namespace": "work", "object": pod}}


SMALL = review({"metadata": {"name": "p", "namespace": "work"},
                "spec": {"containers": [{"name": "c", "image": "x",
                                         "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}]}})


@contextlib.asynccontextmanager
async def serving(limits: Limits | None = None) -> AsyncIterator[WebhookServer]:
    certs = load_or_create(["127.0.0.1"])
    async with mig_server(certs, host="127.0.0.1", port=0, limits=limits) as server:
        yield server


def client_ssl() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def raw_exchange(port: int, data: bytes, wait: float = 5.0) -> bytes:
    """Send `data` over TLS and read until the server closes (or `wait` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl())
    writer.write(data)
    await writer.drain()
    out = b""
    with contextlib.suppress(TimeoutError, ConnectionError, ssl.SSLError):
        async with asyncio.timeout(wait):
            while chunk := await reader.read(65536):
                out += chunk
    writer.close()
    return out


async def test_each_phase_has_a_deadline_and_each_part_a_size() -> None:
    limits = Limits(header_timeout=0.3, body_timeout=0.3, idle_timeout=0.5, max_header_bytes=2048,
                    max_body_bytes=10_000)
    async with serving(limits) as server:
        began = time.monotonic()
        out = await raw_exchange(server.port, b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\n")
        assert out.startswith(b"HTTP/1.1 408 "), out
        assert time.monotonic() - began < 2.0  # cut at the deadline, not held
        out = await raw_exchange(server.port, b"POST /mutate-pods HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        assert out == b"", out  # a body that never comes: closed
        out = await raw_exchange(server.port, b"POST /mutate-pods HTTP/1.1\r\nContent-Length: 20000\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 413 "), out
        out = await raw_exchange(server.port, b"POST /mutate-pods HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 411 "), out
        out = await raw_exchange(server.port, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 431 "), out
        # kept alive between requests, then closed when idle
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_ssl())
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"keep-alive" in head, head
            assert await reader.readexactly(2) == b"ok"
        async with asyncio.timeout(3):
            assert await reader.read() == b""
        writer.close()


async def test_json_too_deep_or_broken_is_a_400_naming_the_problem() -> None:
    async with serving() as server, aiohttp.ClientSession() as http:
        url = server.url(MUTATE_PATH)
        for body, words in ((b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
                            (json.dumps(review({"metadata": _nested(80)})).encode(), "nested deeper than 64"),
                            (b'{"apiVersion": ', "not JSON")):
            async with http.post(url, data=body, ssl=client_ssl()) as resp:
                assert resp.status == 400 and words in await resp.text(), (resp.status, await resp.text())
        async with http.post(url, json=SMALL, ssl=client_ssl()) as resp:
            answer = await resp.json()
            assert resp.status == 200 and answer["response"]["allowed"] and answer["response"]["patch"]


def _nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


SLOW_CLIENTS = textwrap.dedent("""
    import socket, ssl, sys, threading, time
    port, headers, bodies = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    def hold(first):
        while True:
            try:
                s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)))
                s.sendall(first)
                while s.recv(4096):
                    pass
            except OSError:
                time.sleep(0.05)
    for i in range(headers + bodies):
        first = (b"POST /mutate-pods HTTP/1.1\\r\\nHost: x\\r\\n" if i < headers else
                 b"POST /mutate-pods HTTP/1.1\\r\\nContent-Length: 1000000\\r\\n\\r\\n{")
        threading.Thread(target=hold, args=(first,), daemon=True).start()
    print("holding", flush=True)
    time.sleep(600)
""")

BIG_SENDERS = textwrap.dedent("""
    import http.client, json, ssl, sys, threading, time
    port = int(sys.argv[1])
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    c = lambda i: {"name": f"c{i}", "image": "x" * 40, "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}},
                   "env": [{"name": f"E{j}", "value": "v" * 60} for j in range(3)]}
    pod = {"metadata": {"name": "big", "namespace": "work"}, "spec": {"containers": [c(i) for i in range(2600)]}}
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "big", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "object": pod}}).encode()
    assert len(body) > 1_000_000, len(body)
    sent = [0]
    def send():
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        while True:
            conn.request("POST", "/mutate-pods", body, {"Content-Type": "application/json"})
            r = conn.getresponse(); r.read()
            assert r.status == 200, r.status
            sent[0] += 1
    for _ in range(4):
        threading.Thread(target=send, daemon=True).start()
    print("sending", flush=True)
    while True:
        time.sleep(1); print("sent", sent[0], flush=True)
""")


def spawn(code: str, *args: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "holding" / "sending": the load is on
    assert first.strip() in ("holding", "sending"), f"the load generator did not start: {first!r}"
    return proc


async def test_slow_clients_and_large_reviews_do_not_starve_anyone() -> None:
    async with serving() as server, aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl())) as http:
        base = f"https://127.0.0.1:{server.port}"
        lags: list[float] = []
        steady = asyncio.Event()

        async def ticker() -> None:  # the controllers' loop: how late does a 10 ms timer fire?
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                if steady.is_set():  # once the senders run: starting their processes is not the loop's load
                    lags.append(time.perf_counter() - t - 0.01)

        slow = spawn(SLOW_CLIENTS, server.port, 200, 100)
        big = spawn(BIG_SENDERS, server.port)
        tick = asyncio.create_task(ticker())
        health: list[float] = []
        small: list[float] = []
        try:
            await asyncio.sleep(1.0)  # the large reviews are flowing
            steady.set()
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                t = time.perf_counter()
                async with http.get(f"{base}/healthz") as resp:
                    assert resp.status == 200
                health.append(time.perf_counter() - t)
                t = time.perf_counter()
                async with http.post(f"{base}/mutate-pods", json=SMALL) as resp:
                    assert resp.status == 200 and (await resp.json())["response"]["allowed"]
                small.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)
        finally:
            tick.cancel()
            for proc in (slow, big):
                proc.kill()
                proc.wait()
        assert big.stdout is not None
        sent = [int(line.split()[1]) for line in big.stdout.read().splitlines() if line.startswith("sent")]
        assert sent and sent[-1] >= 8, f"the large reviews did not flow: {sent}"
        small.sort()
        p99 = small[int(len(small) * 0.99) - 1]
        print(f"large reviews answered: {sent[-1]}; /healthz max {max(health) * 1000:.1f} ms; small reviews "
              f"p50 {small[len(small) // 2] * 1000:.1f} ms p99 {p99 * 1000:.1f} ms (n={len(small)}); caller's loop "
              f"lag max {max(lags) * 1000:.1f} ms")
        assert len(small) >= 50, len(small)
        assert max(health) < 0.100, f"/healthz took {max(health) * 1000:.0f} ms"
        assert p99 < 0.050, f"small reviews p99 {p99 * 1000:.0f} ms"
        assert max(lags) < 0.100, f"the caller's loop stalled {max(lags) * 1000:.0f} ms"
