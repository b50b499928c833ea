"""The demo report's PNG plots, one per controller, drawn from a `Timeline` with matplotlib's Agg renderer.

matplotlib comes with the `report` extra and is imported here only, lazily, when a plot is drawn: the operator
never imports it, and `gpuops demo` without it still writes the Markdown (`available()` says why not the PNGs).
Figures are built with `matplotlib.figure.Figure` (no pyplot, no global state, no display needed).

Each plot is meant to be read at a glance by someone new to the demo: a title saying what it shows, axes labelled
with their units, legends beside or below the axes (never over the data), and quantities that compare fairly
(MIG slices weighed by their compute, budgets as a share of their own quota).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .timeline import (
    CANNOT_PLACE,
    CREATING,
    HANDING_OVER,
    NO_PLACEMENT,
    NOT_PLANNED,
    POWER_STATES,
    QUEUED,
    SCHEDULING,
    UNSCHEDULABLE,
    BudgetPoint,
    Timeline,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

__all__ = ["PLOTS", "available", "draw", "write_plots"]

POWER_COLORS = {"on": "#2ca02c", "booting": "#ff7f0e", "shutting-down": "#d62728", "off": "#c7c7c7"}
MIG_COLORS = {"used": "#1f77b4", "unowned": "#9467bd", "fragmented": "#ff7f0e", "free": "#b5e3a8"}
MIG_LABELS = {
    "used": "used: allocated to pods (made or being made)",
    "unowned": "made, no pod left (being destroyed)",
    "fragmented": "free but fragmented: no slice of a waiting pod's\nprofile fits there (of any profile if none wait)",
    "free": "free and usable",
}
WAIT_COLORS = {NO_PLACEMENT: "#d62728", NOT_PLANNED: "#bcbd22", CREATING: "#8c564b", QUEUED: "#17becf",
               HANDING_OVER: "#9edae5", SCHEDULING: "#c49c94", UNSCHEDULABLE: "#e377c2", CANNOT_PLACE: "#7f7f7f"}
ACTIONS = {"Pause": "workloads paused", "Evict": "pods evicted", "AlertOnly": "alert sent"}
X_LABEL = "time since the workload started (s)"
QUOTA_COLOR = "#d62728"


def available() -> str | None:
    """None when plots can be drawn, else the reason they cannot."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'gpuops[report]')"
    return None


def _figure(rows: int = 1, height: float = 4.2, ratios: Sequence[float] | None = None) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, height), dpi=100, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False, height_ratios=ratios)
    return fig, [a for row in axes for a in row]


