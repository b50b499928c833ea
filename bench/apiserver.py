"""Emulator throughput: watch fan-out to concurrent watchers, paged lists of 100,000 pods, and the CPU cost of
object updates.

The emulator is what our scale benchmarks stand on, so it must not be the bottleneck: at least 20,000
watch events/s to each of 4 concurrent watchers, and listing 100,000 pods in pages of 500.

Readers run in separate processes over real HTTP on loopback and check what they receive (every event
arrives once, in resourceVersion order). Side by side in the same run: 1 watcher vs 4 watchers (fan-out
cost) and one unpaged list vs pages of 500 (paging cost).

Write cost (bench/_writes.py): the emulator's CPU seconds per 1,000 object updates under the pod lifecycle that
bench/scale.py's churn drives (client creates, scheduler binds, kubelet status writes, budget status patches,
deletes), with its kubelets and scheduler in-process. `--writes-only` runs that part alone (results in
apiserver_writes.json) and `--profile FILE` dumps a cProfile of its window.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LoopThread, write_results
from _writes import run as writes_run

from gpuops import logs
from gpuops.kube.gctune import tune_for_large_heaps
from gpuops_sim.apiserver import APIServer

PODS = ("", "pods")


def make_pod(i: int, ns: str = "bench") -> dict[str, Any]:
    """A pod of realistic size (~1.5 KiB encoded): labels, a GPU request, status with conditions."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"trainer-{i:07d}",
            "namespace": ns,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": "2026-11-21T00:00:00Z",
            "labels": {"app": "trainer", "team": f"team-{i % 50}", "gpuops.io/budget": f"b-{i % 1000}"},
            "annotations": {"sim.gpuops.io/runtime-seconds": "3600"},
        },
        "spec": {
            "nodeName": f"gpu-node-{i % 5000:05d}",
            "schedulerName": "default-scheduler",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "train",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"},
                              "requests": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}},
            }],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "startTime": "2026-11-21T00:00:05Z",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-11-21T00:00:05Z"}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": "train", "ready": True, "restartCount": 0,
                                   "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                   "state": {"running": {"startedAt": "2026-11-21T00:00:05Z"}}}],
        },
    }


# ------------------------------------------------------------------------------------------ watch


def _reader(url: str, token: str, rv: int, expected: int, out: Any) -> None:
    """One watcher process: count and check events until `expected` arrived."""

    async def run() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        timeout = aiohttp.ClientTimeout(total=600, sock_read=60)
        got = 0
        last_rv = rv
        in_order = True
        first = 0.0
        buf = b""
        params = {"watch": "1", "resourceVersion": str(rv)}
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
            f"{url}/api/v1/pods", headers=headers, params=params
        ) as resp:
            assert resp.status == 200, resp.status
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.time()
                buf += chunk
                lines = buf.split(b"\n")
                buf = lines.pop()
                for line in lines:
                    # Decode the metadata only: what an informer needs to order and key the event.
                    ev = msgspec.json.decode(line, type=_Event)
                    r = int(ev.object.metadata.resourceVersion)
                    if r <= last_rv:
                        in_order = False
                    last_rv = r
                    got += 1
                if got >= expected:
                    break
        return {"events": got, "in_order": in_order, "first": first, "done": time.time()}

    out.put(asyncio.run(run()))


class _Meta(msgspec.Struct):
    resourceVersion: str


class _Obj(msgspec.Struct):
    metadata: _Meta


class _Event(msgspec.Struct):
    type: str
    object: _Obj


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _List(msgspec.Struct):
    metadata: _ListMeta
    items: list[_Obj]


async def _generate(server: APIServer, n: int, start: int) -> float:
    """Write n pod updates straight into the store, yielding to the loop so streams keep flowing."""
    store = server.store
    pods = [make_pod(i) for i in range(200)]
    t0 = time.time()
    for i in range(n):
        p = dict(pods[i % 200])
        p["metadata"] = dict(p["metadata"], labels=dict(p["metadata"]["labels"], seq=str(start + i)))
        store.put(PODS, p)
        if i % 256 == 255:
            await asyncio.sleep(0)
    return t0


