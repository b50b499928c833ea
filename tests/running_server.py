"""An emulated API server on its own event-loop thread, reachable over loopback by sync clients and subprocesses."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from gpuops_sim.apiserver import APIServer

T = TypeVar("T")


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
