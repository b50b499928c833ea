"""`gpuops sim up` and `gpuops demo` as a user runs them: subprocesses, a kubeconfig, the real kubectl."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from waiting import wait_until

BIN = Path(sys.executable).parent
KUBECTL = str(BIN / "kubectl")
GPUOPS = str(BIN / "gpuops")

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: two-seconds
  annotations: {sim.gpuops.io/runtime-seconds: "2"}
spec:
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: main
    image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
    resources: {limits: {nvidia.com/gpu: "1"}}
"""

TOO_BIG = POD.replace("two-seconds", "too-big").replace('nvidia.com/gpu: "1"', 'nvidia.com/gpu: "64"')


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    cache = str(kubeconfig.parent / "kubectl-cache")  # discovery is cached per host:port; ports get reused
    out = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", cache, *args], input=stdin,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_sim_up_idle_with_kubectl(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen([GPUOPS, "sim", "up", "--scenario", "idle", "--kubeconfig", str(kc),
                             "--status-every", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "kubectl" in line and "get nodes" in line:
                break
            assert line or proc.poll() is None, "".join(lines)
        text = "".join(lines)
        assert re.search(r"listening on http://127\.0\.0\.1:\d+", text), text

        def usable(n: dict[str, Any]) -> bool:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            wants_gpus = "nvidia.com/gpu.count" in n["metadata"].get("labels", {})
            has_gpus = n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0") != "0"
            return ready and (has_gpus or not wants_gpus)

        def nodes_ready() -> bool:
            items = json.loads(kubectl(kc, "get", "nodes", "-o", "json"))["items"]
            return len([n for n in items if usable(n)]) == 6

        wait_until("6 Ready nodes with GPUs", nodes_ready, 30, every=0.2)
        wide = kubectl(kc, "get", "nodes", "-L", "nvidia.com/gpu.product")
        assert "NVIDIA-A100-SXM4-40GB" in wide and "NVIDIA-H100-80GB-HBM3" in wide

        kubectl(kc, "apply", "-f", "-", stdin=POD)
        kubectl(kc, "apply", "-f", "-", stdin=TOO_BIG)

        def pod(name: str) -> dict[str, Any]:
            return json.loads(kubectl(kc, "get", "pod", name, "-o", "json"))  # type: ignore[no-any-return]

        done = wait_until("the 2 s pod to succeed",
                          lambda: (p := pod("two-seconds"))["status"].get("phase") == "Succeeded" and p, 30, every=0.2)
        state = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 0 and state["reason"] == "Completed"
        assert done["status"]["startTime"] <= state["startedAt"] <= state["finishedAt"]
        scheduled = wait_until("Unschedulable", lambda: [c for c in pod("too-big")["status"].get("conditions", [])
                                                         if c["type"] == "PodScheduled" and c["status"] == "False"],
                               30.0, every=0.2)
        assert scheduled[0]["reason"] == "Unschedulable"
        assert "Insufficient nvidia.com/gpu" in scheduled[0]["message"]
        events = kubectl(kc, "get", "events", "--field-selector", "involvedObject.name=too-big")
        assert "FailedScheduling" in events
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def test_detach_refuses_a_second_cluster_on_one_kubeconfig_and_down_is_idempotent(tmp_path: Path) -> None:
    kc = tmp_path / "sim.kubeconfig"
    up = [GPUOPS, "sim", "up", "--scenario", "idle", "--no-run-pods", "--kubeconfig", str(kc), "--detach"]
    try:
        first = subprocess.run(up, capture_output=True, text=True, timeout=120, check=False)
        assert first.returncode == 0, first.stderr
        assert kc.exists() and "running in the background" in first.stdout
        second = subprocess.run(up, capture_output=True, text=True, timeout=120, check=False)
        assert second.returncode == 1 and "still runs" in second.stderr
        assert kc.exists(), "the refused start left the running cluster's kubeconfig alone"
    finally:
        down = subprocess.run([GPUOPS, "sim", "down", "--kubeconfig", str(kc)], capture_output=True, text=True,
                              timeout=120, check=False)
    assert down.returncode == 0 and "stopped" in down.stdout and not kc.exists()
    again = subprocess.run([GPUOPS, "sim", "down", "--kubeconfig", str(kc)], capture_output=True, text=True,
                           timeout=60, check=False)
    assert again.returncode == 0 and "no cluster runs" in again.stdout
