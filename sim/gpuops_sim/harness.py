"""The operator as users run it, against an emulated cluster: for benchmarks and chaos scenarios.

`OperatorHarness` starts a `SimCluster`, installs CRDs over HTTP (as `kubectl apply` would), and runs
`gpuops run` as a subprocess with /metrics on a free port; it can kill -9 and restart that process, which an
in-process operator cannot show. Figures then come from what a user would see: the API and the scrape.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from .cluster.cluster import SimCluster

__all__ = ["OperatorHarness", "cpu_seconds", "free_port", "metric_value", "now_us", "until"]

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def now_us() -> int:
    """Wall clock in integer microseconds since the epoch (the unit of `gpuops.accounting.gpuhours`)."""
    return time.time_ns() // 1000


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


async def until(what: str, probe: Callable[[], Awaitable[T]], within: float, every: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy; TimeoutError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        got = await probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(every)


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of the first sample of `name` (in Prometheus text format) carrying all of `labels`."""
    want = [f'{k}="{v}"' for k, v in (labels or {}).items()]
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric == name and all(w in head for w in want):
            return float(value)
    return None


class OperatorHarness:
    """An emulated cluster with CRDs installed and `gpuops run --controllers ...` running against it."""

    def __init__(
        self,
        cluster: SimCluster,
        workdir: Path,
        *,
        crds: Sequence[Path] = (),
        controllers: Sequence[str] = ("budget",),
        log_level: str = "WARNING",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.env = dict(env or {})
        """Added to the operator process's environment (e.g. PYTHONTZPATH for a time zone of the test's own)."""
        self.workdir = workdir
        self.kubeconfig = workdir / "kubeconfig"
        self.crds = list(crds)
        self.controllers = list(controllers)
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    async def __aenter__(self) -> OperatorHarness:
        await self.cluster.start()
        self.cluster.write_kubeconfig(self.kubeconfig)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
        for path in self.crds:
            crd = yaml.safe_load(path.read_text())
            await self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            await until(f"CRD {crd['metadata']['name']} served", self._served(crd), 15)
        if not await self.cluster.wait_ready(60):
            raise TimeoutError("the emulated nodes did not become Ready within 60 s")
        await self.start_operator()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_operator()
        if exc[0] is not None and self.log_path.exists():
            print(self.log_path.read_text()[-4000:], file=sys.stderr)
        if self.http is not None:
            await self.http.close()
        await self.cluster.stop()

    # ------------------------------------------------------------------------------------------ the process

    async def start_operator(self) -> None:
        """Spawn `gpuops run` (its log appended to operator.log) and wait until /metrics answers."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the operator is already running; stop or kill it first")
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(  # noqa: ASYNC220 (starts at once; the wait below has a deadline)
                [sys.executable, "-m", "gpuops", "run", "--controllers", ",".join(self.controllers),
                 "--kubeconfig", str(self.kubeconfig), "--metrics-bind-address", f"127.0.0.1:{self.port}",
                 "--health-probe-bind-address", "0", "--log-level", self.log_level, "--log-format", "json",
                 *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **self.env} if self.env else None)
        await until("the operator's /metrics", self._metrics_up, 30)

    def kill(self) -> None:
        """kill -9: no shutdown path runs, as in a node loss or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    async def stop_operator(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), 15)
        except TimeoutError:
            self.kill()

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the operator has not been started")
        return self.proc.pid

    # ------------------------------------------------------------------------------------------ HTTP

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cluster.server.admin_token}"}

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """One API request as the cluster admin; RuntimeError with the Status on a 4xx/5xx."""
        if self.http is None:
            raise RuntimeError("the harness is not started")
        async with self.http.request(method, self.cluster.server.url + path, headers=self.headers,
                                     json=body) as r:
            data = await r.json(content_type=None)
            if r.status >= 400:
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {data}")
            return data

    async def scrape(self) -> tuple[str, int, int]:
        """/metrics text and the wall-clock instants (µs) just before and after the request."""
        if self.http is None:
            raise RuntimeError("the harness is not started")
        before = now_us()
        async with self.http.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            text = await r.text()
        return text, before, now_us()

    def _served(self, crd: dict[str, Any]) -> Callable[[], Awaitable[bool]]:
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"

        async def probe() -> bool:
            try:
                await self.request("GET", path)
            except RuntimeError:
                return False
            return True

        return probe

    async def _metrics_up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"gpuops run exited with {self.proc.returncode}: " + self.log_path.read_text()[-2000:])
        try:
            await self.scrape()
        except aiohttp.ClientError:
            return False
        return True
