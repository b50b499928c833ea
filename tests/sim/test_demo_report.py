"""`gpuops demo`'s report: the timeline sampler on synthetic series, the Markdown and the plots from
them, and a short real run (a subprocess, as `make demo` runs it) leaving README.md and every PNG behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuops_sim.report import RunInfo, write_report
from gpuops_sim.report.events import Recorder
from gpuops_sim.report.live import plain, progress, screen
from gpuops_sim.report.plots import PLOTS
from gpuops_sim.report.timeline import Sample, Timeline, sample_from

BIN = Path(sys.executable).parent
PNG = b"\x89PNG\r\n\x1a\n"


def budget(ns: str, name: str, consumed: str | None, quota: str, action: str, exceeded: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "QuotaExceeded", "status": "True" if exceeded else "False"}]}
    if consumed is not None:
        status["consumedGpuHours"] = consumed
    return {"metadata": {"namespace": ns, "name": name},
            "spec": {"quota": {"gpuHours": quota, "windowHours": 1}, "enforcement": {"action": action}},
            "status": status}


def pod(name: str, *, gpus: int = 0, node: str | None = None, gated: bool = False, phase: str = "Pending",
        deleting: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "gpuops.io/mig-slicer"}]
    meta: dict[str, Any] = {"name": name, "namespace": "t"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_sample_from_reads_each_controllers_objects() -> None:
    s = sample_from(
        3.0,
        budgets=[budget("a", "train", "0.0625", "0.05", "Pause", True), budget("b", "nb", None, "0.01", "AlertOnly",
                                                                                  False)],
        node_groups=[{"metadata": {"name": "h100-1"}, "spec": {"nodeName": "h100-1"}, "status": {"state": "Ready"}},
                     {"metadata": {"name": "l4-1"}, "spec": {"nodeName": "l4-1"}}],
        pools=[{"metadata": {"name": "spot"}, "status": {"desired": 2, "ready": 1}}],
        mig_nodes=[{"status": {"gpus": [{"slices": [{"profile": "1g.5gb", "claim": "t/c1"},
                                                    {"profile": "1g.5gb"}, {"profile": "3g.20gb", "claim": "t/c2"}]},
                                        {"slices": [{"profile": "1g.5gb", "claim": "t/c3"}]}]}}],
        pods=[pod("gated", gated=True), pod("wants-gpus", gpus=2), pod("bound", gpus=1, node="n1"),
              pod("cpu-only"), pod("gone", gpus=1, deleting=True), pod("done", gpus=1, phase="Failed")],
        machines=[("h100-1", "on"), ("l4-1", "off")],
        instances=[("spot", "running"), ("spot", "pending"), ("spot", "terminated"), ("other", "running")],
        launches=4, reclaims=1,
    )
    assert s.budgets["a/train"].consumed == pytest.approx(0.0625) and s.budgets["a/train"].exceeded
    assert s.budgets["a/train"].quota == pytest.approx(0.05) and s.budgets["a/train"].action == "Pause"
    assert s.budgets["b/nb"].consumed is None and not s.budgets["b/nb"].exceeded
    assert s.groups["h100-1"].state == "Ready" and s.groups["l4-1"].state == "" and s.groups["l4-1"].node == "l4-1"
    assert s.pools["spot"].desired == 2 and s.pools["spot"].ready == 1 and s.pools["spot"].live == 2
    assert s.slices == {"1g.5gb": 3, "3g.20gb": 1} and s.slices_in_use == 3
    assert s.mig_waiting == 1 and s.pending_gpu_pods == 1
    assert s.power == {"h100-1": "on", "l4-1": "off"} and (s.launches, s.reclaims) == (4, 1)


def series() -> Timeline:
    """Ten seconds of a small synthetic run: a budget going over quota at t=4, a machine powered on at t=2 and off
    at t=7, a pool losing an instance to a reclaim at t=5 (two more at t=8) and relaunching, MIG slices growing."""
    tl = Timeline()
    power = ["off", "off", "booting", "booting", "on", "on", "on", "shutting-down", "off", "off"]
    ready = [2, 2, 2, 2, 2, 1, 1, 2, 2, 2]
    launches = [2, 2, 2, 2, 2, 3, 3, 3, 5, 5]
    reclaims = [0, 0, 0, 0, 0, 1, 1, 1, 3, 3]
    for t in range(10):
        tl.add(Sample(
            t=float(t),
            budgets=sample_from(0, budgets=[budget("a", "train", str(0.01 * t), "0.05", "Pause", t >= 4)]).budgets,
            power={"gpu-1": power[t], "gpu-0": "on"},
            groups=sample_from(0, node_groups=[{"metadata": {"name": "gpu-1"}, "spec": {"nodeName": "gpu-1"},
                                                "status": {"state": "Ready" if t >= 4 else "Off"}}]).groups,
            pending_gpu_pods=1 if 1 <= t <= 3 else 0,
            pools=sample_from(0, pools=[{"metadata": {"name": "spot"}, "status": {"desired": 2, "ready": ready[t]}}],
                              instances=[("spot", "running")] * 2).pools,
            launches=launches[t], reclaims=reclaims[t],
            slices={"1g.5gb": min(t, 4), **({"3g.20gb": 1} if t >= 6 else {})},
            slices_in_use=min(t, 4), mig_waiting=1 if t in (1, 2) else 0,
        ))
    return tl


def test_timeline_series() -> None:
    tl = series()
    assert len(tl) == 10 and tl.times == [float(t) for t in range(10)]
    assert tl.budget_names() == ["a/train"]
    assert tl.first_exceeded("a/train") == 4.0
    assert tl.peak_consumed("a/train") == pytest.approx(0.09)
    counts = tl.power_counts()
    assert counts["on"] == [1, 1, 1, 1, 2, 2, 2, 1, 1, 1]
    assert counts["booting"] == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert counts["shutting-down"][7] == 1 and counts["off"] == [1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
    assert tl.power_transitions("gpu-1") == (1, 1)
    assert tl.power_transitions("gpu-0") == (0, 0)
    assert tl.seconds_in("gpu-1", "on") == pytest.approx(3.0)
    assert tl.seconds_in("gpu-1", "booting") == pytest.approx(2.0)
    assert tl.reclaim_times() == [5.0, 8.0, 8.0]
    assert tl.launch_times() == [0.0, 0.0, 5.0, 8.0, 8.0]  # the first sample's launches happened by t=0
    assert tl.slice_series() == {"1g.5gb": [0, 1, 2, 3, 4, 4, 4, 4, 4, 4], "3g.20gb": [0] * 6 + [1] * 4}
    assert tl.pool_names() == ["spot"] and [p.ready for p in tl.pool_series("spot") if p] == [2, 2, 2, 2, 2, 1, 1,
                                                                                              2, 2, 2]
    with pytest.raises(ValueError, match="older"):
        tl.add(Sample(t=3.0))


def recorder() -> Recorder:
    now = [0.0]
    rec = Recorder(clock=lambda: now[0])

    def event(t: float, component: str, reason: str, kind: str, name: str, ns: str = "") -> None:
        now[0] = t
        inv = {"kind": kind, "name": name, **({"namespace": ns} if ns else {})}
        rec.record({"reportingComponent": component, "reason": reason, "involvedObject": inv, "message": "m"})

    event(4.5, "gpuops-budget-controller", "QuotaExceeded", "GPUWorkloadBudget", "train", "a")
    event(5.0, "gpuops-budget-controller", "Paused", "GPUWorkloadBudget", "train", "a")
    event(2.0, "gpuops-autoprovision-controller", "PowerOnDecided", "GPUNodeGroup", "gpu-1")
    event(5.5, "gpuops-spotpool-controller", "Reclaimed", "SpotPool", "spot")
    event(6.0, "kubelet", "Started", "Pod", "p", "t")  # the emulator's own: not counted
    return rec


def test_recorder_keeps_operator_events_only() -> None:
    rec = recorder()
    assert rec.seen == 4 and len(rec.since(2)) == 2
    assert rec.count(("Paused", "Evicted"), "GPUWorkloadBudget/a/train") == 1
    assert rec.times("Reclaimed") == [5.5]
    assert ("kubelet", "Started") not in rec.by_reason


def test_recorder_counts_coalesced_repeats() -> None:
    """A recorder that coalesces repeats patches the count of its first Event: each increase counts."""
    rec = Recorder(clock=lambda: 1.0)
    ev = {"metadata": {"namespace": "a", "name": "train.1"}, "reportingComponent": "gpuops-budget-controller",
          "reason": "Paused", "involvedObject": {"kind": "GPUWorkloadBudget", "namespace": "a", "name": "train"},
          "count": 1}
    assert rec.record(ev) is not None
    assert rec.record({**ev, "count": 3}) is not None
    assert rec.record({**ev, "count": 3}) is None  # an update that is not a repeat (e.g. lastTimestamp only)
    assert rec.by_reason[("gpuops-budget-controller", "Paused")] == 3 and rec.seen == 3
    assert rec.count(("Paused",), "GPUWorkloadBudget/a/train") == 3


def test_report_from_a_synthetic_run(tmp_path: Path) -> None:
    tl, rec = series(), recorder()
    info = RunInfo(scenario="synthetic", description="a test", planned_seconds=10, elapsed=9.0,
                   ended_by="the time limit (10 s)", operator="ran until the end", agents=["mig-0"],
                   summary={"mig_allocations": 4}, compression=["machines boot in 2 s"])
    readme = write_report(tmp_path / "rep", info, tl, rec)
    text = readme.read_text()
    budgets_row = next(line for line in text.splitlines() if line.startswith("| `a/train`"))
    assert "| Pause | 0.050 | 0.0900 | 0.0900 | 4 s | 1 | 1 | over quota |" in budgets_row
    group_row = next(line for line in text.splitlines() if line.startswith("| `gpu-1`"))
    assert "| gpu-1 | Ready | 1 | 1 | 1 | 0 | 3 s | off |" in group_row
    pool_row = next(line for line in text.splitlines() if line.startswith("| `spot`"))
    assert "reclaim notices" in text and "| 5 s, 8 s, 8 s |" in pool_row
    assert "ready below desired from 5 s, back at desired 7 s" in pool_row
    assert re.search(r"\| `1g\.5gb` \| 4 \| 4 \|", text)
    assert "Pods given slices by the agents' device plugins: 4" in text
    assert "| gpuops-budget-controller | Paused | 1 |" in text and "| kubelet |" not in text
    for name in PLOTS.values():
        assert f"]({name})" in text
        data = (tmp_path / "rep" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name


def test_live_view_lines() -> None:
    tl, rec = series(), recorder()
    summary = {"scenario": "s", "pods": {"Running": 2}, "unschedulable": 0, "jobs": {}, "gpus_used": 3,
               "gpus_total": 8, "nodes": [], "machines_off": [], "faults": [], "mig_allocations": 4}
    assert progress(30, 120, width=10) == "[##........]    30 / 120 s"
    text = plain(summary, tl.last, rec, elapsed=9, total=10, operator="running", events_from=2)
    assert "\x1b" not in text
    assert "a/train" in text and "OVER QUOTA, Pause: 1 workload(s) paused" in text
    assert "machines on 1, booting 0, shutting-down 0, off 1" in text
    assert "spot pool spot: ready 2/2 desired, live instances 2, launched 5, reclaimed 3" in text
    assert "MIG slicer: slices 1g.5gb x4, 3g.20gb x1 (in use 4)" in text
    assert text.count(" event ") == 2  # only the Events after the first two
    full = screen(summary, tl.last, rec, elapsed=9, total=10, operator="running")
    assert "[###########################...]" in full and "PowerOnDecided" in full


def test_live_view_event_ages_are_never_negative() -> None:
    """An Event of the operator's start-up (before the workload's clock starts) and one recorded while a frame is
    drawn (past the frame's `elapsed`) show kubectl-style ages, the latter 0s rather than -0.1s."""
    now = [0.0]
    rec = Recorder(clock=lambda: now[0])

    def event(reason: str) -> None:
        rec.record({"reportingComponent": "gpuops-spotpool-controller", "reason": reason,
                    "involvedObject": {"kind": "SpotPool", "name": "spot"}, "message": "m"})

    event("Launched")
    now[0] = 1.9
    rec.restart_clock()  # the workload starts: Launched is at -1.9 s
    now[0] = 9.6
    event("Reclaimed")  # at 7.7 s, while the frame of 7.6 s is drawn
    summary = {"scenario": "s", "pods": {}, "unschedulable": 0, "jobs": {}, "gpus_used": 0, "gpus_total": 0,
               "nodes": [], "machines_off": [], "faults": [], "mig_allocations": 0}
    text = plain(summary, None, rec, elapsed=7.6, total=10, operator="running", events_from=0)
    assert re.findall(r" event +(\S+) ago gpuops-spotpool-controller: (\w+)", text) == [("9s", "Launched"),
                                                                                        ("0s", "Reclaimed")]
    full = screen(summary, None, rec, elapsed=7.6, total=10, operator="running")
    assert re.findall(r"^ +(\S+) ago  gpuops-spotpool-controller: (\w+)", full, re.M) == [("9s", "Launched"),
                                                                                          ("0s", "Reclaimed")]
    assert "-0" not in text and "-0" not in full and "-1" not in full


def test_short_demo_run_writes_the_report(tmp_path: Path) -> None:
    """`DEMO_SECONDS=20 make demo` as a user runs it, with the operator and the MIG agents, output to a pipe: the
    live view, the short report at the end, and the report folder."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "gpuops"), "demo", "--report-dir", "rep", "--kubeconfig", "demo.kubeconfig"],
        cwd=tmp_path, capture_output=True, text=True, timeout=100, env={**os.environ, "DEMO_SECONDS": "20"},
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "\x1b[" not in out, "no cursor control when stdout is not a terminal"
    for line in ("gpuops demo report - scenario demo", "pods bound by the scheduler", "kubectl --kubeconfig",
                 "budget team-a/team-a-training:"):
        assert line in out, out[-3000:]
    # the operator (gpuops run, every registered controller) ran for the whole demo against the cluster
    assert "operator process: ran until the end" in out, (tmp_path / "demo-operator.log").read_text()[-3000:]
    assert re.search(r"^\[ *\d+/20 s\] budgets", out, re.M), out[-3000:]
    text = (tmp_path / "rep" / "README.md").read_text()
    for heading in ("## Budgets (GPUWorkloadBudget)", "## Autoprovision (GPUNodeGroup)", "## Spot pool (SpotPool)",
                    "## MIG slicer", "## Operator Events by reason"):
        assert heading in text
    # each controller's figures, with the demo scenario's objects in them
    assert re.search(r"^\| `team-a/team-a-training` \| Pause \| 0\.200 \| \d+\.\d{4} \|", text, re.M), text
    assert re.search(r"^\| `team-b/team-b-notebooks` \| AlertOnly \| 0\.010 \|", text, re.M)
    assert re.search(r"^\| `h100-1` \| h100-1 \| \w+ \|", text, re.M) and re.search(r"^\| `l4-1` \|", text, re.M)
    pool = re.search(r"^\| `spot-l4` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", text, re.M)
    assert pool is not None and int(pool[1]) == 2 and int(pool[4]) >= 2, text  # desired 2, launched at least 2
    assert re.search(r"^\| `\dg\.\d+gb` \| \d+ \| [1-9]\d* \|", text, re.M), "MIG slices were made"
    assert "| gpuops-spotpool-controller | Launched |" in text
    for name in PLOTS.values():
        data = (tmp_path / "rep" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
        assert f"]({name})" in text
    print(f"demo run took {took:.1f} s")
