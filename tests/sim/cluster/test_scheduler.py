"""The emulated kube-scheduler against the in-process emulator: fit, filters, order, messages, scoring."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from waiting import two_passes, until_holds

from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.errors import conflict
from gpuops_sim.cluster.access import EVENTS, NODES, PODS, ClusterAccess
from gpuops_sim.cluster.scheduler import Scheduler, SchedulerOptions

GPU = "nvidia.com/gpu"
TAINTED = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ------------------------------------------------------------------------------------------ helpers


def node(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    ready: str = "True",
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": str(pods), **({GPU: str(gpus)} if gpus else {}), **(extra or {})}
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"capacity": dict(alloc), "allocatable": alloc, "conditions": [{"type": "Ready", "status": ready}]},
    }


def pod(
    name: str,
    *,
    gpus: int = 0,
    cpu: str = "100m",
    limits: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    requests = {"cpu": cpu, **({GPU: str(gpus)} if gpus else {})}
    container: dict[str, Any] = {"name": "main", "image": "trainer", "resources": {"requests": requests}}
    if gpus:
        container["resources"]["limits"] = {GPU: str(gpus)}
    if limits:
        container["resources"].setdefault("limits", {}).update(limits)
    body: dict[str, Any] = {"containers": [container], **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


class Cluster:
    def __init__(self, server: APIServer) -> None:
        self.server = server
        self.admin = ClusterAccess(server, "admin", component="test")

    async def add_node(self, obj: dict[str, Any]) -> None:
        await self.admin.create(NODES, "", obj)

    async def add_pod(self, obj: dict[str, Any]) -> None:
        await self.admin.create(PODS, "default", obj)

    def pod(self, name: str) -> dict[str, Any]:
        got = self.admin.get(PODS, "default", name)
        assert got is not None
        return got

    def node_of(self, name: str) -> str | None:
        got = self.admin.get(PODS, "default", name)
        return None if got is None else got["spec"].get("nodeName")

    def scheduled(self, name: str) -> dict[str, Any] | None:
        conds = (self.pod(name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PodScheduled"), None)

    def unschedulable_message(self, name: str) -> str | None:
        c = self.scheduled(name)
        return c["message"] if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.admin.iter(EVENTS, "default")
                if e["involvedObject"]["name"] == name and e["reason"] == reason]


@asynccontextmanager
async def cluster(**options: Any) -> AsyncIterator[tuple[Cluster, Scheduler]]:
    async with APIServer() as server:
        c = Cluster(server)
        sched = Scheduler(server, SchedulerOptions(**options))
        sched.start()
        try:
            yield c, sched
        finally:
            await sched.stop()
        assert sched.errors == 0


# ------------------------------------------------------------------------------------------ binding


@pytest.mark.anyio
async def test_binds_a_pod_to_a_fitting_node_with_condition_and_event() -> None:
    async with cluster() as (c, sched):
        await c.add_node(node("small", gpus=0, cpu="1"))
        await c.add_node(node("big", gpus=0, cpu="8"))
        await c.add_pod(pod("web", cpu="2"))
        await until_holds("web bound", lambda: c.node_of("web") is not None)
        assert c.node_of("web") == "big"
        assert c.scheduled("web")["status"] == "True"  # type: ignore[index]
        assert sched.bound == 1 and sched.unschedulable == 0
        [ev] = c.events("web", "Scheduled")
        assert ev["type"] == "Normal" and ev["message"] == "Successfully assigned default/web to big"
        assert ev["source"]["component"] == "default-scheduler"


@pytest.mark.anyio
async def test_gpu_fit_counts_init_containers_sidecars_and_extended_resources() -> None:
    async with cluster() as (c, _):
        await c.add_node(node("g2", gpus=2))
        await c.add_node(node("g8", gpus=8))
        await c.add_node(node("mig", gpus=0, extra={"nvidia.com/mig-1g.10gb": "7"}))
        # The init container needs 4 GPUs before the 1-GPU main container: the pod needs 4.
        init = [{"name": "warmup", "image": "x", "resources": {"limits": {GPU: "4"}}}]
        await c.add_pod(pod("init4", gpus=1, init=init))
        # A sidecar holds its GPU for the pod's life: 2 + 1 = 3 GPUs.
        sidecar = [{"name": "side", "image": "x", "restartPolicy": "Always", "resources": {"limits": {GPU: "1"}}}]
        await c.add_pod(pod("side3", gpus=2, init=sidecar))
        await c.add_pod(pod("slice", limits={"nvidia.com/mig-1g.10gb": "2"}))
        await c.add_pod(pod("custom", limits={"gpuops.io/mig-3g.40gb": "1"}))
        await until_holds("init4, side3 and slice bound",
                          lambda: all(c.node_of(p) for p in ("init4", "side3", "slice")))
        assert c.node_of("init4") == "g8"
        assert c.node_of("side3") == "g8"  # 3 > 2 GPUs on g2
        assert c.node_of("slice") == "mig"
        await until_holds("custom reported unschedulable", lambda: c.unschedulable_message("custom") is not None)
        # A resource no node advertises counts as 0 everywhere: unresolvable.
        assert c.unschedulable_message("custom") == (
            "0/3 nodes are available: 3 Insufficient gpuops.io/mig-3g.40gb. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
        # g8 now holds 4 + 3 GPUs: one left, so a 2-GPU pod fits nowhere, a 1-GPU pod fits g2 or g8.
        await c.add_pod(pod("two", gpus=2))
        await until_holds("two bound", lambda: c.node_of("two") is not None)
        assert c.node_of("two") == "g2"


@pytest.mark.anyio
async def test_node_selector_affinity_taints_tolerations_and_cordon() -> None:
    async with cluster() as (c, _):
        await c.add_node(node("a100", labels={"gpuops.io/gpu-model": "a100", "zone": "z1", "rank": "5"}))
        await c.add_node(node("h100", labels={"gpuops.io/gpu-model": "h100", "zone": "z2", "rank": "9"}))
        await c.add_node(node("tainted", labels={"gpuops.io/gpu-model": "h100"}, taints=TAINTED))
        await c.add_node(node("cordoned", labels={"gpuops.io/gpu-model": "h100"}, unschedulable=True))
        await c.add_pod(pod("sel", nodeSelector={"gpuops.io/gpu-model": "a100"}))
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]},
                                  {"key": "rank", "operator": "Gt", "values": ["7"]}]},
        ]}}}
        await c.add_pod(pod("aff", affinity=affinity))
        tolerate = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
        await c.add_pod(pod("tol", tolerations=tolerate, nodeSelector={"kubernetes.io/hostname": "tainted"}))
        by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h100"]}]},
        ]}}}
        await c.add_pod(pod("pinned", affinity=by_name))
        await c.add_pod(pod("nowhere", nodeSelector={"gpuops.io/gpu-model": "b200"}))
        await c.add_pod(pod("to-cordoned", nodeSelector={"kubernetes.io/hostname": "cordoned"}))
        await until_holds("sel, aff, tol and pinned bound",
                          lambda: all(c.node_of(p) for p in ("sel", "aff", "tol", "pinned")))
        assert (c.node_of("sel"), c.node_of("aff"), c.node_of("tol"), c.node_of("pinned")) == (
            "a100", "h100", "tainted", "h100")
        await until_holds("nowhere and to-cordoned reported unschedulable",
                          lambda: c.unschedulable_message("nowhere") is not None
                          and c.unschedulable_message("to-cordoned") is not None)
        # Filters run in kube-scheduler's order (NodeUnschedulable, TaintToleration, NodeAffinity) and only
        # the first failure of each node counts.
        assert c.unschedulable_message("nowhere") == (
            "0/4 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector. "
            "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
        )
        assert c.unschedulable_message("to-cordoned") == (
            "0/4 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector. "
            "preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
        )
        # Uncordoning is a node update: the pod is retried at once.
        await c.admin.patch(NODES, "", "cordoned", {"spec": {"unschedulable": None}})
        await until_holds("to-cordoned bound to cordoned", lambda: c.node_of("to-cordoned") == "cordoned")


@pytest.mark.anyio
async def test_an_update_of_the_pod_itself_retries_it() -> None:
    async with cluster() as (c, sched):
        await c.add_node(node("gpu", taints=TAINTED))
        await c.add_pod(pod("p", gpus=1))
        await until_holds("p reported unschedulable", lambda: c.unschedulable_message("p") is not None)
        assert sched.unschedulable == 1
        tolerations = [*c.pod("p")["spec"]["tolerations"], {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
        await c.admin.patch(PODS, "default", "p", {"spec": {"tolerations": tolerations}})
        await until_holds("p bound to gpu", lambda: c.node_of("p") == "gpu")
        assert sched.unschedulable == 0


@pytest.mark.anyio
async def test_not_ready_nodes_are_skipped_until_ready() -> None:
    async with cluster() as (c, _):
        await c.add_node(node("n1", ready="False"))
        await c.add_node(node("n2", ready="Unknown"))
        await c.add_pod(pod("p", gpus=1))
        await until_holds("p reported unschedulable", lambda: c.unschedulable_message("p") is not None)
        assert c.unschedulable_message("p") == (
            "0/2 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, "
            "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }. "
            "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        )
        await c.admin.patch(NODES, "", "n2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                            subresource="status")
        await until_holds("p bound to n2", lambda: c.node_of("p") == "n2")


@pytest.mark.anyio
async def test_priority_then_age_decides_who_gets_the_last_gpu() -> None:
    async with APIServer() as server:
        c = Cluster(server)
        await c.add_node(node("one", gpus=1))
        await c.add_pod(pod("low", gpus=1, priority=10))
        await c.add_pod(pod("high", gpus=1, priority=1000))
        await c.add_pod(pod("mid", gpus=1, priority=100))
        sched = Scheduler(server, SchedulerOptions(events=False))
        sched.start()
        try:
            await until_holds("1 pods bound and 2 unschedulable", lambda: sched.bound == 1 and sched.unschedulable == 2)
            assert c.node_of("high") == "one"
            assert c.node_of("low") is None and c.node_of("mid") is None
            # Freeing the GPU (the pod finished) releases the next pod in priority order.
            await c.admin.patch(PODS, "default", "high", {"status": {"phase": "Succeeded"}}, subresource="status")
            await until_holds("mid bound to one", lambda: c.node_of("mid") == "one")
            assert c.node_of("low") is None
            assert not c.events("mid", "Scheduled")  # events=False
        finally:
            await sched.stop()


# ------------------------------------------------------------------------------------------ unschedulable


@pytest.mark.anyio
async def test_unschedulable_condition_has_kube_scheduler_message_and_is_written_once() -> None:
    async with cluster(unschedulable_retry_seconds=0.05) as (c, sched):
        for i in range(3):
            await c.add_node(node(f"busy-{i}", gpus=8))
        for i in range(2):
            await c.add_node(node(f"tainted-{i}", gpus=8, taints=TAINTED))
        for i in range(3):
            await c.add_pod(pod(f"fill-{i}", gpus=8, nodeSelector={"kubernetes.io/hostname": f"busy-{i}"}))
        await until_holds("3 pods bound", lambda: sched.bound == 3)
        await c.add_pod(pod("waiting", gpus=1))
        await until_holds("waiting reported unschedulable", lambda: c.unschedulable_message("waiting") is not None)
        assert c.unschedulable_message("waiting") == (
            "0/5 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "3 Insufficient nvidia.com/gpu. preemption: 0/5 nodes are available: "
            "2 Preemption is not helpful for scheduling, 3 No preemption victims found for incoming pod."
        )
        rv = c.pod("waiting")["metadata"]["resourceVersion"]
        retries = sched.steps
        await until_holds("five more scheduler passes",
                          lambda: sched.steps > retries + 5)  # several periodic retries later...
        assert c.pod("waiting")["metadata"]["resourceVersion"] == rv  # ...no rewrite
        [ev] = c.events("waiting", "FailedScheduling")
        assert ev["type"] == "Warning" and ev["message"] == c.unschedulable_message("waiting")
        assert sched.unschedulable == 1
        # A new node changes the message only if it still does not fit: here it fits.
        await c.add_node(node("fresh", gpus=1))
        await until_holds("waiting bound to fresh", lambda: c.node_of("waiting") == "fresh")
        assert c.scheduled("waiting")["status"] == "True"  # type: ignore[index]
        assert sched.unschedulable == 0


@pytest.mark.anyio
async def test_a_message_is_rewritten_when_its_reasons_change_not_only_its_counts() -> None:
    async with cluster(unschedulable_retry_seconds=0.05) as (c, sched):
        await c.add_node(node("cpu-0", gpus=0))
        await c.add_pod(pod("p", gpus=1))
        await until_holds("p reported unschedulable", lambda: c.unschedulable_message("p") is not None)
        first = c.unschedulable_message("p")
        assert first == (
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. "
            "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
        )
        await c.add_node(node("cpu-1", gpus=0))  # same reasons, other counts: not worth a write
        steps = sched.steps
        await until_holds("five more scheduler passes", lambda: sched.steps > steps + 5)
        assert c.unschedulable_message("p") == first
        assert len(c.events("p", "FailedScheduling")) == 1
        await c.add_node(node("gpu", gpus=1, taints=TAINTED))  # a new reason: rewritten, with fresh counts
        await until_holds("a new unschedulable message for p", lambda: c.unschedulable_message("p") != first)
        assert c.unschedulable_message("p") == (
            "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "2 Insufficient nvidia.com/gpu. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
        assert len(c.events("p", "FailedScheduling")) == 2


@pytest.mark.anyio
async def test_message_counts_every_failing_resource_and_pod_slots() -> None:
    async with cluster() as (c, _):
        await c.add_node(node("tiny", gpus=0, cpu="1", pods=1))
        await c.add_node(node("full", gpus=2, cpu="1", pods=1))
        await c.add_pod(pod("resident", nodeSelector={"kubernetes.io/hostname": "full"}))
        await until_holds("resident bound to full", lambda: c.node_of("resident") == "full")
        await c.add_pod(pod("p", gpus=4, cpu="2", preemptionPolicy="Never"))
        await until_holds("p reported unschedulable", lambda: c.unschedulable_message("p") is not None)
        assert c.unschedulable_message("p") == (
            "0/2 nodes are available: 1 Too many pods, 2 Insufficient cpu, 2 Insufficient nvidia.com/gpu. "
            "preemption: not eligible due to preemptionPolicy=Never."
        )


@pytest.mark.anyio
async def test_pending_pod_binds_when_a_node_is_added_and_when_capacity_is_freed() -> None:
    async with cluster() as (c, sched):
        await c.add_pod(pod("early", gpus=4))
        await until_holds("early reported unschedulable", lambda: c.unschedulable_message("early") is not None)
        assert c.unschedulable_message("early") == "no nodes available to schedule pods"
        await c.add_node(node("n1", gpus=4))
        await until_holds("early bound to n1", lambda: c.node_of("early") == "n1")
        await c.add_pod(pod("late", gpus=4))
        await until_holds("late reported unschedulable", lambda: c.unschedulable_message("late") is not None)
        # A pod being deleted still holds its GPUs until it is gone.
        await c.admin.delete(PODS, "default", "early", grace_seconds=30)
        assert c.pod("early")["metadata"].get("deletionTimestamp")
        await two_passes(sched)
        assert c.node_of("late") is None
        await c.admin.delete(PODS, "default", "early", grace_seconds=0)
        await until_holds("late bound to n1", lambda: c.node_of("late") == "n1")
        assert sched.bound == 2 and sched.unschedulable == 0


@pytest.mark.anyio
async def test_equal_pods_are_released_one_binding_at_a_time() -> None:
    async with cluster(events=False) as (c, sched):
        await c.add_node(node("n", gpus=2))
        for i in range(50):
            await c.add_pod(pod(f"p{i:02d}", gpus=1))
        await until_holds("2 pods bound and 48 unschedulable", lambda: sched.bound == 2 and sched.unschedulable == 48)
        assert [c.node_of(f"p{i:02d}") for i in range(3)] == ["n", "n", None]
        for i in range(2):
            await c.admin.delete(PODS, "default", f"p{i:02d}", grace_seconds=0)
        await until_holds("4 pods bound", lambda: sched.bound == 4)
        assert c.node_of("p02") == "n" and c.node_of("p03") == "n" and c.node_of("p04") is None
        assert sched.unschedulable == 46


@pytest.mark.anyio
async def test_a_conflict_on_bind_is_skipped_and_the_pod_reevaluated() -> None:
    async with cluster(events=False) as (c, sched):
        await c.add_node(node("n"))
        real_bind = sched.access.bind
        conflicts = 0

        async def flaky_bind(namespace: str, name: str, node: str) -> None:
            nonlocal conflicts
            if conflicts == 0:
                conflicts += 1
                raise conflict("pods", "", name, "the object has been modified")
            await real_bind(namespace, name, node)

        sched.access.bind = flaky_bind  # type: ignore[method-assign]
        await c.add_pod(pod("p"))
        await until_holds("p bound to n", lambda: c.node_of("p") == "n")
        assert conflicts == 1 and sched.bound == 1 and sched.errors == 0


# ------------------------------------------------------------------------------------------ who is ours


@pytest.mark.anyio
async def test_scheduling_gates_and_other_schedulers_are_respected() -> None:
    async with cluster() as (c, sched):
        await c.add_node(node("n"))
        await c.add_pod(pod("gated", schedulingGates=[{"name": "gpuops.io/mig-slicer"}]))
        await c.add_pod(pod("foreign", schedulerName="volcano"))
        await c.add_pod(pod("ours"))
        await until_holds("ours bound to n", lambda: c.node_of("ours") == "n")
        await two_passes(sched)
        assert c.node_of("gated") is None and c.node_of("foreign") is None
        assert c.scheduled("gated") is None and c.scheduled("foreign") is None
        assert sched.unschedulable == 0
        await c.admin.patch(PODS, "default", "gated", {"spec": {"schedulingGates": None}})
        await until_holds("gated bound to n", lambda: c.node_of("gated") == "n")
        assert c.node_of("foreign") is None


@pytest.mark.anyio
async def test_a_named_scheduler_takes_only_its_pods() -> None:
    async with cluster(scheduler_name="gpu-scheduler") as (c, sched):
        await c.add_node(node("n"))
        await c.add_pod(pod("mine", schedulerName="gpu-scheduler"))
        await c.add_pod(pod("default"))
        await until_holds("mine bound to n", lambda: c.node_of("mine") == "n")
        await two_passes(sched)
        assert c.node_of("default") is None
        [ev] = c.events("mine", "Scheduled")
        assert ev["source"]["component"] == "gpu-scheduler"


# ------------------------------------------------------------------------------------------ scoring


async def _place_four(scoring: str) -> list[str | None]:
    async with cluster(scoring=scoring, events=False) as (c, sched):
        for name in ("n1", "n2", "n3", "n4"):
            await c.add_node(node(name, gpus=8))
        for i in range(4):
            await c.add_pod(pod(f"p{i}", gpus=2))
        await until_holds("4 pods bound", lambda: sched.bound == 4)
        return [c.node_of(f"p{i}") for i in range(4)]


@pytest.mark.anyio
async def test_most_allocated_packs_and_least_allocated_spreads() -> None:
    assert await _place_four("MostAllocated") == ["n1", "n1", "n1", "n1"]
    assert await _place_four("LeastAllocated") == ["n1", "n2", "n3", "n4"]


@pytest.mark.anyio
async def test_most_allocated_prefers_the_tightest_fit() -> None:
    async with cluster(scoring="MostAllocated", events=False) as (c, _):
        await c.add_node(node("roomy", gpus=8))
        await c.add_node(node("snug", gpus=4))
        await c.add_pod(pod("half", gpus=3, nodeSelector={"kubernetes.io/hostname": "snug"}))
        await until_holds("half bound to snug", lambda: c.node_of("half") == "snug")
        await c.add_pod(pod("one", gpus=1))
        await until_holds("one bound", lambda: c.node_of("one") is not None)
        assert c.node_of("one") == "snug"  # 4/4 used beats 1/8


def test_unknown_scoring_is_refused() -> None:
    with pytest.raises(ValueError, match="scoring"):
        Scheduler(None, SchedulerOptions(scoring="Random"))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ throughput


@pytest.mark.anyio
async def test_throughput_with_many_nodes_and_pods() -> None:
    nodes, pods = 500, 6000
    async with APIServer() as server:
        c = Cluster(server)
        for i in range(nodes):
            await c.add_node(node(f"n{i:04d}", gpus=8, labels={"pool": f"p{i % 4}"}))
        for i in range(pods):
            await c.add_pod(pod(f"p{i:05d}", gpus=1 if i % 2 else 0, cpu="500m"))
        sched = Scheduler(server, SchedulerOptions(events=False))
        t0 = time.perf_counter()
        sched.start()
        try:
            await until_holds("pods pods bound", lambda: sched.bound == pods, 60)
        finally:
            await sched.stop()
        rate = pods / (time.perf_counter() - t0)
        assert rate > 500, f"{rate:.0f} bindings/s"
