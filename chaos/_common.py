"""What every chaos scenario shares, whatever its controller: how a scenario script runs and what it writes.

Every scenario script runs the same way (`run_scenario`): its flags, the scenario, the `passed` figure, its
`Report` (the page, its figures with their meanings, its SUMMARY.md row), the closing lines (`closing`), the
results files and the exit status. The rigs of every controller are `OnHarness`: a harness running
`gpuops run` and the emulated cluster it drives; `WatchFaults` are the watch faults of the API-server scenarios.

Results: `write_results` writes chaos/results/<name>.json (machine facts, `figures`, `passed`, a one-line
`summary`, then the scenario's detail) and <name>.md, then regenerates chaos/results/SUMMARY.md from every
results file there.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuops import logs
from gpuops_sim.apiserver.server import APIServer
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, until

__all__ = [
    "RESULTS", "Detail", "Figures", "Found", "OnHarness", "Report", "WatchFaults", "cli", "closing", "command",
    "figures_table", "load_bench", "log_records", "metric_sum", "mode_of", "pace", "run_scenario", "wait_for",
    "write_results",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def load_bench(name: str) -> Any:
    """bench/<name>.py as the module gpuops_bench_<name>. Both folders hold a `_common`, and this one is the
    scripts' `_common`; while the bench module runs, `_common` is bench's, so its own imports get what they mean."""
    spec = importlib.util.spec_from_file_location(f"gpuops_bench_{name.lstrip('_')}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class body runs
    ours = sys.modules.get("_common")
    if name != "_common":
        sys.modules["_common"] = _BENCH
    try:
        spec.loader.exec_module(module)
    finally:
        if ours is not None:
            sys.modules["_common"] = ours
    return module


_BENCH = load_bench("_common")


# ---------------------------------------------------------------------------------------------- the rig


@dataclass
class OnHarness:
    """What every controller's rig starts from: the harness running `gpuops run` against an emulated cluster.
    Scenario code reads and writes the cluster in-process (`cluster`), so faults injected into HTTP requests are
    the operator's alone."""

    rig: OperatorHarness

    @property
    def cluster(self) -> SimCluster:
        return self.rig.cluster

    def operator_log(self, event: str) -> list[dict[str, Any]]:
        """The operator's JSON log records (all its starts, each tagged `start`) whose `event` is `event`."""
        return log_records(self.rig.log_path, event)


async def wait_for(what: str, probe: Callable[[], bool], within: float, every: float = 0.05) -> float:
    """Until `probe()` holds; the monotonic instant it was first seen (TimeoutError naming `what` after `within`).
    For probes of in-process state, which need no awaiting; the instant lets a scenario time a recovery."""
    async def probed() -> bool:
        return probe()

    await until(what, probed, within, every)
    return time.monotonic()


async def pace(origin: float, offset: float) -> None:
    """Sleep until `offset` seconds after `origin` (time.time()): the scenario's timeline, not a wait for state."""
    await asyncio.sleep(max(0.0, origin + offset - time.time()))


@dataclass
class WatchFaults:
    """The watch faults of the API-server scenarios, counted: every open watch closed every `every` seconds
    (informers must re-watch), a store compaction followed by a drop (re-watches from their last resourceVersion
    meet 410 Gone and must relist), and an outage (the port closed: connections refused)."""

    server: APIServer
    every: float
    dropped: int = 0
    """Watch connections closed, the compactions' included."""
    rounds: int = 0
    """Periodic drops done (a compaction's drop is not one)."""
    compactions: int = 0
    compacted_rv: int = 0
    outage_seconds: float = 0.0

    async def drop_every(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.every)  # the fault's cadence
            except TimeoutError:
                self.dropped += self.server.drop_watches()
                self.rounds += 1

    def compact(self) -> None:
        self.compacted_rv = self.server.compact()
        self.dropped += self.server.drop_watches()
        self.compactions += 1

    async def outage(self, seconds: float) -> None:
        began = time.time()
        await self.server.outage(seconds)
        self.outage_seconds = round(time.time() - began, 3)


