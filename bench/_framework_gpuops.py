"""The bench's controller on gpuops' framework (`python bench/_framework_gpuops.py KUBECONFIG`), wired the way
gpuops/controllers/*/setup.py wire theirs: shared informers from a `Manager`, an index, a `Controller` whose
watches map events to keys, a reconcile that reads the caches and patches status.

The pod informer decodes into `GPUPod`, a projection that keeps only what the controller and the informer read
(name, namespace, resourceVersion, the phase, and whether any container asks for a GPU): a controller choosing
its own model through `ResourceType.typed`, as gpuops/kube/objects.py describes.
An index keeps each namespace's counted pods, so a reconcile is one `len()`. Pod events reach the controller only
when they change whether a pod counts (a predicate), and map to the GPUPodCounts of the pod's namespace.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from _framework_spec import GPU, GROUP, KIND, PLURAL, VERSION

from gpuops import logs
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Predicate, Request
from gpuops.kube.gctune import tune_for_large_heaps
from gpuops.kube.informer import INDEX_NAMESPACE, by_namespace
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.objects import ObjectMeta
from gpuops.kube.resources import PODS, ResourceType

INDEX_COUNTED = "gpu-running"


class _Meta(msgspec.Struct, rename="camel", gc=False):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""

    def __post_init__(self) -> None:
        self.namespace = sys.intern(self.namespace)


class _Resources(msgspec.Struct, gc=False):
    requests: Mapping[str, msgspec.Raw] | None = None
    limits: Mapping[str, msgspec.Raw] | None = None


class _Container(msgspec.Struct, gc=False):
    resources: _Resources | None = None


class _Spec(msgspec.Struct, gc=False):
    """Decoded, then reduced to one flag: the containers are dropped once `gpu` is known."""

    containers: tuple[_Container, ...] = ()
    gpu: bool = False

    def __post_init__(self) -> None:
        self.gpu = any(c.resources is not None and (GPU in (c.resources.requests or ()) or
                                                    GPU in (c.resources.limits or ())) for c in self.containers)
        self.containers = ()


class _Status(msgspec.Struct, gc=False):
    phase: str = ""

    def __post_init__(self) -> None:
        self.phase = sys.intern(self.phase)


class GPUPod(msgspec.Struct, gc=False):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class CountStatus(msgspec.Struct, omit_defaults=True):
    running: int | None = None


class GPUPodCount(msgspec.Struct, kw_only=True, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: CountStatus = msgspec.field(default_factory=CountStatus)


COUNTS: ResourceType[GPUPodCount] = ResourceType(GROUP, VERSION, PLURAL, KIND, True, GPUPodCount)
GPU_PODS = PODS.typed(GPUPod)


def counted(pod: GPUPod) -> tuple[str, ...]:
    """The index: a Running pod asking for a GPU, under its namespace."""
    return (pod.metadata.namespace,) if pod.status.phase == "Running" and pod.spec.gpu else ()


def install(manager: Manager) -> Controller:
    pods = manager.informer(GPU_PODS)
    pods.add_index(INDEX_COUNTED, counted)
    counts = manager.informer(COUNTS)
    counts.add_index(INDEX_NAMESPACE, by_namespace)
    client = manager.client

    async def reconcile(req: Request) -> None:
        cr = counts.store.get(req.key)
        if cr is None:
            return
        running = len(pods.store.index_keys(INDEX_COUNTED, req.namespace))
        if cr.status.running != running:
            await client.patch(COUNTS, req.name, {"status": {"running": running}}, namespace=req.namespace,
                               subresource="status")

    def to_counts(pod: GPUPod) -> Iterable[Request]:
        ns = pod.metadata.namespace
        return [Request.from_key(key) for key in counts.store.index_keys(INDEX_NAMESPACE, ns)]

    changes_count = Predicate(create=lambda p: bool(counted(p)), update=lambda a, b: counted(a) != counted(b),
                              delete=lambda p: bool(counted(p)))
    # One pass computes the status from the caches: the watch event of its own status write has nothing new.
    controller = Controller("gpupodcount", reconcile, client=client, skip_own_write_events=True)
    controller.watch(counts)
    controller.watch(pods, to_counts, predicates=[changes_count])
    manager.add(controller)
    return controller


async def run(kubeconfig: str) -> None:
    client = await Client.from_kubeconfig(kubeconfig)
    try:
        manager = Manager(client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        install(manager)
        manager.handle_signals()
        await manager.run()
    finally:
        await client.close()


def description() -> dict[str, Any]:
    """What the bench reports about this operator's configuration."""
    return {
        "command": "python bench/_framework_gpuops.py KUBECONFIG",
        "framework": "gpuops.kube Manager (no leader election, no metrics or probe servers), shared informers "
                     "(streaming initial list), Controller with 4 workers, read-your-own-writes and "
                     "skip_own_write_events (its own status writes do not queue it again)",
        "pods_model": "GPUPod projection (name, namespace, resourceVersion, phase, gpu flag)",
        "design": "index of Running GPU pods by namespace; pod events that change whether a pod counts map to "
                  "the namespace's GPUPodCounts; reconcile patches status.running when it differs",
        "gc": "tune_for_large_heaps (as `gpuops run`)",
        "logging": "WARNING",
    }


if __name__ == "__main__":
    tune_for_large_heaps()
    logs.configure(json=False, level="WARNING")
    asyncio.run(run(sys.argv[1]))
