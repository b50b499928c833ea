"""`kubectl apply -k manifests` on an emulated cluster that enforces RBAC, then the operator and the MIG agent
run with their installed ServiceAccounts' tokens through a scenario that makes all four controllers act.

What it proves:

1. Enough: the install is valid for `kubectl apply -k` (default, strict field validation), and no request of
   our ServiceAccounts is ever refused (every authorization decision of the API server is recorded through its
   audit hook; zero 403s).
2. Not more: every request our ServiceAccounts made is kept with its authorization attributes. For each rule
   of each of our Roles and ClusterRoles, and for each verb and each resource of a rule that lists several,
   the recorded requests are authorized again by the API server's own RBAC code with exactly that rule (or
   that verb / resource) taken out, and at least one of them must then be denied. A denied recorded request
   is one this very run would have seen answered 403 - and a 403 fails this test (point 1) - so removing
   any single rule (or verb, or resource) from the manifests makes the suite fail. There is no exception: the
   scenario reaches every path our roles serve (UNREACHED below would list, with a reason, a rule only an
   unreachable path needs; it is empty):
   - the API server answers like a kube-apiserver with the WatchList feature gate off, so every informer is
     refused its streaming list and falls back to a paginated one (the `list` verbs), then watches;
   - budget: a price list's history; Evict, Pause, Gate (a pod held, then released), and an AlertOnly budget
     that goes under quota and over again (the same QuotaExceeded Event twice: the recorder patches it);
   - autoprovision: powers gng-0 on for a pending pod, then drains it (taint, evicts the CPU pod left on it)
     and powers it off; a machine the power API does not know is refused twice (WebhookFailed patched);
   - spot pool: launches an instance that joins, then scales in (cordon: nodes patch; drain: an eviction);
     a pool the CRD admits but the controller refuses says InvalidSpec twice (patched);
   - MIG slicer: webhook and slices; then the node's GPU loses its slices (MIG switched off while the agent is
     stopped): a running pod's Bound claim fails (the pod is deleted), a claim planned but not yet made fails
     (it is deleted and the pod planned again); a pod that fits nowhere changes its reason and back (its
     FailedMigAllocation Event patched); then NVIDIA's MIG manager label on the node makes the operator write
     the MigNode's ConflictDetected condition (mignodes/status patch) and a Warning Event on the Node.
   The four controllers run as four `gpuops run --controllers X` processes, each with its own token of the
   same ServiceAccount (TokenRequest gives each token an ID the audit log carries), so that each request is
   known to come from one controller: a controller's ClusterRole must allow all of that controller's
   requests on its own (with the manager's Lease Role and metrics role), and each of its rules must be
   needed by that controller - rules several controllers share (e.g. pods list/watch) are checked per role,
   where a union over all the processes would hide them. A second budget replica runs as the leader-election
   standby (it reads and watches the Lease); its requests count as the budget controller's.
3. A removal for real: with the `pods/eviction create` rule taken out of the live ClusterRoles (budget,
   autoprovision and spot pool each grant it to the one ServiceAccount), the next eviction the budget
   controller attempts is refused (a 403 in the audit log and an EvictionFailed Event): what the replay above
   predicts is what a real run sees.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import functools
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from rbac_audit import AuditLog, PolicySet, describe, edits_of, narrowed, snapshot
from waiting import until

from gpuops_sim.apiserver.auth import CREDENTIAL_ID, Attributes
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.fakenvml import FakeNVML
from gpuops_sim.scenario import load

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
KUBECTL = str(BIN / "kubectl")
GPUOPS = [str(BIN / "gpuops")] if (BIN / "gpuops").exists() else [sys.executable, "-m", "gpuops"]
MANAGER_SA = "system:serviceaccount:gpuops-system:gpuops-controller-manager"
AGENT_SA = "system:serviceaccount:gpuops-node:gpuops-mig-agent"
CONTROLLERS = ("budget", "autoprovision", "spotpool", "migslicer")
STANDBY = "budget-standby"

# Rules (or verbs/resources of rules) that only paths this scenario does not reach need: (kind, role, rule
# index, field, value) -> why. Each has the same reason in its YAML comment. None left: the scenario reaches
# every path our roles grant (see the module docstring), so every rule, verb and resource is proven needed.
UNREACHED: dict[tuple[str, str, int, str | None, str | None], str] = {}

SCENARIO = """
name: install-rbac
description: one node of each kind our controllers care about, small and fast
seed: 3
namespaces: [team-a, team-b, batch, ml]
kubelet: {startLatencySeconds: 0.2, leaseSeconds: 10}
nodeGroups:
  - {name: system, count: 1, cpu: "16", memory: 64Gi}
  - name: a100
    gpuModel: A100-80GB
    gpusPerNode: 2
    labels: {nvidia.com/mig.config: all-disabled}
    bootSeconds: 1
    devicePluginSeconds: 0.2
  - name: gng
    gpuModel: L4-24GB
    gpusPerNode: 1
    poweredOff: 1
    bootSeconds: 1
    devicePluginSeconds: 0.2
  - name: mig
    gpuModel: A100-80GB
    gpusPerNode: 1
    taints: [{key: gpuops.io/mig, value: "true", effect: NoSchedule}]
    bootSeconds: 1
    devicePluginSeconds: 0.2
