"""The README's uninstall commands, run as written by the pinned kubectl against an emulated cluster that
enforces RBAC, with the operator installed by `kubectl apply -k manifests` and running with its installed
ServiceAccount's token.

Before: a SpotPool with a launched instance that joined as a node (its finalizer holds the instances), a
budget with `accounting.retainFinishedPods` whose running pod carries the budget finalizer, a GPUNodeGroup.
The first two commands run while the operator runs; the operator is then stopped at once (as deleting its
Deployment does: the worst case, nothing is left for it to finish later), and the last command deletes the
rest. Each command must exit 0 within its deadline with nothing on stderr (no error, no warning), and at the
end: no CRD of ours, no pod holding one of our finalizers, no live instance in the cloud, the operator's
namespace gone.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from test_install_rbac import ROOT, environment, free_port, pod
from waiting import until

pytestmark = pytest.mark.anyio
OURS = "gpuops.io/"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def readme_uninstall() -> list[list[str]]:
    """The commands of the README's "Uninstalling" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### Uninstalling\n.*?```sh\n(.*?)```", text, re.S)
    assert block is not None, "README.md has no Uninstalling block"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    commands = [c for c in commands if c]
    assert commands and all(c[0] == "kubectl" for c in commands), commands
    return commands


async def row(env: Any, name: str, *args: str) -> dict[str, str]:
    """One object's line of a `kubectl get` table, by column header (columns are single words here)."""
    _, out, _ = await env.kubectl(*args)
    lines = out.splitlines()
    header = lines[0].split()
    cells = next(line.split() for line in lines[1:] if line.split()[0] == name)
    return dict(zip(header, cells, strict=False))


def with_finalizers(items: list[dict[str, Any]]) -> list[str]:
    return [f"{o.get('kind')}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}: "
            f"{o['metadata']['finalizers']}" for o in items
            if any(f.startswith(OURS) for f in o["metadata"].get("finalizers") or ())]


