"""GPUPriceList (gpuops.io/v1alpha1, cluster-scoped): what a GPU-hour costs and weighs, by GPU model and capacity
type, and the history of those prices.

Budgets with a weighted or a cost quota, and every budget's cost figures, read a price list: the one
spec.priceList names, else the one marked `default: true`. A pod is charged at the prices in force while it ran,
so a price list keeps its own history in status: one version per spec generation, with the instant it took effect
(`since`). That instant is the time the API server recorded for the write that changed the spec (the managed
fields entry that owns `spec`, in whole seconds); without one, the first time the budget controller saw that
generation. The first version also holds before its own `since`. Versions older than any window can reach (their
successor began more than 367 days ago) are dropped; nothing a budget still counts is priced differently.

The currency cannot change (a cost figure would add up two currencies): create a new price list instead. A spec
replaced before the operator saw it (two edits while it was down) leaves no version: the API server keeps only
the latest spec, so the hours between the two edits are charged at the prices before them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Annotated, Any, Final

import msgspec

from gpuops.accounting.pricing import PriceTable, PriceVersion, Rates
from gpuops.accounting.reporting import next_counting_instant
from gpuops.controllers.apigroup import ApiStruct, CustomObject, custom_resource, resource_type
from gpuops.kube.crd import Column, Rule, crd
from gpuops.kube.objects import Condition, ObjectMeta
from gpuops.kube.times import format_time, parse_time_or_none

__all__ = [
    "CURRENCY",
    "HISTORY_HORIZON",
    "KIND",
    "PLURAL",
    "PRICE_LISTS",
    "GPUPriceList",
    "ManagedFieldsEntry",
    "ModelPrice",
    "PriceListMeta",
    "PriceListSpec",
    "PriceListStatus",
    "PriceVersionStatus",
    "Prices",
    "history_with",
    "pending_since",
    "table_of",
    "versions_of",
]

PLURAL: Final = "gpupricelists"
KIND: Final = "GPUPriceList"
CURRENCY: Final = r"^[A-Z]{3}$"
_DECIMAL: Final = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"
"""A price or weight: a plain decimal, at most 6 places (money is not written as a quantity with suffixes)."""
_MODEL: Final = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A GPU model as a node label value names it (nvidia.com/gpu.product)."""
HISTORY_HORIZON: Final = 367 * 24 * 3_600 * 1_000_000
"""Microseconds after which a superseded version can no longer price anything a window reaches (366 days is the
longest rolling window, a month the longest calendar period)."""


class Prices(ApiStruct):
    on_demand: Annotated[str, crd(required=True, pattern=_DECIMAL)] = "0"
    """Price of one GPU-hour on on-demand capacity, in the list's currency (e.g. "2.49")."""
    spot: Annotated[str | None, crd(pattern=_DECIMAL)] = None
    """Price of one GPU-hour on spot capacity; unset: the on-demand price."""
    weight: Annotated[str, crd(default="1", pattern=_DECIMAL)] = "1"
    """Weighted GPU-hours one GPU-hour counts for (an H100 hour may count 4, an L4 hour 1)."""


class ModelPrice(Prices):
    """The prices and weight of one GPU model."""

    model: Annotated[str, crd(required=True, max_length=63, pattern=_MODEL)] = ""
    """The GPU model, as the node's nvidia.com/gpu.product label names it (e.g. NVIDIA-H100-80GB-HBM3; a MIG
    strategy's -MIG-<profile> suffix is ignored)."""


class PriceListSpec(ApiStruct):
    currency: Annotated[str, crd(required=True, pattern=CURRENCY, rules=(
        Rule("self == oldSelf", "spec.currency cannot change (cost figures would add up two currencies): create "
                                "a new GPUPriceList and point the budgets at it"),
    ))] = ""
    """ISO 4217 code of the prices (e.g. EUR, USD). Immutable."""
    default: bool = False
    """Budgets that name no price list use the default one (if several are default, the first by name)."""
    prices: Annotated[tuple[ModelPrice, ...] | None, crd(list_type="map", list_map_keys=("model",),
                                                         max_items=256)] = None
    """Prices by GPU model."""
    fallback: Annotated[Prices, crd(required=True)] = msgspec.field(default_factory=Prices)
    """Prices of a model the list does not name, and of pods whose node's model is unknown."""


class PriceVersionStatus(ApiStruct):
    """One version of the prices: the spec of one generation, and since when it is in force."""

    since: Annotated[str, crd(format="date-time")] = ""
    """When these prices took effect."""
    generation: Annotated[int, crd(format="int64")] = 0
    """The spec generation they are."""
    prices: tuple[ModelPrice, ...] | None = None
    """As spec.prices was."""
    fallback: Prices = msgspec.field(default_factory=Prices)
    """As spec.fallback was."""


