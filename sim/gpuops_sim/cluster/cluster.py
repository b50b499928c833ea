"""A whole emulated GPU cluster from a scenario: API server, machines, kubelets, scheduler, controllers, cloud.

`SimCluster` is what `gpuops sim up`, `make demo`, the benchmarks and the controller tests start. Everything
runs on one event loop; the outside world (our operator, kubectl, the cloud SDKs) reaches it only over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml

from ..apiserver import APIServer
from ..apiserver.errors import StatusError
from ..apiserver.quantity import parse_quantity
from ..apiserver.tls import ServingCert
from ..cloud import CloudOptions, CloudServer, InstanceType
from ..scenario import Fault, NodeGroup, Scenario
from ..workload import WorkloadDriver
from . import site
from .access import BUDGETS, JOBS, NAMESPACES, NODES, PODS, ClusterAccess
from .cronjobs import CronJobController, CronJobOptions
from .daemonsets import DaemonSetController, DaemonSetOptions
from .deployments import DeploymentController, DeploymentOptions
from .endpoints import EndpointsController
from .jobs import JobController, JobOptions
from .kubelet import KubeletOptions, Kubelets
from .loop import Loop
from .machines import Fleet, Machine
from .network import PodNetwork
from .nodelifecycle import NodeLifecycle, NodeLifecycleOptions
from .processes import ProcessRuntime
from .replicasets import ReplicaSetController, ReplicaSetOptions
from .scheduler import Scheduler, SchedulerOptions
from .spotagent import SpotNoticeAgent
from .statefulsets import StatefulSetController, StatefulSetOptions

log = structlog.get_logger("gpuops_sim.cluster")


def machines_of(group: NodeGroup) -> list[Machine]:
    out = []
    for i in range(group.count):
        off = i >= group.count - group.powered_off
        out.append(
            Machine(
                name=f"{group.name}-{i}",
                gpu_model=group.gpu_model,
                gpus=group.gpus_per_node,
                cpu=group.cpu,
                memory=group.memory,
                max_pods=group.max_pods,
                labels={"gpuops.io/node-group": group.name, **group.labels},
                taints=[dict(t) for t in group.taints],
                group=group.name,
                provider_id=f"sim:///onprem/{group.name}-{i}",
                state="off" if off else "on",
                boot_seconds=group.boot_seconds,
                device_plugin_seconds=group.device_plugin_seconds,
                shutdown_seconds=group.shutdown_seconds,
            )
        )
    return out


class FaultPlan(Loop):
    """Applies the scenario's faults at their offsets from the start."""

    name = "faults"

    def __init__(self, cluster: SimCluster, faults: list[Fault]) -> None:
        super().__init__()
        self.cluster = cluster
        self.faults = sorted(faults, key=lambda f: f.at)
        self.applied: list[tuple[float, str, str]] = []

    def start(self) -> None:
        now = self.clock()
        for i, f in enumerate(self.faults):
            self.at(i, now + f.at)
        super().start()

    async def step(self) -> None:
        for i in self.due():
            assert isinstance(i, int)
            f = self.faults[i]
            try:
                detail = await self.cluster.apply_fault(f)
            except Exception as e:  # a fault that cannot apply is reported, never fatal
                detail = f"failed: {e}"
            self.applied.append((f.at, f.action, detail))
            log.info("fault applied", action=f.action, target=f.target, detail=detail)


