"""Priced and weighted GPU-hours: what a pod's GPU time costs or weighs, by the GPU model and capacity type it ran
on, at the prices in force while it ran.

A price table maps a GPU model to its rates per GPU-hour: an on-demand and a spot price (one currency), and a
weight (weighted GPU-hours per GPU-hour, so that an H100 hour may count 4 and an L4 hour 1). A model without an
entry has the fallback rates. Price versions take effect at their `since` instant and hold until the next
version's; the first version also holds before its own `since` (the earliest prices known are the best estimate
of earlier ones). A later version never changes what earlier time costs: history is not rewritten.

A record (one pod's interval, live or in a ledger) ran on one model with one capacity type. In a unit (GPU-hours,
weighted GPU-hours or cost) it contributes, for each version span it overlaps, `gpus * overlap * factor`, where
the factor is 1, the model's weight, or its price for the capacity type. `in_unit` turns records into records
whose GPU amounts are already multiplied by their factor, split where a version begins, so the window arithmetic
of `gpuhours` (consumption, exhaustion, next change) holds in any unit unchanged: in the known future no new
version begins, so each piece's factor stays constant.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Final, Literal, NamedTuple, TypeVar

import msgspec

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import (
    MICROS_PER_HOUR,
    Interval,
    Ledger,
    LedgerBucket,
    LedgerEntry,
    gpu_hours,
    keyed_records,
)
from gpuops.accounting.mig import geometry, normalize_model

__all__ = [
    "CAPACITIES",
    "UNITS",
    "Attribution",
    "Capacity",
    "PriceTable",
    "PriceVersion",
    "Rates",
    "Totals",
    "Unit",
    "bucket_in_unit",
    "factor",
    "highest_factor",
    "in_unit",
    "ledger_in_unit",
    "mig_share",
    "totals_by_key",
    "version_at",
    "version_starts",
]

Capacity = Literal["OnDemand", "Spot"]
CAPACITIES: Final[tuple[Capacity, ...]] = ("OnDemand", "Spot")
Unit = Literal["GPUHours", "WeightedGPUHours", "Cost"]
UNITS: Final[tuple[Unit, ...]] = ("GPUHours", "WeightedGPUHours", "Cost")

_R = TypeVar("_R", Interval, LedgerEntry)


class Rates(msgspec.Struct, frozen=True, kw_only=True):
    """Per GPU-hour of one model: what an on-demand and a spot hour cost, and what an hour weighs."""

    on_demand: Fraction
    spot: Fraction
    weight: Fraction = Fraction(1)

    def __post_init__(self) -> None:
        for name in ("on_demand", "spot", "weight"):
            value = getattr(self, name)
            if not isinstance(value, Fraction) or value < 0:
                raise AccountingError(f"Rates.{name} must be a Fraction >= 0, got {value!r}")


class PriceTable(msgspec.Struct, frozen=True, kw_only=True):
    rates: Mapping[str, Rates]
    """By GPU model, as the node's model label names it."""
    fallback: Rates
    """For a model the table does not name, and for pods whose model is unknown ("")."""

    def of(self, model: str) -> Rates:
        return self.rates.get(model, self.fallback)


class PriceVersion(msgspec.Struct, frozen=True, kw_only=True):
    since: int
    """When these prices took effect (microseconds)."""
    table: PriceTable


class Attribution(NamedTuple):
    """What a record ran on: the GPU model ("" if unknown) and the capacity type."""

    model: str
    capacity: Capacity


class Totals(NamedTuple):
    gpu_hours: Fraction
    weighted_gpu_hours: Fraction
    cost: Fraction


def factor(rates: Rates, capacity: Capacity, unit: Unit) -> Fraction:
    """What one GPU-hour on `rates` with `capacity` counts for in `unit`."""
    if unit == "GPUHours":
        return Fraction(1)
    if unit == "WeightedGPUHours":
        return rates.weight
    if unit == "Cost":
        return rates.spot if capacity == "Spot" else rates.on_demand
    raise AccountingError(f"unknown unit {unit!r}: use GPUHours, WeightedGPUHours or Cost")


def highest_factor(table: PriceTable, unit: Unit) -> Fraction:
    """The most one GPU-hour can count for in `unit` under `table`, on any model and either capacity type: what
    a pod not yet placed may cost per GPU-hour at worst."""
    return max(factor(r, c, unit) for r in (table.fallback, *table.rates.values()) for c in CAPACITIES)


def mig_share(model: str, profile: str) -> Fraction:
    """The share of a GPU one MIG slice of `profile` is charged as: its compute slices over the GPU's (a 3g.40gb
    on an A100-80GB is 3/7 of the GPU, a 2g.12gb on an A30 2/4), so the slices of a GPU add up to at most one
    GPU whatever the layout."""
    geom = geometry(normalize_model(model))
    return Fraction(geom.profile(profile).compute, geom.compute_slices)


