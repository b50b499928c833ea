"""Gate budgets, on the controller's side: which held pods go, what the held ones are told, who is closed.

The webhook (`gatehook.py`) holds new pods while a Gate budget is closed; every reconcile of the budget (on the
leader) then
- lets go, oldest first, the held pods the remaining quota has room for (`gpuops.accounting.gate`): our name
  leaves the pod's gpuops.io/gated-by annotation, and the gate goes with the last name;
- tells each pod still held why and until when (its gpuops.io/BudgetGate condition): the period's end for a
  calendar window, else the instant the usage falls far enough in the known future (running pods keep
  running), or that the running pods keep it over quota;
- says whether the budget is closed (over quota past its delay, or pods still held): the status's Gating
  condition, which every replica's webhook follows (a standby's too, so the Service may send the API server's
  call to any replica), and when to look again (that instant: a release is due then).
A budget that is no longer Gate, is invalid or deleted lets all its pods go. Running pods are never touched: a
pod with a scheduling gate has never been scheduled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import msgspec
import structlog

from gpuops.accounting.gate import HeldPod, queue, releasable, release_level
from gpuops.accounting.gpuhours import Interval, Ledger, first_at_or_below
from gpuops.accounting.pricing import highest_factor, version_at
from gpuops.accounting.windows import RollingWindow, period_of
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Conflict, Invalid, NotFound
from gpuops.kube.informer import INDEX_NAMESPACE, Informer
from gpuops.kube.objects import Pod
from gpuops.kube.resources import PODS
from gpuops.kube.times import parse_time_or_none, wall_clock

from .api import GATE, GATE_CONDITION, GATED_BY, GPUWorkloadBudget, ParsedSpec, format_time
from .gatehook import GateBook, gate_names
from .metrics import count_enforcement
from .podcontract import pod_gpus
from .pricebook import Priced

__all__ = ["INDEX_GATED_BY", "GateOutcome", "GateView", "Gatekeeper", "gated_by"]

log = structlog.get_logger("gpuops.controllers.budget.gating")

INDEX_GATED_BY = "gpuops.io/gated-by"
"""Held pods by the budgets ("namespace/name") their annotation names."""

_SECOND = 1_000_000
_NANO = Fraction(1, 10**9)
"""Below the quota by the smallest amount a status shows: "under quota" as a level to reach."""


def _gated(pod: Pod) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates or ())


def gated_by(pod: Pod) -> list[str]:
    """The budgets ("namespace/name") holding `pod` (none unless it carries our gate)."""
    if not _gated(pod):
        return []
    return [f"{pod.metadata.namespace}/{n}" for n in gate_names(pod.metadata.annotations)]


@dataclass(frozen=True, slots=True)
class GateView:
    """What one reconcile of a Gate budget knows, at its counting instant `at`."""

    budget: GPUWorkloadBudget
    spec: ParsedSpec
    priced: Priced | None
    consumed: Fraction
    """In the quota's unit."""
    running_gpus: Fraction
    """GPUs of the budget's pods admitted and not finished (running, or released and not started yet): what the
    reserve covers besides the held pods."""
    live: Sequence[Interval]
    """The window inputs in the quota's unit (for the instant the usage falls far enough)."""
    ledger: Ledger
    over: bool
    due: bool
    """Over quota for delaySeconds: the gate closes."""
    at: int


@dataclass(frozen=True, slots=True)
class GateOutcome:
    until: int | None
    """When the first held pod's turn comes in the known future (None: nobody waits, or not foreseeable)."""
    held: int
    closed: bool
    """The budget holds new pods: over quota past its delay, or pods still wait."""
    message: str
    """Why and until when (the Gating condition's message, and what held pods are told)."""