async def test_the_readme_uninstall_commands_run_clean_and_leave_nothing_behind(tmp_path: Path) -> None:
    commands = readme_uninstall()
    async with environment(tmp_path) as env:
        cloud = env.cluster.cloud.url
        await env.kubectl("apply", "-k", str(ROOT / "manifests"))
        assert await env.cluster.wait_ready(30)
        await env.apply(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "spot-keys", "namespace": "gpuops-system"},
             "stringData": {"secretId": "AKID", "secretKey": "sim"}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "spot"},
             "spec": {"provider": "sim", "endpoint": f"{cloud}/spot/v1", "minimum": 1, "maximum": 1,
                      "credentialsSecretRef": {"name": "spot-keys", "namespace": "gpuops-system"},
                      "insecureAllowHTTP": True,
                      "drainTimeoutSeconds": 5, "template": {"instanceTypes": ["sim.l4"], "gpusPerInstance": 1}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
             "metadata": {"name": "keep", "namespace": "team-a"},
             "spec": {"selector": {"matchLabels": {"team": "a"}}, "quota": {"gpuHours": "100", "windowHours": 1},
                      "enforcement": {"action": "AlertOnly"}, "accounting": {"retainFinishedPods": True}}},
            pod("long", "team-a", labels={"team": "a"}, limits={"nvidia.com/gpu": "1"}, node_group="a100"),
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "idle"},
             "spec": {"provider": "sim", "endpoint": f"{cloud}/spot/v1", "minimum": 0, "maximum": 0,
                      "credentialsSecretRef": {"name": "spot-keys", "namespace": "gpuops-system"},
                      "insecureAllowHTTP": True,
                      "template": {"instanceTypes": ["sim.l4"], "gpusPerInstance": 1}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
             "metadata": {"name": "empty", "namespace": "team-a"},
             "spec": {"selector": {"matchLabels": {"team": "nobody"}}, "quota": {"gpuHours": "1", "windowHours": 1},
                      "enforcement": {"action": "AlertOnly"}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "gng-0"},
             "spec": {"nodeName": "gng-0", "gpuCount": 1,
                      "scaleUp": {"url": f"{cloud}/power/v1/machines/gng-0/start"},
                      "scaleDown": {"url": f"{cloud}/power/v1/machines/gng-0/stop"}}},
        )
        webhook_port, probe = free_port(), free_port()
        env.cluster.server.service_endpoints[("gpuops-system", "gpuops-webhook")] = f"127.0.0.1:{webhook_port}"
        kc = await env.token_kubeconfig("operator", "gpuops-system", "gpuops-controller-manager")
        env.spawn("operator", ["run", "--kubeconfig", str(kc), "--log-format", "json", "--metrics-bind-address", "0",
                               "--health-probe-bind-address", f"127.0.0.1:{probe}", "--spotpool-resync", "2",
                               "--mig-webhook-port", str(webhook_port), "--mig-webhook-host", "127.0.0.1"])

        def live_instances() -> list[Any]:
            return [i for i in env.cluster.cloud.spot.instances.values() if i.state not in ("terminated",
                                                                                             "shutting-down")]

        async def in_use() -> bool:
            env.check_alive()
            pool = await env.get("spotpool", "spot")
            long = await env.get("pod", "long", "-n", "team-a")
            ready = ((pool or {}).get("status") or {}).get("ready") == 1
            held = OURS + "budget-accounting" in ((long or {}).get("metadata") or {}).get("finalizers", [])
            return ready and held and (long or {}).get("status", {}).get("phase") == "Running"

        await until("the pool's instance joined, the running pod holds the budget finalizer", in_use, 90)

        async def shown() -> bool:
            docs = [await env.get("spotpool", "idle"), await env.get("gpuworkloadbudget", "empty", "-n", "team-a"),
                    await env.get("gpunodegroup", "gng-0")]
            return all(((d or {}).get("status") or {}).get("observedGeneration") for d in docs)

        await until("the idle pool, the empty budget and the group written a status", shown, 30)
        # zeros are values: a pool at 0 and a budget tracking no pod show 0, not <none>
        idle = await row(env, "idle", "get", "spotpools")
        empty = await row(env, "empty", "get", "gpuworkloadbudgets", "-n", "team-a")
        assert "<none>" not in idle.values() and (idle["SIZE"], idle["READY"]) == ("0", "0"), idle
        assert "<none>" not in empty.values() and empty["PODS"] == "0", empty
        group = await row(env, "gng-0", "get", "gpunodegroups")  # no power call yet: says so
        assert (group["STATE"], group["WEBHOOK"]) == ("Off", "none"), group

        # ------------------------------------------------------------------------------------------ uninstall
        for i, cmd in enumerate(commands):
            if i == len(commands) - 1:  # the last one deletes the operator: it stops at once
                await env.stop()
            began = time.monotonic()
            code, out, err = await env.kubectl(*cmd[1:], "--timeout", "60s", check=False, cwd=ROOT)
            assert code == 0 and not err.strip(), f"{shlex.join(cmd)} -> {code}\n{out}\n{err}"
            print(f"{shlex.join(cmd)}: {time.monotonic() - began:.1f} s\n{out}")

        # ------------------------------------------------------------------------------------------ nothing left
        crds = await env.get("crd")
        assert not [c["metadata"]["name"] for c in crds["items"] if c["metadata"]["name"].endswith(".gpuops.io")]
        pods = await env.get("pods", "-A")
        assert not with_finalizers(pods["items"])
        assert not live_instances(), "a pool's instance outlived its pool"  # (its Node goes with the cloud's
        # node lifecycle once NotReady, as on a real cluster: not the operator's to delete)

        async def namespace_gone() -> bool:
            return await env.get("namespace", "gpuops-system") is None

        await until("the operator's namespace deleted", namespace_gone, 30)
