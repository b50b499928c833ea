"""The node lifecycle controller with live kubelets: silent nodes go Unknown and get tainted, pods are evicted
after their tolerations, nodes of vanished machines are deleted and their pods garbage collected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pytest
from waiting import two_passes, until_holds

from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import LEASES, NODE_LEASE_NAMESPACE, NODES, PODS, ClusterAccess
from gpuops_sim.cluster.kubelet import KubeletOptions, Kubelets
from gpuops_sim.cluster.machines import Fleet, Machine
from gpuops_sim.cluster.nodelifecycle import NodeLifecycle, NodeLifecycleOptions, tolerates


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


KUBELET = KubeletOptions(start_latency_seconds=0.02, lease_seconds=0.1, node_status_seconds=0.3)
LIFECYCLE = NodeLifecycleOptions(node_monitor_grace_seconds=0.5, monitor_period_seconds=0.1,
                                 pod_gc_orphan_seconds=0.3)


@asynccontextmanager
async def cluster(
    *names: str, options: NodeLifecycleOptions = LIFECYCLE
) -> AsyncIterator[tuple[APIServer, Fleet, NodeLifecycle, ClusterAccess]]:
    async with APIServer() as server:
        fleet = Fleet()
        kubelets = Kubelets(server, fleet, KUBELET)
        lifecycle = NodeLifecycle(server, fleet, options)
        kubelets.start()
        lifecycle.start()
        for n in names:
            fleet.add(Machine(n, provider_id=f"sim:///{n}"))
        access = ClusterAccess(server, "admin", component="test")
        await until_holds("nodes ready", lambda: all(ready(access, n) == "True" for n in names))
        try:
            yield server, fleet, lifecycle, access
        finally:
            await lifecycle.stop()
            await kubelets.stop()
            fleet.close()


def ready(access: ClusterAccess, node: str) -> str | None:
    n = access.get(NODES, "", node)
    for c in ((n or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return str(c["status"])
    return None


def taints(access: ClusterAccess, node: str) -> list[dict[str, Any]]:
    n = access.get(NODES, "", node) or {}
    return list((n.get("spec") or {}).get("taints") or [])


def taint_keys(access: ClusterAccess, node: str) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in taints(access, node)}


def pod(access: ClusterAccess, name: str) -> dict[str, Any] | None:
    return access.get(PODS, "default", name)


def phase(access: ClusterAccess, name: str) -> str | None:
    p = pod(access, name)
    return (p.get("status") or {}).get("phase") if p else None


async def run_pod(access: ClusterAccess, node: str, name: str, *, tolerations: list[dict[str, Any]] | None = None,
                  policy: str = "Always") -> None:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}], "restartPolicy": policy}
    if tolerations:
        spec["tolerations"] = tolerations
    await access.create(PODS, "default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                          "spec": spec})
    await access.bind("default", name, node)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


UNREACHABLE_1S = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 1}]


@pytest.mark.anyio
async def test_silent_node_goes_unknown_is_tainted_and_pods_go_after_their_toleration() -> None:
    async with cluster("n1", "n2") as (_, fleet, lc, access):
        await run_pod(access, "n1", "short", tolerations=UNREACHABLE_1S)
        await run_pod(access, "n1", "patient")
        await until_holds("short Running and patient Running",
                          lambda: phase(access, "short") == "Running" and phase(access, "patient") == "Running")
        assert taints(access, "n1") == []
        t0 = time.monotonic()
        fleet.power_off("n1")
        await until_holds("Ready Unknown", lambda: ready(access, "n1") == "Unknown")
        assert time.monotonic() - t0 >= 0.45
        node = access.get(NODES, "", "n1")
        assert node is not None
        for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
            c = condition(node, t)
            assert c is not None and c["status"] == "Unknown" and c["reason"] == "NodeStatusUnknown"
            assert c["message"] == "Kubelet stopped posting node status."
        await until_holds("unreachable taints", lambda: {("node.kubernetes.io/unreachable", "NoSchedule"),
                                ("node.kubernetes.io/unreachable", "NoExecute")} <= taint_keys(access, "n1"))
        noexec = next(t for t in taints(access, "n1") if t["effect"] == "NoExecute")
        assert datetime.strptime(noexec["timeAdded"], "%Y-%m-%dT%H:%M:%SZ")
        assert ("node.cloudprovider.kubernetes.io/shutdown", "NoSchedule") in taint_keys(access, "n1")
        assert ready(access, "n2") == "True" and taints(access, "n2") == []
        # The pods' Ready condition follows the node (MarkPodsNotReady).
        assert condition(pod(access, "patient"), "Ready")["status"] == "False"  # type: ignore[arg-type,index]
        t_taint = time.monotonic()
        await until_holds("short evicted",
                          lambda: (pod(access, "short") or {}).get("metadata", {}).get("deletionTimestamp"))
        assert time.monotonic() - t_taint >= 0.5  # tolerationSeconds 1, counted from timeAdded (second resolution)
        short = pod(access, "short")
        assert short is not None
        dt = condition(short, "DisruptionTarget")
        assert dt is not None and dt["status"] == "True" and dt["reason"] == "DeletionByTaintManager"
        await two_passes(lc)
        assert pod(access, "short") is not None  # Terminating on a dead node: nobody confirms the deletion
        assert not pod(access, "patient")["metadata"].get("deletionTimestamp")  # type: ignore[index]
        assert lc.evicted == 1 and lc.marked_unknown == 1

        # Back on: Ready, taints gone, the terminating pod is confirmed by the rebooted kubelet.
        fleet.power_on("n1")
        await until_holds("Ready again", lambda: ready(access, "n1") == "True")
        await until_holds("taints removed", lambda: taints(access, "n1") == [])
        await until_holds("terminating pod confirmed", lambda: pod(access, "short") is None)
        await until_holds("patient restarted after the reboot",
                          lambda: condition(pod(access, "patient"), "Ready")["status"] == "True")


@pytest.mark.anyio
async def test_node_reporting_not_ready_gets_not_ready_taints() -> None:
    async with APIServer() as server:
        opts = NodeLifecycleOptions(node_monitor_grace_seconds=30, monitor_period_seconds=0.1)
        lc = NodeLifecycle(server, None, opts)
        lc.start()
        access = ClusterAccess(server, "admin", component="test")
        cond = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "runtime down",
                "lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"}
        await access.create(NODES, "", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"},
                                         "status": {"conditions": [cond]}})
        try:
            await until_holds("the not-ready NoSchedule and NoExecute taints on x",
                              lambda: {("node.kubernetes.io/not-ready", "NoSchedule"),
                                       ("node.kubernetes.io/not-ready", "NoExecute")} == taint_keys(access, "x"))
            await access.patch(NODES, "", "x", {"status": {"conditions": [dict(cond, status="True",
                                                                               reason="KubeletReady")]}},
                               subresource="status")
            await until_holds("taints removed", lambda: taints(access, "x") == [])
        finally:
            await lc.stop()


@pytest.mark.anyio
async def test_removed_machine_loses_its_node_and_orphans_are_force_deleted() -> None:
    async with cluster("n1", "n2") as (server, fleet, lc, access):
        gone: dict[str, dict[str, Any]] = {}

        def record(ev: WatchEvent) -> None:
            if ev.gr == PODS and ev.type == "DELETED":
                gone[ev.key[1]] = ev.new.obj

        server.store.add_listener(record)
        await run_pod(access, "n1", "orphan")
        await until_holds("orphan Running", lambda: phase(access, "orphan") == "Running")
        fleet.remove("n1")
        await until_holds("node deleted", lambda: access.get(NODES, "", "n1") is None)
        assert ready(access, "n2") == "True"
        await until_holds("orphan force-deleted", lambda: "orphan" in gone)
        last = gone["orphan"]
        assert last["status"]["phase"] == "Failed"
        dt = condition(last, "DisruptionTarget")
        assert dt is not None and dt["reason"] == "DeletionByPodGC"
        assert lc.nodes_deleted == 1 and lc.orphans_deleted == 1
        await until_holds("lease collected", lambda: access.get(LEASES, NODE_LEASE_NAMESPACE, "n1") is None)


@pytest.mark.anyio
async def test_out_of_service_taint_force_deletes_terminating_pods() -> None:
    async with cluster("n1", "n2") as (_, fleet, lc, access):
        await run_pod(access, "n1", "stuck")
        await until_holds("stuck Running", lambda: phase(access, "stuck") == "Running")
        fleet.power_off("n1")
        await until_holds("n1 Ready=Unknown", lambda: ready(access, "n1") == "Unknown")
        await access.delete(PODS, "default", "stuck")
        await two_passes(lc)
        assert pod(access, "stuck") is not None
        node = access.get(NODES, "", "n1")
        assert node is not None
        oos = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
        await access.patch(NODES, "", "n1", {"spec": {"taints": [*node["spec"]["taints"], oos]}})
        await until_holds("force-deleted", lambda: pod(access, "stuck") is None)


@pytest.mark.anyio
async def test_when_every_node_is_down_nothing_is_evicted() -> None:
    async with cluster("only") as (_, fleet, lc, access):
        await run_pod(access, "only", "p", tolerations=UNREACHABLE_1S)
        await until_holds("p Running", lambda: phase(access, "p") == "Running")
        fleet.power_off("only")
        await until_holds("the unreachable NoSchedule taint on only",
                          lambda: ("node.kubernetes.io/unreachable", "NoSchedule") in taint_keys(access, "only"))
        await asyncio.sleep(1.5)  # time passing is under test: past the pod's 1 s toleration
        await two_passes(lc)
        assert ("node.kubernetes.io/unreachable", "NoExecute") not in taint_keys(access, "only")
        assert not pod(access, "p")["metadata"].get("deletionTimestamp")  # type: ignore[index]
        assert lc.evicted == 0


@pytest.mark.anyio
async def test_noexecute_tainting_is_rate_limited_per_zone() -> None:
    opts = NodeLifecycleOptions(node_monitor_grace_seconds=0.3, monitor_period_seconds=0.05, eviction_rate=2.0)
    async with cluster("a", "b", "c", "d", options=opts) as (_, fleet, _, access):
        fleet.power_off("a")
        fleet.power_off("b")

        def tainted() -> set[str]:
            return {n for n in ("a", "b") if ("node.kubernetes.io/unreachable", "NoExecute") in taint_keys(access, n)}

        await until_holds("first node tainted", lambda: len(tainted()) == 1)
        t0 = time.monotonic()
        await until_holds("second node tainted", lambda: len(tainted()) == 2)
        assert time.monotonic() - t0 >= 0.35  # one token every 0.5 s


@pytest.mark.anyio
async def test_pod_not_tolerating_a_noexecute_taint_is_evicted_at_once() -> None:
    async with cluster("n1") as (_, _, lc, access):
        maint = [{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"}]
        await run_pod(access, "n1", "plain")
        await run_pod(access, "n1", "tolerant", tolerations=maint)
        await until_holds("plain Running and tolerant Running",
                          lambda: phase(access, "plain") == "Running" and phase(access, "tolerant") == "Running")
        await access.patch(NODES, "", "n1", {"spec": {"taints": [{"key": "example.com/maintenance",
                                                                   "effect": "NoExecute"}]}})
        await until_holds("evicted and confirmed by the kubelet", lambda: pod(access, "plain") is None)
        await two_passes(lc)
        assert phase(access, "tolerant") == "Running"


def test_toleration_matching() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates({"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute"}, taint)
    assert tolerates({"key": "k", "value": "v"}, taint)  # operator defaults to Equal, empty effect matches all
    assert tolerates({"operator": "Exists"}, taint)  # empty key with Exists tolerates everything
    assert not tolerates({"key": "k", "value": "w"}, taint)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "other", "operator": "Exists"}, taint)
