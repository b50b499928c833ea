"""Our operator framework (gpuops.kube) against kopf: the same controller written on each, one run, one emulator.

The controller: count the Running pods that request `nvidia.com/gpu` (in any container's requests or limits) per
namespace and write the count into status.running of the namespace's GPUPodCount (a CRD of group bench.gpuops.io
with a status subresource, which the bench installs in the emulator). Correct status: every namespace's
GPUPodCount shows its true count. Written three times:
  gpuops       bench/_framework_gpuops.py: Manager, shared informers (pods decoded into a minimal projection),
               an index, a Controller with a predicate and a mapper, a reconcile that patches status.
  kopf_index   bench/_kopf_index.py: `@kopf.index` over pods plus a `@kopf.timer` per GPUPodCount (every 0.5 s).
  kopf_events  bench/_kopf_events.py: `@kopf.on.event` on pods and GPUPodCounts keeping counts in memory, a writer
               task per namespace patching the status as soon as the two differ.
kopf runs as `kopf run --standalone --all-namespaces --quiet` with posting off and a streamed initial list
(bench/_kopf_common.py says why); the results record each framework's whole configuration.

Each framework is its own process (so CPU and memory are its own) against the emulated API server in another
process (`gpuops sim apiserver --restore`), restored from the same snapshot for every framework, one framework at a
time: the same state, then the same churn. Sizes: 1,000, 10,000 and 100,000 realistic pods (bench/informer.py's,
managedFields included) over 20 namespaces (bench/_framework_cluster.py: 60% of them counted); `--quick`: 1,000.
Churn: 2,000 pod operations (`--quick`: 1,000) at 100/s: creates, phase changes through the status subresource,
deletes; each is one pod watch event, and half of them change a namespace's count.

Figures, per framework and size (every instant on the bench process's monotonic clock):
  cold_start_s            framework process spawned -> the bench's own watch sees every GPUPodCount correct.
                          A framework still wrong after its cap (kopf_index: 300 s, others 600 s; `--quick` 120 s
                          and 60 s) "did not converge"; kopf_index is then not run at the larger sizes.
  cpu_s_per_1000_events   framework utime+stime (/proc/<pid>/stat) over the churn window (first operation ->
                          every count change shown, or the drain limit, and at least 2 s past the last operation),
                          per 1,000 pod watch events in that window (counted by the bench's own pod watch).
  latency_p50_s/p99_s     a count-changing pod write's response -> the first status the bench's watch sees that
                          shows it (each namespace's count is monotonic during the churn, so a status at or past
                          the operation's count shows it); microsecond clock, so resolved far below 0.1 s.
  peak_rss_mib            the framework's VmHWM (/proc/<pid>/status) at the end of its run.
  correct_after_churn     every GPUPodCount shows the true count when the window closes.
Headline (top-level figures): the largest size run (100,000 pods in a full run) against kopf's better form there
(whichever converged faster). Targets at 100,000 pods: cold start >= 20x faster, CPU per event >= 10x lower, peak
RSS <= 0.5x, p99 change-to-status latency lower.

The machine has 2 cores shared by the emulator, the framework and the bench (and possibly other work): timings are
noisy; the ratios compare runs made minutes apart under the same conditions.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import publish
from _framework_cluster import NAMESPACES, build_snapshot, plan_churn
from _framework_gpuops import description as gpuops_description
from _framework_report import figures_of, markdown
from _framework_run import Churn, frameworks, run_one
from _kopf_common import description as kopf_description

from gpuops import logs

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000,)
RATE = 100.0


def run_size(pods: int, args: Any, skip: set[str]) -> dict[str, Any]:
    ops = 1_000 if args.quick else 2_000
    cold_cap, index_cap = (120.0, 60.0) if args.quick else (600.0, 300.0)
    with tempfile.TemporaryDirectory(prefix="bench-kopf-") as tmp:
        snapshot = Path(tmp) / "state.json"
        state = build_snapshot(snapshot, pods)
        churn = Churn(plan_churn(state, ops, args.seed), RATE, drain=30.0)
        runs: dict[str, Any] = {}
        for fw in frameworks(cold_cap, index_cap):
            if fw.name in skip:
                runs[fw.name] = {"framework": fw.name, "converged": False, "run": False,
                                 "note": "not run: did not converge at a smaller size"}
                continue
            started = time.monotonic()
            runs[fw.name] = run_one(fw, snapshot, state.truth(), churn)
            print(f"{pods:>7,} pods {fw.name:<12} {_line(runs[fw.name])} ({time.monotonic() - started:.0f} s)",
                  flush=True)
            if not runs[fw.name]["converged"]:
                skip.add(fw.name)
    return runs


def _line(run: dict[str, Any]) -> str:
    if not run["converged"]:
        return run["note"]
    return (f"cold {run['cold_start_s']} s, {run['cpu_s_per_1000_events']} CPU-s/1k events, "
            f"p50 {run['latency_p50_s']} s, p99 {run['latency_p99_s']} s, peak {run['peak_rss_mib']} MiB, "
            f"correct {run['correct_after_churn']}")


def parse_args() -> argparse.Namespace:
    """bench/_common.py's flags (--quick, --seed, --out), plus --sizes to run only some of the sizes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,000 pods and 1,000 churn operations (CI; ~1 min)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                        help="comma-separated pod counts (default 1000,10000,100000; --quick: 1000)")
    args = parser.parse_args()
    logs.configure(json=False, level="WARNING")
    return args


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    skip: set[str] = set()
    per_size = {pods: run_size(pods, args, skip) for pods in sizes}
    config = {"gpuops": gpuops_description(), "kopf_index": kopf_description("index"),
              "kopf_events": kopf_description("events")}
    figures = figures_of(per_size)
    command = ("python bench/framework_vs_kopf.py" + (" --quick" if args.quick else "") + f" --seed {args.seed}"
               + (f" --sizes {','.join(map(str, sizes))}" if args.sizes else ""))
    md = markdown(figures, per_size, config, command, quick=args.quick)
    extra = {"command": command, "mode": "quick" if args.quick else "full", "seed": args.seed,
             "wall_seconds": round(time.monotonic() - started, 1), "namespaces": len(NAMESPACES),
             "churn_rate_per_s": RATE, "configuration": config,
             "runs": {str(pods): runs for pods, runs in per_size.items()}}
    publish("framework_vs_kopf", figures, md, extra, args.out)
    return 0 if _valid(per_size) else 1


def _valid(per_size: dict[int, dict[str, Any]]) -> bool:
    """Our controller converged at every size, and every framework that converged was correct after the churn
    (a wrong count would make its figures meaningless)."""
    ok = True
    for pods, runs in per_size.items():
        for name, run in runs.items():
            if (name == "gpuops" and not run["converged"]) or not run.get("correct_after_churn", True):
                print(f"INVALID: {name} at {pods:,} pods: {run}", file=sys.stderr)
                ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
