"""HA failover under the scale load: two `gpuops run --leader-elect` replicas, the leader killed -9 over
and over.

Cluster: bench/scale.py's emulator child (bench/_scale_sim.py, at `--fraction` of 5,000 GPU nodes, 100,000 pods,
1,000 budgets, 200 node groups, 50 spot pools, 500 MIG nodes; churn of 200 pod events/s with 2% gated MIG pods
placed through the agent farm), extended by chaos/_ha.py with side effects that must happen across the kills:
powered-off `hx` machines and bursts of 8-GPU pods that only fit on them (power-on/off webhooks), a spot
instance reclaimed every few seconds (replacement launches), `action: Evict` budgets whose teams get a pod every
few seconds while over quota (evictions), and the churn's MIG pods (slices claimed).

Replicas: two `gpuops run --leader-elect` (all controllers, each its own metrics/probe ports, same kubeconfig;
identities are hostname_uuid, so distinct per process). Every `--kill-interval` s the Lease's holder (read from
the emulator's store) is killed with SIGKILL and a replacement is started at once, so two replicas exist again;
the next kill waits for the surviving standby to be ready (informers synced), with a deadline.

Figures per kill: kill -> the Lease names another holder (takeover), kill -> the first status write of a budget,
node group or spot pool after that (only the leader writes those), whether the new leader was the warm standby.
Duplicates per kind, from the emulator's and the emulated cloud's records (chaos/_ha.py): power transitions (a
new Idempotency-Key for a transition already under way), spot instances created beyond need or creating tokens
beyond launch intents, pods evicted twice or while their team was not over quota, MIG pods with more than one
claim or live claims sharing a slice. Budget accuracy: a sample of budgets, status at computedAt vs the truth.
Pass: every duplicate 0, every side-effect kind happened, every takeover <= lease duration + retry period,
accuracy >= 0.999 for the sample, the side effects settled.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

for _p in (Path(__file__).resolve().parents[1] / "bench", Path(__file__).resolve().parent):  # chaos/ first:
    while str(_p) in sys.path:  # `_common` is chaos's (the spawned child runs this file's top again)
        sys.path.remove(str(_p))
    sys.path.insert(0, str(_p))
from _budget import TARGET  # noqa: E402 (the path order above first)
from _common import figures_table, write_results  # noqa: E402
from _ha import HaPlan, child_main  # noqa: E402
from _scale_sim import EmulatorProcess, Params, size_of  # noqa: E402

from gpuops_sim.harness import free_port  # noqa: E402

NAME = "ha_failover"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setup:
    fraction: float
    kills: int
    interval: float
    lease: float
    renew: float
    retry: float
    events_per_s: float
    plan: HaPlan

    @property
    def bound(self) -> float:
        """The takeover bound judged: lease duration + retry period."""
        return self.lease + self.retry


def setup_of(args: argparse.Namespace) -> Setup:
    if args.quick:
        plan = HaPlan(power_machines=3, power_period=9.0, power_runtime=2.0, spot_reclaim_every=5.0,
                      spot_notice=2.0, evict_teams=2, evict_every=2.0, accuracy_sample=10)
        # churn per budget as at full size (200 events/s over 1,000 budgets) x 2.5: the 20 budgets see what 1,000
        # do, and the emulator has room for the three replicas on 2 cores
        return Setup(args.fraction or 0.02, args.kills or 3, args.kill_interval or 14.0, args.lease_duration or 6.0,
                     4.0, 1.0, 10.0, plan)
    return Setup(args.fraction or 1.0, args.kills or 10, args.kill_interval or 60.0, args.lease_duration or 15.0,
                 10.0, 2.0, 200.0, HaPlan())


# ---------------------------------------------------------------------------------------------- processes


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_until(what: str, probe: Any, within: float, every: float = 0.1) -> float:
    """Until `probe()` is true; returns the wall-clock instant (TimeoutError after `within`)."""
    deadline = time.monotonic() + within
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:g} s")
        time.sleep(every)
    return time.time()


@dataclass
class Replica:
    """One `gpuops run --leader-elect` process."""

    n: int
    proc: subprocess.Popen[bytes]
    log: Path
    metrics: str
    probe: str
    started: float
    ready_at: float | None = None
    errors: float = 0.0
    killed_at: float | None = None

    def ready(self) -> bool:
        if self.ready_at is None and self.proc.poll() is None and http_get(f"{self.probe}/readyz", 2)[0] == 200:
            self.ready_at = time.time()
        return self.ready_at is not None

    def holds(self, identity: str) -> bool:
        """Whether this process logged acquiring the lease as `identity` (identities are hostname_uuid)."""
        return bool(identity) and f'"{identity}"' in self.log.read_text(errors="replace")

    def scrape_errors(self) -> None:
        code, text = http_get(f"{self.metrics}/metrics", 10)
        if code == 200:
            self.errors = sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                              if line.startswith("controller_runtime_reconcile_errors_total"))


@dataclass
class Fleet:
    kubeconfig: str
    workdir: Path
    s: Setup
    replicas: list[Replica] = field(default_factory=list)

    def spawn(self) -> Replica:
        n = len(self.replicas)
        m, p = free_port(), free_port()
        log = self.workdir / f"replica-{n}.log"
        cmd = [sys.executable, "-m", "gpuops", "run", "--kubeconfig", self.kubeconfig, "--leader-elect",
               "--leader-elect-lease-duration", f"{self.s.lease:g}", "--leader-elect-renew-deadline",
               f"{self.s.renew:g}", "--leader-elect-retry-period", f"{self.s.retry:g}",
               "--metrics-bind-address", f"127.0.0.1:{m}", "--health-probe-bind-address", f"127.0.0.1:{p}",
               "--mig-webhook-port", "0", "--log-level", "INFO", "--log-format", "json"]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        r = Replica(n, proc, log, f"http://127.0.0.1:{m}", f"http://127.0.0.1:{p}", time.time())
        self.replicas.append(r)
        return r

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.killed_at is None and r.proc.poll() is None]

    def top_up(self) -> list[dict[str, Any]]:
        """Replace replicas that exited on their own (a leader that lost its lease exits 1, by design), as the
        Deployment's ReplicaSet would; returns what exited."""
        gone = [r for r in self.replicas if r.killed_at is None and r.proc.poll() is not None]
        for r in gone:
            r.killed_at = time.time()
            self.spawn()
        return [{"replica": r.n, "exit_code": r.proc.returncode} for r in gone]

    def holder_of(self, identity: str, within: float = 10.0) -> Replica:
        found: list[Replica] = []

        def probe() -> bool:
            found[:] = [r for r in self.alive() if r.holds(identity)]
            return bool(found)

        wait_until(f"a replica logging lease holder {identity}", probe, within, 0.2)
        return found[0]

    def stop(self) -> None:
        for r in self.alive():
            r.scrape_errors()
            r.proc.send_signal(signal.SIGTERM)
        for r in self.replicas:
            try:
                r.proc.wait(60)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait(10)