def _legend(ax: Axes) -> None:
    """The legend right of the axes, outside them: it never hides a line (constrained layout makes room)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)


def _nan(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def _finish(ax: Axes, timeline: Timeline, integer: bool = False) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.grid(True, alpha=0.3)
    if integer:  # counts of machines, instances, slices, pods
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if timeline.samples:
        ax.set_xlim(timeline.samples[0].t, max(timeline.samples[-1].t, timeline.samples[0].t + 1))


def _value_at(times: Sequence[float], values: Sequence[float | None], t: float) -> float | None:
    """The last known value at or before `t` (step interpolation)."""
    got: float | None = None
    for x, v in zip(times, values, strict=True):
        if x > t:
            break
        if v is not None:
            got = v
    return got


def budgets(timeline: Timeline, enforced: Mapping[str, Sequence[float]]) -> Figure:
    """One panel per budget, its consumption as % of its own quota: quotas of 0.01 and 100 GPU-hours read alike.
    The quota (100 %) is a dashed line; when the budget went over quota and when its enforcement first acted are
    vertical lines; each workload paused or evicted is a marker on the curve; the right axis gives GPU-hours."""
    names = timeline.budget_names()
    fig, axes = _figure(max(1, len(names)), height=1.2 + 2.7 * max(1, len(names)))
    for ax, name in zip(axes, names, strict=False):
        _budget_panel(ax, timeline, name, enforced.get(name, ()))
    if not names:
        axes[0].text(0.5, 0.5, "no GPUWorkloadBudget in this run", ha="center", va="center",
                     transform=axes[0].transAxes)
        axes[0].set_ylabel("% of quota")
    fig.suptitle("Budgets: GPU-hours used in the rolling window, as % of each budget's own quota")
    axes[-1].set_xlabel(X_LABEL)
    for ax in axes:
        _finish(ax, timeline)
    if names:
        fig.legend(handles=_budget_handles(), loc="outside lower center", ncols=5, fontsize=8, frameon=False)
    return fig


def _budget_handles() -> list[Line2D]:
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="C0", linewidth=2, label="consumed (% of quota)"),
            Line2D([], [], color=QUOTA_COLOR, linestyle="--", label="quota (100 %)"),
            Line2D([], [], color="#ff7f0e", linestyle=":", linewidth=2, label="went over quota"),
            Line2D([], [], color="black", linewidth=1.5, label="enforcement acted first"),
            Line2D([], [], color="black", marker="v", linestyle="none", label="each workload paused/evicted")]


def _budget_panel(ax: Axes, timeline: Timeline, name: str, events: Sequence[float]) -> None:
    times = timeline.times
    pct = timeline.budget_percent(name)
    last = next((b for b in reversed(timeline.budget_series(name)) if b is not None), None)
    known = [v for v in pct if v is not None]
    top = max([120.0, *known]) * 1.12
    ax.plot(times, _nan(pct), color="C0", linewidth=2)
    ax.axhline(100, color=QUOTA_COLOR, linestyle="--", linewidth=1.2)
    ax.axhspan(100, top, color=QUOTA_COLOR, alpha=0.05)
    over = timeline.first_exceeded(name)
    if over is not None:
        ax.axvline(over, color="#ff7f0e", linestyle=":", linewidth=2)
    steps = [t for t, result in timeline.enforcement_steps(name) if result not in ("Resumed", "Failed", "Blocked")]
    acted = min([*events[:1], *steps[:1]], default=None)
    if acted is not None:
        ax.axvline(acted, color="black", linewidth=1.5)
    marks = [(t, y) for t in events if (y := _value_at(times, pct, t)) is not None]
    if marks:
        ax.plot([t for t, _ in marks], [y for _, y in marks], marker="v", markersize=7, color="black",
                linestyle="none")
    ax.set_ylim(0, top)
    ax.set_ylabel("% of quota")
    ax.set_title(_budget_title(name, last, max(known, default=None), over, acted, len(events)), fontsize=10,
                 loc="left")
    if last is not None and last.quota:
        quota = last.quota

        def hours(percent: Any) -> Any:
            return percent * quota / 100

        def percent(h: Any) -> Any:
            return h * 100 / quota

        ax.secondary_yaxis("right", functions=(hours, percent)).set_ylabel("GPU-hours")


def _budget_title(name: str, last: BudgetPoint | None, peak: float | None, over: float | None,
                  acted: float | None, events: int) -> str:
    """What a reader wants first: the budget, its quota and action, and what happened when."""
    if last is None:
        return f"{name}: no status written yet"
    window = f" per {last.window_hours:g} h window" if last.window_hours else ""
    head = f"{name}: quota {last.quota:g} GPU-h{window}, action {last.action}" if last.quota else name
    story = ["peak " + (f"{peak:.0f} % of quota" if peak is not None else "-")]
    if over is not None:
        story.append(f"over quota from {over:.0f} s")
    if acted is not None:
        what = ACTIONS.get(last.action, "enforced")
        story.append(f"{what} from {acted:.0f} s" + (f" ({events} in all)" if events > 1 else ""))
    elif over is None:
        story.append("never over quota")
    return head + "\n" + "; ".join(story)


def nodes(timeline: Timeline) -> Figure:
    """Top: pods asking for whole GPUs that no node took (what wakes a machine). Middle: the scenario's machines
    stacked by power state. Bottom: each machine's power state over time. Pods and machines get their own axes:
    one count drawn over the other's stack read as part of it."""
    machines = _machines_to_show(timeline)
    fig, (pending_ax, stack, per_machine) = _figure(3, height=4.6 + 0.3 * len(machines),
                                                    ratios=(1.0, 1.0, max(1.2, 0.15 * len(machines))))
    times = timeline.times
    pending = [s.pending_gpu_pods for s in timeline.samples]
    pending_ax.fill_between(times, pending, step="post", color="#7f7f7f", alpha=0.35)
    pending_ax.step(times, pending, where="post", color="black", linewidth=1.5, label="pending GPU pods")
    pending_ax.set_title("Autoprovision: pending GPU pods (no node took them yet) and the machines they wake",
                         loc="left")
    pending_ax.set_ylabel("pods")
    pending_ax.set_ylim(0, max([*pending, 1]) * 1.15)
    _legend(pending_ax)
    _finish(pending_ax, timeline, integer=True)
    counts = timeline.power_counts()
    stack.stackplot(times, *[counts[s] for s in POWER_STATES], labels=list(POWER_STATES),
                    colors=[POWER_COLORS[s] for s in POWER_STATES], step="post")
    total = len(timeline.machine_names())
    stack.set_title(f"The scenario's {total} machines by power state (spot instances: see the spot pool plot)",
                    loc="left")
    stack.set_ylabel("machines")
    stack.set_ylim(0, max(total, 1))
    _legend(stack)
    _finish(stack, timeline, integer=True)
    _machine_bars(per_machine, timeline, machines)
    per_machine.set_xlabel(X_LABEL)
    _finish(per_machine, timeline)
    return fig


