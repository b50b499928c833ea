"""Waiting on conditions with deadlines, for the emulated cluster's tests (no sleep-and-hope)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def wait_for(pred: Callable[[], Any], within: float = 5.0, what: str = "condition") -> Any:
    """Poll `pred` every 5 ms until it is truthy (returned) or `within` seconds pass."""
    deadline = time.monotonic() + within
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
