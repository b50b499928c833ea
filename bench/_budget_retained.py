"""The retained-finished-pods scenario of bench/budget_accuracy.py: Jobs without a TTL leave thousands of finished
pods in the API, the ledger compacts them into buckets, the operator is killed and restarted mid-run, and status
and metric accuracy are sampled throughout (see `retained` and RETAINED_NOTES for what is judged)."""

from __future__ import annotations

import asyncio
import random
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
from _budget_common import BUDGETS_PATH, CRDS, METRIC, NS, TARGET, ratio

from gpuops.accounting.reporting import counting_instant
from gpuops_sim.budget_workload import MICROS, budget, job, micros, pod, scenario, truth
from gpuops_sim.cluster.access import JOBS, PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value, now_us, until


@dataclass(frozen=True, slots=True)
class RetainedPlan:
    """One run of the retained-finished-pods scenario (see the module docstring).

    One-pod Jobs arrive at `rate`/s until the run ends, each pod running a uniform draw (0.1 s steps) from
    `runtime`; a sample every `every` s, judged from `judge_from` s on; the operator is killed at `kill_at` s
    (or later, once the ledger has compacted) and started again `outage` s after the kill; the run ends at
    `seconds` s, or `after` s after the restarted operator's first status and metric, whichever is later."""

    seconds: float
    rate: float
    runtime: tuple[float, float]
    every: float
    judge_from: float
    kill_at: float
    outage: float
    after: float
    seed: int = 1


# Finished pods' entries merge only once they ended 60 s ago (the controller's compaction margin, not an operator
# flag): in quick mode more than the 500 entries the ledger keeps exist from about t = 60 s and the first pods
# ended at about 4 s, so the first merge comes at about 65 s. Judging starts at 30 s, once the budget has used
# about 2,500 GPU-seconds (quick) or 4,000 (full): see the module docstring (whole-second timestamps).
RETAINED_QUICK = RetainedPlan(seconds=86.0, rate=10.0, runtime=(3.0, 20.0), every=2.0, judge_from=30.0,
                              kill_at=69.0, outage=2.0, after=14.0)
RETAINED_FULL = RetainedPlan(seconds=360.0, rate=10.0, runtime=(10.0, 60.0), every=10.0, judge_from=30.0,
                             kill_at=181.0, outage=5.0, after=170.0)
RETAINED = "retained"
RETAINED_LABELS = {"app": "retained-bench"}
GPU = "nvidia.com/gpu"
UPPER = 2 - TARGET  # 1.001


@dataclass
class RetainedRun:
    """What the three tasks of a retained run (arrivals, samples, restart) share."""

    plan: RetainedPlan
    rig: OperatorHarness
    t0: float
    """time.time() of the first Job: the run's origin."""
    created: int = 0
    end: float | None = None
    """time.time() at which arrivals and samples stop; set once the restart is over."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    kill_us: int | None = None
    spawn_us: int | None = None
    up_us: int | None = None
    ready_us: int | None = None
    compacted_before_kill: bool = False

    def at(self, offset: float) -> float:
        return self.t0 + offset

    def running(self, offset: float) -> bool:
        return self.end is None or self.at(offset) <= self.end


async def pace(when: float) -> None:
    """Sleep until time.time() == `when`: the scenario's timeline, not a wait for state."""
    await asyncio.sleep(max(0.0, when - time.time()))


