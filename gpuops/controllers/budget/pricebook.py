"""The price lists as the budget controller reads them, and the history it keeps in their status.

`PriceBook.lookup` answers a budget's question (which list, which versions) from the informer cache, including a
spec generation whose version is not yet in the list's status: a budget never waits for the history write, and
both use the same instant for it (`pricelist.pending_since`, with the first sighting remembered here).
`PriceBook.reconcile` appends the current generation to status.history, so the versions outlive this process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import structlog

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.pricing import PriceVersion
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Request, Result
from gpuops.kube.errors import NotFound
from gpuops.kube.informer import Informer
from gpuops.kube.times import format_time, wall_clock

from .pricelist import PRICE_LISTS, GPUPriceList, history_with, pending_since, table_of, versions_of

__all__ = ["PriceBook", "Priced"]

log = structlog.get_logger("gpuops.controllers.budget")

_SECOND = 1_000_000


@dataclass(frozen=True, slots=True)
class Priced:
    """The price list a budget counts with, and its versions."""

    name: str
    currency: str
    versions: list[PriceVersion]


@dataclass(eq=False)
class PriceBook:
    client: Client
    price_lists: Informer[GPUPriceList]
    clock: Callable[[], int] = wall_clock
    _seen: dict[tuple[str, int], int] = field(default_factory=dict, init=False)
    """When each (uid, generation) was first seen: the `since` of a generation without a managed fields time."""

    def _observe(self, price_list: GPUPriceList, now: int) -> None:
        """Remember when a generation was first seen, by whichever reader sees it first, so every reader takes
        the same instant for it."""
        meta = price_list.metadata
        self._seen.setdefault((meta.uid, meta.generation), now)

    def _forget_deleted(self) -> None:
        """A list was deleted: drop what was remembered of uids no cached list has."""
        live = {p.metadata.uid for p in self.price_lists.store.list()}
        for key in [k for k in self._seen if k[0] not in live]:
            del self._seen[key]

    def chosen(self, name: str | None) -> GPUPriceList | None:
        """The list `name`, or with None the default one (the first by name if several say so)."""
        if name:
            return self.price_lists.store.get(name)
        defaults = sorted((p for p in self.price_lists.store.list() if p.spec.default and
                           not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)
        return defaults[0] if defaults else None

    def lookup(self, name: str | None) -> Priced | str | None:
        """The price list a budget naming `name` (None: the default) counts with; None if there is none; a message
        if it is malformed (stored past admission)."""
        price_list = self.chosen(name)
        if price_list is None:
            return None
        now = self.clock()
        self._observe(price_list, now)
        try:
            versions = versions_of(price_list, self._seen, now)
        except (ValueError, ArithmeticError, AccountingError) as e:
            return f"GPUPriceList {price_list.metadata.name} has a malformed price ({e}); fix its spec"
        return Priced(price_list.metadata.name, price_list.spec.currency, versions)

    async def reconcile(self, req: Request) -> Result | None:
        """Append the current spec to the list's history (once per generation)."""
        price_list = self.price_lists.store.get(req.name)
        if price_list is None:
            self._forget_deleted()
            return None
        meta, status = price_list.metadata, price_list.status
        if status.observed_generation >= meta.generation and status.history:
            return None
        now = self.clock()
        self._observe(price_list, now)
        stamp = format_time(now - now % _SECOND)
        try:
            table_of(price_list.spec.prices, price_list.spec.fallback)
        except (ValueError, ArithmeticError, AccountingError) as e:
            conditions = cond.set_condition(status.conditions, "Ready", "False", "InvalidSpec",
                                            f"a price is malformed ({e}): fix the spec", meta.generation, now=stamp)
            await self._patch(price_list, {"conditions": conditions})
            return None
        since = pending_since(price_list, self._seen, now)
        history = history_with(price_list, since, now)
        conditions = cond.set_condition(status.conditions, "Ready", "True", "Recorded",
                                        f"generation {meta.generation} in force since {format_time(since)}",
                                        meta.generation, now=stamp)
        await self._patch(price_list, {"observedGeneration": meta.generation,
                                       "history": msgspec.to_builtins(history), "conditions": conditions})
        log.info("price list version recorded", price_list=meta.name, generation=meta.generation,
                 since=format_time(since), versions=len(history))
        return None

    async def _patch(self, price_list: GPUPriceList, status: dict[str, object]) -> None:
        meta = price_list.metadata
        try:
            await self.client.patch(PRICE_LISTS, meta.name,
                                    {"metadata": {"resourceVersion": meta.resource_version}, "status": status},
                                    subresource="status")
        except NotFound as e:  # gone: nothing to record (a Conflict raises: the reconcile is retried)
            log.debug("price list history not written", price_list=meta.name, error=str(e))
