"""Helpers the tests share: waiting on a condition with a deadline (never sleep-and-hope), and installing CRDs from
manifests/ into an emulated API server until they are served. Every polling loop of the tests lives here
(tests/test_test_hygiene.py holds the rest of the tree to that)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError
from gpuops.kube.resources import ResourceType
from gpuops_sim.apiserver import APIServer
from gpuops_sim.cluster.loop import Loop

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "manifests" / "crds"


@dataclass(frozen=True, slots=True)
class NotYet:
    """A probe's answer that counts as "not yet" and carries what the probe saw, which a timeout then shows (a
    bare False would tell nothing)."""

    seen: object

    def __bool__(self) -> bool:
        return False


class TimedOut(AssertionError):
    """A wait that ran past its deadline: says what was awaited, for how long, and the last answer seen."""

    def __init__(self, what: str, within: float, last: object) -> None:
        shown = repr(last.seen if isinstance(last, NotYet) else last)
        shown = shown if len(shown) <= 3000 else shown[:3000] + "..."
        super().__init__(f"timed out after {within:g}s waiting for {what}; last: {shown}")
        self.what, self.within, self.last = what, within, last


async def until(what: str, probe: Callable[[], Awaitable[T | NotYet | None]], within: float = 20.0, *,
                every: float = 0.05, ignoring: tuple[type[Exception], ...] = ()) -> T:
    """Await `probe` every `every` seconds until it returns something truthy, and return that. After `within`
    seconds fail naming `what` and the probe's last answer; an exception in `ignoring` counts as "not yet" (a
    server still starting) and is the last answer."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            got = await probe()
            last = got
            if got and not isinstance(got, NotYet):  # (NotYet is falsy: the check is for the type checker)
                return got
        except ignoring as e:
            last = e
        if time.monotonic() > deadline:
            raise TimedOut(what, within, last)
        await asyncio.sleep(every)


async def until_holds(what: str, probe: Callable[[], T | NotYet | None], within: float = 5.0, *,
                      every: float = 0.005) -> T:
    """`until` for a plain probe of state in this process (cheap, so polled often), from async code."""
    async def asked() -> T | NotYet | None:
        return probe()

    return await until(what, asked, within, every=every)


def wait_until(what: str, probe: Callable[[], T | NotYet | None], within: float = 10.0, *, every: float = 0.05,
               ignoring: tuple[type[Exception], ...] = ()) -> T:
    """`until` for synchronous tests: blocks between calls of a plain probe (a subprocess, a blocking client)."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            got = probe()
            last = got
            if got and not isinstance(got, NotYet):  # (NotYet is falsy: the check is for the type checker)
                return got
        except ignoring as e:
            last = e
        if time.monotonic() > deadline:
            raise TimedOut(what, within, last)
        time.sleep(every)


async def two_passes(component: Loop, within: float = 5.0) -> None:
    """Proof that an emulated cluster component has looked at everything written before this call, to wait on
    before asserting it did nothing: two of its passes end after the call (the first may have begun before it, the
    second began after), each asked for by waking it, so an idle component makes them too."""
    before = component.steps

    def passed() -> bool:
        if component.steps >= before + 2:
            return True  # no wake left behind: a test may stop the component next
        component.wake()
        return False

    await until_holds(f"two passes of the {component.name}", passed, within)


async def refuses_connections(port: int, host: str = "127.0.0.1") -> bool:
    """A probe: whether a TCP connection to host:port is refused now (a server's port is closed)."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return True
    writer.close()
    return False


async def install_crds(client: Client, names: Iterable[str], served: Iterable[ResourceType[Any]]) -> None:
    """POST manifests/crds/<name>.gpuops.io.yaml for each name, then wait until every `served` type lists."""
    for name in names:
        body = yaml.safe_load((CRDS / f"{name}.gpuops.io.yaml").read_text())
        await client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                             body=json.dumps(body).encode(), content_type="application/json")
    kinds = list(served)

    async def listing() -> bool:
        try:
            for rt in kinds:
                await client.list(rt)
        except ApiError:
            return False
        return True

    await until("CRDs served", listing, 10)


@contextlib.asynccontextmanager
async def emulator_with_crds(tmp_path: Path, names: Iterable[str],
                             served: Iterable[ResourceType[Any]]) -> AsyncIterator[Client]:
    """A fresh emulated API server with our CRDs installed and served, and an admin client to it."""
    async with APIServer() as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        client = await Client.from_kubeconfig(str(tmp_path / "kubeconfig"))
        try:
            await install_crds(client, names, served)
            yield client
        finally:
            await client.close()