cloud:
  launchSeconds: 0.5
  bootSeconds: 1
  devicePluginSeconds: 0.2
  instanceTypes:
    - {name: sim.l4, gpuModel: L4-24GB, gpus: 1, cpu: "8", memory: 32Gi, capacity: 2}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod(name: str, namespace: str, *, labels: dict[str, str], limits: dict[str, str], node_group: str | None = None,
        runtime: float | None = None, tolerations: list[dict[str, str]] | None = None,
        selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [
        {"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "resources": {"limits": limits}}]}
    if node_group or selector:
        spec["nodeSelector"] = {**({"gpuops.io/node-group": node_group} if node_group else {}), **(selector or {})}
    if tolerations:
        spec["tolerations"] = tolerations
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if runtime is not None:
        meta["annotations"] = {"sim.gpuops.io/runtime-seconds": str(runtime)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Env:
    """The cluster, kubectl as admin, and the processes this test starts (ended by their own handles)."""

    def __init__(self, cluster: SimCluster, audit: AuditLog, workdir: Path, dp_root: Path) -> None:
        self.cluster = cluster
        self.audit = audit
        self.workdir = workdir
        self.dp_root = dp_root
        self.admin = workdir / "admin.kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.credentials: dict[str, str] = {}  # process name -> its token's credential ID

    async def kubectl(self, *args: str, stdin: str | None = None, kubeconfig: Path | None = None,
                      check: bool = True, cwd: Path | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(kubeconfig or self.admin), "--cache-dir", str(self.workdir / "cache"),
            *args, stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd)
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 90)
        code = proc.returncode if proc.returncode is not None else -1
        if check and code != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({code}): {err.decode()}")
        return code, out.decode(), err.decode()

    async def apply(self, *objs: dict[str, Any]) -> None:
        await self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))

    async def get(self, *args: str) -> Any:
        code, out, _ = await self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(out) if code == 0 else None

    async def token_kubeconfig(self, name: str, namespace: str, sa: str, node: str | None = None) -> Path:
        """`kubectl create token` (TokenRequest), then a kubeconfig for it with the pod's namespace, as a
        ServiceAccount's in-cluster configuration would have. `node`: the token is bound to that Node, as the
        token the kubelet mounts into a node agent's pod names its node."""
        bound = ["--bound-object-kind", "Node", "--bound-object-name", node] if node else []
        _, token, _ = await self.kubectl("create", "token", sa, "-n", namespace, "--duration", "1h", *bound)
        token = token.strip()
        user = self.cluster.server.authn.authenticate_token(token)
        assert user is not None and user.username == f"system:serviceaccount:{namespace}:{sa}", user
        self.credentials[name] = user.extra[CREDENTIAL_ID][0]
        ca = base64.b64encode(self.cluster.server.serving_cert.ca_pem).decode()  # type: ignore[union-attr]
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "sim", "cluster": {"server": self.cluster.server.url,
                                                     "certificate-authority-data": ca}}],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "sim", "user": sa, "namespace": namespace}}]}))
        path.chmod(0o600)
        return path

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen([*GPUOPS, *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env={**os.environ, **(env or {})})
        log.close()

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited {p.returncode}: {self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                await asyncio.to_thread(p.wait, 20)
            except subprocess.TimeoutExpired:
                p.kill()


@contextlib.asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[Env]:
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(SCENARIO)
    dp_root = Path(tempfile.mkdtemp(prefix="gpuops-rbac-", dir="/tmp"))  # unix socket paths stay short
    cluster = SimCluster(load(str(scenario_file)), tls=True, authorization="RBAC", device_plugin_root=dp_root)
    # as a kube-apiserver with its WatchList feature gate off: informers are refused streaming lists, fall back to
    # a paginated list (the `list` verbs of our roles), then watch
    cluster.server.watch_list = False
    audit = AuditLog(cluster.server)
    env = Env(cluster, audit, tmp_path, dp_root)
    await cluster.start()
    try:
        cluster.write_kubeconfig(env.admin)
        yield env
    finally:
        await env.stop()
        await cluster.stop()
        shutil.rmtree(dp_root, ignore_errors=True)
        for name in env.procs:
            print(f"----- {name}.log (tail)\n{env.log(name)[-2500:]}", file=sys.stderr)


def status_of(obj: Any) -> dict[str, Any]:
    return (obj or {}).get("status") or {}


def has_condition(obj: Any, kind: str, status: str = "True") -> bool:
    return any(c.get("type") == kind and c.get("status") == status for c in status_of(obj).get("conditions") or [])


async def event_reasons(env: Env, namespace: str | None = None) -> set[str]:
    items = (await env.get("events", *(["-n", namespace] if namespace else ["-A"]))) or {"items": []}
    return {e.get("reason", "") for e in items["items"]}


def stored(env: Env, group: str, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """What the API server holds now (read in-process: polls cost no kubectl run). Read-only."""
    return [s.obj for s in env.cluster.server.store.iter((group, resource), namespace)]


def stored_one(env: Env, group: str, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    found = env.cluster.server.store.get((group, resource), namespace, name)
    return found.obj if found is not None else None


def events_about(env: Env, kind: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in stored(env, "", "events") if e.get("reason") == reason
            and (e.get("involvedObject") or {}).get("kind") == kind and e["involvedObject"].get("name") == name]


def repeated(env: Env, kind: str, name: str, reason: str, text: str = "") -> bool:
    """One Event recorded twice: created, then patched (count 2) by its controller's EventRecorder."""
    return any(int(e.get("count") or 1) >= 2 and text in e.get("message", "")
               for e in events_about(env, kind, name, reason))


def claims_of(env: Env, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    return [c for c in stored(env, "gpuops.io", "allocationclaims", namespace) if c["spec"]["podName"] == pod_name]


MIG_NODE, MIG_GPUS = "mig-0", "A100-80GB:1"


def set_mig_mode(env: Env, enabled: bool) -> None:
    """`nvidia-smi -mig 0|1` and a GPU reset on the emulated node's driver (the agent's state file): disabling drops
    every slice. Blocking (the driver's file lock): run in a thread."""
    FakeNVML.from_spec(MIG_GPUS, MIG_NODE, state_file=env.dp_root / f"{MIG_NODE}.gpus.json").set_mig_mode(0, enabled)


def stopped(pid: int) -> bool:
    """Every thread of the process is stopped (state T in /proc)."""
    try:
        return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
                   for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


@contextlib.asynccontextmanager
async def agent_frozen(env: Env) -> AsyncIterator[None]:
    """The node agent stopped (SIGSTOP) between two driver calls, then continued: what it would have done meanwhile
    it does after, against the driver as it then is. The driver's lock is held until the agent is stopped, so it
    is not stopped holding it (which would block our own driver calls)."""
    agent = env.procs["agent"]
    fd = os.open(env.dp_root / f"{MIG_NODE}.gpus.json.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        await asyncio.wait_for(asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX), 30)
        agent.send_signal(signal.SIGSTOP)

        async def is_stopped() -> bool:
            return stopped(agent.pid)

        try:
            await until("the agent stopped", is_stopped, 10)
        except BaseException:
            agent.send_signal(signal.SIGCONT)
            raise
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    try:
        yield
    finally:
        agent.send_signal(signal.SIGCONT)


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(240)
@pytest.mark.apiserver_warnings("held by GPUWorkloadBudget")
async def test_install_with_rbac_runs_every_controller_and_every_rule_is_needed(tmp_path: Path) -> None:
    started = time.monotonic()
    async with environment(tmp_path) as env:
        cloud = env.cluster.cloud.url
        # --------------------------------------------------------------------------------- install
        _, out, _ = await env.kubectl("apply", "-k", str(ROOT / "manifests"))
        assert "deployment.apps/gpuops-controller-manager created" in out, out
        assert "networkpolicy.networking.k8s.io/gpuops-controller-manager created" in out, out
        # the GPU-less variant is valid too (server-side dry run: nothing changes)
        _, out, _ = await env.kubectl("apply", "-k", str(ROOT / "manifests" / "emulated"), "--dry-run=server")
        assert "daemonset.apps/gpuops-mig-agent-emulated created (server dry run)" in out, out
        assert await env.cluster.wait_ready(30)

        # the scenario's objects, as a user applies them (before the operator: it finds them at start)
        await env.apply(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "power-token", "namespace": "gpuops-system"},
             "stringData": {"token": "sekret"}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "spot-keys", "namespace": "gpuops-system"},
             "stringData": {"secretId": "AKID", "secretKey": "sim"}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "spot"},
             "spec": {"provider": "sim", "endpoint": f"{cloud}/spot/v1", "minimum": 1, "maximum": 1,
                      "credentialsSecretRef": {"name": "spot-keys", "namespace": "gpuops-system"},
                      "insecureAllowHTTP": True,
                      "drainTimeoutSeconds": 5,
                      "template": {"instanceTypes": ["sim.l4"], "gpusPerInstance": 1,
                                   "labels": {"gpuops.io/capacity-type": "spot"},
                                   "taints": [{"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}]}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUPriceList", "metadata": {"name": "cloud"},
             "spec": {"currency": "EUR", "default": True, "fallback": {"onDemand": "2.5"}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
             "metadata": {"name": "evict", "namespace": "team-a"},
             "spec": {"selector": {"matchLabels": {"team": "a"}}, "quota": {"gpuHours": "0.0001", "windowHours": 1},
                      "enforcement": {"action": "Evict", "delaySeconds": 0},
                      "accounting": {"retainFinishedPods": True}}},
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
             "metadata": {"name": "pause", "namespace": "team-b"},
             "spec": {"selector": {"matchLabels": {"team": "b"}}, "quota": {"gpuHours": "0.0001", "windowHours": 1},
                      "enforcement": {"action": "Pause", "delaySeconds": 0}}},
            pod("hog", "team-a", labels={"team": "a"}, limits={"nvidia.com/gpu": "1"}, node_group="a100"),
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "team-b"},
             "spec": {"backoffLimit": 0, "template": {
                 "metadata": {"labels": {"team": "b"}},
                 "spec": pod("x", "team-b", labels={}, limits={"nvidia.com/gpu": "1"}, node_group="a100")["spec"]}}},
            # a CPU pod that lands on gng-0 once it is up and is still there when autoprovision drains it
            pod("filler", "batch", labels={"app": "filler"}, limits={"cpu": "100m"}, node_group="gng"),
            # a CPU pod on the spot node, evicted when the pool scales in
            pod("spot-job", "batch", labels={"app": "spot-job"}, limits={"cpu": "100m"},
                selector={"gpuops.io/capacity-type": "spot"},
                tolerations=[{"key": "gpuops.io/spot", "operator": "Exists", "effect": "NoSchedule"}]),
            # a pool the CRD admits and the controller refuses: its user data is 6145 characters (within the
            # schema's maxLength, which counts characters) but 12290 bytes, over the cloud's 12 KiB: InvalidSpec
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "broken"},
             "spec": {"provider": "sim", "endpoint": f"{cloud}/spot/v1", "minimum": 0, "maximum": 0,
                      "credentialsSecretRef": {"name": "spot-keys", "namespace": "gpuops-system"},
                      "insecureAllowHTTP": True,
                      "template": {"instanceTypes": ["sim.l4"], "gpusPerInstance": 1, "userData": "\u00e9" * 6145}}},
            # a machine the power API does not know: powering it on for its pending pod fails (HTTP 404)
            {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "ghost-0"},
             "spec": {"nodeName": "ghost-0", "gpuCount": 1, "bootTimeoutSeconds": 600,
                      "scaleUp": {"url": f"{cloud}/power/v1/machines/ghost-0/start"},
                      "scaleDown": {"url": f"{cloud}/power/v1/machines/ghost-0/stop"},
                      "template": {"labels": {"gpuops.io/node-group": "ghost"}}}},
            pod("ghost", "batch", labels={"app": "ghost"}, limits={"nvidia.com/gpu": "1"}, node_group="ghost"),
        )

        # --------------------------------------------------------------------------------- processes
        metrics_port, webhook_port, gate_port = free_port(), free_port(), free_port()
        env.cluster.server.service_endpoints[("gpuops-system", "gpuops-webhook")] = f"127.0.0.1:{webhook_port}"
        env.cluster.server.service_endpoints[("gpuops-system", "gpuops-budget-webhook")] = f"127.0.0.1:{gate_port}"
        probes: dict[str, int] = {}
        for name in CONTROLLERS:
            kc = await env.token_kubeconfig(name, "gpuops-system", "gpuops-controller-manager")
            probes[name] = free_port()
            args = ["run", "--controllers", name, "--kubeconfig", str(kc), "--log-format", "json",
                    "--health-probe-bind-address", f"127.0.0.1:{probes[name]}", "--metrics-bind-address", "0",
                    "--budget-status-refresh", "1", "--spotpool-resync", "5"]
            extra_env: dict[str, str] = {}
            if name == "budget":  # the one that leads through the Lease and serves /metrics as installed
                args += ["--leader-elect", "--leader-elect-retry-period", "0.5",
                         "--metrics-bind-address", f"127.0.0.1:{metrics_port}", "--metrics-secure",
                         "--budget-webhook-port", str(gate_port), "--budget-webhook-host", "127.0.0.1"]
            if name == "migslicer":
                args += ["--mig-webhook-port", str(webhook_port), "--mig-webhook-host", "127.0.0.1"]
            if name == "autoprovision":  # the seed's environment variables become a GPUNodeGroup at start
                extra_env = {"GPU_NODE_1_NAME": "gng-0", "GPU_NODE_1_GPU_COUNT": "1",
                             "GPU_NODE_1_SCALE_UP_ENDPOINT": f"{cloud}/power/v1/machines/gng-0/start",
                             "GPU_NODE_1_SCALE_DOWN_ENDPOINT": f"{cloud}/power/v1/machines/gng-0/stop"}
            env.spawn(name, args, extra_env)
        agent_kc = await env.token_kubeconfig("agent", "gpuops-node", "gpuops-mig-agent", node=MIG_NODE)
        (env.dp_root / MIG_NODE).mkdir(exist_ok=True)
        env.spawn("agent", ["agent", "--kubeconfig", str(agent_kc), "--node-name", MIG_NODE, "--emulated",
                            "--gpus", MIG_GPUS, "--device-plugin-dir", str(env.dp_root / MIG_NODE),
                            "--state-file", str(env.dp_root / f"{MIG_NODE}.gpus.json"), "--metrics-bind-address", "0",
                            "--health-probe-bind-address", "0", "--log-format", "json", "--heartbeat", "5"])

        async with aiohttp.ClientSession() as http:
            async def ready(name: str) -> bool:
                env.check_alive()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{probes[name]}/readyz") as r:
                        return r.status == 200
                return False

            for name in CONTROLLERS:
                await until(f"{name} ready", functools.partial(ready, name), 60)

            # a second budget replica: a standby, which reads and watches the Lease the first one holds
            kc = await env.token_kubeconfig(STANDBY, "gpuops-system", "gpuops-controller-manager")
            probes[STANDBY] = free_port()
            env.spawn(STANDBY, ["run", "--controllers", "budget", "--kubeconfig", str(kc), "--log-format", "json",
                                "--health-probe-bind-address", f"127.0.0.1:{probes[STANDBY]}",
                                "--metrics-bind-address", "0", "--leader-elect", "--leader-elect-retry-period", "0.5"])

            async def standby_watches() -> bool:
                env.check_alive()
                return any(a.verb == "watch" and a.resource == "leases"
                           for a in env.audit.of_credential(env.credentials[STANDBY]))

            await until("the standby's watch of the Lease", standby_watches, 60)

            # autoprovision: the env-seeded group, given its credentials and the template pending pods match
            await until("GPUNodeGroup from the environment", lambda: env.get("gng", "gng-0"), 30)
            await env.kubectl("patch", "gng", "gng-0", "--type", "merge", "-p", json.dumps({"spec": {
                "scaleUp": {"secretRef": {"name": "power-token", "namespace": "gpuops-system"},
                            "insecureAllowHTTP": True},
                "template": {"labels": {"gpuops.io/node-group": "gng"}},
                "scaleDownUnneededSeconds": 1, "scaleDownDelayAfterScaleUpSeconds": 0}}))
            await env.apply(pod("wake", "batch", labels={"app": "wake"}, limits={"nvidia.com/gpu": "1"},
                                node_group="gng", runtime=2))

            # migslicer: once the webhook's CA is in the configuration, a pod asks for a slice by NVIDIA's name
            async def webhook_trusted() -> bool:
                env.check_alive()
                config = await env.get("mutatingwebhookconfiguration", "gpuops-mig-slicer")
                return all((h.get("clientConfig") or {}).get("caBundle") for h in (config or {}).get("webhooks", [{}]))

            await until("the webhook's caBundle", webhook_trusted, 60)
            # the samples are valid against the installed CRDs and webhook (server-side dry run: nothing changes)
            _, out, _ = await env.kubectl("apply", "-f", str(ROOT / "manifests" / "samples"), "--dry-run=server")
            for kind in ("gpuworkloadbudget", "gpunodegroup", "spotpool", "pod/mig-inference"):
                assert kind in out, out
            mig_ok = [{"key": "gpuops.io/mig", "operator": "Exists", "effect": "NoSchedule"}]
            await env.apply(pod("infer", "ml", labels={"app": "infer"}, limits={"nvidia.com/mig-1g.10gb": "1"},
                                runtime=2, tolerations=mig_ok),
                            pod("serve", "ml", labels={"app": "serve"}, limits={"nvidia.com/mig-1g.10gb": "1"},
                                tolerations=mig_ok))
            mutated = await env.get("pod", "infer", "-n", "ml")
            assert "gpuops.io/mig-1g.10gb" in mutated["spec"]["containers"][0]["resources"]["limits"], mutated

            # --------------------------------------------------------------------------- outcomes
            async def done(what: str, probe: Callable[[], Any]) -> None:
                async def checked() -> Any:
                    env.check_alive()
                    got = probe()
                    return await got if inspect.isawaitable(got) else got
                await until(what, checked, 90)

            def phase(namespace: str, name: str) -> str | None:
                return status_of(stored_one(env, "", "pods", namespace, name)).get("phase")

            async def budget_evicted() -> bool:
                b = await env.get("gwb", "evict", "-n", "team-a")
                return has_condition(b, "QuotaExceeded") and "Evicted" in await event_reasons(env, "team-a")

            async def job_paused() -> bool:
                job = await env.get("job", "train", "-n", "team-b")
                return bool(((job or {}).get("spec") or {}).get("suspend"))

            async def machine_woken() -> bool:
                p = await env.get("pod", "wake", "-n", "batch")
                g = await env.get("gng", "gng-0")
                return status_of(p).get("phase") == "Succeeded" and bool(status_of(g).get("lastWebhook"))

            async def machine_off() -> bool:
                g = await env.get("gng", "gng-0")
                return status_of(g).get("state") in ("PoweringOff", "Off")

            async def spot_joined() -> bool:
                nodes = (await env.get("nodes", "-l", "gpuops.io/capacity-type=spot")) or {"items": []}
                return any(has_condition(n, "Ready") for n in nodes["items"])

            async def merge_patch(kind: str, name: str, patch: dict[str, Any], *ns: str) -> None:
                await env.kubectl("patch", kind, name, *ns, "--type", "merge", "-p", json.dumps(patch))

            async def budget_alert() -> None:
                """AlertOnly on the finished wake pod (its usage no longer moves): QuotaExceeded; under quota and over
                again, the same alert again (a patched Event)."""
                await done("the wake pod finished", lambda: phase("batch", "wake") == "Succeeded")
                await env.apply({"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
                                 "metadata": {"name": "alert", "namespace": "batch"},
                                 "spec": {"selector": {"matchLabels": {"app": "wake"}},
                                          "quota": {"gpuHours": "0.0001", "windowHours": 1},
                                          "enforcement": {"action": "AlertOnly", "delaySeconds": 0}}})
                await done("the budget controller alerts (QuotaExceeded)",
                           lambda: events_about(env, "GPUWorkloadBudget", "alert", "QuotaExceeded"))
                await merge_patch("gwb", "alert", {"spec": {"quota": {"gpuHours": "1000"}}}, "-n", "batch")

                def under() -> bool:
                    b = stored_one(env, "gpuops.io", "gpuworkloadbudgets", "batch", "alert") or {}
                    return has_condition(b, "QuotaExceeded", "False") and \
                        status_of(b).get("observedGeneration") == b["metadata"]["generation"]

                await done("budget alert within its raised quota", under)
                await merge_patch("gwb", "alert", {"spec": {"quota": {"gpuHours": "0.0001"}}}, "-n", "batch")
                await done("the same QuotaExceeded alert again (Event patched)",
                           lambda: repeated(env, "GPUWorkloadBudget", "alert", "QuotaExceeded"))

            async def budget_gate() -> None:
                """Gate over the finished wake pod: a new pod it selects is held (the webhook's caBundle patched, the
                pod's condition written), then released once the quota is raised (gate and annotation removed)."""
                await done("the wake pod finished", lambda: phase("batch", "wake") == "Succeeded")
                await env.apply({"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
                                 "metadata": {"name": "gate", "namespace": "batch"},
                                 "spec": {"selector": {"matchLabels": {"app": "wake"}},
                                          "quota": {"gpuHours": "0.0001", "windowHours": 1},
                                          "enforcement": {"action": "Gate", "delaySeconds": 0,
                                                          "gateHorizonMinutes": 0}}})
                await done("the Gate budget over quota", lambda: has_condition(
                    stored_one(env, "gpuops.io", "gpuworkloadbudgets", "batch", "gate"), "QuotaExceeded"))
                config = await env.get("mutatingwebhookconfiguration", "gpuops-budget-gate")
                assert config is not None
                await done("the Gate webhook's CA in its caBundle", lambda: bool(
                    ((stored_one(env, "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "",
                                 "gpuops-budget-gate") or {}).get("webhooks") or [{}])[0]
                    .get("clientConfig", {}).get("caBundle")))
                await env.apply(pod("held", "batch", labels={"app": "wake"}, limits={"nvidia.com/gpu": "1"},
                                    node_group="ghost"))
                await done("the new pod held and told why", lambda: has_condition(
                    stored_one(env, "", "pods", "batch", "held"), "gpuops.io/BudgetGate"))
                await merge_patch("gwb", "gate", {"spec": {"quota": {"gpuHours": "1000"}}}, "-n", "batch")
                await done("the held pod released", lambda: not (
                    (stored_one(env, "", "pods", "batch", "held") or {}).get("spec", {}).get("schedulingGates")))

            async def autoprovision() -> None:
                await done("autoprovision powers gng-0 on for the pending pod", machine_woken)
                # idle again: tainted, drained (the filler pod evicted), powered off
                await done("autoprovision drains the idle gng-0 and powers it off", machine_off)
                await done("the filler pod evicted by the drain", lambda: not stored_one(env, "", "pods", "batch",
                                                                                         "filler"))

            async def ghost() -> None:
                """The power API refuses ghost-0 (404): WebhookFailed. A spec change retries at once: the same
                Event again (patched)."""
                await done("WebhookFailed for ghost-0", lambda: events_about(env, "GPUNodeGroup", "ghost-0",
                                                                            "WebhookFailed"))
                await merge_patch("gng", "ghost-0", {"spec": {"priority": 1}})
                await done("the same WebhookFailed again (Event patched)",
                           lambda: repeated(env, "GPUNodeGroup", "ghost-0", "WebhookFailed"))

            async def spot_scale_in() -> None:
                await done("the spot pool's instance joins as a node", spot_joined)
                await done("spot-job runs on the spot node", lambda: phase("batch", "spot-job") == "Running")
                await merge_patch("spotpool", "spot", {"spec": {"minimum": 0, "maximum": 0}})
                # cordon (the retire taint), drain (spot-job evicted), terminate
                await done("the spot pool scales in", lambda: not stored_one(env, "", "pods", "batch", "spot-job")
                           and events_about(env, "SpotPool", "spot", "ScaleIn"))

            async def broken_pool() -> None:
                await done("InvalidSpec for pool broken", lambda: events_about(env, "SpotPool", "broken",
                                                                              "InvalidSpec"))
                await merge_patch("spotpool", "broken", {"spec": {"drainTimeoutSeconds": 60}})
                await done("the same InvalidSpec again (Event patched)",
                           lambda: repeated(env, "SpotPool", "broken", "InvalidSpec"))

            async def sliced() -> bool:
                p = await env.get("pod", "infer", "-n", "ml")
                return status_of(p).get("phase") == "Succeeded"

            def no_mig(name: str) -> bool:
                return any("MIG disabled on its GPUs" in e.get("message", "")
                           for e in events_about(env, "Pod", name, "FailedMigAllocation"))

            async def mig() -> None:
                """MIG switched off on the node's GPU (every slice gone) while the agent is stopped, after the
                allocator planned a slice for `replan` there: serve's Bound claim fails (the pod is deleted), replan's
                Pending one fails (the claim is deleted, the pod planned again). `huge` (two whole GPUs on a
                one-GPU node: can never fit) waits for a reason that changes and, with MIG back, is the first one
                again."""
                await done("the MIG pod gets a slice and runs", sliced)
                await done("serve runs on its Bound slice", lambda: phase("ml", "serve") == "Running" and any(
                    (c.get("status") or {}).get("phase") == "Bound" for c in claims_of(env, "ml", "serve")))
                async with agent_frozen(env):
                    await env.apply(pod("replan", "ml", labels={"app": "replan"}, runtime=1, tolerations=mig_ok,
                                        limits={"nvidia.com/mig-1g.10gb": "1"}),
                                    pod("huge", "ml", labels={"app": "huge"}, tolerations=mig_ok,
                                        limits={"nvidia.com/mig-7g.80gb": "2"}))
                    await done("replan's claim planned (Pending: the agent is stopped)",
                               lambda: claims_of(env, "ml", "replan"))
                    await done("huge fits nowhere", lambda: events_about(env, "Pod", "huge", "FailedMigAllocation"))
                    await asyncio.wait_for(asyncio.to_thread(set_mig_mode, env, False), 30)
                await done("serve, whose slice vanished, deleted (MigSliceLost)", lambda: not stored_one(
                    env, "", "pods", "ml", "serve") and events_about(env, "Pod", "serve", "MigSliceLost"))
                await done("replan's failed claim deleted, replan waiting for a MIG GPU", lambda: no_mig("replan"))
                await done("huge waiting for a MIG GPU", lambda: no_mig("huge"))
                await asyncio.wait_for(asyncio.to_thread(set_mig_mode, env, True), 30)
                await done("huge's first reason again (Event patched)", lambda: repeated(
                    env, "Pod", "huge", "FailedMigAllocation", "fit on no single node"))
                # NVIDIA's MIG manager acts on the node too: the MigNode says so (its status patched)
                state = "nvidia.com/mig.config.state"
                await merge_patch("node", MIG_NODE, {"metadata": {"labels": {state: "success"}}})
                await done("the MigNode's ConflictDetected and the Node's Event", lambda: has_condition(
                    stored_one(env, "gpuops.io", "mignodes", "", MIG_NODE), "ConflictDetected")
                    and events_about(env, "Node", MIG_NODE, "MigManagerOnNode"))
                await merge_patch("node", MIG_NODE, {"metadata": {"labels": {state: None}}})

            def price_history() -> bool:
                found = stored_one(env, "gpuops.io", "gpupricelists", "", "cloud") or {}
                return bool(status_of(found).get("history"))

            await asyncio.gather(
                done("the budget controller records the price list's history", price_history),
                done("the budget controller evicts over quota", budget_evicted),
                done("the budget controller pauses the Job", job_paused),
                budget_alert(), budget_gate(), autoprovision(), ghost(), spot_scale_in(), broken_pool(), mig())

            # metrics: HTTPS, and only for a token allowed to GET /metrics (TokenReview + SubjectAccessReview)
            await env.apply({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": "monitoring", "labels": {"metrics": "enabled"}}},
                            {"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": {"name": "prometheus", "namespace": "monitoring"}},
                            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                             "metadata": {"name": "prometheus-gpuops-metrics"},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                         "name": "gpuops-metrics-reader"},
                             "subjects": [{"kind": "ServiceAccount", "name": "prometheus",
                                           "namespace": "monitoring"}]})
            _, scraper, _ = await env.kubectl("create", "token", "prometheus", "-n", "monitoring")
            url = f"https://127.0.0.1:{metrics_port}/metrics"
            async with http.get(url, ssl=False, headers={"Authorization": f"Bearer {scraper.strip()}"}) as r:
                assert r.status == 200, await r.text()
                assert "workqueue_adds_total" in await r.text()
            async with http.get(url, ssl=False) as r:
                assert r.status in (401, 403)

        # ------------------------------------------------------------------------------- 1. enough
        denied = env.audit.denied([MANAGER_SA, AGENT_SA])
        assert not denied, "403s for our ServiceAccounts:\n" + "\n".join(
            f"{describe(d.attrs)}: {d.reason}" for d in denied)

        # ------------------------------------------------------------------------------- 2. not more
        installed = snapshot(env.cluster.server)
        by_process = {name: env.audit.of_credential(cred) for name, cred in env.credentials.items()}
        by_process["budget"] += by_process.pop(STANDBY)  # one controller's role covers both of its replicas
        for name, reqs in by_process.items():
            assert reqs, f"no request recorded for {name}"
        check_least_privilege(installed, by_process)
        print(f"recorded requests: { {k: len(v) for k, v in by_process.items()} }; "
              f"{time.monotonic() - started:.1f}s so far", file=sys.stderr)

        # ------------------------------------------------------------------------------- 3. for real
        # the three controllers that evict each grant it (one ServiceAccount): take it out of all three
        for role in installed:
            rules = role.get("rules") or []
            index = next((i for i, r in enumerate(rules) if r.get("resources") == ["pods/eviction"]), None)
            if role["kind"] == "ClusterRole" and index is not None:
                await env.kubectl("patch", "clusterrole", role["metadata"]["name"], "--type", "json", "-p",
                                  json.dumps([{"op": "remove", "path": f"/rules/{index}"}]))
        before = len(env.audit.decisions)
        await env.apply(pod("late", "team-a", labels={"team": "a"}, limits={"nvidia.com/gpu": "1"},
                            node_group="a100"))

        async def refused() -> bool:
            env.check_alive()
            return any(not d.allowed and d.attrs.resource == "pods" and d.attrs.subresource == "eviction"
                       and d.attrs.name == "late" and d.attrs.user.username == MANAGER_SA
                       for d in env.audit.decisions[before:])

        await until("the budget controller's eviction of 'late' refused with 403", refused, 60)
        await until("an EvictionFailed Event", lambda: _has_reason(env, "team-a", "EvictionFailed"), 30)
    assert time.monotonic() - started < 200


