"""The autoprovision controller on the emulated cluster with the emulated power API: a pending 2-GPU pod wakes
the smallest machine that fits (and nothing else), the machine is POSTed once while it boots, the pod runs, and
the idle machine is drained and powered off; a 16-GPU pod with 8-GPU machines is not demand."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from live_controller import ReconcileLog, looked
from prometheus_client import REGISTRY
from waiting import install_crds, until, until_holds

from gpuops.controllers.autoprovision.api import GROUPS, GPUNodeGroup
from gpuops.controllers.autoprovision.reconciler import PLAN
from gpuops.controllers.autoprovision.settings import Settings
from gpuops.controllers.autoprovision.setup import AutoprovisionController, install
from gpuops.controllers.secretscope import SecretScope
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Request
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.objects import Pod
from gpuops.kube.resources import EVENTS, PODS, SECRETS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

NS = "work"

pytestmark = pytest.mark.anyio

SCENARIO = {
    "name": "autoprovision-tests",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeLifecycle": {"nodeMonitorGraceSeconds": 1.0, "podGcOrphanSeconds": 2.0},
    "nodeGroups": [
        {"name": "small", "gpuModel": "A100-80GB", "gpusPerNode": 2, "count": 1, "poweredOff": 1,
         "bootSeconds": 0.4, "devicePluginSeconds": 0.2, "shutdownSeconds": 0.2},
        {"name": "big", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 1, "poweredOff": 1,
         "bootSeconds": 0.4, "devicePluginSeconds": 0.2, "shutdownSeconds": 0.2},
    ],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"



def gpu_pod(name: str, gpus: int, runtime: float) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"sim.gpuops.io/runtime-seconds": str(runtime)}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def group(cluster: SimCluster, machine: str, gpus: int) -> dict[str, Any]:
    base = f"{cluster.cloud.url}/power/v1/machines/{machine}"
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": machine},
            "spec": {"nodeName": machine, "gpuCount": gpus, "scaleUp": {"url": f"{base}/start"},
                     "scaleDown": {"url": f"{base}/stop"}, "bootTimeoutSeconds": 30,
                     "scaleDownUnneededSeconds": 1, "scaleDownDelayAfterScaleUpSeconds": 0,
                     "template": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                              "effect": "NoSchedule"}]}}}


@dataclass(frozen=True, slots=True)
class Rig:
    """The emulated cluster, a client to it, and the running controller with a log of its reconciles."""

    cluster: SimCluster
    client: Client
    handle: AutoprovisionController
    log: ReconcileLog


@asynccontextmanager
async def running(tmp_path: Path, hidden: Callable[[Pod], bool] | None = None,
                  **settings: Any) -> AsyncIterator[tuple[SimCluster, Client]]:
    async with operator(tmp_path, hidden, **settings) as rig:
        yield rig.cluster, rig.client


@asynccontextmanager
async def operator(tmp_path: Path, hidden: Callable[[Pod], bool] | None = None, **settings: Any) -> AsyncIterator[Rig]:
    async with SimCluster(parse(SCENARIO), workload=False) as cluster:
        cluster.write_kubeconfig(tmp_path / "k")
        client = await Client.from_kubeconfig(str(tmp_path / "k"))
        await install_crds(client, ["gpunodegroups"], [GROUPS])
        mgr = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        handle = install(mgr, settings=Settings(**{"drain_recheck": 0.2, "off_recheck": 0.2,
                                                   "secret_scope": SecretScope(NS), **settings}), env={})
        if hidden is not None:  # the operator's pod cache lags: these pods are not in it (yet)
            store = handle.reconciler.pods.store
            real = store.by_index
            store.by_index = lambda name, value: [p for p in real(name, value) if not hidden(p)]  # type: ignore[method-assign]
        log = ReconcileLog()
        log.wrap(handle.controller)
        task = asyncio.create_task(mgr.run())
        try:
            yield Rig(cluster, client, handle, log)
        finally:
            mgr.request_stop()
            await asyncio.wait_for(task, 15)
            await client.close()


async def state_of(client: Client, name: str) -> str:
    g: GPUNodeGroup = await client.get(GROUPS, name)
    return g.status.state


async def test_smallest_fit_once_then_idle_power_off(tmp_path: Path) -> None:
    async with running(tmp_path) as (cluster, client):
        small, big = "small-0", "big-0"
        ups_before = REGISTRY.get_sample_value("gpuops_autoprovision_webhook_requests_total",
                                               {"direction": "up", "code": "202"}) or 0.0
        await client.create(GROUPS, group(cluster, small, 2))
        await client.create(GROUPS, group(cluster, big, 8))
        await client.create(PODS, gpu_pod("job", 2, 1.5), NS)

        async def pod_ran() -> bool:
            p = await client.get(PODS, "job", NS)
            return p.status.phase == "Succeeded"

        await until("the pod ran on the woken machine", pod_ran)
        fleet = cluster.fleet.machines
        assert fleet[small].power_cycles == 1  # one power-on, never re-POSTed while booting
        assert fleet[big].power_cycles == 0  # the smallest sufficient machine, not the big one
        posts = REGISTRY.get_sample_value("gpuops_autoprovision_webhook_requests_total",
                                          {"direction": "up", "code": "202"}) or 0.0
        assert posts - ups_before == 1  # one POST for one decision: none re-sent while the machine booted
        decisions = REGISTRY.get_sample_value("gpuops_autoprovision_decision_seconds_count") or 0.0
        assert decisions >= 1.0
        assert (REGISTRY.get_sample_value("gpuops_autoprovision_node_groups", {"state": "Ready"}) or 0) >= 1

        async def powered_off() -> bool:
            return await state_of(client, small) == "Off" and not fleet[small].powered

        await until("the idle machine drained and powered off", powered_off)
        g: GPUNodeGroup = await client.get(GROUPS, small)
        assert g.status.last_webhook is not None and g.status.last_webhook.code == 202  # the sim answers 202
        assert g.status.last_webhook.direction == "down"
        assert await state_of(client, big) == "Off"

        # the powered-off machine keeps its (unreachable-tainted) Node; it is woken again for new work
        await client.create(PODS, gpu_pod("again", 2, 1.0), NS)

        async def ran_again() -> bool:
            return (await client.get(PODS, "again", NS)).status.phase in ("Running", "Succeeded")

        await until("the same machine powered on a second time", ran_again)
        assert fleet[small].power_cycles == 2 and fleet[big].power_cycles == 0


async def test_a_pod_larger_than_every_machine_is_not_demand(tmp_path: Path) -> None:
    async with operator(tmp_path) as rig:
        cluster, client = rig.cluster, rig.client
        await client.create(GROUPS, group(cluster, "big-0", 8))
        await client.create(PODS, gpu_pod("huge", 16, 1.0), NS)

        async def unschedulable() -> bool:
            p = await client.get(PODS, "huge", NS)
            return any(c.reason == "Unschedulable" for c in p.status.conditions or ())

        await until("the scheduler gave up on the pod", unschedulable)

        def cached_unschedulable() -> bool:
            p = rig.handle.reconciler.pods.store.get(f"{NS}/huge")
            return p is not None and any(c.reason == "Unschedulable" for c in p.status.conditions or ())

        await until_holds("the operator's cache showing the pod unschedulable", cached_unschedulable)
        await looked(rig.log, rig.handle.controller, PLAN)  # a plan that saw the pod
        assert cluster.fleet.machines["big-0"].power_cycles == 0
        assert await state_of(client, "big-0") == "Off"


async def test_a_secret_outside_the_operators_namespaces_is_never_read(tmp_path: Path) -> None:
    """Whoever may write GPUNodeGroups must not read kube-system's Secrets through us: the group is refused
    (Ready=False SecretNotAllowed naming the field and the way out, a Warning Event), left out of the power plan,
    and the operator never asks the API server for that Secret. Naming one in its namespace then works."""
    async with running(tmp_path) as (cluster, client):
        cluster.cloud.options.token = "s3cret-token"
        reads: list[str] = []
        cluster.server.audit_hooks.append(
            lambda d: reads.append(f"{d.attrs.namespace}/{d.attrs.name}")
            if d.attrs.resource == "secrets" and d.attrs.verb == "get" else None)
        token = {"token": base64.b64encode(b"s3cret-token").decode()}
        await client.create(SECRETS, {"metadata": {"name": "bmc", "namespace": "kube-system"}, "data": token},
                            "kube-system")
        body = group(cluster, "small-0", 2)
        body["spec"]["scaleUp"].update(secretRef={"name": "bmc", "namespace": "kube-system"}, insecureAllowHTTP=True)
        await client.create(GROUPS, body)
        plans = REGISTRY.get_sample_value("gpuops_autoprovision_plan_seconds_count") or 0.0
        await client.create(PODS, gpu_pod("job", 1, 30.0), NS)

        async def refused() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "small-0")
            c = cond.get_condition(g.status.conditions, "Ready")
            return g if c is not None and c.reason == "SecretNotAllowed" else None

        g = await until("the group refused for its Secret's namespace", refused)
        ready = cond.get_condition(g.status.conditions, "Ready")
        assert ready is not None and ready.status == "False"
        assert ready.message.startswith("spec.scaleUp.secretRef.namespace: a GPUNodeGroup may name a Secret only in "
                                        f"{NS} (the operator reads it"), ready.message
        assert "not in 'kube-system'" in ready.message and "--secret-namespaces" in ready.message
        await until("a later plan", lambda: _later(plans + 1))
        events = json.loads(await client.request("GET", "/api/v1/events"))["items"]
        assert any(e.get("reason") == "SecretNotAllowed" and e["type"] == "Warning" for e in events)
        assert g.status.transition is None and cluster.fleet.machines["small-0"].power_cycles == 0
        assert reads == [], reads

        await client.create(SECRETS, {"metadata": {"name": "bmc", "namespace": NS}, "data": token}, NS)
        fixed = {"spec": {"scaleUp": {"url": g.spec.scale_up.url, "secretRef": {"name": "bmc", "namespace": NS},
                                      "insecureAllowHTTP": True}}}  # the emulated power API is plain http
        await client.patch(GROUPS, "small-0", fixed)

        async def running_pod() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Running"

        await until("the pod running on the machine powered on with the token", running_pod)
        assert set(reads) == {f"{NS}/bmc"}, reads


async def _later(count: float) -> bool:
    return (REGISTRY.get_sample_value("gpuops_autoprovision_plan_seconds_count") or 0.0) >= count


async def test_a_refused_webhook_is_shown_and_the_fixed_spec_sends_the_same_transition(tmp_path: Path) -> None:
    """The power API wants a bearer token: without it the 401 is a condition and a Warning Event, nothing is
    retried in a loop, the pod stays pending; adding the Secret reference sends the same transition (its
    Idempotency-Key unchanged) and the machine powers on once."""
    async with operator(tmp_path) as rig:
        cluster, client = rig.cluster, rig.client
        cluster.cloud.options.token = "s3cret-token"
        await client.create(SECRETS, {"metadata": {"name": "bmc", "namespace": NS},
                                      "data": {"token": base64.b64encode(b"s3cret-token").decode()}}, NS)
        await client.create(GROUPS, group(cluster, "small-0", 2))
        await client.create(PODS, gpu_pod("job", 1, 30.0), NS)

        async def refused() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "small-0")
            c = cond.get_condition(g.status.conditions, "WebhookFailing")
            return g if c is not None and c.status == "True" and c.reason == "Refused" else None

        g = await until("the 401 shown as WebhookFailing=Refused", refused)
        assert g.status.last_webhook is not None and g.status.last_webhook.code == 401
        assert g.status.webhook == "401"  # the WEBHOOK column
        assert "s3cret" not in (g.status.last_webhook.error or "")
        ready = cond.get_condition(g.status.conditions, "Ready")  # not the first sight's "powered on when needed"
        assert ready is not None and (ready.status, ready.reason) == ("False", "WebhookFailed"), ready
        assert "powering on small-0 is failing" in ready.message and "401" in ready.message
        assert g.status.transition is not None and not g.status.transition.sent
        key = g.status.transition.key
        events = json.loads(await client.request("GET", "/api/v1/events"))["items"]
        assert any(e.get("reason") == "WebhookFailed" for e in events)
        assert cluster.fleet.machines["small-0"].power_cycles == 0
        # the status write recording the refusal wakes the group at once: it must still wait (10 s at first)
        refusals = cluster.cloud.calls[("power", "start", 401)]
        await asyncio.sleep(1.5)  # well inside the backoff, which is under test
        await looked(rig.log, rig.handle.controller, Request("", "small-0"))
        assert cluster.cloud.calls[("power", "start", 401)] == refusals, "a refused webhook was re-sent in a loop"

        fixed = {"spec": {"scaleUp": {"url": g.spec.scale_up.url, "secretRef": {"name": "bmc", "namespace": NS},
                                      "insecureAllowHTTP": True}}}  # the emulated power API is plain http
        await client.patch(GROUPS, "small-0", fixed)

        async def running_pod() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Running"

        await until("the pod running on the machine powered on with the token", running_pod)
        g = await client.get(GROUPS, "small-0")
        assert g.status.last_webhook is not None and g.status.last_webhook.code == 202
        assert cluster.fleet.machines["small-0"].power_cycles == 1
        assert g.status.state == "Ready" and cond.is_false(g.status.conditions, "WebhookFailing")
        assert cluster.cloud.power.replay(key, "start small-0") is not None  # the decision's key, unchanged


async def test_an_idle_node_with_a_do_not_evict_pod_stays_on_until_it_goes(tmp_path: Path) -> None:
    async with operator(tmp_path) as rig:
        cluster, client = rig.cluster, rig.client
        await client.create(GROUPS, group(cluster, "small-0", 2))
        await client.create(PODS, gpu_pod("job", 1, 0.5), NS)

        async def finished() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Succeeded"

        await until("the GPU pod ran", finished)
        keeper = gpu_pod("keeper", 1, 600.0)
        keeper["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "false"
        keeper["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}  # no GPU: not "busy"
        keeper["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "small-0"}
        await client.create(PODS, keeper, NS)

        async def keeper_running() -> bool:
            return (await client.get(PODS, "keeper", NS)).status.phase == "Running"

        await until("the do-not-evict pod running on the idle machine", keeper_running)
        await asyncio.sleep(2.5)  # well past scaleDownUnneededSeconds (1 s), which is under test: it must stay on
        await looked(rig.log, rig.handle.controller, PLAN)  # a plan after that time, which decides power-offs
        assert await state_of(client, "small-0") == "Ready"
        assert cluster.fleet.machines["small-0"].powered
        await client.delete(PODS, "keeper", NS)

        async def off() -> bool:
            return await state_of(client, "small-0") == "Off"

        await until("powered off once the blocker left", off)


async def test_a_pod_bound_while_the_cache_lags_keeps_its_machine_on(tmp_path: Path) -> None:
    """The drain reads the node's pods from the API server after tainting it: a pod bound there that the
    operator's cache does not show yet (seconds of lag under load) aborts the power-off instead of being
    stranded on a machine switched off under it."""
    async with running(tmp_path, hidden=lambda p: p.metadata.name == "late") as (cluster, client):
        await client.create(GROUPS, group(cluster, "small-0", 2))
        await client.create(PODS, gpu_pod("job", 1, 0.5), NS)

        async def finished() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Succeeded"

        await until("the GPU pod ran", finished)
        late = gpu_pod("late", 1, 600.0)
        late["spec"]["nodeName"] = "small-0"
        await client.create(PODS, late, NS)

        async def aborted() -> bool:
            _, events = await client.list(EVENTS, namespace="default")
            return any(e.reason == "PowerOffAborted" for e in events)

        await until("the power-off aborted by the live read", aborted)
        machine = cluster.fleet.machines["small-0"]
        assert machine.powered and machine.power_cycles == 1
        assert (await client.get(PODS, "late", NS)).status.phase in ("Pending", "Running")


async def test_a_machine_that_never_boots_fails_backs_off_and_another_is_tried(tmp_path: Path) -> None:
    """'ghost' (1 GPU, the smallest fit, so tried first) answers its power-on but never joins: after its boot
    timeout it is Failed with a BootTimeout Event, and the pod gets the next machine that fits."""
    async with running(tmp_path, boot_backoff_base=30.0) as (cluster, client):
        ghost = group(cluster, "big-0", 1)
        ghost["metadata"]["name"] = "ghost"
        ghost["spec"]["scaleUp"]["url"] = ghost["spec"]["scaleDown"]["url"]  # 2xx, and powers nothing on
        ghost["spec"].update({"nodeName": "ghost", "bootTimeoutSeconds": 1})  # its node never appears
        await client.create(GROUPS, ghost)
        await client.create(GROUPS, group(cluster, "big-0", 8))
        await client.create(PODS, gpu_pod("job", 1, 30.0), NS)

        async def failed() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "ghost")
            return g if g.status.state == "Failed" else None

        g = await until("ghost Failed after its boot timeout", failed)
        assert g.status.failures == 1 and g.status.backoff_until is not None

        async def pod_running() -> bool:
            return (await client.get(PODS, "job", NS)).status.phase == "Running"

        await until("the pod running on the next machine", pod_running)
        assert (await client.get(PODS, "job", NS)).spec.node_name == "big-0"
        events = json.loads(await client.request("GET", "/api/v1/events"))["items"]
        assert any(e.get("reason") == "BootTimeout" for e in events)
        assert await state_of(client, "ghost") == "Failed"  # still backing off (30 s here)


async def test_a_machine_that_boots_late_is_taken_and_its_failure_count_starts_over(tmp_path: Path) -> None:
    """Booting takes 3 s, the group allows 1 s: Failed (failures 1); when the node joins after all the group
    is Ready and forgets the failure, so a later timeout is not backed off as a second one."""
    async with running(tmp_path) as (cluster, client):
        cluster.fleet.machines["big-0"].boot_seconds = 3.0
        slow = group(cluster, "big-0", 8)
        slow["spec"]["bootTimeoutSeconds"] = 1
        await client.create(GROUPS, slow)
        await client.create(PODS, gpu_pod("job", 1, 30.0), NS)

        async def failed() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "big-0")
            return g if g.status.state == "Failed" else None

        assert (await until("Failed after its 1 s boot timeout", failed)).status.failures == 1

        async def ready() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "big-0")
            return g if g.status.state == "Ready" else None

        g = await until("Ready once the node joined late", ready)
        assert g.status.failures == 0 and g.status.backoff_until is None


async def test_every_idle_machine_goes_off_in_time_largest_first(tmp_path: Path) -> None:
    """The seed could only ever power off the single largest idle node: here both go, one at a time (the cap
    on concurrent power-offs is 1), the 8-GPU machine first. Both become due for power-off at the same instant
    (5 s after the latest power-on, the scale-down delay: longer than any skew between their pods' ends), so the
    order is the planner's choice, not which pod happened to end first."""
    async with running(tmp_path, max_concurrent_power_offs=1) as (cluster, client):
        for name, gpus in (("small-0", 2), ("big-0", 8)):
            body = group(cluster, name, gpus)
            body["spec"]["scaleDownDelayAfterScaleUpSeconds"] = 5
            await client.create(GROUPS, body)
        await client.create(PODS, gpu_pod("small-job", 2, 1.0), NS)
        await client.create(PODS, gpu_pod("big-job", 8, 1.0), NS)

        async def both_ran() -> bool:
            return all([(await client.get(PODS, n, NS)).status.phase == "Succeeded" for n in ("small-job", "big-job")])

        await until("both pods ran", both_ran)

        async def both_off() -> list[GPUNodeGroup] | None:
            groups = [await client.get(GROUPS, n) for n in ("small-0", "big-0")]
            return groups if all(g.status.state == "Off" for g in groups) else None

        small, big = await until("both idle machines powered off", both_off, within=40)
        fleet = cluster.fleet.machines
        assert fleet["small-0"].power_cycles == 1 and fleet["big-0"].power_cycles == 1
        assert small.status.last_webhook is not None and big.status.last_webhook is not None
        assert small.status.last_webhook.direction == big.status.last_webhook.direction == "down"
        assert big.status.last_webhook.time < small.status.last_webhook.time  # largest first


async def test_two_groups_naming_one_node_the_first_manages_it_and_hands_over_when_it_goes(tmp_path: Path) -> None:
    """Two groups driving one machine would power it on and off against each other: the one created first
    manages it, the other says so (Ready=False NodeClaimed, a Warning Event) while the planner powers the machine
    on for work; deleting the first hands the machine to the second."""
    async with running(tmp_path) as (cluster, client):
        await client.create(GROUPS, group(cluster, "small-0", 2))
        second = group(cluster, "small-0", 2)
        second["metadata"]["name"] = "second"

        async def observed(name: str) -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, name)
            return g if g.status.observed_generation == g.metadata.generation and g.status.conditions else None

        await until("small-0 observed", lambda: observed("small-0"))
        await client.create(GROUPS, second)
        g = await until("second observed", lambda: observed("second"))
        ready = cond.get_condition(g.status.conditions, "Ready")
        assert ready is not None and (ready.status, ready.reason) == ("False", "NodeClaimed"), ready
        assert "GPUNodeGroup small-0" in ready.message and "spec.nodeName" in ready.message

        async def warned() -> bool:
            _, events = await client.list(EVENTS, namespace="default")
            return any(e.reason == "NodeClaimed" and e.involved_object.name == "second" for e in events)

        await until("a NodeClaimed Event on second", warned)
        await client.create(PODS, gpu_pod("job", 2, 60.0), NS)
        await until("small-0 powered on for the pod", lambda: _state_in(client, "small-0", ("PoweringOn", "Ready")))
        assert await state_of(client, "second") == "Off"

        await client.delete(GROUPS, "small-0")

        async def handed_over() -> bool:
            g: GPUNodeGroup = await client.get(GROUPS, "second")
            ready = cond.get_condition(g.status.conditions, "Ready")
            return ready is not None and ready.reason != "NodeClaimed" and g.status.state == "Ready"

        await until("second manages the running machine", handed_over)


