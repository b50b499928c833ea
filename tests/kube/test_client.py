"""gpuops.kube.client against the emulated API server over real HTTP: CRUD, typed errors, patch content
types, watch streams (frames above aiohttp's 2 MiB line limit), write callbacks, metrics, and credentials
from exec plugins."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from gpuops.kube import errors, objects
from gpuops.kube.client import PATCH_CONTENT_TYPES, Client, _batches, _lines
from gpuops.kube.resources import CONFIGMAPS, LEASES, NAMESPACES, PODS, ResourceType
from gpuops_sim.apiserver import APIServer
from gpuops_sim.apiserver.auth import UserInfo

pytestmark = pytest.mark.anyio

WIDGETS: ResourceType[dict[str, Any]] = ResourceType("example.gpuops.io", "v1", "widgets", "Widget", True, dict)
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.gpuops.io"},
    "spec": {
        "group": "example.gpuops.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    async with APIServer() as s:
        yield s


@pytest.fixture
async def client(server: APIServer, tmp_path: Path) -> AsyncIterator[Client]:
    path = tmp_path / "k"
    server.write_kubeconfig(path)
    c = await Client.from_kubeconfig(str(path))
    try:
        yield c
    finally:
        await c.close()


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": dict(data)}


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---------------------------------------------------------------------------------------------- config


async def test_kubeconfig_context_gives_host_and_namespace(server: APIServer, client: Client) -> None:
    assert client.host == server.url
    assert client.namespace == "default"


async def test_proxy_environment_is_read_once_and_honoured(
    server: APIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-request env/netrc lookups are off (they cost two thread hops per request), yet HTTP_PROXY and
    NO_PROXY still decide the route, as client-go's ProxyFromEnvironment does."""
    path = tmp_path / "k"
    server.write_kubeconfig(path)
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("HTTP_PROXY", dead)
    via_proxy = await Client.from_kubeconfig(str(path))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    direct = await Client.from_kubeconfig(str(path))
    try:
        assert via_proxy._rest.proxy == dead and direct._rest.proxy is None
        assert not via_proxy._rest.pool_manager.trust_env and not direct._rest.pool_manager.trust_env
        with pytest.raises(errors.TransportError):  # the (closed) proxy port is really used
            await via_proxy.get(CONFIGMAPS, "nothing", namespace="default")
        with pytest.raises(errors.NotFound):  # straight to the API server
            await direct.get(CONFIGMAPS, "nothing", namespace="default")
    finally:
        await via_proxy.close()
        await direct.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    from kubernetes_asyncio.config import ConfigException

    with pytest.raises(ConfigException):
        await Client.from_kubeconfig(str(tmp_path / "absent"))


async def test_auto_prefers_an_explicit_kubeconfig(server: APIServer, tmp_path: Path) -> None:
    server.write_kubeconfig(tmp_path / "k")
    async with await Client.auto(str(tmp_path / "k")) as c:
        ns = await c.get(NAMESPACES, "default")
        assert ns.metadata.name == "default" and ns.status.phase == "Active"


# ---------------------------------------------------------------------------------------------- CRUD


async def test_configmap_crud(client: Client) -> None:
    created = await client.create(CONFIGMAPS, cm("a", k="v"), "default")
    assert isinstance(created, objects.ConfigMap)
    assert created.metadata.namespace == "default" and created.data == {"k": "v"}
    got = await client.get(CONFIGMAPS, "a", "default")
    assert got.metadata.uid == created.metadata.uid

    got.data = {"k": "w"}
    replaced = await client.replace(CONFIGMAPS, got)
    assert replaced.data == {"k": "w"}
    assert replaced.metadata.resource_version != created.metadata.resource_version

    meta, items = await client.list(CONFIGMAPS, "default")
    assert [i.metadata.name for i in items if i.metadata.name == "a"] == ["a"]
    assert meta.resource_version

    await client.delete(CONFIGMAPS, "a", "default")
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "a", "default")


async def test_create_from_a_model_fills_in_apiversion_and_kind(client: Client) -> None:
    model = objects.ConfigMap(metadata=objects.ObjectMeta(name="m", namespace="default"), data={"x": "1"})
    created = await client.create(CONFIGMAPS, model)
    assert created.data == {"x": "1"}