# ---------------------------------------------------------------------------------------------- the run


def one_kill(child: EmulatorProcess, fleet: Fleet, k: int) -> dict[str, Any]:
    """Kill -9 the Lease's holder, start a replacement, measure the takeover and the first write after it."""
    s = fleet.s
    exited = fleet.top_up()
    got = child.ask(("wait_holder", "", 3 * s.lease + 30), "holder", 3 * s.lease + 60)  # a leader to kill
    holder = str(got["holder"])
    leader = fleet.holder_of(holder, 3 * s.lease + 30)
    standbys = [r for r in fleet.alive() if r is not leader]
    wait_until("the standby ready (informers synced)", lambda: all(r.ready() for r in standbys), 120 + s.interval)
    for r in fleet.alive():
        r.scrape_errors()
    leader.proc.send_signal(signal.SIGKILL)
    t_kill = leader.killed_at = time.time()
    leader.proc.wait(10)
    replacement = fleet.spawn()
    got = child.ask(("wait_holder", holder, 3 * s.lease + 30), "holder", 3 * s.lease + 60)
    info: dict[str, Any] = {"kill": k, "killed": leader.n, "replacement": replacement.n, "exited_before": exited,
                            "standby_ready_at_kill": all(r.ready_at is not None and r.ready_at < t_kill
                                                         for r in standbys)}
    if got["at"] is None:
        info["takeover_seconds"] = None
        return info
    t_new = float(got["at"])
    new = fleet.holder_of(got["holder"])
    writes = child.ask(("first_write", t_new, 60), "write", 90)
    first = min((v for v in writes.values() if v is not None), default=None)
    info.update({"takeover_seconds": round(t_new - t_kill, 3), "new_leader": new.n,
                 "new_leader_was_warm_standby": new in standbys,
                 "first_write_seconds": round(first - t_kill, 3) if first is not None else None,
                 "first_write_by_kind_seconds": {kind: round(v - t_kill, 3) if v is not None else None
                                                 for kind, v in writes.items()}})
    return info


