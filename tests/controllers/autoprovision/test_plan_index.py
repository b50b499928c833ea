"""The planner reads demand from the pods the scheduler gave up on (an index), never from a scan of every pod:
at 100,000 pods a scan per plan cost O(pods) on every pod event near a managed node (seen in bench/scale.py).
The index is the spot pool controller's (one shared function, so both controllers in one process share it)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from gpuops.accounting.capacity import PendingPod
from gpuops.controllers import scheduling
from gpuops.controllers.autoprovision import reconciler as rec_mod
from gpuops.controllers.autoprovision.api import GROUPS
from gpuops.controllers.autoprovision.reconciler import Autoprovisioner
from gpuops.controllers.spotpool import reconciler as spot_mod
from gpuops.kube.informer import Informer
from gpuops.kube.objects import Pod
from gpuops.kube.resources import NODES, PODS

pytestmark = pytest.mark.anyio

UNSCHEDULABLE = {"phase": "Pending",
                 "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pod(name: str, rv: int, *, node: str = "", pending: bool = False) -> Pod:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
                            "spec": spec, "status": UNSCHEDULABLE if pending else {"phase": "Running"}}, Pod)


def planner() -> tuple[Autoprovisioner, Informer[Pod]]:
    client: Any = SimpleNamespace(host="http://unused")  # never started: the test fills the stores itself
    pods = Informer(client, PODS)
    ap = Autoprovisioner(client, Informer(client, GROUPS), Informer(client, NODES), pods, cast(Any, None),
                         cast(Any, None))
    return ap, pods


async def test_plan_takes_demand_from_the_index_not_from_every_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    ap, pods = planner()
    for i in range(1000):
        pods.store.upsert(pod(f"bound-{i:04d}", i + 1, node=f"n{i % 10}"))
    pods.store.upsert(pod("wait-b", 2001, pending=True))
    pods.store.upsert(pod("wait-a", 2002, pending=True))
    pods.store.upsert(pod("wait-c", 2003, pending=True))
    pods.store.upsert(pod("wait-c", 2004, node="n1"))  # the scheduler found it a place: no longer demand
    seen: list[list[str]] = []

    def demand(waiting: list[Pod], views: Any) -> list[PendingPod]:
        seen.append([p.metadata.name for p in waiting])
        return []

    def no_scan() -> list[Pod]:
        raise AssertionError("plan() listed every pod")

    monkeypatch.setattr(rec_mod, "demand", demand)
    monkeypatch.setattr(pods.store, "list", no_scan)
    await ap.plan()
    assert seen == [["wait-a", "wait-b"]]  # only the unschedulable pods, in name order


def test_the_index_is_shared_with_the_spot_pool_controller() -> None:
    _, pods = planner()
    assert spot_mod.unschedulable is scheduling.unschedulable
    assert spot_mod.INDEX_UNSCHEDULABLE == scheduling.INDEX_UNSCHEDULABLE
    pods.add_index(spot_mod.INDEX_UNSCHEDULABLE, spot_mod.unschedulable)  # the same function: a no-op, no error
    pods.store.upsert(pod("w", 1, pending=True))
    assert [p.metadata.name for p in pods.store.by_index(scheduling.INDEX_UNSCHEDULABLE, "")] == ["w"]


# ---------------------------------------------------------------------------------------------- gpu_request memo


def versioned(uid: str, rv: str, gpus: str) -> Pod:
    return msgspec.convert({"metadata": {"name": uid, "namespace": "ns", "uid": uid, "resourceVersion": rv},
                            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}},
                           Pod)


def test_gpu_request_is_computed_once_per_pod_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan() asks for the same cached pods' requests on every plan; exact quantity parsing was ~85% of a plan's
    time at 200 node groups (bench/scale.py). A new resourceVersion is a new entry; the memo stays bounded.

    Seen from outside: a resourceVersion names one content, so a pod shown again under a version with another
    request (which the API server never does) gets the remembered answer, and a recomputed one gets the new."""
    monkeypatch.setattr(scheduling, "REQUESTS_MAX", 3)
    u = uuid.uuid4().hex  # uids of this run only: the memo is the process's
    a1 = versioned(f"a-{u}", "1", "2")
    assert scheduling.gpu_request(a1, "nvidia.com/gpu") == 2
    assert scheduling.gpu_request(versioned(f"a-{u}", "1", "5"), "nvidia.com/gpu") == 2  # same version: remembered
    assert scheduling.gpu_request(a1, "cpu") == 0  # per resource
    assert scheduling.gpu_request(versioned(f"a-{u}", "2", "4"), "nvidia.com/gpu") == 4  # a new version: recomputed
    for gpus in ("1", "3"):  # no uid nor resourceVersion (built in memory): never memoised
        assert scheduling.gpu_request(versioned("", "", gpus), "nvidia.com/gpu") == int(gpus)
    for i in range(10):
        scheduling.gpu_request(versioned(f"p{i}-{u}", "1", "1"), "nvidia.com/gpu")
    remembered = [i for i in range(10)
                  if scheduling.gpu_request(versioned(f"p{i}-{u}", "1", "7"), "nvidia.com/gpu") == 1]
    assert len(remembered) <= 3, remembered  # at most REQUESTS_MAX entries were kept
