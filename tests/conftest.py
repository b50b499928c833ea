"""Shared fixtures: the emulated API server running in a background thread, reachable over loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuops.sim.apiserver import APIServer, answered_warnings

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _apiserver_warnings_are_failures(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A warning from the API server means part of a write was not taken as sent (a field pruned, a duplicate
    field, a deprecated API): every test fails on one it did not name with `@pytest.mark.apiserver_warnings`.
    Emulators in this process and in subprocesses (which inherit the variable) append to the same log."""
    log = tmp_path_factory.mktemp("apiserver-warnings") / "answered.jsonl"
    monkeypatch.setenv(answered_warnings.LOG_ENV, str(log))
    yield
    expected = [str(text) for m in request.node.iter_markers("apiserver_warnings") for text in m.args]
    unexpected = [w for w in answered_warnings.read_log(str(log)) if not any(text in w.text for text in expected)]
    if unexpected:
        listed = "\n  ".join(dict.fromkeys(str(w) for w in unexpected))
        pytest.fail(f"the API server answered {len(unexpected)} unexpected warning(s):\n  {listed}", pytrace=False)


class RunningServer:
    """An APIServer on its own event loop thread, so sync clients and subprocesses can talk to it."""

    def __init__(self, kubeconfig: Path, **kwargs: Any) -> None:
        self.kubeconfig = kubeconfig
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="apiserver", daemon=True)
        self.server: APIServer

    def start(self) -> None:
        self._thread.start()

        async def boot() -> APIServer:
            s = APIServer(**self._kwargs)
            await s.start()
            return s

        self.server = self.call(boot())
        self.server.write_kubeconfig(self.kubeconfig)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def run(self, fn: Any, *args: Any) -> Any:
        """Run a plain function on the server's loop thread (store access is not thread-safe)."""

        async def wrap() -> Any:
            return fn(*args)

        return self.call(wrap())

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def token(self) -> str:
        return self.server.admin_token

    def stop(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "kubeconfig", bookmark_interval=1.0)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


@pytest.fixture
def rbac_apiserver(tmp_path: Path) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "kubeconfig", authorization="RBAC", bookmark_interval=1.0)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


@pytest.fixture
def tls_rbac_apiserver(tmp_path: Path) -> Iterator[RunningServer]:
    """RBAC enforced over HTTPS (kubectl sends bearer tokens only over TLS); the kubeconfig is admin.kubeconfig."""
    rs = RunningServer(tmp_path / "admin.kubeconfig", authorization="RBAC", tls=True)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()
