"""gpuops.kube.manager and health, and `gpuops run`, against the emulated API server over HTTP: /metrics
names, /healthz and /readyz (with ?exclude and ?verbose) flipping, shutdown within its bound, leader election
with warm standbys (failover without two leaders acting at once), lease loss, the controller registry and the
CLI. Waits are conditions with deadlines; lease timings are shortened."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from example_controller import ReplicatorSettings
from prometheus_client import REGISTRY
from waiting import NotYet, until, until_holds, wait_until

from gpuops import cli
from gpuops.kube import objects
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result, predicate_funcs
from gpuops.kube.health import Checks, LoopLagMonitor, informers_check, parse_bind_address
from gpuops.kube.leaderelection import JITTER_FACTOR, LeaderElectionLost, micro_time
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.reflector import ReflectorOptions
from gpuops.kube.registry import ControllerDefinition, ControllerRegistry, UnknownControllers
from gpuops.kube.resources import CONFIGMAPS, LEASES
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

NS = "default"
LD, RD, RP = 2.0, 1.0, 0.2
MAX_RETRY_WAIT = RP * (1 + JITTER_FACTOR)
FAST = ReflectorOptions(backoff_initial=0.02, backoff_cap=0.2)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[APIServer]:
    async with APIServer(bookmark_interval=0.5) as s:
        s.write_kubeconfig(tmp_path / "kubeconfig")
        yield s


@pytest.fixture
async def clients(server: APIServer, tmp_path: Path) -> AsyncIterator[Callable[[], Awaitable[Client]]]:
    """Independent clients, one per manager, as separate processes would have."""
    made: list[Client] = []

    async def make() -> Client:
        c = await Client.from_kubeconfig(str(tmp_path / "kubeconfig"))
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            await c.close()


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


# ---------------------------------------------------------------------------------------------- HTTP endpoints


async def test_metrics_healthz_and_readyz(server: APIServer, clients: Callable[[], Awaitable[Client]]) -> None:
    client = await clients()
    server.faults.add_error(500, verbs=["list", "watch"], resources=["configmaps"])
    mgr = Manager(client, ManagerOptions(metrics_bind_address="127.0.0.1:0",
        health_probe_bind_address="127.0.0.1:0",
        reflector_options=FAST,
        loop_lag_interval=0.02,
        loop_lag_threshold=0.15,
        loop_lag_window=0.6))
    inf = mgr.informer(CONFIGMAPS)

    reconciled = asyncio.Event()

    async def reconcile(req: Request) -> Result:
        reconciled.set()
        return Result(requeue_after=3600)  # a delayed add: workqueue_retries_total

    await client.create(CONFIGMAPS, {"metadata": {"name": "probed"}}, NS)
    mgr.add(Controller("probed", reconcile).watch(inf))
    task = asyncio.create_task(mgr.run())
    async with aiohttp.ClientSession() as session:
        await until_holds("the manager started", lambda: mgr.elected.is_set(), 10.0)
        assert mgr.probe_server is not None and mgr.metrics_server is not None
        probes, metrics = mgr.probe_server.url, mgr.metrics_server.url

        assert await fetch(session, f"{probes}/healthz") == (200, "ok")
        status, body = await fetch(session, f"{probes}/healthz?verbose")
        assert status == 200 and body == "[+]ping ok\n[+]eventloop ok\nhealthz check passed\n"

        # not synced yet (lists fail): not ready; failures are always verbose
        status, body = await fetch(session, f"{probes}/readyz")
        assert status == 500
        assert body.startswith("[+]ping ok\n[-]informers failed: configmaps not synced\n")
        assert body.endswith("readyz check failed\n")
        assert await fetch(session, f"{probes}/readyz?exclude=informers") == (200, "ok")
        status, body = await fetch(session, f"{probes}/readyz?verbose&exclude=informers&exclude=nope")
        assert status == 200
        assert body == (
            "[+]ping ok\n[+]informers excluded: ok\n"
            'warn: some health checks cannot be excluded: no matches for "nope"\nreadyz check passed\n'
        )
        assert await fetch(session, f"{probes}/readyz/informers") == (
            500, "internal server error: configmaps not synced\n")
        assert await fetch(session, f"{probes}/readyz/ping") == (200, "ok")
        assert (await fetch(session, f"{probes}/readyz/nope"))[0] == 404

        server.faults.clear()

        async def answers_ok(path: str) -> bool | NotYet:
            status, body = await fetch(session, f"{probes}{path}")
            return status == 200 or NotYet((status, body))

        await until("/readyz ready", lambda: answers_ok("/readyz"), 10, every=0.02)
        await asyncio.wait_for(reconciled.wait(), 10)

        status, body = await fetch(session, f"{metrics}/metrics")
        assert status == 200
        for name in (
            "workqueue_depth{", "workqueue_adds_total{", "workqueue_queue_duration_seconds_bucket{",
            "workqueue_work_duration_seconds_bucket{", "workqueue_retries_total{",
            "workqueue_unfinished_work_seconds{", "workqueue_longest_running_processor_seconds{",
            'controller_runtime_reconcile_total{controller="probed",result="success"}',
            'controller_runtime_reconcile_total{controller="probed",result="requeue_after"}',
            "controller_runtime_reconcile_errors_total{", "controller_runtime_terminal_reconcile_errors_total{",
            "controller_runtime_reconcile_panics_total{", "controller_runtime_reconcile_time_seconds_bucket{",
            'controller_runtime_max_concurrent_reconciles{controller="probed"} 4.0',
            "controller_runtime_active_workers{", "controller_runtime_reconcile_timeouts_total{",
            "rest_client_requests_total{", "rest_client_request_duration_seconds_bucket{",
            "gpuops_read_your_writes_timeouts_total{", "gpuops_event_loop_lag_seconds ",
        ):
            assert name in body, name
        assert (await fetch(session, f"{probes}/metrics"))[0] == 404  # metrics live on their own port

        # a stalled event loop fails /healthz for a while, then it recovers
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
        status, body = await fetch(session, f"{probes}/healthz")
        assert status == 500 and "[-]eventloop failed: event loop lagged" in body, body
        assert await fetch(session, f"{probes}/healthz?exclude=eventloop") == (200, "ok")
        await until("/healthz recovered", lambda: answers_ok("/healthz"), 5)

        mgr.request_stop()
        await asyncio.wait_for(task, 10)
        with pytest.raises(aiohttp.ClientConnectionError):
            await fetch(session, f"{probes}/healthz")


async def test_leader_healthz_check(server: APIServer, clients: Callable[[], Awaitable[Client]]) -> None:
    mgr = Manager(await clients(), ManagerOptions(leader_election=True, leader_election_namespace=NS, lease_duration=LD,
        renew_deadline=RD, retry_period=RP, metrics_bind_address="0", health_probe_bind_address="127.0.0.1:0"))
    task = asyncio.create_task(mgr.run())
    try:
        await asyncio.wait_for(mgr.elected.wait(), 10)
        assert mgr.is_leader
        assert mgr.metrics_server is None and mgr.probe_server is not None
        async with aiohttp.ClientSession() as session:
            status, body = await fetch(session, f"{mgr.probe_server.url}/healthz?verbose")
            assert status == 200 and "[+]leaderElection ok\n" in body
            assert mgr.elector is not None
            mgr.elector.healthy = lambda tolerance=20.0: False  # type: ignore[method-assign]  # a stuck renew loop
            status, body = await fetch(session, f"{mgr.probe_server.url}/healthz")
            assert status == 500 and "[-]leaderElection failed: leader has not renewed the lease" in body
    finally:
        mgr.request_stop()
        await asyncio.wait_for(task, 10)


def test_readiness_needs_fresh_informers_and_checks_are_named() -> None:
    class Fake:
        def __init__(self, name: str, synced: bool, age: float) -> None:
            self.name, self._synced, self.age = name, synced, age

        def synced(self) -> bool:
            return self._synced

        def last_event_age(self) -> float:
            return self.age

    infs = [Fake("pods", True, 5.0), Fake("nodes", True, 200.0), Fake("jobs", False, 0.0)]
    check = informers_check(lambda: infs, max_silence=150.0)
    assert check() == "nodes silent for 200s (> 150s); jobs not synced"
    infs[1:] = []
    assert check() is None

    checks = Checks("readyz")
    with pytest.raises(ValueError):
        checks.add("ping", lambda: None)
    with pytest.raises(ValueError):
        checks.add("a/b", lambda: None)

    lag = LoopLagMonitor(interval=1.0, threshold=0.5, window=10.0)
    assert lag.check() is None
    lag.tick(0.7)
    assert lag.check() == "event loop lagged 0.70s (> 0.5s) within the last 10s"

    assert parse_bind_address("0") is None and parse_bind_address("") is None
    assert parse_bind_address(":8080") == (None, 8080)
    assert parse_bind_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_bind_address("[::1]:9") == ("::1", 9)
    for bad in ("8080", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError):
            parse_bind_address(bad)


# ---------------------------------------------------------------------------------------------- shutdown


async def test_cancel_drains_in_flight_reconciles_within_the_bound(
    server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    client = await clients()
    outcomes: dict[str, str] = {}
    started: dict[str, asyncio.Event] = {"slow": asyncio.Event(), "stuck": asyncio.Event()}

    async def reconcile(req: Request) -> None:
        if req.name not in started:
            return
        started[req.name].set()
        try:
            await asyncio.sleep(0.3 if req.name == "slow" else 3600)  # work in progress
            outcomes[req.name] = "done"
        except asyncio.CancelledError:
            outcomes[req.name] = "cancelled"
            raise

    async def run_until_started(name: str, grace: float) -> float:
        mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0",
                      graceful_shutdown_timeout=grace))
        ctrl = Controller(f"shutdown-{name}", reconcile).watch(
            mgr.informer(CONFIGMAPS), predicates=[predicate_funcs(lambda o: o.metadata.name == name)])
        mgr.add(ctrl)
        task = asyncio.create_task(mgr.run())
        await client.create(CONFIGMAPS, {"metadata": {"name": name}}, NS)
        await asyncio.wait_for(started[name].wait(), 10)
        t0 = time.monotonic()
        task.cancel()  # what SIGTERM does through request_stop(), with cancellation semantics for the caller
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ctrl.queue.shutting_down
        return time.monotonic() - t0

    took = await run_until_started("slow", grace=10.0)
    assert outcomes["slow"] == "done" and took < 5.0  # drained, not cut

    took = await run_until_started("stuck", grace=0.5)
    assert outcomes["stuck"] == "cancelled" and 0.4 < took < 3.0  # cut at the bound


async def test_a_failing_runnable_stops_the_manager(
    server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    mgr = Manager(await clients(), ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
    inf = mgr.informer(CONFIGMAPS)
    boom = asyncio.Event()

    async def fails() -> None:
        await boom.wait()
        raise RuntimeError("runnable broke")

    mgr.add_runnable("fails", fails, need_leader_election=False)
    task = asyncio.create_task(mgr.run())
    assert await inf.wait_synced(10)
    boom.set()
    with pytest.raises(RuntimeError, match="runnable broke"):
        await asyncio.wait_for(task, 10)
    assert inf._task is None  # informers were stopped on the way out


# ---------------------------------------------------------------------------------------------- leader election


Timeline = list[tuple[str, float, float]]


def ticking_manager(client: Client, ident: str, timeline: Timeline, *, release_on_cancel: bool = True) -> Manager:
    """A manager whose controller keeps reconciling one ConfigMap, recording each reconcile's interval."""
    mgr = Manager(client, ManagerOptions(
        leader_election=True, leader_election_id="ticker-lease", leader_election_namespace=NS, identity=ident,
        lease_duration=LD, renew_deadline=RD, retry_period=RP, release_on_cancel=release_on_cancel,
        metrics_bind_address="0", health_probe_bind_address="0"))

    async def reconcile(req: Request) -> Result:
        start = time.monotonic()
        try:
            await asyncio.sleep(0.01)  # the reconcile's work
        finally:
            timeline.append((ident, start, time.monotonic()))
        return Result(requeue_after=0.02)

    ctrl = Controller("ticker", reconcile).watch(
        mgr.informer(CONFIGMAPS), predicates=[predicate_funcs(lambda o: o.metadata.name == "tick")])
    mgr.add(ctrl)
    return mgr