def start_fleet(child: EmulatorProcess, fleet: Fleet, budgets: int) -> dict[str, Any]:
    """Two replicas, both ready, one holding the Lease, every budget with a first status."""
    t0 = time.time()
    fleet.spawn()
    fleet.spawn()
    ready = wait_until("both replicas ready", lambda: all(r.ready() for r in fleet.replicas), 600)
    holder = child.ask(("wait_holder", "", 120), "holder", 150)
    if holder["at"] is None:
        raise TimeoutError("no replica took the Lease")

    def reconciled() -> bool:
        st = child.ask(("status",), "status", 60)
        return bool(st["budgets_with_status"] >= budgets)

    done = wait_until("every budget's first status", reconciled, 600, 1.0)
    return {"ready_seconds": round(ready - t0, 1), "leader_seconds": round(float(holder["at"]) - t0, 1),
            "initial_reconcile_seconds": round(done - t0, 1)}


def run(args: argparse.Namespace, s: Setup, workdir: Path) -> dict[str, Any]:
    size = size_of(s.fraction)
    params = Params(fraction=s.fraction, workdir=str(workdir), churn_events_per_s=s.events_per_s, seed=args.seed)
    child = EmulatorProcess(child_main, params, s.plan)
    fleet: Fleet | None = None
    try:
        ready = child.expect("ready", 600 + size.pods / 20)
        fleet = Fleet(ready["kubeconfig"], workdir, s)
        start = start_fleet(child, fleet, size.budgets + s.plan.evict_teams)
        print(f"emulator filled {ready['fill_seconds']} s, fleet {start}", flush=True)
        window = s.kills * s.interval + s.lease + 3  # side effects go on under the last new leader
        t0 = float(child.ask(("start", window), "started", 30)["at"])
        kills: list[dict[str, Any]] = []
        before: list[dict[str, Any]] = []
        for k in range(1, s.kills + 1):
            wait_until(f"kill {k}'s time", lambda k=k: time.time() >= t0 + k * s.interval,
                       s.interval * k + 5, 0.05)
            before = before or child.ask(("accuracy",), "accuracy", 60)  # the baseline: no kill yet
            kills.append(one_kill(child, fleet, k))
            print(f"kill {k}: {kills[-1]}", flush=True)
        settled = child.ask(("settle", 120 + 4 * s.lease), "settled", 240 + 8 * s.lease)
        print(f"settled: {settled['settled_after_seconds']}", flush=True)
    finally:
        if fleet is not None:
            fleet.stop()
        child.close()
    return {"fill": {k: v for k, v in ready.items() if k not in ("kubeconfig", "status")}, "start": start,
            "kills": kills, "result": settled, "accuracy_before_kills": before,
            "reconcile_errors": sum(r.errors for r in fleet.replicas),
            "replicas": len(fleet.replicas)}


# ---------------------------------------------------------------------------------------------- the verdict


