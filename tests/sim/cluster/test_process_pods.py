"""Pods of the gpuops image run as real processes in the emulated cluster (`SimCluster(run_pods=True)`): their
exit codes become the pod's phase, `kubectl logs` reads what they wrote, a spec that cannot run waits in
CreateContainerConfigError, readiness probes gate the Ready condition, and each pod has an address of its own
behind its Service's cluster DNS name."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from waiting import until_holds

from gpuops_sim.cluster.access import PODS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.network import SHIM_DIR
from gpuops_sim.scenario import parse

NS = "default"
IMAGE = "ghcr.io/gpuops/gpuops:test"
SCENARIO = {
    "name": "process-pods",
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.5, "nodeStatusSeconds": 5},
    "nodeGroups": [{"name": "cpu", "count": 1, "bootSeconds": 0.05, "devicePluginSeconds": 0}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(parse(SCENARIO), workload=False, run_pods=True) as cluster:
        await until_holds("the node", lambda: cluster.access.get(("", "nodes"), "", "cpu-0"), 10)
        yield cluster


def _pod(name: str, args: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": IMAGE, "args": args, **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def _status(sim: SimCluster, name: str) -> dict[str, Any]:
    return (sim.access.get(PODS, NS, name) or {}).get("status") or {}


async def _log(sim: SimCluster, name: str) -> str:
    headers = {"Authorization": f"Bearer {sim.server.admin_token}"}
    async with aiohttp.ClientSession() as http, http.get(
            f"{sim.server.url}/api/v1/namespaces/{NS}/pods/{name}/log", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


@pytest.mark.anyio
async def test_exit_codes_become_phases_and_logs_are_what_the_process_wrote(sim: SimCluster) -> None:
    await sim.access.create_object(_pod("plan", ["mig", "plan", "--gpu", "A100-40GB", "3g.20gb"]))
    await sim.access.create_object(_pod("bad", ["mig", "plan", "3g.20gb"]))  # no --gpu: exits 2
    await until_holds("plan succeeds", lambda: _status(sim, "plan").get("phase") == "Succeeded", 60)
    await until_holds("bad fails", lambda: _status(sim, "bad").get("phase") == "Failed", 60)
    terminated = _status(sim, "bad")["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (2, "Error")
    assert json.loads(await _log(sim, "plan")) == [{"profile": "3g.20gb", "start": 4, "size": 4}]
    assert "--gpu" in await _log(sim, "bad")


@pytest.mark.anyio
async def test_a_spec_that_cannot_run_waits_with_the_reason(sim: SimCluster) -> None:
    env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "x"}}}]
    await sim.access.create_object(_pod("unconfigured", ["--version"], container={"env": env}))

    def waiting() -> dict[str, Any] | None:
        for c in _status(sim, "unconfigured").get("containerStatuses") or []:
            return (c.get("state") or {}).get("waiting")
        return None

    await until_holds("the config error", lambda: (waiting() or {}).get("reason") == "CreateContainerConfigError", 30)
    assert 'configmap "missing" not found' in (waiting() or {}).get("message", "")


def _server(name: str) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1}
    return _pod(name, ["sim", "apiserver", "--host", "0.0.0.0", "--port", "8080"], restartPolicy="Always",
                container={"ports": [{"name": "http", "containerPort": 8080}], "readinessProbe": probe})


def _ready(sim: SimCluster, name: str) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _status(sim, name).get("conditions")
               or [])


@pytest.mark.anyio
async def test_two_pods_listen_on_one_port_and_a_service_name_reaches_them(sim: SimCluster) -> None:
    for name in ("api-a", "api-b"):
        body = _server(name)
        body["metadata"]["labels"] = {"app": "api"}
        await sim.access.create_object(body)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": NS},
               "spec": {"selector": {"app": "api"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]}}
    await sim.access.create_object(service)
    await until_holds("both servers ready", lambda: _ready(sim, "api-a") and _ready(sim, "api-b"), 60)
    assert _status(sim, "api-a")["podIP"] != _status(sim, "api-b")["podIP"]
    assert sim.network is not None
    await until_holds("both routed", lambda: len(sim.network.table["services"].get(
        f"{sim.access.get(('', 'services'), NS, 'api')['spec']['clusterIP']}:80", [])) == 2, 30)
    client = ("import urllib.request; print(urllib.request.urlopen('http://api/readyz', timeout=5).status);"
              "print(urllib.request.urlopen('http://api.default.svc.cluster.local/healthz', timeout=5).status)")
    env = {**os.environ, "PYTHONPATH": str(SHIM_DIR), "GPUOPS_SIM_POD_ADDRESS": "127.0.0.1",
           "GPUOPS_SIM_NETWORK": str(sim.network.table_path), "GPUOPS_SIM_POD_NAMESPACE": NS}
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", client], env=env, capture_output=True,
                                   text=True, timeout=30, check=False)
    assert done.stdout.split() == ["200", "200"], done.stderr
    unknown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", "import socket; socket.getaddrinfo('nope.default.svc', 80)"],
        env=env, capture_output=True, text=True, timeout=30, check=False)
    assert unknown.returncode != 0 and "gaierror" in unknown.stderr


@pytest.mark.anyio
async def test_paths_under_mounts_are_rewritten_but_never_the_entrypoint(sim: SimCluster, tmp_path: Any) -> None:
    assert sim.runtime is not None
    sim.runtime.entrypoint = ["/tmp/venv/bin/gpuops"]  # an install under /tmp, where the pod mounts an emptyDir
    pod = _pod("paths", ["run", "--cert-dir=/tmp/certs"], volumes=[{"name": "tmp", "emptyDir": {}}],
               container={"volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]})
    pod["metadata"]["uid"] = "u-paths"
    argv, env = sim.runtime.prepare(pod, pod["spec"]["containers"][0], "cpu-0", {})
    assert argv[0] == "/tmp/venv/bin/gpuops"
    assert argv[2].startswith("--cert-dir=") and argv[2].endswith("/volumes/tmp/certs") and argv[2] != \
        "--cert-dir=/tmp/certs"
    assert env["TMPDIR"].endswith("/volumes/tmp")
