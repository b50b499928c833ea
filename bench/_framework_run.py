"""One framework's run in bench/framework_vs_kopf.py: the emulator restored from the size's snapshot, the framework
spawned as its own process, then cold start, churn, CPU, latency and peak memory measured from the bench process.

Clock: every instant is `time.monotonic()` in the bench process. A GPUPodCount's status is seen through a watch
the bench holds (an informer of its own, synced before the framework starts, the same for every framework); a
pod write's instant is when its response came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _framework_cluster import NAMESPACES, Op, bench_pod
from _framework_gpuops import COUNTS, GPUPodCount
from informer import _serve, _warm

from gpuops.kube.client import Client
from gpuops.kube.informer import Informer
from gpuops.kube.resources import PODS
from gpuops_sim.harness import cpu_seconds

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Framework:
    name: str
    argv: list[str]
    cold_cap: float
    """Seconds to wait for a correct status before recording that the framework did not converge."""


@dataclass(frozen=True)
class Churn:
    plan: list[Op]
    rate: float
    """Operations per second."""
    drain: float
    """Seconds after the last operation to wait for its status before counting it unresolved."""


def frameworks(cold_cap: float, index_cap: float) -> list[Framework]:
    py = sys.executable
    kopf = [str(BIN / "kopf"), "run", "--standalone", "--all-namespaces", "--quiet"]
    return [Framework("gpuops", [py, str(BENCH / "_framework_gpuops.py"), "{kubeconfig}"], cold_cap),
            Framework("kopf_events", [*kopf, str(BENCH / "_kopf_events.py")], cold_cap),
            Framework("kopf_index", [*kopf, str(BENCH / "_kopf_index.py")], index_cap)]


def proc_status(pid: int, field: str) -> int:
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS) in bytes; 0 once the process is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------------- observing


class Latency:
    """Matches count-changing pod writes to the first status that shows them (see _framework_cluster.py: each
    namespace's count is monotonic, so a status at or past an operation's count covers it)."""

    def __init__(self) -> None:
        self.pending: dict[str, deque[tuple[float, Op]]] = {ns: deque() for ns in NAMESPACES}
        self.shown: dict[str, int | None] = {}
        self.samples: list[float] = []
        self.last_resolved = 0.0
        self.idle = asyncio.Event()
        """Set while no count change waits for its status."""
        self.idle.set()

    @staticmethod
    def _covers(op: Op, value: int | None) -> bool:
        return value is not None and (value >= op.count if op.delta > 0 else value <= op.count)

    def wrote(self, op: Op, at: float) -> None:
        if op.delta == 0:
            return
        if self._covers(op, self.shown.get(op.namespace)):
            self.samples.append(0.0)  # the status showed it before the write's response came back
            self.last_resolved = at
        else:
            self.pending[op.namespace].append((at, op))
            self.idle.clear()

    def saw(self, namespace: str, value: int | None, at: float) -> None:
        self.shown[namespace] = value
        queue = self.pending.get(namespace)
        while queue and self._covers(queue[0][1], value):
            self.samples.append(at - queue.popleft()[0])
            self.last_resolved = at
        if not queue and not self.unresolved():
            self.idle.set()

    def unresolved(self) -> int:
        return sum(len(q) for q in self.pending.values())


class Watcher:
    """The bench's informer of GPUPodCounts: stamps every status it sees; knows when all show `target`."""

    def __init__(self, client: Client, target: dict[str, int]) -> None:
        self.informer: Informer[GPUPodCount] = Informer(client, COUNTS, name="bench-watcher")
        self.target = target
        self.shown: dict[str, int | None] = {}
        self.correct = asyncio.Event()
        self.correct_at = 0.0
        self.latency: Latency | None = None
        self.informer.add_handler(lambda obj, _initial: self._saw(obj), lambda _old, new: self._saw(new), None)

    def _saw(self, obj: GPUPodCount) -> None:
        at = time.monotonic()
        ns, value = obj.metadata.namespace, obj.status.running
        self.shown[ns] = value
        if self.latency is not None:
            self.latency.saw(ns, value, at)
        if not self.correct.is_set() and all(self.shown.get(n) == v for n, v in self.target.items()):
            self.correct_at = at
            self.correct.set()

    async def start(self) -> None:
        self.informer.start()
        if not await self.informer.wait_synced(60):
            raise RuntimeError("the bench's own GPUPodCount informer did not sync")

    async def stop(self) -> None:
        await self.informer.stop()


# ---------------------------------------------------------------------------------------------- churn


async def apply(client: Client, op: Op) -> None:
    if op.kind == "create":
        pod = bench_pod(int(op.name.rpartition("-")[2]) + 9_000_000, op.namespace, op.gpu, "Pending", op.name)
        del pod["metadata"]["uid"]
        await client.create(PODS, pod, op.namespace)
    elif op.kind == "phase":
        await client.patch(PODS, op.name, {"status": {"phase": op.phase}}, namespace=op.namespace,
                           subresource="status")
    else:
        await client.delete(PODS, op.name, op.namespace, grace_period_seconds=0)


async def run_churn(client: Client, churn: Churn, latency: Latency) -> tuple[float, float]:
    """Every operation at its slot of a fixed-rate schedule (late ones go at once); (first, last) instants."""
    start = time.monotonic()
    for k, op in enumerate(churn.plan):
        delay = start + k / churn.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await apply(client, op)
        latency.wrote(op, time.monotonic())
    return start, time.monotonic()


