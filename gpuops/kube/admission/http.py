"""The admission webhook's HTTP/1.1 server: what the API server needs, and nothing a slow or hostile client can
hold for long.

The webhook port is reachable from every pod (a NetworkPolicy cannot select the API server), and the API
server waits at most the webhook's timeoutSeconds (5 s) for an answer. So every phase of a connection has a
deadline (TLS handshake, request head, body, idle keep-alive), heads and bodies have size caps (431, 413), a
body must declare its length (411: the API server always does), and connections beyond a cap are closed at
once. The server runs on an event loop of its own, in its own thread: neither slow clients nor large reviews
touch the loop the controllers run on. The handler decides where the work on a body happens (`server.py` may
send large reviews to a worker process, so that many small ones never wait behind a few large ones).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import Counter

__all__ = ["REFUSED", "Answer", "HttpServer", "Limits"]

log = structlog.get_logger("gpuops.kube.admission")

REFUSED: Final = Counter(
    "gpuops_webhook_connections_refused_total",
    "Webhook connections or requests cut short, by reason (handshake_timeout, header_timeout, body_timeout, "
    "idle_timeout, header_too_large, body_too_large, length_required, bad_request, connection_limit).",
    ["reason"],
)

_REASONS: Final = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
                   411: "Length Required",
                   413: "Content Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
                   200: "OK"}


@dataclass(frozen=True, slots=True)
class Limits:
    handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    """From the first byte of a request to the end of its head."""
    body_timeout: float = 10.0
    idle_timeout: float = 60.0
    """A kept-alive connection with no new request for this long is closed (the API server reuses them)."""
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 3 * 1024 * 1024 + 64 * 1024
    max_connections: int = 512


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"


# (method, path, body) -> answer; awaited on the server's loop, never on the caller's
Handler = Callable[[str, str, bytes], Awaitable[Answer]]


class _Refused(Exception):
    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status, self.reason = status, reason


class HttpServer:
    """Serve `handler` over HTTPS on its own thread and event loop. `start`/`stop` are called from any loop."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext, host: str | None, port: int,
                 limits: Limits | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.limits = limits or Limits()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._connections = 0

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind and serve; returns once listening (raises what binding raised)."""
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="gpuops-webhook", daemon=True)
        self._thread.start()
        self.port = await asyncio.wrap_future(ready)

    async def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and self._stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop may have ended on its own
                loop.call_soon_threadsafe(self._stopping.set)
        if thread is not None:
            await asyncio.to_thread(thread.join, 10.0)
        self._thread = None

    def call(self, fn: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Run `fn` on the server's loop (e.g. swapping certificates between handshakes)."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._loop is None or self._loop.is_closed():
            fn()
            done.set_result(None)
            return done

        def run() -> None:
            try:
                fn()
            except BaseException as e:
                done.set_exception(e)
            else:
                done.set_result(None)

        self._loop.call_soon_threadsafe(run)
        return done

    def _main(self, ready: concurrent.futures.Future[int]) -> None:
        try:
            asyncio.run(self._serve(ready))
        except BaseException as e:  # binding failed: the caller of start() sees it
            if not ready.done():
                ready.set_exception(e)
            else:
                log.exception("webhook server stopped with an error")

    async def _serve(self, ready: concurrent.futures.Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, self.host, self.port, ssl=self.ssl_context, reuse_address=True,
            ssl_handshake_timeout=self.limits.handshake_timeout, limit=self.limits.max_header_bytes)
        port = int(server.sockets[0].getsockname()[1])
        ready.set_result(port)
        try:
            await self._stopping.wait()
        finally:
            server.close()
            await server.wait_closed()

    # ------------------------------------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= self.limits.max_connections:
            REFUSED.labels("connection_limit").inc()
            writer.close()
            return
        self._connections += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the server stops: end quietly (a cancelled handler is logged as an error)
            return
        finally:
            self._connections -= 1
            writer.close()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection must close."""
        lim = self.limits
        try:
            first = await asyncio.wait_for(reader.readexactly(1), lim.idle_timeout)
        except TimeoutError:
            REFUSED.labels("idle_timeout").inc()
            return False
        except asyncio.IncompleteReadError:
            return False  # the client closed a kept-alive connection
        try:
            method, path, keep_alive, length = await self._head(first, reader)
            if length > lim.max_body_bytes:
                raise _Refused(413, "body_too_large", f"body of {length} bytes is over {lim.max_body_bytes}")
            try:
                body = await asyncio.wait_for(reader.readexactly(length), lim.body_timeout)
            except TimeoutError:
                REFUSED.labels("body_timeout").inc()
                return False
        except _Refused as e:
            REFUSED.labels(e.reason).inc()
            await self._write(writer, Answer(e.status, f"{e}\n".encode(), "text/plain"), keep_alive=False)
            return False
        await self._write(writer, await self._answer(method, path, body), keep_alive)
        return keep_alive

    async def _answer(self, method: str, path: str, body: bytes) -> Answer:
        try:
            return await self.handler(method, path, body)
        except Exception:
            log.exception("webhook request failed", method=method, path=path)
            return Answer(500, b"internal error\n", "text/plain")

    async def _head(self, first: bytes, reader: asyncio.StreamReader) -> tuple[str, str, bool, int]:
        try:
            rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.header_timeout)
        except TimeoutError:
            raise _Refused(408, "header_timeout", "request head not received in time") from None
        except (asyncio.LimitOverrunError, ValueError):
            raise _Refused(431, "header_too_large", "request head too large") from None
        lines = (first + rest).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(400, "bad_request", "malformed request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    raise _Refused(400, "bad_request", "malformed header line")
                headers[name.strip().lower()] = value.strip()
        keep_alive = parts[2] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "transfer-encoding" in headers:
            raise _Refused(411, "length_required", "send the body with a Content-Length, not chunked")
        raw_length = headers.get("content-length", "0" if parts[0] in ("GET", "HEAD") else "")
        if not raw_length.isdigit():
            raise _Refused(411, "length_required", "a Content-Length is required")
        return parts[0], parts[1].split("?", 1)[0], keep_alive, int(raw_length)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, answer: Answer, keep_alive: bool) -> None:
        head = (f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Error')}\r\n"
                f"Content-Type: {answer.content_type}\r\nContent-Length: {len(answer.body)}\r\n"
                f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
        writer.write(head.encode("latin-1") + answer.body)
        await writer.drain()
