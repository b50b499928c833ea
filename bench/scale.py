"""The whole operator at scale: `gpuops run` (all four controllers) against the emulated cluster.

At fraction f of the full size: f x (5,000 GPU nodes, 100,000 pods, 1,000 GPUWorkloadBudgets, 200
GPUNodeGroups, 50 SpotPools, 500 MIG nodes), then a steady churn of 200 pod events/s (100 creates/s and as
many completions). Targets at 100%: operator resident memory <= 1 GiB, cold start to all informers synced
<= 30 s, budget reconcile latency p99 <= 1 s from event to status write.

Processes (2 cores: the bench's own loop must not starve the emulator):
  emulator  a child process (bench/_scale_sim.py) running SimCluster with the shipped `scale` scenario resized:
            f x 4,300 plain 8-GPU nodes, f x 200 node-group machines `ng-<i>` (one GPUNodeGroup each, webhooks at
            the emulated cloud's power API, scale-down after a day: capacity does not move under the load),
            f x 500 MIG nodes `mig-<i>` (tainted gpuops.io/mig; 8 A100-80GB each) whose MigNodes an in-process
            agent farm (sim/gpuops_sim/migfarm.py) keeps fresh and whose AllocationClaims it answers like the node
            agent, f x 50 SpotPools (provider sim, minimum 1, maximum 2), f x 1,000 budgets (20 per namespace,
            each selecting label team=<its name>). Filled before the operator starts: 35% of the pods run for a
            day on 1 GPU each (at most all GPUs but the churn's reserve), the rest ran for 1 s and Succeeded.
  operator  `gpuops run` (all controllers; --mig-webhook-port 0: the churn's MIG pods are created as the
            webhook leaves them, gated), started cold once the fill is done.
  bench     this process: spawns both, polls the operator's /metrics, samples /proc.
The emulated kubelets renew their Leases every 30 s (--lease-seconds; the shipped scenario's 10 s would add
f x 500 writes/s that only the emulator pays: the operator watches no node Leases).
Churn: 100 pods/s created round-robin over the budgets (2% of them gated MIG pods asking one 1g.10gb slice),
running 2-4 s (the emulator's kubelets finish them by their runtime annotation), deleted 3 s after they finish.

Figures per fraction:
  cold start       `gpuops run` spawned -> every `gpuops_informer_synced` series is 1 and /readyz answers 200;
                   then "initial reconcile": -> every budget has a status and the workqueues are empty.
  memory           operator VmHWM (peak resident) from /proc/<pid>/status at the end of the churn window.
  budget latency   a churn pod's Succeeded write -> the first status write of its budget whose ledger holds
                   the pod (both seen by the emulator's store listener, one clock; see bench/_scale_sim.py).
  CPU              operator utime+stime over the churn window (/proc/<pid>/stat), per 1,000 pod watch events
                   (every ADDED/MODIFIED/DELETED of a pod in the window) and per 1,000 churn events (creates +
                   completions); the emulator's own CPU share over the same window (a saturated emulator, near
                   100% of a core, delays every event and shows in the latency).
  MIG              a gated MIG pod's creation -> the write that ungates it (the allocator's decision).
The growth table compares each figure with the smallest fraction's; the PNG plots them (results folder).
`--profile DIR` runs the operator under cProfile (and the emulator with cProfile in-process): slower, for
finding hot spots, not for the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, write_results
from _scale_sim import EmulatorProcess, Params, child_main, size_of

from gpuops_sim.harness import cpu_seconds, free_port

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
TARGET_RSS_MIB = 1024
TARGET_COLD_START_S = 30.0
TARGET_P99_S = 1.0


def proc_status(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM) in bytes; 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def samples(text: str, name: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            out.append(float(line.rpartition(" ")[2]))
    return out


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """Samples of `name` keyed by the value of `label` (summed over the other labels)."""
    out: dict[str, float] = {}
    key = f'{label}="'
    for line in text.splitlines():
        if not line.startswith(name + "{") or key not in line:
            continue
        value = line[line.index(key) + len(key):].split('"', 1)[0]
        out[value] = out.get(value, 0.0) + float(line.rpartition(" ")[2])
    return out


CONTROLLERS = ("budget", "autoprovision", "spotpool", "migslicer")


def reconcile_totals(text: str) -> dict[str, tuple[float, float]]:
    """controller -> (reconciles, seconds spent reconciling: wall time, awaits included)."""
    count = by_label(text, "controller_runtime_reconcile_time_seconds_count", "controller")
    secs = by_label(text, "controller_runtime_reconcile_time_seconds_sum", "controller")
    return {c: (count.get(c, 0.0), secs.get(c, 0.0)) for c in CONTROLLERS}


def buckets(text: str, name: str, label: str, value: str) -> dict[float, float]:
    """Cumulative bucket counts (le -> count) of histogram `name` for one label value."""
    out: dict[float, float] = {}
    want = f'{label}="{value}"'
    for line in text.splitlines():
        if line.startswith(name + "_bucket{") and want in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[math.inf if le == "+Inf" else float(le)] = float(line.rpartition(" ")[2])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile of what a histogram observed between two scrapes, as the upper bound of its bucket
    (Prometheus' histogram_quantile interpolates; the bound is the honest figure); -1 if nothing observed."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return -1.0
    finite = [b for b in bounds if b != math.inf]
    for b, c in zip(bounds, counts, strict=True):
        if c >= q * counts[-1]:
            return b if b != math.inf or not finite else finite[-1]  # beyond the last bound: at least that
    return finite[-1] if finite else -1.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile; -1 for no values."""
    if not values:
        return -1.0
    return round(values[min(len(values) - 1, max(0, int(q * len(values) + 0.5) - 1))], 3)


