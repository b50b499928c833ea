"""The base of the collectors whose gauges are computed at scrape time from what running controllers register.

A collector is registered with Prometheus once, when its module is imported, while the controllers that feed it
start and stop (several managers may share one test process): so it holds `Sources`, which each controller joins
with `register` (calling what that returns leaves). `describe` lists the same families `collect` fills, empty,
so the registry learns their names without computing a scrape.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .sources import Sources

__all__ = ["SourcedCollector"]

S = TypeVar("S")


class SourcedCollector(Collector, Generic[S]):
    def __init__(self) -> None:
        self.sources: Sources[S] = Sources()
        self.register = self.sources.register

    @abstractmethod
    def families(self) -> dict[str, GaugeMetricFamily]:
        """The collector's families, empty, by a key of the subclass's choosing, in the order they are exposed."""

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(self.families().values())
