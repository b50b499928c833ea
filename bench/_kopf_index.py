"""The bench's controller on kopf, index form (`kopf run ... bench/_kopf_index.py`): the way kopf's documentation
pairs an index with a timer. An index over pods holds each namespace's Running GPU pods; a timer on every
GPUPodCount writes the size of its namespace's entry into status.running when the status shows another number.
kopf starts no handler (timers included) before every index is filled from the initial list."""

from __future__ import annotations

from typing import Any

import kopf
from _framework_spec import GROUP, PLURAL, VERSION, counted
from _kopf_common import TIMER_INTERVAL, configure


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)


def _counted(body: kopf.Body, **_: Any) -> bool:
    return counted(body)


@kopf.index("pods", when=_counted)
async def gpu_running(namespace: str, name: str, **_: Any) -> dict[str, str]:
    """Only pods that pass the filter are indexed; kopf purges a pod's entry once it stops passing (a value of
    None would keep the old entry)."""
    return {namespace: name}


@kopf.timer(GROUP, VERSION, PLURAL, interval=TIMER_INTERVAL)
async def report(namespace: str, status: kopf.Status, patch: kopf.Patch, gpu_running: kopf.Index[str, str],
                 **_: Any) -> None:
    running = len(gpu_running.get(namespace, ()))
    if status.get("running") != running:
        patch.status["running"] = running