def _machines_to_show(timeline: Timeline) -> list[str]:
    """Every machine on a small cluster; on a large one those a GPUNodeGroup manages or whose state changed."""
    machines = timeline.machine_names()
    if len(machines) <= 16:
        return machines
    managed = {gp.node for s in timeline.samples for gp in s.groups.values()}
    return [m for m in machines if m in managed or len({s.power.get(m) for s in timeline.samples}) > 1][:40]


def _machine_bars(ax: Axes, timeline: Timeline, machines: list[str]) -> None:
    managed = {gp.node for s in timeline.samples for gp in s.groups.values()}
    for row, m in enumerate(machines):
        spans: dict[str, list[tuple[float, float]]] = {}
        for a, b in zip(timeline.samples, timeline.samples[1:], strict=False):
            state = a.power.get(m)
            if state is not None:
                spans.setdefault(state, []).append((a.t, b.t - a.t))
        for state, bars in spans.items():
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=POWER_COLORS.get(state, "white"))
    ax.set_yticks(range(len(machines)), [f"{m} (GPUNodeGroup)" if m in managed else m for m in machines],
                  fontsize=8)
    ax.set_ylim(-0.6, max(len(machines), 1) - 0.4)
    ax.invert_yaxis()
    shown = "" if len(machines) == len(timeline.machine_names()) else " (those managed or that changed state)"
    ax.set_title(f"Each machine's power state over time{shown}, colours as above", loc="left")
    ax.set_ylabel("machine")


def spotpool(timeline: Timeline) -> Figure:
    """Top: per pool, the instances the controller wants (desired) and has Ready, over the cloud's live ones
    (what is billed, a reclaimed instance included until it is gone). Bottom: when instances were launched and
    reclaim notices came, as events on their own rows (not as points at some instance count)."""
    fig, (ax, events) = _figure(2, height=5.4, ratios=(3.0, 1.0))
    times = timeline.times
    top = 1
    for i, name in enumerate(timeline.pool_names()):
        series = timeline.pool_series(name)
        ready = [p.ready if p else 0 for p in series]
        desired = [p.desired if p else 0 for p in series]
        live = [p.live if p else 0 for p in series]
        top = max(top, *ready, *desired, *live)
        ax.fill_between(times, live, step="post", color=f"C{i}", alpha=0.18,
                        label=f"{name}: live instances at the cloud")
        ax.step(times, ready, where="post", color=f"C{i}", linewidth=2.5, label=f"{name}: ready (nodes Ready)")
        ax.step(times, desired, where="post", color="black", linestyle="--", linewidth=1.2,
                label=f"{name}: desired")
    reclaims = timeline.reclaim_times()
    for j, t in enumerate(sorted(set(reclaims))):
        ax.axvline(t, color="red", linestyle=":", linewidth=1.5, label="reclaim notice" if j == 0 else None)
    ax.set_title("Spot pool: instances desired, ready and live; reclaim notices and the launches replacing them",
                 loc="left")
    ax.set_ylabel("instances")
    ax.set_ylim(0, top + 0.6)
    _legend(ax)
    _finish(ax, timeline, integer=True)
    _event_rows(events, [("instances launched", timeline.launch_times(), "green", "^"),
                         ("reclaim notices", reclaims, "red", "v")])
    events.set_xlabel(X_LABEL)
    _finish(events, timeline)
    return fig


