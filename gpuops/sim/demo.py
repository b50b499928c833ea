"""`gpuops demo` / `make demo`: the emulated cluster running a scenario, our operator against it, a live view.

The operator runs as a separate process (`gpuops run`), exactly as it would against a real cluster, and
reaches the emulator only over HTTP. The terminal shows what runs where and what each controller did (the
Kubernetes Events our controllers record); `--seconds N` (or `DEMO_SECONDS=N`) ends the demo with a short
report and exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .cluster.access import EVENTS
from .cluster.cluster import SimCluster
from .demo_mig import MigSide
from .scenario import Scenario

# Events from these components are the emulated cluster's own; everything else is an operator's doing.
SIM_COMPONENTS = ("default-scheduler", "kubelet", "job-controller", "node-controller", "taint-eviction-controller",
                  "pod-garbage-collector", "sim-workload")


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


class Recorder:
    """Keeps the latest operator Events (not the emulator's own) for the live view and the report."""

    def __init__(self, cluster: SimCluster, keep: int = 8) -> None:
        self.recent: deque[str] = deque(maxlen=keep)
        self.by_reason: Counter[str] = Counter()
        cluster.access.listen(self._on_event)

    def _on_event(self, ev: Any) -> None:
        if ev.gr != EVENTS or ev.type != "ADDED":
            return
        obj = ev.new.obj
        component = obj.get("reportingComponent") or (obj.get("source") or {}).get("component") or ""
        if not component or component in SIM_COMPONENTS or component.startswith("system:"):
            return
        inv = obj.get("involvedObject") or {}
        self.by_reason[f"{component}/{obj.get('reason', '')}"] += 1
        ns = f"{inv['namespace']}/" if inv.get("namespace") else ""
        where = f"{inv.get('kind', '')}/{ns}{inv.get('name', '')}"
        self.recent.append(f"{component}: {obj.get('reason', '')} {where}: {obj.get('message', '')}"[:150])


def render(summary: dict[str, Any], elapsed: float, operator: str, recorder: Recorder) -> str:
    lines = [f"gpuops demo - scenario {summary['scenario']} - {elapsed:5.0f} s - operator: {operator}", ""]
    lines.append(f"{'NODE':<12} {'MODEL':<11} {'POWER':<14} {'READY':<6} GPUS (used/allocatable)")
    for n in summary["nodes"]:
        bar = "#" * n["gpus_used"] + "." * max(0, n["gpus"] - n["gpus_used"])
        cordon = " cordoned" if n["unschedulable"] else ""
        mig = "  MIG " + ", ".join(f"{p} x{k}" for p, k in sorted(n["mig"].items())) if n.get("mig") else ""
        lines.append(f"{n['name']:<12} {n['model'] or '-':<11} {n['power']:<14} {n['ready']!s:<6} "
                     f"{n['gpus_used']}/{n['gpus']} {bar}{cordon}{mig}")
    for m in summary["machines_off"]:
        if not any(n["name"] == m for n in summary["nodes"]):
            lines.append(f"{m:<12} {'':<11} {'off':<14} {'-':<6} (never registered)")
    pods = summary["pods"]
    lines += ["", "pods: " + ", ".join(f"{k} {v}" for k, v in sorted(pods.items())) +
              f"  (unschedulable {summary['unschedulable']}, waiting for MIG slices {summary.get('gated', 0)})",
              "jobs: " + (", ".join(f"{k} {v}" for k, v in sorted(summary["jobs"].items())) or "none"),
              f"GPUs in use: {summary['gpus_used']} of {summary['gpus_total']} allocatable"]
    if summary["budgets"]:
        lines += ["", f"{'BUDGET':<28} {'CONSUMED':>10} {'QUOTA':>8} {'ACTION':<10} STATE"]
        for b in summary["budgets"]:
            lines.append(f"{b['name']:<28} {b['consumed']:>10} {b['quota']:>8} {b['action']:<10} "
                         + ("over quota" if b["exceeded"] else "within quota"))
    if summary["faults"]:
        lines += ["", "faults:", *("  " + f for f in summary["faults"][-3:])]
    lines += ["", "what the controllers did (latest Events):"]
    lines += ["  " + e for e in recorder.recent] or ["  (nothing yet)"]
    return "\n".join(lines)


def report(summary: dict[str, Any], elapsed: float, operator_exit: int | None, recorder: Recorder) -> str:
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
        "  operator Events by reason: " + (", ".join(f"{k} {v}" for k, v in recorder.by_reason.most_common())
                                           or "none"),
        "  operator process: "
        + ("ran until the end (stopped by the demo)" if operator_exit is None else f"exited {operator_exit} early"),
    ]
    return "\n".join(lines)