async def _has_reason(env: Env, namespace: str, reason: str) -> bool:
    return reason in await event_reasons(env, namespace)


def check_least_privilege(installed: list[dict[str, Any]], by_process: dict[str, list[Attributes]]) -> None:
    """Point 2 of the module docstring, against snapshots of the installed RBAC objects."""
    ours = [o for o in installed if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "gpuops"
            and o["kind"] in ("Role", "ClusterRole")]
    roles = {(o["kind"], o["metadata"]["name"]): o for o in ours}
    # granted to the manager's ServiceAccount whichever controllers it runs (Secrets: in its namespace only)
    common = [("Role", "gpuops-leader-election"), ("ClusterRole", "gpuops-metrics-auth"),
              ("Role", "gpuops-secret-reader")]
    manager_reqs = [a for name in CONTROLLERS for a in by_process[name]]
    # which recorded requests, under which grant, each role must be needed for
    scopes: dict[tuple[str, str], tuple[list[Attributes], list[tuple[str, str]]]] = {
        ("ClusterRole", f"gpuops-{name}-controller"): (by_process[name],
                                                       [("ClusterRole", f"gpuops-{name}-controller"), *common])
        for name in CONTROLLERS}
    all_manager_roles = [("ClusterRole", f"gpuops-{n}-controller") for n in CONTROLLERS] + common
    for key in common:
        scopes[key] = (manager_reqs, all_manager_roles)
    scopes[("ClusterRole", "gpuops-mig-agent")] = (by_process["agent"], [("ClusterRole", "gpuops-mig-agent")])
    # gpuops-metrics-reader is the scraper's, bound by the user: it must allow what the scrape asked
    unchecked = set(roles) - set(scopes) - {("ClusterRole", "gpuops-metrics-reader")}
    assert not unchecked, f"roles this test does not know: {unchecked}"

    problems: list[str] = []
    for key, (reqs, grant) in scopes.items():
        policy = PolicySet(narrowed(installed, grant))
        for a in policy.denied(reqs):
            problems.append(f"{key[1]} (with {grant[1:]}) does not allow {describe(a)}")
        for edit in edits_of(roles[key]):
            needed = PolicySet(narrowed(installed, grant), edit).denied(reqs)
            reason = UNREACHED.get((edit.kind, edit.role, edit.index, edit.field, edit.value))
            if not needed and reason is None:
                problems.append(f"not needed by any request: {edit}")
            if needed and reason is not None:
                problems.append(f"listed as unreached but needed by {describe(needed[0])}: {edit}")
    assert not problems, "least privilege:\n" + "\n".join(problems) + "\n\nrecorded requests:\n" + "\n".join(
        sorted({f"{name}: {describe(a)}" for name, reqs in by_process.items() for a in reqs}))
