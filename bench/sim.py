"""The emulated cluster at scale: 5,000 GPU nodes and 100,000 pods in one process.

Our scale benchmarks stand on the simulator, so it must carry them: 5,000 nodes and 100,000 pods with at
most 4 GiB of memory, and at least 500 pod phase transitions per second. Everything runs in one
process on one event loop, as `gpuops sim up` does: API server, kubelets (Lease heartbeats included),
scheduler, node lifecycle and Job controllers, and the emulator's own garbage collectors. An HTTP watcher
of all pods in a second process stands in for an operator, so the emulator also serves the watch stream.

Phases: boot (every node registers, heartbeats and gets its GPUs allocatable), load (100,000 one-GPU pods
created through the API, 40,000 fit at once), churn (pods finish after 5-15 s and pending ones take their
GPUs: demand outruns the simulator, so the rate measured is its capacity). Reported: node registration
time, pod creation rate, the sustained phase transition rate over the churn window, scheduler binds/s,
peak RSS, and the watcher's event rate.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results

from gpuops import logs
from gpuops.kube.gctune import tune_for_large_heaps
from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import Scenario, load

GIB = 1 << 30
# Watch history kept by the emulator (events, all resources; the `scale` scenario's apiserver.historySize).
# At 5,000 nodes the Lease renewals alone make 500 events/s, so 100,000 (the default) would hold 3 minutes
# of history and most of the 4 GiB; 30,000 still lets a watcher resume after a minute's break
# (kube-apiserver's own watch cache is far smaller).
HISTORY = 30_000


def scenario(nodes: int, lease_seconds: float) -> Scenario:
    """The shipped `scale` scenario, resized for --quick and with the Lease interval asked for."""
    sc = load("scale")
    group = msgspec.structs.replace(sc.node_groups[0], count=nodes)
    return msgspec.structs.replace(sc, node_groups=[group],
                                   kubelet=msgspec.structs.replace(sc.kubelet, lease_seconds=lease_seconds))


def pod(i: int, runtime: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"job-{i:06d}", "labels": {"app": "bench", "team": f"team-{i % 20}"},
                     "annotations": {"sim.gpuops.io/runtime-seconds": f"{runtime:.1f}"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                            "resources": {"requests": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": "1"},
                                          "limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def watcher(url: str, token: str, out: Any, stop_after: float) -> None:
    """A pods watcher over HTTP in its own process: counts events for `stop_after` seconds."""
    import aiohttp

    async def go() -> None:
        n = 0
        t0 = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(
            f"{url}/api/v1/pods", params={"watch": "true", "allowWatchBookmarks": "true"},
            headers={"Authorization": f"Bearer {token}"},
        ) as resp:
            buf = b""
            try:
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    n += len(lines)
                    if time.monotonic() - t0 >= stop_after:
                        break
            except aiohttp.ClientError:
                pass  # the cluster stopped first: count what arrived
        out.put((n, time.monotonic() - t0))

    asyncio.run(go())


async def run(nodes: int, pods: int, churn_seconds: float, lease_seconds: float,
              runtime: tuple[float, float]) -> dict[str, Any]:
    import random

    rng = random.Random(5)
    cluster = SimCluster(scenario(nodes, lease_seconds), workload=False, faults=False)
    t0 = time.monotonic()
    await cluster.start()
    ok = await cluster.wait_ready(within=600)
    # GPUs allocatable on every node (the device plugin delay is 0, but registration is asynchronous)
    while time.monotonic() - t0 < 600 and cluster.summary()["gpus_total"] < nodes * 8:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    boot = time.monotonic() - t0
    assert ok, "nodes did not become Ready"
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    watch_seconds = churn_seconds + 5
    proc = ctx.Process(target=watcher, args=(cluster.server.url, cluster.server.admin_token, q, watch_seconds))
    proc.start()
    await asyncio.sleep(1.0)  # let the watcher connect before the load starts (its count starts then too)

    # load: create every pod through the API (the scheduler and kubelets run meanwhile)
    t1 = time.monotonic()
    for i in range(pods):
        await cluster.access.create(PODS, "bench", pod(i, rng.uniform(*runtime)))
        if i % 200 == 199:
            await asyncio.sleep(0)
    load = time.monotonic() - t1
    created_rate = pods / load

    # churn: count kubelet phase transitions and scheduler binds over a fixed window
    k0, b0, c0 = cluster.kubelets.transitions, cluster.scheduler.bound, time.monotonic()
    samples = []
    while time.monotonic() - c0 < churn_seconds:
        await asyncio.sleep(5)
        samples.append((time.monotonic() - c0, cluster.kubelets.transitions - k0, rss_bytes()))
    window = time.monotonic() - c0
    transitions = cluster.kubelets.transitions - k0
    binds = cluster.scheduler.bound - b0
    summary = cluster.summary()
    nodes_ready = sum(1 for n in summary["nodes"] if n["ready"])
    rss_end = rss_bytes()
    await cluster.stop()
    watched, watched_for = q.get(timeout=120)
    proc.join(30)
    return {
        "boot_seconds": boot,
        "nodes_ready": nodes_ready,
        "pods_created_per_s": created_rate,
        "load_seconds": load,
        "churn_window_seconds": window,
        "transitions": transitions,
        "transitions_per_s": transitions / window,
        "binds_per_s": binds / window,
        "pods_by_phase_end": summary["pods"],
        "rss_end_bytes": rss_end,
        "peak_rss_bytes": peak_rss_bytes(),
        "watch_events": watched,
        "watch_events_per_s": watched / watched_for,
        "samples": samples,
        "total_transitions": cluster.kubelets.transitions,
        "loop_errors": {c.name: c.errors for c in (cluster.kubelets, cluster.scheduler, cluster.node_lifecycle,
                                                    cluster.jobs)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run for CI (< 1 minute)")
    parser.add_argument("--lease-seconds", type=float, default=10.0, help="kubelet Lease renew interval")
    args = parser.parse_args()
    # Runtimes short enough that finished pods free GPUs faster than the simulator can start new ones, so the
    # rate measured is the simulator's capacity, not the workload's demand.
    nodes, pods, churn, runtime = (300, 6_000, 15.0, (2.0, 6.0)) if args.quick else (5_000, 100_000, 120.0,
                                                                                        (5.0, 15.0))
    logs.configure(json=False, level="WARNING")
    tune_for_large_heaps()
    gc.collect()
    r = asyncio.run(run(nodes, pods, churn, args.lease_seconds, runtime))
    figures = {
        "nodes": nodes,
        "pods": pods,
        "nodes_ready": r["nodes_ready"],
        "node_boot_seconds": round(r["boot_seconds"], 1),
        "pods_created_per_s": round(r["pods_created_per_s"]),
        "phase_transitions_per_s": round(r["transitions_per_s"]),
        "scheduler_binds_per_s": round(r["binds_per_s"]),
        "peak_rss_gib": round(r["peak_rss_bytes"] / GIB, 2),
        "watch_events_per_s": round(r["watch_events_per_s"]),
        "lease_renew_seconds": args.lease_seconds,
        "meets_memory_target_4gib": int(r["peak_rss_bytes"] <= 4 * GIB),
        "meets_transitions_target_500": int(r["transitions_per_s"] >= 500),
    }
    mode = "quick" if args.quick else "full"
    md = f"""# Emulated cluster at scale ({mode} run)