async def _state_in(client: Client, name: str, states: tuple[str, ...]) -> bool:
    return await state_of(client, name) in states


async def test_a_missing_secret_is_shown_and_counted_for_the_power_on_alert(tmp_path: Path) -> None:
    """A power-on whose Secret does not exist sends nothing, yet it is a failing power-on: WebhookFailing names
    the Secret, a Warning Event says it, and gpuops_autoprovision_webhook_requests_total{code="unsent"} counts it,
    which GPUNodePowerOnFailing alerts on (the rule's promtool tests cover that series)."""
    async with running(tmp_path) as (cluster, client):
        def unsent() -> float:
            return REGISTRY.get_sample_value("gpuops_autoprovision_webhook_requests_total",
                                             {"direction": "up", "code": "unsent"}) or 0.0

        before = unsent()
        body = group(cluster, "small-0", 2)
        body["spec"]["scaleUp"].update(secretRef={"name": "no-such-secret", "namespace": NS}, insecureAllowHTTP=True)
        await client.create(GROUPS, body)
        await client.create(PODS, gpu_pod("job", 1, 30.0), NS)

        async def failing() -> GPUNodeGroup | None:
            g: GPUNodeGroup = await client.get(GROUPS, "small-0")
            c = cond.get_condition(g.status.conditions, "WebhookFailing")
            return g if c is not None and c.status == "True" else None

        g = await until("WebhookFailing for the missing Secret", failing)
        c = cond.get_condition(g.status.conditions, "WebhookFailing")
        assert c is not None and "no-such-secret" in c.message and "spec.scaleUp" in c.message
        ready = cond.get_condition(g.status.conditions, "Ready")
        assert ready is not None and (ready.status, ready.reason) == ("False", "WebhookFailed"), ready
        assert "no-such-secret" in ready.message
        assert g.status.webhook == "unsent"  # the WEBHOOK column: not blank
        assert unsent() > before
        events = json.loads(await client.request("GET", "/api/v1/events"))["items"]
        assert any(e.get("reason") == "WebhookFailed" and "no-such-secret" in e.get("message", "") for e in events)
        assert cluster.fleet.machines["small-0"].power_cycles == 0