class SimCluster:
    """Start with `async with SimCluster(scenario) as c:`; `c.server.url`, `c.cloud.url`, `c.summary()`."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cloud_port: int = 0,
        workload: bool = True,
        faults: bool = True,
        tls: bool = False,
        authorization: str = "AlwaysAllow",
        manifests: Sequence[Path] = (),
        device_plugin_root: str | Path | None = None,
        hold_workload: bool = False,
        run_pods: bool = False,
        state_dir: str | Path | None = None,
    ) -> None:
        """`device_plugin_root`: MIG-capable nodes' kubelets serve device-plugin registration on
        `<root>/<node>/kubelet.sock` (where `gpuops agent --device-plugin-dir` points). `hold_workload`: the
        workload starts at `start_workload()` instead of with the cluster (once an operator is ready).
        `authorization="RBAC"`: the API server enforces RBAC on clients (serve `tls` too: kubectl sends tokens only
        over TLS); the emulated cluster's own components act as privileged users, as the control plane's do.
        `run_pods`: pods of the gpuops image run as real processes (`processes.ProcessRuntime`) on a pod network
        (`network.PodNetwork`), and the site's services (`site`) are published: what `kubectl apply -k
        manifests/emulated` needs to get a working operator. Their files go into `state_dir` (default: a fresh
        folder in /tmp, removed at the end)."""
        self.hold_workload = hold_workload
        device_plugin_root = self._init_state_dir(state_dir, run_pods, device_plugin_root)
        self.scenario = scenario
        self.manifests = list(manifests)
        self.server = APIServer(
            host,
            port,
            history_size=scenario.apiserver.history_size,
            terminated_pod_gc_threshold=scenario.apiserver.terminated_pod_gc_threshold,
            tls=tls,
            authorization=authorization,
        )
        self.fleet = Fleet()
        self._init_control_plane(scenario, device_plugin_root)
        self._init_cloud(scenario, host, cloud_port)
        self.workload = WorkloadDriver(self.access, scenario.workload, scenario.seed) if workload else None
        self.fault_plan = FaultPlan(self, scenario.faults) if faults and scenario.faults else None
        self._loops: list[Loop] = [self.kubelets, self.node_lifecycle, self.scheduler, self.jobs, self.deployments,
                                   self.replicasets]
        self._loops += [self.daemonsets, self.statefulsets, self.cronjobs]
        self.endpoints = EndpointsController(self.server)
        self._loops.append(self.endpoints)
        self.network: PodNetwork | None = None
        self.runtime: ProcessRuntime | None = None
        self._site_cert: ServingCert | None = None
        if run_pods:
            assert self.state_dir is not None and device_plugin_root is not None
            self._init_pod_runtime(self.state_dir, Path(device_plugin_root))

    def _init_state_dir(
        self, state_dir: str | Path | None, run_pods: bool, device_plugin_root: str | Path | None
    ) -> str | Path | None:
        """Pods that run as processes need a folder for their files (a fresh one unless given, removed at the
        end) and, there, the device plugins' sockets; returns the device plugin root to use."""
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self._own_state_dir = False
        if run_pods and self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="gpuops-sim-", dir="/tmp"))  # short unix socket paths
            self._own_state_dir = True
        if run_pods and device_plugin_root is None:
            assert self.state_dir is not None
            device_plugin_root = self.state_dir / "dp"
        return device_plugin_root

    def _init_control_plane(self, scenario: Scenario, device_plugin_root: str | Path | None) -> None:
        """The kubelets, scheduler, node lifecycle and workload controllers, tuned by the scenario."""
        k, s, nl = scenario.kubelet, scenario.scheduler, scenario.node_lifecycle
        self.kubelets = Kubelets(
            self.server,
            self.fleet,
            KubeletOptions(
                start_latency_seconds=k.start_latency_seconds,
                lease_seconds=k.lease_seconds,
                node_status_seconds=k.node_status_seconds,
                events=k.events,
                device_plugin_root=None if device_plugin_root is None else str(device_plugin_root),
            ),
        )
        self.scheduler = Scheduler(self.server, SchedulerOptions(scoring=s.scoring, events=s.events))
        self.node_lifecycle = NodeLifecycle(
            self.server,
            self.fleet,
            NodeLifecycleOptions(
                node_monitor_grace_seconds=nl.node_monitor_grace_seconds,
                pod_gc_orphan_seconds=nl.pod_gc_orphan_seconds,
            ),
        )
        self.jobs = JobController(self.server, JobOptions(events=k.events))
        self.deployments = DeploymentController(self.server, DeploymentOptions(events=k.events))
        self.replicasets = ReplicaSetController(self.server, ReplicaSetOptions(events=k.events))
        self.daemonsets = DaemonSetController(self.server, DaemonSetOptions(events=k.events))
        self.statefulsets = StatefulSetController(self.server, StatefulSetOptions(events=k.events))
        self.cronjobs = CronJobController(self.server, CronJobOptions(events=k.events))

    def _init_cloud(self, scenario: Scenario, host: str, cloud_port: int) -> None:
        """The cloud that sells instances, and the agent that passes its spot reclaim notices to the nodes."""
        c = scenario.cloud
        self.cloud = CloudServer(
            self.fleet,
            host=host,
            port=cloud_port,
            instance_types=[
                InstanceType(t.name, t.gpu_model, t.gpus, t.cpu, t.memory, t.capacity) for t in c.instance_types
            ],
            options=CloudOptions(
                launch_seconds=c.launch_seconds,
                boot_seconds=c.boot_seconds,
                device_plugin_seconds=c.device_plugin_seconds,
                terminate_seconds=c.terminate_seconds,
                reclaim_notice_seconds=c.reclaim_notice_seconds,
            ),
        )
        self.access = ClusterAccess(self.server, "sim-workload", component="sim-workload")
        self.spot_agent = SpotNoticeAgent(ClusterAccess(self.server, "system:node-agent", component="spot-agent"),
                                          c.notice_poll_seconds, scenario.seed)
        self.cloud.spot.notice_subscribers.append(self.spot_agent.on_notice)

    def _init_pod_runtime(self, state_dir: Path, device_plugin_root: Path) -> None:
        """Pods as real processes on a pod network, which also routes the API server's calls to Services."""
        self.network = PodNetwork(self.server, state_dir)
        self._site_cert = site.site_cert()
        self.runtime = ProcessRuntime(self.server, self.network, state_dir,
                                      device_plugin_root=device_plugin_root,
                                      ca_pem=self._site_cert.ca_pem)
        self.kubelets.runtime = self.runtime
        self.server.service_resolver = self.network.resolve_service
        self.server.pod_log_source = self.runtime.log_text
        self._loops.append(self.network)

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.server.start()
        for ns in self.scenario.namespaces:
            if self.access.get(NAMESPACES, "", ns) is None:
                await self.access.create(NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns}})
        for path in self.manifests:
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind"):
                    await self._create_once(doc)
        await self.cloud.start()  # before the objects: they may name its URL
        if self.network is not None and self._site_cert is not None:
            await site.publish(self.access, self.cloud, self.network, self._site_cert)
        for obj in self.scenario.objects:
            await self._create_once(_with_cloud_url(obj, self.cloud.url))
        for loop in self._loops:
            loop.start()
        for group in self.scenario.node_groups:
            for m in machines_of(group):
                self.fleet.add(m)
        if self.workload is not None and not self.hold_workload:
            self.workload.start()
        if self.fault_plan is not None:
            self.fault_plan.start()
        log.info("sim cluster up", scenario=self.scenario.name, apiserver=self.server.url, cloud=self.cloud.url,
                 machines=len(self.fleet.machines))

    def start_workload(self) -> None:
        """Start a held workload (idempotent)."""
        if self.workload is not None and not self.workload.running:
            self.workload.start()

    async def _create_once(self, obj: dict[str, Any]) -> None:
        try:
            await self.access.create_object(obj)
        except StatusError as e:
            if e.code != 409:
                raise

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()  # the operator's processes first, while the API still answers them
        for loop in (self.fault_plan, self.workload, *reversed(self._loops)):
            if loop is not None:
                await loop.stop()
        await self.spot_agent.stop()
        with contextlib.suppress(Exception):
            await self.cloud.stop()
        self.fleet.close()
        await self.server.stop()
        if self._own_state_dir and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | Path) -> None:
        self.server.write_kubeconfig(path)

    async def wait_ready(self, within: float = 60.0) -> bool:
        """Until every powered-on machine has a Ready Node (or the timeout)."""
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            want = {m.name for m in self.fleet.machines.values() if m.state == "on"}
            ready = {n["metadata"]["name"] for n in self.access.iter(NODES) if _node_ready(n)}
            if want <= ready:
                return True
            await asyncio.sleep(0.02)
        return False

    # ------------------------------------------------------------------------------------ faults

    def _targets(self, f: Fault, powered: bool) -> list[Machine]:
        if f.target and f.target in self.fleet.machines:
            return [self.fleet.machines[f.target]]
        group = [m for m in self.fleet.machines.values() if (f.target is None or m.group == f.target)
                 and m.powered == powered]
        return sorted(group, key=lambda m: m.name)[: f.count]

    async def apply_fault(self, f: Fault) -> str:
        if f.action == "power-off":
            names = [m.name for m in self._targets(f, True) if self.fleet.power_off(m.name)]
            return f"powered off {', '.join(names) or 'nothing'}"
        if f.action == "power-on":
            names = [m.name for m in self._targets(f, False) if self.fleet.power_on(m.name)]
            return f"powered on {', '.join(names) or 'nothing'}"
        if f.action == "delete-node":
            names = [m.name for m in self._targets(f, True)]
            for n in names:
                self.fleet.remove(n)
            return f"removed machines {', '.join(names) or 'none'}"
        if f.action == "cordon":
            names = [m.name for m in self._targets(f, True)]
            for n in names:
                await self.access.patch(NODES, "", n, {"spec": {"unschedulable": True}})
            return f"cordoned {', '.join(names) or 'nothing'}"
        if f.action == "reclaim-spot":
            tags: dict[str, str] = {}
            if f.target and "=" in f.target:
                k, _, v = f.target.partition("=")
                tags[k] = v
            ids = self.cloud.reclaim(count=f.count, tags=tags)
            return f"reclaim notices for {', '.join(ids) or 'no instance'}"
        if f.action == "apiserver-outage":
            asyncio.get_running_loop().create_task(self.server.outage(f.seconds))
            return f"API server down for {f.seconds:g} s"
        if f.action == "drop-watches":
            return f"dropped {self.server.drop_watches()} watches"
        raise ValueError(f"unknown fault action {f.action!r}")

    # ------------------------------------------------------------------------------------ reporting

    def summary(self) -> dict[str, Any]:
        """Counts a human (or a test) wants at a glance; cheap enough to call every second."""
        phases, unschedulable, gated, gpus_used = self._pod_counts()
        nodes = self._node_summaries(gpus_used)
        off = [m.name for m in self.fleet.machines.values() if m.state == "off"]
        return {
            "scenario": self.scenario.name,
            "pods": dict(phases),
            "unschedulable": unschedulable,
            "gated": gated,
            "mig_allocations": len(self.kubelets.allocations),
            "jobs": dict(self._job_counts()),
            "budgets": self._budget_summaries(),
            "nodes": sorted(nodes, key=lambda x: x["name"]),
            "machines_off": sorted(off),
            "gpus_total": sum(x["gpus"] for x in nodes if x["ready"]),
            "gpus_used": sum(gpus_used.values()),
            "submitted": self.workload.counts() if self.workload else {},
            "transitions": self.kubelets.transitions,
            "bound": self.scheduler.bound,
            "faults": [f"t={at:g}s {action}: {detail}" for at, action, detail in
                       (self.fault_plan.applied if self.fault_plan else [])],
        }

    def _pod_counts(self) -> tuple[Counter[str], int, int, Counter[str]]:
        """Pods by phase (Terminating apart), how many are unschedulable and gated, GPUs held per node."""
        phases: Counter[str] = Counter()
        unschedulable = 0
        gated = 0
        gpus_used: Counter[str] = Counter()
        for p in self.access.iter(PODS):
            st = p.get("status") or {}
            if (p.get("spec") or {}).get("schedulingGates"):
                gated += 1
            phase = st.get("phase") or "Pending"
            if p["metadata"].get("deletionTimestamp"):
                phase = "Terminating"
            phases[phase] += 1
            if phase == "Pending" and any(c.get("reason") == "Unschedulable" for c in st.get("conditions") or []):
                unschedulable += 1
            node = (p.get("spec") or {}).get("nodeName")
            if node and phase in ("Pending", "Running", "Terminating"):
                gpus_used[node] += _pod_gpus(p)
        return phases, unschedulable, gated, gpus_used

    def _node_summaries(self, gpus_used: Counter[str]) -> list[dict[str, Any]]:
        """Each Node: readiness, cordon, its machine's power, GPU model, GPUs allocatable and held, MIG slices."""
        nodes = []
        for n in self.access.iter(NODES):
            name = n["metadata"]["name"]
            alloc = (n.get("status") or {}).get("allocatable") or {}
            mig = {r[len("gpuops.io/mig-"):]: int(parse_quantity(v)) for r, v in alloc.items()
                   if r.startswith("gpuops.io/mig-") and str(v) != "0"}
            m = self.fleet.get(name)
            nodes.append({
                "name": name,
                "ready": _node_ready(n),
                "unschedulable": bool((n.get("spec") or {}).get("unschedulable")),
                "power": m.state if m else "gone",
                "model": (n["metadata"].get("labels") or {}).get("gpuops.io/gpu-model", ""),
                "gpus": int(parse_quantity(alloc.get("nvidia.com/gpu", "0"))),
                "gpus_used": gpus_used.get(name, 0),
                "mig": mig,
            })
        return nodes

    def _job_counts(self) -> Counter[str]:
        jobs: Counter[str] = Counter()
        for j in self.access.iter(JOBS):
            conds = {c.get("type") for c in (j.get("status") or {}).get("conditions") or []
                     if c.get("status") == "True"}
            jobs["complete" if "Complete" in conds else "failed" if "Failed" in conds
                 else "suspended" if "Suspended" in conds else "active"] += 1
        return jobs

    def _budget_summaries(self) -> list[dict[str, Any]]:
        """Each GPUWorkloadBudget's consumption against its quota (none before its CRD is installed)."""
        budgets: list[dict[str, Any]] = []
        if self.server.registry.by_kind("gpuops.io", "GPUWorkloadBudget") is None:
            return budgets
        for b in self.access.iter(BUDGETS):
            st, spec = b.get("status") or {}, b.get("spec") or {}
            exceeded = any(c.get("type") == "QuotaExceeded" and c.get("status") == "True"
                           for c in st.get("conditions") or [])
            budgets.append({
                "name": f"{b['metadata'].get('namespace', '')}/{b['metadata']['name']}",
                "consumed": st.get("consumedGpuHours", "-"),
                "quota": (spec.get("quota") or {}).get("gpuHours", "-"),
                "action": (spec.get("enforcement") or {}).get("action", "AlertOnly"),
                "exceeded": exceeded,
            })
        return budgets


def _node_ready(n: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (n.get("status") or {}).get("conditions") or [])


def _pod_gpus(p: dict[str, Any]) -> int:
    total = 0
    for c in (p.get("spec") or {}).get("containers") or []:
        req = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        if req:
            total += int(parse_quantity(req))
    return total


CLOUD_URL = "${SIM_CLOUD_URL}"
"""In a scenario object's strings, replaced by the emulated cloud's URL (its port is chosen at start), so a
GPUNodeGroup can point its webhooks at the cloud's power API."""


def _with_cloud_url(value: Any, url: str) -> Any:
    if isinstance(value, str):
        return value.replace(CLOUD_URL, url)
    if isinstance(value, dict):
        return {k: _with_cloud_url(v, url) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_cloud_url(v, url) for v in value]
    return value
