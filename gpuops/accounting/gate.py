"""Which pods a gating budget lets go, and in what order.

A budget that gates holds new pods back (a scheduling gate) while it is over quota and lets them go once it
allows again. Users must be able to predict who goes first and how many, so the rule is plain:

- Pods go in creation order (the key breaks ties), and the first that does not fit stops the queue: a large
  pod is never overtaken by smaller, younger ones, so it cannot starve.
- A pod fits when the remaining quota covers `horizon` of the GPUs of the running pods, of the pods let go
  before it and of its own, each GPU-hour charged at `rate`, the quota unit's highest charge per GPU-hour (1
  for GPU-hours; the highest weight or price otherwise, since where a held pod will run is not known yet).
- Nothing goes while the budget is over quota (no remaining quota), whatever the horizon.

The same rule, read backwards, says until when the head of the queue waits: until the consumption falls to
`release_level` (`gpuhours.first_at_or_below` finds that instant for a rolling window; a calendar period
renews at its end).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from gpuops.accounting.errors import NegativeValueError
from gpuops.accounting.gpuhours import MICROS_PER_HOUR

__all__ = ["HeldPod", "queue", "releasable", "release_level", "reserve"]


@dataclass(frozen=True, slots=True)
class HeldPod:
    """A pod a budget holds back."""

    key: str
    """namespace/name: breaks ties between pods created in the same microsecond."""
    created: int
    """Its creation instant (microseconds)."""
    gpus: Fraction
    """The GPUs it requests, as the budget counts them."""


def _checked(rate: Fraction, horizon: int) -> None:
    if rate < 0:
        raise NegativeValueError(f"rate must be >= 0, got {rate}")
    if horizon < 0:
        raise NegativeValueError(f"horizon must be >= 0 microseconds, got {horizon}")


def reserve(gpus: Fraction, *, rate: Fraction, horizon: int) -> Fraction:
    """What `gpus` GPUs cost over `horizon` microseconds at `rate` per GPU-hour (in the quota's unit)."""
    _checked(rate, horizon)
    if gpus < 0:
        raise NegativeValueError(f"gpus must be >= 0, got {gpus}")
    return gpus * rate * horizon / MICROS_PER_HOUR


def queue(held: Iterable[HeldPod]) -> list[HeldPod]:
    """The held pods in the order they go: oldest first, then by key."""
    return sorted(held, key=lambda p: (p.created, p.key))


def releasable(held: Iterable[HeldPod], *, remaining: Fraction, running_gpus: Fraction, rate: Fraction,
               horizon: int) -> list[HeldPod]:
    """The pods to let go now: the longest prefix of `queue(held)` that fits in `remaining` (see above)."""
    _checked(rate, horizon)
    if remaining <= 0:
        return []
    out: list[HeldPod] = []
    gpus = running_gpus
    for pod in queue(held):
        gpus += pod.gpus
        if reserve(gpus, rate=rate, horizon=horizon) > remaining:
            break
        out.append(pod)
    return out


def release_level(quota: Fraction, *, running_gpus: Fraction, head: HeldPod, rate: Fraction,
                  horizon: int) -> Fraction:
    """The consumption at or below which `head` (the first in the queue) fits: `releasable` lets it go once
    quota - consumption covers the reserve of the running pods and its own (and is above zero)."""
    return quota - reserve(running_gpus + head.gpus, rate=rate, horizon=horizon)
