"""`gpuops demo` / `make demo`: the emulated cluster running a scenario, our operator against it, a live view.

The operator runs as a separate process (`gpuops run`), exactly as it would against a real cluster, and
reaches the emulator only over HTTP. The terminal shows what runs where and what each controller did (the
Kubernetes Events our controllers record); `--seconds N` (or `DEMO_SECONDS=N`) ends the demo with a short
report and exit code 0. At the end (or on Ctrl-C) the full report goes into `demo-report/` (`--report-dir`):
README.md and PNG plots over time of the cluster's state, sampled about once a second (`gpuops_sim.report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .cluster.access import NODES
from .cluster.cluster import SimCluster
from .demo_mig import MigSide
from .report import RunInfo, live, write_report
from .report.events import Recorder
from .report.timeline import Timeline, sample_cluster
from .scenario import Scenario


def usage(cluster: SimCluster, kubeconfig: str | None) -> str:
    kc = f"--kubeconfig {kubeconfig} " if kubeconfig else ""
    return "\n".join([
        f"  API server  {cluster.server.url}",
        f"  cloud API   {cluster.cloud.url}  (power: /power/v1/machines, spot: /spot/v1/instances)",
        *([f"  kubeconfig  {kubeconfig}"] if kubeconfig else []),
        "  try:",
        f"    kubectl {kc}get nodes -L gpuops.io/gpu-model -L nvidia.com/gpu.count",
        f"    kubectl {kc}get pods -A -o wide",
        f"    kubectl {kc}get events -A --sort-by=.lastTimestamp",
    ])


def report(summary: dict[str, Any], elapsed: float, operator_exit: int | None, recorder: Recorder) -> str:
    """The short report printed at the end (the full one, with plots, goes into the report folder)."""
    pods = summary["pods"]
    lines = [
        f"gpuops demo report - scenario {summary['scenario']}, {elapsed:.0f} s",
        f"  submitted: {sum(summary['submitted'].values())} "
        f"({', '.join(f'{k} {v}' for k, v in summary['submitted'].items())})",
        f"  pods now: {', '.join(f'{k} {v}' for k, v in sorted(pods.items())) or 'none'}",
        f"  pods bound by the scheduler: {summary['bound']}; phase transitions by kubelets: {summary['transitions']}",
        f"  jobs: {', '.join(f'{k} {v}' for k, v in sorted(summary['jobs'].items())) or 'none'}",
        f"  GPUs in use at the end: {summary['gpus_used']} of {summary['gpus_total']}",
        f"  MIG: {summary.get('mig_allocations', 0)} pods got slices from the agents' device plugins; "
        f"{summary.get('gated', 0)} still gated",
        *(f"  budget {b['name']}: {b['consumed']} of {b['quota']} GPU-hours, {b['action']}, "
          + ("over quota" if b["exceeded"] else "within quota") for b in summary["budgets"]),
        f"  faults applied: {len(summary['faults'])}",
        *("    " + f for f in summary["faults"]),
        "  operator Events by reason: " + (", ".join(f"{c}/{r} {n}" for (c, r), n in recorder.by_reason.most_common())
                                           or "none"),
        "  operator process: "
        + ("ran until the end (stopped by the demo)" if operator_exit is None else f"exited {operator_exit} early"),
    ]
    return "\n".join(lines)


def compression(scenario: Scenario) -> list[str]:
    """How the scenario squeezes hours into minutes, read from its own settings (for the report)."""
    out = []
    boots = sorted({g.boot_seconds for g in scenario.node_groups if g.gpu_model})
    if boots:
        out.append(f"machines boot in {', '.join(f'{b:g}' for b in boots)} s")
    c = scenario.cloud
    if c.instance_types:
        out.append(f"spot instances launch in {c.launch_seconds:g} s and boot in {c.boot_seconds:g} s; a reclaim "
                   f"notice gives {c.reclaim_notice_seconds:g} s")
    for obj in scenario.objects:
        spec, name = obj.get("spec") or {}, (obj.get("metadata") or {}).get("name", "")
        if obj.get("kind") == "GPUWorkloadBudget":
            q = spec.get("quota") or {}
            out.append(f"budget {name} allows {q.get('gpuHours')} GPU-hours per {q.get('windowHours')} h")
        elif obj.get("kind") == "GPUNodeGroup" and "scaleDownUnneededSeconds" in spec:
            out.append(f"GPUNodeGroup {name} powers off after {spec['scaleDownUnneededSeconds']} s idle")
    return out


def _operator_command(kubeconfig: str) -> list[str]:
    exe = Path(sys.executable).parent / "gpuops"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuops"]
    return [*base, "run", "--kubeconfig", kubeconfig, "--metrics-bind-address", "127.0.0.1:0",
            "--health-probe-bind-address", "127.0.0.1:0", "--log-format", "json"]


def repo_crds() -> list[Path]:
    """Our CRDs from the checkout's manifests/ (what `kubectl apply -k manifests` would install first)."""
    folder = Path(__file__).resolve().parents[2] / "manifests" / "crds"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