def run_fraction(f: float, churn_seconds: float, events_per_s: float, workdir: Path,
                 profile_dir: Path | None, lease_seconds: float, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    size = size_of(f)
    params = Params(fraction=f, workdir=str(workdir), churn_events_per_s=events_per_s, lease_seconds=lease_seconds)
    t_start = time.monotonic()
    child = EmulatorProcess(child_main, params, str(profile_dir / f"emulator-f{f:g}.prof") if profile_dir else None)
    op: subprocess.Popen[bytes] | None = None
    log_path = workdir / "operator.log"
    try:
        ready = child.expect("ready", 600 + size.pods / 20)
        metrics_port, probe_port = free_port(), free_port()
        prefix = [sys.executable]
        if profile_dir:
            prefix += ["-m", "cProfile", "-o", str(profile_dir / f"operator-f{f:g}.prof")]
        cmd = [*prefix, "-m", "gpuops", "run", "--kubeconfig", ready["kubeconfig"],
               "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
               "--health-probe-bind-address", f"127.0.0.1:{probe_port}", "--mig-webhook-port", "0",
               "--log-level", "WARNING", "--log-format", "json", *extra]
        cpu_child0 = cpu_seconds(child.proc.pid or 0)
        with log_path.open("wb") as log:
            t0 = time.monotonic()
            op = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        readyz = f"http://127.0.0.1:{probe_port}/readyz"
        cold = None
        deadline = t0 + 300 + size.pods / 100
        while time.monotonic() < deadline:
            if op.poll() is not None:
                raise RuntimeError(f"gpuops run exited with {op.returncode}: {log_path.read_text()[-3000:]}")
            code, text = http_get(metrics)
            synced = samples(text, "gpuops_informer_synced") if code == 200 else []
            if synced and all(v == 1 for v in synced) and http_get(readyz)[0] == 200:
                cold = time.monotonic() - t0
                break
            time.sleep(0.1)
        if cold is None:
            raise TimeoutError("the operator's informers did not sync")
        informers = len(synced)
        # the initial backlog: every budget's first status, empty workqueues (twice in a row)
        initial = None
        calm = 0
        while time.monotonic() < deadline:
            st = child.ask(("status",), "status", 60)
            _, text = http_get(metrics, 30)
            depth = sum(samples(text, "workqueue_depth"))
            calm = calm + 1 if st["budgets_with_status"] >= size.budgets and depth == 0 else 0
            if calm >= 2:
                initial = time.monotonic() - t0
                break
            time.sleep(1.0)
        rss_after_start = proc_status(op.pid, "VmRSS")
        cpu_start = cpu_seconds(op.pid)
        # churn window
        _, text = http_get(metrics, 30)
        rec0 = reconcile_totals(text)
        queue0 = buckets(text, "workqueue_queue_duration_seconds", "name", "budget")
        rtime0 = buckets(text, "controller_runtime_reconcile_time_seconds", "controller", "budget")
        cpu_op0, cpu_child1, w0 = cpu_seconds(op.pid), cpu_seconds(child.proc.pid or 0), time.monotonic()
        churn = child.ask(("churn", churn_seconds, 10.0), "churned", churn_seconds + 120)
        # the child returns after the window plus the matching drain; the CPU window is the churn window
        # (the drain is idle churn-wise: count it so the operator's catch-up work is not left out)
        w1 = time.monotonic()
        cpu_op1, cpu_child2 = cpu_seconds(op.pid), cpu_seconds(child.proc.pid or 0)
        hwm = proc_status(op.pid, "VmHWM")
        rss_end = proc_status(op.pid, "VmRSS")
        _, text = http_get(metrics, 30)
        rec1 = reconcile_totals(text)
        queue1 = buckets(text, "workqueue_queue_duration_seconds", "name", "budget")
        rtime1 = buckets(text, "controller_runtime_reconcile_time_seconds", "controller", "budget")
        plan_count = sum(samples(text, "gpuops_autoprovision_plan_seconds_count"))
        plan_sum = sum(samples(text, "gpuops_autoprovision_plan_seconds_sum"))
        errors = sum(samples(text, "controller_runtime_reconcile_errors_total"))
        status = child.ask(("status",), "status", 60)
    finally:
        if op is not None and op.poll() is None:
            op.send_signal(signal.SIGTERM)
            try:
                op.wait(60)
            except subprocess.TimeoutExpired:
                op.kill()
                op.wait(10)
        child.close()
    span = w1 - w0
    events = churn["pod_events_total"]
    churn_events = churn["creates"] + churn["completions"]
    cpu_op = cpu_op1 - cpu_op0
    lat = churn["budget_latencies"]
    mig = churn["mig_ungate_latencies"]
    return {
        "fraction": f, "size": size.__dict__, "fill": {k: v for k, v in ready.items() if k != "kubeconfig"},
        "informers": informers, "cold_start_seconds": round(cold, 2),
        "initial_reconcile_seconds": round(initial, 1) if initial is not None else -1.0,
        "operator_cpu_seconds_startup": round(cpu_start, 1),
        "operator_rss_after_start_mib": round(rss_after_start / MIB, 1),
        "operator_peak_rss_mib": round(hwm / MIB, 1), "operator_rss_end_mib": round(rss_end / MIB, 1),
        "churn": {k: v for k, v in churn.items() if k not in ("budget_latencies", "mig_ungate_latencies")},
        "measure_seconds": round(span, 2),
        "pod_events_per_s": round(events / churn["window_seconds"], 1),
        "churn_events_per_s": round(churn_events / churn["window_seconds"], 1),
        "operator_cpu_seconds": round(cpu_op, 2),
        "operator_cpu_share": round(cpu_op / span, 3),
        "operator_cpu_s_per_1000_pod_events": round(cpu_op * 1000 / max(1, events), 3),
        "operator_cpu_s_per_1000_churn_events": round(cpu_op * 1000 / max(1, churn_events), 3),
        "emulator_cpu_share": round((cpu_child2 - cpu_child1) / span, 3),
        "emulator_cpu_seconds_before_operator": round(cpu_child0, 1),
        "emulator_cpu_s_per_1000_object_updates": churn.get("emulator_cpu_s_per_1000_updates", -1.0),
        "budget_latency_p50_seconds": pct(lat, 0.50), "budget_latency_p99_seconds": pct(lat, 0.99),
        "budget_latency_max_seconds": round(lat[-1], 3) if lat else -1.0, "budget_latencies_measured": len(lat),
        "mig_ungate_p50_seconds": pct(mig, 0.50), "mig_ungate_p99_seconds": pct(mig, 0.99),
        "mig_pods_ungated": len(mig),
        # where a budget's latency goes, from the operator's own histograms (bucket upper bounds)
        "budget_queue_wait_p50_seconds": bucket_quantile(queue0, queue1, 0.50),
        "budget_queue_wait_p99_seconds": bucket_quantile(queue0, queue1, 0.99),
        "budget_reconcile_p50_seconds": bucket_quantile(rtime0, rtime1, 0.50),
        "budget_reconcile_p99_seconds": bucket_quantile(rtime0, rtime1, 0.99),
        "reconcile_errors_total": errors, "final_status": status,
        "reconciles_in_window": {c: {"count": int(rec1[c][0] - rec0[c][0]),
                                     "seconds": round(rec1[c][1] - rec0[c][1], 2)} for c in CONTROLLERS},
        "autoprovision_plans_total": int(plan_count), "autoprovision_plan_seconds_total": round(plan_sum, 2),
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }


GROWTH = [  # (key, label, unit)
    ("operator_peak_rss_mib", "operator peak RSS", "MiB"),
    ("cold_start_seconds", "cold start to informers synced", "s"),
    ("initial_reconcile_seconds", "cold start to initial reconcile done", "s"),
    ("budget_latency_p50_seconds", "budget latency p50", "s"),
    ("budget_latency_p99_seconds", "budget latency p99", "s"),
    ("operator_cpu_s_per_1000_pod_events", "operator CPU-s / 1,000 pod watch events", "s"),
    ("operator_cpu_s_per_1000_churn_events", "operator CPU-s / 1,000 churn events", "s"),
    ("operator_cpu_share", "operator CPU share (cores)", ""),
    ("emulator_cpu_share", "emulator CPU share (cores)", ""),
    ("emulator_cpu_s_per_1000_object_updates", "emulator CPU-s / 1,000 object updates", "s"),
    ("budget_queue_wait_p99_seconds", "budget: work queue wait p99 (bucket bound)", "s"),
    ("budget_reconcile_p99_seconds", "budget: reconcile incl. status write p99 (bucket bound)", "s"),
    ("mig_ungate_p99_seconds", "MIG pod ungated p99", "s"),
]


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["fraction"] * 100 for r in runs]
    panels = [("operator_peak_rss_mib", "peak RSS (MiB)", TARGET_RSS_MIB),
              ("cold_start_seconds", "cold start to synced (s)", TARGET_COLD_START_S),
              ("budget_latency_p99_seconds", "budget latency p50/p99 (s)", TARGET_P99_S),
              ("operator_cpu_s_per_1000_pod_events", "CPU-s per 1,000 pod events", None)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, target) in zip(axes.flat, panels, strict=True):
        ax.plot(xs, [r[key] for r in runs], "o-", label=key.replace("_", " "))
        if key == "budget_latency_p99_seconds":
            ax.plot(xs, [r["budget_latency_p50_seconds"] for r in runs], "s--", label="p50")
        if key == "cold_start_seconds":
            ax.plot(xs, [r["initial_reconcile_seconds"] for r in runs], "s--", label="initial reconcile done")
        if target is not None:
            ax.axhline(target, color="red", linestyle=":", label="target at 100%")
        ax.set_title(title)
        ax.set_xlabel("% of the full size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("gpuops run at scale (bench/scale.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(runs: list[dict[str, Any]], mode: str, command: str, png: str) -> str:
    head = "| figure | " + " | ".join(f"{r['fraction'] * 100:g}%" for r in runs) + " | growth (last / first) |"
    rows = [head, "|---" * (len(runs) + 2) + "|"]

    def line(label: str, values: list[Any], growth: str = "") -> None:
        rows.append(f"| {label} | " + " | ".join(str(v) for v in values) + f" | {growth} |")

    line("nodes / pods", [f"{r['size']['nodes']:,} / {r['size']['pods']:,}" for r in runs])
    line("budgets / node groups / spot pools / MIG nodes",
         [f"{r['size']['budgets']} / {r['size']['groups']} / {r['size']['pools']} / {r['size']['mig']}" for r in runs])
    line("pods in the store at the end of the window", [f"{r['churn']['pods_in_store']:,}" for r in runs])
    for key, label, unit in GROWTH:
        vals = [r.get(key, -1.0) for r in runs]
        g = f"x{vals[-1] / vals[0]:.2f}" if len(runs) > 1 and vals[0] and vals[0] > 0 and vals[-1] >= 0 else ""
        line(f"{label}{' (' + unit + ')' if unit else ''}", vals, g)
    line("churn achieved: creates+completions/s (pod watch events/s)",
         [f"{r['churn_events_per_s']} ({r['pod_events_per_s']})" for r in runs])
    line("budget completions measured / not reflected within 10 s",
         [f"{r['budget_latencies_measured']} / {r['churn']['not_reflected']}" for r in runs])
    line("MIG pods ungated in the window", [r["mig_pods_ungated"] for r in runs])
    line("Unschedulable pods at the end (a backlog makes the autoprovisioner plan)",
         [r["final_status"].get("unschedulable_pods", "-") for r in runs])
    for c in CONTROLLERS:
        line(f"{c}: reconciles in the window (busy wall-seconds)",
             [f"{r['reconciles_in_window'][c]['count']:,} ({r['reconciles_in_window'][c]['seconds']})"
              if "reconciles_in_window" in r else "-" for r in runs])
    line("reconcile errors (total, all controllers)", [int(r["reconcile_errors_total"]) for r in runs])
    line("spot pools Ready / pools", [f"{r['final_status']['spot_ready']} / {r['final_status']['pools']}"
                                      for r in runs])
    line("budget object size avg / max (KiB; its status carries the ledger)",
         [f"{r['final_status']['budget_bytes_avg'] / 1024:.1f} / {r['final_status']['budget_bytes_max'] / 1024:.1f}"
          for r in runs])
    line("budget status writes / s in the window",
         [round(r["churn"]["budget_status_writes"] / r["churn"]["window_seconds"]) for r in runs])
    line("emulator fill (s)", [r["fill"].get("fill_seconds") for r in runs])
    last = runs[-1]
    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    verdict = (f"At {last['fraction'] * 100:g}% of the full size: memory <= {TARGET_RSS_MIB} MiB "
               f"{met(last['operator_peak_rss_mib'] <= TARGET_RSS_MIB)}; cold start <= {TARGET_COLD_START_S:g} s "
               f"{met(0 <= last['cold_start_seconds'] <= TARGET_COLD_START_S)}; budget latency p99 <= "
               f"{TARGET_P99_S:g} s {met(0 <= last['budget_latency_p99_seconds'] <= TARGET_P99_S)}.")
    return f"""# gpuops run at scale ({mode} run)

`gpuops run` (budget, autoprovision, spotpool, migslicer) against the emulated cluster at a fraction of 5,000 GPU
nodes / 100,000 pods / 1,000 budgets / 200 node groups / 50 spot pools / 500 MIG nodes, then a churn of
{runs[0]['churn']['creates'] / runs[0]['churn']['window_seconds'] * 2:.0f} pod events/s (creates + completions) for
{runs[0]['churn']['window_seconds']:g} s. The emulator runs in its own process; see bench/scale.py's docstring for
every definition.

{chr(10).join(rows)}

{verdict} Plot: `{png}`.
Command: `{command}` ({os.cpu_count()} cores).
"""


def report(runs: list[dict[str, Any]], args: argparse.Namespace, mode: str, churn: float,
           profile_dir: Path | None) -> tuple[str, Path]:
    """Results (JSON, Markdown, PNG) of the fractions run so far."""
    folder = RESULTS / "quick" if mode == "quick" else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "scale.png"
    try:
        plot(runs, png)
        png_note = str(png.relative_to(ROOT))
    except ImportError:
        png_note = "(not drawn: matplotlib is missing; pip install 'gpuops[report]')"
    figures: dict[str, float | int] = {}
    for r in runs:
        k = f"f{r['fraction'] * 100:g}_"
        for key, _, _ in GROWTH:
            figures[k + key] = r.get(key, -1.0)
        figures[k + "not_reflected"] = r["churn"]["not_reflected"]
        figures[k + "churn_events_per_s"] = r["churn_events_per_s"]
    last = runs[-1]
    figures["largest_fraction"] = last["fraction"]
    figures["meets_memory_1gib"] = int(last["operator_peak_rss_mib"] <= TARGET_RSS_MIB)
    figures["meets_cold_start_30s"] = int(0 <= last["cold_start_seconds"] <= TARGET_COLD_START_S)
    figures["meets_latency_p99_1s"] = int(0 <= last["budget_latency_p99_seconds"] <= TARGET_P99_S
                                          and last["churn"]["not_reflected"] == 0)
    figures["targets_at_full_size"] = int(last["fraction"] >= 1.0)
    done = ",".join(f"{r['fraction']:g}" for r in runs)
    command = "python bench/scale.py" + (" --quick" if args.quick else f" --fractions {done}")
    if profile_dir:
        command += " --profile DIR (figures distorted by cProfile)"
    md = markdown(runs, mode, command, png_note)
    path = write_results("scale", figures, md, {"mode": mode, "churn_seconds": churn, "events_per_s": args.events_per_s,
                                                "lease_seconds": args.lease_seconds, "runs": runs})
    return md, path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one tiny fraction (0.02) for CI (< 1 minute)")
    parser.add_argument("--fractions", default=None, help="comma-separated fractions (default 0.1,0.25,0.5,1.0)")
    parser.add_argument("--churn-seconds", type=float, default=None, help="measured window (default 60; quick 10)")
    parser.add_argument("--events-per-s", type=float, default=200.0, help="churn: creates + completions per second")
    parser.add_argument("--lease-seconds", type=float, default=30.0,
                        help="emulated kubelets' Lease renew interval (the emulator's load only; default 30)")
    parser.add_argument("--add", action="store_true",
                        help="keep the other fractions of the previous results file (same mode) and add these")
    parser.add_argument("--operator-args", default="", metavar="ARGS",
                        help="more `gpuops run` flags (A/B runs; such a run never replaces the committed results)")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="cProfile the operator and the emulator into DIR (slower: not for the figures)")
    args = parser.parse_args()
    fractions = [float(x) for x in (args.fractions or ("0.02" if args.quick else "0.1,0.25,0.5,1.0")).split(",")]
    churn = args.churn_seconds if args.churn_seconds is not None else (10.0 if args.quick else 60.0)
    profile_dir = Path(args.profile).resolve() if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    # a profiled run's figures are distorted by the profiler: it never replaces the committed results
    mode = "quick" if args.quick or profile_dir or args.operator_args else "full"
    runs: list[dict[str, Any]] = []
    previous = (RESULTS / "quick" if mode == "quick" else RESULTS) / "scale.json"
    if args.add and previous.exists():
        import json

        runs = [r for r in json.loads(previous.read_text()).get("runs", []) if r["fraction"] not in fractions]
    for f in sorted(fractions):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.monotonic()
            print(f"fraction {f:g}: {size_of(f)}", flush=True)
            try:
                r = run_fraction(f, churn, args.events_per_s, Path(tmp), profile_dir, args.lease_seconds,
                                 tuple(shlex.split(args.operator_args)))
            except Exception:
                log = Path(tmp) / "operator.log"
                if log.exists():
                    print(log.read_text()[-3000:], file=sys.stderr)
                raise
            runs.append(r)
            runs.sort(key=lambda x: float(x["fraction"]))
            print(f"fraction {f:g} done in {time.monotonic() - t:.0f} s: RSS {r['operator_peak_rss_mib']} MiB, "
                  f"cold start {r['cold_start_seconds']} s (reconciled {r['initial_reconcile_seconds']} s), "
                  f"p50/p99 {r['budget_latency_p50_seconds']}/{r['budget_latency_p99_seconds']} s, "
                  f"CPU {r['operator_cpu_s_per_1000_pod_events']} s/1k pod events, "
                  f"emulator {r['emulator_cpu_share']}", flush=True)
        # written after every fraction: a long sweep stopped part-way keeps what it measured
        md, path = report(runs, args, mode, churn, profile_dir)
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