{nodes:,} GPU nodes (8 GPUs each, Lease renewed every {args.lease_seconds:g} s) and {pods:,} one-GPU pods
(runtimes {runtime[0]:g}-{runtime[1]:g} s) in one process: API server, kubelets, scheduler, node lifecycle
and Job controllers, plus an HTTP watcher of all pods in a second process.

| figure | value |
|---|---|
| nodes Ready with GPUs allocatable | {r['nodes_ready']:,} of {nodes:,} after {figures['node_boot_seconds']} s |
| pods created through the API | {figures['pods_created_per_s']:,}/s ({r['load_seconds']:.0f} s for {pods:,}) |
| pod phase transitions (kubelets), churn window of {r['churn_window_seconds']:.0f} s | \
{figures['phase_transitions_per_s']:,}/s |
| scheduler binds in the same window | {figures['scheduler_binds_per_s']:,}/s |
| watch events delivered to the HTTP watcher | {figures['watch_events_per_s']:,}/s |
| peak RSS (watch history: {HISTORY:,} events) | {figures['peak_rss_gib']} GiB |
| pods at the end | {', '.join(f'{k} {v:,}' for k, v in sorted(r['pods_by_phase_end'].items()))} |

Targets: <= 4 GiB: {"met" if figures['meets_memory_target_4gib'] else "NOT met"};
>= 500 phase transitions/s: {"met" if figures['meets_transitions_target_500'] else "NOT met"}.
Command: `python bench/sim.py{" --quick" if args.quick else ""}` (2 cores).
"""
    path = write_results("sim", figures, md, {"mode": mode, "run": r})
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
