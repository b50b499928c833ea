"""The HTTP face of the emulator: routing, authentication, authorization, faults and response encoding.

`APIServer` is an async context manager for tests and the body of `gpuops sim apiserver`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import secrets
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiohttp import web

from . import answered_warnings, auth, discovery, namespace_content, openapi, podlog, protobuf, scale, tables
from .admission import WebhookCaller
from .controllers import ControllerLoops
from .crds import crd_resource_infos
from .errors import StatusError, bad_request, internal, method_not_allowed
from .faults import Faults
from .lists import Lister, Page
from .objects import CRD_GR, ObjectAPI, WriteContext, decode_json, scrub_surrogates
from .registry import Registry
from .resources import STREAMING_SUBRESOURCES, ResourceInfo
from .routing import Route, parse_path
from .store import Store
from .tls import make_serving_cert
from .watch import WatchSettings, serve_watch

log = structlog.get_logger("gpuops_sim.apiserver")
_encode = msgspec.json.encode
MAX_BODY = 3 * 1024 * 1024
ENDPOINT_ANNOTATION = "sim.gpuops.io/endpoint"
RBAC_GROUP = "rbac.authorization.k8s.io"


class _StoreRBAC:
    """RBAC objects straight from the store (auth.RBACSource)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def roles(self, namespace: str) -> Iterable[Mapping[str, Any]]:
        return (s.obj for s in self.store.iter((RBAC_GROUP, "roles"), namespace))

    def cluster_roles(self) -> Iterable[Mapping[str, Any]]:
        return (s.obj for s in self.store.iter((RBAC_GROUP, "clusterroles")))

    def role_bindings(self, namespace: str) -> Iterable[Mapping[str, Any]]:
        return (s.obj for s in self.store.iter((RBAC_GROUP, "rolebindings"), namespace))

    def cluster_role_bindings(self) -> Iterable[Mapping[str, Any]]:
        return (s.obj for s in self.store.iter((RBAC_GROUP, "clusterrolebindings")))

    def cluster_role(self, name: str) -> Mapping[str, Any] | None:
        s = self.store.get((RBAC_GROUP, "clusterroles"), "", name)
        return s.obj if s else None

    def role(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        s = self.store.get((RBAC_GROUP, "roles"), namespace, name)
        return s.obj if s else None


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(
    body: Any, status: int = 200, warnings: list[str] | None = None, content_type: str = "application/json"
) -> web.Response:
    headers = {"Content-Type": content_type}
    data = _encode(body) if not isinstance(body, bytes) else body
    if content_type.startswith("application/json"):
        data += b"\n"  # Go's json.Encoder ends every document with a newline, and clients compare bodies
    resp = web.Response(body=data, status=status, headers=headers)
    for w in warnings or []:
        resp.headers.add("Warning", '299 - "' + w.replace('"', '\\"') + '"')
    return resp


def status_response(err: StatusError) -> web.Response:
    body = err.to_status()
    headers = dict(err.headers)
    cont = headers.pop("X-Continue", None)
    if cont:
        body["metadata"] = {"continue": cont}
    resp = _json(body, err.code)
    if err.retry_after is not None:
        resp.headers["Retry-After"] = str(err.retry_after)
    for k, v in headers.items():
        resp.headers[k] = v
    return resp


def _check_resource_route(route: Route, info: ResourceInfo, method: str, query: Mapping[str, str]) -> None:
    """Refuse a path the resource is not served at (404) and a verb its subresource does not serve (405)."""
    # Namespaced resources are reachable without /namespaces/{ns}/ only for lists and watches across all.
    if info.namespaced and not route.namespaced_path and route.resource != "namespaces" and (
        route.name or method != "GET"
    ):
        raise not_found_path()
    if not info.namespaced and route.namespaced_path:
        raise not_found_path()
    sub = route.subresource
    if sub and sub not in info.subresources and not (info.resource == "namespaces" and sub == "finalize"):
        raise not_found_path()
    if sub in STREAMING_SUBRESOURCES and sub in info.subresources:
        raise bad_request(podlog.refused(info.resource, sub))
    if sub in info.subresources:
        # Each subresource serves only its own verbs (eviction/binding: create; status: get/update/patch);
        # anything else must not fall through to the main resource's handler.
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if verb.get(method) not in info.subresources[sub][1] or (method == "GET" and "watch" in query):
            raise method_not_allowed()


def _expected_body(info: ResourceInfo, sub: str) -> tuple[str, str]:
    """The (apiVersion, kind) a write's body has at this endpoint."""
    if sub == "scale":
        return (scale.SCALE_API_VERSION, "Scale")
    return (info.group_version, info.subresources[sub][0] if sub in info.subresources else info.kind)



class APIServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        authorization: str = "AlwaysAllow",
        admin_token: str | None = None,
        anonymous: bool = True,
        history_size: int = 100_000,
        history_age: float = 300.0,
        bookmark_interval: float = 60.0,
        watch_timeout: float = 1800.0,
        continue_ttl: float = 300.0,
        watcher_buffer: int = 200_000,
        seed_namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
        terminated_pod_gc_threshold: int | None = None,
        tls: bool = False,
        watch_list: bool = True,
        root_ca_publisher: bool = True,
    ) -> None:
        """`watch_list`: serve streaming lists (watch with `sendInitialEvents`), as kube-apiserver does with its
        WatchList feature gate on; False refuses them as a server with the gate off does (the `watch_list`
        property switches it while the server runs). `root_ca_publisher=False` leaves namespaces without the
        kube-root-ca.crt ConfigMap, as kube-controller-manager does with
        `--controllers=*,-root-ca-cert-publisher` (for tests that count a namespace's ConfigMaps)."""
        self.root_ca_publisher = root_ca_publisher
        if authorization not in ("AlwaysAllow", "RBAC"):
            raise ValueError("authorization: must be 'AlwaysAllow' or 'RBAC'")
        self.host = host
        self.port = port
        # kubectl sends bearer tokens only over TLS: serve HTTPS with a CA of our own when asked.
        self.serving_cert = make_serving_cert([host, "localhost", "127.0.0.1"]) if tls else None
        self.store = Store(history_size=history_size, history_age=history_age, watcher_buffer=watcher_buffer)
        self.registry = Registry()
        self._init_auth(authorization, admin_token, anonymous)
        self._init_outside_hooks()
        self._init_handlers(
            continue_ttl, WatchSettings(bookmark_interval, watch_timeout, watch_list), terminated_pod_gc_threshold
        )
        self._seed(seed_namespaces)

    def _init_auth(self, authorization: str, admin_token: str | None, anonymous: bool) -> None:
        """Authentication (the admin's token, anonymous requests if allowed) and authorization."""
        self.authorization = authorization
        self.admin_token = admin_token or secrets.token_urlsafe(24)
        self.authn = auth.Authenticator(allow_anonymous=anonymous)
        self.authn.add_token(self.admin_token, auth.UserInfo("admin", groups=("system:masters",)))
        self.rbac = _StoreRBAC(self.store)
        # Called with every authorization decision (allowed or not, RBAC or AlwaysAllow), in request order: the
        # emulator's audit log, e.g. to prove a ServiceAccount never met a 403 or to replay its requests.
        self.audit_hooks: list[Callable[[auth.Decision], None]] = []

    def _init_outside_hooks(self) -> None:
        """What the emulated cluster around the server provides: how Services are reached, the pods' output."""
        self.service_endpoints: dict[tuple[str, str], str] = {}
        # How a webhook Service is reached when the emulated cluster routes Services itself (its pod network):
        # (namespace, name, port) -> host:port, None when that network does not know the Service.
        self.service_resolver: Callable[[str, str, int], str | None] | None = None
        # The output of containers that really run (the emulated kubelet's process runtime), for pods/log:
        # (namespace, pod, container, previous) -> text, None for a container that never ran as a process.
        self.pod_log_source: Callable[[str, str, str, bool], str | None] | None = None

    def _init_handlers(
        self, continue_ttl: float, watch_settings: WatchSettings, terminated_pod_gc_threshold: int | None
    ) -> None:
        """The object API with its webhooks, lists, watches, the built-in controllers, and the serving state."""
        self.webhooks = WebhookCaller(self._resolve_service)
        self.api = ObjectAPI(self.store, self.registry, self.webhooks)
        self.api.on_crd_change.append(self._crd_changed)
        self.api.on_namespace_created.append(self.fill_namespace)
        self.lister = Lister(self.store, continue_ttl=continue_ttl)
        self.watch_settings = watch_settings
        self.controllers = ControllerLoops(self.api, terminated_pod_gc_threshold)
        self.faults = Faults()
        self.requests_total = 0
        self._streams: set[web.StreamResponse] = set()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._openapi_cache: dict[tuple[int, str], dict[str, Any]] = {}
        self._answering = asyncio.Event()
        self._answering.set()

    # ------------------------------------------------------------------------------------ lifecycle

    @functools.cached_property
    def cluster_ca_pem(self) -> str:
        """The CA a pod would trust for the API server (published in every namespace's kube-root-ca.crt):
        the serving CA over TLS, else a CA of its own, as every cluster has one."""
        cert = self.serving_cert or make_serving_cert(["localhost"])
        return cert.ca_pem.decode()

    def fill_namespace(self, namespace: str) -> None:
        """The default ServiceAccount and kube-root-ca.crt of a namespace (see namespace_content)."""
        ca = self.cluster_ca_pem if self.root_ca_publisher else None
        namespace_content.fill_namespace(self.store, namespace, ca, _now_text())

    def _seed(self, namespaces: Iterable[str]) -> None:
        now = _now_text()
        import uuid

        for ns in namespaces:
            self.store.put(
                ("", "namespaces"),
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": ns,
                        "uid": str(uuid.uuid4()),
                        "creationTimestamp": now,
                        "labels": {"kubernetes.io/metadata.name": ns},
                    },
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                },
            )
        for ns in namespaces:
            self.fill_namespace(ns)
        roles, bindings = auth.bootstrap_policy()
        for r in roles:
            r["metadata"].setdefault("uid", str(uuid.uuid4()))
            r["metadata"].setdefault("creationTimestamp", now)
            self.store.put((RBAC_GROUP, "clusterroles"), r)
        for b in bindings:
            b["metadata"].setdefault("uid", str(uuid.uuid4()))
            b["metadata"].setdefault("creationTimestamp", now)
            self.store.put((RBAC_GROUP, "clusterrolebindings"), b)

    @property
    def watch_list(self) -> bool:
        """Whether streaming lists are served (kube-apiserver's WatchList feature gate); settable at run time:
        watches opened from then on are judged by the new value."""
        return self.watch_settings.watch_list

    @watch_list.setter
    def watch_list(self, enabled: bool) -> None:
        self.watch_settings.watch_list = enabled

    @property
    def url(self) -> str:
        scheme = "https" if self.serving_cert else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY + 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await self._listen()
        if self.store.get(("", "namespaces"), "", "default") is not None:
            namespace_content.seed_kubernetes_service(self.store, self.port, _now_text())
        self.controllers.start()
        self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())

    async def _listen(self) -> None:
        assert self._runner is not None
        ssl_context = self.serving_cert.server_context() if self.serving_cert else None
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=ssl_context)
        await self._site.start()
        if self.port == 0:
            server = self._site._server
            assert server is not None
            sockets = getattr(server, "sockets", None)
            assert sockets
            self.port = int(sockets[0].getsockname()[1])

    async def _unlisten(self) -> None:
        self.drop_watches()
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for conn in list(self._runner.server.connections):
                conn.force_close()

    async def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        await self.controllers.stop()
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.webhooks.close()

    async def __aenter__(self) -> APIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.store.expire_history()

    # ------------------------------------------------------------------------------------ chaos switches

    def drop_watches(self) -> int:
        watchers = self.store.all_watchers()
        for w in watchers:
            w.close()
        return len(watchers)

    def compact(self) -> int:
        return self.store.compact()

    async def outage(self, seconds: float, mode: str = "refuse") -> None:
        """Stop answering for `seconds`, then carry on with the same state on the same port.

        mode "refuse": the port is closed (a crashed or restarting apiserver: connections refused);
        mode "hang": connections are accepted but nothing is answered until the end (a stalled apiserver,
        e.g. waiting on etcd), so clients meet their own timeouts.
        """
        if mode not in ("refuse", "hang"):
            raise ValueError("mode: must be 'refuse' or 'hang'")
        if mode == "hang":
            self._answering.clear()
            self.drop_watches()
            try:
                await asyncio.sleep(seconds)
            finally:
                self._answering.set()
            return
        await self._unlisten()
        await asyncio.sleep(seconds)
        await self._listen()

    async def restart(self) -> None:
        await self.outage(0.0)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.store.dump())

    def restore(self, path: str | Path) -> None:
        self.drop_watches()
        self.store.load(Path(path).read_bytes())
        for crd in list(self.registry.all()):
            if crd.is_custom:
                self.registry.remove_crd(crd.crd_name)
        for s in self.store.iter(CRD_GR):
            self._crd_changed(s.obj, False)

    # ------------------------------------------------------------------------------------ helpers

    def _crd_changed(self, crd: dict[str, Any], deleted: bool) -> None:
        name = crd["metadata"]["name"]
        if deleted:
            self.registry.remove_crd(name)
        else:
            self.registry.set_crd(name, crd_resource_infos(crd))
        self._openapi_cache.clear()

    def _resolve_service(self, namespace: str, name: str, port: int) -> str:
        if (namespace, name) in self.service_endpoints:
            return self.service_endpoints[(namespace, name)]
        if self.service_resolver is not None:
            routed = self.service_resolver(namespace, name, port)
            if routed is not None:
                return routed
        svc = self.store.get(("", "services"), namespace, name)
        if svc is not None:
            ep = (svc.obj["metadata"].get("annotations") or {}).get(ENDPOINT_ANNOTATION)
            if ep:
                return str(ep)
        raise ConnectionError(f'service "{namespace}/{name}" has no reachable endpoint')

    def service_account_token(self, namespace: str, name: str) -> str:
        return self.authn.service_account_token(namespace, name)

    def pod_token(self, pod: Mapping[str, Any]) -> str:
        """The token a kubelet projects into a pod: its ServiceAccount's, bound to the pod and its node (so node
        confinement policies see which node an agent runs on). Kubelet-requested tokens are extended to a year by
        kube-apiserver, and this one does not expire either, as the process cannot re-read a rotated file."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        namespace, account = str(meta.get("namespace", "default")), str(spec.get("serviceAccountName") or "default")
        found = self.store.get(("", "serviceaccounts"), namespace, account)
        account_uid = str(found.obj["metadata"].get("uid", "")) if found is not None else ""

        def bound(kind: str, ns: str, obj_name: str) -> Mapping[str, Any] | None:
            got = self.store.get(("", "nodes") if kind == "Node" else ("", "pods"), ns, obj_name)
            return got.obj if got is not None else None

        extra = auth.pod_bound_extra(pod, bound)
        return self.authn.service_account_token(namespace, account, account_uid, extra=extra)

    def _token_request(self, info: ResourceInfo, ns: str, name: str, body: Any) -> dict[str, Any]:
        """POST serviceaccounts/{name}/token: the ServiceAccount must exist (404 otherwise)."""
        service_account = self.api.get(info, ns, name).obj

        def bound(kind: str, namespace: str, obj_name: str) -> Mapping[str, Any] | None:
            gr = {"Pod": ("", "pods"), "Secret": ("", "secrets"), "Node": ("", "nodes")}[kind]
            got = self.store.get(gr, namespace, obj_name)
            return got.obj if got is not None else None

        return auth.token_request(body, service_account, self.authn, bound)

    def _audit(self, attrs: auth.Attributes, allowed: bool, reason: str) -> None:
        """Tell the audit hooks about an authorization decision (a hook must never fail a request)."""
        for hook in self.audit_hooks:
            try:
                hook(auth.Decision(attrs, allowed, reason))
            except Exception:
                log.exception("audit hook failed")

    def _authorize(self, attrs: auth.Attributes) -> tuple[bool, str]:
        """The configured authorizer's decision (RBAC, or AlwaysAllow), told to the audit hooks."""
        allowed, reason = auth.authorize(attrs, self.rbac) if self.authorization == "RBAC" else (True, "")
        self._audit(attrs, allowed, reason)
        return allowed, reason

    def kubeconfig(self, token: str | None = None, user: str = "admin", namespace: str = "default") -> str:
        ca = ""
        if self.serving_cert is not None:
            ca = f"    certificate-authority-data: {base64.b64encode(self.serving_cert.ca_pem).decode()}\n"
        return (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: gpuops-sim\n  cluster:\n    server: {self.url}\n{ca}"
            f"users:\n- name: {user}\n  user:\n    token: {token or self.admin_token}\n"
            f"contexts:\n- name: gpuops-sim\n  context:\n    cluster: gpuops-sim\n    user: {user}\n"
            f"    namespace: {namespace}\n"
            "current-context: gpuops-sim\n"
        )

    def write_kubeconfig(self, path: str | Path, token: str | None = None) -> None:
        p = Path(path)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(self.kubeconfig(token))
        tmp.chmod(0o600)
        tmp.replace(p)  # atomically: a reader never sees half a file

    # ------------------------------------------------------------------------------------ request entry

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests_total += 1
        if not self._answering.is_set() and not request.path.startswith("/sim/"):
            await self._answering.wait()
        response = await self._answer(request)
        warnings = response.headers.getall("Warning", None)
        if warnings:
            answered_warnings.report(request.method, request.path_qs, response.status, warnings)
        return response

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except StatusError as e:
            return status_response(e)
        except web.HTTPRequestEntityTooLarge:
            return status_response(
                StatusError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}")
            )
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:  # a request must never take the server down
            log.exception("request failed", method=request.method, path=request.path)
            return status_response(internal(f"{type(e).__name__}: {e}"))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        user = self.authn.authenticate(request.headers.get("Authorization"))
        if user is None:
            raise auth.unauthorized()
        try:
            user = auth.impersonate(user, request.headers.items(), self._authorize)
        except auth.ImpersonationHeaderError as e:
            return web.Response(
                status=500,
                text=e.response_text(request.raw_path),
                content_type="text/plain",
                headers={"X-Content-Type-Options": "nosniff"},
            )
        if path.startswith("/sim/"):
            if "system:masters" not in user.groups:
                raise StatusError(403, "Forbidden", "the emulator's control endpoints need the admin token")
            return await self._control(request)
        query = {k: v for k, v in request.query.items()}
        attrs = auth.request_attributes(user, request.method, path, query)
        allowed, reason = self._authorize(attrs)
        if not allowed:
            raise auth.forbidden(attrs, reason)
        if attrs.resource_request:
            if self.faults.latency:
                await asyncio.sleep(self.faults.latency)
            self.faults.check(attrs.verb, attrs.resource)
        route = parse_path(path)
        if route is None:
            return await self._non_resource(request, path)
        if not route.resource:
            return self._group_version_discovery(route, request)
        info = self.registry.lookup(route.group, route.version, route.resource)
        if info is None:
            raise not_found_path()
        return await self._resource(request, route, info, user, query)

    # ------------------------------------------------------------------------------------ non-resource

    async def _non_resource(self, request: web.Request, path: str) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise method_not_allowed()
        # The generated Python clients ask for /api/, /apis/, /apis/{group}/ and /version/.
        path = path.rstrip("/") or path
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return _json(discovery.version_info())
        accept = request.headers.get("Accept")
        if path in ("/api", "/apis"):
            fmt, ctype = discovery.negotiate_discovery(accept)
            infos = self.registry.all()
            if fmt != "legacy":
                return _json(
                    discovery.aggregated_discovery(infos, core=path == "/api", version=fmt),
                    content_type=ctype,
                )
            if path == "/api":
                return _json(discovery.api_versions())
            return _json(discovery.api_group_list(infos))
        if path.startswith("/apis/") and path.count("/") == 2:
            group = path.split("/")[2]
            groups = discovery.api_group_list(self.registry.all())
            for g in groups.get("groups", []):
                if g.get("name") == group:
                    return _json({"kind": "APIGroup", "apiVersion": "v1", **g})
            raise not_found_path()
        if path == "/openapi/v3":
            return _json(openapi.openapi_v3_index(self.registry.all()))
        if path.startswith("/openapi/v3/"):
            gv_path = path[len("/openapi/v3/") :]
            gv = gv_path[len("api/") :] if gv_path.startswith("api/") else gv_path[len("apis/") :]
            key = (self.registry.generation, gv)
            doc = self._openapi_cache.get(key)
            if doc is None:
                doc = openapi.openapi_v3_group_version(self.registry.all(), gv)
                if doc is None:
                    raise not_found_path()
                self._openapi_cache[key] = doc
            return _json(doc)
        raise not_found_path()

    def _group_version_discovery(self, route: Route, request: web.Request) -> web.Response:
        gv = f"{route.group}/{route.version}" if route.group else route.version
        doc = discovery.api_resource_list(self.registry.all(), gv)
        if doc is None:
            raise not_found_path()
        return _json(doc)

    # ------------------------------------------------------------------------------------ control

    async def _control(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/sim/faults":
            raise not_found_path()
        if request.method == "GET":
            return _json(
                dict(
                    self.faults.describe(),
                    resourceVersion=self.store.rv,
                    compactedResourceVersion=self.store.compacted_rv,
                )
            )
        if request.method != "POST":
            raise method_not_allowed()
        body = decode_json(await request.read())
        if not isinstance(body, dict) or "action" not in body:
            raise bad_request(
                'body: need {"action": "error"|"latency"|"clear"|"drop-watches"|"compact"|'
                '"outage"|"restart"|"snapshot"|"restore", ...}'
            )
        action = body["action"]
        result: dict[str, Any] = {"action": action}
        try:
            if action == "error":
                self.faults.add_error(
                    int(body["code"]),
                    float(body.get("rate", 1.0)),
                    verbs=body.get("verbs"),
                    resources=body.get("resources"),
                    retry_after=body.get("retryAfter"),
                    count=body.get("count"),
                )
            elif action == "latency":
                self.faults.latency = float(body["seconds"])
            elif action == "clear":
                self.faults.clear()
            elif action == "drop-watches":
                result["dropped"] = self.drop_watches()
            elif action == "compact":
                result["compactedResourceVersion"] = self.compact()
            elif action in ("outage", "restart"):
                seconds = float(body.get("seconds", 0.0)) if action == "outage" else 0.0
                mode = str(body.get("mode", "refuse"))
                if mode not in ("refuse", "hang"):
                    raise ValueError("mode: must be 'refuse' or 'hang'")
                # Answer first, then go dark: the caller learns the outage started.
                asyncio.get_running_loop().call_later(
                    0.05, lambda: asyncio.ensure_future(self.outage(seconds, mode))
                )
                result["seconds"] = seconds
                result["mode"] = mode
            elif action == "snapshot":
                self.save(str(body["path"]))
            elif action == "restore":
                self.restore(str(body["path"]))
            else:
                raise bad_request(f"action: unsupported value {action!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise bad_request(f"invalid fault request: {e}") from None
        return _json(result)

    # ------------------------------------------------------------------------------------ resources

    async def _read_body(self, request: web.Request, expect: tuple[str, str] = ("", "")) -> Any:
        """The JSON, YAML or (for built-in kinds) protobuf body. `expect` is the (apiVersion, kind) the URL
        implies, which fills a protobuf envelope that names none, as upstream's decoder defaults them."""
        raw = await request.read()
        if len(raw) > MAX_BODY:
            raise StatusError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}")
        ctype = (request.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()
        if request.method == "PATCH" and not ctype.endswith(("patch+json", "patch+yaml")):
            return None  # ObjectAPI.patch answers 415 listing the patch types this resource accepts
        if ctype == protobuf.CONTENT_TYPE:
            try:
                return protobuf.decode_object(raw, *expect)
            except protobuf.DecodeError as e:
                raise bad_request(str(e)) from None
        if ctype.endswith("yaml"):
            import yaml

            try:
                loaded = yaml.safe_load(raw.decode("utf-8")) if raw else None
                # Round trip through JSON: YAML-only values (dates, binary, non-string keys) become JSON ones.
                return decode_json(_encode(scrub_surrogates(loaded)))
            except (yaml.YAMLError, UnicodeDecodeError, TypeError, ValueError, msgspec.EncodeError) as e:
                raise bad_request(f"error converting YAML to JSON: {e}") from None
        if ctype != "application/json" and not ctype.endswith("+json"):
            # CBOR bodies are not emulated: answer as the apiserver answers an unknown format, not with a
            # JSON decode error.
            raise StatusError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json, application/yaml, application/vnd.kubernetes.protobuf",
            )
        if not raw:
            raise bad_request("the body of the request is empty")
        return decode_json(raw)

    def _context(self, request: web.Request, user: auth.UserInfo, query: Mapping[str, str]) -> WriteContext:
        dry = query.get("dryRun")
        if dry not in (None, "", "All"):
            raise bad_request(f'dryRun: Unsupported value: "{dry}": supported values: "All"')
        fv = query.get("fieldValidation", "")
        if fv not in ("", "Strict", "Warn", "Ignore"):
            raise bad_request(
                f'fieldValidation: Unsupported value: "{fv}": supported values: "Ignore", "Strict", "Warn"'
            )
        manager = query.get("fieldManager", "")
        if (
            (not manager
            and request.method != "PATCH")
            or (request.method == "PATCH" and not manager and "apply-patch" not in request.content_type)
        ):
            ua = request.headers.get("User-Agent", "")
            manager = ua.split("/")[0] if ua else "unknown"
        return WriteContext(user, dry_run=dry == "All", field_manager=manager, field_validation=fv)

    async def _resource(
        self,
        request: web.Request,
        route: Route,
        info: ResourceInfo,
        user: auth.UserInfo,
        query: dict[str, str],
    ) -> web.StreamResponse:
        method = request.method
        _check_resource_route(route, info, method, query)
        if info.create_only:
            if method != "POST" or route.name:
                raise method_not_allowed()
            return await self._review(request, info, user)
        ns = route.namespace if info.namespaced else ""
        if info.storage_key == ("", "namespaces"):
            ns = ""
        if method == "GET":
            return await self._read(request, route, info, ns, query)
        ctx = self._context(request, user, query)
        if method == "POST":
            return await self._post(request, route, info, ns, ctx)
        if method == "PUT":
            return await self._put(request, route, info, ns, ctx)
        if method == "PATCH":
            return await self._patch(request, route, info, ns, query, ctx)
        if method == "DELETE":
            return await self._delete(request, route, info, ns, query, ctx)
        raise method_not_allowed()

    async def _read(
        self, request: web.Request, route: Route, info: ResourceInfo, ns: str, query: dict[str, str]
    ) -> web.StreamResponse:
        """GET: a watch, one object (or its scale or log), or a list."""
        name, sub = route.name, route.subresource
        # Query booleans as upstream decodes them: anything but "0"/"false" is true (Python clients send "True").
        if route.legacy_watch or query.get("watch", "0").lower() not in ("0", "false"):
            q = dict(query)
            if name:
                q["fieldSelector"] = ",".join(f for f in (query.get("fieldSelector", ""), f"metadata.name={name}") if f)
            return await self._watch(request, info, ns if route.namespaced_path or not info.namespaced else None, q)
        if name:
            await self._wait_fresh(query.get("resourceVersion"))
            if sub == "scale":
                return self._answerer(request, info)(scale.scale_of(info, self.api.get(info, ns, name).obj), 200, None)
            if sub == "log":
                text = podlog.pod_log(self.api.get(info, ns, name).obj, query, self.pod_log_source)
                return web.Response(text=text, content_type="text/plain")
            return self._get(request, info, ns, name)
        return await self._list(request, info, ns if route.namespaced_path else None, query)

    async def _post(
        self, request: web.Request, route: Route, info: ResourceInfo, ns: str, ctx: WriteContext
    ) -> web.StreamResponse:
        """POST: a create, or a subresource that creates (eviction, binding, a ServiceAccount's token)."""
        name, sub = route.name, route.subresource
        answer = self._answerer(request, info)
        body = await self._read_body(request, _expected_body(info, sub))
        if sub == "eviction":
            return answer(await self.api.evict(ns, name, body, ctx), 201, ctx.warnings)
        if sub == "binding":
            return answer(await self.api.bind(ns, name, body, ctx), 201, ctx.warnings)
        if sub == "token" and info.storage_key == ("", "serviceaccounts"):
            return answer(self._token_request(info, ns, name, body), 201, None)
        if name:
            raise method_not_allowed()
        obj = await self.api.create(info, ns, body, ctx)
        return answer(obj, 201, ctx.warnings)

    async def _put(
        self, request: web.Request, route: Route, info: ResourceInfo, ns: str, ctx: WriteContext
    ) -> web.StreamResponse:
        """PUT: an update of an object, its status or scale, or a namespace's finalizers."""
        name, sub = route.name, route.subresource
        answer = self._answerer(request, info)
        if not name:
            raise method_not_allowed()
        body = await self._read_body(request, _expected_body(info, sub))
        if sub == "scale":
            return answer(await scale.write_scale(self.api, info, ns, name, body, ctx), 200, ctx.warnings)
        if sub == "finalize":
            return answer(await self._finalize_namespace(info, name, body, ctx), 200, ctx.warnings)
        obj = await self.api.update(info, ns, name, body, ctx, sub)
        return answer(obj, 200, ctx.warnings)

    async def _patch(
        self, request: web.Request, route: Route, info: ResourceInfo, ns: str, query: dict[str, str], ctx: WriteContext
    ) -> web.StreamResponse:
        name, sub = route.name, route.subresource
        answer = self._answerer(request, info)
        if not name:
            raise method_not_allowed()
        body = await self._read_body(request)
        force = query.get("force", "0").lower() not in ("0", "false")
        ctype = request.headers.get("Content-Type", "")
        if sub == "scale":
            return answer(await scale.patch_scale(self.api, info, ns, name, ctype, body, ctx), 200, ctx.warnings)
        code, obj = await self.api.patch(info, ns, name, ctype, body, ctx, sub, force)
        return answer(obj, code, ctx.warnings)

    async def _delete(
        self, request: web.Request, route: Route, info: ResourceInfo, ns: str, query: dict[str, str], ctx: WriteContext
    ) -> web.StreamResponse:
        """DELETE: one object, or the collection."""
        name = route.name
        options = await self._delete_options(request, query, info.group_version)
        if options.get("dryRun"):
            ctx.dry_run = True
        if not name:
            if "deletecollection" not in info.verbs or info.storage_key == ("", "namespaces"):
                raise method_not_allowed()  # upstream's namespace storage has no DeleteCollection
            scope = ns if route.namespaced_path else None
            return await self._delete_collection(request, info, scope, query, options, ctx)
        code, obj = await self.api.delete(info, ns, name, options, ctx)
        return self._answerer(request, info)(obj, code, ctx.warnings)

    def _answerer(self, request: web.Request, info: ResourceInfo) -> Callable[[Any, int, list[str] | None],
                                                                             web.Response]:
        """How a write answers: protobuf when the client prefers it for a built-in kind, else JSON. A write
        whose Accept header offers nothing servable still answers JSON, as it did before negotiation."""
        try:
            wants = self._object_format(request, info) == "protobuf"
        except StatusError:
            wants = False

        def answer(obj: Any, code: int, warnings: list[str] | None) -> web.Response:
            if wants and isinstance(obj, dict):
                return _json(_protobuf_body(obj), code, warnings, content_type=protobuf.CONTENT_TYPE)
            return _json(obj, code, warnings)

        return answer

    async def _finalize_namespace(
        self, info: ResourceInfo, name: str, body: Any, ctx: WriteContext
    ) -> dict[str, Any]:
        current = self.api.get(info, "", name).obj
        if not isinstance(body, dict):
            raise bad_request("the body of a finalize request must be a Namespace")
        new = dict(current, metadata=dict(current["metadata"]))  # the stored version stays as it was
        new["spec"] = dict(
            current.get("spec") or {}, finalizers=(body.get("spec") or {}).get("finalizers") or []
        )
        if new["spec"] == current.get("spec"):
            return current
        if (
            current["metadata"].get("deletionTimestamp")
            and not new["spec"]["finalizers"]
            and not current["metadata"].get("finalizers")
        ):
            gone = self.store.remove(info.storage_key, "", name)
            assert gone is not None
            return gone.obj
        return self.store.put(info.storage_key, new).obj

    async def _delete_options(
        self, request: web.Request, query: Mapping[str, str], group_version: str
    ) -> dict[str, Any]:
        """DeleteOptions from the body (JSON, or protobuf as typed Go clients send them) and the query."""
        options: dict[str, Any] = {}
        raw = await request.read()
        if raw:
            ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype == protobuf.CONTENT_TYPE:
                try:
                    body = protobuf.decode_object(raw, group_version, "DeleteOptions")
                except protobuf.DecodeError as e:
                    raise bad_request(str(e)) from None
                body.pop("kind", None)
                body.pop("apiVersion", None)
            else:
                body = decode_json(raw)
            if not isinstance(body, dict):
                raise bad_request("the body of a delete must be DeleteOptions")
            options.update(body)
        if "gracePeriodSeconds" in query:
            try:
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            except ValueError:
                raise bad_request("gracePeriodSeconds: must be an integer") from None
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if query.get("dryRun") == "All":
            options["dryRun"] = ["All"]
        return options

    async def _delete_collection(
        self,
        request: web.Request,
        info: ResourceInfo,
        ns: str | None,
        query: Mapping[str, str],
        options: dict[str, Any],
        ctx: WriteContext,
    ) -> web.Response:
        page = await self.lister.page(
            info, ns, {k: v for k, v in query.items() if k in ("labelSelector", "fieldSelector")}
        )
        deleted = []
        for s in page.items:
            m = s.obj["metadata"]
            with contextlib.suppress(StatusError):
                _, obj = await self.api.delete(info, m.get("namespace", "") or "", m["name"], options, ctx)
                deleted.append(obj)
        return _json(
            {
                "kind": info.list_kind,
                "apiVersion": info.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": deleted,
            },
            200,
            ctx.warnings,
        )

    async def _review(self, request: web.Request, info: ResourceInfo, user: auth.UserInfo) -> web.Response:
        body = await self._read_body(request, (info.group_version, info.kind))
        if not isinstance(body, dict):
            raise bad_request("the body of a review must be an object")
        if body.get("kind") not in (None, info.kind):
            raise bad_request(f"the kind in the data ({body.get('kind')}) does not match the expected kind "
                              f"({info.kind})")
        answer = self._answerer(request, info)
        try:
            if info.kind == "TokenReview":
                return answer(auth.token_review(body, self.authn), 201, None)
            if info.kind == "SelfSubjectAccessReview":
                return answer(auth.self_subject_access_review(body, user, self.rbac), 201, None)
            return answer(auth.subject_access_review(body, self.rbac), 201, None)
        except (AttributeError, TypeError, ValueError) as e:
            # A field of the wrong JSON type: upstream fails decoding the review (400), never a 500.
            raise bad_request(f"{info.kind} in version \"{info.group_version}\" cannot be handled: {e}") from None

    def _object_format(self, request: web.Request, info: ResourceInfo) -> str:
        return discovery.negotiate_object(request.headers.get("Accept"), protobuf=not info.is_custom)

    async def _wait_fresh(self, rv_s: str | None) -> None:
        """A get "not older than" a future RV waits for it, then 504s like the watch cache."""
        if rv_s in (None, "", "0"):
            return
        from . import lists

        assert rv_s is not None
        n = lists.parse_rv(rv_s)
        if n > self.store.rv and not await self.store.wait_for_rv(n, lists.TOO_LARGE_WAIT):
            raise lists.too_large(n, self.store.rv)

    def _get(self, request: web.Request, info: ResourceInfo, ns: str, name: str) -> web.Response:
        fmt = self._object_format(request, info)
        rv = request.query.get("resourceVersion")
        if rv not in (None, "", "0"):
            from .lists import parse_rv

            parse_rv(rv)
        stored = self.api.get(info, ns, name)
        if fmt == "protobuf":
            return _json(_protobuf_body(stored.obj), content_type=protobuf.CONTENT_TYPE)
        if fmt != "json":
            table = tables.render_table(
                info,
                [stored.obj],
                resource_version=str(stored.rv),
                include_object=request.query.get("includeObject", "Metadata"),
            )
            return _json(table, content_type=_table_ctype(fmt))
        return _json(stored.raw)

    async def _list(
        self, request: web.Request, info: ResourceInfo, ns: str | None, query: Mapping[str, str]
    ) -> web.Response:
        fmt = self._object_format(request, info)
        page: Page = await self.lister.page(info, ns, query)
        if fmt not in ("json", "protobuf"):
            table = tables.render_table(
                info,
                [s.obj for s in page.items],
                resource_version=str(page.resource_version),
                continue_token=page.continue_token,
                remaining=page.remaining,
                include_object=query.get("includeObject", "Metadata"),
            )
            return _json(table, content_type=_table_ctype(fmt))
        meta: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
        if page.continue_token:
            meta["continue"] = page.continue_token
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
        if fmt == "protobuf":
            listed = {"kind": info.list_kind, "apiVersion": info.api_version, "metadata": meta,
                      "items": [s.obj for s in page.items]}
            return _json(_protobuf_body(listed), content_type=protobuf.CONTENT_TYPE)
        head = _encode({"kind": info.list_kind, "apiVersion": info.api_version, "metadata": meta})
        body = head[:-1] + b',"items":[' + b",".join(s.raw for s in page.items) + b"]}"
        return _json(body)

    async def _watch(
        self, request: web.Request, info: ResourceInfo, ns: str | None, query: Mapping[str, str]
    ) -> web.StreamResponse:
        fmt = self._object_format(request, info)
        table_row = None
        ctype = "application/json"
        if fmt == "protobuf":
            ctype = protobuf.WATCH_CONTENT_TYPE
        elif fmt != "json":
            ctype = _table_ctype(fmt)

            first = [True]

            def table_row(obj: dict[str, Any]) -> dict[str, Any]:
                # Upstream sends column definitions with the first event of a watch only.
                headers, first[0] = first[0], False
                return tables.render_table_row_event(info, obj, include_headers=headers)

        return await serve_watch(
            request,
            self.store,
            info,
            ns,
            query,
            self.watch_settings,
            table_row=table_row,
            content_type=ctype,
            open_streams=self._streams,
            protobuf=fmt == "protobuf",
        )


def _protobuf_body(obj: dict[str, Any]) -> bytes:
    """An object the server holds in protobuf; one that does not fit its kind's wire form is a server bug,
    answered as a 500 naming the field rather than as a body the client cannot decode."""
    try:
        return protobuf.encode_object(obj)
    except protobuf.EncodeError as e:
        raise internal(f"the object could not be encoded as protobuf: {e}") from None


def _table_ctype(fmt: str) -> str:
    version = "v1beta1" if fmt == "table-v1beta1" else "v1"
    return f"application/json;as=Table;v={version};g=meta.k8s.io"


def not_found_path() -> StatusError:
    return StatusError(404, "NotFound", "the server could not find the requested resource", empty_details=True)
