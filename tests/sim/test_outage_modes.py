"""Outage modes of the fault switch: a refused port and a stalled server both come back with their state."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from waiting import refuses_connections, until

from gpuops_sim.apiserver import APIServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _get(session: aiohttp.ClientSession, s: APIServer, limit_s: float) -> int:
    async with session.get(f"{s.url}/api/v1/namespaces/default",
                           headers={"Authorization": f"Bearer {s.admin_token}"},
                           timeout=aiohttp.ClientTimeout(total=limit_s)) as r:
        return r.status


@pytest.mark.anyio
async def test_hang_mode_accepts_but_answers_nothing_until_the_end() -> None:
    async with APIServer() as s, aiohttp.ClientSession() as session:
        rv = s.store.rv
        outage = asyncio.ensure_future(s.outage(1.0, mode="hang"))
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            await _get(session, s, limit_s=0.3)
        late = asyncio.ensure_future(_get(session, s, limit_s=5))
        await outage
        assert await late == 200  # the request held during the stall is answered afterwards
        assert s.store.rv == rv


@pytest.mark.anyio
async def test_refuse_mode_closes_the_port_then_listens_again_on_it() -> None:
    async with APIServer() as s, aiohttp.ClientSession() as session:
        port = s.port
        outage = asyncio.ensure_future(s.outage(1.0))
        await until("the port closed", lambda: refuses_connections(port), 1.0, every=0.01)
        with pytest.raises(aiohttp.ClientConnectionError):
            await _get(session, s, limit_s=0.5)
        await outage
        assert s.port == port
        assert await _get(session, s, limit_s=5) == 200


@pytest.mark.anyio
async def test_unknown_outage_mode_is_refused() -> None:
    async with APIServer() as s:
        with pytest.raises(ValueError, match="mode"):
            await s.outage(0.1, mode="sideways")
