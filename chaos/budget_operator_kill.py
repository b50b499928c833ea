"""kill -9 the budget operator mid-run; while it is down, Job TTL + garbage collection delete finished pods.

Injected: the operator (`gpuops run --controllers budget`, a subprocess) is killed with SIGKILL at t = 15 s and
started again at t = 25 s, t counted from the first pod. Two budgets (AlertOnly, large quota) select disjoint
pod sets: `retain` has `accounting.retainFinishedPods: true`, `plain` does not. Each set is the seed's scenario
(50 pods created at 10/s, 1 GPU, 30 s each) plus 20 one-pod batch/v1 Jobs with `ttlSecondsAfterFinished: 0`,
created from t = 2 s, whose pods are timed to end at about t = 17.5 s: inside the outage. The emulator's Job
controller marks each Job Complete, its TTL controller deletes the Job (propagation Background) and its garbage
collector deletes the pod, all while the operator is down: the real TTL + GC chain, nothing deleted by hand.
A `plain` pod is then gone before the operator comes back (the controller saw it start, never end); a `retain`
pod waits, with a deletionTimestamp, on the `gpuops.io/budget-accounting` finalizer the operator put on it
while it ran. The script checks the chain happened inside the outage (each Job pod turned terminal and was
deleted between the kill and the restart) and counts a scenario that missed it as failed.

Checked: snapshots at t = 10 s (before the kill), 30 s and 45 s (after the restart; every pod has ended by
t = 45 s): status.consumedGpuHours against the truth at status.computedAt and the scraped metric against the
truth at the scrape's midpoint, per budget. Truth includes deleted pods (their last state, kept by a store
listener attached before the first pod: see chaos/_budget.py). Loss = truth - reported at t = 45 s. The bound
for `plain` = sum over its pods that both finished and were deleted while the operator was down of GPUs x
runtime (the controller never saw them end, so at most their whole usage is lost); for `retain` the same sum
over pods that finished and were marked for deletion in the outage is reported as "at risk".
Pass: `retain` loses nothing (loss <= 1e-6 GPU-h, status and metric; it may be below zero, an over-count, only by
the status's own stated bound, status.ledger.errorBoundGpuHours) and meets 0.999 <= accuracy <= 1.001 at every
snapshot, above 1.001 only within that bound; `plain` has -1e-6 <= loss <= bound + 1e-6 GPU-h (its accuracy after
the restart is reported, not judged: losing those pods is the documented behaviour without the finalizer); the
Job chain ran inside the outage. Also reported: restart -> first status write per budget (the first change
of its resourceVersion, seen in the store), restart -> retained pods released, and accuracy of `plain` against
the truth without the pods it could not see.

`--quick`: every time / 3 (kill at 5 s, restart at 8.3 s, snapshots at 3.3, 10, 15 s; figures keep the full
run's names t10/t30/t45).
"""

from __future__ import annotations

import argparse
import asyncio
from fractions import Fraction
from functools import partial
from typing import Any

from _budget import GPU, NS, Chaos, PodRecord, gpu_seconds, open_rig, ratio, set_labels, snapshot, snapshot_ok
from _common import Detail, Figures, Found, Report, mode_of, pace, run_scenario

from gpuops_sim.budget_workload import MICROS, budget, job, micros, pod
from gpuops_sim.harness import now_us, until

NAME = "budget_operator_kill"
NOTES = {
    "retain_loss_gpu_seconds_status": "truth - status at t45 (must be 0 within 1e-6 GPU-h, or an over-count "
                                      "within the status's errorBoundGpuHours)",
    "retain_error_bound_gpu_seconds": "the retain budget's status.ledger.errorBoundGpuHours at t45 (seconds counted "
                                      "before a finish reached the operator)",
    "plain_loss_gpu_seconds_status": "truth - status at t45 (must be within [0, bound])",
    "plain_bound_gpu_seconds": "GPUs x runtime of plain pods finished and deleted while the operator was down",
    "retain_at_risk_gpu_seconds": "same sum for retain pods (finished, deletion requested in the outage)",
    "plain_accuracy_status_t45_without_unseen_pods": "status / truth without the pods the controller never saw end",
    "retain_pods_held_through_outage": "retain Job pods marked for deletion in the outage, gone only after restart",
    "restart_to_metrics_up_seconds": "process spawn -> /metrics answers",
    "restart_to_retained_pods_released_seconds": "spawn -> last retained Job pod released by the finalizer and gone",
}

