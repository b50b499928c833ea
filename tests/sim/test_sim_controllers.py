"""The emulator's controller-manager loops: disruption controller arithmetic and PodGC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.auth import UserInfo
from gpuops_sim.apiserver.controllers import pdb_status
from gpuops_sim.apiserver.objects import WriteContext

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


def pod(name: str, ready: bool = True, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app": "x"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-21T12:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def pdb(spec: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "b", "generation": generation}, "spec": spec, "status": status or {}}


def test_min_available_counts_ready_pods() -> None:
    pods = [pod("a"), pod("b"), pod("c", ready=False), pod("d", phase="Succeeded")]
    st_ = pdb_status(pdb({"minAvailable": 1}), pods, NOW)
    assert st_["expectedPods"] == 3
    assert st_["currentHealthy"] == 2
    assert st_["desiredHealthy"] == 1
    assert st_["disruptionsAllowed"] == 1
    assert st_["observedGeneration"] == 1
    assert st_["conditions"][0]["reason"] == "SufficientPods"


def test_percentages_round_up() -> None:
    pods = [pod(str(i)) for i in range(3)]
    assert pdb_status(pdb({"minAvailable": "50%"}), pods, NOW)["desiredHealthy"] == 2
    assert pdb_status(pdb({"maxUnavailable": "50%"}), pods, NOW)["desiredHealthy"] == 1


def test_recent_disruptions_reduce_allowance_until_they_expire() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    recent = (NOW - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    s1 = pdb_status(pdb({"minAvailable": 1}, status={"disruptedPods": {"a": recent}}), pods, NOW)
    assert s1["disruptionsAllowed"] == 1 and s1["disruptedPods"] == {"a": recent}
    s2 = pdb_status(pdb({"minAvailable": 1}, status={"disruptedPods": {"a": old}}), pods, NOW)
    assert s2["disruptionsAllowed"] == 2 and "disruptedPods" not in s2


@given(ready=st.integers(0, 20), unready=st.integers(0, 20), min_available=st.integers(0, 40))
def test_allowance_never_negative_and_never_exceeds_healthy(ready: int, unready: int,
                                                                   min_available: int) -> None:
    pods = [pod(f"r{i}") for i in range(ready)] + [pod(f"u{i}", ready=False) for i in range(unready)]
    s = pdb_status(pdb({"minAvailable": min_available}), pods, NOW)
    assert 0 <= s["disruptionsAllowed"] <= s["currentHealthy"] == ready
    assert s["disruptionsAllowed"] == max(0, ready - min_available)


@pytest.mark.anyio
async def test_pod_gc_keeps_at_most_threshold_terminated_pods() -> None:
    async with APIServer(terminated_pod_gc_threshold=2) as s:
        pods = s.registry.lookup("", "v1", "pods")
        assert pods is not None
        ctx = WriteContext(UserInfo("t", groups=("system:masters",)), field_manager="t")
        for i in range(4):
            await s.api.create(pods, "default", {"metadata": {"name": f"p{i}"},
                                                 "spec": {"containers": [{"name": "c", "image": "i"}]}}, ctx)
            current = s.api.get(pods, "default", f"p{i}").obj
            await s.api.update(pods, "default", f"p{i}", dict(current, status={"phase": "Succeeded"}), ctx,
                               "status")
        await s.controllers.step()
        left = sorted(x.obj["metadata"]["name"] for x in s.store.iter(("", "pods"), "default"))
        assert left == ["p2", "p3"]  # oldest first; same-second ties break by name


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_numeric_quantities_are_stored_as_strings_like_the_apiserver() -> None:
    async with APIServer() as s:
        pods = s.registry.lookup("", "v1", "pods")
        assert pods is not None
        ctx = WriteContext(UserInfo("t", groups=("system:masters",)), field_manager="t")
        created = await s.api.create(pods, "default", {"metadata": {"name": "q"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"cpu": 0.5, "nvidia.com/gpu": 2, "memory": "1Gi"}}}
        ]}}, ctx)
        res = created["spec"]["containers"][0]["resources"]
        assert res["limits"] == {"cpu": "500m", "nvidia.com/gpu": "2", "memory": "1Gi"}
        assert res["requests"] == res["limits"]  # requests default to limits
