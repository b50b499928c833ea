"""Admission webhooks against a real HTTPS webhook server on loopback.

The server is aiohttp with a certificate from a throw-away `trustme` CA, reached either by URL or through a
Service that the resolver maps to the loopback port (TLS server name `hook.gpuops.svc`).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import inspect
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
from aiohttp import web

from gpuops_sim.apiserver.admission import AdmissionRequest, WebhookCaller, admission_review, rule_matches
from gpuops_sim.apiserver.auth import UserInfo
from gpuops_sim.apiserver.errors import StatusError

pytestmark = pytest.mark.anyio

SERVICE_NAME = "hook.gpuops.svc"
Behaviour = Callable[[dict[str, Any]], Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ----------------------------------------------------------------------------------------------------------
# A tiny JSON patch for the tests (the real one lives in gpuops_sim.apiserver.patch, written separately).


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def shim_json_patch(doc: Any, ops: Any) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if op["op"] in ("add", "replace"):
            if isinstance(target, list):
                target.insert(len(target) if last == "-" else int(last), op["value"])
            else:
                if op["op"] == "replace" and last not in target:
                    raise ValueError(f"replace operation does not apply: doc is missing key: {op['path']}")
                target[last] = op["value"]
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


# ----------------------------------------------------------------------------------------------------------
# The webhook server


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    review: dict[str, Any]


@dataclass
class HookServer:
    port: int = 0
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def calls(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        review = json.loads(await request.read())
        self.seen.append(Seen(request.path, dict(request.query), dict(request.headers), review))
        result = self.behaviours[request.path](review)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(result)


def respond(**response: Any) -> Behaviour:
    def behaviour(review: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], **response},
        }

    return behaviour


def b64_patch(ops: list[dict[str, Any]]) -> str:
    return base64.b64encode(json.dumps(ops).encode()).decode()


def add_label(key: str, value: str, **extra: Any) -> Behaviour:
    escaped = key.replace("~", "~0").replace("/", "~1")
    ops = [{"op": "add", "path": f"/metadata/labels/{escaped}", "value": value}]
    return respond(allowed=True, patchType="JSONPatch", patch=b64_patch(ops), **extra)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", SERVICE_NAME).configure_cert(ctx)
    return ctx


@pytest.fixture(scope="module")
def ca_bundle(ca: trustme.CA) -> str:
    return base64.b64encode(ca.cert_pem.bytes()).decode()


@pytest.fixture
async def server(server_ssl: ssl.SSLContext) -> AsyncIterator[HookServer]:
    hs = HookServer()
    app = web.Application()
    app.router.add_post("/{tail:.*}", hs.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
    await site.start()
    hs.port = runner.addresses[0][1]
    try:
        yield hs
    finally:
        hs.release.set()
        await runner.cleanup()


@pytest.fixture
async def caller(server: HookServer) -> AsyncIterator[WebhookCaller]:
    def resolve(namespace: str, name: str, port: int) -> str:
        if namespace == "gpuops" and name != "missing" and port == 443:
            return f"127.0.0.1:{server.port}"
        raise ConnectionError(f'service "{namespace}/{name}" has no reachable endpoint')

    c = WebhookCaller(resolve, json_patch=shim_json_patch)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


# ----------------------------------------------------------------------------------------------------------
# Builders


def webhook(name: str, path: str, ca_bundle: str, **kw: Any) -> dict[str, Any]:
    rule = {
        "operations": list(kw.pop("operations", ["CREATE", "UPDATE"])),
        "apiGroups": list(kw.pop("groups", [""])),
        "apiVersions": list(kw.pop("versions", ["v1"])),
        "resources": list(kw.pop("resources", ["pods"])),
    }
    if "scope" in kw:
        rule["scope"] = kw.pop("scope")
    client: dict[str, Any] = {"caBundle": kw.pop("ca", ca_bundle)}
    if "url" in kw:
        client["url"] = kw.pop("url")
    else:
        client["service"] = {"namespace": "gpuops", "name": kw.pop("service", "hook"), "path": path}
    hook: dict[str, Any] = {
        "name": name,
        "clientConfig": client,
        "rules": [rule],
        "sideEffects": kw.pop("side_effects", "None"),
        "admissionReviewVersions": ["v1"],
    }
    if kw.get("side_effects_absent"):
        kw.pop("side_effects_absent")
        del hook["sideEffects"]
    hook.update(kw)
    return hook


def config(name: str, *hooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": list(hooks),
    }


def pod(name: str = "p", labels: dict[str, str] | None = None, ns: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {"app": "train"})},
        "spec": {"containers": [{"name": "c", "image": "cuda"}]},
    }


ALICE = UserInfo("alice", "uid-a", ("devs", "system:authenticated"))


def pod_request(
    op: str = "CREATE", obj: dict[str, Any] | None = None, old: dict[str, Any] | None = None, **kw: Any
) -> AdmissionRequest:
    ref = obj or old or pod()
    return AdmissionRequest(
        operation=op,
        group="",
        version="v1",
        resource="pods",
        subresource=kw.pop("subresource", ""),
        kind="Pod",
        namespace=ref["metadata"].get("namespace", ""),
        name=ref["metadata"]["name"],
        obj=obj,
        old_obj=old,
        dry_run=kw.pop("dry_run", False),
        user=ALICE,
        **kw,
    )


NS_LABELS = {"kubernetes.io/metadata.name": "team-a", "gpu": "yes"}


# ----------------------------------------------------------------------------------------------------------
# Denials and allowed requests


async def test_validating_denial_carries_the_webhook_status(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    """A denial reads `admission webhook "<name>" denied the request: …` with the response's code and reason."""
    server.behaviours["/deny"] = respond(
        allowed=False, status={"code": 403, "reason": "Forbidden", "message": "GPU budget exhausted"}
    )
    server.behaviours["/invalid"] = respond(
        allowed=False,
        status={
            "code": 422,
            "reason": "Invalid",
            "message": "spec.gpus: must be positive",
            "details": {
                "causes": [
                    {"reason": "FieldValueInvalid", "message": "must be positive", "field": "spec.gpus"}
                ]
            },
        },
    )
    cfg = [config("budgets", webhook("vpod.gpuops.io", "/deny", ca_bundle))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert (e.value.code, e.value.reason) == (403, "Forbidden")
    assert e.value.message == 'admission webhook "vpod.gpuops.io" denied the request: GPU budget exhausted'

    cfg = [config("budgets", webhook("cr.gpuops.io", "/invalid", ca_bundle))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    status = e.value.to_status()
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert (
        status["message"]
        == 'admission webhook "cr.gpuops.io" denied the request: spec.gpus: must be positive'
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": "must be positive", "field": "spec.gpus"}
    ]


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (None, 400, 'admission webhook "v.gpuops.io" denied the request without explanation'),
        ({"code": 200, "message": "no"}, 400, 'admission webhook "v.gpuops.io" denied the request: no'),
        ({"reason": "TooBig"}, 400, 'admission webhook "v.gpuops.io" denied the request: TooBig'),
        ({"code": 409, "message": "busy"}, 409, 'admission webhook "v.gpuops.io" denied the request: busy'),
    ],
)
async def test_denial_codes_below_400_become_400(
    server: HookServer,
    caller: WebhookCaller,
    ca_bundle: str,
    status: dict[str, Any] | None,
    code: int,
    message: str,
) -> None:
    server.behaviours["/deny"] = respond(allowed=False, **({"status": status} if status else {}))
    cfg = [config("c", webhook("v.gpuops.io", "/deny", ca_bundle))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert (e.value.code, e.value.message) == (code, message)


async def test_admission_review_sent_to_a_service(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    server.behaviours["/validate"] = respond(allowed=True)
    old = pod(labels={"app": "old"})
    new = pod()
    req = pod_request(
        "UPDATE",
        obj=new,
        old=old,
        options={"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl"},
    )
    assert (
        await caller.validate([config("c", webhook("v.gpuops.io", "/validate", ca_bundle))], req, NS_LABELS)
        == []
    )
    (seen,) = server.seen
    assert seen.headers["Host"] == "hook.gpuops.svc:443"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.query == {"timeout": "10s"}
    review = seen.review
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    r = review["request"]
    assert len(r.pop("uid")) == 36
    assert r == {
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "p",
        "namespace": "team-a",
        "operation": "UPDATE",
        "userInfo": {"username": "alice", "uid": "uid-a", "groups": ["devs", "system:authenticated"]},
        "object": new,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl"},
    }


def test_admission_review_for_subresources_and_deletes() -> None:
    evict = AdmissionRequest(
        "CREATE",
        "",
        "v1",
        "pods",
        "eviction",
        "Eviction",
        "team-a",
        "p",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": "team-a"}},
        None,
        True,
        ALICE,
        kind_group="policy",
    )
    r = admission_review(evict, "u1")["request"]
    assert r["kind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert r["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert r["subResource"] == r["requestSubResource"] == "eviction"
    assert r["oldObject"] is None and r["dryRun"] is True
    assert r["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "dryRun": ["All"]}
    delete = pod_request("DELETE", old=pod())
    r = admission_review(delete, "u2")["request"]
    assert r["object"] is None and r["oldObject"] == pod()
    assert r["options"] == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}
    ns = AdmissionRequest(
        "CREATE",
        "",
        "v1",
        "namespaces",
        "",
        "Namespace",
        "",
        "team-x",
        {"metadata": {"name": "team-x"}},
        None,
        False,
        ALICE,
    )
    assert admission_review(ns, "u3")["request"]["namespace"] == "team-x"


async def test_url_client_config(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    server.behaviours["/by-url"] = respond(allowed=True, warnings=["deprecated field spec.foo"])
    hook = webhook(
        "u.gpuops.io", "", ca_bundle, url=f"https://127.0.0.1:{server.port}/by-url", timeoutSeconds=5
    )
    assert await caller.validate([config("c", hook)], pod_request(obj=pod()), NS_LABELS) == [
        "deprecated field spec.foo"
    ]
    assert server.seen[0].query == {"timeout": "5s"}


# ----------------------------------------------------------------------------------------------------------
# Mutation


async def test_mutating_webhooks_patch_in_order(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    """Configurations by name, webhooks in order; each sees the previous patch; the input is not mutated."""
    server.behaviours["/first"] = add_label("first", "1", warnings=["from first"])
    server.behaviours["/second"] = add_label("second", "2")
    server.behaviours["/third"] = respond(allowed=True)
    configs = [
        config("b-config", webhook("third.gpuops.io", "/third", ca_bundle)),
        config(
            "a-config",
            webhook("first.gpuops.io", "/first", ca_bundle),
            webhook("second.gpuops.io", "/second", ca_bundle),
        ),
    ]
    original = pod()
    req = pod_request(obj=original)
    warnings: list[str] = []
    out = await caller.mutate(configs, req, NS_LABELS, warnings=warnings)
    assert out is not None
    assert out["metadata"]["labels"] == {"app": "train", "first": "1", "second": "2"}
    assert original == pod() and req.obj is original
    assert [s.path for s in server.seen] == ["/first", "/second", "/third"]
    assert server.seen[1].review["request"]["object"]["metadata"]["labels"] == {"app": "train", "first": "1"}
    assert server.seen[2].review["request"]["object"] == out
    assert warnings == ["from first"]


async def test_mutate_without_change_returns_none(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    server.behaviours["/noop"] = respond(allowed=True)
    server.behaviours["/empty"] = respond(allowed=True, patchType="JSONPatch", patch=b64_patch([]))
    server.behaviours["/same"] = respond(
        allowed=True,
        patchType="JSONPatch",
        patch=b64_patch([{"op": "replace", "path": "/metadata/labels/app", "value": "train"}]),
    )
    cfg = [config("c", *(webhook(f"{p}.gpuops.io", f"/{p}", ca_bundle) for p in ("noop", "empty", "same")))]
    assert await caller.mutate(cfg, pod_request(obj=pod()), NS_LABELS) is None
    assert len(server.seen) == 3


async def test_reinvocation_if_needed(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    """An IfNeeded webhook runs again when a later webhook changed the object; a Never one does not."""
    server.behaviours["/watcher"] = respond(allowed=True)
    server.behaviours["/never"] = respond(allowed=True)
    server.behaviours["/labeler"] = add_label("gpu", "a100")
    configs = [
        config(
            "a",
            webhook("watcher.gpuops.io", "/watcher", ca_bundle, reinvocationPolicy="IfNeeded"),
            webhook("never.gpuops.io", "/never", ca_bundle),
        ),
        config("b", webhook("labeler.gpuops.io", "/labeler", ca_bundle, reinvocationPolicy="IfNeeded")),
    ]
    out = await caller.mutate(configs, pod_request(obj=pod()), NS_LABELS)
    assert out is not None and out["metadata"]["labels"]["gpu"] == "a100"
    assert [s.path for s in server.seen] == ["/watcher", "/never", "/labeler", "/watcher"]
    assert server.seen[-1].review["request"]["object"] == out


async def test_patch_on_delete_is_an_internal_error(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    server.behaviours["/m"] = add_label("x", "y")
    cfg = [config("c", webhook("m.gpuops.io", "/m", ca_bundle, operations=["DELETE"]))]
    with pytest.raises(StatusError) as e:
        await caller.mutate(cfg, pod_request("DELETE", old=pod()), NS_LABELS)
    assert (e.value.code, e.value.reason) == (500, "InternalError")
    assert e.value.message == (
        'Internal error occurred: admission webhook "m.gpuops.io" attempted to modify '
        "the object, which is not supported for this operation"
    )


async def test_patch_that_does_not_apply_is_an_internal_error_even_with_ignore(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    server.behaviours["/m"] = respond(
        allowed=True,
        patchType="JSONPatch",
        patch=b64_patch([{"op": "replace", "path": "/metadata/annotations", "value": {}}]),
    )
    cfg = [config("c", webhook("m.gpuops.io", "/m", ca_bundle, failurePolicy="Ignore"))]
    with pytest.raises(StatusError) as e:
        await caller.mutate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert e.value.code == 500
    assert "replace operation does not apply" in e.value.message


async def test_default_json_patch_module(server: HookServer, ca_bundle: str) -> None:
    server.behaviours["/m"] = add_label("x", "y")
    c = WebhookCaller(lambda ns, name, port: f"127.0.0.1:{server.port}")
    try:
        out = await c.mutate(
            [config("c", webhook("m.gpuops.io", "/m", ca_bundle))], pod_request(obj=pod()), NS_LABELS
        )
    finally:
        await c.close()
    assert out is not None and out["metadata"]["labels"]["x"] == "y"


# ----------------------------------------------------------------------------------------------------------
# Failures and failurePolicy


async def test_unreachable_webhook_fail_and_ignore(
    caller: WebhookCaller, ca_bundle: str, closed_port: int
) -> None:
    """Unreachable + Fail -> 500 InternalError `failed calling webhook`; Ignore -> admitted."""
    url = f"https://127.0.0.1:{closed_port}/validate"
    fail = [config("c", webhook("v.gpuops.io", "", ca_bundle, url=url))]
    for call in (caller.validate, caller.mutate):
        with pytest.raises(StatusError) as e:
            await call(fail, pod_request(obj=pod()), NS_LABELS)
        assert (e.value.code, e.value.reason) == (500, "InternalError")
        assert e.value.message == (
            'Internal error occurred: failed calling webhook "v.gpuops.io": failed to call webhook: '
            f'Post "{url}?timeout=10s": dial tcp 127.0.0.1:{closed_port}: connect: connection refused'
        )
        assert e.value.to_status()["details"]["causes"] == [
            {"message": e.value.message.removeprefix("Internal error occurred: ")}
        ]
    ignore = [config("c", webhook("v.gpuops.io", "", ca_bundle, url=url, failurePolicy="Ignore"))]
    assert await caller.validate(ignore, pod_request(obj=pod()), NS_LABELS) == []
    assert await caller.mutate(ignore, pod_request(obj=pod()), NS_LABELS) is None


async def test_unresolvable_service(caller: WebhookCaller, ca_bundle: str) -> None:
    cfg = [config("c", webhook("v.gpuops.io", "/v", ca_bundle, service="missing"))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert e.value.message == (
        'Internal error occurred: failed calling webhook "v.gpuops.io": failed to call '
        'webhook: service "gpuops/missing" has no reachable endpoint'
    )


async def test_certificate_from_another_ca_is_rejected(server: HookServer, caller: WebhookCaller) -> None:
    server.behaviours["/v"] = respond(allowed=True)
    other = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    cfg = [config("c", webhook("v.gpuops.io", "/v", other))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert e.value.code == 500
    assert e.value.message.endswith("x509: certificate signed by unknown authority")
    assert 'Post "https://hook.gpuops.svc:443/v?timeout=10s"' in e.value.message
    assert server.seen == []


async def test_timeout(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    async def stall(review: dict[str, Any]) -> Any:
        await server.release.wait()
        return respond(allowed=True)(review)

    server.behaviours["/slow"] = stall
    cfg = [config("c", webhook("slow.gpuops.io", "/slow", ca_bundle, timeoutSeconds=1))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert e.value.message.endswith('/slow?timeout=1s": context deadline exceeded')


@pytest.mark.parametrize(
    ("behaviour", "mutating", "detail"),
    [
        (
            lambda r: {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": "x", "allowed": True},
            },
            False,
            'received invalid webhook response: expected response.uid="{uid}", got "x"',
        ),
        (
            lambda r: {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
            False,
            "received invalid webhook response: webhook response was absent",
        ),
        (
            lambda r: {
                "apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview",
                "response": {"uid": r["request"]["uid"], "allowed": True},
            },
            False,
            "received invalid webhook response: expected webhook response of admission.k8s.io/v1, "
            "Kind=AdmissionReview, got admission.k8s.io/v1beta1, Kind=AdmissionReview",
        ),
        (
            add_label("a", "b"),
            False,
            "received invalid webhook response: validating webhook may not return response.patchType",
        ),
        (
            respond(allowed=True, patch=b64_patch([])),
            True,
            "received invalid webhook response: webhook returned response.patch but not response.patchType",
        ),
        (
            respond(allowed=True, patchType="MergePatch", patch=b64_patch([])),
            True,
            'received invalid webhook response: invalid response.patchType "MergePatch"',
        ),
        (
            lambda r: web.Response(status=500, text="boom"),
            False,
            'failed to call webhook: an error on the server ("boom") has prevented the request '
            "from succeeding",
        ),
        (
            lambda r: web.Response(status=404),
            False,
            "failed to call webhook: the server responded with the status code 404 but did not return more "
            "information",
        ),
    ],
)
async def test_bad_responses_are_call_failures(
    server: HookServer,
    caller: WebhookCaller,
    ca_bundle: str,
    behaviour: Behaviour,
    mutating: bool,
    detail: str,
) -> None:
    server.behaviours["/bad"] = behaviour
    call = caller.mutate if mutating else caller.validate
    with pytest.raises(StatusError) as e:
        await call(
            [config("c", webhook("bad.gpuops.io", "/bad", ca_bundle))], pod_request(obj=pod()), NS_LABELS
        )
    uid = server.seen[-1].review["request"]["uid"]
    assert e.value.code == 500
    assert e.value.message == (
        f'Internal error occurred: failed calling webhook "bad.gpuops.io": {detail.format(uid=uid)}'
    )
    ignored = [config("c", webhook("bad.gpuops.io", "/bad", ca_bundle, failurePolicy="Ignore"))]
    await call(ignored, pod_request(obj=pod()), NS_LABELS)


async def test_validating_webhooks_run_concurrently_and_first_in_order_wins(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    both_in = asyncio.Event()
    arrived: list[str] = []

    def gate(msg: str) -> Behaviour:
        async def behaviour(review: dict[str, Any]) -> Any:
            arrived.append(msg)
            if len(arrived) == 2:
                both_in.set()
            await both_in.wait()  # would deadlock if the webhooks were called one after the other
            return respond(allowed=False, status={"code": 403, "message": msg}, warnings=[f"w-{msg}"])(review)

        return behaviour

    server.behaviours["/one"] = gate("one")
    server.behaviours["/two"] = gate("two")
    cfg = [
        config("z", webhook("two.gpuops.io", "/two", ca_bundle)),
        config("a", webhook("one.gpuops.io", "/one", ca_bundle)),
    ]
    warnings: list[str] = []
    with pytest.raises(StatusError) as e:
        await asyncio.wait_for(caller.validate(cfg, pod_request(obj=pod()), NS_LABELS, warnings=warnings), 5)
    assert e.value.message == 'admission webhook "one.gpuops.io" denied the request: one'
    assert warnings == ["w-one", "w-two"]


# ----------------------------------------------------------------------------------------------------------
# Dry run and side effects


async def test_dry_run_and_side_effects(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    server.behaviours["/v"] = respond(allowed=True)
    req = pod_request(obj=pod(), dry_run=True)
    ok = [config("c", webhook("ok.gpuops.io", "/v", ca_bundle, side_effects="NoneOnDryRun"))]
    assert await caller.validate(ok, req, NS_LABELS) == []
    assert server.seen[-1].review["request"]["dryRun"] is True
    some = [
        config("c", webhook("some.gpuops.io", "/v", ca_bundle, side_effects="Some", failurePolicy="Ignore"))
    ]
    with pytest.raises(StatusError) as e:
        await caller.validate(some, req, NS_LABELS)
    assert (e.value.code, e.value.reason, e.value.message) == (
        400,
        "BadRequest",
        'admission webhook "some.gpuops.io" does not support dry run',
    )
    nil = [config("c", webhook("nil.gpuops.io", "/v", ca_bundle, side_effects_absent=True))]
    with pytest.raises(StatusError) as e:
        await caller.mutate(nil, req, NS_LABELS)
    assert e.value.message == (
        'Internal error occurred: failed calling webhook "nil.gpuops.io": Webhook SideEffects is nil'
    )
    assert len(server.seen) == 1
    # Without dry run, sideEffects are not checked.
    assert await caller.validate(some, pod_request(obj=pod()), NS_LABELS) == []


# ----------------------------------------------------------------------------------------------------------
# Matching: rules, namespace and object selectors


def _req(
    op: str = "CREATE",
    group: str = "",
    version: str = "v1",
    resource: str = "pods",
    sub: str = "",
    ns: str = "team-a",
    name: str = "x",
) -> AdmissionRequest:
    return AdmissionRequest(
        op, group, version, resource, sub, "K", ns, name, {"metadata": {"name": name}}, None, False, ALICE
    )


@pytest.mark.parametrize(
    ("rule", "req", "matches"),
    [
        (
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
            _req(),
            True,
        ),
        (
            {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
            _req(),
            False,
        ),
        (
            {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]},
            _req("DELETE"),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["*"]},
            _req(),
            False,
        ),
        ({"operations": ["*"], "apiGroups": [""], "apiVersions": ["v2"], "resources": ["*"]}, _req(), False),
        # "*" is every resource but no subresource; "*/*" everything; "pods/*" pods and all its subresources.
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*"]},
            _req(sub="status"),
            False,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*/*"]},
            _req(sub="status"),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/*"]},
            _req(sub="eviction"),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/*"]},
            _req(),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*/status"]},
            _req(sub="status"),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*/status"]},
            _req(),
            False,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/eviction"]},
            _req(sub="eviction"),
            True,
        ),
        (
            {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
            _req(sub="eviction"),
            False,
        ),
        # scope
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Namespaced",
            },
            _req(),
            True,
        ),
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Namespaced",
            },
            _req(resource="nodes", ns=""),
            False,
        ),
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Namespaced",
            },
            _req(resource="namespaces", ns="", name="team-a"),
            False,
        ),
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Cluster",
            },
            _req(resource="namespaces", ns="", name="team-a"),
            True,
        ),
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Cluster",
            },
            _req(resource="nodes", ns=""),
            True,
        ),
        (
            {
                "operations": ["*"],
                "apiGroups": ["*"],
                "apiVersions": ["*"],
                "resources": ["*"],
                "scope": "Cluster",
            },
            _req(),
            False,
        ),
    ],
)
def test_rule_matching(rule: dict[str, Any], req: AdmissionRequest, matches: bool) -> None:
    assert rule_matches(rule, req) is matches


async def test_webhook_configurations_are_exempt(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    server.behaviours["/deny"] = respond(allowed=False)
    cfg = [config("c", webhook("all.gpuops.io", "/deny", ca_bundle, groups=["*"], resources=["*"]))]
    req = _req(group="admissionregistration.k8s.io", resource="validatingwebhookconfigurations", ns="")
    assert await caller.validate(cfg, req, None) == []
    assert server.seen == []


async def test_namespace_selector(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    server.behaviours["/deny"] = respond(allowed=False, status={"code": 403, "message": "gpu namespace"})
    selector = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
    cfg = [
        config(
            "c",
            webhook(
                "ns.gpuops.io", "/deny", ca_bundle, groups=["*"], resources=["*"], namespaceSelector=selector
            ),
        )
    ]
    with pytest.raises(StatusError):
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert await caller.validate(cfg, pod_request(obj=pod()), {"gpu": "no"}) == []
    # A namespaced object whose namespace is unknown: 404 like upstream's namespace lister.
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), None)
    assert (e.value.code, e.value.message) == (404, 'namespaces "team-a" not found')
    # Cluster-scoped objects are never exempted by a namespaceSelector.
    with pytest.raises(StatusError):
        await caller.validate(cfg, _req(resource="nodes", ns=""), None)
    # A Namespace being created or updated is judged by its own labels.
    ns_obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-x", "labels": {"gpu": "yes"}},
    }
    ns_req = AdmissionRequest(
        "CREATE", "", "v1", "namespaces", "", "Namespace", "", "team-x", ns_obj, None, False, ALICE
    )
    with pytest.raises(StatusError):
        await caller.validate(cfg, ns_req, None)
    ns_obj["metadata"]["labels"] = {"gpu": "no"}
    assert await caller.validate(cfg, ns_req, None) == []
    # Deleting a Namespace uses the stored namespace's labels (what the caller passes).
    del_req = AdmissionRequest(
        "DELETE", "", "v1", "namespaces", "", "Namespace", "", "team-x", None, ns_obj, False, ALICE
    )
    cfg_del = [
        config(
            "c",
            webhook(
                "ns.gpuops.io",
                "/deny",
                ca_bundle,
                operations=["DELETE"],
                resources=["*"],
                namespaceSelector=selector,
            ),
        )
    ]
    assert await caller.validate(cfg_del, del_req, {"gpu": "no"}) == []
    with pytest.raises(StatusError):
        await caller.validate(cfg_del, del_req, {"gpu": "yes"})


async def test_object_selector(server: HookServer, caller: WebhookCaller, ca_bundle: str) -> None:
    server.behaviours["/deny"] = respond(allowed=False, status={"code": 403, "message": "gpu pod"})
    cfg = [
        config(
            "c",
            webhook(
                "obj.gpuops.io",
                "/deny",
                ca_bundle,
                operations=["*"],
                objectSelector={"matchLabels": {"gpuops.io/managed": "true"}},
            ),
        )
    ]
    assert await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS) == []
    managed = pod(labels={"gpuops.io/managed": "true"})
    with pytest.raises(StatusError):
        await caller.validate(cfg, pod_request(obj=managed), NS_LABELS)
    # Either the new or the old object may match: DELETE and label removal are still seen.
    with pytest.raises(StatusError):
        await caller.validate(cfg, pod_request("DELETE", old=managed), NS_LABELS)
    with pytest.raises(StatusError):
        await caller.validate(cfg, pod_request("UPDATE", obj=pod(), old=managed), NS_LABELS)
    bad = [
        config(
            "c",
            webhook(
                "obj.gpuops.io",
                "/deny",
                ca_bundle,
                objectSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]},
            ),
        )
    ]
    with pytest.raises(StatusError) as e:
        await caller.validate(bad, pod_request(obj=pod()), NS_LABELS)
    assert e.value.code == 500


async def test_mutation_changes_which_webhooks_match(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    """Later webhooks' objectSelectors see earlier patches."""
    server.behaviours["/tag"] = add_label("gpuops.io/managed", "true")
    server.behaviours["/seen"] = respond(allowed=True)
    cfg = [
        config("a", webhook("tag.gpuops.io", "/tag", ca_bundle)),
        config(
            "b",
            webhook(
                "seen.gpuops.io",
                "/seen",
                ca_bundle,
                objectSelector={"matchLabels": {"gpuops.io/managed": "true"}},
            ),
        ),
    ]
    await caller.mutate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert [s.path for s in server.seen] == ["/tag", "/seen"]


async def test_selectors_without_requirements_select_everything(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    """`{"matchLabels": {}}` is an empty selector: no namespace lookup, every object matches."""
    server.behaviours["/v"] = respond(allowed=True)
    empty: dict[str, Any] = {"matchLabels": {}, "matchExpressions": []}
    cfg = [
        config("c", webhook("v.gpuops.io", "/v", ca_bundle, namespaceSelector=empty, objectSelector=empty))
    ]
    assert await caller.validate(cfg, pod_request(obj=pod()), None) == []
    assert len(server.seen) == 1


async def test_certificate_for_another_name_is_rejected(
    server: HookServer, caller: WebhookCaller, ca_bundle: str
) -> None:
    """The TLS server name is the Service's DNS name even though the emulator dials loopback."""
    server.behaviours["/v"] = respond(allowed=True)
    cfg = [config("c", webhook("v.gpuops.io", "/v", ca_bundle, service="other"))]
    with pytest.raises(StatusError) as e:
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert e.value.message.endswith("x509: certificate is not valid for other.gpuops.svc")
    assert server.seen == []


async def test_match_conditions_decide_whether_a_webhook_is_called(
    caller: WebhookCaller, ca_bundle: str, closed_port: int
) -> None:
    """matchConditions (GA 1.30): a false condition skips the (unreachable, Fail) webhook; a true one calls it;
    an expression that errors fails the request under Fail and skips the webhook under Ignore."""
    url = f"https://127.0.0.1:{closed_port}/m"
    only_gpu = [{"name": "gpu-pods", "expression": "object.metadata.labels.app == 'gpu'"}]
    cfg = [config("c", webhook("m.gpuops.io", "", ca_bundle, url=url, matchConditions=only_gpu))]
    assert await caller.mutate(cfg, pod_request(obj=pod(labels={"app": "web"})), NS_LABELS) is None
    assert await caller.validate(cfg, pod_request(obj=pod(labels={"app": "web"})), NS_LABELS) == []
    with pytest.raises(StatusError) as e:
        await caller.mutate(cfg, pod_request(obj=pod(labels={"app": "gpu"})), NS_LABELS)
    assert "failed calling webhook" in e.value.message
    by_user = [{"name": "alice", "expression": "request.userInfo.username == 'alice'"}]
    cfg = [config("c", webhook("m.gpuops.io", "", ca_bundle, url=url, matchConditions=by_user))]
    with pytest.raises(StatusError):
        await caller.validate(cfg, pod_request(obj=pod()), NS_LABELS)  # alice: called, unreachable
    broken = [{"name": "broken", "expression": "object.spec.nosuchfield.size() > 0"}]
    cfg = [config("c", webhook("m.gpuops.io", "", ca_bundle, url=url, matchConditions=broken))]
    with pytest.raises(StatusError) as e:
        await caller.mutate(cfg, pod_request(obj=pod()), NS_LABELS)
    assert "match condition 'broken'" in e.value.message
    cfg = [config("c", webhook("m.gpuops.io", "", ca_bundle, url=url, matchConditions=broken,
                               failurePolicy="Ignore"))]
    assert await caller.mutate(cfg, pod_request(obj=pod()), NS_LABELS) is None