async def retained(plan: RetainedPlan) -> dict[str, Any]:
    """Finished pods kept in the API beyond the ledger's max entries, arrivals throughout, a restart mid-run."""
    nodes = -(-round(plan.rate * plan.runtime[1]) // 8) + 2
    sc = scenario("budget-retained", nodes, namespaces=[NS], events=False, start_latency=0.5, lease=30.0,
                  node_status=300.0)
    with tempfile.TemporaryDirectory() as tmp:
        async with OperatorHarness(SimCluster(sc, workload=False, faults=False), Path(tmp), crds=CRDS) as rig:
            deleted: set[str] = set()  # every pod deletion the store makes (a synchronous listener: none is missed)
            rig.cluster.access.listen(
                lambda ev: deleted.add(ev.key[1]) if ev.gr == PODS and ev.type == "DELETED" else None)
            await rig.request("POST", BUDGETS_PATH, budget(RETAINED, RETAINED_LABELS, GPU))

            async def accounted() -> bool:
                return bool((await retained_status(rig)).get("computedAt"))

            await until("the budget's first status", accounted, 30)
            run = RetainedRun(plan, rig, time.time())
            async with asyncio.TaskGroup() as tg:
                tg.create_task(arrivals(run))
                tg.create_task(sampler(run))
                tg.create_task(restart(run))
            return {"plan": asdict(plan), "nodes": nodes, "jobs_created": run.created,
                    "pods_present": len(selected_pods(rig)), "pods_deleted": len(deleted),
                    "origin_us": round(run.t0 * MICROS),
                    "kill_us": run.kill_us, "spawn_us": run.spawn_us, "up_us": run.up_us, "ready_us": run.ready_us,
                    "compacted_before_kill": run.compacted_before_kill, "samples": run.samples}


async def retained_status(rig: OperatorHarness) -> dict[str, Any]:
    b = await rig.request("GET", f"{BUDGETS_PATH}/{RETAINED}")
    return dict(b.get("status") or {})


def selected_pods(rig: OperatorHarness) -> list[dict[str, Any]]:
    """The budget's pods as the emulator's store holds them now (none is ever deleted in this scenario)."""
    return [p for p in rig.cluster.access.iter(PODS, NS)
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in RETAINED_LABELS.items())]


async def arrivals(run: RetainedRun) -> None:
    """One-pod Jobs without ttlSecondsAfterFinished at a fixed rate, in-process (as the scale run creates
    pods): the Job controller creates each pod, marks the Job Complete, and nothing ever deletes either."""
    rng = random.Random(run.plan.seed)
    lo, hi = run.plan.runtime
    while run.running(run.created / run.plan.rate):
        await pace(run.at(run.created / run.plan.rate))
        template = pod("x", RETAINED_LABELS, GPU, "1", round(rng.uniform(lo, hi), 1))
        await run.rig.cluster.access.create(JOBS, NS, job(f"r-{run.created:05d}", template, ttl=None))
        run.created += 1


async def sampler(run: RetainedRun) -> None:
    k = 1
    while run.running(k * run.plan.every):
        await pace(run.at(k * run.plan.every))
        run.samples.append(await retained_sample(run))
        k += 1