async def _gpus_allocatable(cluster: SimCluster, exclude: set[str], within: float = 30.0) -> bool:
    """Wait until every powered-on GPU machine (but the MIG ones) has a Node with its GPUs allocatable, so the first
    pods find the cluster as it is, not half-booted (a pod pending for a device plugin would wake a powered-off
    machine for nothing)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        want = {m.name for m in cluster.fleet.machines.values() if m.state == "on" and m.gpus and m.name not in exclude}
        have = {n["metadata"]["name"] for n in cluster.access.iter(NODES)
                if str(((n.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")) != "0"}
        if want <= have:
            return True
        await asyncio.sleep(0.2)
    return False


def _start_operator(cmd: list[str], log_path: str) -> tuple[subprocess.Popen[bytes], BinaryIO]:
    log_file = open(log_path, "wb")  # noqa: SIM115 - the caller closes it after the process ends
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT), log_file


def _stop_on_signals() -> asyncio.Event:
    """An event Ctrl-C or SIGTERM sets, so the demo ends with its report instead of a traceback."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def _start_operator_side(
    cluster: SimCluster, mig: MigSide, kubeconfig: str, operator_log: str, out: TextIO
) -> tuple[subprocess.Popen[bytes], BinaryIO]:
    """The MIG agents and the operator process, and a wait for the operator's webhook."""
    await mig.start(cluster)
    proc, log_file = _start_operator([*_operator_command(kubeconfig), *mig.operator_args()], operator_log)
    print(f"  operator    gpuops run (pid {proc.pid}), logs in {operator_log}", file=out, flush=True)
    if mig.procs:
        print(f"  MIG agents  gpuops agent --emulated on {', '.join(sorted(mig.procs))}, logs in "
              f"{mig.log_path}", file=out, flush=True)
    if not await mig.webhook_ready(cluster):  # its failure policy refuses MIG pods until it serves
        print("  (the operator's webhook did not answer within 30 s; starting the workload anyway)", file=out)
    return proc, log_file


@dataclass(frozen=True)
class _LiveView:
    """How the live view is shown: where, for how long, how often."""

    out: TextIO
    seconds: float | None
    refresh: float
    plain_every: float


async def _show_live(cluster: SimCluster, timeline: Timeline, recorder: Recorder,
                     proc: subprocess.Popen[bytes] | None, stop: asyncio.Event, view: _LiveView,
                     start: float) -> str:
    """Sample the cluster every `refresh` s and show it (a redrawn screen on a terminal, else a plain block
    every `plain_every` s) until `stop` or the time limit; returns what ended the demo."""
    out = view.out
    tty = out.isatty()
    next_plain = 0.0
    printed = 0
    while not stop.is_set():
        elapsed = time.monotonic() - start
        if view.seconds is not None and elapsed >= view.seconds:
            return f"the time limit ({view.seconds:g} s)"
        timeline.add(sample_cluster(cluster, elapsed))
        state = "not started" if proc is None else (
            "running" if proc.poll() is None else f"exited {proc.returncode}")
        if tty:
            out.write("\x1b[H\x1b[2J" + live.screen(cluster.summary(), timeline.last, recorder,
                                                  elapsed=elapsed, total=view.seconds, operator=state) + "\n")
            out.flush()
        elif elapsed >= next_plain:
            out.write(live.plain(cluster.summary(), timeline.last, recorder, elapsed=elapsed, total=view.seconds,
                                 operator=state, events_from=printed) + "\n")
            out.flush()
            printed = recorder.seen
            next_plain = elapsed + view.plain_every
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, view.refresh - (time.monotonic() - start - elapsed)))
    return "Ctrl-C (or SIGTERM)"


