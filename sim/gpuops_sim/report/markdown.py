"""The demo report's README.md: what ran, one table per controller with its figures, the Events by reason, and
links to the plots. Text only: the figures come from the `Timeline`, the `Recorder` and the run's `RunInfo`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import Recorder
from .timeline import Timeline

__all__ = ["RunInfo", "render"]

ENFORCED = ("Paused", "Evicted")
READING = {
    "budgets": "How to read it: one panel per budget, its GPU-hours as a share of its own quota (left axis; "
               "GPU-hours on the right), so a tiny quota reads as clearly as a large one. Dashed red: the quota "
               "(100 %); dotted orange: when the budget went over quota; solid black: when its enforcement first "
               "acted (a Job paused, a pod evicted, an alert sent); triangles: each workload paused or evicted.",
    "nodes": "How to read it: top, the pods asking for whole GPUs that no node has taken yet (what makes the "
             "autoprovisioner power a machine on); middle, the scenario's machines stacked by power state; bottom, "
             "each machine's power state over time.",
    "spotpool": "How to read it: solid, the pool's Ready instances; dashed, how many it wants; shaded, the instances "
                "live at the cloud (a reclaimed one counts until it is gone). Dotted red lines and the row below: "
                "reclaim notices; the triangles: instance launches (xN: several at once).",
    "mig": "How to read it: the MIG GPUs' compute slices (a 1g slice counts 1, a 3g slice 3), stacked up to the "
           "capacity line: used by pods, free but fragmented (no slice of a waiting pod's profile fits there, by "
           "MIG's placement rules) and free and usable. Dashed red: the compute the pods not placed yet ask for. "
           "Demand above the usable band while a fragmented band remains means fragmented GPUs; no free band "
           "means full ones. Below: the MIG pods without their slice yet, by why they wait.",
}
"""What each plot shows and how to read it, under the plot in README.md."""


@dataclass(slots=True)
class RunInfo:
    scenario: str
    description: str
    planned_seconds: float | None
    elapsed: float
    ended_by: str
    """"the time limit", "Ctrl-C", ..."""
    operator: str
    """What became of `gpuops run`."""
    agents: list[str] = field(default_factory=list)
    """Nodes a MIG agent ran on."""
    summary: dict[str, Any] = field(default_factory=dict)
    """The cluster's `summary()` at the end."""
    compression: list[str] = field(default_factory=list)
    """How the scenario compresses time, one phrase each."""
    fault_offset: float = 0.0
    """Seconds between the cluster's start (fault times count from it) and the workload's (the plots' zero)."""


