"""What the spot pool chaos scenarios share: the rig, the ground truth of the emulated cloud, pool helpers.

Rig. An emulated cluster with the emulated cloud selling 1-GPU spot instances on compressed timings (launch
0.5 s, boot 1 s, device plugin 0.2 s, terminate 0.3 s; the node agent reports a notice within
`notice_poll` s), the SpotPool CRD, and `gpuops run --controllers spotpool` as a subprocess (log level
INFO: its "instances launched" records name each launch's client token). The cloud's fault injector draws
from `--seed`.

Ground truth is bench/spotpool.py's `SpotLedger` (loaded from there, so bench and chaos measure alike),
attached before the cloud starts: every launch request as the cloud handled it (client token, created or
replayed), every reclaim notice, every notice annotation on a Node, instance states read from the cloud's
own records. None of it goes through the operator or the HTTP API under test. Latencies are on
`time.monotonic()` of this process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import OnHarness, load_bench, wait_for

from gpuops_sim.cloud.faults import CloudFaults
from gpuops_sim.cloud.spot import Instance
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness
from gpuops_sim.scenario import parse

__all__ = ["NS", "POOL", "SECRETS", "SpotRig", "bench", "open_spot_rig", "sleep_until"]

ROOT = Path(__file__).resolve().parents[1]
NS = "gpuops-system"
POOL = "chaos"
SECRETS = ("", "secrets")


bench = load_bench("spotpool")


@dataclass
class SpotRig(OnHarness):
    led: Any  # bench.SpotLedger of the pool POOL
    resync: float
    notes: list[str] = field(default_factory=list)

    @property
    def spot(self) -> Any:
        return self.cluster.cloud.spot

    # ------------------------------------------------------------------------------------------ the pool

    def pool(self) -> dict[str, Any] | None:
        """The pool as the store holds it (in-process: unaffected by faults of the HTTP API)."""
        return self.cluster.access.get(bench.POOLS, "", POOL)

    def status(self) -> dict[str, Any]:
        return dict((self.pool() or {}).get("status") or {})

    def condition(self, ctype: str) -> dict[str, Any] | None:
        return next((c for c in self.status().get("conditions") or () if c.get("type") == ctype), None)

    def is_true(self, ctype: str) -> bool:
        c = self.condition(ctype)
        return c is not None and c.get("status") == "True"

    async def create_pool(self, minimum: int, maximum: int, **spec: Any) -> None:
        body = bench.pool_body(POOL, self.cluster.cloud.url, minimum, maximum, drainTimeoutSeconds=5, **spec)
        await self.rig.request("POST", bench.POOLS_PATH, body)

    async def patch_spec(self, **spec: Any) -> None:
        """A merge patch of the spec, in-process (the driver's writes are not the operator's to fail)."""
        await self.cluster.access.patch(bench.POOLS, "", POOL, {"spec": spec})

    async def delete_pool(self) -> None:
        await self.cluster.access.delete(bench.POOLS, "", POOL)

    def spec(self) -> dict[str, Any]:
        return dict((self.pool() or {}).get("spec") or {})

    def converged(self, target: int | None = None) -> bool:
        """At `target` (default: the spec's minimum): that many live instances not under notice in the cloud,
        all Ready, the status saying so (desired, size, ready, Ready=True) and no launch pending."""
        spec, st = self.spec(), self.status()
        n = int(spec.get("minimum") or 0) if target is None else target
        return (len(self.led.live()) == n and st.get("desired") == n and len(self.led.ready()) >= n
                and st.get("size") == n and st.get("ready") == n and st.get("pendingLaunch") is None
                and self.is_true("Ready")
                and len([i for i in self.led.ready() if i.interruption is None]) == n)

    async def wait_converged(self, what: str, within: float, target: int | None = None) -> float:
        """Until `converged(target)`; returns the monotonic instant it was first seen."""
        return await wait_for(what, lambda: self.converged(target), within)

    def launches_since(self, t0: float) -> list[dict[str, Any]]:
        """Every RunInstances call the cloud answered: when (s after `t0`), its client token, how many instances
        it asked for and whether it created them (a replayed token creates none)."""
        return [{"at": round(c.at - t0, 3), "token": c.token, "count": c.count, "created": c.created}
                for c in self.led.launches]

    def tagged(self) -> list[Instance]:
        return [i for i in self.spot.instances.values() if i.tags.get(bench.POOL_TAG) == POOL]

    # ------------------------------------------------------------------------------------------ secrets

    async def put_secret(self, name: str, token: str) -> None:
        data = {"token": base64.b64encode(token.encode()).decode()}
        if self.cluster.access.get(SECRETS, NS, name) is None:
            await self.cluster.access.create(SECRETS, NS, {"apiVersion": "v1", "kind": "Secret",
                                                          "metadata": {"name": name, "namespace": NS},
                                                          "data": data})
        else:
            await self.cluster.access.patch(SECRETS, NS, name, {"data": data})

    # ------------------------------------------------------------------------------------------ the operator

    def spot_calls(self) -> int:
        return int(bench.spot_calls(self.cluster))

    def run_calls(self) -> int:
        return sum(n for (api, op, _), n in self.cluster.cloud.calls.items() if api == "spot" and op == "run")


def _scenario(name: str, notice: float, notice_poll: float) -> Any:
    return parse({
        "name": name, "namespaces": [NS],
        "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
        "scheduler": {"events": False},
        "nodeLifecycle": {"nodeMonitorGraceSeconds": 1.0, "podGcOrphanSeconds": 2.0},
        "cloud": {"launchSeconds": 0.5, "bootSeconds": 1.0, "devicePluginSeconds": 0.2, "terminateSeconds": 0.3,
                  "reclaimNoticeSeconds": notice, "noticePollSeconds": notice_poll,
                  "instanceTypes": [{"name": bench.ITYPE, "gpuModel": "L4-24GB", "gpus": 1}]},
    })


@contextlib.asynccontextmanager
async def open_spot_rig(name: str, *, seed: int, resync: float | None = None, notice: float = 10.0,
                        notice_poll: float = 0.5, minimum: int = 0,
                        configure: Callable[[SimCluster], None] | None = None) -> AsyncIterator[SpotRig]:
    """The rig (module docstring); `resync`: `--spotpool-resync` (None: the default, 30 s)."""
    cluster = SimCluster(_scenario(name, notice, notice_poll), workload=False, faults=False)
    cluster.cloud.faults = CloudFaults(seed)
    if configure is not None:
        configure(cluster)
    led = bench.SpotLedger(cluster, lambda i: i.tags.get(bench.POOL_TAG) == POOL, minimum)
    led.attach()
    args = ("--spotpool-resync", f"{resync:g}") if resync is not None else ()
    with tempfile.TemporaryDirectory() as tmp:
        async with OperatorHarness(cluster, Path(tmp), crds=[bench.CRD], controllers=("spotpool",),
                                   log_level=os.environ.get("CHAOS_SPOT_LOG_LEVEL", "INFO"),
                                   extra_args=args) as rig:
            try:
                yield SpotRig(rig, led, resync if resync is not None else 30.0)
            finally:  # kept for a look after the run (the rig's folder goes with it)
                with contextlib.suppress(OSError):
                    shutil.copyfile(rig.log_path, Path(tempfile.gettempdir()) / f"{name}-operator.log")


async def sleep_until(deadline: float) -> None:
    """The scenario's own timeline (a hold of a fault for a set time), not a wait for state."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))

