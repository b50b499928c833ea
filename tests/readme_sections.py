"""The README's generated sections: headline figures from bench/results, the chaos summary from chaos/results,
and a configuration reference built from the CRD schemas in manifests/crds.

Generated, so the README cannot drift from what the benchmarks measured or what the API server accepts:
`make readme` (also the tail of a full `make bench`) rewrites every `<!-- generated:NAME -->` ...
`<!-- /generated:NAME -->` block; tests/test_readme.py fails when a block is stale.

    python tests/readme_sections.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH = ROOT / "bench" / "results"
CHAOS = ROOT / "chaos" / "results"
CRDS = ROOT / "manifests" / "crds"


class Headline(NamedTuple):
    """One row: a figure of ours, the same figure of the alternative measured in the same run (if any)."""

    what: str
    ours: str
    alternative: str | None = None
    against: str = ""
    unit: str = ""


# bench name -> what it compares against, and its headline rows (figure keys of bench/results/<name>.json)
HEADLINES: dict[str, tuple[str, list[Headline]]] = {
    "informer": ("kubernetes-asyncio's and the official client's `Watch` on the same stream", [
        Headline("watch events decoded into the cache", "ours_events_per_s", "kubernetes_asyncio_watch_events_per_s",
                 "kubernetes-asyncio", "/s"),
        Headline("watch events decoded into the cache", "ours_events_per_s", "official_watch_events_per_s",
                 "official client", "/s"),
        Headline("share of the stack's limit on the same stream (decoding alone)", "ours_share_of_stack_limit_pct",
                 unit=" %"),
        Headline("memory per cached pod", "bytes_per_cached_pod_ours",
                 "bytes_per_cached_pod_kubernetes_asyncio_model", "kubernetes-asyncio model", " B"),
        Headline("cold sync of 100,000 pods (paginated list)", "cold_sync_seconds_paginated_list", unit=" s"),
    ]),
    "budget_accuracy": ("the emulator's container timestamps (ground truth)", [
        Headline("accuracy of status at t=45 min (1.0 = exact)", "accuracy_status_t45"),
        Headline("accuracy of the metric at t=45 min", "accuracy_metric_t45"),
        Headline("3,600 Jobs kept finished, compaction, a restart: lowest status accuracy",
                 "retained_finished_pods.accuracy_status_min"),
        Headline("the same: highest status accuracy", "retained_finished_pods.accuracy_status_max"),
        Headline("the same: samples where usage went down", "retained_finished_pods.usage_decreases_status"),
        Headline("cost across a day boundary and a price change: lowest status accuracy",
                 "priced.daily-cost_min_accuracy_status"),
        Headline("weighted GPU-hours, same run: lowest status accuracy", "priced.hourly-weighted_min_accuracy_status"),
        Headline("1,000 budgets, 50,000 pods: event to status p99", "scale_r100_latency_p99_seconds", unit=" s"),
        Headline("1,000 budgets, 50,000 pods: operator memory", "scale_r100_operator_rss_mib", unit=" MiB"),
    ]),
    "budget_gate": ("its target: p99 <= 1 s from the moment the budget allows again", [
        Headline("held pod released after its budget allows: p99, all triggers", "release_latency_p99_seconds",
                 unit=" s"),
        Headline("the same, quota raised", "quota.p99_seconds", unit=" s"),
        Headline("the same, usage leaving a rolling hour", "window.p99_seconds", unit=" s"),
        Headline("the same, a new calendar day", "period.p99_seconds", unit=" s"),
    ]),
    "autoprovision": ("the seed's algorithm (main.go of dseif0x/k8s-gpu-autoprovision, polling every 10 s; "
                      "`SeedAutoprovisioner` in bench/autoprovision.py), same workload, run concurrently", [
        Headline("pending pod to power-on decision p99", "ours_decision_latency_p99_s",
                 "baseline_decision_latency_p99_s", "seed", " s"),
        Headline("idle powered GPU-hours", "ours_idle_gpu_hours", "baseline_idle_gpu_hours", "seed"),
        Headline("redundant power-on requests", "ours_power_on_redundant", "baseline_power_on_redundant", "seed"),
        Headline("pods left unschedulable", "ours_pods_left_unschedulable", "baseline_pods_left_unschedulable",
                 "seed"),
    ]),
    "framework_vs_kopf": ("kopf 1.45.2 running the same controller, in its better form at 100,000 pods (index or "
                          "event handlers), same emulated state and churn", [
        Headline("100,000 pods: cold start to correct status", "ours_cold_start_s", "kopf_cold_start_s", "kopf",
                 " s"),
        Headline("CPU-s per 1,000 pod events", "ours_cpu_s_per_1000_events", "kopf_cpu_s_per_1000_events", "kopf",
                 " s"),
        Headline("peak resident memory", "ours_peak_rss_mib", "kopf_peak_rss_mib", "kopf", " MiB"),
        Headline("pod change to status p99", "ours_latency_p99_s", "kopf_latency_p99_s", "kopf", " s"),
    ]),
    "spotpool": ("the seed tutorial's polling loop (the kubebuilder Spotpool tutorial's reconciler, every 40 s; "
                 "`SeedSpotpool` in bench/spotpool.py), same reclaims, run concurrently", [
        Headline("reclaim notice to replacement launched p50", "ours_from_notice_p50_s",
                 "baseline_from_notice_p50_s", "seed loop", " s"),
        Headline("reclaim observable (node report or cloud answer) to replacement launched p99",
                 "ours_from_observable_p99_s", "baseline_from_observable_p99_s", "seed loop", " s"),
        Headline("instance-seconds below minimum", "ours_shortfall_instance_seconds",
                 "baseline_shortfall_instance_seconds", "seed loop"),
        Headline("duplicate instances", "ours_duplicates", "baseline_duplicates", "seed loop"),
    ]),
    "migslicer": ("a DAS-style lowest-free-slot allocator, same churn sequence", [
        Headline("pod creation to gate removal p99", "lat_fit_ungate_p99_ms", unit=" ms"),
        Headline("compute-weighted acceptance, end to end", "pack_e2e_ours_pct", "pack_acct_das_pct", "DAS-style",
                 " %"),
        Headline("feasible single-GPU batches placed in every order", "orders_acct_ours_every_order_pct",
                 "orders_acct_das_every_order_pct", "DAS-style", " %"),
    ]),
    "accounting": ("the DAS-style baseline on 20,000 churn events", [
        Headline("compute-weighted MIG acceptance", "mig_ours_compute_weighted_acceptance_pct",
                 "mig_das_compute_weighted_acceptance_pct", "DAS-style", " %"),
        Headline("MIG placement decision p99", "mig_decision_warm_p99_ms", unit=" ms"),
        Headline("GPU-hours over 100,000 intervals", "gpu_hours_100k_intervals_ms", unit=" ms"),
    ]),
    "apiserver": ("the same emulator serving one watcher (fan-out cost) or an unpaged list", [
        Headline("watch events per watcher, 4 watchers", "watch_4_watchers_min_events_per_s_each",
                 "watch_1_watcher_events_per_s", "1 watcher", "/s"),
        Headline("paged list of 100,000 pods", "list_paged_seconds", "list_unpaged_seconds", "unpaged", " s"),
    ]),
    "scale": ("its targets: <= 1 GiB, <= 30 s to synced, event to status p99 <= 1 s (all controllers)", [
        Headline("5,000 nodes, 100,000 pods: operator peak memory", "f100_operator_peak_rss_mib", unit=" MiB"),
        Headline("5,000 nodes, 100,000 pods: cold start to informers synced", "f100_cold_start_seconds", unit=" s"),
        Headline("1,000 budgets at 200 pod events/s: event to status p99", "f100_budget_latency_p99_seconds",
                 unit=" s"),
        Headline("100 budgets at 200 pod events/s: event to status p99", "f10_budget_latency_p99_seconds",
                 unit=" s"),
    ]),
    "sim": ("its targets: <= 4 GiB, >= 500 pod phase transitions/s", [
        Headline("5,000 nodes Ready", "node_boot_seconds", unit=" s"),
        Headline("pod phase transitions", "phase_transitions_per_s", unit="/s"),
        Headline("peak memory with 100,000 pods", "peak_rss_gib", unit=" GiB"),
    ]),
}


def _number(value: Any, unit: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value}{unit}"
    if isinstance(value, float) and not value.is_integer():
        digits = 6 if 0.99 < value < 1.01 else 3  # accuracies: 1.000107 is not 1
        text = f"{value:,.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    else:
        text = f"{int(value):,}"
    return f"{text}{unit}"


def _results(folder: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / f"{name}.json").read_text())
    return data


def _figure(figures: dict[str, Any], key: str) -> Any:
    """A figure by key; `scenario.figure` reaches into a scenario's own figures."""
    value: Any = figures
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def bench_table() -> str:
    rows = ["| benchmark | figure | gpuops | alternative (same run) |", "|---|---|---|---|"]
    for name, (_, headlines) in HEADLINES.items():
        data = _results(BENCH, name)
        figures = data["figures"]
        mode = "" if data.get("mode", "full") == "full" else f" ({data['mode']} run)"
        for i, h in enumerate(headlines):
            ours, other = _figure(figures, h.ours), _figure(figures, h.alternative) if h.alternative else None
            if ours is None or (h.alternative and other is None):
                raise KeyError(f"bench/results/{name}.json has no figure {h.ours!r} or {h.alternative!r}")
            alt = f"{_number(other, h.unit)} ({h.against})" if h.alternative else "-"
            label = f"[`{name}`](bench/results/{name}.md){mode}" if i == 0 else ""
            rows.append(f"| {label} | {h.what} | {_number(ours, h.unit)} | {alt} |")
    notes = [f"- `{name}`: against {against}." for name, (against, _) in HEADLINES.items()]
    return "\n".join(rows) + "\n\n" + "\n".join(notes)


