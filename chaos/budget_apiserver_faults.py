"""API server faults under the budget controller: 5 % 500s, watches dropped every 2 s, one forced 410.

Injected, from the first pod until the last snapshot: `faults.add_error(500, 0.05)` on every verb and resource
(every HTTP request the operator makes: lists, watches, status patches, finalizer patches, Events), the
emulator closing every open watch every 2 s (`drop_watches()`), and once, at t = 22.5 s, a store compaction
followed by a drop (`compact()` then `drop_watches()`), so every informer re-watching from its last
resourceVersion meets 410 Gone and must relist. The scenario driver creates pods and reads status
in-process, so the faults are the operator's alone. Workload: the seed's scenario (50 pods created at 10/s,
1 GPU, 30 s each; one AlertOnly budget with a large quota selecting them).

Checked: snapshots at t = 15, 30 and 45 s: status.consumedGpuHours against the truth at status.computedAt
and the scraped metric against the truth at the scrape (judged at some instant of the scrape request, the
midpoint reported too: chaos/_budget.py `snapshot_ok`). Pass: 0.999 <= accuracy <= 1.001 at every snapshot,
and the final status (after the faults stop) equal to the truth of all pods within 1e-6 GPU-h. Reported: faults
injected (the emulator's count), watches dropped (connections closed), the operator's own view from its
/metrics (500s it received, relists by reason, expired = 410, watch restarts, reconcile errors), the lag from
the last pod's end to the status write that reflected it (under faults), and the time to converge once the
faults stop (0 when the status already held the final value).

`--quick`: every time / 3 (snapshots at 5, 10, 15 s, compaction at 7.5 s; figures keep the names t15/t30/t45).
`--seed` seeds the injector's random draws.
"""

from __future__ import annotations

import argparse
import asyncio
from fractions import Fraction
from typing import Any

from _budget import GPU, NS, metric_gpu_hours, open_rig, snapshot, snapshot_ok
from _common import Detail, Figures, Found, Report, WatchFaults, metric_sum, mode_of, pace, run_scenario

from gpuops_sim.budget_workload import MICROS, budget, micros, pod
from gpuops_sim.harness import now_us, until

NAME = "budget_apiserver_faults"
NOTES = {
    "accuracy_metric_t15": "at the scrape's midpoint (reported)",
    "accuracy_metric_in_window_t15": "at some instant of the scrape request (judged)",
    "faults_injected": "500s the emulator returned (to any client: only the operator talks HTTP here)",
    "watches_dropped": "watch connections closed by drop_watches(), the compaction's included",
    "operator_relists_expired_410": "informer relists after 410 Gone, from the operator's /metrics",
    "last_pod_end_to_status_seconds": "store marks the last pod Succeeded -> status write reflecting it",
    "converge_after_faults_stop_seconds": "0: the status and metric already held the final truth",
    "pods_informer_rewatch_backoff_max_seconds": "longest sleep before the pods watch was re-opened (operator log)",
}

PODS, RATE, RUNTIME = 50, 10.0, 30.0
SNAPSHOTS = (15, 30, 45)
ERROR_RATE, DROP_EVERY, COMPACT_AT = 0.05, 2.0, 22.5
LABELS = {"chaos": "apiserver-faults"}
HOUR_TOL = Fraction(1, 1_000_000)