def figures_of(out: dict[str, Any], s: Setup) -> tuple[dict[str, float | int], list[str]]:
    kills, res = out["kills"], out["result"]
    takeovers = sorted(k["takeover_seconds"] for k in kills if k.get("takeover_seconds") is not None)
    writes = sorted(k["first_write_seconds"] for k in kills if k.get("first_write_seconds") is not None)
    acc = [a["accuracy"] for a in res["accuracy"] if a["retain"]]
    plain = [a for a in res["accuracy"] if not a["retain"]]
    power, spot, ev, mig = res["power"], res["spot"], res["evict"], res["mig"]
    figures: dict[str, float | int] = {
        "kills": len(kills), "takeovers": len(takeovers),
        "takeover_max_seconds": max(takeovers, default=-1), "takeover_p50_seconds": _p50(takeovers),
        "takeovers_over_lease_duration": sum(1 for t in takeovers if t > s.lease),
        "first_write_max_seconds": max(writes, default=-1), "first_write_p50_seconds": _p50(writes),
        "takeovers_by_warm_standby": sum(1 for k in kills if k.get("new_leader_was_warm_standby")),
        "power_duplicates": power["duplicates"], "power_problems": power["problem_count"],
        "spot_duplicates": spot["duplicates"] + max(0, spot["tokens_creating"] - spot["launch_intents"]),
        "eviction_duplicates": ev["duplicates"], "evicted_not_over_quota": ev["not_over_quota"],
        "mig_doubled": mig["doubled"] + mig["violations"],
        "power_cycles": power["power_cycles"], "power_off_requests": power["stops_done"],
        "spot_instances_launched": spot["created"], "spot_reclaimed": spot["reclaimed"],
        "evictions": ev["evictions"], "mig_claims": mig["claims"],
        "budget_accuracy_min": min(acc, default=0.0), "budget_accuracy_max": max(acc, default=0.0),
        "plain_budget_accuracy_min": min((a["accuracy"] for a in plain), default=0.0),
        "plain_budget_loss_gpu_seconds_max": max((-a["delta_gpu_seconds"] for a in plain), default=0.0),
        "plain_budget_loss_beyond_bound": sum(1 for a in plain if _beyond_bound(a)),
        "retain_budget_loss_beyond_bound": sum(1 for a in res["accuracy"] if a["retain"] and _beyond_bound(a)),
        "power_pods_never_ran": sum(1 for p in res.get("power_pods", {}).values() if "running" not in p),
        "reconcile_errors": int(out["reconcile_errors"]),
        "replicas_exited_on_their_own": sum(len(k.get("exited_before", ())) for k in kills),
    }
    return figures, problems_of(figures, out, s)


def _beyond_bound(a: dict[str, Any]) -> bool:
    """A plain budget may lose its pods deleted while its ledger lacked them (the reconciler's documented gap),
    plus the 0.1 % every budget is allowed; it may never over-count beyond 0.1 %."""
    loss = -float(a["delta_gpu_seconds"])
    slack = (1 - float(TARGET)) * float(a.get("truth_gpu_hours", 0.0)) * 3600
    return bool(a.get("missing")) or a["accuracy"] > 2 - float(TARGET) or loss > a["loss_bound_gpu_seconds"] + slack


