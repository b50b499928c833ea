"""`gpuops sim up`: a scenario's whole emulated cluster in the foreground, until Ctrl-C or `--seconds`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import TextIO

from .cluster.cluster import SimCluster
from .demo import usage
from .scenario import Scenario


def status_line(summary: dict[str, object], elapsed: float) -> str:
    pods = summary["pods"]
    assert isinstance(pods, dict)
    nodes = summary["nodes"]
    assert isinstance(nodes, list)
    ready = sum(1 for n in nodes if n["ready"])
    return (f"[{elapsed:6.0f}s] nodes ready {ready}/{len(nodes)}, GPUs used {summary['gpus_used']}/"
            f"{summary['gpus_total']}, pods " + (", ".join(f"{k} {v}" for k, v in sorted(pods.items())) or "none"))


async def run_up(
    scenario: Scenario,
    *,
    host: str,
    port: int,
    cloud_port: int,
    kubeconfig: str | None,
    tls: bool,
    workload: bool,
    seconds: float | None,
    status_every: float,
    out: TextIO = sys.stdout,
    authorization: str = "AlwaysAllow",
    run_pods: bool = True,
    state_dir: str | None = None,
) -> int:
    """`authorization="RBAC"` enforces Roles, ClusterRoles and their bindings (as `gpuops sim apiserver
    --authorization RBAC`); the kubeconfig's admin token is in system:masters either way. `run_pods`: pods of the
    gpuops image run as processes (see `SimCluster`). The kubeconfig is written once the cluster answers (a
    stale one is removed first, see the CLI), so waiting for the file waits for the cluster."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with SimCluster(scenario, host=host, port=port, cloud_port=cloud_port, workload=workload,
                          tls=tls, authorization=authorization, run_pods=run_pods, state_dir=state_dir) as cluster:
        await cluster.wait_ready(30.0)  # its powered-on machines are Ready nodes before anyone looks
        if kubeconfig:
            cluster.write_kubeconfig(kubeconfig)  # once up: the file's existence says the cluster answers
        print(f"gpuops sim up: scenario {scenario.name}: {scenario.description}", file=out)
        print(f"gpuops sim apiserver listening on {cluster.server.url} (port {cluster.server.port})", file=out)
        print(usage(cluster, kubeconfig), file=out)
        if cluster.state_dir is not None:
            print(f"  pods of the gpuops image run as processes; their files and logs are in {cluster.state_dir}",
                  file=out)
            print(f"  each node's kubelet takes device plugins at {cluster.state_dir / 'dp'}/<node>/kubelet.sock "
                  "(for a hand-started `gpuops agent --device-plugin-dir`)", file=out)
        out.flush()
        start = time.monotonic()
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if seconds is not None and elapsed >= seconds:
                break
            wait = status_every if status_every > 0 else None
            if seconds is not None:
                wait = min(wait or seconds, max(0.0, seconds - elapsed))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if status_every > 0 and not stop.is_set():
                print(status_line(cluster.summary(), time.monotonic() - start), file=out, flush=True)
    return 0
