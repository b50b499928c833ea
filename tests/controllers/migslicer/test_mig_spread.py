"""Placement under concurrent arrivals: a node hands one not-yet-started pod its slices per profile at a time, so
a pod whose profile is being handed over on the fullest node goes to the next best node instead of queueing."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuops.accounting import mig
from gpuops.controllers.migslicer.allocator import (
    INDEX_CLAIMS_BY_NODE,
    INDEX_CLAIMS_BY_POD,
    INDEX_GATED,
    Allocator,
    claims_by_node,
    claims_by_pod,
    gated,
)
from gpuops.controllers.migslicer.api import GATE, AllocationClaim, MigNode
from gpuops.kube.controller import Request
from gpuops.kube.objects import Pod


class _Store:
    def __init__(self, items: dict[str, Any]) -> None:
        self.items = items

    def by_index(self, name: str, value: str) -> list[Any]:
        fn = {INDEX_GATED: gated, INDEX_CLAIMS_BY_POD: claims_by_pod, INDEX_CLAIMS_BY_NODE: claims_by_node}[name]
        return [o for o in self.items.values() if value in fn(o)]  # type: ignore[operator]

    def list(self) -> list[Any]:
        return list(self.items.values())

    def get(self, key: str) -> Any:
        return self.items.get(key)


class _Informer:
    def __init__(self, items: dict[str, Any]) -> None:
        self.store = _Store(items)


def _pod(name: str, phase: str = "Pending", started: bool = False, gated: bool = False) -> Pod:
    status: dict[str, Any] = {"phase": phase}
    if started:
        status["containerStatuses"] = [{"name": "main", "ready": True, "restartCount": 0, "image": "cuda",
                                        "imageID": "", "state": {"running": {}}}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return msgspec.convert({"metadata": {"name": name, "namespace": "w", "uid": f"uid-{name}"},
                            "spec": spec, "status": status}, Pod)


def _claim(pod: str, node: str, profile: str, phase: str = "Created") -> AllocationClaim:
    return msgspec.convert({"metadata": {"name": f"{pod}-0", "namespace": "w"},
                            "spec": {"podName": pod, "podUID": f"uid-{pod}", "nodeName": node, "gpuUUID": "g",
                                     "profile": profile, "start": 0, "size": 1},
                            "status": {"phase": phase}}, AllocationClaim)


def _allocator(pods: list[Pod], claims: list[AllocationClaim]) -> Allocator:
    a = Allocator.__new__(Allocator)
    a.pods = _Informer({f"w/{p.metadata.name}": p for p in pods})  # type: ignore[assignment]
    a.claims = _Informer({f"w/{c.metadata.name}": c for c in claims})  # type: ignore[assignment]
    a._reserved = {}
    return a


FULLER = mig.Node("fuller", (mig.GPU("g0", "A100-40GB", (mig.Placement("3g.20gb", 4, 4),)),))
EMPTY = mig.Node("empty", (mig.GPU("g1", "A100-40GB"),))


def test_a_node_handing_the_profile_to_another_pod_is_passed_over() -> None:
    a = _allocator([_pod("first")], [_claim("first", "fuller", "1g.5gb")])
    assert a._place([FULLER, EMPTY], ["1g.5gb"]).node == "empty"  # type: ignore[union-attr]
    # another profile is not held up there: packing wins
    assert a._place([FULLER, EMPTY], ["2g.10gb"]).node == "fuller"  # type: ignore[union-attr]


def test_once_the_other_pod_started_or_when_nothing_else_fits_the_best_node_is_used() -> None:
    started = _allocator([_pod("first", started=True)], [_claim("first", "fuller", "1g.5gb", "Bound")])
    assert started._place([FULLER, EMPTY], ["1g.5gb"]).node == "fuller"  # type: ignore[union-attr]
    busy = _allocator([_pod("first")], [_claim("first", "fuller", "1g.5gb")])
    assert busy._place([FULLER], ["1g.5gb"]).node == "fuller"  # type: ignore[union-attr]
    full = mig.Node("full", (mig.GPU("g2", "A100-40GB", (mig.Placement("7g.40gb", 0, 8),)),))
    assert busy._place([FULLER, full], ["1g.5gb"]).node == "fuller"  # type: ignore[union-attr]
    # a claim whose pod is gone or finished holds nothing up
    gone = _allocator([], [_claim("first", "fuller", "1g.5gb")])
    assert gone._place([FULLER, EMPTY], ["1g.5gb"]).node == "fuller"  # type: ignore[union-attr]


def test_a_claim_change_wakes_only_the_gated_pods_it_can_concern() -> None:
    """Its own pod, pods not planned yet, and pods handed slices on the same node; not pods whose claims are
    on other nodes (each wake is a reconcile of the single worker)."""
    pods = [_pod("own", gated=True), _pod("unplanned", gated=True), _pod("same-node", gated=True),
            _pod("other-node", gated=True), _pod("running", "Running", started=True)]
    claims = [_claim("own", "a", "1g.5gb"), _claim("same-node", "a", "1g.5gb"), _claim("other-node", "b", "1g.5gb"),
              _claim("running", "a", "1g.5gb", "Bound")]
    a = _allocator(pods, claims)
    woken = a.map_claim(claims[0])
    assert woken[0] == Request("w", "own")
    assert sorted(r.name for r in woken) == ["own", "same-node", "unplanned"]
    node_b = msgspec.convert({"metadata": {"name": "b"}, "spec": {"nodeName": "b"}}, MigNode)
    assert sorted(r.name for r in a.map_capacity(node_b)) == ["other-node", "unplanned"]
    everyone = ["other-node", "own", "same-node", "unplanned"]
    assert sorted(r.name for r in a.map_capacity(object())) == everyone  # an unknown object: every gated pod
