"""The emulator's `watch_list` option: kube-apiserver with its WatchList feature gate off refuses streaming lists.

Upstream (apimachinery's ListOptions validation, `validateWatchOptions` with `isWatchListFeatureEnabled=false`):
a watch carrying `sendInitialEvents` is answered 422 Invalid for kind ListOptions of group meta.k8s.io, with a
FieldValueForbidden cause on `sendInitialEvents`; any other error of the same request comes in the same Status.
Plain lists and watches are untouched. Our informers then fall back to a paginated list and a plain watch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from waiting import until_holds

from gpuops.kube.client import Client
from gpuops.kube.informer import Informer
from gpuops.kube.resources import CONFIGMAPS
from gpuops_sim.apiserver import APIServer

pytestmark = pytest.mark.anyio

CMS = "/api/v1/namespaces/default/configmaps"
STREAMING = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
             "allowWatchBookmarks": "true"}
GATE = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    async with APIServer(watch_list=False, bookmark_interval=0.5, root_ca_publisher=False) as s:
        yield s


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def get(s: APIServer, path: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(s.url + path, params=params) as r:
        return r.status, json.loads(await r.read())


async def test_streaming_list_refused_as_upstream_without_the_feature_gate(server: APIServer) -> None:
    assert server.watch_list is False
    status, body = await get(server, CMS, STREAMING)
    assert status == 422
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "Invalid"
    assert body["code"] == 422
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: {GATE}'
    assert body["details"]["kind"] == "ListOptions" and body["details"]["group"] == "meta.k8s.io"
    assert body["details"]["causes"] == [
        {"reason": "FieldValueForbidden", "message": f"Forbidden: {GATE}", "field": "sendInitialEvents"}]
    # sendInitialEvents=false is a value too (upstream checks the pointer, not its truth)
    status, body = await get(server, CMS, {**STREAMING, "sendInitialEvents": "false"})
    assert status == 422 and body["details"]["causes"][0]["field"] == "sendInitialEvents"


async def test_every_error_of_the_request_in_one_status(server: APIServer) -> None:
    status, body = await get(server, CMS, {"watch": "true", "sendInitialEvents": "true"})
    assert status == 422
    assert body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires '
        f"setting resourceVersionMatch to NotOlderThan, sendInitialEvents: Forbidden: {GATE}]")
    assert [c["field"] for c in body["details"]["causes"]] == ["resourceVersionMatch", "sendInitialEvents"]


async def test_plain_lists_and_watches_are_served_and_the_gate_switches_at_run_time(server: APIServer) -> None:
    async with aiohttp.ClientSession() as http:
        await http.post(server.url + CMS, json=cm("a"))
        async with http.get(server.url + CMS) as r:
            assert r.status == 200
            listed = await r.json()
        assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
        rv = listed["metadata"]["resourceVersion"]
        async with http.get(server.url + CMS, params={"watch": "true", "resourceVersion": rv,
                                                     "timeoutSeconds": "5"}) as w:
            assert w.status == 200
            await http.post(server.url + CMS, json=cm("b"))
            frame = json.loads(await asyncio.wait_for(w.content.readline(), 5))
            assert frame["type"] == "ADDED" and frame["object"]["metadata"]["name"] == "b"
        server.watch_list = True
        async with http.get(server.url + CMS, params={**STREAMING, "timeoutSeconds": "5"}) as w:
            assert w.status == 200
            names = []
            while True:
                frame = json.loads(await asyncio.wait_for(w.content.readline(), 5))
                if frame["type"] == "BOOKMARK":
                    assert frame["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
                    break
                names.append(frame["object"]["metadata"]["name"])
            assert names == ["a", "b"]


async def test_informer_falls_back_to_a_paginated_list(server: APIServer, tmp_path: Path) -> None:
    server.write_kubeconfig(tmp_path / "kubeconfig")
    client = await Client.from_kubeconfig(str(tmp_path / "kubeconfig"))
    try:
        await client.create(CONFIGMAPS, cm("before"), "default")
        inf = Informer(client, CONFIGMAPS, namespace="default")
        inf.start()
        try:
            assert await inf.wait_synced(10)
            assert inf.store.get("default/before") is not None
            assert (inf.reflector.streaming_lists, inf.reflector.paginated_lists) == (0, 1)
            assert not inf.reflector.streaming  # remembered for this server
            await client.create(CONFIGMAPS, cm("after"), "default")
            await until_holds("the watch after the list", lambda: inf.store.get("default/after") is not None, 10.0)
        finally:
            await inf.stop()
    finally:
        await client.close()
