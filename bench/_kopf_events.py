"""The bench's controller on kopf, event-handler form (`kopf run ... bench/_kopf_events.py`).

`@kopf.on.event` on pods keeps, per namespace, the set of Running GPU pods; `@kopf.on.event` on GPUPodCounts
remembers what each one's status shows. Whenever a namespace's count and its GPUPodCount's status differ, that
namespace's writer task patches the status at once (kopf patches only the object a handler runs for, so the write
goes through kubernetes_asyncio, the async client kopf's documentation points to for other objects). One writer per
namespace, woken by an event and writing the count as it is when it runs, so a burst of pod events costs one write
per round trip rather than one per event, and two writes of one namespace never race.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from _framework_spec import GROUP, PLURAL, VERSION, counted
from _kopf_common import configure
from kubernetes_asyncio import client, config

log = logging.getLogger("bench.kopf_events")

RUNNING: dict[str, set[str]] = {}
"""namespace -> names of its Running GPU pods."""
SHOWN: dict[str, dict[str, int | None]] = {}
"""namespace -> GPUPodCount name -> the status.running it shows (as last seen or written)."""
WAKE: dict[str, asyncio.Event] = {}
WRITERS: set[asyncio.Task[None]] = set()
API: list[client.CustomObjectsApi] = []


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)
    await config.load_kube_config()
    API.append(client.CustomObjectsApi(client.ApiClient()))


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for task in WRITERS:
        task.cancel()
    for api in API:
        await api.api_client.close()


@kopf.on.event("pods")
async def pod_event(type: str | None, namespace: str, name: str, body: kopf.Body, **_: Any) -> None:
    pods = RUNNING.setdefault(namespace, set())
    before = len(pods)
    if type != "DELETED" and counted(body):
        pods.add(name)
    else:
        pods.discard(name)
    if len(pods) != before:
        _wake(namespace)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def count_event(type: str | None, namespace: str, name: str, status: kopf.Status, **_: Any) -> None:
    shown = SHOWN.setdefault(namespace, {})
    if type == "DELETED":
        shown.pop(name, None)
        return
    shown[name] = status.get("running")
    _wake(namespace)


def _wake(namespace: str) -> None:
    wake = WAKE.get(namespace)
    if wake is None:
        wake = WAKE[namespace] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_writer(namespace, wake), name=f"writer-{namespace}")
        WRITERS.add(task)
    wake.set()


async def _writer(namespace: str, wake: asyncio.Event) -> None:
    while True:
        await wake.wait()
        wake.clear()
        shown = SHOWN.get(namespace, {})
        for name in list(shown):
            running = len(RUNNING.get(namespace, ()))
            if shown.get(name, running) == running:
                continue
            try:
                await API[0].patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, name, {"status": {"running": running}},
                    _content_type="application/merge-patch+json")
            except client.ApiException as e:
                log.warning("status write of %s/%s failed: %s", namespace, name, e)
                wake.set()
                await asyncio.sleep(1.0)
                continue
            if name in shown:
                shown[name] = running