def count(timeline: Timeline, ident: str) -> int:
    return sum(1 for i, _, _ in timeline if i == ident)


async def test_failover_to_a_warm_standby_without_two_leaders(
    server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    setup = await clients()
    await setup.create(CONFIGMAPS, {"metadata": {"name": "tick"}}, NS)
    timeline: Timeline = []
    a = ticking_manager(await clients(), "A", timeline, release_on_cancel=False)
    b = ticking_manager(await clients(), "B", timeline)
    task_a = asyncio.create_task(a.run())
    await asyncio.wait_for(a.elected.wait(), 10)
    task_b = asyncio.create_task(b.run())
    try:
        # B is a warm standby: its informers sync, its controllers do not run
        await until_holds("A acting, B synced", lambda: b.factory.synced() and count(timeline, "A") >= 10, 10.0)
        assert not b.elected.is_set() and count(timeline, "B") == 0
        assert REGISTRY.get_sample_value("leader_election_master_status", {"name": "ticker-lease"}) is not None

        # "kill" A: it stops without releasing the lease, so B must wait for it to expire
        task_a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task_a
        t_kill = time.monotonic()
        a_last_end = max(end for i, _, end in timeline if i == "A")
        assert a_last_end <= t_kill
        await asyncio.wait_for(b.elected.wait(), LD + MAX_RETRY_WAIT + 2)
        took = time.monotonic() - t_kill
        assert LD - RP - 0.1 <= took <= LD + MAX_RETRY_WAIT + 0.5, took
        await until_holds("B acting", lambda: count(timeline, "B") >= 3, 10.0)
        b_first_start = min(start for i, start, _ in timeline if i == "B")
        assert a_last_end < b_first_start  # never two leaders acting at once
        assert b.is_leader
    finally:
        if not task_a.done():
            task_a.cancel()
        b.request_stop()
        await asyncio.wait_for(task_b, 10)
    lease = await setup.get(LEASES, "ticker-lease", NS)
    assert lease.spec.holder_identity in ("", None)  # B released it on its way out


async def test_lease_loss_stops_controllers_and_raises(
    server: APIServer, clients: Callable[[], Awaitable[Client]]
) -> None:
    client = await clients()
    await client.create(CONFIGMAPS, {"metadata": {"name": "tick"}}, NS)
    timeline: Timeline = []
    a = ticking_manager(client, "A", timeline)
    task = asyncio.create_task(a.run())
    await asyncio.wait_for(a.elected.wait(), 10)
    await until_holds("A acting", lambda: count(timeline, "A") >= 3, 10.0)

    lease = await client.get(LEASES, "ticker-lease", NS)
    body: dict[str, Any] = objects.to_builtins(lease)
    now = micro_time()
    body["spec"].update(holderIdentity="intruder", renewTime=now, acquireTime=now, leaseDurationSeconds=60)
    await client.replace(LEASES, body)
    t_steal = time.monotonic()
    with pytest.raises(LeaderElectionLost):
        await asyncio.wait_for(task, RD + 5)
    t_exit = time.monotonic()
    assert t_exit - t_steal < RD + MAX_RETRY_WAIT + 1.0
    assert all(end <= t_exit for _, _, end in timeline)
    ctrl = a.runnables()[0]
    assert isinstance(ctrl, Controller) and ctrl.queue.shutting_down
    assert not a.is_leader
    lease = await client.get(LEASES, "ticker-lease", NS)
    assert lease.spec.holder_identity == "intruder"  # a lost lease is never "released" over the new holder


# ---------------------------------------------------------------------------------------------- registry and CLI


async def test_controller_registry(server: APIServer, clients: Callable[[], Awaitable[Client]]) -> None:
    reg = ControllerRegistry()
    assert reg.select(None) == [] and reg.select("*") == []
    with pytest.raises(UnknownControllers, match=r"unknown controller\(s\) 'x'; known controllers: \(none"):
        reg.select("x")
    calls: list[str] = []

    class NoSettings(msgspec.Struct, frozen=True):
        pass

    reg.register(ControllerDefinition("budget", NoSettings, lambda mgr, settings: calls.append("budget")))
    # lazy: imported only when selected
    reg.register(ControllerDefinition("replicator", ReplicatorSettings, "example_controller:setup"))
    with pytest.raises(ValueError):
        reg.register(ControllerDefinition("budget", NoSettings, lambda mgr, settings: None))
    assert reg.select(None) == reg.select("*") == ["budget", "replicator"]
    assert reg.select("*,-budget") == ["replicator"]
    assert reg.select("replicator,budget") == ["budget", "replicator"]
    with pytest.raises(UnknownControllers, match="known controllers: budget, replicator") as err:
        reg.select("budget,nope,-other")
    assert err.value.unknown == ["nope", "other"]

    mgr = Manager(await clients(), ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
    await reg.setup(mgr, reg.select(None))
    assert calls == ["budget"] and [r.name for r in mgr.runnables()] == ["replicator"]


def test_cli_run_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--kubeconfig", "--namespace", "--controllers", "--leader-elect", "--leader-elect-lease-name",
        "--leader-elect-namespace", "--metrics-bind-address", "--health-probe-bind-address", "--log-format",
    ):
        assert flag in out, flag
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run" in capsys.readouterr().out  # the existing commands are still there, run among them


def test_cli_run_unknown_controller_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--controllers", "nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --controllers: unknown controller(s) 'nope'; known controllers:" in err
    with pytest.raises(SystemExit):
        cli.main(["run", "--metrics-bind-address", "8080"])
    assert "argument --metrics-bind-address" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def test_gpuops_run_serves_probes_and_exits_cleanly_on_sigterm(apiserver: Any) -> None:
    """The real entrypoint in a subprocess: ready, leader, then SIGTERM -> exit 0 and the lease released.

    It runs every registered controller, as a user's `gpuops run` does, so our CRDs go in first (as
    `kubectl apply -k manifests` would put them there)."""
    kubectl = str(Path(sys.executable).parent / "kubectl")
    crds = str(ROOT / "manifests" / "crds")
    subprocess.run([kubectl, "--kubeconfig", str(apiserver.kubeconfig), "apply", "-f", crds],
                   check=True, capture_output=True, timeout=60)
    metrics_port, probe_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuops", "run", "--kubeconfig", str(apiserver.kubeconfig), "--leader-elect",
         "--leader-elect-namespace", NS, "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
         "--health-probe-bind-address", f"127.0.0.1:{probe_port}", "--log-format", "json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 20  # for both waits together

        def ready() -> bool | NotYet:
            assert proc.poll() is None, proc.communicate()[0]
            status, body = _get(f"http://127.0.0.1:{probe_port}/readyz")
            return status == 200 or NotYet((status, body))

        def leading() -> bool:
            led = 'leader_election_master_status{name="gpuops-controller-manager"} 1.0'
            return led in _get(f"http://127.0.0.1:{metrics_port}/metrics")[1]

        wait_until("gpuops run ready", ready, 20, every=0.05)
        wait_until("gpuops run leading", leading, deadline - time.monotonic(), every=0.05)
        lease_url = f"{apiserver.url}/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/gpuops-controller-manager"
        status, body = _get(lease_url, apiserver.token)
        assert status == 200 and json.loads(body)["spec"]["holderIdentity"]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert time.monotonic() - t0 < 10
        logs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert any(e.get("event") == "manager stopped" for e in logs), out
        status, body = _get(lease_url, apiserver.token)
        assert status == 200 and not json.loads(body)["spec"].get("holderIdentity")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