async def test_list_pages_with_limit_and_continue(client: Client) -> None:
    for i in range(5):
        await client.create(CONFIGMAPS, cm(f"p{i}"), "default")
    names: list[str] = []
    meta, items = await client.list(CONFIGMAPS, "default", limit=2, label_selector="")
    names += [i.metadata.name for i in items]
    while meta.continue_:
        meta, items = await client.list(CONFIGMAPS, "default", limit=2, continue_=meta.continue_)
        names += [i.metadata.name for i in items]
    assert [n for n in names if n.startswith("p")] == [f"p{i}" for i in range(5)]


async def test_pod_crud_and_eviction(client: Client) -> None:
    pod = {
        "metadata": {"name": "worker", "labels": {"app": "train"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}}
            ]
        },
    }
    created = await client.create(PODS, pod, "default")
    assert created.spec.containers is not None
    resources = created.spec.containers[0].resources
    assert resources is not None and resources.requests is not None
    assert str(resources.requests["nvidia.com/gpu"]) == "2"
    _, pods = await client.list(PODS, None, label_selector="app=train")  # all namespaces
    assert [p.metadata.name for p in pods] == ["worker"]
    await client.evict("worker", "default", grace_period_seconds=0)
    try:
        got = await client.get(PODS, "worker", "default")
    except errors.NotFound:
        return
    assert got.metadata.deletion_timestamp  # a graceful deletion in progress is the other valid outcome


async def test_lease_crud_keeps_microtime_strings(client: Client) -> None:
    lease = objects.Lease(
        metadata=objects.ObjectMeta(name="leader", namespace="default"),
        spec=objects.LeaseSpec(
            holder_identity="a",
            lease_duration_seconds=15,
            acquire_time="2025-01-02T03:04:05.123456Z",
            renew_time="2025-01-02T03:04:05.123456Z",
            lease_transitions=0,
        ),
    )
    created = await client.create(LEASES, lease)
    assert created.spec.holder_identity == "a"
    assert created.spec.renew_time == "2025-01-02T03:04:05.123456Z"
    assert created.spec.lease_transitions == 0
    created.spec.holder_identity = "b"
    created.spec.lease_transitions = 1
    updated = await client.replace(LEASES, created)
    assert (updated.spec.holder_identity, updated.spec.lease_transitions) == ("b", 1)
    with pytest.raises(errors.Conflict):
        await client.replace(LEASES, created)  # stale resourceVersion


# ---------------------------------------------------------------------------------------------- errors


async def test_not_found(client: Client) -> None:
    with pytest.raises(errors.NotFound) as ei:
        await client.get(CONFIGMAPS, "absent", "default")
    assert ei.value.status == 404 and ei.value.reason == "NotFound" and ei.value.name == "absent"


async def test_already_exists_is_not_a_conflict(client: Client) -> None:
    await client.create(CONFIGMAPS, cm("dup"), "default")
    with pytest.raises(errors.AlreadyExists) as ei:
        await client.create(CONFIGMAPS, cm("dup"), "default")
    assert not isinstance(ei.value, errors.Conflict) and ei.value.status == 409


async def test_stale_update_and_failed_precondition_are_conflicts(client: Client) -> None:
    created = await client.create(CONFIGMAPS, cm("c"), "default")
    await client.patch(CONFIGMAPS, "c", {"data": {"x": "1"}}, namespace="default")
    with pytest.raises(errors.Conflict) as ei:
        await client.replace(CONFIGMAPS, created)
    assert ei.value.reason == "Conflict"
    with pytest.raises(errors.Conflict):
        await client.delete(CONFIGMAPS, "c", "default", preconditions={"uid": "not-the-uid"})


async def test_invalid_carries_causes(client: Client) -> None:
    with pytest.raises(errors.Invalid) as ei:
        await client.create(CONFIGMAPS, cm("Bad_Name"), "default")
    assert ei.value.status == 422
    assert [c.field for c in ei.value.causes] == ["metadata.name"]
    assert ei.value.causes[0].reason == "FieldValueInvalid"