def watch_run(lt: LoopThread, server: APIServer, watchers: int, events: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    rv0 = server.store.rv
    procs = [ctx.Process(target=_reader, args=(server.url, server.admin_token, rv0, events, q))
             for _ in range(watchers)]
    for p in procs:
        p.start()

    async def wait_watchers() -> None:
        deadline = time.monotonic() + 60
        while len(server.store.all_watchers()) < watchers:
            if time.monotonic() > deadline:
                raise TimeoutError("watchers did not connect")
            await asyncio.sleep(0.05)

    lt.call(wait_watchers())
    t0 = lt.call(_generate(server, events, rv0))
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    per = [r["events"] / max(1e-9, r["done"] - t0) for r in results]
    return {
        "watchers": watchers,
        "events": events,
        "per_watcher_events_per_s": per,
        "min_per_watcher_events_per_s": min(per),
        "all_received": all(r["events"] == events for r in results),
        "in_order": all(r["in_order"] for r in results),
    }


# ------------------------------------------------------------------------------------------ list


async def _list_all(url: str, token: str, limit: int) -> tuple[int, int, float]:
    headers = {"Authorization": f"Bearer {token}"}
    items = pages = 0
    cont = ""
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        while True:
            params = {"limit": str(limit)} if limit else {}
            if cont:
                params["continue"] = cont
            async with session.get(f"{url}/api/v1/pods", headers=headers, params=params) as resp:
                assert resp.status == 200, resp.status
                # Typed projection, as our informers decode: metadata of each item, the list's continue token.
                body = msgspec.json.decode(await resp.read(), type=_List)
            items += len(body.items)
            pages += 1
            cont = body.metadata.continue_
            if not cont:
                break
    return items, pages, time.perf_counter() - t0


def list_run(lt: LoopThread, server: APIServer, n: int) -> dict[str, Any]:
    async def fill() -> None:
        for i in range(n):
            server.store.put(PODS, make_pod(i, ns=f"team-{i % 50}"))
            if i % 5000 == 4999:
                await asyncio.sleep(0)

    lt.call(fill())
    paged_items, pages, paged_s = asyncio.run(_list_all(server.url, server.admin_token, 500))
    full_items, _, full_s = asyncio.run(_list_all(server.url, server.admin_token, 0))
    return {
        "pods": n,
        "paged_items": paged_items,
        "pages": pages,
        "paged_seconds": paged_s,
        "paged_items_per_s": paged_items / paged_s,
        "unpaged_seconds": full_s,
        "unpaged_items": full_items,
    }


def writes_figures(w: dict[str, Any]) -> dict[str, Any]:
    return {
        "writes_pods": w["pods"],
        "writes_object_updates": w["object_updates"],
        "writes_cpu_seconds": w["cpu_seconds"],
        "writes_cpu_share": w["cpu_share"],
        "writes_cpu_s_per_1000_updates": w["cpu_s_per_1000_updates"],
    }


def writes_md(w: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k} {v:,}" for k, v in w["updates_by_kind"].items())
    return f"""## Write cost

{w['pods']:,} pods through their lifecycle at {w['rate']:g} creates/s on a 100-node emulated cluster (its kubelets,
scheduler and Leases in-process), each completion written into its budget's status, then the pod deleted:
{w['object_updates']:,} object updates in {w['wall_seconds']} s ({kinds}).

| figure | value |
|---|---|
| emulator CPU seconds | {w['cpu_seconds']} ({w['cpu_share']} of a core) |
| **CPU seconds per 1,000 object updates** | **{w['cpu_s_per_1000_updates']}** |
"""


def throughput(quick: bool) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Watch fan-out and paged lists: figures, Markdown rows, raw results."""
    events = 20_000 if quick else 200_000
    pods = 10_000 if quick else 100_000
    lt = LoopThread()
    server = APIServer(history_size=max(events * 2, 100_000), watcher_buffer=events * 2)
    lt.call(server.start())
    try:
        one = watch_run(lt, server, 1, events)
        four = watch_run(lt, server, 4, events)
        server.store.compact()
        lst = list_run(lt, server, pods)
    finally:
        lt.call(server.stop())
        lt.close()
    figures = {
        "watch_events": events,
        "watch_1_watcher_events_per_s": round(one["min_per_watcher_events_per_s"]),
        "watch_4_watchers_min_events_per_s_each": round(four["min_per_watcher_events_per_s"]),
        "watch_4_watchers_aggregate_events_per_s": round(sum(four["per_watcher_events_per_s"])),
        "watch_fanout_ratio_4_vs_1": round(
            four["min_per_watcher_events_per_s"] / one["min_per_watcher_events_per_s"], 3
        ),
        "watch_all_events_received_in_order": int(four["all_received"] and four["in_order"] and one["all_received"]),
        "list_pods": pods,
        "list_pages_of_500": lst["pages"],
        "list_paged_seconds": round(lst["paged_seconds"], 3),
        "list_paged_pods_per_s": round(lst["paged_items_per_s"]),
        "list_unpaged_seconds": round(lst["unpaged_seconds"], 3),
        "list_paged_vs_unpaged_time_ratio": round(lst["paged_seconds"] / lst["unpaged_seconds"], 3),
        "target_watch_events_per_s_each": 20_000,
        "meets_watch_target": int(four["min_per_watcher_events_per_s"] >= 20_000),
    }
    md = f"""# Emulator throughput ({"quick" if quick else "full"} run)

Server: `gpuops_sim.apiserver` in-process on one event loop; readers: separate processes over HTTP on
loopback, decoding each event's metadata and checking resourceVersion order. Pods are ~1.5 KiB each.
The benchmark process raises CPython's GC thresholds as `gpuops sim apiserver` does (see gctune.py).

| figure | value |
|---|---|
| watch events per run | {events:,} |
| 1 watcher: events/s | {figures['watch_1_watcher_events_per_s']:,} |
| 4 watchers: slowest watcher events/s | {figures['watch_4_watchers_min_events_per_s_each']:,} |
| 4 watchers: aggregate events/s | {figures['watch_4_watchers_aggregate_events_per_s']:,} |
| fan-out ratio (4 vs 1, per watcher) | {figures['watch_fanout_ratio_4_vs_1']} |
| every event received once, in order | {"yes" if figures['watch_all_events_received_in_order'] else "NO"} |
| list {pods:,} pods in pages of 500 | {figures['list_paged_seconds']} s ({lst['pages']} pages, \
{figures['list_paged_pods_per_s']:,} pods/s) |
| same list unpaged (one request) | {figures['list_unpaged_seconds']} s |
| paged / unpaged time | {figures['list_paged_vs_unpaged_time_ratio']} |

Target: >= 20,000 events/s to each of 4 watchers: {"met" if figures['meets_watch_target'] else "NOT met"}.
"""
    return figures, md, {"watch": {"one": one, "four": four}, "list": lst}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run for CI (< 1 minute)")
    parser.add_argument("--writes-only", action="store_true", help="only the write-cost part")
    parser.add_argument("--profile", metavar="FILE", default=None, help="cProfile dump of the write-cost window")
    args = parser.parse_args()
    tune_for_large_heaps()  # as `gpuops sim apiserver` does: the emulator shares this process
    logs.configure(json=False, level="WARNING")
    mode = "quick" if args.quick or args.profile else "full"
    figures: dict[str, Any] = {}
    md = f"# Emulator write cost ({mode} run)\n" if args.writes_only else ""
    extra: dict[str, Any] = {"mode": mode}
    if not args.writes_only:
        figures, md, extra_tp = throughput(args.quick)
        extra.update(extra_tp)
    w = asyncio.run(writes_run(1_000 if args.quick else 3_000, profile=args.profile))
    figures.update(writes_figures(w))
    extra["writes"] = w
    flags = (" --quick" if args.quick else "") + (" --writes-only" if args.writes_only else "")
    md += "\n" + writes_md(w) + f"\nCommand: `python bench/apiserver.py{flags}` (2 cores, shared).\n"
    path = write_results("apiserver_writes" if args.writes_only else "apiserver", figures, md, extra)
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
