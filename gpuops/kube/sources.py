"""A thread-safe list of metric sources that controllers register while they run (scrapes may come from the
HTTP server's thread; several managers may share one test process)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Sources"]

S = TypeVar("S")


class Sources(Generic[S]):
    def __init__(self) -> None:
        self._items: list[S] = []
        self._lock = threading.Lock()

    def register(self, source: S) -> Callable[[], None]:
        """Start reporting `source`; returns the function that stops it."""
        with self._lock:
            self._items.append(source)

        def unregister() -> None:
            with self._lock:
                if source in self._items:
                    self._items.remove(source)

        return unregister

    def current(self) -> list[S]:
        with self._lock:
            return list(self._items)
