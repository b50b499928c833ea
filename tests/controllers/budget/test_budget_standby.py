"""A standby replica remembers pods deleted while another replica leads (or while nobody does), so a failover
between a pod's end and its deletion loses nothing; what a leader's ledger already holds it forgets."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, budget, environment, pod, truth_gpu_hours

from gpuops.controllers.budget.api import BUDGETS, GPUWorkloadBudget
from gpuops.controllers.budget.setup import install
from gpuops.kube.leaderelection import micro_time
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import LEASES, PODS

pytestmark = pytest.mark.anyio

LEASE = "budget-standby-test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _entries(b: GPUWorkloadBudget) -> dict[str, str]:
    return {e.uid: e.name for e in (b.status.ledger.entries or ())} if b.status.ledger else {}


async def test_pods_deleted_without_a_leader_are_accounted_after_the_takeover(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.create_budget(budget("team", "100"))
        # another replica holds the lease (and is gone: it never renews, nor writes a ledger)
        await env.client.create(LEASES, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE},
            "spec": {"holderIdentity": "killed-leader", "leaseDurationSeconds": 3600,
                     "acquireTime": micro_time(), "renewTime": micro_time()}}, NS)
        mgr = Manager(env.client, ManagerOptions(
            metrics_bind_address="0", health_probe_bind_address="0", leader_election=True, leader_election_id=LEASE,
            leader_election_namespace=NS, lease_duration=3.0, renew_deadline=2.0, retry_period=0.5))
        handle = install(mgr)
        task = asyncio.create_task(mgr.run())
        try:
            await env.create_pod(pod("gone", 2, 1.0))
            await env.create_pod(pod("ledgered", 1, 1.0))
            await env.until("both finished", lambda: env.all_finished(["gone", "ledgered"]))
            raw = {p["metadata"]["name"]: p for p in await env.raw_pods(["gone", "ledgered"])}
            uids = {n: p["metadata"]["uid"] for n, p in raw.items()}
            for name in ("gone", "ledgered"):
                await env.client.delete(PODS, name, NS)
                await env.until(f"{name} gone", lambda n=name: env.pod_gone(n))  # type: ignore[misc]
            departed = handle.reconciler._departed

            async def remembered() -> bool:
                return set(uids.values()) <= set(departed.get(f"{NS}/team", {}))

            await env.until("the standby remembers both deletions", remembered)
            standby = not mgr.is_leader
            assert standby and not _entries(await env.budget("team"))
            # the dead leader had written "ledgered" before it died: the standby forgets that one
            st = {"ledger": {"resourceName": "nvidia.com/gpu", "entries": [
                {"uid": uids["ledgered"], "name": "ledgered", "start": "2026-01-01T00:00:00Z",
                 "end": "2026-01-01T00:00:01Z", "gpus": "1"}]}}
            await env.client.patch(BUDGETS, "team", {"status": st}, namespace=NS, subresource="status")

            async def pruned() -> bool:
                return set(departed.get(f"{NS}/team", {})) == {uids["gone"]}

            await env.until("what the ledger holds is forgotten", pruned)
            # the takeover: the lease frees up; the new leader writes the deleted pod's usage
            await env.client.delete(LEASES, LEASE, namespace=NS)

            async def accounted() -> GPUWorkloadBudget | None:
                b = await env.budget("team")
                return b if uids["gone"] in _entries(b) else None

            b = await env.until("the deleted pod is in the ledger", accounted, within=30.0)
            assert mgr.is_leader
            gone_truth = truth_gpu_hours([raw["gone"]])
            assert b.status.ledger is not None
            entry = next(e for e in b.status.ledger.entries or () if e.uid == uids["gone"])
            assert entry.name == "gone" and Fraction(entry.gpus) == 2 and gone_truth > 0
        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 15)
