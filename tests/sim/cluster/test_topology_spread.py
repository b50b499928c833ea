"""The emulated scheduler's PodTopologySpread filter (DoNotSchedule): replicas spread over the domains of the
topology key, the node inclusion policies decide which domains count, a node without the key is never used,
and a pod that would exceed maxSkew waits with kube-scheduler's message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import cluster, node, pod
from waiting import until_holds

from gpuops_sim.apiserver.selectors import label_selector_from_object
from gpuops_sim.cluster.spread import (
    REASON_SPREAD,
    REASON_SPREAD_LABEL,
    EligibleNode,
    Spread,
    domain_counts,
    spread_reason,
)

HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spread_pod(name: str, key: str = HOSTNAME, *, policy: str | None = None, **spec: Any) -> dict[str, Any]:
    constraint: dict[str, Any] = {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                                  "labelSelector": {"matchLabels": {"app": "web"}}}
    if policy:
        constraint["nodeAffinityPolicy"] = policy
    body = pod(name, topologySpreadConstraints=[constraint], **spec)
    body["metadata"]["labels"] = {"app": "web"}
    return body


@pytest.mark.anyio
async def test_replicas_created_together_land_on_different_nodes() -> None:
    async with cluster() as (c, _):
        for n in ("a", "b"):
            await c.add_node(node(n, gpus=0))
        for i in range(4):
            await c.add_pod(spread_pod(f"web-{i}"))
        await until_holds("web-0 to web-3 bound", lambda: all(c.node_of(f"web-{i}") for i in range(4)))
        placed = [c.node_of(f"web-{i}") for i in range(4)]
        assert sorted(placed) == ["a", "a", "b", "b"]


@pytest.mark.anyio
async def test_node_affinity_policy_decides_which_domains_count() -> None:
    async with cluster() as (c, _):
        for n in ("a", "b"):
            await c.add_node(node(n, gpus=0, labels={"pool": n}))
        for i in range(2):  # Honor (the default): only pool a's node is a domain, so both fit there
            await c.add_pod(spread_pod(f"honor-{i}", nodeSelector={"pool": "a"}))
        await until_holds("honor-0 and honor-1 bound to a", lambda: c.node_of("honor-0") == c.node_of("honor-1") == "a")
        ignore = spread_pod("ignore", policy="Ignore", nodeSelector={"pool": "a"})
        await c.add_pod(ignore)  # Ignore: b counts as an empty domain, so a third pod on a is a skew of 3
        await until_holds("ignore reported unschedulable", lambda: c.unschedulable_message("ignore") is not None)
        assert f"1 {REASON_SPREAD}" in (c.unschedulable_message("ignore") or "")


@pytest.mark.anyio
async def test_a_node_without_the_topology_key_is_never_chosen() -> None:
    async with cluster() as (c, _):
        await c.add_node(node("zoned", gpus=0, cpu="1", labels={"zone": "z1"}))
        await c.add_node(node("unzoned", gpus=0, cpu="64"))
        await c.add_pod(spread_pod("big", key="zone", cpu="2"))  # only fits the node without a zone
        await until_holds("big reported unschedulable", lambda: c.unschedulable_message("big") is not None)
        message = c.unschedulable_message("big") or ""
        assert f"1 {REASON_SPREAD_LABEL}" in message and "1 Insufficient cpu" in message


EVERYTHING = label_selector_from_object({})


@given(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.integers(1, 3), st.integers(1, 6))
def test_the_filter_admits_exactly_the_domains_within_max_skew(loads: list[int], max_skew: int,
                                                               min_domains: int) -> None:
    spread = Spread(max_skew, "zone", EVERYTHING, min_domains, True, False, True)
    nodes = [EligibleNode(f"n{i}", {"zone": f"z{i}"}, True, True) for i in range(len(loads))]
    pods = [{"metadata": {"labels": {}}, "spec": {"nodeName": f"n{i}"}} for i, k in enumerate(loads) for _ in range(k)]
    counts = domain_counts(spread, nodes, pods)
    assert counts == {f"z{i}": k for i, k in enumerate(loads)}
    floor = min(loads) if len(loads) >= min_domains else 0
    for i, k in enumerate(loads):
        admitted = spread_reason((spread,), [counts], {"zone": f"z{i}"}) is None
        assert admitted == (k + 1 - floor <= max_skew)