async def test_gone_for_a_compacted_resource_version(server: APIServer, client: Client) -> None:
    first = await client.create(CONFIGMAPS, cm("g1"), "default")
    await client.create(CONFIGMAPS, cm("g2"), "default")
    server.compact()
    with pytest.raises(errors.Gone) as ei:
        await client.list(
            CONFIGMAPS,
            "default",
            resource_version=first.metadata.resource_version,
            resource_version_match="Exact",
        )
    assert ei.value.status == 410 and ei.value.reason in ("Expired", "Gone")


async def test_forbidden_for_a_service_account_without_rbac(tmp_path: Path) -> None:
    async with APIServer(authorization="RBAC") as s:
        s.write_kubeconfig(tmp_path / "sa", token=s.service_account_token("default", "robot"))
        async with await Client.from_kubeconfig(str(tmp_path / "sa")) as c:
            with pytest.raises(errors.Forbidden) as ei:
                await c.list(PODS, "default")
            assert ei.value.status == 403 and "robot" in ei.value.message
        s.write_kubeconfig(tmp_path / "bogus", token="not-a-token")
        async with await Client.from_kubeconfig(str(tmp_path / "bogus")) as c:
            with pytest.raises(errors.Unauthorized):
                await c.list(PODS, "default")


async def test_too_many_requests_carries_retry_after(server: APIServer, client: Client) -> None:
    server.faults.add_error(429, retry_after=3, count=1)
    with pytest.raises(errors.TooManyRequests) as ei:
        await client.list(CONFIGMAPS, "default")
    assert ei.value.retry_after == 3.0
    await client.list(CONFIGMAPS, "default")  # count=1: the next one goes through


async def test_server_errors(server: APIServer, client: Client) -> None:
    server.faults.add_error(503, count=1)
    with pytest.raises(errors.ServerError) as ei:
        await client.get(CONFIGMAPS, "x", "default")
    assert ei.value.status == 503 and not isinstance(ei.value, errors.ServerTimeout)
    server.faults.add_error(504, count=1)
    with pytest.raises(errors.ServerTimeout):
        await client.get(CONFIGMAPS, "x", "default")


async def test_unsupported_media_type_for_strategic_patch_on_a_custom_resource(client: Client) -> None:
    await client.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=msgspec.json.encode(WIDGET_CRD)
    )
    await client.create(WIDGETS, {"metadata": {"name": "w"}, "spec": {"a": 1}}, "default")
    with pytest.raises(errors.UnsupportedMediaType) as ei:
        await client.patch(WIDGETS, "w", {"spec": {"b": 2}}, namespace="default", patch_type="strategic")
    assert ei.value.status == 415
    merged = await client.patch(WIDGETS, "w", {"spec": {"b": 2}}, namespace="default", patch_type="merge")
    assert merged["spec"] == {"a": 1, "b": 2}


async def test_transport_error_when_the_server_is_down(tmp_path: Path) -> None:
    async with APIServer() as s:
        s.write_kubeconfig(tmp_path / "k")
        host = f"127.0.0.1:{s.port}"
        c = await Client.from_kubeconfig(str(tmp_path / "k"))
    try:
        before = sample("rest_client_requests_total", {"code": "<error>", "method": "GET", "host": host})
        with pytest.raises(errors.TransportError) as ei:
            await c.get(CONFIGMAPS, "x", "default")
        assert ei.value.status == 0
        assert sample("rest_client_requests_total", {"code": "<error>", "method": "GET", "host": host}) == before + 1
    finally:
        await c.close()


async def test_request_timeout_when_the_server_stalls(server: APIServer, client: Client) -> None:
    outage = asyncio.ensure_future(server.outage(1.0, mode="hang"))
    await asyncio.sleep(0)
    with pytest.raises(errors.RequestTimeout):
        await client.request("GET", CONFIGMAPS.path("default"), timeout=0.3)
    await outage


# ---------------------------------------------------------------------------------------------- patches


