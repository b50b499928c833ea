"""The power API of on-prem machines: start and stop are idempotent, an Idempotency-Key replays answers.

Machines the spot cloud created are not power-managed (a BMC does not know cloud VMs): they look unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpuops_sim.cluster.machines import Fleet, Machine

from .errors import CloudError

log = structlog.get_logger("gpuops_sim.cloud")

MAX_KEYS = 100_000


def machine_json(m: Machine) -> dict[str, Any]:
    return {
        "name": m.name,
        "state": m.state,
        "powerCycles": m.power_cycles,
        "group": m.group,
        "gpus": m.gpus,
        "gpuModel": m.gpu_model,
        "providerId": m.provider_id,
    }


@dataclass
class Remembered:
    fingerprint: str
    status: int
    body: dict[str, Any]
    expires: float


class PowerAPI:
    def __init__(self, fleet: Fleet, *, managed: Callable[[str], bool], idempotency_seconds: float) -> None:
        self.fleet = fleet
        self._managed = managed
        self._ttl = idempotency_seconds
        self._keys: dict[str, Remembered] = {}

    def machine(self, name: str) -> Machine:
        m = self.fleet.get(name)
        if m is None or not self._managed(name):
            raise CloudError(404, "MachineNotFound", f"machine {name!r} is not known to the power API", name=name)
        return m

    def start(self, name: str) -> tuple[int, dict[str, Any]]:
        """202 when the machine starts booting now, 200 when it is booting or on already."""
        m = self.machine(name)
        changed = self.fleet.power_on(name)
        if changed:
            log.info("power on", machine=name, boot_seconds=m.boot_seconds, cycles=m.power_cycles)
        return (202 if changed else 200), machine_json(m)

    def stop(self, name: str) -> tuple[int, dict[str, Any]]:
        """202 when the machine starts shutting down now, 200 when it is shutting down or off already."""
        m = self.machine(name)
        changed = self.fleet.power_off(name)
        if changed:
            log.info("power off", machine=name, shutdown_seconds=m.shutdown_seconds)
        return (202 if changed else 200), machine_json(m)

    def list(self, group: str | None = None) -> list[dict[str, Any]]:
        return [machine_json(m) for n, m in self.fleet.machines.items()
                if self._managed(n) and (group is None or m.group == group)]

    # ------------------------------------------------------------------------------------ idempotency keys

    def replay(self, key: str, fingerprint: str) -> tuple[int, dict[str, Any]] | None:
        """The stored answer of an earlier call with this key; a key reused for another call is an error."""
        got = self._keys.get(key)
        if got is None:
            return None
        if got.expires < time.monotonic():
            del self._keys[key]
            return None
        if got.fingerprint != fingerprint:
            raise CloudError(422, "IdempotencyKeyMismatch",
                             f"Idempotency-Key {key!r} was used for {got.fingerprint!r}, not {fingerprint!r}")
        return got.status, got.body

    def remember(self, key: str, fingerprint: str, status: int, body: dict[str, Any]) -> None:
        if len(self._keys) >= MAX_KEYS:
            del self._keys[next(iter(self._keys))]  # oldest first: dicts keep insertion order
        self._keys[key] = Remembered(fingerprint, status, body, time.monotonic() + self._ttl)
