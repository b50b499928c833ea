"""Any MigNode the CRD schema admits (as a node agent, or a forger holding its token, could publish it) leaves
the MIG allocator working: hypothesis draws a MigNode's GPUs from the schema (models with and without MIG
tables, MIG disabled or pending, slices anywhere), the API server admits or refuses it, and a gated pod asking
for a slice is then reconciled without raising, without a hot loop, and with the allocator's condition on the
pod naming a reason; a pod it cannot place also gets a FailedMigAllocation Event."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, reject
from hypothesis import strategies as st
from live_controller import ANY_ADMITTED, Live
from schema_strategies import for_schema

from gpuops.controllers.migslicer.allocator import CONDITION
from gpuops.controllers.migslicer.api import CLAIMS, GATE, MIG_NODES, resource_of_profile
from gpuops.controllers.migslicer.settings import Settings
from gpuops.controllers.migslicer.setup import install
from gpuops.kube import conditions as cond
from gpuops.kube.errors import ApiError
from gpuops.kube.manager import Manager
from gpuops.kube.resources import EVENTS, PODS
from gpuops.kube.times import format_time, wall_clock
from gpuops_sim.cluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[3]
STATUS = yaml.safe_load((ROOT / "manifests/crds/mignodes.gpuops.io.yaml").read_text())[
    "spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
NS = "work"
NODE = "mig-0"
SCENARIO = {
    "name": "mig-any",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "mig", "gpuModel": "A100-40GB", "gpusPerNode": 2, "count": 1}],
}
PROFILES = ["1g.5gb", "3g.20gb", "7g.40gb", "1g.10gb", "4g.20gb+me", "8g.9999gb"]
WAITING = frozenset({"Planned", "CreatingSlices", "Advertising", "WaitingForKubelet", "WaitingForNode"})
"""Condition reasons of a pod whose slices are on their way (no Event: nothing is wrong)."""
NAMES = itertools.count()


def _install(manager: Manager, _cluster: SimCluster) -> Any:
    return install(manager, settings=Settings(retry=1.0))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with Live(tmp_path_factory.mktemp("mig-any"), SCENARIO, ["mignodes", "allocationclaims"], [CLAIMS, MIG_NODES],
              _install) as lv:
        yield lv


def _status() -> st.SearchStrategy[Any]:
    models = st.sampled_from(["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L4-24GB", "T4"])
    drawn = for_schema(STATUS["properties"]["gpus"]["items"], "status.gpus[]", {"status.gpus[].model": models})
    clean = st.integers(0, 63).map(lambda i: {"index": i, "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
                                               "model": "A100-40GB", "migMode": "Enabled"})
    gpu = st.one_of(drawn, clean)  # some GPUs a slice fits on, so allocations happen too
    return st.tuples(for_schema(STATUS, "status", {
        "status.gpus": st.lists(gpu, max_size=3, unique_by=lambda g: g["uuid"]),
        "status.conditions": st.just([]),
    }), st.booleans()).map(lambda d: {**d[0], "heartbeat": format_time(wall_clock())} if d[1] else d[0])


def _pod(name: str, profile: str) -> dict[str, Any]:
    limits = {resource_of_profile(profile): "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "schedulingGates": [{"name": GATE}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": limits, "requests": limits}}]}}


async def _publish(live: Live, name: str, node: str, status: dict[str, Any]) -> bool:
    body = {"apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode", "metadata": {"name": name},
            "spec": {"nodeName": node}}
    try:
        await live.client.create(MIG_NODES, body)
        await live.client.patch(MIG_NODES, name, {"status": status}, subresource="status")
    except ApiError as e:
        if e.status in (400, 422):
            await live.client.delete(MIG_NODES, name)
            return False
        raise
    return True


async def _handled(live: Live, node: str, status: dict[str, Any], profile: str) -> bool:
    n = next(NAMES)
    mig_node, pod = f"node-{n}", f"pod-{n}"
    if not await _publish(live, mig_node, node, status):
        return False
    mark = len(live.log.items)
    await live.client.create(PODS, _pod(pod, profile), NS)
    key = f"{NS}/{pod}"
    await live.reconciled(key, mark)
    await live.settle(1.0)
    raised = [r for r in live.log.errors() if r.seq > mark]
    assert not raised, f"reconcile of {raised[0].key} raised {raised[0].error!r}"
    mine = live.log.of(key, mark)
    assert len(mine) <= 10, f"{len(mine)} reconciles of {key} in 1 s: a hot loop"
    got = await live.client.get(PODS, pod, NS)
    c = cond.get_condition(got.status.conditions, CONDITION)
    assert c is not None and c.reason and c.message, f"{pod} has no {CONDITION} condition naming a reason: {c}"
    event(f"{c.status} {c.reason}")
    if c.status != "True" and c.reason not in WAITING:
        assert await live.handle.recorder.flush(5.0)
        _, events = await live.client.list(EVENTS, NS)
        assert any(e.reason == "FailedMigAllocation" and e.involved_object.name == pod for e in events), c
    await live.client.delete(PODS, pod, NS)
    await live.client.delete(MIG_NODES, mig_node)
    return True


@ANY_ADMITTED
@given(node=st.sampled_from([NODE, "no-such-node"]), status=_status(), profile=st.sampled_from(PROFILES))
def test_any_admitted_mig_node_leaves_the_allocator_working(
    live: Live, node: str, status: dict[str, Any], profile: str,
) -> None:
    if not live.run(_handled(live, node, status, profile)):
        reject()