FINALIZER = "gpuops.io/budget-accounting"
SETS = ("retain", "plain")
labels = partial(set_labels, "operator-kill")
PODS, RATE, RUNTIME = 50, 10.0, 30.0
JOBS, JOB_AT, JOB_END = 20, 2.0, 17.5
KILL_AT, RESTART_AT = 15.0, 25.0
SNAPSHOTS = (10, 30, 45)
HOUR_TOL = Fraction(1, 1_000_000)  # 1e-6 GPU-hours
START_OVERHEAD = 0.6  # Job -> pod -> bound -> started: the kubelet's 0.5 s start latency plus the controllers'


def in_outage(at: int | None, kill: int, restart: int) -> bool:
    return at is not None and kill < at < restart


async def scenario(quick: bool, seed: int) -> Found:
    c = 3.0 if quick else 1.0
    job_runtime = (JOB_END - JOB_AT) / c - START_OVERHEAD
    async with open_rig("chaos-operator-kill", 2 * (PODS + JOBS), seed=seed) as chaos:
        for s in SETS:
            await chaos.create_budget(budget(s, labels(s), GPU, retain=(s == "retain")))
        origin = now_us()
        t0 = origin / MICROS

        async def seed_pods() -> None:
            for i in range(PODS):
                await pace(t0, i / RATE / c)
                for s in SETS:
                    await chaos.create_pod(pod(f"{s}-{i:03d}", labels(s), GPU, "1", RUNTIME / c))

        async def jobs() -> None:
            for j in range(JOBS):
                await pace(t0, JOB_AT / c + j * 0.02)
                for s in SETS:
                    template = pod("x", {**labels(s), "job": "yes"}, GPU, "1", job_runtime)
                    await chaos.create_job(job(f"{s}-job-{j:02d}", template, ttl=0))

        await asyncio.gather(seed_pods(), jobs())
        snaps: dict[int, dict[str, dict[str, Any]]] = {}
        await pace(t0, SNAPSHOTS[0] / c)
        snaps[SNAPSHOTS[0]] = {s: await snapshot(chaos, s, labels(s), origin) for s in SETS}

        def retain_running_held() -> bool:
            recs = [r for r in chaos.log.select(labels("retain")) if r.terminal_at is None]
            return bool(recs) and all(FINALIZER in (r.last["metadata"].get("finalizers") or ()) for r in recs)

        async def held() -> bool:
            return retain_running_held()

        await until("the retain set's running pods to carry the accounting finalizer", held,
                    max(0.5, t0 + KILL_AT / c - now_us() / MICROS))
        await pace(t0, KILL_AT / c)
        kill_us = now_us()
        chaos.rig.kill()
        job_recs = {s: [r for r in chaos.log.select({**labels(s), "job": "yes"})] for s in SETS}

        def chain_done() -> bool:
            return all(len(job_recs[s]) == JOBS for s in SETS) and all(
                r.terminal_at is not None and r.deletion_at is not None for s in SETS for r in job_recs[s])

        async def chain() -> bool:
            for s in SETS:  # Job pods are created by the emulator's Job controller: pick them up by label
                job_recs[s] = chaos.log.select({**labels(s), "job": "yes"})
            return chain_done()

        chain_in_time = True
        try:
            await until("every Job pod finished and deleted (TTL + GC) during the outage", chain,
                        max(0.1, t0 + RESTART_AT / c - 0.3 - now_us() / MICROS))
        except TimeoutError:
            chain_in_time = False
        await pace(t0, RESTART_AT / c)
        # the operator is down: only its first status write after the restart changes a budget's version
        versions = {s: chaos.budget_obj(s)["metadata"]["resourceVersion"] for s in SETS}
        spawn_us = now_us()
        await chaos.rig.start_operator()
        metrics_up_us = now_us()
        first_status: dict[str, float] = {}

        async def restatused() -> bool:
            for s in SETS:
                if s not in first_status and chaos.budget_obj(s)["metadata"]["resourceVersion"] != versions[s]:
                    first_status[s] = (now_us() - spawn_us) / MICROS
            return len(first_status) == len(SETS)

        await until("both budgets' first status after the restart", restatused, 30)

        async def released() -> bool:
            return all(r.gone_at is not None for r in chaos.log.select({**labels("retain"), "job": "yes"}))

        await until("the retained Job pods to be released and gone after the restart", released, 30)
        released_after = max(r.gone_at or 0 for r in job_recs["retain"]) - spawn_us
        for t in SNAPSHOTS[1:]:
            await pace(t0, t / c)
            snaps[t] = {s: await snapshot(chaos, s, labels(s), origin) for s in SETS}
        return summarize(chaos, snaps, job_recs, kill_us, spawn_us, metrics_up_us, first_status, released_after,
                         chain_in_time)


