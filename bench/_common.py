"""Helpers every benchmark shares: results files, a server on its own loop thread, machine facts."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

RESULTS = Path(__file__).resolve().parent / "results"
T = TypeVar("T")


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(
    name: str, figures: dict[str, Any], summary_md: str, extra: dict[str, Any], folder: Path = RESULTS
) -> Path:
    """<folder>/<name>.json (machine facts, `figures`, then `extra`) and <folder>/<name>.md.

    `figures`: name -> number, or a scenario's own key -> its dict of name -> number (the README's headline table
    reads top-level numbers only).

    A quick run (`extra["mode"] == "quick"`, what CI does) writes to <folder>/quick/ instead (git-ignored), so it
    never replaces the committed full-run figures that the README's tables quote."""
    if extra.get("mode") == "quick":
        folder = folder / "quick"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"name": name, "machine": machine(), "figures": figures, **extra}, indent=2) + "\n")
    (folder / f"{name}.md").write_text(summary_md.rstrip() + "\n")
    return path


class LoopThread:
    """An asyncio loop on a background thread, so the measured server has its own scheduler."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