async def test_every_patch_type_sends_its_content_type(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    original = client._session.request

    async def spy(method: str, url: str, **kw: Any) -> Any:
        if method == "PATCH":
            sent.append(kw["headers"]["Content-Type"])
        return await original(method, url, **kw)

    monkeypatch.setattr(client._session, "request", spy)
    await client.create(CONFIGMAPS, cm("p", a="1"), "default")
    out = await client.patch(CONFIGMAPS, "p", {"data": {"b": "2"}}, namespace="default", patch_type="merge")
    assert out.data == {"a": "1", "b": "2"}
    out = await client.patch(
        CONFIGMAPS, "p", [{"op": "add", "path": "/data/c", "value": "3"}], namespace="default", patch_type="json"
    )
    assert out.data == {"a": "1", "b": "2", "c": "3"}
    out = await client.patch(CONFIGMAPS, "p", {"data": {"d": "4"}}, namespace="default", patch_type="strategic")
    assert out.data is not None and out.data["d"] == "4"
    out = await client.patch(
        CONFIGMAPS, "p", {"data": {"e": "5"}}, namespace="default", patch_type="apply", field_manager="test"
    )
    assert out.data is not None and out.data["e"] == "5"
    yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: p\ndata:\n  f: '6'\n"
    out = await client.patch(
        CONFIGMAPS, "p", yaml, namespace="default", patch_type="apply", field_manager="test", force=True
    )
    assert out.data is not None and out.data["f"] == "6" and "e" not in out.data  # the manager gave up e
    assert sent == [
        PATCH_CONTENT_TYPES["merge"],
        PATCH_CONTENT_TYPES["json"],
        PATCH_CONTENT_TYPES["strategic"],
        PATCH_CONTENT_TYPES["apply"],
        PATCH_CONTENT_TYPES["apply"] + "; charset=utf-8",  # YAML bytes go through the rest client untouched
    ]


async def test_apply_needs_a_field_manager_and_force_needs_apply(client: Client) -> None:
    with pytest.raises(ValueError, match="field_manager"):
        await client.patch(CONFIGMAPS, "p", {"data": {}}, namespace="default", patch_type="apply")
    with pytest.raises(ValueError, match="force"):
        await client.patch(CONFIGMAPS, "p", {"data": {}}, namespace="default", patch_type="merge", force=True)


async def test_status_subresource_patch(client: Client) -> None:
    pod = {"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    await client.create(PODS, pod, "default")
    out = await client.patch(
        PODS, "s", {"status": {"phase": "Running"}}, namespace="default", subresource="status"
    )
    assert out.status.phase == "Running"


# ---------------------------------------------------------------------------------------------- streams


async def test_watch_stream_yields_frames(client: Client) -> None:
    meta, _ = await client.list(CONFIGMAPS, "default")
    await client.create(CONFIGMAPS, cm("w1"), "default")
    await client.create(CONFIGMAPS, cm("w2"), "default")
    query = {"watch": "1", "resourceVersion": meta.resource_version, "timeoutSeconds": "10"}
    got: list[tuple[str, str]] = []
    async with client.stream_lines(CONFIGMAPS.path("default"), query) as lines:
        async for line in lines:
            event = msgspec.json.decode(line)
            got.append((event["type"], event["object"]["metadata"]["name"]))
            if len(got) == 2:
                break
    assert got == [("ADDED", "w1"), ("ADDED", "w2")]


async def test_a_frame_larger_than_2_mib_streams(client: Client) -> None:
    meta, _ = await client.list(CONFIGMAPS, "default")
    big = "x" * (2 * 1024 * 1024 + 4096)
    await client.create(CONFIGMAPS, cm("big", blob=big), "default")
    await client.create(CONFIGMAPS, cm("after"), "default")
    query = {"watch": "1", "resourceVersion": meta.resource_version, "timeoutSeconds": "10"}
    sizes: list[int] = []
    names: list[str] = []
    async with client.stream_lines(CONFIGMAPS.path("default"), query) as lines:
        async for line in lines:
            sizes.append(len(line))
            obj = msgspec.json.decode(line, type=dict[str, Any])["object"]
            names.append(obj["metadata"]["name"])
            if len(names) == 2:
                break
    assert names == ["big", "after"]
    assert sizes[0] > 2 * 1024 * 1024


async def test_stream_errors_raise_before_yielding(client: Client) -> None:
    with pytest.raises(errors.NotFound):
        async with client.stream_lines("/api/v1/namespaces/default/nothings", {"watch": "1"}):
            pytest.fail("entered the stream of a missing resource")


async def test_silent_stream_ends_with_a_read_timeout(client: Client) -> None:
    meta, _ = await client.list(CONFIGMAPS, "default")
    query = {"watch": "1", "resourceVersion": meta.resource_version}
    with pytest.raises(errors.RequestTimeout):
        async with client.stream_lines(CONFIGMAPS.path("default"), query, read_timeout=0.3) as lines:
            async for _ in lines:
                pytest.fail("no event was expected")


class _FakeContent:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


class _FakeResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _FakeContent(chunks)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"n") + b"}"), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    blank=st.booleans(),
)
def test_line_splitting_is_independent_of_chunk_boundaries(frames: list[bytes], cuts: list[int], blank: bool) -> None:
    stream = b"".join(f + b"\n" + (b"\n" if blank else b"") for f in frames)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def collect() -> list[bytes]:
        return [line async for line in _lines(_FakeResponse(chunks), "/x")]  # type: ignore[arg-type]

    expected = [f for f in frames if f.strip()]
    assert asyncio.run(collect()) == expected