def _checked(versions: Sequence[PriceVersion]) -> list[int]:
    if not versions:
        raise AccountingError("at least one price version is needed")
    starts = [v.since for v in versions]
    if any(b <= a for a, b in itertools.pairwise(starts)):
        raise AccountingError(f"price versions must be in strictly increasing order of since, got {starts}")
    return starts


def version_at(versions: Sequence[PriceVersion], instant: int) -> PriceVersion:
    """The version in force at `instant` (the first one before its own `since`)."""
    starts = _checked(versions)
    return versions[max(0, bisect.bisect_right(starts, instant) - 1)]


def _pieces(record: _R, starts: list[int]) -> list[tuple[int, int | None, int]]:
    """`record` cut where a version begins: (start, end, index of the version in force)."""
    first = max(0, bisect.bisect_right(starts, record.start) - 1)
    end: int | None = record.end
    cuts: list[int] = [s for s in starts[first + 1:] if end is None or s < end]
    lows = [record.start, *cuts]
    highs: list[int | None] = [*cuts, end]
    return [(lows[k], highs[k], first + k) for k in range(len(lows))]


def in_unit(records: Iterable[tuple[_R, Attribution]], versions: Sequence[PriceVersion], unit: Unit) -> list[_R]:
    """The records with their GPUs counted in `unit`: cut where a price version begins, each piece's GPUs times
    its factor. Pieces after the first get the UID `<uid>#<k>` (the window arithmetic counts each UID once);
    the record's late part stays at its end, split like the rest where a version begins inside it."""
    starts = _checked(versions)
    out: list[_R] = []
    for record, (model, capacity) in records:
        pieces = _pieces(record, starts)
        late_from = None if record.end is None or not record.late else record.end - record.late
        for k, (start, end, index) in enumerate(pieces):
            gpus = record.gpus * factor(versions[index].table.of(model), capacity, unit)
            late = 0 if late_from is None or end is None else max(0, end - max(start, late_from))
            uid = record.uid if k == 0 else f"{record.uid}#{k}"
            out.append(msgspec.structs.replace(record, uid=uid, start=start, end=end, gpus=gpus, late=late))
    return out


def version_starts(versions: Sequence[PriceVersion]) -> tuple[int, ...]:
    """Where prices change: the `since` of every version but the first (which also holds before its own)."""
    return tuple(_checked(versions)[1:])


def bucket_in_unit(bucket: LedgerBucket, attribution: Attribution, versions: Sequence[PriceVersion],
                   unit: Unit) -> LedgerBucket:
    """A ledger bucket with its amounts counted in `unit`, at the prices in force at its start: compaction cuts
    its cells where a version begins (`version_starts` as its cuts), so a bucket lies within one version."""
    rates = version_at(versions, bucket.start).table.of(attribution.model)
    f = factor(rates, attribution.capacity, unit)
    return msgspec.structs.replace(bucket, gpu_micros=bucket.gpu_micros * f, peak_gpus=bucket.peak_gpus * f,
                                   late_gpu_micros=bucket.late_gpu_micros * f)


def ledger_in_unit(live: Mapping[str, Iterable[Interval]], ledger: Ledger, attribution_of: Callable[[str], Attribution],
                   versions: Sequence[PriceVersion], unit: Unit) -> tuple[list[Interval], Ledger]:
    """The window inputs counted in `unit`: the records that count (one per UID, `keyed_records`) cut at price
    versions and scaled (`in_unit`), and the ledger's buckets scaled (`bucket_in_unit`); `live` intervals are
    given by key, entries and buckets carry theirs, and `attribution_of` reads a key."""
    records = in_unit(((r, attribution_of(key)) for r, key in keyed_records(live, ledger)), versions, unit)
    buckets = tuple(bucket_in_unit(b, attribution_of(b.key), versions, unit) for b in ledger.buckets)
    return records, Ledger(buckets=buckets)


def totals_by_key(live: Mapping[str, Iterable[Interval]], ledger: Ledger, attribution_of: Callable[[str], Attribution],
                  versions: Sequence[PriceVersion], *, now: int, window: int) -> dict[str, Totals]:
    """GPU-hours, weighted GPU-hours and cost inside `[now - window, now)` by key, counted as the window counts
    them (one record per UID; buckets whole while they overlap the window), so the keys add up to the total."""
    grouped: dict[str, list[Interval]] = {}
    for record, key in keyed_records(live, ledger):
        grouped.setdefault(key, []).append(record)
    out: dict[str, Totals] = {}
    for key in {*grouped, *(b.key for b in ledger.buckets)}:
        pairs = [(r, attribution_of(key)) for r in grouped.get(key, ())]
        sums = []
        for unit in UNITS:
            total = gpu_hours(in_unit(pairs, versions, unit), now=now, window=window)
            for b in ledger.buckets:
                if b.key == key and b.start < now and now - window < b.end and b.gpu_micros:
                    total += bucket_in_unit(b, attribution_of(key), versions, unit).gpu_micros / MICROS_PER_HOUR
            sums.append(total)
        out[key] = Totals(*sums)
    return out
