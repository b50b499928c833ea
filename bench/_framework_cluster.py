"""The cluster state and the churn of bench/framework_vs_kopf.py: the same for every framework it runs.

State: `pods` realistic pods (bench/informer.py's, managedFields included) spread evenly over 20 namespaces, each
namespace with one GPUPodCount (no status). Of each namespace's pods, 60% are Running GPU pods (the ones counted),
10% Pending GPU pods, 15% Succeeded GPU pods and 15% Running CPU-only pods. The pods carry no ownerReferences and
no Job finalizer: no Job exists in the emulator, whose garbage collector would delete them.

Churn: a fixed list of pod operations, drawn with a fixed seed from that state, round-robin over the namespaces:
creates (Pending), status phase changes (the status subresource) and deletes (grace period 0, gone at once), each
one pod watch event. In even namespaces the counted number only rises (Pending -> Running of a GPU pod), in odd
ones it only falls (a Running GPU pod finishes or is deleted); the other operations change no count. Since every
namespace's count is monotonic, a status showing count c resolves every operation of that namespace whose count
after it is c or before it on the ramp: that is how a change is matched to the status write that shows it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import LoopThread
from _framework_spec import CRD, GPU, count_object
from informer import _create_ns, realistic_pod

from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.auth import UserInfo
from gpuops_sim.apiserver.objects import WriteContext

NAMESPACES = tuple(f"team-{i:02d}" for i in range(20))
PODS_GR = ("", "pods")
# What each namespace's pods are, by index modulo 20: (GPU?, phase).
_MIX = [(True, "Running")] * 12 + [(True, "Pending")] * 2 + [(True, "Succeeded")] * 3 + [(False, "Running")] * 3


def bench_pod(i: int, namespace: str, gpu: bool, phase: str, name: str | None = None) -> dict[str, Any]:
    """bench/informer.py's realistic pod, without the Job references, as a GPU or CPU-only pod in `phase`."""
    pod = realistic_pod(i, namespace)
    meta = pod["metadata"]
    del meta["ownerReferences"], meta["finalizers"]
    if name:
        meta["name"] = name
    if not gpu:
        container = pod["spec"]["containers"][0]
        for part in ("requests", "limits"):
            del container["resources"][part][GPU]
        pod["spec"]["tolerations"] = pod["spec"]["tolerations"][1:]
    status = pod["status"]
    if phase == "Pending":
        pod["status"] = {"phase": "Pending", "qosClass": status["qosClass"]}
    else:
        status["phase"] = phase
    return pod


@dataclass
class Pools:
    """The pod names of one namespace by (GPU?, phase), as the churn plan goes along."""

    by_kind: dict[tuple[bool, str], list[str]] = field(default_factory=dict)

    def add(self, gpu: bool, phase: str, name: str) -> None:
        self.by_kind.setdefault((gpu, phase), []).append(name)

    def take(self, rng: random.Random, gpu: bool, phase: str) -> str | None:
        names = self.by_kind.get((gpu, phase)) or []
        if not names:
            return None
        i = rng.randrange(len(names))
        names[i], names[-1] = names[-1], names[i]
        return names.pop()

    def counted(self) -> int:
        return len(self.by_kind.get((True, "Running"), ()))


@dataclass
class State:
    pods: int
    pools: dict[str, Pools]

    def truth(self) -> dict[str, int]:
        return {ns: p.counted() for ns, p in self.pools.items()}


def initial_state(pods: int) -> State:
    per_ns = pods // len(NAMESPACES)
    pools = {ns: Pools() for ns in NAMESPACES}
    for n, ns in enumerate(NAMESPACES):
        for j in range(per_ns):
            gpu, phase = _MIX[j % len(_MIX)]
            pools[ns].add(gpu, phase, f"train-{n * per_ns + j:07d}")
    return State(per_ns * len(NAMESPACES), pools)


