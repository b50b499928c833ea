"""The lifecycle every emulated cloud API shares: an aiohttp app on a loopback port (0 picks a free one), and
a `closing` event that releases calls an injected fault holds hung, so a stop never waits on them."""

from __future__ import annotations

import asyncio
import socket
import ssl
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from aiohttp import web


class LoopbackServer(ABC):
    """Subclasses build their routes in `app()` and may log or clean up in `started()` / `stopped()`."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @abstractmethod
    def app(self) -> web.Application:
        """The routes of this API."""

    def started(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Called once the port is known."""

    def stopped(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Called after the server has closed."""

    async def start(self) -> None:
        app = self.app()
        self._closing.clear()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self.started()

    async def add_tls_site(self, context: ssl.SSLContext, host: str = "127.0.0.1") -> int:
        """Serve the same API over HTTPS on another port (picked free) as well; returns that port."""
        assert self._runner is not None, "start() first"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        site = web.SockSite(self._runner, sock, ssl_context=context)
        await site.start()
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        self._closing.set()  # releases hung calls
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.stopped()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
