"""The all-controllers rig of chaos/apiserver_all.py: one emulated cluster, one `gpuops run` with all four controllers.

Rig. One in-process `SimCluster`: 3 always-on 8-GPU nodes (`base`, where the budgets' pods run, pinned by a
nodeSelector), powered-off 8-GPU machines `gpu-<i>` with one GPUNodeGroup each whose webhooks are the emulated
cloud's power API, 2 MIG nodes (2 x A100-80GB, tainted) played by the in-process agent farm
(sim/gpuops_sim/migfarm.py: it answers AllocationClaims through in-process writes, so the faults are the operator's
alone), the emulated spot cloud selling 1-GPU instances to one SpotPool (tainted: nothing else runs there). The
operator is `gpuops run` (all controllers, `--mig-webhook-port 0`: MIG pods are created as the webhook leaves
them, gated) at log level INFO, whose records name every power decision, launch and eviction.

Script. `build_script(plan, seed)` is the seeded, time-scripted workload, identical for every run of one seed
(`Step`s at offsets from t0). It is chosen so that its end state does not depend on timing:
  * every pod has a whole-second runtime, so its usage from the kubelet's timestamps (whole seconds, one fixed
    wall offset) is exactly runtime x GPUs however late it started;
  * Pause and Evict budgets are pushed over quota by short pods ("phase A") that all end before the budget can
    act (quota crossed halfway through their runtime, delaySeconds past their end; the controller counts a
    running pod from its whole-second startedAt, so it may see the crossing up to 1 s early, which the margins
    allow for), then get long pods ("phase B", runtime far beyond the run) started before the action is due:
    the action always hits exactly the long ones, however late the controller acts; their usage (which depends
    on when it acts) is left out. A controller acting on a stale cache can still evict a short pod that has
    ended: the comparison then shows it (deleted-Succeeded, and its ledger usage if that is off);
  * each powered-off machine receives one wave of pods pinned to it (hostname nodeSelector), so it is powered
    on exactly once and off once, however the planner's timing falls;
  * each spot reclaim takes one running instance: exactly one replacement each.
Ground truth is read in-process (store listeners attached before the cluster starts, the cloud's own records),
never through the HTTP API under test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _autoprovision import ApRig, Call, PodSeen, _record_calls, group_body
from _budget import NS, PodLog
from _common import OnHarness, WatchFaults, pace
from _migslicer import Tracker
from _spotpool import bench

from gpuops.controllers.migslicer.api import GATE, OUR_PREFIX
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.faults import Faults
from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.budget_workload import budget, job, pod
from gpuops_sim.cloud.faults import CloudFaults
from gpuops_sim.cluster.access import BUDGETS, GROUPS, JOBS, PODS, POOLS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.demo import repo_crds
from gpuops_sim.harness import OperatorHarness, until
from gpuops_sim.migfarm import MigAgentFarm
from gpuops_sim.scenario import Scenario, parse

__all__ = ["BUDGETS", "CRDS", "FULL", "GROUPS", "POOL", "QUICK", "AllRig", "CountingFaults", "Plan", "Step",
           "build_script", "drive", "open_all_rig"]

CRDS = repo_crds()
GPU = "nvidia.com/gpu"
POOL = "spot"
MIG_TAINT = {"key": "gpuops.io/mig", "value": "true", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "gpuops.io/spot", "value": "true", "effect": "NoSchedule"}
BASE = {"gpuops.io/node-group": "base"}
MIG_NODES = ("mig-0", "mig-1")
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")
CONTROLLERS = ("budget", "autoprovision", "spotpool", "migslicer")


# ---------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Enforced:
    """A Pause or Evict budget's two phases (module docstring): offsets in seconds from t0."""

    phase_a: float
    short_pods: int
    short_runtime: int
    phase_b: float
    long_pods: int
    quota_gpu_hours: str
    delay: int


