"""One controller running on an emulated cluster, driven from a synchronous (hypothesis) test.

The cluster and the controller's Manager live on a private event loop; each example runs a coroutine on it
(`Live.run`), and the manager works while it does. `ReconcileLog` wraps the controller's reconcile function
to record every reconcile (key, order, the exception it raised), so a test waits for proof that the controller
looked at an object before it judges what the controller did with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hypothesis import HealthCheck, Phase, settings
from waiting import install_crds, until

from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Controller, Request, Result
from gpuops.kube.errors import ApiError
from gpuops.kube.manager import Manager, ManagerOptions
from gpuops.kube.resources import EVENTS, ResourceType
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.scenario import parse

T = TypeVar("T")

ANY_ADMITTED = settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                               HealthCheck.filter_too_much])
"""Hypothesis settings of the any-admitted-object tests: 10 admitted examples per run (each run draws anew); no
shrinking (each example runs the controller for a second or more; a failure prints its draw whole)."""


class Handle(Protocol):
    controller: Controller


@dataclass(slots=True)
class Reconcile:
    seq: int
    key: str
    began: float
    error: BaseException | None = None
    done: bool = False


@dataclass(slots=True)
class ReconcileLog:
    """Every reconcile the controller made, in start order."""

    items: list[Reconcile] = field(default_factory=list)

    def wrap(self, controller: Controller) -> None:
        inner = controller.reconcile

        async def logged(req: Request) -> Result | None:
            item = Reconcile(len(self.items) + 1, req.key, time.monotonic())
            self.items.append(item)
            try:
                return await inner(req)
            except BaseException as e:
                item.error = e
                raise
            finally:
                item.done = True

        controller.reconcile = logged

    def of(self, key: str, after: int = 0) -> list[Reconcile]:
        return [r for r in self.items if r.key == key and r.seq > after]

    def errors(self) -> list[Reconcile]:
        return [r for r in self.items if r.error is not None]


async def looked(log: ReconcileLog, controller: Controller, request: Request, within: float = 15.0) -> Reconcile:
    """Proof that `controller` has looked at `request` since this call, to wait on before asserting it did nothing:
    the key is queued now, and a reconcile of it that started after the call has finished (one in flight at the
    call is not enough: it may have read the state before the change). `log` must wrap the controller."""
    after = len(log.items)
    controller.enqueue(request)

    async def probe() -> Reconcile | None:
        return next((r for r in log.of(request.key, after) if r.done), None)

    return await until(f"a reconcile of {request.key!r} that started after the change", probe, within)


class Live:
    """`with Live(...) as live:` an emulated cluster with `crds` installed and one controller installed by
    `install(manager)` running; `live.run(coro)` runs a coroutine on the cluster's loop."""

    def __init__(
        self,
        tmp_path: Path,
        scenario: dict[str, Any],
        crds: list[str],
        served: list[ResourceType[Any]],
        install: Callable[[Manager, SimCluster], Handle],
    ) -> None:
        self.tmp_path = tmp_path
        self.scenario = scenario
        self.crds = crds
        self.served = served
        self.install = install
        self.loop = asyncio.new_event_loop()
        self.log = ReconcileLog()
        self._stack = contextlib.AsyncExitStack()
        self._task: asyncio.Task[None] | None = None

    def run(self, coro: Coroutine[Any, Any, T], within: float = 60.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, within))

    def __enter__(self) -> Live:
        try:
            self.run(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.close()

    async def _start(self) -> None:
        self.cluster = await self._stack.enter_async_context(SimCluster(parse(self.scenario), workload=False))
        kubeconfig = self.tmp_path / "kubeconfig"
        self.cluster.write_kubeconfig(kubeconfig)
        self.client = await Client.from_kubeconfig(str(kubeconfig))
        self._stack.push_async_callback(self.client.close)
        await install_crds(self.client, self.crds, self.served)
        assert await self.cluster.wait_ready(10)
        self.manager = Manager(self.client, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))
        self.handle = self.install(self.manager, self.cluster)
        self.log.wrap(self.handle.controller)
        self._task = asyncio.create_task(self.manager.run())

    async def _stop(self) -> None:
        if self._task is not None:
            self.manager.request_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 15)
        await self._stack.aclose()

    async def create(self, rt: ResourceType[Any], body: dict[str, Any], namespace: str | None = None) -> bool:
        """Create `body`; False if the API server refused it (invalid: the schema or a rule said no)."""
        try:
            await self.client.create(rt, body, namespace)
        except ApiError as e:
            if e.status in (400, 422):
                return False
            raise
        return True

    async def reconciled(self, key: str, after: int, within: float = 15.0) -> Reconcile:
        """The first reconcile of `key` that started after reconcile number `after` and has finished."""

        async def probe() -> Reconcile | None:
            return next((r for r in self.log.of(key, after) if r.done), None)

        return await until(f"a reconcile of {key}", probe, within)

    async def settle(self, seconds: float) -> None:
        """Let the controller run for `seconds` (to count what it does in that time, not to wait for a result)."""
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Expect:
    """What handling an admitted object means, per controller."""

    observe: float = 1.0
    """Seconds the controller runs after its first reconcile of the object, to count what it does."""
    most: int = 10
    """Reconciles of the object allowed in that time: more is a hot loop (backoff and requeues are slower)."""
    ready: bool = True
    """The object carries a Ready condition for its current generation."""
    progressing: frozenset[str] = frozenset()
    """Ready=False reasons of work under way (instances booting), which need no Event: nothing is wrong."""


async def handles_admitted(
    live: Live, rt: ResourceType[Any], body: dict[str, Any], namespace: str | None = None,
    expect: Expect = Expect(),
) -> bool:
    """Create `body` and judge the controller's handling of it; False if the API server refused it.

    No reconcile of any object raises meanwhile (one object's failure must not become another's); the object
    is reconciled at most `expect.most` times in `expect.observe` seconds; it shows Ready for its generation,
    and a Ready=False names a reason and a message, with an Event of that reason on the object.
    """
    name = body["metadata"]["name"]
    mark = len(live.log.items)
    if not await live.create(rt, body, namespace):
        return False
    key = f"{namespace}/{name}" if namespace else name
    await live.reconciled(key, mark)
    await live.settle(expect.observe)
    raised = [r for r in live.log.errors() if r.seq > mark]
    assert not raised, f"reconcile of {raised[0].key} raised {raised[0].error!r}"
    mine = live.log.of(key, mark)
    assert len(mine) <= expect.most, f"{len(mine)} reconciles of {key} in {expect.observe}s: a hot loop"
    if expect.ready:
        obj = await live.client.get(rt, name, namespace)
        ready = cond.get_condition(obj.status.conditions, "Ready")
        assert ready is not None, f"{key} has no Ready condition: {obj.status.conditions}"
        assert ready.observed_generation == obj.metadata.generation, (ready, obj.metadata.generation)
        if ready.status != "True":
            assert ready.reason and ready.message, ready
        if ready.status != "True" and ready.reason not in expect.progressing:
            recorder = getattr(live.handle, "recorder", None)
            if recorder is not None:
                assert await recorder.flush(5.0)
            events = await live.client.list(EVENTS, namespace or "default")
            reasons = {e.reason for e in events[1] if e.involved_object.name == name}
            assert ready.reason in reasons, f"{key} is Ready=False ({ready.reason}) with Events {reasons}"
    with contextlib.suppress(ApiError):
        await live.client.delete(rt, name, namespace)
    return True