def _p50(values: list[float]) -> float:
    return values[(len(values) - 1) // 2] if values else -1.0


def problems_of(f: dict[str, float | int], out: dict[str, Any], s: Setup) -> list[str]:
    res = out["result"]
    problems = [f"{k} = {f[k]}" for k in ("power_duplicates", "power_problems", "spot_duplicates",
                                          "eviction_duplicates", "evicted_not_over_quota", "mig_doubled") if f[k]]
    if f["takeovers"] < f["kills"]:
        problems.append(f"only {f['takeovers']} of {f['kills']} kills were followed by a takeover")
    slow = [k["kill"] for k in out["kills"] if (k.get("takeover_seconds") or 0) > s.bound]
    if slow:
        problems.append(f"takeover above lease + retry ({s.bound:g} s) after kill(s) {slow}")
    required = ["power_cycles", "spot_instances_launched", "evictions"] + ([] if s.fraction < 0.05 else ["mig_claims"])
    problems += [f"no side effect of kind {k}" for k in required if not f[k]]
    if res["spot"]["missing"]:
        problems.append(f"spot: {res['spot']['missing']} needed instance(s) never created")
    lo, hi = float(TARGET), 2 - float(TARGET)
    bad = [a["budget"] for a in res["accuracy"] if a["retain"] and not lo <= a["accuracy"] <= hi]
    if bad:
        problems.append(f"retaining budgets' accuracy outside 0.999..1.001: {bad}")
    if f["plain_budget_loss_beyond_bound"]:
        problems.append(f"{f['plain_budget_loss_beyond_bound']} plain budget(s) lost more than their pods deleted "
                        "unrecorded, or over-counted")
    unsettled = [k for k, v in res["settled"].items() if not v]
    if unsettled:
        problems.append(f"not settled at the end: {unsettled}")
    return problems


NOTES = {
    "takeover_max_seconds": "kill -9 of the holder -> the Lease names another holder (emulator's store)",
    "takeovers_over_lease_duration": "takeovers that took longer than the lease duration after the kill",
    "first_write_max_seconds": "kill -> first status write of a budget, node group or spot pool after the takeover",
    "takeovers_by_warm_standby": "takeovers won by the replica that was already a synced standby",
    "power_duplicates": "new Idempotency-Key for a start while booting/on or a stop while going down/off (0)",
    "power_problems": "duplicates, keys never persisted as decided, power cycles above decisions (0)",
    "spot_duplicates": "instances created beyond pools x minimum + reclaimed, plus creating tokens beyond intents (0)",
    "eviction_duplicates": "successful evictions of a pod uid beyond the first (0)",
    "evicted_not_over_quota": "evictions while the team's truth was under its quota (0)",
    "mig_doubled": "MIG pods with more than one claim, plus live-claim overlaps or doubles seen on any change (0)",
    "retain_budget_loss_beyond_bound": "the same bound for the retaining ones (reported: a loss within it is a pod "
                                       "deleted before any leader added the finalizer)",
    "replicas_exited_on_their_own": "leaders that lost their lease unkilled (renewals stalled past the renew "
                                    "deadline: an overloaded machine) and exited; replaced (reported)",
    "power_pods_never_ran": "8-GPU pods for the hx machines that never ran (not settled: fails the run)",
    "budget_accuracy_min": "sampled budgets with retainFinishedPods: status at computedAt / truth (>= 0.999)",
    "plain_budget_accuracy_min": "sampled budgets without it (reported: see the loss bound)",
    "plain_budget_loss_gpu_seconds_max": "truth - status of a plain sampled budget (GPU-s)",
    "plain_budget_loss_beyond_bound": "plain budgets that lost more than their pods deleted while their ledger "
                                      "lacked them + 0.1 %, or over-counted (0)",
}


def markdown(out: dict[str, Any], s: Setup, figures: dict[str, float | int], problems: list[str], cmd: str,
             mode: str) -> str:
    rows = "\n".join(
        f"| {k['kill']} | {k['killed']} -> {k.get('new_leader', '-')} | {k.get('takeover_seconds')} | "
        f"{k.get('first_write_seconds')} | {k.get('new_leader_was_warm_standby')} | {k['standby_ready_at_kill']} |"
        for k in out["kills"])
    size = size_of(s.fraction)
    return f"""# HA failover under load ({mode} run)

Two `gpuops run --leader-elect` replicas (lease {s.lease:g} s, renew deadline {s.renew:g} s, retry {s.retry:g} s)
on the scale cluster at fraction {s.fraction:g} ({size.nodes:,} nodes, {size.pods:,} pods, {size.budgets} budgets,
{size.groups} node groups, {size.pools} spot pools, {size.mig} MIG nodes; churn {s.events_per_s:g} pod events/s),
plus the side-effect workload of chaos/_ha.py. The holder killed -9 every {s.interval:g} s, {s.kills} times, a
replacement started at once.

| kill | replica killed -> new leader | takeover (s) | first write (s) | warm standby won | standby ready at kill |
|---|---|---|---|---|---|
{rows}

{figures_table(figures, NOTES)}

Startup: {out['start']}. Settled at the end: {out['result']['settled']}.

Why a takeover can exceed {s.lease:g} s: a kill -9 does not release the Lease, so the standby waits until
leaseDuration has passed since it last *saw* the record change (by its own monotonic clock, never the Lease's
timestamps). It watches the Lease (polling it every retry period as a fallback), so it sees each renewal as it is
written, and tries again at the very instant the lease expires (gpuops/kube/leaderelection.py `_watch_lease`,
`_next_wait`): it takes over between leaseDuration - retry and leaseDuration after the kill (depending on where
the kill fell between two renewals), plus the watch's delivery, one GET and one PUT on a loaded machine.

Budgets: half the sampled budgets set `accounting.retainFinishedPods` (the finalizer keeps a finished pod until
a status write holds it), the other half do not. Neither can account a pod that finishes and is deleted while
no replica's budget controller is running (standbys' controllers register their handlers only once elected),
and a plain budget also loses a pod deleted after the killed leader saw it but before any status write held it
(the reconciler's documented gap); `loss_bound_gpu_seconds` per budget is the usage of its pods deleted while
its stored ledger lacked them. Retaining budgets are judged at 0.999; plain ones may lose at most that bound
(+0.1 %).

Problems: {"; ".join(problems) or "none"}.

Result: {"PASS" if not problems else "FAIL"}.

Command: `{cmd}`
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI-sized: fraction 0.02, lease 6 s, 3 kills 14 s apart")
    parser.add_argument("--seed", type=int, default=1, help="seed of the churn's draws")
    parser.add_argument("--fraction", type=float, default=None, help="of the full cluster (default 1.0; quick 0.02)")
    parser.add_argument("--kills", type=int, default=None, help="leader kills (default 10; quick 3)")
    parser.add_argument("--kill-interval", type=float, default=None, help="seconds between kills (60; quick 14)")
    parser.add_argument("--lease-duration", type=float, default=None, help="--leader-elect-lease-duration (15; 6)")
    args = parser.parse_args()
    s = setup_of(args)
    mode = "quick" if args.quick else "full"
    cmd = (f"python chaos/ha_failover.py{' --quick' if args.quick else ''} --seed {args.seed} --fraction "
           f"{s.fraction:g} --kills {s.kills} --kill-interval {s.interval:g} ({os.cpu_count()} cores)")
    t = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = run(args, s, Path(tmp))
        except Exception:
            for log in sorted(Path(tmp).glob("replica-*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
            raise
        finally:
            keep = Path(tempfile.gettempdir()) / f"{NAME}-replicas"  # the replicas' logs, for a look after the run
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(tmp, keep, ignore=shutil.ignore_patterns("kubeconfig"))
    out["wall_seconds"] = round(time.monotonic() - t, 1)
    figures, problems = figures_of(out, s)
    md = markdown(out, s, figures, problems, cmd, mode)
    write_results(NAME, figures, md, passed=not problems, extra={"mode": mode, "setup": s.__dict__ | {
        "plan": s.plan.__dict__}, "problems": problems, **out}, summary={
        "injected": f"kill -9 of the leader every {s.interval:g} s x {s.kills} under the scale load "
                    f"(fraction {s.fraction:g}), replacement started at once",
        "checked": "takeover <= lease + retry, 0 duplicate power/spot/eviction/MIG side effects, accuracy >= 0.999",
        "key": f"takeover max {figures['takeover_max_seconds']} s, first write max "
               f"{figures['first_write_max_seconds']} s, accuracy min {figures['budget_accuracy_min']}"})
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
