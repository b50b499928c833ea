"""A machine that never boots: its power-on is accepted, its Node never appears; timeout, backoff, another one.

Groups: `ghost` (1 GPU, so the smallest fit and tried first; nodeName `ghost`, a node that never exists; its
webhooks are a local endpoint that answers 202 to everything and powers nothing) and `gpu-0` (a real,
powered-off 8-GPU machine behind the emulated power API). One pending 1-GPU pod. Compressed timings:
ghost bootTimeoutSeconds 10 s (`--quick` 3 s), gpu-0 boots in 3 s (`--quick` 2 s). The operator's boot
backoff is its default (5 min base; not a flag of `gpuops run`), so ghost stays Failed for the whole run.

Checked: ghost powered on once (one request, one key), Failed once the boot timeout passed (not before),
with status.failures == 1, status.backoff_until about 5 min after the failure and a BootTimeout Warning
Event; not tried again while backing off; the pod Running on gpu-0, powered on once, no duplicate transition.
Figures: decision -> Failed (vs bootTimeoutSeconds), pod created -> Running (time to fallback).
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

from _autoprovision import Sink, group_body, open_ap_rig, power_report
from _common import Detail, Figures, Found, Report, mode_of, run_scenario

from gpuops_sim.harness import until

NAME = "autoprovision_never_boots"
NOTES = {
    "decision_to_failed_seconds": "ghost's decision (status.lastScaleUp) -> Failed (status.since), vs "
                                  "bootTimeoutSeconds",
    "pod_created_to_running_seconds": "time to fallback: the pod created -> Running on gpu-0",
    "backoff_seconds": "status.backoffUntil - Failed time (operator default 300 s)",
    "ghost_power_requests": "requests the never-booting machine's endpoint received (must be 1)",
}

BACKOFF_BASE = 300.0  # the operator's default boot backoff (reconciler.Settings.boot_backoff_base)


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def scenario(quick: bool, seed: int) -> Found:
    timeout, boot, runtime = (3, 2.0, 10.0) if quick else (10, 3.0, 30.0)
    sink = Sink()
    await sink.start()
    try:
        async with open_ap_rig("chaos-ap-never-boots", 1, seed=seed, boot=boot) as ap:
            ghost = group_body(ap.cluster.cloud.url, "gpu-0", 1, name="ghost", node="ghost", boot_timeout=timeout,
                               up_url=f"{sink.url}/power/ghost/start", unneeded=600)
            ghost["spec"]["scaleDown"]["url"] = f"{sink.url}/power/ghost/stop"
            await ap.create_group(ghost)
            await ap.create_groups(["gpu-0"], unneeded=600)
            t0 = time.time()
            await ap.create_pod("job", 1, runtime)
            problems: list[str] = []
            info: dict[str, Any] = {}

            async def failed() -> bool:
                return ap.state("ghost") == "Failed"

            try:
                await until("ghost Failed after its boot timeout", failed, timeout + 30, every=0.05)
                info["failed_seen"] = time.time()
            except TimeoutError as e:
                problems.append(f"{e} (state {ap.state('ghost')})")

            async def running() -> bool:
                return ap.pods["job"].running is not None

            try:
                await until("the pod Running on another machine", running, timeout + boot + 30)
            except TimeoutError as e:
                problems.append(str(e))
            await until("the group gpu-0 Ready", lambda: _ready(ap), 20)
            st = ap.group("ghost").get("status") or {}
            decided = [d for d in ap.decisions() if d.get("node") == "ghost" and d.get("direction") == "up"]
            decided_at = _ts(st.get("lastScaleUp"))  # the decision's own instant (its key's decidedAt)
            failed_since = _ts(st.get("since")) if st.get("state") == "Failed" else None
            backoff_until = _ts(st.get("backoffUntil"))
            job = ap.pods["job"]
            figures: dict[str, float | int] = {}
            if decided_at is not None and failed_since is not None:
                figures["decision_to_failed_seconds"] = round(failed_since - decided_at, 3)
                if failed_since - decided_at < timeout - 1e-6:
                    problems.append(f"ghost Failed {failed_since - decided_at:.3f} s after the decision, before "
                                    f"its {timeout} s boot timeout")
            else:
                problems.append(f"ghost: no decision time ({bool(decided)}) or no Failed time ({st.get('state')})")
            figures["boot_timeout_seconds"] = timeout
            figures["pod_created_to_running_seconds"] = round(job.running - t0, 3) if job.running else -1
            figures["failures"] = int(st.get("failures") or 0)
            figures["backoff_seconds"] = round(backoff_until - failed_since, 3) if backoff_until and failed_since \
                else -1
            figures["boot_timeout_events"] = ap.events("BootTimeout", "ghost")
            figures["ghost_power_requests"] = len(sink.requests)
            figures["ghost_power_keys"] = len({k for _, k in sink.requests})
            pf, per, power_problems = power_report(ap, ["gpu-0"])
            figures.update({f"gpu0_{k}": v for k, v in pf.items() if k in (
                "power_cycles", "power_on_decisions", "duplicate_transitions", "undecided_keys_sent")})
            problems += power_problems
            if job.node != "gpu-0":
                problems.append(f"the pod ran on {job.node!r}, not gpu-0")
            if figures["failures"] != 1:
                problems.append(f"ghost status.failures = {figures['failures']} (want 1)")
            if not (BACKOFF_BASE - 2 <= figures["backoff_seconds"] <= BACKOFF_BASE + 2):
                problems.append(f"ghost backoff {figures['backoff_seconds']} s (want {BACKOFF_BASE:g} s)")
            if figures["boot_timeout_events"] < 1:
                problems.append("no BootTimeout Event for ghost")
            if figures["ghost_power_requests"] != 1 or figures["ghost_power_keys"] != 1:
                problems.append(f"ghost: {len(sink.requests)} power requests with "
                                f"{figures['ghost_power_keys']} keys (want 1 and 1)")
            if ap.machines["gpu-0"].power_cycles != 1:
                problems.append(f"gpu-0 powered on {ap.machines['gpu-0'].power_cycles} times (want 1)")
            return figures, {"ghost_status": st, "machines": per, "problems": problems, "trace": ap.trace(),
                             "timings": {"boot_timeout_seconds": timeout, "boot_seconds": boot}}, not problems
    finally:
        await sink.stop()


async def _ready(ap: Any) -> bool:
    return bool(ap.state("gpu-0") == "Ready")


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    t = detail["timings"]
    injected = (f"a 1-GPU group whose power-on is accepted but whose node never joins (bootTimeoutSeconds "
                f"{t['boot_timeout_seconds']}), beside a real 8-GPU machine")
    checked = "Failed after the timeout, BootTimeout Event, backoffUntil, 1 request; pod runs on gpu-0"
    key = (f"Failed {figures.get('decision_to_failed_seconds', '-')} s after the decision; pod Running after "
           f"{figures['pod_created_to_running_seconds']:g} s; backoff {figures['backoff_seconds']:g} s")
    md = f"""# Autoprovision: a machine that never boots ({mode_of(args)} run)

`ghost` (1 GPU, the smallest fit) accepts its power-on (202) and never joins; `gpu-0` (8 GPUs) is a real
powered-off machine. One pending 1-GPU pod. Compressed timings: ghost bootTimeoutSeconds {t['boot_timeout_seconds']}
s, gpu-0 boot {t['boot_seconds']:g} s; boot backoff the operator's default (300 s).

Checked: ghost Failed after (not before) its boot timeout, failures 1, backoffUntil 300 s later, a BootTimeout
Event, one power request; the pod Running on gpu-0, powered on once, no duplicate transition."""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
