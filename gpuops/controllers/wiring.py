"""What every controller's `setup.py` wires the same way: the parts `install` returns (tests and benchmarks look
inside), and the tasks that run beside a controller while it leads (its Event recorder, its metrics source, and
anything it must close when it stops)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpuops.kube.controller import Controller
from gpuops.kube.events import EventRecorder
from gpuops.kube.manager import Manager

__all__ = ["Installed", "add_side_tasks"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Installed(Generic[R]):
    """A controller as `install` added it: the object that decides (`reconciler`), its controller loop and the
    recorder of its Events. Construct it as `Installed(...)`; `Installed[X]` is for annotations (a frozen
    dataclass refuses the attribute a subscripted call would set)."""

    reconciler: R
    controller: Controller
    recorder: EventRecorder


def add_side_tasks(manager: Manager, name: str, recorder: EventRecorder, register: Callable[[], Callable[[], None]],
                   *, first: Callable[[], Awaitable[None]] | None = None,
                   close: Iterable[Callable[[], Awaitable[None]]] = ()) -> None:
    """Run `name`-events-and-metrics with the controllers: register the metrics source (`register()` returns
    its unregister), start the recorder, run `first` once; at stop undo them in reverse and call `close`."""

    async def side_tasks() -> None:
        unregister = register()
        recorder.start()
        try:
            if first is not None:
                await first()
            await asyncio.Event().wait()
        finally:
            unregister()
            await recorder.stop(timeout=2.0)
            for closing in close:
                await closing()

    manager.add_runnable(f"{name}-events-and-metrics", side_tasks)
