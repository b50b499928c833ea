"""What both kopf operators of bench/framework_vs_kopf.py share: kopf's settings, applied at start-up, and the
description of them the bench reports.

Why these settings: posting is off, since kopf would otherwise post a Kubernetes Event per handler outcome (one
per pod event here; our operator posts none); the initial list is streamed (`sendInitialEvents`), as our informer
does against the same emulator; everything else is kopf's default (no worker limit: each object gets a worker task
that lives `idle_timeout` seconds after its last event). Peering is off and the watch cluster-wide through the
command line (`kopf run --standalone --all-namespaces`); `--quiet` logs warnings only, as our operator does.
Every handler is `async`, so kopf never hops to its thread pool.
"""

from __future__ import annotations

from typing import Any

import kopf

TIMER_INTERVAL = 0.5
"""Seconds between the index form's status writes per GPUPodCount (its change-to-status latency is about this)."""

COMMAND = ["run", "--standalone", "--all-namespaces", "--quiet"]


def configure(settings: kopf.OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.watching.initial_streaming = True


def description(form: str) -> dict[str, Any]:
    """What the bench reports about a kopf operator's configuration (`form`: "index" or "events")."""
    settings = kopf.OperatorSettings()
    configure(settings)
    out: dict[str, Any] = {
        "kopf": kopf.__version__,
        "command": "kopf " + " ".join(COMMAND) + f" bench/_kopf_{form}.py",
        "posting.enabled": settings.posting.enabled,
        "watching.initial_streaming": settings.watching.initial_streaming,
        "watching.chunk_size": settings.watching.chunk_size,
        "queueing.worker_limit": settings.queueing.worker_limit,
        "queueing.idle_timeout": settings.queueing.idle_timeout,
        "scanning.disabled": settings.scanning.disabled,
        "persistence": "defaults (unused: on.event, index and timer handlers store no progress)",
        "handlers": "async",
    }
    if form == "index":
        out["design"] = ("@kopf.index('pods') -> {namespace: name} for Running GPU pods; "
                         f"@kopf.timer on GPUPodCount every {TIMER_INTERVAL} s patches status.running "
                         "from the index when it differs")
    else:
        out["design"] = ("@kopf.on.event('pods') keeps per-namespace sets of Running GPU pods; "
                         "@kopf.on.event on GPUPodCount tracks what each shows; one writer task per namespace "
                         "patches status.running (kubernetes_asyncio, merge patch on /status) whenever they differ, "
                         "coalescing bursts")
    return out