def test_a_stream_cut_mid_frame_is_a_transport_error() -> None:
    async def collect() -> list[bytes]:
        return [line async for line in _lines(_FakeResponse([b'{"a":1}\n{"b"']), "/x")]  # type: ignore[arg-type]

    with pytest.raises(errors.TransportError, match="middle of a frame"):
        asyncio.run(collect())



def _batched(chunks: list[bytes]) -> list[list[bytes]]:
    async def collect() -> list[list[bytes]]:
        return [batch async for batch in _batches(_FakeResponse(chunks), "/x")]  # type: ignore[arg-type]

    return asyncio.run(collect())


def test_batches_hold_the_frames_each_chunk_completes() -> None:
    """Several frames in one chunk come as one batch; a frame split across chunks comes with the chunk that
    ends it; chunks completing nothing (or only keep-alive blank lines) yield no batch."""
    big = b'{"big":"' + b"x" * (2 * 1024 * 1024 + 4096) + b'"}'
    chunks = [
        b'{"a":1}\n{"b":2}\n{"c"',  # two whole frames and the start of a third
        b":3",  # completes nothing
        b'}\n\n{"d":4}\n' + big[:1000],  # ends "c", a keep-alive line, "d", starts the big one
        big[1000 : 1024 * 1024],
        big[1024 * 1024 :],
        b"\n \n",  # ends the big frame; a whitespace-only keep-alive line
        b"\n",  # nothing but a blank line: no batch
        b'{"e":5}\n',
    ]
    got = _batched(chunks)
    assert got == [[b'{"a":1}', b'{"b":2}'], [b'{"c":3}', b'{"d":4}'], [big], [b'{"e":5}']]
    assert len(got[2][0]) > 2 * 1024 * 1024
    assert [f for b in got for f in b] == asyncio.run(_collect_lines(chunks))


async def _collect_lines(chunks: list[bytes]) -> list[bytes]:
    return [line async for line in _lines(_FakeResponse(chunks), "/x")]  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"n") + b"}"), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_batches_are_independent_of_chunk_boundaries(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(f + b"\n" for f in frames)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]
    got = _batched(chunks)
    assert all(got)  # never an empty batch
    assert len(got) <= len(chunks)
    assert [f for b in got for f in b] == [f for f in frames if f.strip()]


def test_batches_cut_mid_frame_is_a_transport_error() -> None:
    with pytest.raises(errors.TransportError, match="middle of a frame"):
        _batched([b'{"a":1}\n{"b"'])


async def test_stream_batches_over_http_with_a_frame_larger_than_2_mib(client: Client) -> None:
    meta, _ = await client.list(CONFIGMAPS, "default")
    big = "x" * (2 * 1024 * 1024 + 4096)
    await client.create(CONFIGMAPS, cm("b1"), "default")
    await client.create(CONFIGMAPS, cm("bbig", blob=big), "default")
    await client.create(CONFIGMAPS, cm("b2"), "default")
    query = {"watch": "1", "resourceVersion": meta.resource_version, "timeoutSeconds": "10"}
    names: list[str] = []
    sizes: list[int] = []
    async with client.stream_batches(CONFIGMAPS.path("default"), query) as batches:
        async for batch in batches:
            assert batch
            for frame in batch:
                sizes.append(len(frame))
                names.append(msgspec.json.decode(frame, type=dict[str, Any])["object"]["metadata"]["name"])
            if len(names) >= 3:
                break
    assert names == ["b1", "bbig", "b2"]
    assert sizes[1] > 2 * 1024 * 1024

