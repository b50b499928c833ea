"""Restarts, admission and permissions: with retainFinishedPods nothing is lost across an operator outage during
which pods finish and are deleted; invalid specs are refused at admission with messages naming the field;
kubectl explains the CRD and prints its columns; the RBAC role in manifests/ is all the controller needs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget_harness import NS, ROOT, Env, budget, environment, install_crd, pod, truth_gpu_hours
from waiting import NotYet, until

from gpuops.controllers.budget.api import BUDGETS, FINALIZER, GPUWorkloadBudget
from gpuops.controllers.budget.setup import install
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.errors import Invalid
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import NAMESPACES, PODS
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

KUBECTL = str(Path(sys.executable).parent / "kubectl")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def finalizers(env: Env, name: str) -> tuple[str, ...]:
    return (await env.client.get(PODS, name, NS)).metadata.finalizers or ()


async def holds(env: Env, name: str) -> bool:
    """The pod carries our accounting finalizer."""
    return FINALIZER in await finalizers(env, name)


async def test_restart_with_retained_pods_loses_nothing(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        await env.start()
        await env.create_budget(budget("keep", "100", accounting={"retainFinishedPods": True}))
        await env.create_pod(pod("short", 1, 1.0))
        await env.create_pod(pod("long", 2, 600.0))

        await env.until("long holds the accounting finalizer", lambda: holds(env, "long"))
        await env.until("short finished", lambda: env.all_finished(["short"]))

        async def released_after_ledger() -> bool:
            b = await env.budget("keep")
            entries = b.status.ledger.entries if b.status.ledger else None
            return any(e.name == "short" for e in entries or ()) and not await holds(env, "short")

        await env.until("short recorded, then released", released_after_ledger)
        short = await env.raw_pods(["short"])

        # operator down: the running pod is deleted (it stays, terminating, held by the finalizer), the
        # recorded one is deleted for good, and a new pod runs to completion unseen
        await env.stop()
        await env.client.delete(PODS, "long", NS)
        await env.client.delete(PODS, "short", NS)
        await env.create_pod(pod("unseen", 1, 1.0))

        async def long_terminated() -> list[dict[str, Any]] | None:
            got = await env.raw_pods(["long"])
            return got if got and got[0]["status"].get("phase") in ("Succeeded", "Failed") else None

        long = await env.until("long terminated but kept", long_terminated)
        await env.until("unseen finished", lambda: env.all_finished(["unseen"]))
        unseen = await env.raw_pods(["unseen"])
        assert await env.pod_gone("short")

        await env.start()
        await env.until("long recorded and released", lambda: env.pod_gone("long"))
        truth = truth_gpu_hours([*short, *long, *unseen])

        async def exact() -> GPUWorkloadBudget | None:
            b = await env.budget("keep")
            ok = b.status.consumed_gpu_hours and abs(Fraction(b.status.consumed_gpu_hours) - truth) <= Fraction(
                1, 10**6)
            return b if ok else None

        b = await env.until("consumption equals the truth after the restart", exact)
        assert b.status.tracked_pods == 3 and b.status.running_pods == 0
        assert {e.name for e in (b.status.ledger.entries or ())} == {"short", "long", "unseen"}  # type: ignore[union-attr]
        assert not await holds(env, "unseen")

        # deleting the budget releases what it held: no pod keeps our finalizer
        await env.create_pod(pod("held", 1, 600.0))
        await env.until("held gets the finalizer", lambda: holds(env, "held"))
        await env.client.delete(BUDGETS, "keep", NS)

        async def released() -> bool:
            return not await holds(env, "held")

        await env.until("finalizer released after the budget went", released)


async def test_invalid_specs_are_refused_with_the_field_named(tmp_path: Path) -> None:
    async with environment(tmp_path) as env:
        good = budget("ok", "2.5")
        cases: list[tuple[str, dict[str, Any], str, str]] = [
            ("empty-selector", {"selector": {}}, "spec.selector", "must not be empty"),
            ("zero-quota", {"quota": {"gpuHours": "0", "windowHours": 1}}, "spec.quota.gpuHours", "greater than 0"),
            ("bad-action", {"enforcement": {"action": "Kill"}}, "spec.enforcement.action", "Unsupported value"),
            ("zero-window", {"quota": {"gpuHours": "1", "windowHours": 0}}, "spec.quota.windowHours",
             "greater than or equal to 1"),
            ("no-window", {"quota": {"gpuHours": "1"}}, "spec.quota", "set exactly one of spec.quota.windowHours"),
            ("two-windows", {"quota": {"gpuHours": "1", "windowHours": 1, "window": {"calendar": "Day"}}},
             "spec.quota", "set exactly one of spec.quota.windowHours"),
            ("yearly", {"quota": {"gpuHours": "1", "window": {"calendar": "Year"}}}, "spec.quota.window.calendar",
             "Unsupported value"),
            ("zone-path", {"quota": {"gpuHours": "1", "window": {"calendar": "Day", "timeZone": "../etc/passwd"}}},
             "spec.quota.window.timeZone", "should match"),
        ]
        for name, override, field, words in cases:
            body = {**good, "metadata": {"name": name}, "spec": {**good["spec"], **override}}
            with pytest.raises(Invalid) as err:
                await env.create_budget(body)
            assert any(c.field == field and words in c.message for c in err.value.causes), err.value.causes
            assert field in str(err.value)

        minimal = {**good, "spec": {"selector": good["spec"]["selector"], "quota": good["spec"]["quota"]}}
        created = await env.create_budget(minimal)  # defaults filled in by the schema
        spec = created.spec
        assert (spec.gpu_resource_name, spec.enforcement.action, spec.enforcement.delay_seconds) == (
            "nvidia.com/gpu", "AlertOnly", 60)
        assert spec.accounting.retain_finished_pods is False

        await env.start()

        async def ready() -> GPUWorkloadBudget | None:
            b = await env.budget("ok")
            return b if cond.is_true(b.status.conditions, "Ready") else None

        await env.until("ok is Ready", ready)
        explain = await kubectl(env, "explain", "gwb.spec")
        assert "selector" in explain and "must not be empty" in explain and "retainFinishedPods" not in explain
        explain = await kubectl(env, "explain", "gwb.spec.quota.gpuHours")
        assert "GPU-hours allowed per window" in explain
        table = await kubectl(env, "get", "gwb", "-n", NS)
        header = table.splitlines()[0].split()
        assert header == ["NAME", "CONSUMED", "QUOTA", "REMAINING", "PODS", "ACTION", "AGE"], table
        assert "2.5" in table and "AlertOnly" in table


async def kubectl(env: Env, *args: str) -> str:
    # A cache of its own: kubectl keeps discovery per host:port, and an earlier test's emulator on the same
    # loopback port (without our CRD) would answer `explain gwb` from that stale cache.
    cache = str(Path(env.kubeconfig).parent / "kubectl-cache")
    proc = await asyncio.create_subprocess_exec(KUBECTL, "--kubeconfig", str(env.kubeconfig), "--cache-dir", cache,
                                                *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_the_rbac_role_is_enough(tmp_path: Path) -> None:
    """The controller runs as a service account bound to manifests/rbac/budget-role.yaml only."""
    async with APIServer(authorization="RBAC", bookmark_interval=0.5) as server:
        server.write_kubeconfig(tmp_path / "admin")
        admin = await Client.from_kubeconfig(str(tmp_path / "admin"))
        server.write_kubeconfig(tmp_path / "sa", token=server.service_account_token("gpuops-system", "budget"))
        sa = await Client.from_kubeconfig(str(tmp_path / "sa"))
        try:
            for ns in ("gpuops-system", NS):
                await admin.create(NAMESPACES, {"metadata": {"name": ns}})
            await install_crd(admin)
            role = yaml.safe_load((ROOT / "manifests" / "rbac" / "budget-role.yaml").read_text())
            rbac = "/apis/rbac.authorization.k8s.io/v1"
            await admin.request("POST", f"{rbac}/clusterroles", body=json.dumps(role).encode(),
                                content_type="application/json")
            binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                       "metadata": {"name": "budget"},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                   "name": role["metadata"]["name"]},
                       "subjects": [{"kind": "ServiceAccount", "name": "budget", "namespace": "gpuops-system"}]}
            await admin.request("POST", f"{rbac}/clusterrolebindings", body=json.dumps(binding).encode(),
                                content_type="application/json")
            # no kubelets here: the pod is made Running (an hour ago) through its status, as a kubelet would
            await admin.create(PODS, pod("hog", 1), NS)
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
            await admin.patch(PODS, "hog", {"status": {"phase": "Running", "startTime": started, "containerStatuses": [
                {"name": "main", "ready": True, "restartCount": 0, "image": "cuda", "imageID": "",
                 "state": {"running": {"startedAt": started}}}]}}, namespace=NS, subresource="status")
            await admin.create(BUDGETS, budget("b", "0.5", action="Evict", accounting={"retainFinishedPods": True}),
                               NS)

            mgr = Manager(sa, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
            install(mgr)
            task = asyncio.create_task(mgr.run())

            async def evicted() -> bool | NotYet:
                b = await admin.get(BUDGETS, "b", NS)
                events = json.loads(await admin.request("GET", f"/api/v1/namespaces/{NS}/events"))["items"]
                hog = await admin.get(PODS, "hog", NS)
                done = (cond.is_true(b.status.conditions, "QuotaExceeded") and hog.metadata.deletion_timestamp
                        and FINALIZER in (hog.metadata.finalizers or ())
                        and any(e["reason"] == "Evicted" for e in events))
                return bool(done) or NotYet((b.status, hog.metadata, events))

            try:
                await until("the hog evicted with the controller's own role", evicted, 15)
            finally:
                mgr.request_stop()
                await asyncio.wait_for(task, 15)
        finally:
            await sa.close()
            await admin.close()


async def test_turning_retention_off_releases_every_pod_the_budget_held(tmp_path: Path) -> None:
    """A budget that no longer retains finished pods lets go of its running pods at its next reconcile (nothing
    else needs them), and still counts them."""
    async with environment(tmp_path) as env:
        await env.start()
        await env.create_budget(budget("keep", "100", accounting={"retainFinishedPods": True}))
        await env.create_pod(pod("a", 1, 600.0))
        await env.create_pod(pod("b", 2, 600.0))

        for name in ("a", "b"):
            await env.until(f"{name} holds the accounting finalizer", lambda name=name: holds(env, name))
        await env.client.patch(BUDGETS, "keep", {"spec": {"accounting": {"retainFinishedPods": False}}}, namespace=NS)

        async def released() -> GPUWorkloadBudget | None:
            b = await env.budget("keep")
            if b.status.observed_generation != b.metadata.generation or await holds(env, "a") or await holds(env, "b"):
                return None
            return b

        b = await env.until("both released once the change is observed", released)
        assert b.status.running_pods == 2 and await env.phase("a") == "Running"


async def test_releasing_a_recorded_pod_keeps_the_finalizers_of_others(tmp_path: Path) -> None:
    """Our accounting finalizer goes once the pod is in the ledger; another controller's finalizer on the same pod
    stays (only ours is ours to remove)."""
    async with environment(tmp_path) as env:
        await env.start()
        await env.create_budget(budget("keep", "100", accounting={"retainFinishedPods": True}))
        body = pod("shared", 1, 2.0)
        body["metadata"]["finalizers"] = ["example.com/keep"]
        await env.create_pod(body)
        await env.create_pod(pod("plain", 1, 2.0))

        async def held() -> bool:
            return all([FINALIZER in await finalizers(env, n) for n in ("shared", "plain")])

        await env.until("both hold the accounting finalizer while they run", held)

        async def released() -> bool:
            return (await finalizers(env, "shared") == ("example.com/keep",)
                    and await finalizers(env, "plain") == ())

        await env.until("both finished, recorded and released by us", released)
        b = await env.budget("keep")
        assert {e.name for e in (b.status.ledger.entries or ())} == {"shared", "plain"}  # type: ignore[union-attr]
        await env.client.patch(PODS, "shared", {"metadata": {"finalizers": []}}, namespace=NS)