def chaos_table() -> str:
    rows = ["| scenario | injected | checked | key figures | result |", "|---|---|---|---|---|"]
    for path in sorted(CHAOS.glob("*.json")):
        data = json.loads(path.read_text())
        s = data.get("summary") or {}
        mode = "" if data.get("mode", "full") == "full" else f" ({data['mode']})"
        rows.append(f"| [`{path.stem}`](chaos/results/{path.stem}.md){mode} | {s.get('injected', '')} | "
                    f"{s.get('checked', '')} | {s.get('key', '')} | {'PASS' if data.get('passed') else 'FAIL'} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ CRD reference


def _type_of(schema: Mapping[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = str(schema.get("type", "object"))
    if kind == "array":
        return f"[]{_type_of(schema.get('items') or {})}"
    if kind == "object" and "additionalProperties" in schema and not schema.get("properties"):
        return f"map[string]{_type_of(schema['additionalProperties'] or {})}"
    return kind


def _rules(schema: Mapping[str, Any]) -> str:
    out: list[str] = []
    if "enum" in schema:
        out.append(" \\| ".join(f"`{v}`" for v in schema["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<="), ("minLength", "length >="), ("maxLength", "length <="),
                      ("minItems", "items >="), ("maxItems", "items <=")):
        if key in schema:
            out.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        out.append(f"pattern `{schema['pattern']}`")
    if "format" in schema:
        out.append(f"format {schema['format']}")
    return ", ".join(out)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _fields(schema: Mapping[str, Any], prefix: str, required: frozenset[str]) -> Iterator[tuple[str, ...]]:
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}"
        default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
        yield (f"`{path}`" + (" (required)" if name in required else ""), _type_of(sub), default, _rules(sub),
               _one_line(sub.get("description", "")))
        child = sub.get("items") if sub.get("type") == "array" else sub
        if isinstance(child, Mapping) and child.get("properties"):
            suffix = "[]" if sub.get("type") == "array" else ""
            yield from _fields(child, path + suffix, frozenset(child.get("required") or ()))


def _cel(schema: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
    for rule in schema.get("x-kubernetes-validations") or ():
        yield prefix, _one_line(str(rule.get("message") or rule.get("rule", "")))
    for name, sub in (schema.get("properties") or {}).items():
        yield from _cel(sub, f"{prefix}.{name}")
        if sub.get("type") == "array" and isinstance(sub.get("items"), Mapping):
            yield from _cel(sub["items"], f"{prefix}.{name}[]")


def crd_reference() -> str:
    parts: list[str] = []
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        names = spec["names"]
        version = next(v for v in spec["versions"] if v.get("storage"))
        schema = version["schema"]["openAPIV3Schema"]
        short = ", ".join(f"`{s}`" for s in names.get("shortNames") or ()) or "none"
        parts.append(f"### {names['kind']}\n")
        parts.append(f"`{spec['group']}/{version['name']}`, {spec['scope'].lower()}, short names: {short}; "
                     f"CRD [`manifests/crds/{path.name}`](manifests/crds/{path.name}).\n")
        if schema.get("description"):
            parts.append(_one_line(schema["description"]) + "\n")
        for section in ("spec", "status"):
            sub = (schema.get("properties") or {}).get(section)
            if not isinstance(sub, Mapping) or not sub.get("properties"):
                continue
            rows = list(_fields(sub, section, frozenset(sub.get("required") or ())))
            parts.append("| field | type | default | validation | meaning |\n|---|---|---|---|---|")
            parts.extend(f"| {' | '.join(r)} |" for r in rows)
            parts.append("")
        rules = list(_cel(schema, names["kind"]))
        if rules:
            parts.append("Rules checked at admission (CEL): " + "; ".join(f"{msg}" for _, msg in rules) + ".\n")
        columns = [c["name"] for c in version.get("additionalPrinterColumns") or () if not c.get("priority")]
        if columns:
            parts.append(f"`kubectl get` columns: {', '.join(columns)}.\n")
    return "\n".join(parts).rstrip()


# ------------------------------------------------------------------------------------------ command flags


def _subcommand(name: str) -> argparse.ArgumentParser:
    from gpuops.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            parser: argparse.ArgumentParser = action.choices[name]
            return parser
    raise KeyError(f"gpuops has no subcommand {name!r}")


def flags_table(command: str) -> str:
    """Every option of `gpuops <command>` with its help text (defaults are stated there)."""
    rows = ["| flag | meaning |", "|---|---|"]
    for action in _subcommand(command)._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        value = action.metavar or ("{" + ",".join(map(str, action.choices)) + "}" if action.choices
                                   else action.dest.upper())
        flag = ", ".join(f"`{o}{'' if action.nargs == 0 else ' ' + str(value)}`" for o in action.option_strings)
        help_text = (action.help or "") % {"default": action.default} if action.help else ""
        rows.append(f"| {flag} | {_one_line(help_text)} |")
    return "\n".join(rows)


def failures_table() -> str:
    """tests/failure_matrix.py's rows: what each failure class shows, as its matrix test saw it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from failure_matrix import MATRICES

    rows = ["| controller | when | condition | Warning Event | metric | log line (JSON, with the object's key) |",
            "|---|---|---|---|---|---|"]
    for controller, seen in MATRICES.items():
        rows += [f"| {controller} | {s.failure} | {s.condition} | `{s.event}` | `{s.metric}` | `{s.log}` |"
                 for s in seen.values()]
    return "\n".join(rows)


SECTIONS: dict[str, Callable[[], str]] = {
    "bench": bench_table, "chaos": chaos_table, "crds": crd_reference, "failures": failures_table,
    "run": lambda: flags_table("run"), "agent": lambda: flags_table("agent"),
}
_BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def render(text: str) -> str:
    """`text` with every generated block replaced by its current content; an unknown block name is an error."""
    def fill(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in SECTIONS:
            raise KeyError(f"README block {name!r}: no generator (known: {', '.join(SECTIONS)})")
        return f"{m.group(1)}{SECTIONS[name]()}\n{m.group(4)}"

    return _BLOCK.sub(fill, text)


def blocks(text: str) -> list[str]:
    return [m.group("name") for m in _BLOCK.finditer(text)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale, write nothing")
    args = parser.parse_args()
    current = README.read_text()
    fresh = render(current)
    if args.check:
        if fresh != current:
            print("README.md is stale: run `make readme`", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        README.write_text(fresh)
        print(f"rewrote {', '.join(blocks(current))} in README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