def build_snapshot(path: Path, pods: int) -> State:
    """The state of `pods` pods, saved where `gpuops sim apiserver --restore` reads it."""
    state = initial_state(pods)
    lt = LoopThread()
    server = APIServer()
    lt.call(server.start())
    lt.call(server.controllers.stop())  # nothing may change the state before a framework sees it
    try:
        lt.call(_create_ns(server, list(NAMESPACES)))
        lt.call(_install_crd(server))
        lt.call(_fill(server, state))
        server.save(path)
    finally:
        lt.call(server.stop())
        lt.close()
    return state


async def _install_crd(server: APIServer) -> None:
    ctx = WriteContext(UserInfo("bench", groups=("system:masters",)), field_manager="bench")
    crds = server.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    assert crds is not None
    await server.api.create(crds, "", CRD, ctx)
    spec = CRD["spec"]
    info = server.registry.lookup(spec["group"], spec["versions"][0]["name"], spec["names"]["plural"])
    assert info is not None, "the emulator did not serve the bench's CRD"
    for ns in NAMESPACES:
        await server.api.create(info, ns, count_object(ns), ctx)


async def _fill(server: APIServer, state: State) -> None:
    for n, ns in enumerate(NAMESPACES):
        for (gpu, phase), names in state.pools[ns].by_kind.items():
            for name in names:
                i = int(name.rpartition("-")[2])
                server.store.put(PODS_GR, bench_pod(i, ns, gpu, phase))
        if n % 2:
            await asyncio.sleep(0)


# ---------------------------------------------------------------------------------------------- churn


@dataclass(frozen=True)
class Op:
    """One pod operation: `kind` create | phase | delete; `phase` the new phase of a phase change; `delta` what
    it does to the namespace's count, `count` the count after it."""

    kind: str
    namespace: str
    name: str
    gpu: bool
    phase: str
    delta: int
    count: int


# (weight, kind, GPU?, from phase, to phase, delta) per ramp direction; "" from: a create.
_RISING = [(3, "phase", True, "Pending", "Running", 1), (2, "create", True, "", "Pending", 0),
           (1, "create", False, "", "Pending", 0), (1, "phase", False, "Pending", "Running", 0),
           (1, "delete", True, "Succeeded", "", 0), (1, "phase", False, "Running", "Succeeded", 0)]
_FALLING = [(2, "phase", True, "Running", "Succeeded", -1), (1, "delete", True, "Running", "", -1),
            (1, "create", True, "", "Pending", 0), (1, "delete", True, "Succeeded", "", 0),
            (1, "create", False, "", "Pending", 0), (1, "delete", False, "Running", "", 0)]


def plan_churn(state: State, ops: int, seed: int) -> list[Op]:
    """`ops` operations on a copy of `state`'s pools, round-robin over the namespaces."""
    rng = random.Random(seed)
    pools = {ns: Pools({k: list(v) for k, v in p.by_kind.items()}) for ns, p in state.pools.items()}
    counts = state.truth()
    plan: list[Op] = []
    for k in range(ops):
        ns = NAMESPACES[k % len(NAMESPACES)]
        choices = _RISING if NAMESPACES.index(ns) % 2 == 0 else _FALLING
        while True:
            weight_total = sum(c[0] for c in choices)
            _, kind, gpu, src, dst, delta = _pick(rng, choices, weight_total)
            name = f"churn-{k:06d}" if kind == "create" else pools[ns].take(rng, gpu, src)
            if name is not None:
                break
            choices = [c for c in choices if c[1] == "create" or c[2:4] != (gpu, src)]
        if dst:
            pools[ns].add(gpu, dst, name)
        counts[ns] += delta
        plan.append(Op(kind, ns, name, gpu, dst, delta, counts[ns]))
    return plan


def _pick(rng: random.Random, choices: list[Any], total: int) -> Any:
    x = rng.uniform(0, total)
    for c in choices:
        x -= c[0]
        if x <= 0:
            return c
    return choices[-1]