def summarize(chaos: Chaos, snaps: dict[int, dict[str, dict[str, Any]]], job_recs: dict[str, list[PodRecord]],
              kill_us: int, spawn_us: int, metrics_up_us: int, first_status: dict[str, float],
              released_after: int, chain_in_time: bool) -> Found:
    figures: dict[str, float | int] = {}
    for t, per in snaps.items():
        for s, snap in per.items():
            figures[f"{s}_accuracy_status_t{t}"] = snap["accuracy_status"]
            figures[f"{s}_accuracy_metric_t{t}"] = snap["accuracy_metric"]
            figures[f"{s}_accuracy_metric_in_window_t{t}"] = snap["accuracy_metric_in_window"]
    last = snaps[SNAPSHOTS[-1]]
    final = {s: chaos.status(s) for s in SETS}
    ok = chain_in_time
    detail: dict[str, Any] = {}
    for s in SETS:
        at = micros(final[s]["computedAt"])
        truth_now = chaos.log.truth(labels(s), at)
        loss_status = truth_now - Fraction(final[s]["consumedGpuHours"])
        snap = last[s]
        loss_metric = Fraction(snap["truth_metric_gpu_hours"]) - Fraction(snap["metric_gpu_hours"] or 0)
        finished_out = [r for r in job_recs[s] if in_outage(r.terminal_at, kill_us, spawn_us)]
        deleted_out = [r for r in finished_out if in_outage(r.deletion_at if s == "retain" else r.gone_at,
                                                            kill_us, spawn_us)]
        bound = sum((gpu_seconds(r) for r in deleted_out), Fraction(0))
        if s == "retain":  # the finalizer's work: marked for deletion in the outage, removed only after the restart
            figures["retain_pods_held_through_outage"] = sum(1 for r in deleted_out if (r.gone_at or 0) > spawn_us)
        figures[f"{s}_loss_gpu_seconds_status"] = round(float(loss_status * 3600), 4)
        figures[f"{s}_loss_gpu_seconds_metric"] = round(float(loss_metric * 3600), 4)
        figures[f"{s}_pods_finished_in_outage"] = len(finished_out)
        figures[f"{s}_pods_{'marked_for_deletion' if s == 'retain' else 'finished_and_deleted'}_in_outage"] = \
            len(deleted_out)
        figures[f"{s}_{'at_risk' if s == 'retain' else 'bound'}_gpu_seconds"] = round(float(bound), 4)
        figures[f"{s}_restart_to_first_status_seconds"] = round(first_status[s], 3)
        if s == "retain":  # nothing lost; over only by the ledger's stated bound (snapshot_ok)
            over = Fraction(final[s].get("ledger", {}).get("errorBoundGpuHours") or "0")
            figures["retain_error_bound_gpu_seconds"] = round(float(over * 3600), 4)
            ok = ok and -over - HOUR_TOL <= loss_status <= HOUR_TOL and -over - HOUR_TOL <= loss_metric <= HOUR_TOL \
                and all(snapshot_ok(per[s]) for per in snaps.values())
        else:
            ok = ok and -HOUR_TOL <= loss_status <= bound / 3600 + HOUR_TOL
            seen = [r for r in chaos.log.select(labels(s)) if r not in deleted_out]
            visible = sum((gpu_seconds(r) for r in seen), Fraction(0)) / 3600
            figures["plain_accuracy_status_t45_without_unseen_pods"] = ratio(Fraction(final[s]["consumedGpuHours"]),
                                                                             visible)
        detail[s] = {"final_status": final[s].get("consumedGpuHours"),
                     "lost_pods": sorted(r.last["metadata"]["name"] for r in deleted_out)}
    figures["restart_to_metrics_up_seconds"] = round((metrics_up_us - spawn_us) / MICROS, 3)
    figures["restart_to_retained_pods_released_seconds"] = round(released_after / MICROS, 3)
    figures["outage_seconds"] = round((spawn_us - kill_us) / MICROS, 3)
    figures["job_chain_in_outage"] = int(chain_in_time)
    return figures, {"snapshots": {str(t): v for t, v in snaps.items()}, "budgets": detail}, ok


