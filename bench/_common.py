"""Helpers every benchmark shares: results files, a server on its own loop thread, machine facts, and what the
benchmarks that run our operator beside a baseline share (their flags, running both at once, publishing)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from gpuops import logs

RESULTS = Path(__file__).resolve().parent / "results"
T = TypeVar("T")
U = TypeVar("U")


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(
    name: str, figures: dict[str, Any], summary_md: str, extra: dict[str, Any], folder: Path = RESULTS
) -> Path:
    """<folder>/<name>.json (machine facts, `figures`, then `extra`) and <folder>/<name>.md.

    `figures`: name -> number, or a scenario's own key -> its dict of name -> number (the README's headline table
    reads top-level numbers only).

    A quick run (`extra["mode"] == "quick"`, what CI does) writes to <folder>/quick/ instead (git-ignored), so it
    never replaces the committed full-run figures that the README's tables quote."""
    if extra.get("mode") == "quick":
        folder = folder / "quick"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"name": name, "machine": machine(), "figures": figures, **extra}, indent=2) + "\n")
    (folder / f"{name}.md").write_text(summary_md.rstrip() + "\n")
    return path


def publish(name: str, figures: dict[str, Any], summary_md: str, extra: dict[str, Any], folder: Path | None) -> Path:
    """`write_results` to `folder` (None: bench/results), then the page and the results path on stdout, where a
    benchmark run by hand or by `make bench` shows what it measured."""
    path = write_results(name, figures, summary_md, extra, **({"folder": folder} if folder else {}))
    print(summary_md)
    print(f"results: {path}")
    return path


def cli(doc: str | None, quick: str, *, seed: int | None = None) -> argparse.Namespace:
    """The flags of the benchmarks that run `gpuops run`: --quick (what CI runs; `quick` says how it shrinks),
    --seed when the workload is drawn at random (`seed`: its default), --out for a results folder other than
    bench/results. The operator's own log stays quiet in the terminal."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    args = parser.parse_args()
    logs.configure(json=False, level="WARNING")
    return args


def command(script: str, args: argparse.Namespace) -> str:
    """The command line that reproduces a run of bench/`script` with these flags (its results say it)."""
    return f"python bench/{script}" + (" --quick" if args.quick else "") + f" --seed {args.seed}"


async def beside_baseline(ours: Callable[[Path], Coroutine[Any, Any, T]],
                          baseline: Callable[[], Coroutine[Any, Any, U]]) -> tuple[T, U]:
    """Our operator (its kubeconfig and log in a temporary folder) and the baseline it is compared with, run at
    once in one process: both meet the same machine load over the same stretch of time."""
    with tempfile.TemporaryDirectory() as tmp:
        return await asyncio.gather(ours(Path(tmp)), baseline())


Run = dict[str, Any]


def compare(name: str, args: argparse.Namespace, mode: Any, workload: Any, *, recorded: dict[str, Any],
            ours: Callable[[Path], Coroutine[Any, Any, Run]], baseline: Callable[[], Coroutine[Any, Any, Run]],
            figures_of: Callable[[Run, Run], dict[str, Any]], markdown: Callable[..., str]) -> None:
    """A benchmark of our operator against a baseline on one drawn `workload`: both run at once
    (`beside_baseline`), `figures_of(ours, baseline)` and `markdown(figures, ours, baseline, command, mode,
    workload)` say what they measured, and the results hold the command, the mode (`mode`'s fields as
    mode_settings), the seed, the wall time, the workload as `recorded` and both runs' own records."""
    started = time.monotonic()
    ours_run, base_run = asyncio.run(beside_baseline(ours, baseline))
    cmd = command(f"{name}.py", args)
    fig = figures_of(ours_run, base_run)
    md = markdown(fig, ours_run, base_run, cmd, mode, workload)
    extra = {"command": cmd, "mode": "quick" if args.quick else "full", "seed": args.seed,
             "wall_seconds": round(time.monotonic() - started, 1), "mode_settings": mode.__dict__, **recorded,
             "ours": ours_run, "baseline": base_run}
    publish(name, fig, md, extra, args.out)


class LoopThread:
    """An asyncio loop on a background thread, so the measured server has its own scheduler."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