def _operator_command(kubeconfig: str) -> list[str]:
    exe = Path(sys.executable).parent / "gpuops"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuops"]
    return [*base, "run", "--kubeconfig", kubeconfig, "--metrics-bind-address", "127.0.0.1:0",
            "--health-probe-bind-address", "127.0.0.1:0", "--log-format", "json"]


def repo_crds() -> list[Path]:
    """Our CRDs from the checkout's manifests/ (what `kubectl apply -k manifests` would install first)."""
    folder = Path(__file__).resolve().parents[2] / "manifests" / "crds"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def _start_operator(cmd: list[str], log_path: str) -> tuple[subprocess.Popen[bytes], BinaryIO]:
    log_file = open(log_path, "wb")  # noqa: SIM115 - the caller closes it after the process ends
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT), log_file


async def run_demo(
    scenario: Scenario,
    *,
    kubeconfig: str,
    seconds: float | None,
    port: int = 0,
    operator: bool = True,
    operator_log: str = "demo-operator.log",
    out: TextIO = sys.stdout,
    refresh: float = 2.0,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    tty = out.isatty()
    crds = repo_crds()
    mig = MigSide(kubeconfig)
    async with SimCluster(scenario, port=port, manifests=crds, device_plugin_root=mig.root,
                          hold_workload=operator) as cluster:
        cluster.write_kubeconfig(kubeconfig)
        recorder = Recorder(cluster)
        print(f"gpuops demo: scenario {scenario.name}: {scenario.description}", file=out)
        print(usage(cluster, kubeconfig), file=out, flush=True)
        proc: subprocess.Popen[bytes] | None = None
        log_file: BinaryIO | None = None
        if operator:
            await mig.start(cluster)
            proc, log_file = _start_operator([*_operator_command(kubeconfig), *mig.operator_args()], operator_log)
            print(f"  operator    gpuops run (pid {proc.pid}), logs in {operator_log}", file=out, flush=True)
            if mig.procs:
                print(f"  MIG agents  gpuops agent --emulated on {', '.join(sorted(mig.procs))}, logs in "
                      f"{mig.log_path}", file=out, flush=True)
            if not await mig.webhook_ready(cluster):  # its failure policy refuses MIG pods until it serves
                print("  (the operator's webhook did not answer within 30 s; starting the workload anyway)", file=out)
        cluster.start_workload()
        start = time.monotonic()
        next_plain = 0.0
        try:
            while not stop.is_set():
                elapsed = time.monotonic() - start
                if seconds is not None and elapsed >= seconds:
                    break
                state = "not started" if proc is None else (
                    "running" if proc.poll() is None else f"exited {proc.returncode}")
                if tty:
                    out.write("\x1b[H\x1b[2J" + render(cluster.summary(), elapsed, state, recorder) + "\n")
                    out.flush()
                elif elapsed >= next_plain:
                    out.write("\n" + render(cluster.summary(), elapsed, state, recorder) + "\n")
                    out.flush()
                    next_plain = elapsed + 15.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), refresh)
        finally:
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
            await mig.stop()
        print("\n" + report(cluster.summary(), time.monotonic() - start, exit_code, recorder), file=out, flush=True)
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