def report(figures: Figures, extra: Detail, args: argparse.Namespace) -> Report:
    c = 3 if args.quick else 1
    rows = []
    for t, per in extra["snapshots"].items():
        for s, snap in per.items():
            rows.append(f"| t{t} ({snap['offset_seconds']:.1f} s) | {s} | {snap['accuracy_status']:.6f} | "
                        f"{snap['delta_gpu_seconds_status']:+.3f} | {snap['accuracy_metric']:.6f} | "
                        f"{snap['delta_gpu_seconds_metric'] if snap['delta_gpu_seconds_metric'] is not None else '-'}"
                        f" | {snap['accuracy_metric_in_window']:.6f} | {snap['scrape_window_ms']:.1f} / "
                        f"{snap['scrape_window_gpu_seconds']:.3f} | {snap['staleness_seconds']:.3f} |")
    injected = (f"kill -9 at {KILL_AT / c:g} s, restart at {RESTART_AT / c:g} s; {JOBS} Job pods/budget end and "
                "are TTL+GC-deleted in the outage")
    checked = "status+metric accuracy t10/t30/t45; loss vs bound, retain vs plain"
    key = (f"retain loss {figures['retain_loss_gpu_seconds_status']:g} GPU-s, min acc "
           f"{min(v for k, v in figures.items() if k.startswith('retain_accuracy')):g}; plain loss "
           f"{figures['plain_loss_gpu_seconds_status']:g} <= bound {figures['plain_bound_gpu_seconds']:g} GPU-s; "
           f"first status {figures['retain_restart_to_first_status_seconds']:g}/"
           f"{figures['plain_restart_to_first_status_seconds']:g} s after spawn")
    md = f"""# Budget operator kill -9 + Job TTL deletions during the outage ({mode_of(args)} run)

Injected: `kill -9` of the operator at t = {KILL_AT / c:g} s, restart at t = {RESTART_AT / c:g} s (outage \
{figures['outage_seconds']} s). Two budgets over disjoint pod sets, `retain` (retainFinishedPods) and `plain`, each
{PODS} pods ({RATE * c:g}/s, {RUNTIME / c:g} s, 1 GPU) plus {JOBS} one-pod Jobs (`ttlSecondsAfterFinished: 0`) whose
pods end during the outage and are deleted by the emulator's Job TTL controller + garbage collector (not by hand).
Job chain completed inside the outage: {"yes" if figures['job_chain_in_outage'] else "NO"}.

Checked: status (at computedAt) and metric (at the scrape) against exact truth from the emulator's container
timestamps, deleted pods included; loss at t45 against the bound (GPUs x runtime of pods finished and deleted
while the operator was down). Pass: retain loses nothing and stays within 0.999..1.001 everywhere (status at
computedAt; metric at some instant of its scrape request, see chaos/_budget.py `snapshot_ok`; the midpoint
figure is reported too), above it only by the status's own errorBoundGpuHours (retain:
{figures['retain_error_bound_gpu_seconds']:g} GPU-s at t45); plain loses between 0 and the bound.

| snapshot | budget | status accuracy | status delta (GPU-s) | metric accuracy (midpoint) | metric delta (GPU-s) | \
metric accuracy (in scrape window) | scrape window (ms / GPU-s) | staleness (s) |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}"""
    lost = f"Lost (plain): {', '.join(extra['budgets']['plain']['lost_pods']) or 'none'}."
    return Report(md, NOTES, injected=injected, checked=checked, key=key, footer=lost)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report, facts={"namespace": NS})