async def retained_sample(run: RetainedRun) -> dict[str, Any]:
    """Scrape, then the status, then the pods: every pod that can count at the scrape or at computedAt is
    already in the store when it is listed (truth clips each pod at the instant asked)."""
    rig = run.rig
    value: float | None = None
    s0 = now_us()
    try:
        text, s0, s1 = await rig.scrape()
        value = metric_value(text, METRIC, {"namespace": NS, "name": RETAINED})
    except (aiohttp.ClientError, OSError):
        s1 = now_us()  # the operator is down (killed, not yet restarted)
    st = await retained_status(rig)
    taken = now_us()
    pods = selected_pods(rig)
    computed = micros(st["computedAt"])
    reported = Fraction(st["consumedGpuHours"])
    ledger = st.get("ledger") or {}
    bound = Fraction(ledger.get("errorBoundGpuHours") or "0")
    t_status = truth(pods, GPU, computed)
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    origin = round(run.t0 * MICROS)
    out: dict[str, Any] = {
        "t_seconds": round((taken - origin) / MICROS, 3), "jobs_created": run.created,
        "pods_running": phases.count("Running"), "pods_finished": phases.count("Succeeded") + phases.count("Failed"),
        "ledger_entries": len(ledger.get("entries") or ()), "ledger_buckets": len(ledger.get("buckets") or ()),
        "ledger_max_entries": ledger.get("maxEntries"), "compacted_through": ledger.get("compactedThrough"),
        "error_bound_gpu_hours": str(bound),
        "status_gpu_hours": str(reported), "truth_status_gpu_hours": str(t_status),
        "computed_at_seconds": round((computed - origin) / MICROS, 3),
        "staleness_seconds": round((taken - computed) / MICROS, 3),
        "accuracy_status": ratio(reported, t_status),
        "accuracy_status_bound_adjusted": ratio(reported - bound, t_status),
        "delta_gpu_seconds_status": round(float((reported - t_status) * 3600), 3),
        "status_ok": reported >= TARGET * t_status and reported - bound <= UPPER * t_status,
        **late_marks(ledger, pods),
        "metric_gpu_hours": None, "scrape_start_us": s0, "scrape_end_us": s1,
    }
    if value is not None:
        metric = Fraction(value) / 3600  # exact: the scraped float GPU-seconds in GPU-hours
        # the metric is the figure at the counting instant (whole second) of some instant of its scrape
        t_mid, lo, hi = (truth(pods, GPU, counting_instant(at)) for at in ((s0 + s1) // 2, s0, s1))
        out.update({
            "metric_gpu_hours": str(metric), "truth_metric_gpu_hours": str(t_mid),
            "accuracy_metric": ratio(metric, t_mid),
            "accuracy_metric_in_window": window_accuracy(metric, lo, hi),
            "delta_gpu_seconds_metric": round(float((metric - t_mid) * 3600), 3),
            "scrape_window_ms": round((s1 - s0) / 1000, 2),
            "metric_ok": metric >= TARGET * lo and metric - bound <= UPPER * hi,
        })
    return out


def finished_at(pod: dict[str, Any]) -> int | None:
    """The pod's recorded finish (its containers' latest finishedAt, µs), None while any container runs."""
    terms = [((s.get("state") or {}).get("terminated") or {}).get("finishedAt")
             for s in (pod.get("status") or {}).get("containerStatuses") or ()]
    return max(micros(t) for t in terms) if terms and all(terms) else None


def late_marks(ledger: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, int]:
    """Checks the ledger's late marks against the pods' records: an entry counted past its pod's finishedAt
    must say so (recordedEnd == finishedAt, at most a second before its end), one without the mark must end at
    the finishedAt. The error bound the status is judged with includes the marked parts; this is what keeps
    that bound honest."""
    finished = {p["metadata"]["uid"]: finished_at(p) for p in pods}
    marked = wrong = 0
    for e in ledger.get("entries") or ():
        record, end = finished.get(e["uid"]), micros(e["end"])
        if e.get("recordedEnd") is not None:
            marked += 1
            wrong += int(record is None or micros(e["recordedEnd"]) != record or not 0 < end - record <= MICROS)
        else:
            wrong += int(record is None or end != record)
    late = sum(Fraction(b.get("lateGpuSeconds") or "0") for b in ledger.get("buckets") or ())
    return {"late_entries": marked, "late_marks_wrong": wrong, "late_bucket_gpu_seconds": round(float(late), 3)}


def window_accuracy(metric: Fraction, lo: Fraction, hi: Fraction) -> float:
    """The operator evaluates the metric at some instant inside the scrape's HTTP request, where the truth
    lies in [lo, hi]: 1 inside that range, else the ratio to its nearer end."""
    return 1.0 if lo <= metric <= hi else ratio(metric, lo if metric < lo else hi)


async def restart(run: RetainedRun) -> None:
    """kill -9 the operator at kill_at (once the ledger has buckets), start a new one `outage` s later, wait
    for its first status and metric, then set the run's end."""
    rig, plan = run.rig, run.plan

    async def compacted() -> bool:
        return bool(((await retained_status(rig)).get("ledger") or {}).get("buckets"))

    await pace(run.at(plan.kill_at))
    try:
        await until("the ledger's first compaction (buckets in status.ledger)", compacted,
                    max(1.0, plan.seconds - plan.kill_at), every=0.5)
        run.compacted_before_kill = True
    except TimeoutError:
        pass  # reported (compacted_before_restart = 0) and judged as a failure: the run did not test compaction
    run.kill_us = now_us()
    rig.kill()
    await pace(run.kill_us / MICROS + plan.outage)
    run.spawn_us = now_us()
    await rig.start_operator()
    run.up_us = now_us()
    spawn = run.spawn_us

    async def restarted() -> bool:
        if micros((await retained_status(rig)).get("computedAt") or "1970-01-01T00:00:00Z") <= spawn:
            return False
        text, _, _ = await rig.scrape()
        return metric_value(text, METRIC, {"namespace": NS, "name": RETAINED}) is not None

    await until("the restarted operator's first status and metric", restarted, 60, every=0.1)
    run.ready_us = now_us()
    run.end = max(run.at(plan.seconds), run.ready_us / MICROS + plan.after)


def judge_retained(r: dict[str, Any]) -> tuple[dict[str, float | int], bool]:
    """The scenario's figures and its verdict (the criteria are listed in the module docstring)."""
    f = {**_retained_setup_figures(r), **_retained_accuracy_figures(r)}
    ok = not retained_failures(r, f)
    f["passed"] = int(ok)
    return f, ok


def retained_failures(r: dict[str, Any], f: dict[str, float | int]) -> list[str]:
    """Each pass criterion the run missed, named with its figures, and each judged sample that failed: what a
    reader of a CI log needs to tell a regression from a starved machine."""
    criteria = {
        "samples taken": bool(r["samples"]), "restarted operator reported": bool(r["ready_us"]),
        "pods_deleted == 0": f["pods_deleted"] == 0,
        "compacted_before_restart == 1": f["compacted_before_restart"] == 1,
        "compacted_through_kept == 1": f["compacted_through_kept"] == 1,
        "samples_after_compaction > 0": f["samples_after_compaction"] > 0,
        "samples_after_restart > 0": f["samples_after_restart"] > 0,
        "status_samples_ok == samples_judged": f["status_samples_ok"] == f["samples_judged"],
        "metric_samples_ok == metric_samples_judged": f["metric_samples_ok"] == f["metric_samples_judged"],
        "metric_absent_outside_restart == 0": f["metric_absent_outside_restart"] == 0,
        "usage_decreases_status == 0": f["usage_decreases_status"] == 0,
        "late_marks_wrong == 0": f["late_marks_wrong"] == 0,
        "usage_decreases_metric == 0": f["usage_decreases_metric"] == 0,
        "run_seconds < 3600": f["run_seconds"] < 3600,
    }
    missed = [f"criterion missed: {name} ({_named_figures(name, f)})" for name, held in criteria.items() if not held]
    judged = [s for s in r["samples"] if s["t_seconds"] >= r["plan"]["judge_from"]]
    missed += [f"sample failed at t = {s['t_seconds']} s: status {s['status_gpu_hours']} vs truth "
               f"{s['truth_status_gpu_hours']} (ok: {s['status_ok']}), metric {s['metric_gpu_hours']} vs truth "
               f"{s.get('truth_metric_gpu_hours')} (ok: {s.get('metric_ok')}), scrape "
               f"{s.get('scrape_window_ms')} ms, staleness {s['staleness_seconds']} s"
               for s in judged if not (s["status_ok"] and s.get("metric_ok", True))]
    return missed


def _named_figures(criterion: str, f: dict[str, float | int]) -> str:
    names = [w for w in re.findall(r"[a-z_]+", criterion) if w in f]
    return ", ".join(f"{n} = {f[n]}" for n in names) or "see the figures"


def _retained_setup_figures(r: dict[str, Any]) -> dict[str, float | int]:
    """What the run did: pods, compaction, restart (the conditions under which accuracy is judged)."""
    samples = r["samples"]
    origin, kill, spawn, ready = r["origin_us"], r["kill_us"], r["spawn_us"], r["ready_us"]
    compacted = [s for s in samples if s["ledger_buckets"]]
    last = samples[-1] if samples else {}

    def since(a: int | None, b: int | None) -> float:
        return round((b - a) / MICROS, 3) if a is not None and b is not None else -1.0

    return {
        "jobs_created": r["jobs_created"], "pods_present_end": r["pods_present"], "pods_deleted": r["pods_deleted"],
        "pods_finished_end": last.get("pods_finished", 0), "pods_running_end": last.get("pods_running", 0),
        "truth_gpu_hours_end": round(float(Fraction(last.get("truth_status_gpu_hours", "0"))), 6),
        "run_seconds": last.get("t_seconds", 0.0), "samples": len(samples),
        "sample_every_seconds": r["plan"]["every"], "judged_from_seconds": r["plan"]["judge_from"],
        "ledger_max_entries": int(last.get("ledger_max_entries") or 0),
        "ledger_entries_end": last.get("ledger_entries", 0), "ledger_buckets_end": last.get("ledger_buckets", 0),
        "compaction_first_seen_seconds": compacted[0]["t_seconds"] if compacted else -1.0,
        "samples_after_compaction": len(compacted),
        "compacted_through_kept": int(all(s["compacted_through"] for s in compacted)),
        "compacted_before_restart": int(r["compacted_before_kill"]),
        "kill_at_seconds": since(origin, kill), "outage_seconds": since(kill, spawn),
        "restart_to_metrics_up_seconds": since(spawn, r["up_us"]),
        "restart_to_first_status_and_metric_seconds": since(spawn, ready),
        "samples_after_restart": sum(1 for s in samples if ready is not None and s["scrape_start_us"] >= ready),
    }


def _retained_accuracy_figures(r: dict[str, Any]) -> dict[str, float | int]:
    """Accuracy at the judged samples (status and metric), usage never decreasing (all samples)."""
    samples = r["samples"]
    kill, ready = r["kill_us"], r["ready_us"]
    judged = [s for s in samples if s["t_seconds"] >= r["plan"]["judge_from"]]
    warmup = [s for s in samples if s["t_seconds"] < r["plan"]["judge_from"]]
    metric = [s for s in samples if s["metric_gpu_hours"] is not None]
    metric_judged = [s for s in judged if s["metric_gpu_hours"] is not None]
    compacted = [s for s in judged if s["ledger_buckets"]]

    def in_restart(s: dict[str, Any]) -> bool:
        return kill is not None and s["scrape_end_us"] >= kill and (ready is None or s["scrape_start_us"] < ready)

    def steps(key: str, rows: list[dict[str, Any]]) -> list[Fraction]:
        return [Fraction(b[key]) - Fraction(a[key]) for a, b in pairwise(rows)]

    def lo(key: str, rows: list[dict[str, Any]]) -> float:
        return min((s[key] for s in rows if s.get(key) is not None), default=0.0)

    def hi(key: str, rows: list[dict[str, Any]]) -> float:
        return max((s[key] for s in rows if s.get(key) is not None), default=0.0)

    status_steps, metric_steps = steps("status_gpu_hours", samples), steps("metric_gpu_hours", metric)
    absent = [s for s in samples if s["metric_gpu_hours"] is None]
    return {
        "samples_judged": len(judged),
        "accuracy_status_min": lo("accuracy_status", judged), "accuracy_status_max": hi("accuracy_status", judged),
        "accuracy_status_max_after_compaction": hi("accuracy_status", compacted),
        "accuracy_metric_min": lo("accuracy_metric", judged), "accuracy_metric_max": hi("accuracy_metric", judged),
        "accuracy_metric_in_window_min": lo("accuracy_metric_in_window", judged),
        "accuracy_metric_in_window_max": hi("accuracy_metric_in_window", judged),
        "accuracy_metric_in_window_max_after_compaction": hi("accuracy_metric_in_window", compacted),
        "error_bound_gpu_hours_max": float(max((Fraction(s["error_bound_gpu_hours"]) for s in samples),
                                               default=Fraction(0))),
        "status_samples_ok": sum(1 for s in judged if s["status_ok"]),
        "status_samples_ok_only_within_bound": sum(1 for s in judged if s["status_ok"] and
                                                   s["accuracy_status"] > float(UPPER)),
        "metric_samples_judged": len(metric_judged),
        "metric_samples_ok": sum(1 for s in metric_judged if s["metric_ok"]),
        "metric_samples_absent": len(absent),
        "metric_absent_outside_restart": sum(1 for s in absent if not in_restart(s)),
        "warmup_accuracy_status_min": lo("accuracy_status", warmup),
        "warmup_accuracy_metric_in_window_min": lo("accuracy_metric_in_window", warmup),
        "warmup_truth_gpu_seconds_max": round(max((float(Fraction(s["truth_status_gpu_hours"])) * 3600
                                                   for s in warmup), default=0.0), 1),
        "usage_decreases_status": sum(1 for d in status_steps if d < 0),
        "usage_decreases_metric": sum(1 for d in metric_steps if d < 0),
        "usage_min_step_gpu_seconds_status": round(float(min(status_steps, default=Fraction(0)) * 3600), 3),
        "usage_min_step_gpu_seconds_metric": round(float(min(metric_steps, default=Fraction(0)) * 3600), 3),
        "staleness_max_seconds": hi("staleness_seconds", samples),
        "late_entries_max": max((s["late_entries"] for s in samples), default=0),
        "late_bucket_gpu_seconds_max": max((s["late_bucket_gpu_seconds"] for s in samples), default=0.0),
        "late_marks_wrong": sum(s["late_marks_wrong"] for s in samples),
    }


RETAINED_NOTES = {
    "pods_deleted": "pod deletions the emulator's store made during the run (must be 0: pods stay in the API)",
    "ledger_max_entries": "status.ledger.maxEntries: entries kept individually (the operator's default)",
    "judged_from_seconds": "samples before this are reported, not judged (warm-up: see below)",
    "compaction_first_seen_seconds": "first sample whose status.ledger has buckets",
    "samples_after_compaction": "samples whose status.ledger has buckets (must be > 0)",
    "compacted_through_kept": "every sample with buckets also has status.ledger.compactedThrough (must be 1)",
    "compacted_before_restart": "the ledger had buckets when the operator was killed (must be 1)",
    "restart_to_first_status_and_metric_seconds": "spawn -> a status computed after it and the metric series",
    "samples_after_restart": "samples whose scrape began after that (must be > 0)",
    "samples_judged": "samples from judged_from_seconds on",
    "accuracy_status_min": "status / truth at its computedAt, judged samples",
    "accuracy_status_max_after_compaction": "the same, judged samples with buckets",
    "accuracy_metric_min": "metric / truth at the scrape's midpoint (reported)",
    "accuracy_metric_in_window_min": "metric against the truth over the scrape request (judged)",
    "error_bound_gpu_hours_max": "largest status.ledger.errorBoundGpuHours seen",
    "status_samples_ok": "samples with 0.999 <= status / truth and (status - errorBound) / truth <= 1.001",
    "status_samples_ok_only_within_bound": "of those, samples above 1.001 admitted by errorBound alone",
    "metric_samples_ok": "scrapes with the series where the same holds over the request's truth range",
    "metric_absent_outside_restart": "scrapes without the series outside kill -> first reconcile (must be 0)",
    "warmup_accuracy_status_min": "status / truth before judged_from_seconds (reported, not judged)",
    "warmup_truth_gpu_seconds_max": "the budget's usage at the last warm-up sample",
    "usage_decreases_status": "consecutive samples where status.consumedGpuHours went down (must be 0)",
    "usage_decreases_metric": "the same for the metric (must be 0)",
    "late_entries_max": "most ledger entries marked as counted past their pod's finishedAt (recordedEnd) in a sample",
    "late_bucket_gpu_seconds_max": "most GPU-seconds the buckets marked as counted past recorded finishes",
    "late_marks_wrong": "entries whose mark disagrees with the pod's finishedAt, summed over samples (must be 0)",
}


def retained_markdown(r: dict[str, Any], f: dict[str, float | int]) -> str:
    plan = r["plan"]
    lo, hi = plan["runtime"]
    rows = []
    for s in r["samples"]:
        metric = (f"{s['accuracy_metric']:.6f} | {s['accuracy_metric_in_window']:.6f} | {s['scrape_window_ms']:.1f}"
                  if s["metric_gpu_hours"] is not None else "- | - | -")
        judged = s["t_seconds"] >= plan["judge_from"]
        ok = "warm-up" if not judged else "ok" if s["status_ok"] and s.get("metric_ok", True) else "FAIL"
        rows.append(f"| {s['t_seconds']:.1f} | {s['jobs_created']} | {s['pods_running']}/{s['pods_finished']} | "
                    f"{s['ledger_entries']}/{s['ledger_buckets']} | {'yes' if s['compacted_through'] else '-'} | "
                    f"{s['accuracy_status']:.6f} | {float(Fraction(s['error_bound_gpu_hours'])):g} | "
                    f"{s['delta_gpu_seconds_status']:+.3f} | {s['staleness_seconds']:.2f} | {metric} | "
                    f"{ok} |")
    table = "\n".join(rows)
    figs = "\n".join(f"| `{k}` | {v:g} | {RETAINED_NOTES.get(k, '')} |" for k, v in f.items())
    return f"""## Finished pods kept in the API beyond the ledger's max entries, operator restarted mid-run

{f['jobs_created']:,} one-pod Jobs without `ttlSecondsAfterFinished` created at {plan['rate']:g}/s for the whole \
run ({f['run_seconds']:g} s), 1 GPU each, running {lo:g}-{hi:g} s (uniform, seed {plan['seed']}): their pods \
complete and stay in the API ({f['pods_finished_end']:,} finished at the end; deleted: {f['pods_deleted']}). One \
AlertOnly budget (1 h window: longer than the run, so nothing leaves it and its usage may never decrease) selects \
them. The ledger keeps {f['ledger_max_entries']} entries individually and merges older ones into buckets once they \
ended 60 s ago: first seen compacted at t = {f['compaction_first_seen_seconds']:g} s, {f['ledger_entries_end']} \
entries and {f['ledger_buckets_end']} buckets at the end; `compactedThrough` recorded whenever buckets exist: \
{"yes" if f['compacted_through_kept'] else "NO"}. The operator was killed (`kill -9`) at t = \
{f['kill_at_seconds']:g} s{"" if f['compacted_before_restart'] else " (BEFORE any compaction)"}, started again \
{f['outage_seconds']:g} s later, and had written a status and published the metric \
{f['restart_to_first_status_and_metric_seconds']:g} s after that.

Sampled every {plan['every']:g} s: the status against the truth at its computedAt, the metric against the truth over
its scrape request (the midpoint ratio is shown as well). Judged at every sample from t = {plan['judge_from']:g} s:
`0.999 <= reported / truth` and `(reported - errorBoundGpuHours) / truth <= 1.001`, i.e. the raw ratio within
0.999..1.001 unless the ledger's stated over-count bound (status.ledger.errorBoundGpuHours) admits more. That
bound is non-zero only while a bucket straddles the window's trailing edge (a 1 h window never reaches that here)
or while the ledger holds time counted past a pod's recorded finish: a figure that counted a pod running before
its finish reached the operator is not taken back, and the entry says so (recordedEnd). Every such mark is checked
against the pod's own finishedAt at every sample (`late_marks_wrong` must be 0): the bound admits only what the
records show was counted past them. And, at every sample, neither figure lower than at the previous one. Scrapes without
the series are allowed only between the kill and the restarted operator's first reconcile. Earlier samples are
warm-up (reported, not judged): container timestamps are whole seconds, so each pod that starts or ends near the
instant makes a reading uncertain by up to 1 GPU-second (deltas of 0.3-1.5 GPU-s seen), more than 0.1 % until
the budget has used a few thousand GPU-seconds. Ledger = entries/buckets in status.ledger.

| t (s) | Jobs | running/finished | ledger | compactedThrough | status accuracy | errorBound (GPU-h) | \
status delta (GPU-s) | staleness (s) | metric accuracy (midpoint) | metric in scrape window | scrape (ms) | sample |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{table}

| figure | value | meaning |
|---|---|---|
{figs}

Retained-finished-pods result: {"PASS" if f['passed'] else "FAIL"}."""


# ---------------------------------------------------------------------------------------------- main
