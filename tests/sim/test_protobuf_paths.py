"""For generated objects of several built-in kinds, a create in protobuf and the same create in JSON answer
alike and store identical objects: the decoder hands the server exactly what the JSON decoder does. The
objects come from the wire-format table (canonical Go JSON), sent over real HTTP to the emulated server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protobuf_objects import message
from running_server import RunningServer

from gpuops_sim.apiserver.protobuf import CONTENT_TYPE, encode_object
from gpuops_sim.apiserver.protobuf.table import table

KINDS = [("v1", "ConfigMap", "/api/v1/namespaces/default/configmaps"),
         ("v1", "Secret", "/api/v1/namespaces/default/secrets"),
         ("v1", "ServiceAccount", "/api/v1/namespaces/default/serviceaccounts"),
         ("rbac.authorization.k8s.io/v1", "Role", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"),
         ("coordination.k8s.io/v1", "Lease", "/apis/coordination.k8s.io/v1/namespaces/default/leases"),
         ("scheduling.k8s.io/v1", "PriorityClass", "/apis/scheduling.k8s.io/v1/priorityclasses")]
VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "name")
_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path_factory.mktemp("paths") / "kubeconfig")
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


def _post(server: RunningServer, path: str, body: bytes, ctype: str) -> tuple[int, Any]:
    r = requests.post(server.url + path, data=body, timeout=30,
                      headers={"Content-Type": ctype, "Accept": "application/json",
                               "Authorization": f"Bearer {server.token}"})
    return r.status_code, r.json()


def _keyed(drawn: dict[str, Any]) -> dict[str, Any]:
    """Valid keys for the data maps, so that most examples are admitted and stored, not refused alike."""
    out = dict(drawn)
    for field in ("data", "binaryData", "stringData"):
        if isinstance(out.get(field), dict):
            out[field] = {f"key-{i}": v for i, v in enumerate(out[field].values())}
    return out


def _comparable(answer: Any, name: str) -> Any:
    text = json.dumps(answer).replace(name, "NAME")
    out = json.loads(text)
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k not in VOLATILE}
    return out


@pytest.mark.apiserver_warnings("unknown field", "duplicate field")
@pytest.mark.parametrize(("api_version", "kind", "path"), KINDS, ids=[k for _, k, _ in KINDS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_protobuf_and_json_creates_store_the_same(server: RunningServer, api_version: str, kind: str, path: str,
                                                   data: st.DataObject) -> None:
    found = table().message_for(api_version, kind)
    assert found is not None
    drawn = data.draw(message(found.name, max_depth=3))
    n = next(_names)
    answers = []
    for via in ("json", "protobuf"):
        name = f"{via}-{n}"
        obj = {**_keyed(drawn), "kind": kind, "apiVersion": api_version, "metadata": {"name": name}}
        if via == "json":
            code, answer = _post(server, path, json.dumps(obj).encode(), "application/json")
        else:
            code, answer = _post(server, path, encode_object(obj), CONTENT_TYPE)
        answers.append((code, _comparable(answer, name)))
    assert answers[0] == answers[1]


def test_a_watch_in_protobuf_streams_length_prefixed_watch_events(server: RunningServer) -> None:
    """As a typed Go client receives it: each frame a 4-byte big-endian length, then a WatchEvent whose object
    is a RawExtension holding the enveloped object."""
    from gpuops_sim.apiserver.protobuf import decode_object
    from gpuops_sim.apiserver.protobuf.wire import read_fields

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "watched"}, "data": {"k": "v"}}
    code, created = _post(server, "/api/v1/namespaces/default/configmaps", json.dumps(cm).encode(),
                          "application/json")
    assert code == 201
    r = requests.get(server.url + "/api/v1/namespaces/default/configmaps",
                     params={"watch": "1", "fieldSelector": "metadata.name=watched", "timeoutSeconds": "1"},
                     headers={"Accept": CONTENT_TYPE, "Authorization": f"Bearer {server.token}"}, timeout=30)
    assert r.headers["Content-Type"] == "application/vnd.kubernetes.protobuf;stream=watch"
    body, events = r.content, []
    while body:
        size = int.from_bytes(body[:4], "big")
        frame, body = body[4:4 + size], body[4 + size:]
        fields = {n: v for n, _, v in read_fields(frame)}
        raw = {n: v for n, _, v in read_fields(fields[2])}[1]  # type: ignore[arg-type]
        events.append((fields[1], decode_object(raw)))  # type: ignore[arg-type]
    assert [(t, o["metadata"]["name"], o["data"]) for t, o in events] == [(b"ADDED", "watched", {"k": "v"})]
    assert events[0][1]["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
