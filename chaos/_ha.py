"""The HA scenario's emulator child: bench/_scale_sim.py's cluster plus side-effect workloads and their records.

Runs in a spawned child process (as bench/scale.py's emulator does) so the driver's loop never competes with it;
the parent (chaos/ha_failover.py) talks to it over a Pipe. Everything here is ground truth read from the
emulator's and the emulated cloud's own records (store listeners, the cloud's request gate, its launch call),
never through the operator:

  * lease     every change of the leader-election Lease's holder (wall clock), and every status write of a
              budget, node group or spot pool (only the leader writes those): kill -> new holder -> first write;
  * power     `hx-<i>` machines that start powered off (tainted, so only this workload's 8-GPU pods, one per
              machine by nodeSelector, fit), their GPUNodeGroups scale down after 2 s idle; every start/stop
              request as the power API received it (chaos/_autoprovision.py's recorder and its definition of a
              duplicate: a new Idempotency-Key for a transition already under way) and every key the groups'
              status persisted as decided (a machine that went off has its Node marked Unknown at once: the
              scale scenario's node-lifecycle grace of 120 s would keep its group PoweringOff all run);
  * spot      bench/spotpool.py's SpotLedger over every pool; one running instance reclaimed every few seconds:
              instances created == pools x minimum + reclaimed, one creating client token per launch intent;
  * evictions `action: Evict` budgets (tiny quota, delay 1 s) whose teams get a fresh pod every few seconds;
              the API's eviction call is wrapped: successful evictions per pod uid, and the team's truth at that
              instant (over quota or not);
  * MIG       every AllocationClaim change: live claims per pod <= its one slice, no two live claims sharing a
              GPU's memory slices, claims ever made per pod;
  * accuracy  a sample of the scale budgets, half of them with accounting.retainFinishedPods: status at computedAt
              against the truth from their pods' container timestamps (chaos/_budget.py's PodRecord/PodLog
              rules, deleted pods included), and per budget the usage of its pods deleted while its stored ledger
              did not hold them (all a failover can lose: see chaos/ha_failover.py).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import msgspec
from _autoprovision import Call, _record_calls, group_body
from _budget import GPU, PodLog, PodRecord, ratio
from _scale_sim import BUDGETS, GROUPS, POOLS, Emulator, Params, budget_of, pod, quiet_child, serve
from _spotpool import bench as spot_bench

from gpuops_sim.budget_workload import MICROS, micros, truth
from gpuops_sim.cluster.access import LEASES, PODS, WatchEvent
from gpuops_sim.harness import now_us
from gpuops_sim.migfarm import CLAIMS
from gpuops_sim.scenario import Scenario

__all__ = ["HA_TAINT", "HaPlan", "child_main"]

HA_TAINT = {"key": "gpuops.io/ha-chaos", "value": "true", "effect": "NoSchedule"}
EVICT_NS = "team-000"
LIVE_CLAIM = ("Pending", "Created", "Bound")


@dataclass(frozen=True)
class HaPlan:
    """The side-effect workload (see the module docstring); times in seconds."""

    lease_name: str = "gpuops-controller-manager"
    power_machines: int = 4
    power_period: float = 14.0
    power_runtime: float = 4.0
    spot_reclaim_every: float = 6.0
    spot_notice: float = 3.0
    evict_teams: int = 3
    evict_every: float = 3.0
    evict_quota_gpu_hours: str = "0.002"
    accuracy_sample: int = 20


# ---------------------------------------------------------------------------------------------- records


@dataclass
class LeaseLog:
    """Holder changes of the Lease and operator status writes, on the wall clock (the parent kills by it)."""

    name: str
    holders: list[tuple[float, str]] = field(default_factory=list)
    writes: dict[str, list[float]] = field(default_factory=lambda: {"budget": [], "group": [], "pool": []})
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    wrote: asyncio.Event = field(default_factory=asyncio.Event)

    def on_event(self, ev: WatchEvent) -> None:
        if ev.gr == LEASES and ev.key[1] == self.name:
            holder = str(((ev.new.obj.get("spec") or {}).get("holderIdentity")) or "")
            if not self.holders or self.holders[-1][1] != holder:
                self.holders.append((time.time(), holder))
                self.changed.set()
            return
        kind = {BUDGETS: "budget", GROUPS: "group", POOLS: "pool"}.get(ev.gr)
        if kind is None or ev.type != "MODIFIED" or ev.prev is None:
            return
        if ev.new.obj.get("status") != ev.prev.obj.get("status"):
            self.writes[kind].append(time.time())
            self.wrote.set()

    @property
    def holder(self) -> str:
        return self.holders[-1][1] if self.holders else ""

    def first_write(self, after: float) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for kind, times in self.writes.items():
            i = bisect.bisect_right(times, after)
            out[kind] = times[i] if i < len(times) else None
        return out


class TeamLog(PodLog):
    """chaos/_budget.py's PodLog for the pods of chosen (namespace, team) pairs instead of one namespace."""

    def __init__(self, teams: set[tuple[str, str]]) -> None:
        self.records: dict[str, PodRecord] = {}
        self.teams = teams

    def attach(self, listen: Callable[[Callable[[WatchEvent], None]], None]) -> None:
        listen(self._on_team_event)

    def _on_team_event(self, ev: WatchEvent) -> None:
        if ev.gr != PODS:
            return
        team = (ev.new.obj["metadata"].get("labels") or {}).get("team")
        if (ev.key[0], team) not in self.teams:
            return
        at = now_us()
        obj, uid = ev.new.obj, ev.new.obj["metadata"]["uid"]
        rec = self.records.get(uid)
        if rec is None:
            rec = self.records[uid] = PodRecord(obj, at)
        rec.last = obj
        if rec.deletion_at is None and (obj["metadata"].get("deletionTimestamp") or ev.type == "DELETED"):
            rec.deletion_at = at
        if ev.type == "DELETED":
            rec.gone_at = at

    def team_truth(self, ns: str, team: str, at: int) -> Fraction:
        """Exact GPU-hours of the team's pods up to `at` (µs)."""
        pods = [self.final_state(r) for r in self.records.values()
                if r.last["metadata"].get("namespace") == ns
                and (r.last["metadata"].get("labels") or {}).get("team") == team
                and all(GPU in ((c.get("resources") or {}).get("limits") or {})  # MIG pods: not this resource
                        for c in r.last["spec"]["containers"])]
        out: Fraction = truth(pods, GPU, at)
        return out


