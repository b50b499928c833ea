"""A budget's figures in the unit of its quota: GPU-hours, weighted GPU-hours or money.

GPU-hours are always counted (consumedGpuHours, trackedPods, the ledger's error bound). With a price list, each
record is also counted at its GPU model's weight or price, at the version in force while it ran
(`gpuops.accounting.pricing`); a weighted or cost quota's decision (over quota, remaining, exhaustsAt, when to
look again) is taken on those figures, through the same window arithmetic and counting instants as GPU-hours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from gpuops.accounting.gpuhours import Interval, Ledger, Usage, consumed_by_key
from gpuops.accounting.pricing import Attribution, Totals, ledger_in_unit, totals_by_key, version_starts
from gpuops.accounting.reporting import reported_usage

from .api import ParsedSpec
from .kinds import split
from .pricebook import Priced

__all__ = ["Figures", "attribution_of", "cuts", "figures", "in_unit", "totals"]


def attribution_of(kind: str) -> Attribution:
    """What a kind ran on, for pricing: an unknown model is priced at the fallback, unknown capacity on-demand."""
    model, capacity = split(kind)
    return Attribution(model or "", "Spot" if capacity == "Spot" else "OnDemand")


def cuts(priced: Priced | None) -> tuple[int, ...]:
    """Where a ledger bucket must not span: the instants prices change."""
    return version_starts(priced.versions) if priced is not None else ()


def in_unit(spec: ParsedSpec, priced: Priced | None, live: Mapping[str, Iterable[Interval]],
            ledger: Ledger) -> tuple[list[Interval], Ledger]:
    """The window inputs counted in the quota's unit (`live` by kind; the ledger's records carry theirs)."""
    if spec.unit == "GPUHours" or priced is None:
        return [i for items in live.values() for i in items], ledger
    return ledger_in_unit(live, ledger, attribution_of, priced.versions, spec.unit)


def totals(priced: Priced | None, live: Mapping[str, Iterable[Interval]], ledger: Ledger, *, now: int,
           window: int) -> dict[str, Totals]:
    """GPU-hours, weighted GPU-hours and cost inside `[now - window, now)` by kind (the last two 0 without a
    price list)."""
    if priced is None:
        plain = consumed_by_key(live, ledger, now=now, window=window)
        return {k: Totals(v, Fraction(0), Fraction(0)) for k, v in plain.items()}
    return totals_by_key(live, ledger, attribution_of, priced.versions, now=now, window=window)


@dataclass(frozen=True, slots=True)
class Figures:
    """One reconcile's figures at one counting instant."""

    gpu_hours: Usage
    """In GPU-hours, whatever the quota's unit."""
    quota: Usage
    """In the quota's unit: what enforcement, exhaustsAt and the next look follow."""
    by_kind: dict[str, Totals]
    """GPU-hours, weighted GPU-hours and cost by kind (weighted and cost 0 without a price list)."""
    priced: Priced | None

    @property
    def cost(self) -> Fraction:
        return sum((t.cost for t in self.by_kind.values()), Fraction(0))

    @property
    def weighted(self) -> Fraction:
        return sum((t.weighted_gpu_hours for t in self.by_kind.values()), Fraction(0))


def figures(spec: ParsedSpec, priced: Priced | None, live: Mapping[str, Iterable[Interval]], ledger: Ledger, *,
            at: int) -> Figures:
    """The budget's figures at counting instant `at` from its live intervals (by kind) and ledger."""
    flat = [i for items in live.values() for i in items]
    gpu = reported_usage(flat, ledger, now=at, window=spec.window, quota=spec.quota)
    kinds = {k for k, items in live.items() if items} | {e.key for e in ledger.entries}
    kinds.update(b.key for b in ledger.buckets)
    if priced is None and len(kinds) <= 1:  # one kind has the whole figure: no second pass over the records
        by_kind = {k: Totals(gpu.consumed, Fraction(0), Fraction(0)) for k in kinds}
    else:
        by_kind = totals(priced, live, ledger, now=at, window=spec.length_at(at))
    if priced is None or spec.unit == "GPUHours":
        return Figures(gpu, gpu, by_kind, priced)
    pieces, scaled = in_unit(spec, priced, live, ledger)
    return Figures(gpu, reported_usage(pieces, scaled, now=at, window=spec.window, quota=spec.quota), by_kind,
                   priced)
