"""The demo report's PNG plots, one per controller, drawn from a `Timeline` with matplotlib's Agg renderer.

matplotlib comes with the `report` extra and is imported here only, lazily, when a plot is drawn: the operator
never imports it, and `gpuops demo` without it still writes the Markdown (`available()` says why not the PNGs).
Figures are built with `matplotlib.figure.Figure` (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .timeline import POWER_STATES, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PLOTS", "available", "write_plots"]

POWER_COLORS = {"on": "#2ca02c", "booting": "#ff7f0e", "shutting-down": "#d62728", "off": "#c7c7c7"}
X_LABEL = "seconds since the workload started"


def available() -> str | None:
    """None when plots can be drawn, else the reason they cannot."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'gpuops[report]')"
    return None


def _figure(rows: int = 1, height: float = 4.2) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height), dpi=100, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)
    return fig, [a for row in axes for a in row]


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


def budgets(timeline: Timeline, path: Path, enforced: Mapping[str, Sequence[float]]) -> None:
    """Consumed GPU-hours per budget (solid) against its quota (dashed, same colour); enforcement marked."""
    fig, (ax,) = _figure()
    times = timeline.times
    for i, name in enumerate(timeline.budget_names()):
        color = f"C{i}"
        series = timeline.budget_series(name)
        consumed = [b.consumed if b is not None else None for b in series]
        quota = [b.quota if b is not None else None for b in series]
        action = next((b.action for b in series if b is not None), "")
        ax.plot(times, [float("nan") if v is None else v for v in consumed], color=color, linewidth=2,
                label=f"{name} consumed ({action})")
        ax.plot(times, [float("nan") if v is None else v for v in quota], color=color, linestyle="--",
                linewidth=1.5, label=f"{name} quota")
        first = timeline.first_exceeded(name)
        if first is not None:
            y = _value_at(times, consumed, first)
            if y is not None:
                ax.plot([first], [y], marker="o", markersize=9, markerfacecolor="none", color=color,
                        linestyle="none", label=f"{name} over quota (t={first:.0f} s)")
        marks = [(t, y) for t in enforced.get(name, ()) if (y := _value_at(times, consumed, t)) is not None]
        if marks:
            ax.plot([t for t, _ in marks], [y for _, y in marks], marker="v", markersize=7, color=color,
                    linestyle="none", label=f"{name}: {len(marks)} workload(s) {action.lower()}d")
    ax.set_title("Budgets: GPU-hours consumed in the rolling window vs quota")
    ax.set_ylabel("GPU-hours")
    ax.set_xlabel(X_LABEL)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    _finish(ax, timeline)
    fig.savefig(path)


def nodes(timeline: Timeline, path: Path) -> None:
    """Top: the scenario's machines stacked by power state, pending GPU pods on top. Bottom: each machine's state
    over time, the GPUNodeGroup-managed ones named."""
    fig, (top, bottom) = _figure(2, height=7.0)
    times = timeline.times
    counts = timeline.power_counts()
    top.stackplot(times, *[counts[s] for s in POWER_STATES], labels=list(POWER_STATES),
                  colors=[POWER_COLORS[s] for s in POWER_STATES], step="post", alpha=0.85)
    pending = [s.pending_gpu_pods for s in timeline.samples]
    top.step(times, pending, where="post", color="black", linewidth=1.5, label="pending GPU pods")
    top.set_title("Autoprovision: machines by power state, and the pending GPU pods that wake them")
    top.set_ylabel("machines / pods")
    top.legend(loc="upper left", fontsize=8, ncols=5)
    top.set_ylim(0, max([len(timeline.machine_names()), *pending, 1]) * 1.35)
    _finish(top, timeline, integer=True)
    managed = {gp.node: g for s in timeline.samples for g, gp in s.groups.items()}
    machines = timeline.machine_names()
    for row, m in enumerate(machines):
        spans: dict[str, list[tuple[float, float]]] = {}
        for a, b in zip(timeline.samples, timeline.samples[1:], strict=False):
            state = a.power.get(m)
            if state is not None:
                spans.setdefault(state, []).append((a.t, b.t - a.t))
        for state, bars in spans.items():
            bottom.broken_barh(bars, (row - 0.4, 0.8), facecolors=POWER_COLORS.get(state, "white"))
    bottom.set_yticks(range(len(machines)),
                      [f"{m} (GPUNodeGroup)" if m in managed else m for m in machines], fontsize=8)
    bottom.set_ylim(-0.6, len(machines) - 0.4)
    bottom.invert_yaxis()
    bottom.set_title("Each machine's power state (green on, orange booting, red shutting down, grey off)")
    bottom.set_xlabel(X_LABEL)
    _finish(bottom, timeline)
    fig.savefig(path)


