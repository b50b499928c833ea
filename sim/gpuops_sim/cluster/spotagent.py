"""The node agent of a spot instance: it polls the metadata service for a termination notice (Tencent
`spot/termination-time`, AWS `spot/instance-action`) and reports one on its Node as the annotation
`gpuops.io/spot-termination-time`, the contract the spot pool controller reads. A real agent polls every few
seconds, so the report lands a random fraction of the poll interval after the cloud posts the notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import structlog

from ..cloud.spot import Instance
from .access import NODES, ClusterAccess

log = structlog.get_logger("gpuops_sim.spotagent")

NOTICE_ANNOTATION = "gpuops.io/spot-termination-time"


class SpotNoticeAgent:
    """One agent for every spot node (they share nothing but the poll interval)."""

    def __init__(self, access: ClusterAccess, poll_seconds: float, seed: int | None = None) -> None:
        self.access = access
        self.poll_seconds = poll_seconds
        self.reported = 0
        self._rng = random.Random(seed)
        self._tasks: set[asyncio.Task[Any]] = set()

    def on_notice(self, inst: Instance) -> None:
        if inst.interruption is None:
            return
        delay = self._rng.uniform(0, self.poll_seconds) if self.poll_seconds > 0 else 0.0
        task = asyncio.get_running_loop().create_task(self._report(inst.node_name, inst.interruption["terminateTime"],
                                                                   delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, node: str, when: str, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if self.access.get(NODES, "", node) is None:
            return  # not joined yet (or gone): no agent runs there
        try:
            await self.access.patch(NODES, "", node, {"metadata": {"annotations": {NOTICE_ANNOTATION: when}}})
            self.reported += 1
            log.info("spot termination notice reported", node=node, terminate_time=when)
        except Exception as e:  # the node went away meanwhile
            log.debug("spot notice not reported", node=node, error=str(e))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
