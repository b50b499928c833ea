"""The emulated kubelets: node registration, leases, the pod lifecycle with its timestamps, restarts,
graceful deletion, admission, and what a power-off or reboot does to all of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pytest
from waiting import NotYet, two_passes, until_holds

from gpuops_sim.apiserver import APIServer
from gpuops_sim.cluster.access import EVENTS, LEASES, NODE_LEASE_NAMESPACE, NODES, PODS, ClusterAccess
from gpuops_sim.cluster.kubelet import KubeletOptions, Kubelets
from gpuops_sim.cluster.machines import Fleet, Machine


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


FAST = KubeletOptions(start_latency_seconds=0.05, lease_seconds=0.1, node_status_seconds=0.3,
                      restart_backoff_seconds=0.3, restart_backoff_max_seconds=1.0)


@asynccontextmanager
async def cluster(
    *machines: Machine, options: KubeletOptions = FAST
) -> AsyncIterator[tuple[APIServer, Fleet, Kubelets, ClusterAccess]]:
    async with APIServer() as server:
        fleet = Fleet()
        kubelets = Kubelets(server, fleet, options)
        kubelets.start()
        for m in machines:
            fleet.add(m)
        access = ClusterAccess(server, "admin", component="test")
        try:
            yield server, fleet, kubelets, access
        finally:
            await kubelets.stop()
            fleet.close()


def pod_obj(name: str, *, runtime: float | None = None, exit_code: int | None = None, policy: str = "Never",
            gpus: int = 0, termination: float | None = None, grace: int | None = None,
            init: bool = False) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if runtime is not None:
        ann["sim.gpuops.io/runtime-seconds"] = str(runtime)
    if exit_code is not None:
        ann["sim.gpuops.io/exit-code"] = str(exit_code)
    if termination is not None:
        ann["sim.gpuops.io/termination-seconds"] = str(termination)
    c: dict[str, Any] = {"name": "main", "image": "busybox:1.36", "resources": {"requests": {"cpu": "100m"}}}
    if gpus:
        c["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {"containers": [c], "restartPolicy": policy}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if init:
        spec["initContainers"] = [{"name": "setup", "image": "busybox:1.36"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann}, "spec": spec}


async def run_pod(access: ClusterAccess, node: str, name: str, **kw: Any) -> None:
    await access.create(PODS, "default", pod_obj(name, **kw))
    await access.bind("default", name, node)


def pod(access: ClusterAccess, name: str) -> dict[str, Any] | None:
    return access.get(PODS, "default", name)


def phase(access: ClusterAccess, name: str) -> str | None:
    p = pod(access, name)
    return (p.get("status") or {}).get("phase") if p else None


def ts(s: str) -> datetime:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def node_ready(access: ClusterAccess, name: str) -> bool:
    n = access.get(NODES, "", name)
    return bool(n) and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])


# ---------------------------------------------------------------------------------------------------- pods


@pytest.mark.anyio
async def test_pod_runs_for_its_runtime_and_succeeds_with_consistent_status() -> None:
    async with cluster(Machine("n1")) as (_, _, k, access):
        await until_holds("node registered", lambda: node_ready(access, "n1"))
        # Long enough that Running is observable even when a loaded CI machine delays the kubelet's loop (a
        # late loop honours the runtime from the intended start, so a short pod may finish in the same step).
        await run_pod(access, "n1", "job", runtime=1.5, init=True)
        running = await until_holds("Running", lambda: phase(access, "job") == "Running" and pod(access, "job"))
        st = running["status"]
        main = st["containerStatuses"][0]
        assert main["ready"] and main["started"] and main["restartCount"] == 0
        assert main["image"] == "docker.io/library/busybox:1.36"
        assert main["imageID"].startswith("docker.io/library/busybox@sha256:")
        assert main["containerID"].startswith("containerd://")
        assert st["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
        assert st["hostIP"].startswith("172.16.") and st["podIP"].startswith("10.244.")
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
            assert cond(running, t)["status"] == "True"
        await until_holds("Succeeded", lambda: phase(access, "job") == "Succeeded")
        done = pod(access, "job")
        assert done is not None
        term = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed"
        assert ts(done["status"]["startTime"]) <= ts(term["startedAt"]) <= ts(term["finishedAt"])
        assert term["startedAt"] == main["state"]["running"]["startedAt"]
        assert cond(done, "Ready")["status"] == "False" and cond(done, "Ready")["reason"] == "PodCompleted"
        assert k.transitions == 2 and k.started == 1 and k.finished == 1
        reasons = {e["reason"] for e in access.iter(EVENTS, "default")
                   if e["involvedObject"]["name"] == "job"}
        assert {"Pulled", "Created", "Started"} <= reasons


@pytest.mark.anyio
async def test_a_two_second_runtime_takes_two_seconds() -> None:
    async with cluster(Machine("n1")) as (_, _, _, access):
        await until_holds("n1 Ready", lambda: node_ready(access, "n1"))
        await run_pod(access, "n1", "job", runtime=2)
        await until_holds("job Running", lambda: phase(access, "job") == "Running")
        t0 = time.monotonic()
        await until_holds("job Succeeded", lambda: phase(access, "job") == "Succeeded", 5)
        elapsed = time.monotonic() - t0
        assert 1.8 <= elapsed <= 2.6, elapsed
        term = pod(access, "job")["status"]["containerStatuses"][0]["state"]["terminated"]  # type: ignore[index]
        assert (ts(term["finishedAt"]) - ts(term["startedAt"])).total_seconds() == 2


@pytest.mark.anyio
async def test_exit_code_fails_the_pod() -> None:
    async with cluster(Machine("n1")) as (_, _, _, access):
        await run_pod(access, "n1", "bad", runtime=0.1, exit_code=3)
        await until_holds("Failed", lambda: phase(access, "bad") == "Failed")
        p = pod(access, "bad")
        assert p is not None
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 3 and term["reason"] == "Error"
        assert cond(p, "Ready")["reason"] == "PodFailed"


@pytest.mark.anyio
async def test_pod_without_runtime_runs_until_deleted() -> None:
    async with cluster(Machine("n1")) as (_, _, k, access):
        await run_pod(access, "n1", "server")
        await until_holds("server Running", lambda: phase(access, "server") == "Running")
        await asyncio.sleep(0.6)  # time passing is under test: a pod without a runtime never ends by itself
        await two_passes(k)
        assert phase(access, "server") == "Running"


@pytest.mark.anyio
async def test_on_failure_restarts_the_container_then_backs_off() -> None:
    async with cluster(Machine("n1")) as (_, _, k, access):
        await run_pod(access, "n1", "flaky", runtime=0.1, exit_code=1, policy="OnFailure")

        def restarted() -> dict[str, Any] | None:
            p = pod(access, "flaky")
            cs = ((p or {}).get("status") or {}).get("containerStatuses") or []
            return cs[0] if cs and cs[0]["restartCount"] >= 1 and "running" in cs[0]["state"] else None

        cs = await until_holds("first restart", restarted)
        assert cs["lastState"]["terminated"]["exitCode"] == 1
        assert phase(access, "flaky") == "Running"

        def backing_off() -> bool:
            p = pod(access, "flaky")
            c = p["status"]["containerStatuses"][0] if p else {}
            return c.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"

        await until_holds("CrashLoopBackOff", backing_off)
        p = pod(access, "flaky")
        assert p is not None and cond(p, "Ready")["status"] == "False" and p["status"]["phase"] == "Running"
        await until_holds("restart after back-off", lambda: (restarted() or {}).get("restartCount", 0) >= 2)
        assert k.transitions == 1 and k.restarts >= 2


@pytest.mark.anyio
async def test_on_failure_with_exit_zero_succeeds() -> None:
    async with cluster(Machine("n1")) as (_, _, _, access):
        await run_pod(access, "n1", "ok", runtime=0.1, policy="OnFailure")
        await until_holds("ok Succeeded", lambda: phase(access, "ok") == "Succeeded")


@pytest.mark.anyio
async def test_graceful_deletion_terminates_then_removes_the_pod() -> None:
    async with cluster(Machine("n1")) as (_, _, k, access):
        await run_pod(access, "n1", "web", termination=0.3, grace=30)
        await until_holds("web Running", lambda: phase(access, "web") == "Running")
        t0 = time.monotonic()
        await access.delete(PODS, "default", "web")
        assert pod(access, "web")["metadata"]["deletionTimestamp"]  # type: ignore[index]
        await two_passes(k)  # the kubelet has seen the deletion
        assert pod(access, "web") is not None  # still shutting down
        await until_holds("web deleted", lambda: pod(access, "web") is None)
        assert time.monotonic() - t0 >= 0.25
        assert k.deleted == 1
        reasons = {e["reason"] for e in access.iter(EVENTS, "default") if e["involvedObject"]["name"] == "web"}
        assert "Killing" in reasons


@pytest.mark.anyio
async def test_termination_exit_codes_sigterm_within_grace_sigkill_after() -> None:
    # A finalizer keeps the pod after the kubelet's grace-0 delete, so its final status can be read.
    async with cluster(Machine("n1")) as (_, _, _, access):
        for name, took in (("polite", 0.1), ("stubborn", 60.0)):
            body = pod_obj(name, termination=took, grace=1)
            body["metadata"]["finalizers"] = ["example.com/keep"]
            await access.create(PODS, "default", body)
            await access.bind("default", name, "n1")
        await until_holds("polite Running and stubborn Running",
                          lambda: phase(access, "polite") == "Running" and phase(access, "stubborn") == "Running")
        t0 = time.monotonic()
        await access.delete(PODS, "default", "polite")
        await access.delete(PODS, "default", "stubborn")

        def exit_code(name: str) -> int | None:
            p = pod(access, name)
            if not p or p["status"]["phase"] != "Failed" or p["metadata"].get("deletionGracePeriodSeconds") != 0:
                return None
            return int(p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])

        assert await until_holds("SIGTERM exit", lambda: exit_code("polite")) == 143
        assert await until_holds("SIGKILL at the grace period", lambda: exit_code("stubborn")) == 137
        assert time.monotonic() - t0 >= 0.9
        term = pod(access, "stubborn")["status"]["containerStatuses"][0]["state"]["terminated"]  # type: ignore[index]
        assert ts(term["startedAt"]) <= ts(term["finishedAt"])
        for name in ("polite", "stubborn"):
            await access.patch(PODS, "default", name, {"metadata": {"finalizers": None}})
            assert pod(access, name) is None


@pytest.mark.anyio
async def test_deleting_a_pod_that_has_not_started_removes_it_at_once() -> None:
    slow = KubeletOptions(start_latency_seconds=30, lease_seconds=1, node_status_seconds=5)
    async with cluster(Machine("n1"), options=slow) as (_, _, _, access):
        await until_holds("n1 Ready", lambda: node_ready(access, "n1"))
        await run_pod(access, "n1", "p")
        await access.delete(PODS, "default", "p")
        await until_holds("pod gone", lambda: pod(access, "p") is None)


# ---------------------------------------------------------------------------------------------------- nodes


@pytest.mark.anyio
async def test_gpu_node_registers_and_gets_gpus_after_the_device_plugin_delay() -> None:
    m = Machine("gpu-1", gpu_model="A100-40GB", gpus=8, labels={"team": "ml"},
                taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}], provider_id="sim:///gpu-1",
                device_plugin_seconds=0.6)
    async with cluster(m) as (_, _, _, access):
        node = await until_holds("node", lambda: access.get(NODES, "", "gpu-1"))
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
        assert labels["nvidia.com/gpu.count"] == "8" and labels["team"] == "ml"
        assert labels["kubernetes.io/hostname"] == "gpu-1" and labels["kubernetes.io/os"] == "linux"
        assert labels["kubernetes.io/arch"] == "amd64" and "node.kubernetes.io/instance-type" in labels
        assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
        assert node["spec"]["providerID"] == "sim:///gpu-1" and node["spec"]["podCIDR"].endswith("/24")
        st = node["status"]
        assert st["allocatable"]["cpu"] == "64" and st["allocatable"]["pods"] == "110"
        assert "nvidia.com/gpu" not in st["allocatable"]
        assert cond(node, "Ready")["reason"] == "KubeletReady"
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure"):
            assert cond(node, t)["status"] == "False"
        assert st["nodeInfo"]["kubeletVersion"].startswith("v1.") and st["nodeInfo"]["bootID"]
        assert {a["type"] for a in st["addresses"]} == {"InternalIP", "Hostname"}
        # A GPU pod bound before the device plugin registered is rejected, as a real kubelet does.
        await run_pod(access, "gpu-1", "early", gpus=1)
        await until_holds("early Failed", lambda: phase(access, "early") == "Failed")
        assert pod(access, "early")["status"]["reason"] == "UnexpectedAdmissionError"  # type: ignore[index]
        t0 = time.monotonic()

        def gpus() -> str | None:
            n = access.get(NODES, "", "gpu-1")
            return (n or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")

        assert await until_holds("GPUs allocatable", gpus) == "8"
        assert time.monotonic() - t0 >= 0.3
        await run_pod(access, "gpu-1", "late", gpus=8, runtime=0.1)
        await until_holds("late Succeeded", lambda: phase(access, "late") == "Succeeded")


@pytest.mark.anyio
async def test_lease_is_renewed_and_node_status_heartbeats() -> None:
    async with cluster(Machine("n1")) as (_, _, _, access):
        lease = await until_holds("lease", lambda: access.get(LEASES, NODE_LEASE_NAMESPACE, "n1"))
        assert lease["spec"]["holderIdentity"] == "n1" and lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"
        renewals = {lease["spec"]["renewTime"]}

        def renewed_twice() -> bool | NotYet:
            renewals.add(access.get(LEASES, NODE_LEASE_NAMESPACE, "n1")["spec"]["renewTime"])  # type: ignore[index]
            return len(renewals) >= 3 or NotYet(renewals)

        await until_holds("two lease renewals", renewed_twice, 10.0, every=0.02)
        first = cond(access.get(NODES, "", "n1"), "Ready")["lastHeartbeatTime"]  # type: ignore[arg-type]

        def heartbeat() -> str:
            return str(cond(access.get(NODES, "", "n1"), "Ready")["lastHeartbeatTime"])  # type: ignore[arg-type]

        await until_holds("a periodic node status post", lambda: heartbeat() != first, 3)


@pytest.mark.anyio
async def test_power_off_stops_the_kubelet_and_a_reboot_restarts_or_fails_its_pods() -> None:
    async with cluster(Machine("n1")) as (_, fleet, k, access):
        await run_pod(access, "n1", "always", policy="Always")
        await run_pod(access, "n1", "never", policy="Never")
        await until_holds("always Running and never Running",
                          lambda: phase(access, "always") == "Running" and phase(access, "never") == "Running")
        fleet.power_off("n1")
        await two_passes(k)  # a renewal in flight at the power-off has landed
        renew = access.get(LEASES, NODE_LEASE_NAMESPACE, "n1")["spec"]["renewTime"]  # type: ignore[index]
        await run_pod(access, "n1", "late", runtime=0.1)
        await access.delete(PODS, "default", "never")  # nobody confirms: it stays Terminating
        await asyncio.sleep(0.4)  # time passing is under test: several lease periods without a renewal
        await two_passes(k)
        assert access.get(LEASES, NODE_LEASE_NAMESPACE, "n1")["spec"]["renewTime"] == renew  # type: ignore[index]
        assert phase(access, "late") == "Pending" and phase(access, "always") == "Running"
        assert pod(access, "never")["metadata"]["deletionTimestamp"]  # type: ignore[index]
        boot = access.get(NODES, "", "n1")["status"]["nodeInfo"]["bootID"]  # type: ignore[index]
        fleet.power_on("n1")

        def rebooted() -> bool:
            p = pod(access, "always") or {}
            cs = (p.get("status") or {}).get("containerStatuses") or [{}]
            return cs[0].get("restartCount") == 1 and "running" in cs[0].get("state", {})

        await until_holds("Always pod restarted after the reboot", rebooted)
        cs = pod(access, "always")["status"]["containerStatuses"][0]  # type: ignore[index]
        assert cs["lastState"]["terminated"]["reason"] == "ContainerStatusUnknown"
        assert pod(access, "always")["status"]["podIP"]  # type: ignore[index]
        await until_holds("terminating pod confirmed after the reboot", lambda: pod(access, "never") is None)
        await until_holds("pending pod ran after the reboot", lambda: phase(access, "late") == "Succeeded")
        assert access.get(NODES, "", "n1")["status"]["nodeInfo"]["bootID"] != boot  # type: ignore[index]


@pytest.mark.anyio
async def test_reboot_fails_running_pods_with_restart_policy_never() -> None:
    async with cluster(Machine("n1")) as (_, fleet, _, access):
        await run_pod(access, "n1", "once", policy="Never")
        await until_holds("once Running", lambda: phase(access, "once") == "Running")
        fleet.power_off("n1")
        fleet.power_on("n1")  # off and on again before the kubelets' next step: still a reboot
        await until_holds("Failed after reboot", lambda: phase(access, "once") == "Failed")
        term = pod(access, "once")["status"]["containerStatuses"][0]["state"]["terminated"]  # type: ignore[index]
        assert term["reason"] == "ContainerStatusUnknown" and term["exitCode"] == 137


@pytest.mark.anyio
async def test_admission_rejects_what_the_node_cannot_hold() -> None:
    async with cluster(Machine("tiny", max_pods=1, cpu="1")) as (_, _, k, access):
        await until_holds("tiny Ready", lambda: node_ready(access, "tiny"))
        await run_pod(access, "tiny", "first")
        await until_holds("first Running", lambda: phase(access, "first") == "Running")
        await run_pod(access, "tiny", "second")
        await until_holds("second Failed", lambda: phase(access, "second") == "Failed")
        assert pod(access, "second")["status"]["reason"] == "OutOfpods"  # type: ignore[index]
        assert k.rejected == 1


@pytest.mark.anyio
async def test_pod_ips_are_unique_and_inside_the_node_cidr() -> None:
    async with cluster(Machine("n1"), Machine("n2")) as (_, _, _, access):
        for i in range(30):
            await run_pod(access, "n1" if i % 2 else "n2", f"p{i}")
        await until_holds("all 30 pods Running", lambda: all(phase(access, f"p{i}") == "Running" for i in range(30)))
        ips = [pod(access, f"p{i}")["status"]["podIP"] for i in range(30)]  # type: ignore[index]
        assert len(set(ips)) == 30
        cidrs = {access.get(NODES, "", n)["spec"]["podCIDR"] for n in ("n1", "n2")}  # type: ignore[index]
        assert len(cidrs) == 2


@pytest.mark.anyio
async def test_a_thousand_pods_run_to_completion() -> None:
    opts = KubeletOptions(start_latency_seconds=0.0, lease_seconds=5, node_status_seconds=30, events=False)
    machines = [Machine(f"n{i}", max_pods=200) for i in range(10)]
    async with cluster(*machines, options=opts) as (server, _, k, access):
        await until_holds("every node Ready", lambda: all(node_ready(access, m.name) for m in machines))
        for i in range(1000):
            body = pod_obj(f"b{i}", runtime=0.0)
            body["spec"]["nodeName"] = f"n{i % 10}"  # created bound, as a DaemonSet or test harness does
            await access.create(PODS, "default", body)
        await until_holds("all pods finished", lambda: k.finished >= 1000, 20)
        assert k.transitions == 2000
        assert sum(1 for p in server.store.iter(PODS) if p.obj["status"]["phase"] == "Succeeded") == 1000
