"""Three real Kubernetes clients behind one small adapter interface, for the conformance suite.

Each adapter drives its client the way that client's users do: kubernetes-asyncio and the official
`kubernetes` package through `config.load_kube_config`, the typed APIs (CoreV1Api, CustomObjectsApi,
PolicyV1Api, ...), `watch.Watch().stream` and the dynamic client; kubectl as a subprocess with KUBECONFIG.
Errors from all three come out as `ApiError` with the HTTP code and the Status reason, so a scenario is
written once and asserted the same way for every client.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import queue
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"

# The Status reasons kubectl prints as "Error from server (<Reason>)", mapped back to their HTTP codes.
REASON_CODES = {
    "BadRequest": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "NotFound": 404,
    "MethodNotAllowed": 405,
    "NotAcceptable": 406,
    "AlreadyExists": 409,
    "Conflict": 409,
    "Gone": 410,
    "Expired": 410,
    "RequestEntityTooLarge": 413,
    "UnsupportedMediaType": 415,
    "Invalid": 422,
    "TooManyRequests": 429,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "Timeout": 504,
}

Event = tuple[str, dict[str, Any]]


class ApiError(Exception):
    """A failed API call, whichever client made it."""

    def __init__(self, status: int, reason: str, message: str = "", body: dict[str, Any] | None = None):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


@dataclass(frozen=True)
class Res:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def kubectl_name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, ns: str | None = None, name: str = "", sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and ns:
            base += f"/namespaces/{ns}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


CONFIGMAPS = Res("", "v1", "configmaps", "ConfigMap")
PODS = Res("", "v1", "pods", "Pod")
SERVICES = Res("", "v1", "services", "Service")
SERVICEACCOUNTS = Res("", "v1", "serviceaccounts", "ServiceAccount")
NAMESPACES = Res("", "v1", "namespaces", "Namespace", namespaced=False)
PDBS = Res("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
CRDS = Res("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
ROLES = Res("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS = Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
MUTATING = Res(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False
)
VALIDATING = Res(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    False,
)

# Typed-API class and the snake_case kind in its method names, for resources the Python clients model.
TYPED: dict[tuple[str, str], tuple[str, str]] = {
    ("", "configmaps"): ("CoreV1Api", "config_map"),
    ("", "pods"): ("CoreV1Api", "pod"),
    ("", "services"): ("CoreV1Api", "service"),
    ("", "serviceaccounts"): ("CoreV1Api", "service_account"),
    ("", "namespaces"): ("CoreV1Api", "namespace"),
    ("policy", "poddisruptionbudgets"): ("PolicyV1Api", "pod_disruption_budget"),
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("ApiextensionsV1Api", "custom_resource_definition"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): (
        "AdmissionregistrationV1Api",
        "mutating_webhook_configuration",
    ),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): (
        "AdmissionregistrationV1Api",
        "validating_webhook_configuration",
    ),
    ("rbac.authorization.k8s.io", "roles"): ("RbacAuthorizationV1Api", "role"),
    ("rbac.authorization.k8s.io", "rolebindings"): ("RbacAuthorizationV1Api", "role_binding"),
}

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


# ------------------------------------------------------------------------------------------ admin


class Admin:
    """Plain-HTTP admin access for setup and for observing results independently of the client under test."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def request(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def _ok(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        code, out = self.request(method, path, body, ctype)
        if code >= 300:
            raise ApiError(code, (out or {}).get("reason", ""), (out or {}).get("message", ""), out)
        return out

    def create(self, res: Res, obj: dict[str, Any], ns: str | None = "default") -> dict[str, Any]:
        return dict(self._ok("POST", res.path(ns), obj))

    def get(self, res: Res, name: str, ns: str | None = "default") -> dict[str, Any] | None:
        code, out = self.request("GET", res.path(ns, name))
        if code == 404:
            return None
        if code >= 300:
            raise ApiError(code, out.get("reason", ""), out.get("message", ""), out)
        return dict(out)

    def list_objects(self, res: Res, ns: str | None = "default", query: str = "") -> dict[str, Any]:
        return dict(self._ok("GET", res.path(ns) + (f"?{query}" if query else "")))

    def merge(self, res: Res, name: str, patch: dict[str, Any], ns: str | None = "default", sub: str = "") -> Any:
        return self._ok("PATCH", res.path(ns, name, sub), patch, PATCH_TYPES["merge"])

    def put(self, res: Res, obj: dict[str, Any], ns: str | None = "default", sub: str = "") -> Any:
        return self._ok("PUT", res.path(ns, obj["metadata"]["name"], sub), obj)

    def delete(self, res: Res, name: str, ns: str | None = "default") -> Any:
        return self._ok("DELETE", res.path(ns, name))

    def rv(self, res: Res, ns: str | None = "default") -> str:
        return str(self.list_objects(res, ns)["metadata"]["resourceVersion"])


