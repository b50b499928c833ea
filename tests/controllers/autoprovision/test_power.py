"""The power webhook adapter over real HTTP on loopback: a recording receiver written here, and the sim's power API.

Backoff waits go through an injected `sleep` that only records (and, for deadline tests, advances a fake
clock); the only real waits are the short per-attempt timeouts of the hang cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
from aiohttp import web
from prometheus_client import REGISTRY
from structlog.testing import capture_logs
from waiting import until_holds

import gpuops
from gpuops.controllers.autoprovision import power
from gpuops.controllers.autoprovision.power import (
    Direction,
    Endpoint,
    Outcome,
    PowerClient,
    Transition,
    idempotency_key,
    verify_signature,
)
from gpuops_sim.cloud import CloudOptions, CloudServer
from gpuops_sim.cluster.machines import Fleet, Machine

pytestmark = pytest.mark.anyio

KEY = idempotency_key("gpu-0", "up", 3, "2025-01-01T00:00:00Z")
WALL = 1_700_000_000.25


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ------------------------------------------------------------------------------------ a recording receiver


@dataclass
class Answer:
    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    hang: float = 0.0  # seconds before answering (cut short when the receiver stops)
    echo_auth: bool = False  # put the request's Authorization header in the body (careless receivers do)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Hook:
    """A webhook receiver on loopback: records every request, answers from `script`, then `default`."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.script: list[Answer] = []
        self.default = Answer(200, '{"accepted": true}')
        self._stop = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def url(self, path: str = "/hooks/power") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), await request.read()))
        a = self.script.pop(0) if self.script else self.default
        if a.hang:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), a.hang)
        body = a.body + (request.headers.get("Authorization", "") if a.echo_auth else "")
        return web.Response(status=a.status, text=body, headers=a.headers)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