@dataclass(eq=False)
class Gatekeeper:
    client: Client
    pods: Informer[Pod]
    book: GateBook = field(default_factory=GateBook)
    """What this replica's webhook reads: fed from every budget's Gating condition (`gatehook.follow`)."""
    webhook: bool = False
    """The admission webhook that reads `book` is installed: without it a Gate budget holds nothing back."""

    def __post_init__(self) -> None:
        self.pods.add_index(INDEX_GATED_BY, gated_by)

    def held_by(self, key: str) -> list[Pod]:
        return [p for p in self.pods.store.by_index(INDEX_GATED_BY, key) if not p.metadata.deletion_timestamp]

    async def reconcile(self, view: GateView) -> GateOutcome:
        """Release what fits and tell the rest; whether the budget holds new pods (its Gating condition, which
        every replica's webhook reads), when to look again and how many pods it still holds."""
        meta = view.budget.metadata
        key = f"{meta.namespace}/{meta.name}"
        held: list[tuple[Pod, HeldPod]] = []
        for pod in self.held_by(key):
            if not view.spec.selector.matches(pod.metadata.labels):
                await self._let_go(pod, meta.name, "the budget no longer selects it")
                continue
            created = parse_time_or_none(pod.metadata.creation_timestamp) or 0
            held.append((pod, HeldPod(f"{meta.namespace}/{pod.metadata.name}", created,
                                      pod_gpus(pod, view.spec.resource))))
        rate = self._rate(view)
        spec = view.spec
        going = releasable([h for _, h in held], remaining=spec.quota - view.consumed, running_gpus=view.running_gpus,
                           rate=rate, horizon=spec.gate_horizon)
        gone = {h.key for h in going}
        for pod, h in held:
            if h.key in gone and await self._let_go(pod, meta.name, f"budget {meta.name} has room for it"):
                count_enforcement(meta.namespace, meta.name, "Gate", "Released")
        waiting = queue(h for _, h in held if h.key not in gone)
        if going:
            log.info("held pods released", budget=key, released=len(going), waiting=len(waiting))
        if not (view.over and view.due) and not waiting:
            return GateOutcome(None, 0, False, "new pods it selects are admitted")
        # until when the first in line waits; with nobody waiting, a new 1-GPU pod would
        head = waiting[0] if waiting else HeldPod("", view.at, Fraction(1))
        level = self._level(view, head, rate)
        until = self._until(view, level) if level >= 0 else None
        message = self._message(view, until, too_small=level < 0)
        for pod, h in held:
            if h.key not in gone:
                await self._tell(pod, meta.name, message)
        return GateOutcome(until if waiting else None, len(waiting), True, message)

    async def let_all_go(self, namespace: str, name: str, why: str) -> None:
        """The budget no longer gates (another action, an invalid spec, deleted): its pods go."""
        for pod in self.held_by(f"{namespace}/{name}"):
            await self._let_go(pod, name, why)

    async def sweep(self, namespace: str, gating: Iterable[str]) -> None:
        """Let go what budgets of `namespace` not in `gating` (gone, or no longer Gate) still hold."""
        alive = set(gating)
        for pod in self.pods.store.by_index(INDEX_NAMESPACE, namespace):
            for ref in gated_by(pod):
                name = ref.partition("/")[2]
                if name not in alive and not pod.metadata.deletion_timestamp:
                    await self._let_go(pod, name, f"budget {name} no longer gates")

    # ------------------------------------------------------------------------------------------ the figures

    @staticmethod
    def _rate(view: GateView) -> Fraction:
        """The most one GPU-hour of a held pod may count for in the quota's unit (it has no node yet)."""
        if view.spec.unit == "GPUHours" or view.priced is None:
            return Fraction(1)
        return highest_factor(version_at(view.priced.versions, view.at).table, view.spec.unit)

    @staticmethod
    def _level(view: GateView, head: HeldPod, rate: Fraction) -> Fraction:
        """The consumption at or below which the first held pod goes (below zero: never, the quota is too small
        for its reserve)."""
        spec = view.spec
        level = release_level(spec.quota, running_gpus=view.running_gpus, head=head, rate=rate,
                              horizon=spec.gate_horizon)
        return spec.quota - _NANO if level >= spec.quota else level  # a reserve of nothing: under quota will do

    @staticmethod
    def _until(view: GateView, level: Fraction) -> int | None:
        """When the consumption is at `level` in the known future: the period's end for a calendar window
        (nothing leaves it before), else the first instant the window's usage falls that far; None: not while
        the running pods keep it above."""
        spec = view.spec
        if not isinstance(spec.window, RollingWindow):
            period = period_of(spec.window, view.at)
            return period.end if period is not None else None
        return first_at_or_below(view.live, view.ledger, now=view.at, window=spec.length_at(view.at), level=level)

    @staticmethod
    def _message(view: GateView, until: int | None, *, too_small: bool) -> str:
        """Why and until when; no live figure, so the condition changes only when the answer does."""
        spec = view.spec
        name = view.budget.metadata.name
        if too_small:
            minutes = spec.gate_horizon // 60 // _SECOND
            return (f"held by GPUWorkloadBudget {name}: its quota of {spec.amount(spec.quota)} per {spec.per} is "
                    f"smaller than {minutes} minutes of this pod's GPUs and the running pods': raise the quota or "
                    f"lower spec.enforcement.gateHorizonMinutes")
        why = (f"over its quota of {spec.amount(spec.quota)} per {spec.per}" if view.over else
               f"older held pods, and the running pods' reserve of {spec.gate_horizon // 60 // _SECOND} minutes, "
               f"fill what is left of its quota of {spec.amount(spec.quota)} per {spec.per}")
        if not isinstance(spec.window, RollingWindow):
            end = f" at {format_time(until)}" if until is not None else ""
            when = f"when the period renews{end}, or sooner if the quota is raised"
        elif until is not None:
            when = (f"at {format_time(until)} as usage leaves the {spec.per} window, or sooner if the quota is "
                    "raised or pods stop")
        else:
            when = (f"once usage leaves the {spec.per} window (not while the running pods keep it this high), or "
                    "sooner if the quota is raised")
        return f"held by GPUWorkloadBudget {name}: {why}; released {when}"

    # ------------------------------------------------------------------------------------------ pod writes

    async def _let_go(self, pod: Pod, name: str, why: str) -> bool:
        """Take `name` off the pod's gpuops.io/gated-by; with the last name, the gate goes too. A JSON patch that
        tests exactly the fields it changes (not the resourceVersion: our own condition write in the same
        reconcile, or the kubelet's, must not make it wait for the next event). False if those fields changed
        meanwhile, or the pod went."""
        meta = pod.metadata
        raw = (meta.annotations or {}).get(GATED_BY)
        names = [n for n in gate_names(meta.annotations) if n != name]
        where = f"/metadata/annotations/{GATED_BY.replace('~', '~0').replace('/', '~1')}"
        ops: list[dict[str, object]] = [{"op": "test", "path": where, "value": raw}]
        ops.append({"op": "replace", "path": where, "value": ",".join(names)} if names else
                   {"op": "remove", "path": where})
        if not names:
            current = [msgspec.to_builtins(g) for g in pod.spec.scheduling_gates or ()]
            others = [g for g in current if g.get("name") != GATE]
            ops.append({"op": "test", "path": "/spec/schedulingGates", "value": current})
            ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": others} if others else
                       {"op": "remove", "path": "/spec/schedulingGates"})
        try:
            await self.client.patch(PODS, meta.name, ops, namespace=meta.namespace, patch_type="json")
        except (Conflict, NotFound, Invalid) as e:  # it changed or went: its event brings us back
            log.debug("held pod not released", pod=f"{meta.namespace}/{meta.name}", error=str(e))
            return False
        if not names:
            await self._condition(pod, "False", "Released", f"released by GPUWorkloadBudget {name}: {why}")
        return True

    async def _tell(self, pod: Pod, name: str, message: str) -> None:
        """The held pod's condition says who holds it and until when; another holder's word is left alone."""
        current = cond.get_condition(pod.status.conditions, GATE_CONDITION)
        holders = gate_names(pod.metadata.annotations)
        if current is not None and current.status == "True" and any(
                current.message.startswith(f"held by GPUWorkloadBudget {h}:") for h in holders if h != name):
            return
        await self._condition(pod, "True", "HeldByBudget", message)

    async def _condition(self, pod: Pod, value: str, reason: str, message: str) -> None:
        current = cond.get_condition(pod.status.conditions, GATE_CONDITION)
        if current is not None and (current.status, current.reason, current.message) == (value, reason, message):
            return
        items = cond.set_condition(pod.status.conditions, GATE_CONDITION, value, reason, message[:1024],
                                   now=format_time(wall_clock() // _SECOND * _SECOND))
        mine = next(c for c in items if c["type"] == GATE_CONDITION)
        meta = pod.metadata
        try:
            await self.client.patch(PODS, meta.name, {"status": {"conditions": [mine]}}, namespace=meta.namespace,
                                    patch_type="strategic", subresource="status")
        except (NotFound, Conflict):
            return
        except ApiError as e:
            log.info("held pod's condition not written", pod=f"{meta.namespace}/{meta.name}", error=str(e))