# ------------------------------------------------------------------------------------------ watching


class Watching:
    """A watch running in the background; events are consumed with deadlines, never slept for."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Event | BaseException] = queue.Queue()
        self.seen: list[Event] = []
        self._stop: Callable[[], None] = lambda: None

    def put(self, item: Event | BaseException) -> None:
        self.queue.put(item)

    def wait_for(self, pred: Callable[[str, dict[str, Any]], bool], timeout: float = 10.0) -> Event:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching watch event within {timeout}s; saw {self._summary()}")
            try:
                item = self.queue.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            self.seen.append(item)
            if pred(*item):
                return item

    def _summary(self) -> list[tuple[str, str, str]]:
        return [
            (t, o.get("metadata", {}).get("name", ""), o.get("metadata", {}).get("resourceVersion", ""))
            for t, o in self.seen
        ]

    def stop(self) -> None:
        self._stop()


# ------------------------------------------------------------------------------------------ interface


class Client(abc.ABC):
    name: str

    @abc.abstractmethod
    def version(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def api_versions(self) -> set[str]: ...

    @abc.abstractmethod
    def api_resources(self) -> set[str]:
        """Resource names as kubectl prints them: `plural` for core, `plural.group` otherwise."""

    @abc.abstractmethod
    def create(self, res: Res, obj: dict[str, Any], ns: str | None = "default") -> dict[str, Any]: ...

    @abc.abstractmethod
    def get(self, res: Res, name: str, ns: str | None = "default") -> dict[str, Any]: ...

    @abc.abstractmethod
    def list_objects(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def replace(
        self, res: Res, obj: dict[str, Any], ns: str | None = "default", *, subresource: str = ""
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def patch(
        self,
        res: Res,
        name: str,
        body: Any,
        ns: str | None = "default",
        *,
        patch_type: str,
        subresource: str = "",
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def delete(
        self, res: Res, name: str, ns: str | None = "default", *, propagation: str | None = None
    ) -> None: ...

    def label(self, res: Res, name: str, labels: dict[str, str], ns: str | None = "default") -> None:
        """Set labels the way this client's users do (Python: a merge patch of metadata.labels)."""
        self.patch(res, name, {"metadata": {"labels": labels}}, ns, patch_type="merge")

    @abc.abstractmethod
    def apply(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Declarative client-side apply: create, or patch (strategic for built-ins, merge for CRs)."""

    @abc.abstractmethod
    def apply_server_side(
        self, res: Res, obj: dict[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]: ...

    @abc.abstractmethod
    def watch(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        resource_version: str,
        max_events: int,
        timeout_seconds: int = 5,
        label_selector: str = "",
        bookmarks: bool = False,
    ) -> list[Event]:
        """Watch from a resourceVersion until `max_events` arrived or the server closed the stream."""

    @abc.abstractmethod
    def start_watch(self, res: Res, ns: str | None = "default") -> Watching: ...

    @abc.abstractmethod
    def evict(self, name: str, ns: str = "default") -> dict[str, Any]: ...

    @abc.abstractmethod
    def table(self, res: Res, ns: str | None = "default") -> tuple[list[str], list[list[str]]]:
        """Server-side printed columns: upper-cased headers and cell strings, as `kubectl get` shows them."""

    @abc.abstractmethod
    def can_i(self, verb: str, res: Res, ns: str = "default") -> bool: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


WIDGETS = Res("conformance.gpuops.io", "v1", "widgets", "Widget")
KNOWN: dict[tuple[str, str], Res] = {
    (r.api_version, r.kind): r
    for r in (CONFIGMAPS, PODS, SERVICES, SERVICEACCOUNTS, NAMESPACES, PDBS, CRDS, ROLES, ROLEBINDINGS, MUTATING)
}
KNOWN.update({(r.api_version, r.kind): r for r in (VALIDATING, WIDGETS)})


def res_for(obj: dict[str, Any]) -> Res:
    """The Res of one of the suite's manifests."""
    return KNOWN[(obj["apiVersion"], obj["kind"])]


# ------------------------------------------------------------------------------------------ python clients


def _status_from_exc(e: Exception) -> ApiError:
    status = getattr(e, "status", None)
    raw = getattr(e, "body", None)
    body: dict[str, Any] | None = None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str) and raw:
        with contextlib.suppress(ValueError):
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                body = parsed
    reason = str(getattr(e, "reason", "") or "")
    message = ""
    if body is not None:
        reason = str(body.get("reason", "")) or reason
        message = str(body.get("message", ""))
    elif ": " in reason:
        # Watch ERROR events become ApiException(code, "Reason: message") in both Python clients.
        reason, message = reason.split(": ", 1)
    return ApiError(int(status or 0), reason, message, body)