# ---------------------------------------------------------------------------------------------- callbacks, metrics


async def test_on_write_fires_with_the_written_resource_version(client: Client) -> None:
    seen: list[tuple[str, str, str, str]] = []
    client.on_write.append(lambda rt, ns, name, rv: seen.append((rt.plural, ns, name, rv)))
    created = await client.create(CONFIGMAPS, {"metadata": {"generateName": "gen-"}}, "default")
    name = created.metadata.name
    patched = await client.patch(CONFIGMAPS, name, {"data": {"a": "1"}}, namespace="default")
    replaced = await client.replace(CONFIGMAPS, patched)
    await client.get(CONFIGMAPS, name, "default")  # reads never fire
    await client.delete(CONFIGMAPS, name, "default")
    assert [s[:3] for s in seen] == [("configmaps", "default", name)] * 4
    rvs = [s[3] for s in seen]
    assert rvs[:3] == [
        created.metadata.resource_version,
        patched.metadata.resource_version,
        replaced.metadata.resource_version,
    ]
    assert int(rvs[3]) >= int(rvs[2])


async def test_a_failing_callback_does_not_fail_the_write(client: Client) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("callback bug")

    client.on_write.append(boom)
    created = await client.create(CONFIGMAPS, cm("cb"), "default")
    assert created.metadata.name == "cb"


async def test_metrics_count_requests_by_code_method_and_host(server: APIServer, client: Client) -> None:
    host = f"127.0.0.1:{server.port}"
    ok = {"code": "200", "method": "GET", "host": host}
    missing = {"code": "404", "method": "GET", "host": host}
    created = {"code": "201", "method": "POST", "host": host}
    duration = {"verb": "GET", "host": host}
    before = [sample("rest_client_requests_total", x) for x in (ok, missing, created)]
    before_count = sample("rest_client_request_duration_seconds_count", duration)
    await client.create(CONFIGMAPS, cm("m"), "default")
    await client.get(CONFIGMAPS, "m", "default")
    await client.get(CONFIGMAPS, "m", "default")
    with pytest.raises(errors.NotFound):
        await client.get(CONFIGMAPS, "absent", "default")
    after = [sample("rest_client_requests_total", x) for x in (ok, missing, created)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 1, 1]
    assert sample("rest_client_request_duration_seconds_count", duration) == before_count + 3
    assert REGISTRY.get_sample_value(
        "rest_client_request_duration_seconds_bucket", {"verb": "GET", "host": host, "le": "60.0"}
    ) is not None


# ---------------------------------------------------------------------------------------------- exec credentials

_PLUGIN = """\
import datetime, json, sys
token = open(sys.argv[1]).read().strip()
with open(sys.argv[1] + ".runs", "a") as f:
    f.write("x")
status = {"token": token}
if len(sys.argv) > 2:
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(sys.argv[2]))
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}))
"""


def _exec_kubeconfig(server: APIServer, plugin: Path, token_file: Path, *extra: str) -> str:
    args = json.dumps([str(a) for a in (plugin, token_file, *extra)])
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: sim\n  cluster:\n    server: {server.url}\n"
        "users:\n- name: exec-user\n  user:\n    exec:\n"
        "      apiVersion: client.authentication.k8s.io/v1\n"
        f"      command: {sys.executable}\n"
        f"      args: {args}\n"
        "      interactiveMode: Never\n"
        "contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: exec-user\n    namespace: team-a\n"
        "current-context: sim\n"
    )


async def test_exec_plugin_credentials_authenticate_and_refresh_after_401(tmp_path: Path) -> None:
    async with APIServer(authorization="RBAC") as s:
        plugin = tmp_path / "plugin.py"
        plugin.write_text(_PLUGIN)
        token_file = tmp_path / "token"
        token_file.write_text("exec-token-1")
        s.authn.add_token("exec-token-1", UserInfo("exec-user", groups=("system:masters",)))
        kubeconfig = tmp_path / "exec"
        kubeconfig.write_text(_exec_kubeconfig(s, plugin, token_file))
        async with await Client.from_kubeconfig(str(kubeconfig)) as c:
            assert c.namespace == "team-a"
            await c.list(PODS, "default")  # system:masters through RBAC: the plugin's token was used
            runs = (tmp_path / "token.runs").read_text()
            await c.list(PODS, "default")
            assert (tmp_path / "token.runs").read_text() == runs  # no expiry: the token is reused
            # The token is revoked and the plugin now hands out a new one: one 401, a rerun, success.
            s.authn.remove_token("exec-token-1")
            s.authn.add_token("exec-token-2", UserInfo("exec-user", groups=("system:masters",)))
            token_file.write_text("exec-token-2")
            await c.list(PODS, "default")
            assert len((tmp_path / "token.runs").read_text()) == len(runs) + 1
            s.authn.remove_token("exec-token-2")
            with pytest.raises(errors.Unauthorized):
                await c.list(PODS, "default")  # the plugin's answer is still revoked: no loop