async def _stop_operator(proc: subprocess.Popen[bytes] | None, log_file: BinaryIO | None) -> int | None:
    """SIGTERM the operator (killed if it takes over 35 s); its exit code if it had ended by itself."""
    exit_code = None
    if proc is not None:
        exit_code = proc.poll()
        if exit_code is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 35)
            except subprocess.TimeoutExpired:
                proc.kill()
    if log_file is not None:
        log_file.close()
    return exit_code


def _operator_outcome(proc: subprocess.Popen[bytes] | None, exit_code: int | None, ended_by: str) -> str:
    if proc is None:
        return "not started (--no-operator)"
    if exit_code is None:
        return "ran until the end (stopped by the demo)"
    if ended_by.startswith("Ctrl-C"):
        return f"stopped by the Ctrl-C too (exit code {exit_code})"
    return f"exited {exit_code} early"


async def run_demo(
    scenario: Scenario,
    *,
    kubeconfig: str,
    seconds: float | None,
    port: int = 0,
    operator: bool = True,
    operator_log: str = "demo-operator.log",
    out: TextIO = sys.stdout,
    refresh: float = 1.0,
    report_dir: str | Path | None = "demo-report",
    plain_every: float = 10.0,
) -> int:
    """Run the demo until `seconds` (None: until Ctrl-C or SIGTERM), sampling the cluster every `refresh` s; then
    print a short report and write the full one (README.md and PNGs) into `report_dir` (None: none)."""
    stop = _stop_on_signals()
    mig = MigSide(kubeconfig)
    timeline = Timeline()
    async with SimCluster(scenario, port=port, manifests=repo_crds(), device_plugin_root=mig.root,
                          hold_workload=operator) as cluster:
        cluster_start = time.monotonic()  # the scenario's fault times count from here
        cluster.write_kubeconfig(kubeconfig)
        recorder = Recorder().attach(cluster)
        print(f"gpuops demo: scenario {scenario.name}: {scenario.description}", file=out)
        print(usage(cluster, kubeconfig), file=out, flush=True)
        proc: subprocess.Popen[bytes] | None = None
        log_file: BinaryIO | None = None
        if operator:
            proc, log_file = await _start_operator_side(cluster, mig, kubeconfig, operator_log, out)
        if not await _gpus_allocatable(cluster, exclude=set(MigSide.mig_machines(cluster))):
            print("  (not every powered-on GPU node offered its GPUs within 30 s; starting the workload anyway)",
                  file=out)
        if report_dir is not None:
            print(f"  report      {Path(report_dir) / 'README.md'} and PNG plots, written at the end", file=out)
        cluster.start_workload()
        start = time.monotonic()
        recorder.restart_clock()
        ended_by = "Ctrl-C (or SIGTERM)"
        try:
            view = _LiveView(out, seconds, refresh, plain_every)
            ended_by = await _show_live(cluster, timeline, recorder, proc, stop, view, start)
        finally:
            elapsed = time.monotonic() - start
            timeline.add(sample_cluster(cluster, elapsed))  # the state the run ended in
            exit_code = await _stop_operator(proc, log_file)
            agents = sorted(mig.procs)
            await mig.stop()
        summary = cluster.summary()
        print("\n" + report(summary, elapsed, exit_code, recorder), file=out, flush=True)
        if report_dir is not None:
            info = RunInfo(
                scenario=scenario.name, description=scenario.description, planned_seconds=seconds, elapsed=elapsed,
                ended_by=ended_by, agents=agents, summary=summary, compression=compression(scenario),
                fault_offset=start - cluster_start, operator=_operator_outcome(proc, exit_code, ended_by),
            )
            readme = write_report(Path(report_dir), info, timeline, recorder)
            print(f"  full report: {readme} (plots beside it)", file=out, flush=True)
    return 0


def seconds_from_env(value: float | None) -> float | None:
    if value is not None:
        return value
    env = os.environ.get("DEMO_SECONDS", "").strip()
    if not env:
        return None
    try:
        return float(env)
    except ValueError:
        raise SystemExit(f"gpuops demo: DEMO_SECONDS must be a number of seconds, got {env!r}") from None