@dataclass(frozen=True)
class Plan:
    length: float
    """The scenario's length (s): the last pod ends well before it."""
    faults_from: float
    faults_until: float
    drop_every: float
    compactions: tuple[float, ...]
    storms: tuple[tuple[float, float], ...]
    """(offset, seconds) of each 429 storm."""
    storm_rate: float
    retry_after: int
    outage_at: float
    outage_seconds: float
    alert_from: float
    alert_every: float
    alert_pods: int
    alert_runtime: int
    alert_quota: str
    ap_waves: tuple[float, ...]
    """One wave of pinned pods per machine gpu-<i>, at these offsets."""
    ap_runtime: int
    boot: float
    unneeded: int
    pause: Enforced
    evict: Enforced
    mig_waves: tuple[float, ...]
    mig_pods_per_wave: int
    mig_runtime: tuple[int, int]
    spot_minimum: int
    spot_maximum: int
    notice: float
    """The spot cloud's reclaim notice (s): how long a reclaimed instance runs on after its notice."""
    reclaims: tuple[float, ...]
    resync: float
    """The operator's --spotpool-resync (s)."""
    converge_within: float
    """How long the run may take to converge once the scenario's length is over (s)."""
    error_rate: float
    """The share of HTTP requests answered 500 while the faults are on."""

    @property
    def machines(self) -> int:
        return len(self.ap_waves)


FULL = Plan(  # ten minutes of faults (t = 5 .. 595 s), the workload busy throughout
    length=600, faults_from=5, faults_until=595, error_rate=0.05, drop_every=5, compactions=(150, 420),
    storms=((90, 8), (270, 8), (480, 8)), storm_rate=0.6, retry_after=2, outage_at=210, outage_seconds=20,
    alert_from=20, alert_every=20, alert_pods=26, alert_runtime=60, alert_quota="0.2",
    ap_waves=(60, 200, 330, 480), ap_runtime=40, boot=4, unneeded=10,
    pause=Enforced(100, 4, 60, 162, 3, "0.035", 45), evict=Enforced(190, 4, 60, 252, 3, "0.035", 45),
    mig_waves=tuple(30 + 40 * i for i in range(14)), mig_pods_per_wave=3, mig_runtime=(20, 30),
    spot_minimum=3, spot_maximum=4, notice=10, reclaims=(120, 280, 420, 540), resync=10, converge_within=150)