# ---------------------------------------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (400, "BadRequest", errors.BadRequest),
        (401, "Unauthorized", errors.Unauthorized),
        (403, "Forbidden", errors.Forbidden),
        (404, "NotFound", errors.NotFound),
        (405, "MethodNotAllowed", errors.MethodNotAllowed),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (410, "Expired", errors.Gone),
        (415, "UnsupportedMediaType", errors.UnsupportedMediaType),
        (422, "Invalid", errors.Invalid),
        (429, "TooManyRequests", errors.TooManyRequests),
        (500, "InternalError", errors.ServerError),
        (500, "ServerTimeout", errors.ServerTimeout),
        (504, "Timeout", errors.ServerTimeout),
        (413, "RequestEntityTooLarge", errors.ApiError),
    ],
)
def test_error_class_by_status_and_reason(status: int, reason: str, cls: type[errors.ApiError]) -> None:
    status_body = {"kind": "Status", "status": "Failure", "code": status, "reason": reason, "message": "m"}
    body = msgspec.json.encode(status_body)
    err = errors.ApiError.from_response(status, body, {})
    assert type(err) is cls
    assert (err.status, err.reason, err.message, err.body) == (status, reason, "m", body)


def test_retry_after_from_header_or_details() -> None:
    body = msgspec.json.encode(
        {"kind": "Status", "code": 429, "reason": "TooManyRequests", "details": {"retryAfterSeconds": 7}}
    )
    assert errors.ApiError.from_response(429, body, {}).retry_after == 7.0
    assert errors.ApiError.from_response(429, body, {"Retry-After": "2"}).retry_after == 2.0
    assert errors.ApiError.from_response(503, b"", {"Retry-After": "soon"}).retry_after is None


def test_non_status_bodies_from_proxies_keep_a_readable_message() -> None:
    err = errors.ApiError.from_response(502, b"<html>Bad Gateway</html>", {})
    assert isinstance(err, errors.ServerError)
    assert err.reason == "Unknown" and "Bad Gateway" in err.message
    err = errors.ApiError.from_response(404, b"404 page not found\n", {})
    assert isinstance(err, errors.NotFound) and err.reason == "NotFound" and err.message == "404 page not found"


def test_in_cluster_outside_a_pod_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes_asyncio.config import ConfigException

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # as in any process outside a pod

    async def go() -> None:
        await Client.in_cluster()

    with pytest.raises(ConfigException):
        asyncio.run(go())


@pytest.mark.parametrize(("lifetime", "reruns"), [(3600, 0), (5, 2)])
async def test_exec_plugin_reruns_only_when_its_token_nears_expiry(tmp_path: Path, lifetime: int, reruns: int) -> None:
    async with APIServer(authorization="RBAC") as s:
        plugin = tmp_path / "plugin.py"
        plugin.write_text(_PLUGIN)
        token_file = tmp_path / "token"
        token_file.write_text("exec-token")
        s.authn.add_token("exec-token", UserInfo("exec-user", groups=("system:masters",)))
        kubeconfig = tmp_path / "exec"
        kubeconfig.write_text(_exec_kubeconfig(s, plugin, token_file, str(lifetime)))
        async with await Client.from_kubeconfig(str(kubeconfig)) as c:
            loaded = len((tmp_path / "token.runs").read_text())
            await c.list(PODS, "default")
            await c.list(PODS, "default")
            # A token within 10 s of its expirationTimestamp is replaced before use; a fresh one is reused.
            assert len((tmp_path / "token.runs").read_text()) == loaded + reruns