async def count_pod_events(client: Client, resource_version: str, counter: list[int]) -> None:
    """Every pod watch event after `resource_version` (the churn's own: nothing else writes pods)."""
    query = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "false"}
    async with client.stream_lines(PODS.path(), query, read_timeout=0) as lines:
        async for _line in lines:
            counter[0] += 1


# ---------------------------------------------------------------------------------------------- one run


def run_one(fw: Framework, snapshot: Path, target: dict[str, int], churn: Churn) -> dict[str, Any]:
    """The emulator from `snapshot` in its own process, then `fw` against it; the emulator is stopped after."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{fw.name}-") as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        emulator = _serve(snapshot, kubeconfig)
        try:
            asyncio.run(_warm(kubeconfig, list(NAMESPACES)))
            return asyncio.run(_measure(fw, kubeconfig, Path(tmp) / "framework.log", target, churn))
        finally:
            emulator.terminate()
            emulator.wait(60)


async def _measure(fw: Framework, kubeconfig: str, log_path: Path, target: dict[str, int],
                   churn: Churn) -> dict[str, Any]:
    client = await Client.from_kubeconfig(kubeconfig)
    watcher = Watcher(client, target)
    await watcher.start()
    argv = [a.replace("{kubeconfig}", kubeconfig) for a in fw.argv]
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(BENCH)}
    t0, proc = _spawn(argv, env, log_path)
    try:
        out: dict[str, Any] = {"framework": fw.name}
        try:
            await asyncio.wait_for(watcher.correct.wait(), fw.cold_cap)
        except TimeoutError:
            out.update(converged=False, cold_cap_s=fw.cold_cap, peak_rss_mib=_mib(proc_status(proc.pid, "VmHWM")),
                       note=f"did not converge in {fw.cold_cap:g} s", shown=watcher.shown)
            return out
        if proc.poll() is not None:
            raise RuntimeError(f"{fw.name} exited: {_tail(log_path)}")
        out.update(converged=True, cold_start_s=round(watcher.correct_at - t0, 3),
                   rss_at_cold_start_mib=_mib(proc_status(proc.pid, "VmRSS")))
        await asyncio.sleep(1.0)  # let the framework settle after its last cold-start write
        out.update(await _churn_window(client, proc.pid, watcher, churn))
        out["peak_rss_mib"] = _mib(proc_status(proc.pid, "VmHWM"))
        if proc.poll() is not None:
            raise RuntimeError(f"{fw.name} exited: {_tail(log_path)}")
        return out
    finally:
        await _stop(proc)
        await watcher.stop()
        await client.close()
        _warn_log(fw.name, log_path)


async def _churn_window(client: Client, pid: int, watcher: Watcher, churn: Churn) -> dict[str, Any]:
    latency = watcher.latency = Latency()
    latency.shown.update(watcher.shown)
    meta, _ = await client.list(PODS, limit=1)
    events = [0]
    counter = asyncio.create_task(count_pod_events(client, meta.resource_version, events))
    cpu0 = cpu_seconds(pid)
    start, end = await run_churn(client, churn, latency)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(latency.idle.wait(), churn.drain)
    await asyncio.sleep(max(0.0, end + 2.0 - time.monotonic()))
    cpu1 = cpu_seconds(pid)
    window = time.monotonic() - start
    counter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await counter
    final = _final_truth(watcher.target, churn)
    wrong = {ns: [watcher.shown.get(ns), v] for ns, v in final.items() if watcher.shown.get(ns) != v}
    samples = sorted(latency.samples)
    return {
        "churn_ops": len(churn.plan), "churn_seconds": round(end - start, 2), "pod_events": events[0],
        "cpu_window_s": round(window, 2), "cpu_s": round(cpu1 - cpu0, 3),
        "cpu_s_per_1000_events": round((cpu1 - cpu0) * 1000 / max(1, events[0]), 4),
        "latency_samples": len(samples), "unresolved": latency.unresolved(),
        "latency_p50_s": _quantile(samples, 0.5), "latency_p99_s": _quantile(samples, 0.99),
        "latency_max_s": round(samples[-1], 4) if samples else None,
        "correct_after_churn": not wrong,
        **({"wrong_after_churn": wrong} if wrong else {}),
    }


def _final_truth(target: dict[str, int], churn: Churn) -> dict[str, int]:
    final = dict(target)
    for op in churn.plan:
        final[op.namespace] = op.count
    return final


def _quantile(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    if len(samples) == 1:
        return round(samples[0], 4)
    return round(statistics.quantiles(samples, n=1000, method="inclusive")[int(q * 1000) - 1], 4)


def _mib(n: int) -> float:
    return round(n / (1 << 20), 1)


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[float, subprocess.Popen[bytes]]:
    """The framework's process, its output to `log_path`; (the instant just before the spawn, the process)."""
    with log_path.open("w") as log:
        t0 = time.monotonic()
        return t0, subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-2000:]


async def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        for _ in range(300):
            if proc.poll() is not None:
                return
            await asyncio.sleep(0.05)
        proc.kill()
        proc.wait(10)


def _warn_log(name: str, log_path: Path) -> None:
    """A framework's warnings and errors, echoed so a run shows what went wrong (both log warnings only)."""
    text = log_path.read_text(errors="replace").strip()
    if text:
        lines = [line[:300] + (" ..." if len(line) > 300 else "") for line in text.splitlines()[-8:]]
        print(f"-- {name} log (last lines):\n" + "\n".join(lines), file=sys.stderr)
