"""The example ConfigMap replicator (tests/kube/example_controller.py), run by a Manager against the emulated
API server over HTTP: it converges, follows updates and deletes, and retries injected 500s with growing,
jittered per-key backoff. Every wait is a condition with a deadline."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from example_controller import SOURCE_ANNOTATION, STATUS_ANNOTATION, Replicator, digest, install
from prometheus_client import REGISTRY
from waiting import until

from gpuops.kube.client import Client
from gpuops.kube.errors import NotFound
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.objects import ConfigMap
from gpuops.kube.resources import CONFIGMAPS
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

NS = "default"


async def running(client: Client, **options: Any) -> tuple[Manager, Replicator, asyncio.Task[None]]:
    mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
    replicator = install(mgr, **options)
    task = asyncio.create_task(mgr.run())
    return mgr, replicator, task


async def stop(mgr: Manager, task: asyncio.Task[None]) -> None:
    mgr.request_stop()
    await asyncio.wait_for(task, 10)


async def get(client: Client, name: str) -> ConfigMap | None:
    try:
        return await client.get(CONFIGMAPS, name, NS)
    except NotFound:
        return None


def source(name: str, data: dict[str, str], copy: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"copy": "yes" if copy else "no"}}, "data": data}


async def test_converges_follows_updates_and_handles_deletes(emulator: tuple[APIServer, Client]) -> None:
    _, client = emulator
    await client.create(CONFIGMAPS, source("plain", {"k": "v"}, copy=False), NS)
    await client.create(CONFIGMAPS, source("a", {"x": "1"}), NS)
    mgr, rep, task = await running(client)
    try:
        await client.create(CONFIGMAPS, source("b", {"y": "2", "z": "3"}), NS)

        async def copied(name: str, data: dict[str, str]) -> bool:
            src, copy = await get(client, name), await get(client, f"{name}-copy")
            return (
                src is not None
                and copy is not None
                and copy.data == data
                and (copy.metadata.annotations or {}).get(SOURCE_ANNOTATION) == name
                and (src.metadata.annotations or {}).get(STATUS_ANNOTATION) == digest(data)
            )

        await until("a copied", lambda: copied("a", {"x": "1"}), 10.0)
        await until("b copied", lambda: copied("b", {"y": "2", "z": "3"}), 10.0)
        assert f"{NS}/plain" in rep.attempts  # it was looked at ...
        assert await get(client, "plain-copy") is None  # ... and left alone

        # an update of the source reaches the copy (a removed key too)
        await client.patch(CONFIGMAPS, "b", {"data": {"z": None, "w": "4"}}, namespace=NS)
        await until("b's update copied", lambda: copied("b", {"y": "2", "w": "4"}), 10.0)

        # a deleted copy comes back; an edited copy is put right
        old = await get(client, "a-copy")
        assert old is not None
        await client.delete(CONFIGMAPS, "a-copy", NS)

        async def recreated() -> bool:
            new = await get(client, "a-copy")
            return new is not None and new.metadata.uid != old.metadata.uid and new.data == {"x": "1"}

        await until("a-copy recreated", recreated, 10.0)
        await client.patch(CONFIGMAPS, "a-copy", {"data": {"x": "tampered"}}, namespace=NS)
        await until("a-copy restored", lambda: copied("a", {"x": "1"}), 10.0)

        # removing the label deletes the copy and the status annotation
        await client.patch(CONFIGMAPS, "b", {"metadata": {"labels": {"copy": None}}}, namespace=NS)

        async def unlabelled() -> bool:
            src = await get(client, "b")
            return (
                await get(client, "b-copy") is None
                and src is not None
                and STATUS_ANNOTATION not in (src.metadata.annotations or {})
            )

        await until("b-copy deleted after the label went", unlabelled, 10.0)

        # deleting the source deletes the copy
        await client.delete(CONFIGMAPS, "a", NS)

        async def gone() -> bool:
            return await get(client, "a-copy") is None

        await until("a-copy deleted with its source", gone, 10.0)
        assert mgr.is_leader
    finally:
        await stop(mgr, task)


async def test_injected_500s_are_retried_with_growing_backoff(emulator: tuple[APIServer, Client]) -> None:
    s, client = emulator
    base = 0.05
    mgr, rep, task = await running(client, base_delay=base)
    key = f"{NS}/r"
    try:
        await client.create(CONFIGMAPS, source("r", {"k": "v"}, copy=False), NS)

        async def looked_at() -> bool:
            return key in rep.attempts

        await until("the unlabelled source reconciled", looked_at, 10.0)
        errors_before = REGISTRY.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "replicator"}
        ) or 0.0
        s.faults.add_error(500, verbs=["create"], resources=["configmaps"], count=3)
        before = len(rep.attempts[key])
        await client.patch(CONFIGMAPS, "r", {"metadata": {"labels": {"copy": "yes"}}}, namespace=NS)

        async def copied() -> bool:
            return await get(client, "r-copy") is not None

        await until("r-copy created after the 500s", copied, 10.0)
        assert s.faults.injected == 3
        errors_after = REGISTRY.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "replicator"}
        )
        assert errors_after == errors_before + 3

        starts = rep.attempts[key][before:]
        assert len(starts) >= 4  # three failures, then the create that worked
        gaps = [b - a for a, b in itertools.pairwise(starts[:4])]
        # Backoff base * 2**n shortened by at most 10 % jitter, each retry on schedule doubling the next one.
        for n, gap in enumerate(gaps):
            assert gap >= base * 2**n * 0.9, gaps
            assert gap < base * 2**n + 0.5, gaps
        assert gaps[0] < gaps[1] < gaps[2], gaps
    finally:
        await stop(mgr, task)