@dataclass
class ClaimCheck:
    """MIG invariants on every claim change: each pod asks one slice; live claims never overlap on a GPU."""

    live_by_pod: dict[str, set[str]] = field(default_factory=dict)
    live_by_gpu: dict[tuple[str, str], dict[str, tuple[int, int]]] = field(default_factory=dict)
    ever_by_pod: dict[str, set[str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    max_live_per_pod: int = 0

    def on_event(self, ev: WatchEvent) -> None:
        if ev.gr != CLAIMS:
            return
        obj = ev.new.obj
        uid, spec = obj["metadata"]["uid"], obj.get("spec") or {}
        pod_uid, gpu = str(spec.get("podUID") or ""), (str(spec.get("nodeName") or ""), str(spec.get("gpuUUID") or ""))
        live = ev.type != "DELETED" and str((obj.get("status") or {}).get("phase") or "Pending") in LIVE_CLAIM
        self.ever_by_pod.setdefault(pod_uid, set()).add(uid)
        mine, on_gpu = self.live_by_pod.setdefault(pod_uid, set()), self.live_by_gpu.setdefault(gpu, {})
        if not live:
            mine.discard(uid)
            on_gpu.pop(uid, None)
            return
        start, size = int(spec.get("start") or 0), int(spec.get("size") or 0)
        for other, (s, n) in on_gpu.items():
            if other != uid and s < start + size and start < s + n:
                self.violations.append(f"claims {other} and {uid} share memory slices of {gpu[0]}/{gpu[1][:8]}")
        mine.add(uid)
        on_gpu[uid] = (start, size)
        self.max_live_per_pod = max(self.max_live_per_pod, len(mine))
        if len(mine) > 1:
            self.violations.append(f"pod {pod_uid} holds {len(mine)} live claims for one slice")


@dataclass
class EvictLog:
    """Successful evictions per pod uid, and whether the pod's team was over quota (truth) at that instant."""

    teams: TeamLog
    quota: Fraction
    success: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: int = 0
    not_over: list[str] = field(default_factory=list)
    other: int = 0  # evictions of pods outside the Evict teams (drains)

    def wrap(self, api: Any, get: Callable[[str, str], dict[str, Any] | None]) -> None:
        inner = api.evict

        async def evict(namespace: str, name: str, body: Any, ctx: Any) -> dict[str, Any]:
            obj = get(namespace, name)
            meta = (obj or {}).get("metadata") or {}
            team = str((meta.get("labels") or {}).get("team") or "")
            ours = (namespace, team) in self.teams.teams
            over = self.teams.team_truth(namespace, team, now_us()) >= self.quota if ours else True
            try:
                out: dict[str, Any] = await inner(namespace, name, body, ctx)
            except Exception:
                self.refused += 1
                raise
            if not ours:
                self.other += 1
                return out
            self.success[str(meta.get("uid") or name)] += 1
            if not over:
                self.not_over.append(f"{namespace}/{name}")
            return out

        api.evict = evict


# ---------------------------------------------------------------------------------------------- the child


class HaEmulator(Emulator):
    """bench/_scale_sim.py's Emulator with the `hx` machines and every recorder of the module docstring."""

    def __init__(self, p: Params, plan: HaPlan) -> None:
        self.plan = plan
        super().__init__(p)
        access = self.cluster.access
        self.lease = LeaseLog(plan.lease_name)
        access.listen(self.lease.on_event)
        self.calls: list[Call] = []
        _record_calls(self.cluster, self.calls, [])
        self.decided: dict[str, tuple[str, str]] = {}  # key -> (machine, direction) as persisted in status
        access.listen(self._on_group)
        self.led = spot_bench.SpotLedger(self.cluster, lambda i: spot_bench.POOL_TAG in i.tags, 0)
        self.led.attach()
        self.reclaimed: list[str] = []
        self.claims = ClaimCheck()
        access.listen(self.claims.on_event)
        self.evict_teams = {(EVICT_NS, f"ev-{i}") for i in range(plan.evict_teams)}
        self.sample = self._sample_budgets()
        self.retain = set(self.sample[::2])  # half the sample keeps finished pods until accounted (finalizer)
        self.truth_log = TeamLog(self.evict_teams | set(self.sample))
        self.truth_log.attach(access.listen)
        self.evictions = EvictLog(self.truth_log, Fraction(plan.evict_quota_gpu_hours))
        self.evictions.wrap(self.cluster.server.api, lambda ns, n: access.get(PODS, ns, n))
        self.created: collections.Counter[str] = collections.Counter()
        self.power_pods: dict[str, dict[str, Any]] = {}
        access.listen(self._on_power_pod)
        self.unrecorded: dict[tuple[str, str], float] = collections.defaultdict(float)  # budget -> GPU-s
        access.listen(self._on_sample_delete)
        self.tasks: list[asyncio.Task[Any]] = []
        self.background: set[asyncio.Task[Any]] = set()
        self.cluster.fleet.subscribe(self._on_machine)

    async def stop(self) -> None:
        """Its workload's and recorders' tasks first, then the emulator."""
        for t in (*self.tasks, *self.background):
            t.cancel()
        await super().stop()

    def _on_machine(self, m: Any, event: str) -> None:
        """An hx machine that went off has its Node marked Unknown at once, the write the node lifecycle
        controller makes once its grace (120 s in the scale scenario) passes, so its group can go Off and be
        powered on again within the run (chaos/_autoprovision.py's rig uses a 1 s grace for the same reason)."""
        if event == "off" and m.name.startswith("hx-"):
            task = asyncio.get_running_loop().create_task(self.cluster.node_lifecycle._mark_unknown(m.name))
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    def scenario(self) -> Scenario:
        sc = super().scenario()
        base = sc.node_groups[0]
        hx = msgspec.structs.replace(base, name="hx", count=self.plan.power_machines,
                                     powered_off=self.plan.power_machines, taints=[dict(HA_TAINT)],
                                     boot_seconds=2.0, device_plugin_seconds=0.5, shutdown_seconds=1.0)
        return msgspec.structs.replace(sc, node_groups=[*sc.node_groups, hx])

    def _sample_budgets(self) -> list[tuple[str, str]]:
        n = self.size.budgets
        step = max(1, n // max(1, self.plan.accuracy_sample))
        return [budget_of(i) for i in range(0, n, step)][: self.plan.accuracy_sample]

    def _on_sample_delete(self, ev: WatchEvent) -> None:
        """GPU-s of a sampled budget's pod deleted while the budget's stored ledger did not hold it: what the
        budget may lose if no replica's controller saw the deletion (the reconciler's documented bound; with
        retainFinishedPods only pods deleted before any leader added the finalizer, e.g. within a failover)."""
        if ev.gr != PODS or ev.type != "DELETED":
            return
        meta = ev.new.obj["metadata"]
        key = (ev.key[0], str((meta.get("labels") or {}).get("team") or ""))
        rec = self.truth_log.records.get(meta["uid"])
        if key not in self.sample or rec is None:
            return
        st = (self.cluster.access.get(BUDGETS, *key) or {}).get("status") or {}
        if any(e.get("uid") == meta["uid"] for e in ((st.get("ledger") or {}).get("entries") or ())):
            return
        if all(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in rec.last["spec"]["containers"]):
            self.unrecorded[key] += float(truth([PodLog.final_state(rec)], GPU, now_us()) * 3600)

    def _on_group(self, ev: WatchEvent) -> None:
        if ev.gr != GROUPS or not ev.key[1].startswith("hx-"):
            return
        tr = (ev.new.obj.get("status") or {}).get("transition") or {}
        if tr.get("key") and tr["key"] not in self.decided:
            # "up" is PendingTransition.direction's default, which the operator's encoder omits
            self.decided[tr["key"]] = (ev.key[1], str(tr.get("direction") or "up"))

    # ------------------------------------------------------------------------------------ objects

    async def create_ha_objects(self) -> None:
        """The hx machines' groups (idle 2 s -> off), the Evict budgets, retainFinishedPods on half the sample."""
        for ns, name in sorted(self.retain):
            await self.cluster.access.patch(BUDGETS, ns, name, {"spec": {"accounting": {"retainFinishedPods": True}}})
        for i in range(self.plan.power_machines):
            body = group_body(self.cluster.cloud.url, f"hx-{i}", 8, boot_timeout=60, unneeded=2)
            body["spec"]["template"]["taints"] = [dict(HA_TAINT)]
            await self.cluster.access.create_object(body)
        for ns, team in sorted(self.evict_teams):
            await self.cluster.access.create_object({
                "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
                "metadata": {"name": team, "namespace": ns},
                "spec": {"selector": {"matchLabels": {"team": team}},
                         "quota": {"gpuHours": self.plan.evict_quota_gpu_hours, "windowHours": 1},
                         "enforcement": {"action": "Evict", "delaySeconds": 1}}})

    # ------------------------------------------------------------------------------------ workloads

    def start_workload(self, seconds: float) -> None:
        self.tasks = [asyncio.create_task(self.churn(seconds, 10.0)),
                      asyncio.create_task(self._power(seconds)),
                      asyncio.create_task(self._spot(seconds)),
                      asyncio.create_task(self._evict(seconds))]

    async def _every(self, period: float, seconds: float, offset: float, act: Callable[[int], Any]) -> None:
        t0 = time.monotonic()
        n = 0
        while (due := t0 + offset + n * period) < t0 + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await act(n)
            n += 1

    async def _power(self, seconds: float) -> None:
        """One 8-GPU pod per hx machine every power_period, the machines staggered over the period."""
        k = self.plan.power_machines

        async def one(i: int) -> None:
            async def act(n: int) -> None:
                body = pod(f"p-{i}-{n:04d}", EVICT_NS, "ha-power", self.plan.power_runtime)
                res = {GPU: "8"}
                body["spec"]["containers"][0]["resources"] = {"limits": res, "requests": res}
                body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": f"hx-{i}"}
                body["spec"]["tolerations"].append({"key": HA_TAINT["key"], "operator": "Exists",
                                                    "effect": "NoSchedule"})
                await self.cluster.access.create(PODS, EVICT_NS, body)
                self.created["power"] += 1

            await self._every(self.plan.power_period, seconds, i * self.plan.power_period / k, act)

        await asyncio.gather(*(one(i) for i in range(k)))

    async def _spot(self, seconds: float) -> None:
        """A running, not yet noticed pool instance reclaimed every spot_reclaim_every (oldest first)."""
        async def act(_n: int) -> None:
            ready = sorted((i for i in self.led.ready() if i.interruption is None), key=lambda i: i.launch_time)
            if ready:
                self.reclaimed += self.cluster.cloud.reclaim([ready[0].id], notice_seconds=self.plan.spot_notice)

        await self._every(self.plan.spot_reclaim_every, seconds, self.plan.spot_reclaim_every, act)

    async def _evict(self, seconds: float) -> None:
        async def act(n: int) -> None:
            for ns, team in sorted(self.evict_teams):
                await self.cluster.access.create(PODS, ns, pod(f"e-{team}-{n:04d}", ns, team, 3600.0))
                self.created["evict"] += 1

        await self._every(self.plan.evict_every, seconds, 0.0, act)

    def _on_power_pod(self, ev: WatchEvent) -> None:
        """Finished power pods go (as churn pods do), so the machines' groups see them idle; each pod's times
        (created, bound, running, finished: s after creation) and its machine's state when it was bound."""
        if ev.gr != PODS or not ev.key[1].startswith("p-"):
            return
        obj, now = ev.new.obj, time.monotonic()
        rec = self.power_pods.setdefault(ev.key[1], {"created": now})
        node = (obj.get("spec") or {}).get("nodeName")
        if node and "bound" not in rec:
            m = self.cluster.fleet.machines.get(node)
            rec["bound"], rec["machine_at_bind"] = round(now - rec["created"], 2), m.state if m else "?"
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" and "running" not in rec:
            rec["running"] = round(now - rec["created"], 2)
        if phase in ("Succeeded", "Failed") and "finished" not in rec:
            rec["finished"] = round(now - rec["created"], 2)
            self.rec.to_delete.append((now + 0.5, *ev.key))

    # ------------------------------------------------------------------------------------ the end

    def settled(self) -> dict[str, bool]:
        """What must hold before the side effects are judged: the workload's results all came about."""
        pods = list(self.cluster.access.iter(PODS, EVICT_NS))
        power_pods = [p for p in pods if p["metadata"]["name"].startswith("p-")]
        evict_running = [p for p in pods if p["metadata"]["name"].startswith("e-")  # Evict takes running pods
                         and (p.get("status") or {}).get("phase") == "Running"]
        machines = [m for n, m in self.cluster.fleet.machines.items() if n.startswith("hx-")]
        pools = list(self.cluster.access.iter(POOLS))
        live = self.led.live(noticed=True)
        return {
            "power_pods_done": not power_pods,
            "machines_off": all(m.state == "off" for m in machines),
            "evict_pods_running_gone": not evict_running,
            "spot_converged": len(live) == len(pools) and all(i.interruption is None for i in live)
            and all(((p.get("status") or {}).get("pendingLaunch")) is None for p in pools),
        }

    async def settle(self, within: float) -> dict[str, Any]:
        for t in self.tasks:
            with contextlib.suppress(Exception):
                await t
        t0 = time.monotonic()
        first: dict[str, float] = {}
        while time.monotonic() < t0 + within:
            state = self.settled()
            for k, v in state.items():
                if v:
                    first.setdefault(k, round(time.monotonic() - t0, 1))
            if all(state.values()):
                break
            await asyncio.sleep(0.2)
        churn = self.tasks[0].result() if self.tasks and not self.tasks[0].cancelled() else {}
        return {"settled": state, "settled_after_seconds": first, "churn": {k: v for k, v in churn.items()
                                            if k not in ("budget_latencies", "mig_ungate_latencies")},
                "power": self.power_report(), "spot": self.spot_report(), "evict": self.evict_report(),
                "mig": self.mig_report(), "accuracy": self.accuracy(), "created": dict(self.created),
                "power_pods": self.power_pods}

    def power_report(self) -> dict[str, Any]:
        """chaos/_autoprovision.py's power_report over the hx machines, with the decided keys read from the
        groups' status (what the operator persisted before sending) instead of its log."""
        ups = collections.Counter(m for m, d in self.decided.values() if d == "up")
        downs = collections.Counter(m for m, d in self.decided.values() if d == "down")
        mine = [c for c in self.calls if c.machine.startswith("hx-")]
        dups = [c for c in mine if c.new_key and ((c.op == "start" and c.state_before in ("booting", "on"))
                                                 or (c.op == "stop" and c.state_before in ("shutting-down", "off")))]
        machines = {n: m for n, m in self.cluster.fleet.machines.items() if n.startswith("hx-")}
        problems = [f"{c.machine}: new key {c.key} for a {c.op} while {c.state_before}" for c in dups]
        problems += [f"{c.machine}: key {c.key} sent but never persisted as decided" for c in mine
                     if c.key not in self.decided]
        for n, m in machines.items():
            starts = {c.key for c in mine if c.machine == n and c.op == "start"}
            stops = {c.key for c in mine if c.machine == n and c.op == "stop"}
            if m.power_cycles > ups[n] or len(starts) > ups[n] or len(stops) > downs[n]:
                problems.append(f"{n}: {m.power_cycles} power cycles, {len(starts)}/{len(stops)} start/stop keys "
                                f"for {ups[n]}/{downs[n]} decisions")
        return {"requests": len(mine), "replayed": sum(1 for c in mine if c.replayed),
                "power_on_decisions": sum(ups.values()), "power_off_decisions": sum(downs.values()),
                "power_cycles": sum(m.power_cycles for m in machines.values()),
                "stops_done": sum(1 for c in mine if c.op == "stop" and c.new_key and 200 <= c.status < 300),
                "duplicates": len(dups), "problems": problems[:20], "problem_count": len(problems)}

    def spot_report(self) -> dict[str, Any]:
        pools = list(self.cluster.access.iter(POOLS))
        minimum = sum(int((p.get("spec") or {}).get("minimum") or 0) for p in pools)
        created_tokens = {c.token for c in self.led.launches if c.created}
        intents = sum(int((p.get("status") or {}).get("launchSequence") or 0) for p in pools)
        needed = minimum + len(self.reclaimed)
        created = self.led.created()
        return {"pools": len(pools), "reclaimed": len(self.reclaimed), "needed": needed, "created": created,
                "duplicates": max(0, created - needed), "missing": max(0, needed - created),
                "tokens_creating": len(created_tokens), "launch_intents": intents,
                "launch_calls": len(self.led.launches), "replayed_calls": sum(1 for c in self.led.launches
                                                                              if not c.created)}

    def evict_report(self) -> dict[str, Any]:
        ev = self.evictions
        return {"pods_created": self.created["evict"], "evicted_pods": len(ev.success),
                "evictions": sum(ev.success.values()), "duplicates": sum(n - 1 for n in ev.success.values() if n > 1),
                "not_over_quota": len(ev.not_over), "not_over_quota_pods": ev.not_over[:10],
                "refused_calls": ev.refused, "other_evictions": ev.other}

    def mig_report(self) -> dict[str, Any]:
        c = self.claims
        ever = [len(v) for v in c.ever_by_pod.values()]
        return {"pods_with_claims": len(ever), "claims": sum(ever), "doubled": sum(1 for n in ever if n > 1),
                "max_live_claims_per_pod": c.max_live_per_pod, "violations": len(c.violations),
                "violation_samples": c.violations[:10],
                "claims_created_by_farm": self.farm.claims_created if self.farm else 0}

    def accuracy(self) -> list[dict[str, Any]]:
        """Each sampled budget's status at its computedAt against the truth at that instant."""
        out = []
        for ns, name in self.sample:
            st = (self.cluster.access.get(BUDGETS, ns, name) or {}).get("status") or {}
            if not st.get("computedAt"):
                out.append({"budget": f"{ns}/{name}", "retain": (ns, name) in self.retain, "accuracy": 0.0,
                            "missing": True, "delta_gpu_seconds": 0.0, "loss_bound_gpu_seconds": 0.0})
                continue
            at = micros(st["computedAt"])
            want = self.truth_log.team_truth(ns, name, at)
            got = Fraction(st.get("consumedGpuHours") or "0")
            out.append({"budget": f"{ns}/{name}", "retain": (ns, name) in self.retain, "accuracy": ratio(got, want),
                        "delta_gpu_seconds": round(float((got - want) * 3600), 3),
                        "loss_bound_gpu_seconds": round(self.unrecorded[(ns, name)], 3),
                        "age_seconds": round((now_us() - at) / MICROS, 1), "truth_gpu_hours": float(want)})
        return out


async def _wait_holder(emu: HaEmulator, not_holder: str, within: float) -> dict[str, Any]:
    """Until the Lease names a holder other than `not_holder` (and not empty)."""
    deadline = time.monotonic() + within
    while not (emu.lease.holder and emu.lease.holder != not_holder):
        emu.lease.changed.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return {"at": None, "holder": emu.lease.holder}
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(emu.lease.changed.wait(), left)
    return {"at": emu.lease.holders[-1][0], "holder": emu.lease.holder}


async def _first_write(emu: HaEmulator, after: float, within: float) -> dict[str, Any]:
    """The first operator status write (any kind) after `after`, per kind what there is by then."""
    deadline = time.monotonic() + within
    while not any(v is not None for v in emu.lease.first_write(after).values()):
        emu.lease.wrote.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(emu.lease.wrote.wait(), left)
    return emu.lease.first_write(after)


async def _command(emu: HaEmulator, msg: tuple[Any, ...]) -> tuple[str, Any]:
    kind = msg[0]
    if kind == "status":
        return "status", emu.status()
    if kind == "holder":
        return "holder", {"holder": emu.lease.holder, "history": emu.lease.holders}
    if kind == "wait_holder":
        return "holder", await _wait_holder(emu, str(msg[1]), float(msg[2]))
    if kind == "first_write":
        return "write", await _first_write(emu, float(msg[1]), float(msg[2]))
    if kind == "start":
        emu.start_workload(float(msg[1]))
        return "started", {"at": time.time()}
    if kind == "accuracy":
        return "accuracy", emu.accuracy()
    if kind == "settle":
        return "settled", await emu.settle(float(msg[1]))
    raise ValueError(f"unknown command {kind!r}")


async def _serve(conn: Any, p: Params, plan: HaPlan) -> None:
    emu = HaEmulator(p, plan)

    async def answer(msg: Any) -> tuple[str, Any] | None:
        return None if msg[0] == "stop" else await _command(emu, msg)

    await serve(conn, emu, answer, prepare=emu.create_ha_objects)


def child_main(conn: Any, p: Params, plan: HaPlan) -> None:
    """The child process's entry point (multiprocessing target)."""
    quiet_child()
    asyncio.run(_serve(conn, p, plan))
