"""The demo's live terminal view: progress, one block per controller, the operator's latest Events.

`screen` is the full-screen picture redrawn in place on a terminal; `plain` is what a CI log gets instead:
a few self-contained lines every so often, then the Events recorded since the last time, no cursor control.
Both only format what a `Sample`, the cluster's `summary()` and the `Recorder` already hold.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from ..apiserver.tables import human_duration
from .events import Recorder
from .timeline import Sample

__all__ = ["controller_lines", "event_age", "plain", "progress", "screen"]

ENFORCED = ("Paused", "Evicted")


def progress(elapsed: float, total: float | None, width: int = 30) -> str:
    if total is None or total <= 0:
        return f"{elapsed:5.0f} s (Ctrl-C ends the demo and writes the report)"
    done = min(1.0, max(0.0, elapsed / total))
    filled = int(done * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {elapsed:5.0f} / {total:.0f} s"


def event_age(elapsed: float, at: float) -> str:
    """How long ago an Event arrived, in `kubectl get events`' age format (5s, 2m10s), clamped at 0s. An age
    rather than the recorder's time, which counts from the workload's start and is negative for the Events of
    the operator's start-up; the clamp because an Event recorded while a frame is drawn has a time past that
    frame's `elapsed` (the demo loop and the recorder read the clock separately)."""
    return human_duration(timedelta(seconds=max(0.0, elapsed - at)))


def _budget_line(name: str, b: Any, recorder: Recorder) -> str:
    consumed = "-" if b.consumed is None else f"{b.consumed:.4f}"
    quota = "-" if b.quota is None else f"{b.quota:g}"
    share = f"{100 * b.consumed / b.quota:4.0f}%" if b.consumed is not None and b.quota else "   -"
    enforced = recorder.count(ENFORCED, f"GPUWorkloadBudget/{name}")
    if not b.exceeded:
        state = "within quota"
    elif b.action == "AlertOnly":
        state = "OVER QUOTA, alerting only"
    else:
        state = f"OVER QUOTA, {b.action}: {enforced} workload(s) {'paused' if b.action == 'Pause' else 'evicted'}"
    return f"  {name:<26} {consumed:>8} / {quota:<6} GPU-h {share}  {b.action:<9} {state}"


def controller_lines(sample: Sample | None, recorder: Recorder, mig_pods_served: int = 0) -> list[str]:
    """One short block per controller: budgets, autoprovision, spot pool, MIG slicer."""
    if sample is None:
        return ["  (no sample yet)"]
    lines = ["budgets (GPUWorkloadBudget):"]
    lines += [_budget_line(n, b, recorder) for n, b in sorted(sample.budgets.items())] or ["  (none)"]
    power = Counter(sample.power.values())
    lines.append("autoprovision: machines " + ", ".join(f"{s} {power[s]}" for s in ("on", "booting",
                                                                                      "shutting-down", "off"))
                 + f"; pending GPU pods {sample.pending_gpu_pods}")
    for g, gp in sorted(sample.groups.items()):
        lines.append(f"  GPUNodeGroup {g:<12} {gp.state or '(no status yet)':<12} machine {gp.node or '-'}: "
                     f"{sample.power.get(gp.node, '-')}")
    reclaimed = recorder.times("Reclaimed")
    for name, p in sorted(sample.pools.items()):
        lines.append(f"spot pool {name}: ready {p.ready}/{p.desired} desired, live instances {p.live}, "
                     f"launched {sample.launches}, reclaimed {sample.reclaims}"
                     + (f" (last Reclaimed Event at {reclaimed[-1]:.0f} s)" if reclaimed else ""))
    if not sample.pools:
        lines.append("spot pool: (none)")
    slices = ", ".join(f"{p} x{k}" for p, k in sample.slices.items()) or "none"
    lines.append(f"MIG slicer: slices {slices} (in use {sample.slices_in_use}); pods waiting for a slice "
                 f"{sample.mig_waiting}; pods given slices {mig_pods_served}")
    m = sample.mig
    if m.capacity:
        lines.append(f"  compute slices: used {m.used}/{m.capacity}, free {m.free}, fragmented {m.fragmented}; "
                     f"asked by pods not placed yet {m.demand}")
    return lines


def _nodes(summary: dict[str, Any]) -> list[str]:
    lines = [f"{'NODE':<12} {'MODEL':<11} {'POWER':<14} {'READY':<6} GPUS (used/allocatable)"]
    for n in summary["nodes"]:
        bar = "#" * n["gpus_used"] + "." * max(0, n["gpus"] - n["gpus_used"])
        cordon = " cordoned" if n["unschedulable"] else ""
        mig = "  MIG " + ", ".join(f"{p} x{k}" for p, k in sorted(n["mig"].items())) if n.get("mig") else ""
        lines.append(f"{n['name']:<12} {n['model'] or '-':<11} {n['power']:<14} {n['ready']!s:<6} "
                     f"{n['gpus_used']}/{n['gpus']} {bar}{cordon}{mig}")
    for m in summary["machines_off"]:
        if not any(n["name"] == m for n in summary["nodes"]):
            lines.append(f"{m:<12} {'':<11} {'off':<14} {'-':<6} (never registered)")
    return lines


def screen(summary: dict[str, Any], sample: Sample | None, recorder: Recorder, *, elapsed: float,
           total: float | None, operator: str) -> str:
    """The full picture for a terminal (the caller clears the screen before writing it)."""
    pods = summary["pods"]
    lines = [f"gpuops demo - scenario {summary['scenario']} - operator: {operator}",
             progress(elapsed, total), "", *_nodes(summary), "",
             "pods: " + (", ".join(f"{k} {v}" for k, v in sorted(pods.items())) or "none")
             + f"  (unschedulable {summary['unschedulable']})   jobs: "
             + (", ".join(f"{k} {v}" for k, v in sorted(summary["jobs"].items())) or "none")
             + f"   GPUs in use: {summary['gpus_used']} of {summary['gpus_total']}", ""]
    lines += controller_lines(sample, recorder, summary.get("mig_allocations", 0))
    if summary["faults"]:
        lines += ["", "faults: " + "; ".join(summary["faults"][-3:])]
    lines += ["", "what the controllers did (latest Events):"]
    lines += [f"  {event_age(elapsed, e.t):>6} ago  {e.line(140)}" for e in recorder.recent] or ["  (nothing yet)"]
    return "\n".join(lines)


def plain(summary: dict[str, Any], sample: Sample | None, recorder: Recorder, *, elapsed: float,
          total: float | None, operator: str, events_from: int) -> str:
    """A block of plain lines for logs: progress, the controllers, then the Events since `events_from`."""
    head = f"[{elapsed:4.0f}{'' if total is None else f'/{total:.0f}'} s]"
    pods = summary["pods"]
    lines = [f"{head} operator {operator}; pods " + (", ".join(f"{k} {v}" for k, v in sorted(pods.items()))
                                                      or "none")
             + f"; GPUs in use {summary['gpus_used']} of {summary['gpus_total']}"]
    lines += [f"{head} {line.strip()}" for line in controller_lines(sample, recorder,
                                                                     summary.get("mig_allocations", 0))]
    lines += [f"{head} event {event_age(elapsed, e.t):>5} ago {e.line(160)}" for e in recorder.since(events_from)]
    return "\n".join(lines)