def _event_rows(ax: Axes, rows: list[tuple[str, list[float], str, str]]) -> None:
    """One row of markers per kind of event, several at one moment written as xN beside the marker."""
    for row, (label, times, color, marker) in enumerate(rows):
        at = Counter(times)
        ax.plot(list(at), [row] * len(at), marker=marker, color=color, linestyle="none", markersize=9,
                label=f"{label} ({len(times)})", clip_on=False)  # at the first sample: on the axes' edge
        for t, n in at.items():
            if n > 1:
                ax.annotate(f"x{n}", (t, row), textcoords="offset points", xytext=(7, -3), fontsize=8,
                            annotation_clip=False)
    ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
    ax.tick_params(axis="y", pad=8)  # clear of a marker on the axes' left edge
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_ylabel("events")
    _legend(ax)


def mig(timeline: Timeline) -> Figure:
    """Top: the MIG GPUs' compute slices (1g = 1 ... 7g = 7), stacked used / made-but-unowned / free-but-fragmented
    / free-and-usable up to the capacity line, with the waiting pods' demand as a line: demand above the usable
    band with a fragmented band below it says "fragmented", no free band at all says "full". Bottom: the MIG pods
    without their slice yet, by why they wait."""
    fig, (ax, why) = _figure(2, height=7.0, ratios=(2.4, 1.2))
    times = timeline.times
    series = timeline.mig_series()
    parts = [k for k in MIG_COLORS if k != "unowned" or any(series[k])]
    ax.stackplot(times, *[series[k] for k in parts], labels=[MIG_LABELS[k] for k in parts],
                 colors=[MIG_COLORS[k] for k in parts], step="post",
                 hatch=["//" if k == "fragmented" else "" for k in parts])
    ax.step(times, series["capacity"], where="post", color="black", linewidth=2,
            label="capacity: all compute slices of the MIG GPUs")
    ax.step(times, series["demand"], where="post", color="#d62728", linestyle="--", linewidth=2.2,
            label="demand: compute asked by pods not placed yet")
    last = timeline.last
    gpus = f"{last.mig.gpus} MIG GPUs, {last.mig.capacity} compute slices" if last is not None else "no MIG GPU"
    ax.set_title(f"MIG slicer: where the GPUs' compute slices go ({gpus}; a 1g slice counts 1, a 3g slice 3)",
                 loc="left")
    ax.set_ylabel("compute slices")
    ax.set_ylim(0, max([*series["capacity"], *series["demand"], 1]) * 1.08)
    _legend(ax)
    _finish(ax, timeline, integer=True)
    waits = timeline.wait_series()
    if waits:
        why.stackplot(times, *waits.values(), labels=list(waits), colors=[WAIT_COLORS[r] for r in waits],
                      step="post")
    else:
        why.text(0.5, 0.5, "no MIG pod waited for a slice", ha="center", va="center", transform=why.transAxes)
    why.set_title("MIG pods without their slice yet, by why they wait", loc="left")
    why.set_ylabel("MIG pods")
    why.set_ylim(0, max([sum(v) for v in zip(*waits.values(), strict=True)] + [1]) * 1.1)
    why.set_xlabel(X_LABEL)
    if waits:
        _legend(why)
    _finish(why, timeline, integer=True)
    return fig


def draw(name: str, timeline: Timeline, enforced: Mapping[str, Sequence[float]]) -> Figure:
    """The figure of plot `name` (a key of PLOTS)."""
    drawers: dict[str, Callable[[], Figure]] = {
        "budgets": lambda: budgets(timeline, enforced),
        "nodes": lambda: nodes(timeline),
        "spotpool": lambda: spotpool(timeline),
        "mig": lambda: mig(timeline),
    }
    return drawers[name]()


PLOTS: dict[str, str] = {
    "budgets": "budgets.png",
    "nodes": "nodes.png",
    "spotpool": "spotpool.png",
    "mig": "mig.png",
}
"""Plot -> file name in the report folder."""


def write_plots(timeline: Timeline, folder: Path, enforced: Mapping[str, Sequence[float]]) -> dict[str, Path]:
    """Draw every plot into `folder`; returns plot name -> path of what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, file in PLOTS.items():
        path = folder / file
        draw(name, timeline, enforced).savefig(path)
        out[name] = path
    return out