def metric_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of every sample of `name` carrying all of `labels` (0 when there is none)."""
    want = [f'{k}="{v}"' for k, v in (labels or {}).items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name and all(w in head for w in want):
            total += float(value)
    return total


# ---------------------------------------------------------------------------------------------- results


def figures_table(figures: Mapping[str, float | int], notes: Mapping[str, str] | None = None) -> str:
    rows = ["| figure | value | meaning |", "|---|---|---|"]
    for k, v in figures.items():
        rows.append(f"| `{k}` | {v:g} | {(notes or {}).get(k, '')} |")
    return "\n".join(rows)


def write_results(name: str, figures: dict[str, float | int], md: str, *, passed: bool, summary: dict[str, str],
                  extra: dict[str, Any]) -> Path:
    """<name>.json and <name>.md under chaos/results (chaos/results/quick for --quick runs, git-ignored, so CI
    never replaces the committed full runs), then SUMMARY.md from every results file there; prints the summary
    and the path.

    `summary`: injected, checked, key (one line each) for SUMMARY.md."""
    path: Path = _BENCH.write_results(name, figures, md, {"passed": int(passed), "summary": summary, **extra},
                                      folder=RESULTS)
    write_summary(path.parent)
    print(md)
    print(f"wrote {path}")
    return path


def write_summary(folder: Path = RESULTS) -> Path:
    rows = []
    for p in sorted(folder.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        s = data.get("summary") or {}
        when = (data.get("machine") or {}).get("when", "")
        rows.append(f"| [{data.get('name', p.stem)}]({p.stem}.md) | {data.get('mode', '?')} | "
                    f"{s.get('injected', '')} | {s.get('checked', '')} | {s.get('key', '')} | "
                    f"{'PASS' if data.get('passed') else 'FAIL'} | {when} |")
    out = folder / "SUMMARY.md"
    where = "chaos/results/quick" if folder.name == "quick" else "chaos/results"
    out.write_text(f"# Chaos scenarios: summary\n\nRegenerated from {where}/*.json by whichever scenario ran "
                   "last (`make chaos`, or `python chaos/<name>.py [--quick]`).\n\n"
                   "| scenario | mode | injected | checked | key figures | result | run at |\n"
                   "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    return out


def cli(doc: str | None, *, quick: str = "CI-sized run (the scenario's times / 3, < 60 s)",
        seed: str = "seed of the fault injector's random draws",
        more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """Every scenario's flags: --quick (what CI runs; `quick` says what it shrinks) and --seed (`seed` says what it
    seeds), plus the scenario's own (`more`); the operator's log stays quiet in the terminal."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seed", type=int, default=1, help=seed)
    if more is not None:
        more(parser)
    args = parser.parse_args()
    logs.configure(json=False, level="WARNING")
    return args


def command(script: str, args: argparse.Namespace) -> str:
    """The command line that reproduces the run, the machine's cores, then the scenario's own switches that were
    on (`cli`'s `more`)."""
    own = "".join(f" --{k.replace('_', '-')}" for k, v in vars(args).items()
                  if k not in ("quick", "seed") and v is True)
    return f"python chaos/{script}{' --quick' if args.quick else ''} --seed {args.seed} ({os.cpu_count()} cores){own}"


def closing(ok: bool, cmd: str, problems: Sequence[str] | None = None, *, listed: bool = False) -> str:
    """The lines every scenario's page ends with: the problems it found (when it keeps a list of them: `listed`
    puts one per line, for long ones), the result, and the command that reproduces the run."""
    if problems is None:
        found = ""
    elif listed:
        found = "Problems:\n" + ("\n".join(f"- {p}" for p in problems) or "none.") + "\n\n"
    else:
        found = f'Problems: {"; ".join(problems) or "none"}.\n\n'
    return f'{found}Result: {"PASS" if ok else "FAIL"}.\n\nCommand: `{cmd}`\n'


Figures = dict[str, float | int]
"""A scenario's figures: name -> number (the results file's `figures`; `passed` is added last)."""
Detail = dict[str, Any]
"""What a scenario writes beside its figures (problems, rounds, timings...): JSON-able, read by its report."""
Found = tuple[Figures, Detail, bool]
"""What a scenario's run returns: its figures, its detail, whether its pass criteria held."""


def mode_of(args: argparse.Namespace) -> str:
    return "quick" if args.quick else "full"


@dataclass(frozen=True)
class Report:
    """What a scenario says about its run: its Markdown page up to its figures, the figures' meanings (`notes`),
    its row of SUMMARY.md (what was injected, what was checked, the key figures), whether its problems are long
    enough to list one per line, and what its page says after the figures (`footer`). `run_scenario` lays the
    page out: the page, the figures table, the footer, the closing lines."""

    page: str
    notes: Mapping[str, str]
    injected: str
    checked: str
    key: str
    listed: bool = False
    footer: str = ""


def run_scenario(name: str, doc: str | None, scenario: Callable[[argparse.Namespace], Coroutine[Any, Any, Found]],
                 report: Callable[[Figures, Detail, argparse.Namespace], Report], *,
                 facts: Mapping[str, Any] | None = None, **flags: Any) -> None:
    """A scenario script's whole life: its flags (`cli`, with `flags`), its run, the `passed` figure, its report
    (closed by the detail's `problems`, for the scenarios that keep such a list), the results files
    (chaos/results/<name>.json with `facts` and the detail beside the figures; <name>.md; SUMMARY.md), and exit
    status 1 when its pass criteria failed, which `make chaos` reports."""
    args = cli(doc, **flags)
    figures, detail, ok = asyncio.run(scenario(args))
    figures["passed"] = int(ok)
    said = report(figures, detail, args)
    parts = [said.page, figures_table(figures, said.notes), said.footer,
             closing(ok, command(f"{name}.py", args), detail.get("problems"), listed=said.listed)]
    write_results(name, figures, "\n\n".join(p for p in parts if p), passed=ok,
                  summary={"injected": said.injected, "checked": said.checked, "key": said.key},
                  extra={"mode": mode_of(args), "seed": args.seed, **(facts or {}), **detail})
    sys.exit(0 if ok else 1)


def log_records(path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log records in `path` (an operator's log, all its starts) whose `event` is `event`, each tagged
    with `start`: the number of the last "--- start N" line a rig wrote before it (0 if none)."""
    out = []
    start = 0
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("--- start "):
            start = int(line.split()[2])
        elif line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event:
                out.append({**rec, "start": start})
    return out
