"""Figures and the Markdown page of bench/framework_vs_kopf.py, from its runs (size -> framework -> run)."""

from __future__ import annotations

from typing import Any

KOPF = ("kopf_index", "kopf_events")
ORDER = ("gpuops", "kopf_events", "kopf_index")
PER_RUN = ("cold_start_s", "cpu_s_per_1000_events", "latency_p50_s", "latency_p99_s", "peak_rss_mib")
TARGET_COLD = 20.0
TARGET_CPU = 10.0
TARGET_RSS = 0.5

Runs = dict[int, dict[str, dict[str, Any]]]


def better_kopf(runs: dict[str, dict[str, Any]]) -> str | None:
    """kopf's form that reached a correct status sooner at this size (None: neither did)."""
    done = [name for name in KOPF if runs.get(name, {}).get("converged")]
    return min(done, key=lambda name: runs[name]["cold_start_s"]) if done else None


def _ratio(a: float | None, b: float | None, digits: int = 1) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, digits)


def size_figures(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ORDER:
        run = runs.get(name, {})
        out[f"{name}_converged"] = int(bool(run.get("converged")))
        for key in PER_RUN:
            if run.get(key) is not None:
                out[f"{name}_{key}"] = run[key]
    base = better_kopf(runs)
    out["kopf_better_form_is_index"] = None if base is None else int(base == "kopf_index")
    if base is not None:
        ours, kopf = runs["gpuops"], runs[base]
        out["cold_start_speedup"] = _ratio(kopf["cold_start_s"], ours["cold_start_s"])
        out["cpu_per_event_ratio"] = _ratio(kopf["cpu_s_per_1000_events"], ours["cpu_s_per_1000_events"])
        out["peak_rss_ratio"] = _ratio(ours["peak_rss_mib"], kopf["peak_rss_mib"], 3)
    return out


def figures_of(per_size: Runs) -> dict[str, Any]:
    """Top level: the largest size's headline against kopf's better form there; then each size's own figures."""
    pods = max(per_size)
    runs = per_size[pods]
    head = size_figures(runs)
    base = better_kopf(runs)
    ours = runs["gpuops"]
    fig: dict[str, Any] = {"headline_pods": pods, "kopf_converged": int(base is not None)}
    for key in PER_RUN:
        fig[f"ours_{key}"] = ours.get(key)
        fig[f"kopf_{key}"] = runs[base].get(key) if base else None
    for key in ("kopf_better_form_is_index", "cold_start_speedup", "cpu_per_event_ratio", "peak_rss_ratio"):
        fig[key] = head.get(key)
    fig.update(_targets(fig))
    for size, size_runs in per_size.items():
        fig[f"pods_{size}"] = size_figures(size_runs)
    return fig


def _targets(fig: dict[str, Any]) -> dict[str, int]:
    """1 where the headline meets its target; against a kopf that never converged, only the cold start is met."""
    if not fig["kopf_converged"]:
        return {"meets_cold_start_target_20x": int(fig["ours_cold_start_s"] is not None),
                "meets_cpu_target_10x": 0, "meets_rss_target_half": 0, "meets_p99_target": 0}
    ours_p99, kopf_p99 = fig["ours_latency_p99_s"], fig["kopf_latency_p99_s"]
    return {
        "meets_cold_start_target_20x": int((fig["cold_start_speedup"] or 0) >= TARGET_COLD),
        "meets_cpu_target_10x": int((fig["cpu_per_event_ratio"] or 0) >= TARGET_CPU),
        "meets_rss_target_half": int(fig["peak_rss_ratio"] is not None and fig["peak_rss_ratio"] <= TARGET_RSS),
        "meets_p99_target": int(ours_p99 is not None and kopf_p99 is not None and ours_p99 < kopf_p99),
    }


def _cell(run: dict[str, Any], key: str) -> str:
    value = run.get(key)
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def size_table(pods: int, runs: dict[str, dict[str, Any]]) -> str:
    rows = [f"### {pods:,} pods", "",
            "| framework | cold start (s) | CPU-s / 1,000 pod events | p50 (s) | p99 (s) | peak RSS (MiB) | "
            "correct after churn | pod events |",
            "|---|---|---|---|---|---|---|---|"]
    for name in ORDER:
        run = runs.get(name, {})
        if not run.get("converged"):
            rows.append(f"| {name} | {run.get('note', 'not run')} | | | | {_cell(run, 'peak_rss_mib')} | | |")
            continue
        rows.append(f"| {name} | {run['cold_start_s']} | {run['cpu_s_per_1000_events']} | "
                    f"{_cell(run, 'latency_p50_s')} | {_cell(run, 'latency_p99_s')} | {run['peak_rss_mib']} | "
                    f"{'yes' if run['correct_after_churn'] else 'NO'} | {run['pod_events']:,} |")
    return "\n".join(rows)


def _verdict(met: int) -> str:
    return "met" if met else "NOT met"


def markdown(fig: dict[str, Any], per_size: Runs, config: dict[str, Any], command: str, *, quick: bool) -> str:
    pods = fig["headline_pods"]
    base = better_kopf(per_size[pods])
    head = [f"# gpuops.kube vs kopf: the same controller ({'quick' if quick else 'full'} run)", "",
            "Count Running GPU pods per namespace into a GPUPodCount's status; each framework in its own process "
            "against the same emulated API server state and the same churn (100 pod operations/s). "
            "2 shared cores: timings are noisy.", ""]
    head += [size_table(size, runs) + "\n" for size, runs in per_size.items()]
    if base is None:
        head.append(f"At {pods:,} pods no kopf form converged: ratios are not defined.")
    else:
        head += [f"Headline at {pods:,} pods against kopf's better form there ({base}):", "",
                 f"- cold start: {fig['cold_start_speedup']}x faster (target >= 20x: "
                 f"{_verdict(fig['meets_cold_start_target_20x'])})",
                 f"- CPU per pod event: {fig['cpu_per_event_ratio']}x lower (target >= 10x: "
                 f"{_verdict(fig['meets_cpu_target_10x'])})",
                 f"- peak RSS: {fig['peak_rss_ratio']}x kopf's (target <= 0.5x: "
                 f"{_verdict(fig['meets_rss_target_half'])})",
                 f"- p99 change-to-status: {fig['ours_latency_p99_s']} s vs {fig['kopf_latency_p99_s']} s "
                 f"(target lower: {_verdict(fig['meets_p99_target'])})"]
    if pods != 100_000:
        head.append(f"\n(The targets are stated at 100,000 pods; this run's largest size is {pods:,}.)")
    head += ["", "Configuration:", ""]
    for name, conf in config.items():
        head.append(f"- {name}: " + "; ".join(f"{k}: {v}" for k, v in conf.items()))
    head += ["", f"Command: `{command}`"]
    return "\n".join(head)