class _PythonClient(Client):
    """Shared call routing of the two generated Python clients (same API surface, sync vs async)."""

    module: Any  # the `client` package of the library

    def _target(self, res: Res, verb: str, subresource: str = "") -> tuple[str, str, list[Any]]:
        """(api class, method name, leading positional args) for a verb on res."""
        typed = TYPED.get((res.group, res.plural))
        suffix = f"_{subresource}" if subresource else ""
        if typed is not None:
            cls, kind = typed
            scope = "namespaced_" if res.namespaced else ""
            return cls, f"{verb}_{scope}{kind}{suffix}", []
        scope = "namespaced" if res.namespaced else "cluster"
        cverb = {"read": "get"}.get(verb, verb)
        return "CustomObjectsApi", f"{cverb}_{scope}_custom_object{suffix}", [res.group, res.version]

    def _args(
        self, res: Res, verb: str, ns: str | None, name: str = "", sub: str = ""
    ) -> tuple[str, str, list[Any], dict[str, Any]]:
        cls, method, lead = self._target(res, verb, sub)
        kwargs: dict[str, Any] = {}
        if cls == "CustomObjectsApi":
            args = list(lead)
            if res.namespaced:
                args.append(ns)
            args.append(res.plural)
            if name:
                args.append(name)
        else:
            args = [name] if name else []
            if res.namespaced:
                kwargs["namespace"] = ns
        return cls, method, args, kwargs

    @abc.abstractmethod
    def _call(self, cls: str, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def create(self, res: Res, obj: dict[str, Any], ns: str | None = "default") -> dict[str, Any]:
        cls, m, a, kw = self._args(res, "create", ns)
        return dict(self._call(cls, m, *a, body=obj, **kw))

    def get(self, res: Res, name: str, ns: str | None = "default") -> dict[str, Any]:
        cls, m, a, kw = self._args(res, "read", ns, name)
        return dict(self._call(cls, m, *a, **kw))

    def list_objects(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
    ) -> dict[str, Any]:
        cls, m, a, kw = self._args(res, "list", ns)
        if label_selector:
            kw["label_selector"] = label_selector
        if field_selector:
            kw["field_selector"] = field_selector
        if limit:
            kw["limit"] = limit
        if continue_:
            kw["_continue"] = continue_
        return dict(self._call(cls, m, *a, **kw))

    def replace(
        self, res: Res, obj: dict[str, Any], ns: str | None = "default", *, subresource: str = ""
    ) -> dict[str, Any]:
        cls, m, a, kw = self._args(res, "replace", ns, obj["metadata"]["name"], subresource)
        return dict(self._call(cls, m, *a, body=obj, **kw))

    def patch(
        self,
        res: Res,
        name: str,
        body: Any,
        ns: str | None = "default",
        *,
        patch_type: str,
        subresource: str = "",
    ) -> dict[str, Any]:
        cls, m, a, kw = self._args(res, "patch", ns, name, subresource)
        return dict(self._call(cls, m, *a, body=body, _content_type=PATCH_TYPES[patch_type], **kw))

    def delete(
        self, res: Res, name: str, ns: str | None = "default", *, propagation: str | None = None
    ) -> None:
        cls, m, a, kw = self._args(res, "delete", ns, name)
        if propagation:
            kw["propagation_policy"] = propagation
        self._call(cls, m, *a, **kw)

    def apply(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # What Python operators write for "apply": create, and on AlreadyExists patch with the manifest,
        # strategic merge for built-in kinds and JSON merge patch for custom resources.
        out = []
        for obj in objs:
            res = res_for(obj)
            ns = obj["metadata"].get("namespace") if res.namespaced else None
            try:
                out.append(self.create(res, obj, ns))
            except ApiError as e:
                if e.status != 409:
                    raise
                ptype = "strategic" if (res.group, res.plural) in TYPED else "merge"
                out.append(self.patch(res, obj["metadata"]["name"], obj, ns, patch_type=ptype))
        return out

    def can_i(self, verb: str, res: Res, ns: str = "default") -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": res.group,
                    "resource": res.plural,
                    "namespace": ns,
                }
            },
        }
        out = self._call("AuthorizationV1Api", "create_self_subject_access_review", body=review)
        return bool(out["status"]["allowed"])

    def evict(self, name: str, ns: str = "default") -> dict[str, Any]:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        return dict(self._call("CoreV1Api", "create_namespaced_pod_eviction", name, ns, body=body) or {})


