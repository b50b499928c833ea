"""What `gpuops demo` shows and leaves behind: a timeline sampled from the emulated cluster (`timeline`), the
operator's Events (`events`), the live terminal view (`live`), PNG plots (`plots`, matplotlib, lazily) and the
Markdown report (`markdown`). `write_report` puts the last two into a folder."""

from __future__ import annotations

from pathlib import Path

from . import markdown, plots
from .events import Recorder
from .markdown import RunInfo
from .timeline import Timeline

__all__ = ["RunInfo", "write_report"]


def enforcement_times(timeline: Timeline, recorder: Recorder) -> dict[str, list[float]]:
    """Budget -> when the budget controller paused or evicted a workload of it."""
    return {name: [e.t for e in recorder.all if e.reason in markdown.ENFORCED
                   and e.involved == f"GPUWorkloadBudget/{name}"] for name in timeline.budget_names()}


def write_report(folder: Path, info: RunInfo, timeline: Timeline, recorder: Recorder) -> Path:
    """Write README.md and the PNGs into `folder` (created if needed); returns the README's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in plots.PLOTS.values():  # never leave an earlier run's plot beside this run's report
        (folder / name).unlink(missing_ok=True)
    no_plots = plots.available() if timeline.samples else "no samples were taken"
    written: dict[str, str] = {}
    if no_plots is None:
        try:
            written = {k: p.name for k, p in plots.write_plots(timeline, folder,
                                                               enforcement_times(timeline, recorder)).items()}
        except Exception as e:  # a plot that cannot be drawn must not cost the report
            no_plots = f"drawing failed: {type(e).__name__}: {e}"
    readme = folder / "README.md"
    readme.write_text(markdown.render(info, timeline, recorder, written, no_plots))
    return readme
