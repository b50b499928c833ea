"""What `gpuops run` and `gpuops agent` serve on /metrics, scraped from the real entrypoints in subprocesses (a
fresh interpreter each, so import order is the one a pod has): no `_created` series next to our counters and
histograms."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import NotYet, wait_until

ROOT = Path(__file__).resolve().parents[1]
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


def _counted(text: str) -> bool:
    """True once a counter has a sample (a labelled counter has none until its first increment)."""
    return any(line.split("{", 1)[0].endswith("_total") for line in text.splitlines() if not line.startswith("#"))


@pytest.fixture
def crds(apiserver: Any) -> Any:
    """Our CRDs in the emulated API server, as `kubectl apply -k manifests` puts them first."""
    subprocess.run([KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "apply", "-f", str(ROOT / "manifests/crds")],
                   check=True, capture_output=True, timeout=60)
    return apiserver


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.communicate()


def _start(procs: list[subprocess.Popen[bytes]], *args: str) -> int:
    port = _free_port()
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "gpuops", *args, "--metrics-bind-address", f"127.0.0.1:{port}",
         "--health-probe-bind-address", "0", "--log-format", "json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ))
    return port


def _scrape_once_counting(port: int, proc: subprocess.Popen[bytes], within: float = 30.0) -> str:
    def counting() -> str | NotYet:
        assert proc.poll() is None, proc.communicate()[0].decode()
        text = _scrape(port)
        return text if _counted(text) else NotYet(text)

    return wait_until(f"a counter sample on :{port}/metrics", counting, within, every=0.1)


def test_operator_and_agent_export_no_created_series(
    crds: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    kubeconfig = str(crds.kubeconfig)
    operator = _start(processes, "run", "--kubeconfig", kubeconfig, "--mig-webhook-port", "0")
    (tmp_path / "plugins").mkdir()
    agent = _start(processes, "agent", "--kubeconfig", kubeconfig, "--node-name", "mig-0", "--emulated",
                   "--device-plugin-dir", str(tmp_path / "plugins"), "--state-file", str(tmp_path / "gpus.json"))
    created = {}
    for name, port, proc in (("gpuops run", operator, processes[0]), ("gpuops agent", agent, processes[1])):
        text = _scrape_once_counting(port, proc)
        created[name] = [line for line in text.splitlines() if "_created" in line.split("{", 1)[0]][:4]
    assert created == {"gpuops run": [], "gpuops agent": []}