QUICK = Plan(  # CI: both runs < 90 s on 2 cores; the informers' re-watch backoff (<= 30 s) sets the tail
    length=14, faults_from=1, faults_until=9, error_rate=0.05, drop_every=2.5, compactions=(3, 7.5),
    storms=((2, 1), (8, 1)), storm_rate=0.6, retry_after=1, outage_at=5, outage_seconds=2,
    alert_from=0.5, alert_every=1.5, alert_pods=7, alert_runtime=3, alert_quota="0.003",
    ap_waves=(1.5, 6), ap_runtime=3, boot=1.5, unneeded=2,
    pause=Enforced(1.5, 4, 3, 5.2, 2, "0.0015", 4), evict=Enforced(3, 4, 3, 6.7, 2, "0.0015", 4),
    mig_waves=(1, 4.5, 8), mig_pods_per_wave=2, mig_runtime=(2, 3),
    spot_minimum=2, spot_maximum=3, notice=1.5, reclaims=(4,), resync=3, converge_within=70)


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan a run's flags ask for: --quick is CI's."""
    return QUICK if args.quick else FULL


# ---------------------------------------------------------------------------------------------- the script


@dataclass(frozen=True)
class Step:
    at: float
    kind: str  # pod | job | reclaim
    body: dict[str, Any] = field(default_factory=dict)


def _pinned(name: str, labels: dict[str, str], runtime: int, selector: dict[str, str], gpus: int = 1
            ) -> dict[str, Any]:
    body = pod(name, labels, GPU, str(gpus), runtime)
    body["spec"]["nodeSelector"] = dict(selector)
    return body


def _mig_pod(name: str, profile: str, count: int, runtime: int) -> dict[str, Any]:
    """A MIG pod as the slicer's webhook leaves it: our resource name, gated, tolerating the MIG taint."""
    res = {OUR_PREFIX + profile: str(count)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"chaos": "mig"},
                         "annotations": {"sim.gpuops.io/runtime-seconds": str(runtime)}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": GATE}],
                     "tolerations": [{"key": MIG_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": dict(res), "requests": dict(res)}}]}}


def _enforced_steps(name: str, e: Enforced, jobs: bool) -> list[Step]:
    labels = {"budget": name}
    long_runtime = 100_000  # never ends on its own: only the budget's action stops it
    out = []
    for phase, at, count, runtime in (("a", e.phase_a, e.short_pods, e.short_runtime),
                                      ("b", e.phase_b, e.long_pods, long_runtime)):
        for i in range(count):
            body = _pinned(f"{name}-{phase}{i}", labels, runtime, BASE)
            if jobs:
                body = job(f"{name}-{phase}{i}", body, ttl=0)
                del body["spec"]["ttlSecondsAfterFinished"]  # finished Jobs and their pods stay
                out.append(Step(at, "job", body))
            else:
                out.append(Step(at, "pod", body))
    return out


def build_script(plan: Plan, seed: int) -> list[Step]:
    """The workload of the module docstring; the seed draws runtimes and MIG profiles (same for every run)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    for i in range(plan.alert_pods):
        runtime = plan.alert_runtime + rng.randint(-1, 1)
        steps.append(Step(plan.alert_from + i * plan.alert_every, "pod",
                          _pinned(f"alert-{i:02d}", {"budget": "alert"}, runtime, BASE)))
    for m, at in enumerate(plan.ap_waves):
        for j in range(rng.randint(2, 4)):
            steps.append(Step(at, "pod", _pinned(f"ap-{m}-{j}", {"budget": "ap", "chaos": "ap"},
                                                 plan.ap_runtime + rng.randint(0, 2),
                                                 {"kubernetes.io/hostname": f"gpu-{m}"}, gpus=2)))
    steps += _enforced_steps("pause", plan.pause, jobs=True)
    steps += _enforced_steps("evict", plan.evict, jobs=False)
    for w, at in enumerate(plan.mig_waves):
        for j in range(plan.mig_pods_per_wave):
            profile = rng.choice(MIG_PROFILES)
            count = 2 if profile == "1g.10gb" and rng.random() < 0.5 else 1
            steps.append(Step(at + 0.2 * j, "pod", _mig_pod(f"mig-{w:02d}-{j}", profile, count,
                                                            rng.randint(*plan.mig_runtime))))
    steps += [Step(at, "reclaim") for at in plan.reclaims]
    return sorted(steps, key=lambda s: s.at)


def budgets(plan: Plan) -> list[dict[str, Any]]:
    """alert (AlertOnly, goes over), ap (AlertOnly, stays under), pause (Pause), evict (Evict)."""
    out = [budget("alert", {"budget": "alert"}, GPU, quota=plan.alert_quota, delay=1),
           budget("ap", {"budget": "ap"}, GPU, quota="1000"),
           budget("pause", {"budget": "pause"}, GPU, quota=plan.pause.quota_gpu_hours, action="Pause",
                  delay=plan.pause.delay),
           budget("evict", {"budget": "evict"}, GPU, quota=plan.evict.quota_gpu_hours, action="Evict",
                  delay=plan.evict.delay)]
    for b in out:
        b["metadata"]["namespace"] = NS
    return out


# ---------------------------------------------------------------------------------------------- the rig


class CountingFaults(Faults):
    """The emulator's injector, counting what it answered by HTTP status (500s and 429s apart)."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self.by_code: Counter[int] = Counter()

    def check(self, verb: str, resource: str) -> None:
        try:
            super().check(verb, resource)
        except StatusError as e:
            self.by_code[e.code] += 1
            raise


def _scenario(plan: Plan) -> Scenario:
    return parse({
        "name": "chaos-all", "namespaces": [NS, "gpuops-system"],
        "kubelet": {"startLatencySeconds": 0.2, "leaseSeconds": 0.5, "nodeStatusSeconds": 5, "events": False},
        "scheduler": {"events": False},
        "nodeLifecycle": {"nodeMonitorGraceSeconds": 1.5, "podGcOrphanSeconds": 2.0},
        "nodeGroups": [
            {"name": "base", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": 3, "bootSeconds": 0.05,
             "devicePluginSeconds": 0.05},
            {"name": "gpu", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": plan.machines,
             "poweredOff": plan.machines, "bootSeconds": plan.boot, "devicePluginSeconds": 0.3,
             "shutdownSeconds": 0.3},
            {"name": "mig", "gpuModel": "A100-80GB", "gpusPerNode": 2, "count": len(MIG_NODES),
             "taints": [dict(MIG_TAINT)], "bootSeconds": 0.05, "devicePluginSeconds": 0.05},
        ],
        "cloud": {"launchSeconds": 0.5, "bootSeconds": 1.0, "devicePluginSeconds": 0.2, "terminateSeconds": 0.3,
                  "reclaimNoticeSeconds": plan.notice, "noticePollSeconds": 0.5,
                  "instanceTypes": [{"name": bench.ITYPE, "gpuModel": "L4-24GB", "gpus": 1}]},
    })


@dataclass
class AllRig(OnHarness):
    plan: Plan
    log: PodLog
    track: Tracker
    ap: ApRig
    led: Any  # bench.SpotLedger of POOL
    farm: MigAgentFarm
    faults: CountingFaults
    reclaimed: list[str] = field(default_factory=list)
    ignored: Callable[[dict[str, Any]], bool] = lambda _obj: False
    """Objects that are not the scenario's (chaos/bad_objects.py's poison): left out of `objects`, so of the
    convergence checks and the compared final state."""

    @property
    def machine_names(self) -> list[str]:
        return [f"gpu-{i}" for i in range(self.plan.machines)]

    def objects(self, gr: tuple[str, str]) -> list[dict[str, Any]]:
        return [o for o in self.cluster.access.iter(gr) if not self.ignored(o)]

    def pool(self) -> dict[str, Any]:
        return self.cluster.access.get(POOLS, "", POOL) or {}

    def pool_converged(self) -> bool:
        """At minimum: that many live instances not under notice, all Ready, the status saying so."""
        st, n = self.pool().get("status") or {}, self.plan.spot_minimum
        ready_cond = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or ())
        return (len(self.led.live()) == n and st.get("desired") == n and st.get("size") == n
                and st.get("ready") == n and st.get("pendingLaunch") is None and ready_cond
                and len([i for i in self.led.ready() if i.interruption is None]) == n)

    async def create_objects(self) -> None:
        """Budgets, groups and the pool, in-process (the driver's writes are not the operator's to fail)."""
        access = self.cluster.access
        for b in budgets(self.plan):
            await access.create_object(b)
        for m in self.machine_names:
            await access.create_object(group_body(self.cluster.cloud.url, m, 8, unneeded=self.plan.unneeded,
                                                  boot_timeout=60))
        await access.create_object(bench.pool_body(
            POOL, self.cluster.cloud.url, self.plan.spot_minimum, self.plan.spot_maximum, drainTimeoutSeconds=5,
            template={"instanceTypes": [bench.ITYPE], "taints": [dict(SPOT_TAINT)]}))

    async def wait_settled(self, within: float) -> None:
        """Before t0: every budget accounted, every group Off, the pool at its minimum."""
        async def probe() -> bool:
            return (all((b.get("status") or {}).get("computedAt") for b in self.objects(BUDGETS))
                    and all((g.get("status") or {}).get("state") == "Off" for g in self.objects(GROUPS))
                    and self.pool_converged())

        await until("budgets accounted, groups Off, the pool at its minimum", probe, within, every=0.1)

    def reclaim(self) -> None:
        ids, _ = self.cluster.cloud.spot.reclaim(count=1, tags={bench.POOL_TAG: POOL})
        self.reclaimed += ids


def _track_ap_pods(cluster: SimCluster, pods: dict[str, PodSeen]) -> None:
    """When each autoprovision pod first ran and where (for `power_report`'s "machine ran no pod")."""
    def on_pod(ev: WatchEvent) -> None:
        if ev.gr != PODS or ev.key[0] != NS or not ev.key[1].startswith("ap-"):
            return
        obj = ev.new.obj
        rec = pods.setdefault(ev.key[1], PodSeen(time.time()))
        rec.phase = (obj.get("status") or {}).get("phase") or ""
        if rec.phase in ("Running", "Succeeded") and rec.running is None:
            rec.running = time.time()
            rec.node = obj["spec"].get("nodeName") or ""

    cluster.access.listen(on_pod)


@contextlib.asynccontextmanager
async def open_all_rig(plan: Plan, seed: int, workdir: Path) -> AsyncIterator[AllRig]:
    """The rig of the module docstring, objects created and settled; the operator log copied to `workdir`."""
    cluster = SimCluster(_scenario(plan), workload=False, faults=False)
    faults = CountingFaults(seed)
    cluster.server.faults = faults
    cluster.cloud.faults = CloudFaults(seed)
    calls: list[Call] = []
    _record_calls(cluster, calls, [])
    log = PodLog(cluster)
    log.precise_kills = True
    track = Tracker(cluster)
    ap_pods: dict[str, PodSeen] = {}
    _track_ap_pods(cluster, ap_pods)
    led = bench.SpotLedger(cluster, lambda i: i.tags.get(bench.POOL_TAG) == POOL, plan.spot_minimum)
    led.attach()
    args = ("--mig-webhook-port", "0", "--spotpool-resync", f"{plan.resync:g}")
    with tempfile.TemporaryDirectory() as tmp:
        async with OperatorHarness(cluster, Path(tmp), crds=CRDS, controllers=CONTROLLERS, log_level="INFO",
                                   extra_args=args) as rig:
            farm = MigAgentFarm(cluster.access, [(n, "A100-80GB", 2) for n in MIG_NODES], heartbeat_seconds=5)
            await farm.start()
            try:
                r = AllRig(rig, plan, log, track, ApRig(rig, calls, ap_pods, []), led, farm, faults)
                await r.create_objects()
                await r.wait_settled(60)
                yield r
            finally:
                await farm.stop()
                with contextlib.suppress(OSError):
                    os.makedirs(workdir, exist_ok=True)
                    shutil.copyfile(rig.log_path, workdir / "operator.log")


async def drive(r: AllRig, script: list[Step], t0: float) -> None:
    """Play the script on its timeline (`pace`: the scenario's clock, not a wait for state)."""
    for step in script:
        await pace(t0, step.at)
        if step.kind == "pod":
            await r.cluster.access.create(PODS, NS, step.body)
        elif step.kind == "job":
            await r.cluster.access.create(JOBS, NS, step.body)
        else:
            r.reclaim()


# ---------------------------------------------------------------------------------------------- faults


@dataclass
class Faulter:
    """The faulted run's API server chaos on the plan's timeline; counts what it did."""

    r: AllRig
    watch: WatchFaults = field(init=False)
    """Drops every plan.drop_every seconds, the compactions and the outage."""
    storms: int = 0
    stopped_at: float = 0.0
    """Wall time the last fault ended."""

    def __post_init__(self) -> None:
        self.watch = WatchFaults(self.r.cluster.server, self.r.plan.drop_every)

    async def run(self, t0: float) -> None:
        p = self.r.plan
        await pace(t0, p.faults_from)
        errors = self.r.faults.add_error(500, p.error_rate)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(self.watch.drop_every(stop)), asyncio.create_task(self._outage(t0)),
                 *(asyncio.create_task(self._compact(t0, at)) for at in p.compactions),
                 *(asyncio.create_task(self._storm(t0, at, s)) for at, s in p.storms)]
        await pace(t0, p.faults_until)
        stop.set()
        await asyncio.gather(*tasks)
        self.r.faults.rules.remove(errors)
        self.stopped_at = time.time()

    async def _compact(self, t0: float, at: float) -> None:
        await pace(t0, at)
        self.watch.compact()

    async def _storm(self, t0: float, at: float, seconds: float) -> None:
        await pace(t0, at)
        p = self.r.plan
        rule = self.r.faults.add_error(429, p.storm_rate, retry_after=p.retry_after)
        await asyncio.sleep(seconds)  # the storm's length
        self.r.faults.rules.remove(rule)
        self.storms += 1

    async def _outage(self, t0: float) -> None:
        p = self.r.plan
        await pace(t0, p.outage_at)
        await self.watch.outage(p.outage_seconds)
