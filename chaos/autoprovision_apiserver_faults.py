"""API server faults under the autoprovision controller: 5 % 500s, watches dropped every 2 s, a forced 410 and a
short outage, during a burst of pending GPU pods.

Injected, from the first pod until every machine is off again: `faults.add_error(500, 0.05)` on every verb and
resource (every HTTP request the operator makes: lists, watches, group status writes, node taints, evictions,
Events), every open watch closed every 2 s (`drop_watches()`), once a store compaction followed by a drop
(`compact()` then `drop_watches()`: informers re-watching from their last resourceVersion meet 410 Gone and
relist), and once a 2 s outage (the API server's port closed: connections refused) in the middle of the
burst. The scenario driver creates pods and reads state in-process, so the faults are the operator's alone.

Workload: 6 powered-off 8-GPU machines, one GPUNodeGroup each (created before the faults); a burst of 24
pods of 2 GPUs, 0.25 s apart (`--quick`: 0.1 s), 15 s each (`--quick` 5 s). Compressed timings: boot 4 s
(`--quick` 2 s), device plugin and shutdown 0.3 s, scaleDownUnneededSeconds 4 s (`--quick` 2 s).

Checked: every pod Running; no duplicate transition, every key sent decided by the operator, no machine powered
on more often than decided (chaos/_autoprovision.py `power_report`); every machine off and every group Off
in the end (converged with the faults still on).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _autoprovision import burst, open_ap_rig, power_report
from _common import Detail, Figures, Found, Report, WatchFaults, mode_of, pace, run_scenario

NAME = "autoprovision_apiserver_faults"
NOTES = {
    "apiserver_500s_injected": "HTTP 500s the API server's injector answered (5 % of the operator's requests)",
    "watches_dropped": "watch connections the emulator closed (every 2 s, and once after the compaction)",
    "duplicate_transitions": "new key for a start while booting/on or a stop while going down/off (must be 0)",
    "undecided_keys_sent": "power requests whose key the operator never logged as decided (must be 0)",
    "power_cycles": "power-ons the machines went through (must not exceed power_on_decisions)",
    "seconds_to_all_pods_running": "first pod created -> last pod first Running",
    "seconds_to_all_machines_off": "first pod created -> every machine off and every group Off (faults on)",
}

MACHINES, PODS, GPUS = 6, 24, 2
ERROR_RATE, DROP_EVERY, COMPACT_AT, OUTAGE_AT, OUTAGE = 0.05, 2.0, 1.0, 1.5, 2.0


async def timeline(f: WatchFaults, t0: float) -> None:
    """The compaction (410) and then the outage, in the middle of the burst."""
    await pace(t0, COMPACT_AT)
    f.compact()
    await pace(t0, OUTAGE_AT)
    await f.outage(OUTAGE)


async def scenario(quick: bool, seed: int) -> Found:
    boot, runtime, unneeded, spacing = (2.0, 5.0, 2, 0.1) if quick else (4.0, 15.0, 4, 0.25)
    names = [f"gpu-{i}" for i in range(MACHINES)]
    async with open_ap_rig("chaos-ap-apiserver", MACHINES, seed=seed, boot=boot) as ap:
        await ap.create_groups(names, unneeded=unneeded)
        f = WatchFaults(ap.cluster.server, DROP_EVERY)
        rule = ap.cluster.server.faults.add_error(500, ERROR_RATE)
        stop = asyncio.Event()
        dropper = asyncio.create_task(f.drop_every(stop))
        t0 = time.time()
        timeline_done = asyncio.create_task(timeline(f, t0))
        await burst(ap, PODS, GPUS, runtime, spacing)
        problems: list[str] = []
        running_at = off_at = None
        try:
            running_at = await ap.wait_all_running(60 if quick else 120)
        except TimeoutError as e:
            problems.append(str(e))
        await timeline_done
        if running_at is not None:
            try:
                off_at = await ap.wait_all_off(names, runtime + 40 if quick else runtime + 90)
            except TimeoutError as e:
                problems.append(f"{e}: states {[(n, ap.state(n), ap.machines[n].state) for n in names]}")
        stop.set()
        await dropper
        injected = ap.cluster.server.faults.injected
        ap.cluster.server.faults.rules.remove(rule)
        figures, per, power_problems = power_report(ap, names)
        problems += power_problems
        figures = {
            **figures,
            "apiserver_500s_injected": injected,
            "watches_dropped": f.dropped,
            "drop_rounds": f.rounds,
            "compacted_rv": f.compacted_rv,
            "outage_seconds": f.outage_seconds,
            "pods": len(ap.pods),
            "pods_never_running": sum(1 for p in ap.pods.values() if p.running is None),
            "seconds_to_all_pods_running": round(running_at - t0, 3) if running_at else -1,
            "seconds_to_all_machines_off": round(off_at - t0, 3) if off_at else -1,
            "machines_used": sum(1 for n in names if ap.machines[n].power_cycles > 0),
        }
        timings = {"boot_seconds": boot, "pod_runtime_seconds": runtime, "scale_down_unneeded_seconds": unneeded,
                   "pod_spacing_seconds": spacing}
        return figures, {"machines": per, "problems": problems, "trace": ap.trace(), "timings": timings}, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    t = detail["timings"]
    rows = "\n".join(f"| {n} | {d['power_cycles']} | {d['up_decisions']} | {d['down_decisions']} | "
                     f"{d['start_requests']} / {d['start_keys']} | {d['stop_requests']} / {d['stop_keys']} | "
                     f"{len(d['duplicates'])} |" for n, d in detail["machines"].items())
    injected = (f"5 % API 500s, watch drops every {DROP_EVERY:g} s, compaction (410), {OUTAGE:g} s outage during "
                f"a burst of {PODS} pods over {MACHINES} off machines (compressed: boot {t['boot_seconds']:g} s)")
    checked = "all pods Running; 0 duplicate transitions; keys all decided; cycles <= decisions; all off"
    key = (f"{figures['apiserver_500s_injected']} 500s, {figures['watches_dropped']} watches dropped; "
           f"{figures['duplicate_transitions']} duplicates; running after "
           f"{figures['seconds_to_all_pods_running']:g} s, all off after {figures['seconds_to_all_machines_off']:g} s")
    md = f"""# Autoprovision under API server faults ({mode_of(args)} run)

Injected from the first pod until every machine is off: 5 % HTTP 500 on every request, all watches dropped
every {DROP_EVERY:g} s, a compaction + drop (410 Gone) at t = {COMPACT_AT:g} s, a {OUTAGE:g} s outage (connections
refused) at t = {OUTAGE_AT:g} s. Workload: {PODS} pods x {GPUS} GPUs, {t['pod_spacing_seconds']:g} s apart, over
{MACHINES} powered-off 8-GPU machines. Compressed timings: boot {t['boot_seconds']:g} s, pod runtime
{t['pod_runtime_seconds']:g} s, scaleDownUnneededSeconds {t['scale_down_unneeded_seconds']} s.

Checked: every pod Running; no duplicate transition; every key sent decided; power-ons <= decisions; every
machine off and every group Off at the end.

| machine | power cycles | up decisions | down decisions | start requests / keys | stop requests / keys | \
duplicates |
|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