class PriceListStatus(ApiStruct):
    observed_generation: Annotated[int, crd(format="int64")] = 0
    """The spec generation the history includes."""
    history: Annotated[tuple[PriceVersionStatus, ...] | None, crd(max_items=1000)] = None
    """Every version a budget may still charge at, oldest first."""
    conditions: Annotated[tuple[Condition, ...] | None, crd(list_type="map", list_map_keys=("type",))] = None
    """Ready: the history includes the current spec. metav1.Condition."""


class ManagedFieldsEntry(ApiStruct):
    manager: str = ""
    operation: str = ""
    subresource: str = ""
    time: str | None = None
    fields_v1: dict[str, Any] | None = None


class PriceListMeta(ObjectMeta):
    """A price list's metadata, with the managed fields that say when its spec was written."""

    managed_fields: tuple[ManagedFieldsEntry, ...] | None = None


class GPUPriceList(CustomObject):
    """GPUPriceList gives the price and weight of a GPU-hour by GPU model and capacity type (spot or on-demand),
    with a fallback for other models. Budgets count weighted GPU-hours and cost with it, each pod at the prices in
    force while it ran: status.history keeps every version a budget may still charge at."""

    metadata: PriceListMeta = msgspec.field(default_factory=PriceListMeta)
    spec: Annotated[PriceListSpec, crd(required=True)] = msgspec.field(default_factory=PriceListSpec)
    """The prices now."""
    status: PriceListStatus = msgspec.field(default_factory=PriceListStatus)
    """Written by the budget controller."""


PRICE_LISTS: Final = resource_type(PLURAL, KIND, False, GPUPriceList)
CRD: Final = custom_resource(
    PRICE_LISTS,
    Column("Currency", "string", ".spec.currency", "ISO 4217 code of the prices."),
    Column("Default", "boolean", ".spec.default", "Used by budgets that name no price list."),
    Column("Recorded", "integer", ".status.observedGeneration",
           "The spec generation the price history includes.", priority=1),
    short_names=("gpl",),
)


# ---------------------------------------------------------------------------------------------- versions


def _rates(prices: Prices) -> Rates:
    on_demand = Fraction(prices.on_demand or "0")
    spot = Fraction(prices.spot) if prices.spot else on_demand
    return Rates(on_demand=on_demand, spot=spot, weight=Fraction(prices.weight or "1"))


def table_of(prices: Iterable[ModelPrice] | None, fallback: Prices) -> PriceTable:
    """The accounting's price table of a spec (or a history version). Raises ValueError on a malformed number
    (admission refuses those; an object stored past it names its field in the error)."""
    return PriceTable(rates={p.model: _rates(p) for p in prices or ()}, fallback=_rates(fallback))


def pending_since(price_list: GPUPriceList, seen: Mapping[tuple[str, int], int], now: int) -> int:
    """When the current spec generation took effect: the time of the write that changed the spec (the latest
    managed fields entry owning `spec` outside a subresource), else when it was first seen (`seen`, by uid and
    generation), else `now`; in whole seconds, and never before the last version's `since` plus one second."""
    meta = price_list.metadata
    written = [t for e in meta.managed_fields or () if not e.subresource and "f:spec" in (e.fields_v1 or {})
               if (t := parse_time_or_none(e.time)) is not None]
    since = max(written) if written else next_counting_instant(seen.get((meta.uid, meta.generation), now))
    history = price_list.status.history or ()
    last = parse_time_or_none(history[-1].since) if history else None
    return since if last is None else max(since, last + 1_000_000)


def versions_of(price_list: GPUPriceList, seen: Mapping[tuple[str, int], int], now: int) -> list[PriceVersion]:
    """The versions to charge at: the recorded history, and the current spec if the history lacks it."""
    out: list[PriceVersion] = []
    history = price_list.status.history or ()
    for v in history:
        since = parse_time_or_none(v.since)
        if since is not None and (not out or since > out[-1].since):
            out.append(PriceVersion(since=since, table=table_of(v.prices, v.fallback)))
    recorded = max((v.generation for v in history), default=0)
    if price_list.metadata.generation > recorded or not out:
        since = pending_since(price_list, seen, now)
        if not out or since > out[-1].since:
            out.append(PriceVersion(since=since, table=table_of(price_list.spec.prices, price_list.spec.fallback)))
    return out


def history_with(price_list: GPUPriceList, since: int, now: int) -> tuple[PriceVersionStatus, ...]:
    """The history with the current spec appended at `since`, without the versions no window can reach."""
    spec, history = price_list.spec, list(price_list.status.history or ())
    history.append(PriceVersionStatus(since=format_time(since), generation=price_list.metadata.generation,
                                      prices=spec.prices, fallback=spec.fallback))
    while len(history) > 1:
        successor = parse_time_or_none(history[1].since)
        if successor is None or successor > now - HISTORY_HORIZON:
            break
        history.pop(0)
    return tuple(history)