def _f(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _t(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(none in this scenario)", ""]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _budgets(tl: Timeline, rec: Recorder) -> list[str]:
    rows = []
    last = tl.last
    for name in tl.budget_names():
        b = last.budgets.get(name) if last else None
        involved = f"GPUWorkloadBudget/{name}"
        rows.append([
            f"`{name}`", b.action if b else "-", _f(b.quota if b else None, 3), _f(b.consumed if b else None),
            _f(tl.peak_consumed(name)), _t(tl.first_exceeded(name)),
            str(rec.count(ENFORCED, involved)), str(rec.count(("QuotaExceeded",), involved)),
            ("over quota" if b.exceeded else "within quota") if b else "-",
        ])
    return _table(["budget", "action", "quota (GPU-h)", "consumed at end (GPU-h)", "peak (GPU-h)",
                   "over quota from", "workloads paused/evicted", "QuotaExceeded Events", "state at end"], rows)


def _autoprovision(tl: Timeline, rec: Recorder) -> list[str]:
    last = tl.last
    rows = []
    for g in tl.group_names():
        gp = last.groups.get(g) if last else None
        node = gp.node if gp else ""
        ons, offs = tl.power_transitions(node)
        involved = f"GPUNodeGroup/{g}"
        rows.append([f"`{g}`", node or "-", (gp.state or "-") if gp else "-", str(ons), str(offs),
                     str(rec.count(("PowerOnDecided",), involved)), str(rec.count(("PowerOffDecided",), involved)),
                     _t(tl.seconds_in(node, "on")), (last.power.get(node, "-") if last else "-")])
    lines = _table(["GPUNodeGroup", "machine", "state at end", "power-ons seen", "power-offs seen",
                    "PowerOnDecided", "PowerOffDecided", "time on", "machine at end"], rows)
    if last is not None:
        power = Counter(last.power.values())
        peak_pending = max(s.pending_gpu_pods for s in tl.samples)
        lines += [f"All {len(last.power)} machines of the scenario at the end: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(power.items()))
                  + f". Pending GPU pods: peak {peak_pending}, at the end {last.pending_gpu_pods}.", ""]
    return lines


def _spot(tl: Timeline, rec: Recorder) -> list[str]:
    last = tl.last
    rows = []
    reclaims = tl.reclaim_times()
    launches = tl.launch_times()
    for name in tl.pool_names():
        p = last.pools.get(name) if last else None
        series = tl.pool_series(name)
        recovered = "-"
        if reclaims:
            r = reclaims[0]
            after = [(s.t, q) for s, q in zip(tl.samples, series, strict=True) if s.t >= r and q is not None]
            dip = next((t for t, q in after if q.ready < q.desired), None)
            back = next((t for t, q in after if dip is not None and t > dip and q.ready >= q.desired), None)
            relaunch = next((t for t in launches if t >= r), None)
            recovered = (f"replacement launched at {_t(relaunch)}; " if relaunch is not None else "no launch after; ")
            recovered += ("ready never fell below desired" if dip is None else
                          f"ready below desired from {_t(dip)}, back at desired {_t(back)}" if back is not None
                          else f"ready below desired from {_t(dip)}, not back by the end")
        rows.append([f"`{name}`", str(p.desired) if p else "-", str(p.ready) if p else "-", str(p.live) if p else "-",
                     str(last.launches if last else 0), str(rec.count(("Launched",), f"SpotPool/{name}")),
                     str(last.reclaims if last else 0), ", ".join(_t(t) for t in reclaims) or "-", recovered])
    return _table(["pool", "desired at end", "ready at end", "live instances at end", "instances launched (cloud)",
                   "Launched Events", "reclaim notices", "reclaim at", "after the first reclaim"], rows)


def _mig(tl: Timeline, rec: Recorder, summary: Mapping[str, Any]) -> list[str]:
    last = tl.last
    series = tl.slice_series()
    rows = [[f"`{p}`", str(last.slices.get(p, 0) if last else 0), str(max(v) if v else 0)]
            for p, v in series.items()]
    lines = _table(["MIG profile", "slices at end", "peak slices"], rows)
    waiting = [s.mig_waiting for s in tl.samples]
    lines += [f"Pods given slices by the agents' device plugins: {summary.get('mig_allocations', 0)}; "
              f"MigSlicesAllocated Events: {sum(n for (_, r), n in rec.by_reason.items() if r == 'MigSlicesAllocated')}"
              f"; FailedMigAllocation Events: "
              f"{sum(n for (_, r), n in rec.by_reason.items() if r == 'FailedMigAllocation')}. Pods waiting for a "
              f"slice: peak {max(waiting, default=0)}, at the end {waiting[-1] if waiting else 0}. "
              f"Slices in use at the end: {last.slices_in_use if last else 0}.", "", *_mig_compute(tl)]
    return lines


def _peak(tl: Timeline, values: list[int]) -> str:
    """"N at T s" for the largest value (its first time), "0" if it never rose."""
    top = max(values, default=0)
    return f"{top} at {tl.samples[values.index(top)].t:.0f} s" if top else "0"


def _mig_compute(tl: Timeline) -> list[str]:
    """The figures of the MIG plot, in compute slices (what `MigPoint` says)."""
    last = tl.last
    if last is None or not last.mig.capacity:
        return []
    m, series = last.mig, tl.mig_series()
    waits = tl.wait_series()
    reasons = "; ".join(f"{r} {max(v)}" for r, v in waits.items()) or "none"
    return [f"In compute slices (a 1g slice counts 1, a 3g slice 3; an A100 or H100 has 7): capacity "
            f"{m.capacity} on {m.gpus} MIG-enabled GPUs. Used by pods: peak {_peak(tl, series['used'])}, "
            f"{m.used} at the end. Free but fragmented (no waiting pod's profile fits there): peak "
            f"{_peak(tl, series['fragmented'])}. Demand of pods not placed yet: peak {_peak(tl, series['demand'])}, "
            f"{m.demand} at the end. Most MIG pods waiting at once, by reason: {reasons}.", ""]


def render(info: RunInfo, tl: Timeline, rec: Recorder, plots: Mapping[str, str], no_plots: str | None = None) -> str:
    """The README.md text; `plots` maps plot name (budgets, nodes, spotpool, mig) -> file name beside it."""
    s = info.summary
    planned = f" of {info.planned_seconds:.0f} s planned" if info.planned_seconds else ""
    submitted = s.get("submitted") or {}
    lines = [
        f"# gpuops demo report: scenario `{info.scenario}`", "",
        f"{info.description}", "",
        "## What ran", "",
        f"- {info.elapsed:.0f} s of workload{planned}, ended by {info.ended_by}; {len(tl)} samples of the "
        "emulated cluster's state, about one a second.",
        "- The emulated cluster (`gpuops_sim`: API server, scheduler, kubelets, Job controller, spot cloud, power "
        "API) in the demo's process.",
        f"- The operator as its own process, `gpuops run`, with all four controllers: {info.operator}.",
        f"- MIG node agents (`gpuops agent --emulated`) on {', '.join(info.agents) or 'no node'}.",
        "- Workload submitted: " + (", ".join(f"{k} {v}" for k, v in submitted.items()) or "none")
        + f"; pods bound by the scheduler {s.get('bound', 0)}.",
        "- Faults applied: " + ("; ".join(s.get("faults") or []) or "none")
        + (f" (fault times count from the cluster's start, {info.fault_offset:.1f} s before the workload's, "
           "where the plots' time starts)." if s.get("faults") else "."),
    ]
    if info.compression:
        lines += ["- Time is compressed so that every controller acts within two minutes: "
                  + "; ".join(info.compression) + "."]
    lines += [""]

    def plot(name: str, title: str) -> list[str]:
        if name in plots:
            return [f"![{title}]({plots[name]})", "", f"_{READING[name]}_", ""]
        return [f"_(plot not drawn: {no_plots or 'no data'})_", ""]

    lines += ["## Budgets (GPUWorkloadBudget)", "", *_budgets(tl, rec), *plot("budgets", "budget consumption")]
    lines += ["## Autoprovision (GPUNodeGroup)", "", *_autoprovision(tl, rec),
              *plot("nodes", "machines by power state")]
    lines += ["## Spot pool (SpotPool)", "", *_spot(tl, rec), *plot("spotpool", "spot pool size")]
    lines += ["## MIG slicer", "", *_mig(tl, rec, s), *plot("mig", "MIG compute slices")]
    lines += ["## Operator Events by reason", ""]
    lines += _table(["controller", "reason", "count"],
                    [[c, r, str(n)] for (c, r), n in sorted(rec.by_reason.items(), key=lambda kv: (-kv[1], kv[0]))])
    lines += ["## Plots", ""]
    lines += [f"- [{f}]({f})" for f in plots.values()] or [f"- none: {no_plots or 'no data'}"]
    return "\n".join(lines) + "\n"
