"""kill -9 of the autoprovision operator right after a power-on took effect, while the machine boots.

Two variants, one after the other on the same cluster (2 powered-off 8-GPU machines, one GPUNodeGroup each):
  after-boot   a pending 1-GPU pod makes the operator power gpu-0 on; the moment the emulated power API has
               started the machine (inside the request, before it answers: the operator never sees the 2xx,
               so its persisted transition still says "not sent"), the operator is killed with SIGKILL. It is
               restarted once the machine has booted and its Node is Ready with GPUs.
  while-booting the same for a second pod on gpu-1 (the pod asks for a nodeSelector on gpu-1), restarted at
               once, while gpu-1 is still booting: the restarted operator must re-send the *same* transition
               (same Idempotency-Key, replayed by the power API), never decide a second one.

Compressed timings: boot 6 s (`--quick` 4 s), device plugin 0.3 s; pods run 20 s (`--quick` 8 s).

Checked: per machine, power_cycles == 1 and exactly one start key (every start request of the machine
carries the key of the one decision), no duplicate transition (chaos/_autoprovision.py `power_report`), the
pod Running on its machine, the group Ready after the restart, and (variant while-booting) that the machine
was indeed still booting when the new operator process started.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _autoprovision import ApRig, Call, open_ap_rig, power_report
from _common import Detail, Figures, Found, Report, mode_of, run_scenario

from gpuops_sim.harness import until

NAME = "autoprovision_operator_kill"
NOTES = {
    "after_boot_power_cycles": "gpu-0: restarted after it booted (must be 1)",
    "while_booting_power_cycles": "gpu-1: restarted while it booted (must be 1)",
    "while_booting_start_requests_after_restart": "the same transition re-sent by the new process",
    "while_booting_replayed": "answers the power API replayed for the decision's key",
    "outage_seconds": "kill -> new process spawned",
    "duplicate_transitions": "new key for a start while booting/on (must be 0)",
}

VARIANTS = (("after_boot", "gpu-0"), ("while_booting", "gpu-1"))


async def variant(ap: ApRig, kind: str, machine: str, runtime: float, boot: float) -> tuple[dict[str, Any], list[str]]:
    killed = asyncio.Event()
    info: dict[str, Any] = {}

    def hook(call: Call) -> None:
        if call.machine == machine and call.op == "start" and not killed.is_set():
            ap.rig.kill()  # synchronous: the process is gone before the power API answers
            info["killed_at"] = time.time()
            info["key"] = call.key
            killed.set()

    ap.hooks.append(hook)
    t0 = time.time()
    pod = f"{kind.replace('_', '-')}"
    # pinned to its machine (nodeSelector on the hostname, which the planner reads from the group's template)
    await ap.create_pod(pod, 1, runtime, node=machine)
    problems: list[str] = []
    try:
        await asyncio.wait_for(killed.wait(), 30)
    except TimeoutError:
        problems.append(f"{kind}: no power-on request for {machine} within 30 s")
        ap.hooks.remove(hook)
        return info, problems
    ap.hooks.remove(hook)
    m = ap.machines[machine]
    if kind == "after_boot":
        async def booted() -> bool:
            node = ap.cluster.access.get(("", "nodes"), "", machine)
            alloc = ((node or {}).get("status") or {}).get("allocatable") or {}
            return m.state == "on" and str(alloc.get("nvidia.com/gpu", "0")) not in ("0", "")

        await until(f"{machine} booted with GPUs allocatable", booted, boot + 20)
    info["machine_state_at_restart"] = m.state
    spawn = time.time()
    await ap.rig.start_operator()
    info["outage_seconds"] = round(spawn - info["killed_at"], 3)
    info["restart_to_metrics_seconds"] = round(time.time() - spawn, 3)
    if kind == "while_booting" and info["machine_state_at_restart"] != "booting":
        problems.append(f"{kind}: {machine} was {info['machine_state_at_restart']!r}, not booting, at the restart")

    async def pod_running() -> bool:
        return ap.pods[pod].running is not None

    try:
        await until(f"pod {pod} Running", pod_running, 60)
        info["pod_node"] = ap.pods[pod].node
        info["pod_running_after_seconds"] = round((ap.pods[pod].running or 0) - t0, 3)
        if ap.pods[pod].node != machine:
            problems.append(f"{kind}: pod ran on {ap.pods[pod].node}, not {machine}")
    except TimeoutError as e:
        problems.append(f"{kind}: {e}")

    async def ready() -> bool:
        return ap.state(machine) == "Ready"

    try:
        await until(f"group {machine} Ready", ready, 30)
    except TimeoutError as e:
        problems.append(f"{kind}: {e} (state {ap.state(machine)})")
    starts = [c for c in ap.calls if c.machine == machine and c.op == "start"]
    info["start_requests"] = len(starts)
    info["start_keys"] = len({c.key for c in starts})
    info["start_requests_after_restart"] = sum(1 for c in starts if c.at >= spawn)
    info["replayed"] = sum(1 for c in starts if c.replayed)
    info["power_cycles"] = m.power_cycles
    if m.power_cycles != 1:
        problems.append(f"{kind}: {machine} powered on {m.power_cycles} times (want 1)")
    if info["start_keys"] != 1:
        problems.append(f"{kind}: {info['start_keys']} different start keys for {machine} (want 1)")
    return info, problems


async def scenario(quick: bool, seed: int) -> Found:
    boot, runtime = (4.0, 8.0) if quick else (6.0, 20.0)
    names = [m for _, m in VARIANTS]
    async with open_ap_rig("chaos-ap-kill", len(names), seed=seed, boot=boot) as ap:
        # long unneeded time: the machines stay on through the whole run (this scenario is about power-on)
        await ap.create_groups(names, unneeded=600)
        results: dict[str, Any] = {}
        problems: list[str] = []

        for kind, machine in VARIANTS:
            info, bad = await variant(ap, kind, machine, runtime, boot)
            results[kind] = info
            problems += bad
        figures, per, power_problems = power_report(ap, names)
        problems += power_problems
        for kind, info in results.items():
            for k in ("power_cycles", "start_requests", "start_keys", "start_requests_after_restart", "replayed",
                      "outage_seconds", "restart_to_metrics_seconds", "pod_running_after_seconds"):
                if k in info:
                    figures[f"{kind}_{k}"] = info[k]
        return figures, {"variants": results, "machines": per, "problems": problems, "trace": ap.trace(),
                         "timings": {"boot_seconds": boot, "pod_runtime_seconds": runtime}}, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    t = detail["timings"]
    rows = "\n".join(f"| {k} | {m} | {v.get('machine_state_at_restart', '-')} | {v.get('outage_seconds', '-')} | "
                     f"{v.get('power_cycles', '-')} | {v.get('start_requests', '-')} / {v.get('start_keys', '-')} | "
                     f"{v.get('start_requests_after_restart', '-')} | {v.get('replayed', '-')} | "
                     f"{v.get('pod_node', '-')} |" for (k, m), v in zip(VARIANTS, detail["variants"].values(),
                                                                           strict=False))
    injected = ("kill -9 inside the power-on request (machine booting, 2xx never seen); restart after the "
                f"boot / while booting (compressed: boot {t['boot_seconds']:g} s)")
    checked = "power_cycles == 1, one key per machine, 0 duplicates, pod Running, group Ready"
    key = (f"cycles {figures.get('after_boot_power_cycles', '-')}/{figures.get('while_booting_power_cycles', '-')}"
           f", re-sent after restart {figures.get('after_boot_start_requests_after_restart', '-')}/"
           f"{figures.get('while_booting_start_requests_after_restart', '-')} (replayed "
           f"{figures.get('while_booting_replayed', '-')}), duplicates {figures['duplicate_transitions']}")
    md = f"""# Autoprovision: operator kill -9 while a machine boots ({mode_of(args)} run)

The operator is killed (SIGKILL) inside the power API's start request, after the machine began booting and
before the answer; restarted after the boot finished (after_boot, gpu-0) or at once, while it boots
(while_booting, gpu-1). Compressed timings: boot {t['boot_seconds']:g} s, pod runtime {t['pod_runtime_seconds']:g} s.

Checked: power_cycles == 1 and a single Idempotency-Key per machine, no duplicate transition, the pod Running on
the machine, the group Ready; while_booting: the machine still booting when the new process started.

| variant | machine | machine at restart | outage (s) | power cycles | start requests / keys | \
requests after restart | replayed | pod ran on |
|---|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