def _watch_kwargs(label_selector: str, bookmarks: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if label_selector:
        kw["label_selector"] = label_selector
    if bookmarks:
        kw["allow_watch_bookmarks"] = True
    return kw


def _rows_from_table(table: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    headers = [c["name"].upper() for c in table["columnDefinitions"] if c.get("priority", 0) == 0]
    keep = [i for i, c in enumerate(table["columnDefinitions"]) if c.get("priority", 0) == 0]
    rows = [["" if r["cells"][i] is None else str(r["cells"][i]) for i in keep] for r in table["rows"]]
    return headers, rows


class OfficialClient(_PythonClient):
    """The official synchronous `kubernetes` client."""

    name = "official"

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        import kubernetes

        k8s: Any = kubernetes  # the official client ships without type hints
        self.module = k8s.client
        cfg = k8s.client.Configuration()
        k8s.config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.api_client: Any = k8s.client.ApiClient(cfg)
        self.workdir = workdir
        self._dynamic: Any = None

    def close(self) -> None:
        self.api_client.close()

    def _api(self, cls: str) -> Any:
        return getattr(self.module, cls)(self.api_client)

    def table(self, res: Res, ns: str | None = "default") -> tuple[list[str], list[list[str]]]:
        # kubernetes < 37 overwrites an Accept header given as `_headers` in its generated list methods, so the
        # Table is asked for through the client's own call_api, still its configuration, auth and transport.
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        path = f"{base}/namespaces/{ns}/{res.plural}" if res.namespaced and ns else f"{base}/{res.plural}"
        out = self.api_client.call_api(path, "GET", header_params={"Accept": TABLE_ACCEPT},
                                       response_types_map={200: "object"},
                                       auth_settings=["BearerToken"], _return_http_data_only=True)
        assert out["kind"] == "Table", out
        return _rows_from_table(out)

    def _call(self, cls: str, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            out = getattr(self._api(cls), method)(*args, **kwargs)
        except Exception as e:
            if isinstance(getattr(e, "status", None), int):
                raise _status_from_exc(e) from None
            raise
        return self.api_client.sanitize_for_serialization(out)

    def dynamic(self) -> Any:
        from kubernetes import dynamic

        if self._dynamic is None:
            cache = str(self.workdir / "official-discovery.json")
            self._dynamic = cast(Any, dynamic).DynamicClient(self.api_client, cache_file=cache)
        return self._dynamic

    def version(self) -> dict[str, Any]:
        return dict(self._call("VersionApi", "get_code"))

    def api_versions(self) -> set[str]:
        core = self._call("CoreApi", "get_api_versions")
        groups = self._call("ApisApi", "get_api_versions")
        out = set(core["versions"])
        for g in groups["groups"]:
            out.update(v["groupVersion"] for v in g["versions"])
        return out

    def api_resources(self) -> set[str]:
        dyn = self.dynamic()
        dyn.resources.invalidate_cache()
        out = set()
        for r in dyn.resources.search():
            if getattr(r, "kind", "").endswith("List") or "/" in getattr(r, "name", "/"):
                continue
            out.add(f"{r.name}.{r.group}" if r.group else r.name)
        return out

    def apply_server_side(
        self, res: Res, obj: dict[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        dyn = self.dynamic()
        try:
            resource = dyn.resources.get(api_version=res.api_version, kind=res.kind)
            out = dyn.server_side_apply(
                resource,
                body=obj,
                namespace=obj["metadata"].get("namespace"),
                field_manager=field_manager,
                force_conflicts=force or None,
            )
        except Exception as e:
            if isinstance(getattr(e, "status", None), int):
                raise _status_from_exc(e) from None
            raise
        return dict(out.to_dict())

    def _list_fn(self, res: Res, ns: str | None) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
        cls, m, a, kw = self._args(res, "list", ns)
        return getattr(self._api(cls), m), a, kw

    def watch(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        resource_version: str,
        max_events: int,
        timeout_seconds: int = 5,
        label_selector: str = "",
        bookmarks: bool = False,
    ) -> list[Event]:
        from kubernetes import watch

        fn, a, kw = self._list_fn(res, ns)
        kw.update(_watch_kwargs(label_selector, bookmarks))
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        events: list[Event] = []
        try:
            for ev in w.stream(fn, *a, resource_version=resource_version, timeout_seconds=timeout_seconds, **kw):
                events.append((ev["type"], ev["raw_object"]))
                if len(events) >= max_events:
                    w.stop()
                    break
        except Exception as e:
            if isinstance(getattr(e, "status", None), int):
                raise _status_from_exc(e) from None
            raise
        return events

    def start_watch(self, res: Res, ns: str | None = "default") -> Watching:
        from kubernetes import watch

        fn, a, kw = self._list_fn(res, ns)
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        watching = Watching()
        stopped = threading.Event()

        def run() -> None:
            try:
                for ev in w.stream(fn, *a, timeout_seconds=60, **kw):
                    watching.put((ev["type"], ev["raw_object"]))
            except Exception as e:
                if not stopped.is_set():
                    watching.put(_status_from_exc(e) if isinstance(getattr(e, "status", None), int) else e)

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def stop() -> None:
            stopped.set()
            w.stop()
            t.join(5)

        watching._stop = stop
        return watching


class AsyncioClient(_PythonClient):
    """kubernetes-asyncio; every adapter call runs its own short event loop with its own ApiClient."""

    name = "asyncio"

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        from kubernetes_asyncio import client, config

        self.module = client
        self.cfg = client.Configuration()
        asyncio.run(config.load_kube_config(config_file=str(kubeconfig), client_configuration=self.cfg))
        self.workdir = workdir

    def _run(self, fn: Callable[[Any], Any]) -> Any:
        async def main() -> Any:
            async with self.module.ApiClient(self.cfg) as api:
                try:
                    out = await fn(api)
                except Exception as e:
                    if isinstance(getattr(e, "status", None), int):
                        raise _status_from_exc(e) from None
                    raise
                return api.sanitize_for_serialization(out)

        return asyncio.run(main())

    def _call(self, cls: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._run(lambda api: getattr(getattr(self.module, cls)(api), method)(*args, **kwargs))

    def version(self) -> dict[str, Any]:
        return dict(self._call("VersionApi", "get_code"))

    def api_versions(self) -> set[str]:
        core = self._call("CoreApi", "get_api_versions")
        groups = self._call("ApisApi", "get_api_versions")
        out = set(core["versions"])
        for g in groups["groups"]:
            out.update(v["groupVersion"] for v in g["versions"])
        return out

    def api_resources(self) -> set[str]:
        from kubernetes_asyncio.dynamic import DynamicClient

        async def go(api: Any) -> list[str]:
            cache = str(self.workdir / "asyncio-discovery.json")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cache)
            async with DynamicClient(api, cache_file=cache) as dyn:
                out: set[str] = set()
                for r in await dyn.resources.search():
                    if (r.kind or "").endswith("List"):  # ResourceList wrappers resolve names lazily
                        continue
                    name = r.name or ""
                    if name and "/" not in name:
                        out.add(f"{name}.{r.group}" if r.group else name)
                return sorted(out)

        return set(self._run(go))

    def apply_server_side(
        self, res: Res, obj: dict[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        # kubernetes-asyncio would pick JSON patch for a dict on CustomObjectsApi: the content type must be
        # forced.
        ns = obj["metadata"].get("namespace")
        cls, m, a, kw = self._args(res, "patch", ns, obj["metadata"]["name"])
        kw.update(field_manager=field_manager, _content_type="application/apply-patch+yaml")
        if force:
            kw["force"] = True
        out = self._call(cls, m, *a, body=obj, **kw)
        if out is None:
            # CustomObjectsApi maps only 200 for PATCH: an apply that created (201) deserializes
            # to None, so its users read the object back.
            out = self.get(res, obj["metadata"]["name"], ns)
        return dict(out)

    def watch(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        resource_version: str,
        max_events: int,
        timeout_seconds: int = 5,
        label_selector: str = "",
        bookmarks: bool = False,
    ) -> list[Event]:
        from kubernetes_asyncio import watch

        cls, m, a, kw = self._args(res, "list", ns)
        kw.update(_watch_kwargs(label_selector, bookmarks))

        async def go(api: Any) -> list[Event]:
            fn = getattr(getattr(self.module, cls)(api), m)
            events: list[Event] = []
            async with watch.Watch() as w:
                async for ev in w.stream(
                    fn, *a, resource_version=resource_version, timeout_seconds=timeout_seconds, **kw
                ):
                    events.append((ev["type"], ev["raw_object"]))
                    if len(events) >= max_events:
                        w.stop()
                        break
            return events

        return list(self._run(go))

    def start_watch(self, res: Res, ns: str | None = "default") -> Watching:
        from kubernetes_asyncio import watch

        cls, m, a, kw = self._args(res, "list", ns)
        watching = Watching()
        loop = asyncio.new_event_loop()
        task_box: list[asyncio.Task[None]] = []

        async def go() -> None:
            async with self.module.ApiClient(self.cfg) as api:
                fn = getattr(getattr(self.module, cls)(api), m)
                async with watch.Watch() as w:
                    async for ev in w.stream(fn, *a, timeout_seconds=60, **kw):
                        watching.put((ev["type"], ev["raw_object"]))

        def run() -> None:
            asyncio.set_event_loop(loop)
            task = loop.create_task(go())
            task_box.append(task)
            try:
                loop.run_until_complete(task)
            except asyncio.CancelledError:
                pass
            except Exception as e:
                watching.put(_status_from_exc(e) if isinstance(getattr(e, "status", None), int) else e)
            finally:
                loop.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def stop() -> None:
            if task_box and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task_box[0].cancel)
            t.join(5)

        watching._stop = stop
        return watching

    def table(self, res: Res, ns: str | None = "default") -> tuple[list[str], list[list[str]]]:
        async def go(api: Any) -> Any:
            # The generated methods overwrite Accept, so ask for a Table through call_api as kubectl does.
            return await api.call_api(
                res.path(ns),
                "GET",
                header_params={"Accept": TABLE_ACCEPT},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )

        out = self._run(go)
        assert out["kind"] == "Table", out
        return _rows_from_table(out)


# ------------------------------------------------------------------------------------------ kubectl

_ERROR_RE = re.compile(r"Error from server \((\w+)\): (.*)", re.S)
# kubectl rewrites 422 Invalid errors as `The <Kind> "<name>" is invalid: <causes>`.
_INVALID_RE = re.compile(r"The (\S+) \"([^\"]*)\" is invalid: (.*)", re.S)


@dataclass
class KubectlClient(Client):
    kubeconfig: Path
    workdir: Path
    name: str = "kubectl"
    calls: list[list[str]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.workdir),
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
        }

    def run(self, *args: str, stdin: str | None = None, timeout: float = 30) -> str:
        self.calls.append(list(args))
        p = subprocess.run(
            [str(KUBECTL), *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if p.returncode != 0:
            raise self.error(p.stderr or p.stdout)
        return p.stdout

    @staticmethod
    def error(text: str) -> ApiError:
        m = _ERROR_RE.search(text)
        if m:
            reason, message = m.group(1), m.group(2).strip()
            return ApiError(REASON_CODES.get(reason, 0), reason, message)
        m = _INVALID_RE.search(text)
        if m:
            return ApiError(422, "Invalid", m.group(0).strip())
        if "Apply failed with" in text:
            # kubectl renders a 409 whose causes are FieldManagerConflicts as its own apply error.
            return ApiError(409, "Conflict", text.strip())
        return ApiError(0, "ClientError", text.strip())

    def json(self, *args: str, stdin: str | None = None) -> Any:
        return json.loads(self.run(*args, stdin=stdin))

    @staticmethod
    def _ns(res: Res, ns: str | None) -> list[str]:
        return ["-n", ns] if res.namespaced and ns else []

    def version(self) -> dict[str, Any]:
        return dict(self.json("version", "-o", "json")["serverVersion"])

    def api_versions(self) -> set[str]:
        return set(self.run("api-versions").split())

    def api_resources(self) -> set[str]:
        return set(self.run("api-resources", "-o", "name").split())

    def create(self, res: Res, obj: dict[str, Any], ns: str | None = "default") -> dict[str, Any]:
        out = self.json("create", *self._ns(res, ns), "-o", "json", "--show-managed-fields", "-f", "-",
                        stdin=json.dumps(obj))
        return dict(out)

    def get(self, res: Res, name: str, ns: str | None = "default") -> dict[str, Any]:
        return dict(self.json("get", res.kubectl_name, name, *self._ns(res, ns), "-o", "json", "--show-managed-fields"))

    def list_objects(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_: str = "",
    ) -> dict[str, Any]:
        if limit or continue_:
            # kubectl merges chunks itself (--chunk-size); single pages are only visible through --raw.
            q = {"limit": str(limit)} if limit else {}
            if continue_:
                q["continue"] = continue_
            if label_selector:
                q["labelSelector"] = label_selector
            if field_selector:
                q["fieldSelector"] = field_selector
            return dict(self.json("get", "--raw", res.path(ns) + "?" + urllib.parse.urlencode(q)))
        args = ["get", res.kubectl_name, *self._ns(res, ns), "-o", "json", "--show-managed-fields"]
        if label_selector:
            args += ["-l", label_selector]
        if field_selector:
            args += ["--field-selector", field_selector]
        return dict(self.json(*args))

    def replace(
        self, res: Res, obj: dict[str, Any], ns: str | None = "default", *, subresource: str = ""
    ) -> dict[str, Any]:
        if not subresource and not obj["metadata"].get("resourceVersion"):
            # `kubectl replace` reads the live resourceVersion into an object that has none; only
            # `replace --raw` PUTs the body as given.
            return dict(self.json("replace", "--raw", res.path(ns, obj["metadata"]["name"]), "-f", "-",
                                  stdin=json.dumps(obj)))
        args = ["replace", *self._ns(res, ns), "-o", "json", "--show-managed-fields", "-f", "-"]
        if subresource:
            args += ["--subresource", subresource]
        return dict(self.json(*args, stdin=json.dumps(obj)))

    def patch(
        self,
        res: Res,
        name: str,
        body: Any,
        ns: str | None = "default",
        *,
        patch_type: str,
        subresource: str = "",
    ) -> dict[str, Any]:
        args = ["patch", res.kubectl_name, name, *self._ns(res, ns), "--type", patch_type, "-p", json.dumps(body)]
        if subresource:
            args += ["--subresource", subresource]
        return dict(self.json(*args, "-o", "json", "--show-managed-fields"))

    def delete(
        self, res: Res, name: str, ns: str | None = "default", *, propagation: str | None = None
    ) -> None:
        args = ["delete", res.kubectl_name, name, *self._ns(res, ns), "--wait=false"]
        if propagation:
            args.append(f"--cascade={propagation.lower()}")
        self.run(*args)

    def label(self, res: Res, name: str, labels: dict[str, str], ns: str | None = "default") -> None:
        self.run("label", "--overwrite", res.kubectl_name, name, *self._ns(res, ns),
                 *(f"{k}={v}" for k, v in labels.items()))

    def _manifest_file(self, objs: list[dict[str, Any]]) -> str:
        path = self.workdir / f"manifest-{len(self.calls)}.yaml"
        path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        return str(path)

    @staticmethod
    def _items(out: dict[str, Any]) -> list[dict[str, Any]]:
        return list(out["items"]) if out.get("kind") == "List" else [out]

    def apply(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Default --validate=strict: exercises kubectl's /openapi/v3 lookups.
        return self._items(self.json("apply", "-f", self._manifest_file(objs), "-o", "json", "--show-managed-fields"))

    def apply_server_side(
        self, res: Res, obj: dict[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        args = ["apply", "--server-side", f"--field-manager={field_manager}", "-o", "json", "--show-managed-fields"]
        if force:
            args.append("--force-conflicts")
        return self._items(self.json(*args, "-f", self._manifest_file([obj])))[0]

    def _popen(self, *args: str) -> subprocess.Popen[str]:
        self.calls.append(list(args))
        return subprocess.Popen(
            [str(KUBECTL), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def watch(
        self,
        res: Res,
        ns: str | None = "default",
        *,
        resource_version: str,
        max_events: int,
        timeout_seconds: int = 5,
        label_selector: str = "",
        bookmarks: bool = False,
    ) -> list[Event]:
        # kubectl has no flag to start a watch at a resourceVersion; `get --raw` streams the watch as is.
        params = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            params["labelSelector"] = label_selector
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        q = urllib.parse.urlencode(params)
        proc = self._popen("get", "--raw", f"{res.path(ns)}?{q}")
        events: list[Event] = []
        try:
            assert proc.stdout is not None
            for line in _lines_until(proc, timeout_seconds + 5):
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev["type"] == "ERROR":
                    st = ev["object"]
                    raise ApiError(int(st["code"]), st["reason"], st["message"], st)
                events.append((ev["type"], ev["object"]))
                if len(events) >= max_events:
                    break
        finally:
            proc.kill()
            proc.wait(5)
            err = ""
            if proc.stderr is not None:
                err = proc.stderr.read()
                proc.stderr.close()
        if not events and err and "Error from server" in err:
            raise self.error(err)
        return events

    def start_watch(self, res: Res, ns: str | None = "default") -> Watching:
        proc = self._popen(
            "get", res.kubectl_name, *self._ns(res, ns), "-w", "--output-watch-events", "-o", "json"
        )
        watching = Watching()

        def run() -> None:
            assert proc.stdout is not None
            decoder = json.JSONDecoder()
            buf = ""
            for line in proc.stdout:
                buf += line
                while buf.strip():
                    try:
                        obj, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    watching.put((obj["type"], obj["object"]))
            err = proc.stderr.read() if proc.stderr else ""
            if "Error from server" in err:
                watching.put(self.error(err))

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def stop() -> None:
            _stop_child(proc, t)

        watching._stop = stop
        return watching

    def start_text_watch(self, res: Res, ns: str | None = "default") -> Watching:
        """`kubectl get -w` in its default (server-side Table) output: one ("LINE", {"text": ...}) per line."""
        proc = self._popen("get", res.kubectl_name, *self._ns(res, ns), "-w")
        watching = Watching()

        def run() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                watching.put(("LINE", {"text": line.rstrip("\n")}))

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def stop() -> None:
            _stop_child(proc, t)

        watching._stop = stop
        return watching

    def evict(self, name: str, ns: str = "default") -> dict[str, Any]:
        # No kubectl verb evicts one pod (drain works per node and retries 429s); POST the Eviction raw.
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
        out = self.run("create", "--raw", PODS.path(ns, name, "eviction"), "-f", "-", stdin=json.dumps(body))
        return dict(json.loads(out)) if out.strip() else {}

    def table(self, res: Res, ns: str | None = "default") -> tuple[list[str], list[list[str]]]:
        lines = [ln for ln in self.run("get", res.kubectl_name, *self._ns(res, ns)).splitlines() if ln.strip()]
        # Columns are tab-aligned: cut every row at the header's column starts (empty cells stay empty).
        starts = [m.start() for m in re.finditer(r"\S+", lines[0])]
        bounds = list(zip(starts, [*starts[1:], None], strict=True))
        headers = [lines[0][a:b].strip() for a, b in bounds]
        return headers, [[ln[a:b].strip() for a, b in bounds] for ln in lines[1:]]

    def can_i(self, verb: str, res: Res, ns: str = "default") -> bool:
        # `kubectl auth can-i` posts its SelfSubjectAccessReview as protobuf, which the emulator does not
        # decode (415); the same review goes through `create --raw` as JSON.
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "group": res.group, "resource": res.plural, "namespace": ns}},
        }
        out = self.run(
            "create", "--raw", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "-f", "-",
            stdin=json.dumps(review),
        )
        return bool(json.loads(out)["status"]["allowed"])


def _stop_child(proc: subprocess.Popen[str], reader: threading.Thread) -> None:
    """Kill a streaming kubectl and let its reader thread drain the pipes before they are closed."""
    proc.kill()
    reader.join(5)
    proc.wait(5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _lines_until(proc: subprocess.Popen[str], timeout: float) -> Iterator[str]:
    """Lines of a child's stdout, giving up at a deadline (the child is killed by the caller)."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # sole reader of stdout: closes it at EOF (the caller kills the child)
            for line in proc.stdout:
                q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            line = q.get(timeout=left)
        except queue.Empty:
            return
        if line is None:
            return
        yield line


class TLSFrontend:
    """HTTPS in front of the emulator's plain-HTTP port.

    client-go (so kubectl) puts a kubeconfig's bearer token only on TLS connections (kubernetes/kubectl#744):
    over http:// kubectl is anonymous. Tests that need kubectl to be a particular user go through this.
    """

    def __init__(self, backend: str) -> None:
        import trustme

        parsed = urllib.parse.urlsplit(backend)
        self.backend = (parsed.hostname or "127.0.0.1", int(parsed.port or 80))
        self.ca = trustme.CA()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(ctx)
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=ctx)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            b_reader, b_writer = await asyncio.open_connection(*self.backend)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, b_writer), pipe(b_reader, writer))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def kubeconfig(self, token: str) -> str:
        import base64

        ca = base64.b64encode(self.ca.cert_pem.bytes()).decode()
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "sim-tls",
                        "cluster": {"server": f"https://127.0.0.1:{self.port}", "certificate-authority-data": ca},
                    }
                ],
                "users": [{"name": "user", "user": {"token": token}}],
                "contexts": [
                    {"name": "sim-tls", "context": {"cluster": "sim-tls", "user": "user", "namespace": "default"}}
                ],
                "current-context": "sim-tls",
            }
        )


def connect(kind: str, kubeconfig: Path, workdir: Path) -> Client:
    workdir.mkdir(parents=True, exist_ok=True)
    if kind == "asyncio":
        return AsyncioClient(kubeconfig, workdir)
    if kind == "official":
        return OfficialClient(kubeconfig, workdir)
    if kind == "kubectl":
        return KubectlClient(kubeconfig, workdir)
    raise ValueError(kind)
