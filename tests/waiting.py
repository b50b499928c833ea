"""Helpers the async tests share: waiting on a condition with a deadline (never sleep-and-hope), and installing
CRDs from manifests/ into an emulated API server until they are served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError
from gpuops.kube.resources import ResourceType
from gpuops_sim.apiserver import APIServer

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "manifests" / "crds"


async def until(what: str, probe: Callable[[], Awaitable[T | None]], within: float = 20.0) -> T:
    """Poll an async probe until it returns something truthy; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got = await probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


async def until_true(pred: Callable[[], bool], within: float = 3.0) -> None:
    """Poll a plain predicate (state held in this process) until it holds."""
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


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