class Sleeps:
    """An injected sleep: records the delays, waits for nothing; optionally advances a fake clock."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.calls: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.clock is not None:
            self.clock.now += seconds
        await asyncio.sleep(0)


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(sleeps: Sleeps) -> AsyncIterator[PowerClient]:
    c = PowerClient(rng=lambda: 1.0, sleep=sleeps, wall=lambda: WALL)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """Captured log entries of the module. A fresh logger, so a cached one from another test cannot dodge."""
    with capture_logs() as entries:
        monkeypatch.setattr(power, "log", structlog.get_logger("gpuops.controllers.autoprovision"))
        yield entries


def up(key: str = KEY, node: str = "gpu-0", first_attempt: int = 1) -> Transition:
    return Transition(node, "up", key, first_attempt)


def requests(direction: str, code: str) -> float:
    v = REGISTRY.get_sample_value("gpuops_autoprovision_webhook_requests_total",
                                  {"direction": direction, "code": code})
    return v or 0.0


def durations(direction: str) -> float:
    v = REGISTRY.get_sample_value("gpuops_autoprovision_webhook_duration_seconds_count", {"direction": direction})
    return v or 0.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------ the contract


@pytest.mark.parametrize(("direction", "status", "action"), [("up", 200, "scale-up"), ("up", 202, "scale-up"),
                                                             ("down", 204, "scale-down")])
async def test_2xx_is_success_and_the_request_follows_the_contract(
        hook: Hook, client: PowerClient, sleeps: Sleeps, direction: Direction, status: int, action: str) -> None:
    hook.default = Answer(status)
    key = idempotency_key("gpu-0", direction, 1, "t0")
    before, before_d = requests(direction, str(status)), durations(direction)
    t0 = time.time()
    ep = Endpoint(hook.url(), headers={"X-Group": "a100"}, token="tok-abcdefgh")
    out = await client.send(ep, Transition("gpu-0", direction, key))
    assert out == Outcome(ok=True, status=status, attempts=1, error="", retryable=False,
                          finished_at=WALL, retry_after=None)
    assert len(hook.seen) == 1 and sleeps.calls == []
    seen = hook.seen[0]
    assert (seen.method, seen.path) == ("POST", "/hooks/power")
    assert seen.json() == {"node": "gpu-0", "action": action, "idempotencyKey": key}
    assert list(seen.json()) == ["node", "action", "idempotencyKey"]
    h = seen.headers
    assert h["Idempotency-Key"] == key and h["Content-Type"] == "application/json"
    assert h["User-Agent"] == f"gpuops/{gpuops.__version__}"
    assert h["Authorization"] == "Bearer tok-abcdefgh" and h["X-Group"] == "a100"
    assert "X-Gpuops-Signature" not in h and "X-Gpuops-Timestamp" not in h
    assert requests(direction, str(status)) == before + 1 and durations(direction) == before_d + 1
    # the real wall clock by default
    async with PowerClient() as real:
        assert t0 <= (await real.send(ep, Transition("gpu-0", direction, key))).finished_at <= time.time()


@pytest.mark.parametrize(("status", "hint"), [(400, "configuration error"), (401, "bearer token"),
                                              (403, "bearer token"), (404, "configuration error"),
                                              (409, "configuration error"), (422, "configuration error"),
                                              (501, "does not support")])
async def test_a_non_retryable_answer_is_final_at_once(
        hook: Hook, client: PowerClient, sleeps: Sleeps, status: int, hint: str) -> None:
    hook.default = Answer(status, '{"error": "no such\n   node group"}')
    out = await client.send(Endpoint(hook.url()), up())
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, status, 1, False)
    assert len(hook.seen) == 1 and sleeps.calls == []
    assert out.error.startswith(f"POST {hook.url()}: HTTP {status} (not retried: ")
    assert hint in out.error and out.error.endswith('{"error": "no such node group"}')


async def test_redirects_are_not_followed(hook: Hook, client: PowerClient) -> None:
    hook.default = Answer(307, headers={"Location": "/elsewhere"})
    out = await client.send(Endpoint(hook.url(), token="tok-abcdefgh"), up())
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, 307, 1, False)
    assert [s.path for s in hook.seen] == ["/hooks/power"] and "redirects are not followed" in out.error


async def test_500_503_and_timeout_are_retried_with_the_same_key_until_success(
        hook: Hook, sleeps: Sleeps) -> None:
    hook.script = [Answer(500), Answer(503), Answer(200, hang=2.0)]  # the third answers too late
    hook.default = Answer(202)
    codes = {c: requests("up", c) for c in ("500", "503", "timeout", "202")}
    async with PowerClient(rng=lambda: 0.5, sleep=sleeps) as client:
        out = await client.send(Endpoint(hook.url(), timeout=0.2), up())
    assert (out.ok, out.status, out.attempts, out.error) == (True, 202, 4, "")
    assert len(hook.seen) == 4
    assert {s.headers["Idempotency-Key"] for s in hook.seen} == {KEY}
    assert {s.body for s in hook.seen} == {hook.seen[0].body}  # the same bytes every time
    assert sleeps.calls == [0.25, 0.5, 1.0]  # full jitter: rng * base * 2**n
    assert {c: requests("up", c) - v for c, v in codes.items()} == {"500": 1, "503": 1, "timeout": 1, "202": 1}


async def test_connection_errors_are_retried_and_bounded(sleeps: Sleeps, logs: list[MutableMapping[str, Any]]) -> None:
    url = f"http://127.0.0.1:{closed_port()}/power"
    before = requests("down", "error")
    async with PowerClient(rng=lambda: 1.0, sleep=sleeps) as client:
        out = await client.send(Endpoint(url), Transition("gpu-1", "down", "k-1"))
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, None, 4, True)
    assert out.error.startswith(f"POST {url}: connection failed: ") and out.error.endswith(" after 4 attempts")
    assert requests("down", "error") == before + 4 and sleeps.calls == [0.5, 1.0, 2.0]
    assert [e["attempt"] for e in logs] == [1, 2, 3, 4]
    assert all(e["status"] is None and e["node"] == "gpu-1" and e["direction"] == "down" for e in logs)


async def test_attempts_are_bounded_and_the_error_says_what_happened(
        hook: Hook, client: PowerClient, sleeps: Sleeps) -> None:
    hook.default = Answer(503, "BMC busy:\nmaintenance")
    out = await client.send(Endpoint(hook.url()), up())
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, 503, 4, True)
    assert out.error == f"POST {hook.url()}: HTTP 503 after 4 attempts: BMC busy: maintenance"
    assert len(hook.seen) == 4 and sleeps.calls == [0.5, 1.0, 2.0]
    # backoff capped at 8 s; attempt numbers continue the persisted count
    hook.seen.clear()
    more = Sleeps()
    async with PowerClient(max_attempts=7, rng=lambda: 1.0, sleep=more) as c:
        out = await c.send(Endpoint(hook.url()), up(first_attempt=5))
    assert out.attempts == 7 and len(hook.seen) == 7 and more.calls == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert "after 7 attempts (11 in total)" in out.error


async def test_retry_after_is_honoured_in_seconds_and_as_a_date(
        hook: Hook, client: PowerClient, sleeps: Sleeps) -> None:
    date = email.utils.formatdate(WALL + 5.5, usegmt=True)  # whole seconds: 1700000005, WALL + 4.75
    hook.script = [Answer(429, headers={"Retry-After": "3"}), Answer(503, headers={"Retry-After": date}),
                   Answer(429, headers={"Retry-After": "soon"})]
    out = await client.send(Endpoint(hook.url()), up())
    assert (out.ok, out.attempts, out.retry_after) == (True, 4, None)
    assert sleeps.calls == [3.0, pytest.approx(4.75), 2.0]  # garbage Retry-After: plain backoff (rng 1.0)
    assert {s.headers["Idempotency-Key"] for s in hook.seen} == {KEY}


async def test_a_retry_after_beyond_the_cap_returns_instead_of_blocking(
        hook: Hook, client: PowerClient, sleeps: Sleeps) -> None:
    hook.default = Answer(429, "slow down", headers={"Retry-After": "120"})
    out = await client.send(Endpoint(hook.url()), up())
    assert (out.ok, out.status, out.attempts, out.retryable, out.retry_after) == (False, 429, 1, True, 120.0)
    assert sleeps.calls == [] and "retry after 120 s, longer than 30 s" in out.error
    assert out.error.endswith(": slow down")


async def test_no_request_and_no_wait_past_the_deadline(hook: Hook) -> None:
    hook.default = Answer(503)
    clock = FakeClock()
    sleeps = Sleeps(clock)
    async with PowerClient(rng=lambda: 1.0, sleep=sleeps, clock=clock) as client:
        deadline = clock.now + 1.2
        out = await client.send(Endpoint(hook.url()), up(), deadline=deadline)
        # attempt 1, wait 0.5, attempt 2; the next wait (1.0) would end past the deadline
        assert (out.ok, out.attempts, out.retryable) == (False, 2, True) and len(hook.seen) == 2
        assert sleeps.calls == [0.5] and clock.now <= deadline
        assert "the deadline leaves no time for another attempt" in out.error
        hook.seen.clear()
        out = await client.send(Endpoint(hook.url()), up(), deadline=clock.now - 0.001)
        assert (out.ok, out.status, out.attempts, out.retryable) == (False, None, 0, True) and hook.seen == []
        assert out.error == f"POST {hook.url()}: the deadline passed before the first attempt"


async def test_a_hanging_request_is_cut_off_at_the_deadline(hook: Hook, sleeps: Sleeps) -> None:
    hook.default = Answer(200, hang=5.0)
    async with PowerClient(sleep=sleeps) as client:
        start = time.monotonic()
        out = await client.send(Endpoint(hook.url(), timeout=10), up(), deadline=start + 0.3)
        took = time.monotonic() - start
    assert 0.25 <= took < 2.0
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, None, 1, True)
    assert "timeout (no answer within the deadline)" in out.error and sleeps.calls == []


# ------------------------------------------------------------------------------------ signatures and secrets


async def test_signature_is_verifiable_and_rejects_tampering_and_old_timestamps(hook: Hook) -> None:
    key = b"hmac-key-0123456789"
    now = [WALL]

    async def sleep(seconds: float) -> None:
        now[0] += 7.0  # the retry signs with its own, later timestamp

    hook.script = [Answer(503)]
    async with PowerClient(rng=lambda: 0.0, sleep=sleep, wall=lambda: now[0]) as client:
        out = await client.send(Endpoint(hook.url(), hmac_key=key), up())
    assert out.ok and out.attempts == 2
    stamps = [s.headers["X-Gpuops-Timestamp"] for s in hook.seen]
    assert stamps == [str(int(WALL)), str(int(WALL + 7))]
    for s in hook.seen:
        ts, sig, body = s.headers["X-Gpuops-Timestamp"], s.headers["X-Gpuops-Signature"], s.body
        expected = hmac.new(key, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert sig == f"sha256={expected}"
        at = float(ts)
        assert verify_signature(key, ts, body, sig, now=at)
        assert verify_signature(key, ts, body, sig, now=at + 300)
        assert verify_signature(key, ts, body, sig.upper().replace("SHA256=", "sha256="), now=at)
        assert not verify_signature(key, ts, body.replace(b"scale-up", b"scale-dn"), sig, now=at)  # tampered
        assert not verify_signature(key, ts, body + b" ", sig, now=at)
        assert not verify_signature(key, ts, body, sig, now=at + 301)  # too old: a replay
        assert not verify_signature(key, ts, body, sig, now=at - 301)  # from the future
        assert not verify_signature(key, ts, body, sig, now=at + 10, tolerance=5)
        assert not verify_signature(b"other key", ts, body, sig, now=at)
        assert not verify_signature(key, str(int(at) + 1), body, sig, now=at)  # timestamp is signed
        for bad_ts in ("", "-1", "1.5", "\uff11\uff12\uff13", "99999999999999"):
            assert not verify_signature(key, bad_ts, body, sig, now=at)
        for bad_sig in ("", sig.removeprefix("sha256="), "sha1=" + sig[7:], "sha256=", "sha256=zz"):
            assert not verify_signature(key, ts, body, bad_sig, now=at)


async def test_secrets_never_reach_errors_logs_or_reprs(
        hook: Hook, sleeps: Sleeps, logs: list[MutableMapping[str, Any]]) -> None:
    token, key, query, api_key = "tok-SECRET-1234567890", b"hmac-SECRET-abcdef", "QUERY-SECRET-xyz987", "HDR-SECRET-42"
    secrets = [token, key.decode(), key.hex(), query, api_key]
    hook.script = [Answer(500, "upstream said: ", echo_auth=True),
                   Answer(503, f"debug: key={key.decode()} sig={query} api={api_key} ", echo_auth=True)]
    hook.default = Answer(401, "denied for ", echo_auth=True)
    ep = Endpoint(hook.url(f"/hooks/power?sig={query}&x=1"), headers={"X-Api-Key": api_key}, token=token,
                  hmac_key=key)
    async with PowerClient(rng=lambda: 0.0, sleep=sleeps) as client:
        out = await client.send(ep, up())
    assert (out.ok, out.status, out.attempts, out.retryable) == (False, 401, 3, False)
    assert hook.seen[0].headers["Authorization"] == f"Bearer {token}"  # they were sent
    assert hook.seen[0].headers["X-Api-Key"] == api_key
    assert hook.seen[0].path.endswith(f"?sig={query}&x=1")
    shown = f"http://127.0.0.1:{hook.port}/hooks/power?sig=[REDACTED]&x=[REDACTED]"
    assert ep.display_url == shown and out.error.startswith(f"POST {shown}: HTTP 401")
    assert out.error.endswith("denied for Bearer [REDACTED]")
    assert len(logs) == 3
    for e in logs:
        assert e["url"] == shown and {"node", "direction", "attempt", "status"} <= set(e)
    assert "[REDACTED]" in str(logs) and "X-Api-Key" in repr(ep)
    retry = next(e for e in logs if e["attempt"] == 2)
    assert retry["error"] == ("HTTP 503: debug: key=[REDACTED] sig=[REDACTED] api=[REDACTED] Bearer [REDACTED]")
    for text in (out.error, str(logs), repr(ep), repr(out)):
        for s in secrets:
            assert s not in text


async def test_failing_to_connect_does_not_leak_the_query_either(sleeps: Sleeps) -> None:
    query = "QUERY-SECRET-xyz987"
    async with PowerClient(max_attempts=1, sleep=sleeps) as client:
        out = await client.send(Endpoint(f"http://127.0.0.1:{closed_port()}/p?token={query}"), up())
    assert not out.ok and "connection failed" in out.error and query not in out.error


# ------------------------------------------------------------------------------------ against the sim power API


@pytest.fixture
async def sim() -> AsyncIterator[tuple[CloudServer, Fleet]]:
    fleet = Fleet()
    fleet.add(Machine("gpu-0", "A100-80GB", 8, group="a100", state="off", boot_seconds=0.02,
                      shutdown_seconds=0.02))
    async with CloudServer(fleet, options=CloudOptions(token="cloud-token-12345678", seed=1)) as cloud:
        yield cloud, fleet
    fleet.close()


def sim_endpoint(cloud: CloudServer, node: str, op: str, token: str = "cloud-token-12345678") -> Endpoint:
    return Endpoint(f"{cloud.url}/power/v1/machines/{node}/{op}", token=token)


async def test_sim_a_repeated_transition_replays_and_powers_on_once(
        sim: tuple[CloudServer, Fleet], sleeps: Sleeps) -> None:
    cloud, fleet = sim
    m = fleet.machines["gpu-0"]
    # the power-on happens, but the answer is lost (503 after the fact): the retry must not power on again
    cloud.faults.add(api="power", op="start", status=503, after=True, count=1)
    k_up = idempotency_key("gpu-0", "up", 1, "2025-01-01T00:00:00Z")
    async with PowerClient(rng=lambda: 0.0, sleep=sleeps) as client:
        out = await client.send(sim_endpoint(cloud, "gpu-0", "start"), Transition("gpu-0", "up", k_up))
    assert (out.ok, out.status, out.attempts) == (True, 202, 2)
    assert m.power_cycles == 1 and cloud.calls[("power", "start", 503)] == 1
    await until_holds("the machine on", lambda: m.state == "on", 3.0)
    # the operator restarts and sends the persisted transition again: replayed, not repeated
    async with PowerClient(sleep=sleeps) as restarted:
        out = await restarted.send(sim_endpoint(cloud, "gpu-0", "start"), Transition("gpu-0", "up", k_up, 3))
        assert (out.ok, out.status, out.attempts) == (True, 202, 1) and m.power_cycles == 1
        # power off, then a late retry of the old power-on: still replayed, the machine stays off
        k_down = idempotency_key("gpu-0", "down", 2, "2025-01-01T00:10:00Z")
        out = await restarted.send(sim_endpoint(cloud, "gpu-0", "stop"), Transition("gpu-0", "down", k_down))
        assert (out.ok, out.status) == (True, 202)
        await until_holds("the machine off", lambda: m.state == "off", 3.0)
        out = await restarted.send(sim_endpoint(cloud, "gpu-0", "start"), Transition("gpu-0", "up", k_up))
        assert out.ok and m.state == "off" and m.power_cycles == 1
        # a new transition has a new key and does power on
        k_up2 = idempotency_key("gpu-0", "up", 3, "2025-01-01T00:20:00Z")
        out = await restarted.send(sim_endpoint(cloud, "gpu-0", "start"), Transition("gpu-0", "up", k_up2))
        assert (out.ok, out.status) == (True, 202) and m.power_cycles == 2
        assert fleet.machines["gpu-0"].state in ("booting", "on")
    # 202s: the retry, the restart, the late retry (all three replays) and the new transition
    assert cloud.calls[("power", "start", 202)] == 4


async def test_sim_rate_limit_and_errors(sim: tuple[CloudServer, Fleet], sleeps: Sleeps) -> None:
    cloud, fleet = sim
    cloud.faults.add(api="power", op="start", status=429, retry_after=2, count=1)
    async with PowerClient(rng=lambda: 0.0, sleep=sleeps) as client:
        out = await client.send(sim_endpoint(cloud, "gpu-0", "start"), up(idempotency_key("gpu-0", "up", 9, "x")))
        assert (out.ok, out.status, out.attempts) == (True, 202, 2) and sleeps.calls == [2.0]
        assert fleet.machines["gpu-0"].power_cycles == 1
        out = await client.send(sim_endpoint(cloud, "gpu-0", "start", token="wrong-token-987654"), up("k-2"))
        assert (out.ok, out.status, out.attempts, out.retryable) == (False, 401, 1, False)
        assert "bearer token" in out.error and "AuthFailure" in out.error and "wrong-token-987654" not in out.error
        out = await client.send(sim_endpoint(cloud, "gpu-9", "start"), up("k-3", node="gpu-9"))
        assert (out.status, out.attempts, out.retryable) == (404, 1, False) and "MachineNotFound" in out.error


# ------------------------------------------------------------------------------------ inputs, keys, lifecycle


def test_idempotency_key_is_stable_short_and_distinct() -> None:
    k = idempotency_key("gpu-0", "up", 3, "2025-01-01T00:00:00Z")
    assert k == idempotency_key("gpu-0", "up", 3, "2025-01-01T00:00:00Z") == KEY
    assert k.startswith("gpuops-up-") and len(k) == len("gpuops-up-") + 32
    others = {idempotency_key("gpu-1", "up", 3, "2025-01-01T00:00:00Z"),
              idempotency_key("gpu-0", "down", 3, "2025-01-01T00:00:00Z"),
              idempotency_key("gpu-0", "up", 4, "2025-01-01T00:00:00Z"),
              idempotency_key("gpu-0", "up", 3, "2025-01-01T00:00:01Z"),
              idempotency_key("gpu-0\x00up", "up", 3, "2025-01-01T00:00:00Z")}
    assert len(others) == 5 and k not in others
    Transition("gpu-0", "up", k)  # a valid header value
    with pytest.raises(ValueError, match="direction"):
        idempotency_key("gpu-0", "sideways", 1, "t")


def test_endpoint_and_transition_validation() -> None:
    for url in ("ftp://bmc/power", "bmc/power", "http:///power", "https://user:pw@bmc/power"):
        with pytest.raises(ValueError):
            Endpoint(url)
    with pytest.raises(ValueError, match="credentials in URLs"):
        Endpoint("https://user:pw@bmc/power")
    for headers in ({"authorization": "Basic x"}, {"Idempotency-Key": "k"}, {"X-A": "a\r\nX-B: b"},
                    {"bad name": "v"}, {"X-A": "ü"}):
        with pytest.raises(ValueError):
            Endpoint("https://bmc/power", headers=headers)
    for kwargs in ({"timeout": 0}, {"timeout": float("inf")}, {"token": ""}, {"token": "a\nb"},
                   {"token": " tok"}, {"token": "tök"}, {"hmac_key": b""}):
        with pytest.raises(ValueError):
            Endpoint("https://bmc/power", **kwargs)
    ep = Endpoint("https://bmc/power", headers={"X-A": "1"}, token="tok-xyz-123456", hmac_key=b"key-xyz")
    assert "tok-xyz" not in repr(ep) and "key-xyz" not in repr(ep) and hash(ep) == hash(ep)
    with pytest.raises(TypeError):
        ep.headers["X-B"] = "2"  # type: ignore[index]
    for args in (("", "up", "k"), ("n", "on", "k"), ("n", "up", ""), ("n", "up", "a b"), ("n", "up", "k\n"),
                 ("n", "up", "x" * 256)):
        with pytest.raises(ValueError):
            Transition(*args)
    with pytest.raises(ValueError):
        Transition("n", "up", "k", 0)
    with pytest.raises(ValueError):
        PowerClient(max_attempts=0)


async def test_proxy_environment_is_ignored_and_close_is_final(
        hook: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, dead)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    client = PowerClient(max_attempts=1)
    out = await client.send(Endpoint(hook.url()), up())
    assert out.ok and len(hook.seen) == 1
    await client.close()
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.send(Endpoint(hook.url()), up())
