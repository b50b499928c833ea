"""The physical side of the emulated cluster: machines that are powered on or off, boot, and vanish.

A Node object is what a kubelet writes about its machine; a `Machine` is the machine itself. The power API
and the spot cloud (`sim/cloud.py`) change machines; the kubelets (`kubelet.py`) react: a machine that is
on runs a kubelet that registers and heartbeats its Node, a machine that is off or gone runs none, so its
Node goes NotReady through the node lifecycle controller exactly as on a real cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

PowerState = Literal["off", "booting", "on", "shutting-down"]
FleetEvent = Literal["added", "booting", "on", "shutting-down", "off", "removed"]
Subscriber = Callable[["Machine", FleetEvent], None]


@dataclass
class Machine:
    """One server. `gpu_model` is a key of `gpus.MODELS` (None for a CPU-only node)."""

    name: str
    gpu_model: str | None = None
    gpus: int = 0
    cpu: str = "64"
    memory: str = "512Gi"
    max_pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)
    group: str = ""
    provider_id: str = ""
    state: PowerState = "on"
    boot_seconds: float = 0.0  # power-on until the kubelet registers the Node Ready
    device_plugin_seconds: float = 0.0  # Node Ready until GPUs become allocatable
    shutdown_seconds: float = 0.0  # power-off until the kubelet stops heartbeating
    power_cycles: int = 0

    @property
    def powered(self) -> bool:
        return self.state in ("on", "shutting-down")


class Fleet:
    """All machines by name, their power transitions (with delays), and who wants to hear about them."""

    def __init__(self) -> None:
        self.machines: dict[str, Machine] = {}
        self._subscribers: list[Subscriber] = []
        self._pending: dict[str, asyncio.TimerHandle] = {}

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def _emit(self, m: Machine, ev: FleetEvent) -> None:
        for fn in list(self._subscribers):
            fn(m, ev)

    def get(self, name: str) -> Machine | None:
        return self.machines.get(name)

    def add(self, m: Machine) -> Machine:
        if m.name in self.machines:
            raise ValueError(f"machine {m.name!r} exists already")
        self.machines[m.name] = m
        self._emit(m, "added")
        return m

    def remove(self, name: str) -> Machine | None:
        """The machine is gone (terminated or reclaimed): its kubelet stops at once."""
        self._cancel(name)
        m = self.machines.pop(name, None)
        if m is not None:
            m.state = "off"
            self._emit(m, "removed")
        return m

    def power_on(self, name: str) -> bool:
        """Start booting; False when the machine is already on or booting (idempotent)."""
        m = self._machine(name)
        if m.state in ("on", "booting"):
            return False
        self._cancel(name)
        m.state = "booting"
        m.power_cycles += 1
        self._emit(m, "booting")
        self._later(m, m.boot_seconds, "on")
        return True

    def power_off(self, name: str) -> bool:
        """Begin shutting down; False when already off or shutting down (idempotent)."""
        m = self._machine(name)
        if m.state in ("off", "shutting-down"):
            return False
        self._cancel(name)
        m.state = "shutting-down"
        self._emit(m, "shutting-down")
        self._later(m, m.shutdown_seconds, "off")
        return True

    def _machine(self, name: str) -> Machine:
        m = self.machines.get(name)
        if m is None:
            raise KeyError(name)
        return m

    def _later(self, m: Machine, delay: float, state: PowerState) -> None:
        def fire() -> None:
            self._pending.pop(m.name, None)
            if self.machines.get(m.name) is m:
                m.state = state
                self._emit(m, state)

        if delay <= 0:
            fire()
        else:
            self._pending[m.name] = asyncio.get_running_loop().call_later(delay, fire)

    def _cancel(self, name: str) -> None:
        h = self._pending.pop(name, None)
        if h is not None:
            h.cancel()

    def close(self) -> None:
        for h in self._pending.values():
            h.cancel()
        self._pending.clear()