async def scenario(quick: bool, seed: int) -> Found:
    c = 3.0 if quick else 1.0
    # DEBUG: the reflector logs each re-watch backoff ("re-watching after backoff", with its delay) only there
    async with open_rig("chaos-apiserver-faults", PODS, seed=seed, log_level="DEBUG") as chaos:
        await chaos.create_budget(budget("seed", LABELS, GPU))
        faults = chaos.cluster.server.faults
        dropper = WatchFaults(chaos.cluster.server, DROP_EVERY)
        stop = asyncio.Event()
        origin = now_us()
        t0 = origin / MICROS
        faults.add_error(500, ERROR_RATE)
        dropping = asyncio.create_task(dropper.drop_every(stop))

        async def create_all() -> None:
            for i in range(PODS):
                await pace(t0, i / RATE / c)
                await chaos.create_pod(pod(f"seed-{i:03d}", LABELS, GPU, "1", RUNTIME / c))

        async def compaction() -> None:
            await pace(t0, COMPACT_AT / c)
            dropper.compact()

        background = [asyncio.create_task(create_all()), asyncio.create_task(compaction())]
        snaps: dict[int, dict[str, Any]] = {}
        for t in SNAPSHOTS:
            await pace(t0, t / c)
            snaps[t] = await snapshot(chaos, "seed", LABELS, origin)
        await asyncio.gather(*background)
        stop.set()
        await dropping
        faults.clear()
        stopped = now_us()
        injected = faults.injected
        recs = chaos.log.select(LABELS)
        ended = [r.terminal_at for r in recs if r.terminal_at is not None]
        final_truth = chaos.log.truth(LABELS, now_us())
        already = len(ended) == PODS and abs(Fraction(chaos.status("seed")["consumedGpuHours"]) - final_truth) \
            <= HOUR_TOL

        async def converged() -> bool:
            text = await chaos.metrics()
            value = metric_gpu_hours(text, "seed")  # the GPU-seconds gauge / 3600, exact
            status = Fraction(chaos.status("seed")["consumedGpuHours"])
            return value is not None and abs(status - final_truth) <= HOUR_TOL \
                and abs(value - final_truth) <= HOUR_TOL

        timed_out = False
        try:
            await until("status and metric equal to the truth of every pod", converged, 60, every=0.1)
        except TimeoutError:
            timed_out = True
        converge = 0.0 if already else (now_us() - stopped) / MICROS
        st = chaos.status("seed")
        text = await chaos.metrics()
        figures: dict[str, float | int] = {}
        for t, snap in snaps.items():
            figures[f"accuracy_status_t{t}"] = snap["accuracy_status"]
            figures[f"accuracy_metric_t{t}"] = snap["accuracy_metric"]
            figures[f"accuracy_metric_in_window_t{t}"] = snap["accuracy_metric_in_window"]
            figures[f"staleness_seconds_t{t}"] = snap["staleness_seconds"]
        figures.update({
            "faults_injected": injected,
            "watch_drop_rounds": dropper.rounds + dropper.compactions,
            "watches_dropped": dropper.dropped,
            "operator_500s_received": metric_sum(text, "rest_client_requests_total", {"code": "500"}),
            "operator_requests": metric_sum(text, "rest_client_requests_total"),
            "operator_relists_expired_410": metric_sum(text, "gpuops_informer_relists_total", {"reason": "expired"}),
            "operator_relists_error": metric_sum(text, "gpuops_informer_relists_total", {"reason": "error"}),
            "operator_relists_total": metric_sum(text, "gpuops_informer_relists_total"),
            "operator_watch_restarts": metric_sum(text, "gpuops_informer_watch_restarts_total"),
            **{f"operator_watch_restarts_{r}": metric_sum(text, "gpuops_informer_watch_restarts_total", {"reason": r})
               for r in ("closed", "very_short", "transport", "server_error")},
            **backoff_figures(chaos.operator_log("re-watching after backoff")),
            "operator_reconcile_errors": metric_sum(text, "controller_runtime_reconcile_errors_total"),
            "last_pod_end_to_status_seconds": round((micros(st["computedAt"]) - max(ended)) / MICROS, 3)
            if ended else -1,
            "converge_after_faults_stop_seconds": round(converge, 3),
            "final_delta_gpu_seconds": round(float((Fraction(st["consumedGpuHours"]) - final_truth) * 3600), 4),
            "timed_out": int(timed_out),
        })
        ok = not timed_out and len(ended) == PODS and all(snapshot_ok(s) for s in snaps.values())
        return figures, {"snapshots": {str(t): v for t, v in snaps.items()}, "compacted_rv": dropper.compacted_rv,
                         "final_status": st.get("consumedGpuHours")}, ok


def backoff_figures(records: list[dict[str, Any]]) -> dict[str, float | int]:
    """Re-watch backoffs of the operator's pods informer (from its DEBUG log): how many, longest, total."""
    delays = [float(r.get("delay") or 0) for r in records if str(r.get("informer", "")).startswith("pods")]
    return {"pods_informer_rewatch_backoffs": len(delays),
            "pods_informer_rewatch_backoff_max_seconds": round(max(delays), 3) if delays else 0,
            "pods_informer_rewatch_backoff_total_seconds": round(sum(delays), 3)}


def report(figures: Figures, extra: Detail, args: argparse.Namespace) -> Report:
    c = 3 if args.quick else 1
    rows = [f"| t{t} ({v['offset_seconds']:.1f} s) | {v['accuracy_status']:.6f} | "
            f"{v['delta_gpu_seconds_status']:+.3f} | {v['accuracy_metric']:.6f} | "
            f"{v['accuracy_metric_in_window']:.6f} | {v['scrape_window_ms']:.1f} | {v['staleness_seconds']:.3f} |"
            for t, v in extra["snapshots"].items()]
    acc = [v for k, v in figures.items() if k.startswith(("accuracy_status", "accuracy_metric_in_window"))]
    injected = (f"{ERROR_RATE:.0%} 500s on all requests, watches dropped every {DROP_EVERY:g} s, one compaction "
                "(410)")
    checked = "status+metric accuracy t15/t30/t45; convergence after faults stop"
    key = (f"min acc {min(acc):g}; {figures['faults_injected']} 500s, {figures['watches_dropped']} watches "
           f"dropped, {figures['operator_relists_expired_410']:g} relists on 410; pods watch in backoff "
           f"{figures['pods_informer_rewatch_backoff_total_seconds']:g} s (longest "
           f"{figures['pods_informer_rewatch_backoff_max_seconds']:g} s); last pod end -> status "
           f"{figures['last_pod_end_to_status_seconds']:g} s; converge "
           f"{figures['converge_after_faults_stop_seconds']:g} s")
    md = f"""# Budget controller under API server faults ({mode_of(args)} run)

Injected (from the first pod to the last snapshot): {ERROR_RATE:.0%} HTTP 500 on every verb and resource, every
open watch closed every {DROP_EVERY:g} s, and at t = {COMPACT_AT / c:g} s a compaction then a drop (re-watches meet
410 Gone). Workload: {PODS} pods at {RATE * c:g}/s, {RUNTIME / c:g} s each, 1 GPU; one AlertOnly budget.
Checked: status (at computedAt) and metric (in its scrape window; midpoint reported) against exact truth at
t = {", ".join(f"{t / c:g}" for t in SNAPSHOTS)} s; after the faults stop, status and metric equal to the truth.

| snapshot | status accuracy | status delta (GPU-s) | metric accuracy (midpoint) | metric accuracy (in window) | \
scrape (ms) | staleness (s) |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report, facts={"namespace": NS})
