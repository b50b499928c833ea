"""Usage by GPU model and capacity type against the emulated API server: each pod is charged as the kind of node
it ran on (GPU feature discovery's product label; Karpenter's capacity-type label for spot), the kinds add up to
the consumed figure, and a finished pod in the ledger keeps its kind after its node's labels change."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from budget_harness import NS, Clock, Reconciles, budget, environment, pod, running_since
from prometheus_client import REGISTRY

from gpuops.accounting.gpuhours import format_gpu_hours
from gpuops.kube.controller import Request
from gpuops.kube.resources import NODES, PODS

pytestmark = pytest.mark.anyio

A100 = "NVIDIA-A100-SXM4-80GB"
"""The product label GPU feature discovery gives an A100-SXM4-80GB (the emulator's a100 nodes)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def on(node: str, name: str, gpus: int) -> dict[str, object]:
    body = pod(name, gpus)
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}  # type: ignore[index]  # the scheduler waits
    return body  # for the node's GPUs, where a nodeName set before the device plugin registers would be refused


async def test_usage_is_split_by_the_model_and_capacity_type_of_each_pods_node(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.client.patch(NODES, "a100-1", {"metadata": {"labels": {"karpenter.sh/capacity-type": "spot"}}})
        await env.create_budget(budget("kinds", "100", window=24))
        await env.create_pod(on("a100-0", "steady", 1))
        await env.create_pod(on("a100-1", "cheap", 2))
        t_steady = await env.until("steady running", lambda: running_since(env, "steady"))
        t_cheap = await env.until("cheap running", lambda: running_since(env, "cheap"))
        now = max(t_steady, t_cheap) + 600
        clock = Clock()
        clock.set(now)
        handle = await env.start(clock=clock)
        req = Request(NS, "kinds")
        await Reconciles(handle).after(env, req)
        st = (await env.budget("kinds")).status
        on_demand, spot = Fraction(now - t_steady, 3_600), 2 * Fraction(now - t_cheap, 3_600)
        assert [(u.model, u.capacity_type, u.gpu_hours) for u in st.usage or ()] == [
            (A100, "OnDemand", format_gpu_hours(on_demand)), (A100, "Spot", format_gpu_hours(spot))]
        assert st.consumed_gpu_hours == format_gpu_hours(on_demand + spot)
        for capacity, used in (("OnDemand", on_demand), ("Spot", spot)):  # the metrics, at the same instant
            labels = {"namespace": NS, "name": "kinds", "model": A100, "capacity_type": capacity}
            assert REGISTRY.get_sample_value("gpuops_budget_usage_gpu_seconds", labels) == float(used * 3_600)

        relabel = {"metadata": {"labels": {"karpenter.sh/capacity-type": "on-demand"}}}
        await env.client.patch(NODES, "a100-1", relabel)  # while cheap runs: it stays charged as it started

        async def relabelled() -> bool:
            node = handle.reconciler.nodes.store.get("a100-1") if handle.reconciler.nodes else None
            return node is not None and (node.metadata.labels or {}).get("karpenter.sh/capacity-type") == "on-demand"

        await env.until("the controller's cache shows the new label", relabelled)
        await Reconciles(handle).after(env, req, lambda: clock.set(now + 60))
        st = (await env.budget("kinds")).status
        spot = 2 * Fraction(now + 60 - t_cheap, 3_600)
        assert [(u.capacity_type, u.gpu_hours) for u in st.usage or ()][1] == ("Spot", format_gpu_hours(spot))

        await env.client.delete(PODS, "cheap", NS, grace_period_seconds=0)  # its usage moves to the ledger
        await env.until("cheap gone", lambda: env.pod_gone("cheap"))
        await Reconciles(handle).after(env, req, lambda: clock.set(now + 120))
        st = (await env.budget("kinds")).status
        assert st.ledger is not None and [(e.name, e.model, e.capacity_type) for e in st.ledger.entries or ()] == [
            ("cheap", A100, "Spot")]  # charged as what the node was while the pod ran
        kinds = {(u.model, u.capacity_type): Fraction(u.gpu_hours) for u in st.usage or ()}
        assert set(kinds) == {(A100, "OnDemand"), (A100, "Spot")}
        assert abs(sum(kinds.values()) - Fraction(st.consumed_gpu_hours)) <= Fraction(1, 10**6)