def spotpool(timeline: Timeline, path: Path) -> None:
    """Ready and desired instances and the cloud's live instances per pool; launches and reclaims marked."""
    fig, (ax,) = _figure()
    times = timeline.times
    top = 1
    for i, name in enumerate(timeline.pool_names()):
        series = timeline.pool_series(name)
        ready = [p.ready if p else 0 for p in series]
        desired = [p.desired if p else 0 for p in series]
        live = [p.live if p else 0 for p in series]
        top = max(top, *ready, *desired, *live)
        ax.step(times, live, where="post", color=f"C{i}", linewidth=5, alpha=0.3,
                label=f"{name}: live instances (cloud)")
        ax.step(times, ready, where="post", color=f"C{i}", linewidth=2, label=f"{name}: ready")
        ax.step(times, desired, where="post", color="black", linestyle="--", linewidth=1.2,
                label=f"{name}: desired")
    for j, t in enumerate(timeline.reclaim_times()):
        ax.axvline(t, color="red", linestyle=":", linewidth=1.5, label="reclaim notice" if j == 0 else None)
    launches = timeline.launch_times()
    if launches:
        at = Counter(launches)
        ax.plot(list(at), [0.15] * len(at), marker="^", color="green", linestyle="none", markersize=8,
                label=f"instances launched ({len(launches)})")
        for t, n in at.items():
            if n > 1:
                ax.annotate(f"x{n}", (t, 0.15), textcoords="offset points", xytext=(6, -3), fontsize=8)
    ax.set_title("Spot pool: instances ready vs desired; reclaims and replacement launches")
    ax.set_ylabel("instances")
    ax.set_xlabel(X_LABEL)
    ax.set_ylim(0, top + 1.5)
    ax.legend(loc="upper left", fontsize=8, ncols=2)
    _finish(ax, timeline, integer=True)
    fig.savefig(path)


def mig(timeline: Timeline, path: Path) -> None:
    """MIG slices on the GPUs stacked by profile; slices in use and pods waiting for a slice as lines."""
    fig, (ax,) = _figure()
    times = timeline.times
    by_profile = timeline.slice_series()
    if by_profile:
        ax.stackplot(times, *by_profile.values(), labels=[f"slices {p}" for p in by_profile], step="post",
                     alpha=0.7)
    ax.step(times, [s.slices_in_use for s in timeline.samples], where="post", color="black", linewidth=1.5,
            label="slices in use by a pod's claim")
    ax.step(times, [s.mig_waiting for s in timeline.samples], where="post", color="red", linewidth=1.5,
            linestyle="--", label="pods waiting for a slice")
    ax.set_title("MIG slicer: slices on the GPUs by profile, and pods waiting")
    ax.set_ylabel("slices / pods")
    ax.set_xlabel(X_LABEL)
    ax.set_ylim(0, max([*(sum(v) for v in zip(*by_profile.values(), strict=True)),
                         *(s.mig_waiting for s in timeline.samples), 1]) * 1.3)
    ax.legend(loc="upper left", fontsize=8, ncols=3)
    _finish(ax, timeline, integer=True)
    fig.savefig(path)


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
    drawers: dict[str, Callable[[Path], None]] = {
        "budgets": lambda p: budgets(timeline, p, enforced),
        "nodes": lambda p: nodes(timeline, p),
        "spotpool": lambda p: spotpool(timeline, p),
        "mig": lambda p: mig(timeline, p),
    }
    out: dict[str, Path] = {}
    for name, draw in drawers.items():
        path = folder / PLOTS[name]
        draw(path)
        out[name] = path
    return out
