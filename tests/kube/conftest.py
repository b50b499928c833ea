"""Fixtures shared by the framework's tests: the emulator in-process and a client on it over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuops.kube.client import Client
from gpuops_sim.apiserver import APIServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def emulator(tmp_path: Path) -> AsyncIterator[tuple[APIServer, Client]]:
    # The informer and controller tests count the ConfigMaps of a namespace: no kube-root-ca.crt publisher.
    async with APIServer(bookmark_interval=0.5, root_ca_publisher=False) as s:
        path = tmp_path / "kubeconfig"
        s.write_kubeconfig(path)
        client = await Client.from_kubeconfig(str(path))
        try:
            yield s, client
        finally:
            await client.close()
