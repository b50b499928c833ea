"""The MIG slicer's side of the demo: one `gpuops agent --emulated` process per MIG-capable machine (what the agent
DaemonSet runs on a real cluster), and the admission webhook's configuration pointed at the operator.

The agents reach the emulated kubelets through their device-plugin sockets (`<root>/<node>/kubelet.sock`) and the
API server over HTTP, exactly as on a node; nothing here imports the operator's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from . import gpus
from .cluster.cluster import SimCluster

__all__ = ["MigSide", "free_port"]

WEBHOOK_CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml"
WEBHOOK_SERVICE = ("gpuops-system", "gpuops-webhook")
WEBHOOK_NAME = "gpuops-mig-slicer"
WEBHOOKS = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpuops() -> list[str]:
    exe = Path(sys.executable).parent / "gpuops"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuops"]


class MigSide:
    """Start with `await side.start(cluster)` once the cluster is up; `await side.stop()` at the end."""

    def __init__(self, kubeconfig: str, log_path: str = "demo-agents.log") -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.root = Path(tempfile.mkdtemp(prefix="gpuops-dp-", dir="/tmp"))  # unix socket paths stay short
        self.webhook_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log: BinaryIO | None = None

    @staticmethod
    def mig_machines(cluster: SimCluster) -> dict[str, tuple[str, int]]:
        return {m.name: (m.gpu_model, m.gpus) for m in cluster.fleet.machines.values()
                if m.gpu_model and m.gpus and gpus.model(m.gpu_model).mig_capable
                and m.labels.get("nvidia.com/mig.config") != "all-disabled"}

    def operator_args(self) -> list[str]:
        return ["--mig-webhook-port", str(self.webhook_port), "--mig-webhook-host", "127.0.0.1"]

    async def start(self, cluster: SimCluster) -> None:
        machines = self.mig_machines(cluster)
        if not machines:
            return
        cluster.server.service_endpoints[WEBHOOK_SERVICE] = f"127.0.0.1:{self.webhook_port}"
        if WEBHOOK_CONFIG.exists():
            body: dict[str, Any] = yaml.safe_load(WEBHOOK_CONFIG.read_text())
            with contextlib.suppress(Exception):  # already there from an earlier run of a restored cluster
                await cluster.access.create_object(body)
        self._spawn(machines)

    def _spawn(self, machines: dict[str, tuple[str, int]]) -> None:
        """Start the agents (Popen returns at once; they connect on their own)."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        for name, (model, count) in sorted(machines.items()):
            cmd = [*_gpuops(), "agent", "--kubeconfig", self.kubeconfig, "--node-name", name, "--emulated",
                   "--gpus", f"{model}:{count}", "--device-plugin-dir", str(self.root / name),
                   "--state-file", str(self.root / f"{name}.gpus.json"), "--metrics-bind-address", "0",
                   "--health-probe-bind-address", "0", "--log-format", "json"]
            (self.root / name).mkdir(exist_ok=True)
            self.procs[name] = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    async def webhook_ready(self, cluster: SimCluster, within: float = 30.0) -> bool:
        """Wait until the operator's webhook accepts connections and its CA is in the configuration's caBundle,
        so the first MIG pods are not refused."""
        if not self.procs:
            return True
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            config = cluster.access.get(WEBHOOKS, "", WEBHOOK_NAME) or {}
            patched = all((h.get("clientConfig") or {}).get("caBundle") for h in config.get("webhooks") or [{}])
            if patched:
                try:
                    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.webhook_port), 1.0)
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
                    return True
                except (OSError, TimeoutError):
                    pass
            await asyncio.sleep(0.2)
        return False

    async def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                await asyncio.to_thread(p.wait, 15)
            except subprocess.TimeoutExpired:
                p.kill()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
