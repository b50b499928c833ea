"""Dynamic admission control: calling mutating and validating webhooks as kube-apiserver does.

Our MIG slicer's webhook (and any controller-runtime webhook) must see the same AdmissionReview, and clients the
same denials and `failed calling webhook` errors, as against a real cluster. `matchConditions` (CEL over
`object`, `oldObject` and `request`) decide whether a matching webhook is called; one that fails to evaluate
fails the request under failurePolicy Fail and skips the webhook under Ignore, as upstream. Not emulated:
`matchPolicy: Equivalent` (the emulator serves one version per resource), the `authorizer` variable of match
conditions, client certificates towards webhooks, and audit annotations.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import errno
import importlib
import json
import ssl
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gpuops_sim.apiserver.auth import UserInfo, label_selector_matches
from gpuops_sim.apiserver.errors import Cause, StatusError, internal, not_found

JsonPatchFn = Callable[[Any, Any], Any]
ServiceResolver = Callable[[str, str, int], str]

ADMISSION_V1 = "admission.k8s.io/v1"
DEFAULT_TIMEOUT_SECONDS = 10

# Webhooks are never called for the objects that configure admission (so a broken webhook can be fixed).
_EXEMPT = frozenset(
    ("admissionregistration.k8s.io", r)
    for r in (
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
    )
)
_OPTION_KINDS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


@dataclass
class AdmissionRequest:
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    group: str
    version: str
    resource: str
    subresource: str
    kind: str
    namespace: str  # for Namespace objects the namespace's own name (defaulted from `name` when empty)
    name: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    dry_run: bool
    user: UserInfo
    options: dict[str, Any] | None = None
    # Group/version of `kind` when it differs from the resource's (pods/eviction -> policy/v1 Eviction).
    kind_group: str | None = None
    kind_version: str | None = None
    uid: str = ""  # generated per call when empty

    @property
    def is_namespace_object(self) -> bool:
        return self.group == "" and self.version == "v1" and self.resource == "namespaces"

    @property
    def effective_namespace(self) -> str:
        if not self.namespace and self.group == "" and self.resource == "namespaces":
            return self.name
        return self.namespace


@dataclass(frozen=True)
class _Hook:
    configuration: str
    index: int
    spec: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def fail_open(self) -> bool:
        return self.spec.get("failurePolicy") == "Ignore"

    @property
    def reinvoke_if_needed(self) -> bool:
        return self.spec.get("reinvocationPolicy") == "IfNeeded"


class _CallError(Exception):
    """ErrCallingWebhook: the only failure `failurePolicy: Ignore` forgives."""

    def __init__(self, webhook: str, reason: str) -> None:
        super().__init__(f'failed calling webhook "{webhook}": {reason}')


@dataclass
class _Reply:
    allowed: bool
    result: Mapping[str, Any] | None
    patch: str
    patch_type: str
    warnings: list[str]


def _ordered_hooks(configs: Sequence[Mapping[str, Any]]) -> list[_Hook]:
    """Configurations by name, then webhooks in listed order, as the apiserver's configuration manager."""
    ordered = sorted(configs, key=lambda c: str((c.get("metadata") or {}).get("name", "")))
    hooks: list[_Hook] = []
    for config in ordered:
        name = str((config.get("metadata") or {}).get("name", ""))
        for i, spec in enumerate(config.get("webhooks") or []):
            hooks.append(_Hook(name, i, spec))
    return hooks


def _exact_or_wildcard(items: Any, wanted: str) -> bool:
    return any(item in ("*", wanted) for item in items or ())


def rule_matches(rule: Mapping[str, Any], req: AdmissionRequest) -> bool:
    """RuleWithOperations: "pods/*" also matches pods itself, "*" matches no subresource, "*/*" everything."""
    scope = rule.get("scope") or "*"
    namespace = req.effective_namespace
    if scope == "Namespaced" and (req.is_namespace_object or not namespace):
        return False
    if scope == "Cluster" and not (req.is_namespace_object or not namespace):
        return False
    if scope not in ("*", "Namespaced", "Cluster"):
        return False
    if not _exact_or_wildcard(rule.get("operations"), req.operation):
        return False
    if not _exact_or_wildcard(rule.get("apiGroups"), req.group):
        return False
    if not _exact_or_wildcard(rule.get("apiVersions"), req.version):
        return False
    for res_sub in rule.get("resources") or ():
        res, _, sub = str(res_sub).partition("/")
        if res in ("*", req.resource) and sub in ("*", req.subresource):
            return True
    return False


def _labels_of(obj: Mapping[str, Any] | None) -> Mapping[str, str] | None:
    if obj is None:
        return None
    return (obj.get("metadata") or {}).get("labels") or {}


def _selects_everything(selector: Mapping[str, Any]) -> bool:
    return not selector.get("matchLabels") and not selector.get("matchExpressions")


def webhook_matches(
    hook: Mapping[str, Any], req: AdmissionRequest, namespace_labels: Mapping[str, str] | None
) -> bool:
    """Whether the apiserver would call `hook` for `req`; raises like upstream for a missing namespace."""
    if (req.group, req.resource) in _EXEMPT:
        return False
    if not any(rule_matches(rule, req) for rule in hook.get("rules") or ()):
        return False
    try:
        ns_selector = hook.get("namespaceSelector") or {}
        namespace = req.effective_namespace
        if not _selects_everything(ns_selector) and (namespace or req.resource == "namespaces"):
            if req.resource == "namespaces" and not req.subresource and req.operation in ("CREATE", "UPDATE"):
                labels = _labels_of(req.obj) or {}
            elif namespace_labels is None:
                raise not_found("namespaces", "", namespace)
            else:
                labels = namespace_labels
            if not label_selector_matches(ns_selector, labels):
                return False
        obj_selector = hook.get("objectSelector") or {}
        if not _selects_everything(obj_selector):
            new_labels, old_labels = _labels_of(req.obj), _labels_of(req.old_obj)
            matched = (new_labels is not None and label_selector_matches(obj_selector, new_labels)) or (
                old_labels is not None and label_selector_matches(obj_selector, old_labels)
            )
            if not matched:
                return False
    except ValueError as exc:
        raise internal(str(exc)) from exc
    return True


def conditions_hold(hook: Mapping[str, Any], req: AdmissionRequest, uid: str) -> bool:
    """All matchConditions true -> call the webhook; one false -> skip it. An expression that does not compile
    or errors raises _CallError (the caller applies the failure policy)."""
    conditions = hook.get("matchConditions") or ()
    if not conditions:
        return True
    from celpy import celtypes  # cel-python: only when a webhook has conditions

    from . import cel

    review = admission_review(req, uid)["request"]
    activation = {"object": cel.to_cel(req.obj, None), "oldObject": cel.to_cel(req.old_obj, None),
                  "request": cel.to_cel(review, None)}
    for cond in conditions:
        name = cond.get("name", "") if isinstance(cond, Mapping) else ""
        try:
            runner = cel.compile_expression(str(cond.get("expression", "")), _CONDITION_VARS)
            result = runner.evaluate(activation)
        except Exception as e:  # compile errors, CEL evaluation errors
            raise _CallError(str(hook.get("name", "")), f"failed to evaluate match condition {name!r}: {e}") from e
        if isinstance(result, Exception):  # cel-python returns evaluation errors as values
            raise _CallError(str(hook.get("name", "")), f"failed to evaluate match condition {name!r}: {result}")
        if not isinstance(result, bool | celtypes.BoolType):
            raise _CallError(str(hook.get("name", "")), f"match condition {name!r} did not return a bool")
        if not bool(result):
            return False
    return True


_CONDITION_VARS = frozenset({"object", "oldObject", "request", "params", "namespaceObject"})


def admission_review(req: AdmissionRequest, uid: str) -> dict[str, Any]:
    """The admission.k8s.io/v1 AdmissionReview body POSTed to a webhook."""
    kind = {
        "group": req.group if req.kind_group is None else req.kind_group,
        "version": req.version if req.kind_version is None else req.kind_version,
        "kind": req.kind,
    }
    resource = {"group": req.group, "version": req.version, "resource": req.resource}
    options = req.options
    if options is None and req.operation in _OPTION_KINDS:
        options = {"kind": _OPTION_KINDS[req.operation], "apiVersion": "meta.k8s.io/v1"}
        if req.dry_run:
            options["dryRun"] = ["All"]
    body: dict[str, Any] = {"uid": uid, "kind": kind, "resource": resource}
    if req.subresource:
        body["subResource"] = req.subresource
    body["requestKind"] = dict(kind)
    body["requestResource"] = dict(resource)
    if req.subresource:
        body["requestSubResource"] = req.subresource
    if req.name:
        body["name"] = req.name
    if req.effective_namespace:
        body["namespace"] = req.effective_namespace
    body["operation"] = req.operation
    body["userInfo"] = req.user.to_dict()
    # Go's RawExtension encodes an absent object as null; it is not omitted.
    body["object"] = req.obj
    body["oldObject"] = req.old_obj
    body["dryRun"] = req.dry_run
    if options is not None:
        body["options"] = options
    return {"kind": "AdmissionReview", "apiVersion": ADMISSION_V1, "request": body}


def _denied(webhook: str, result: Mapping[str, Any] | None) -> StatusError:
    """webhook ToStatusErr: codes below 400 become 400; the webhook's reason and details pass through."""
    result = result or {}
    code = result.get("code")
    code = code if isinstance(code, int) and code >= 400 else 400
    denied_by = f'admission webhook "{webhook}" denied the request'
    message = str(result.get("message") or "")
    reason = str(result.get("reason") or "")
    if message:
        text = f"{denied_by}: {message}"
    elif reason:
        text = f"{denied_by}: {reason}"
    else:
        text = f"{denied_by} without explanation"
    details = result.get("details") or {}
    causes = [
        Cause(str(c.get("reason", "")), str(c.get("message", "")), str(c.get("field", "")))
        for c in details.get("causes") or []
        if isinstance(c, Mapping)
    ]
    retry = details.get("retryAfterSeconds")
    return StatusError(
        code,
        reason,
        text,
        name=str(details.get("name", "")),
        group=str(details.get("group", "")),
        kind=str(details.get("kind", "")),
        causes=causes,
        retry_after=retry if isinstance(retry, int) else None,
    )


def _verify_reply(review: Any, uid: str, mutating: bool) -> _Reply:
    """VerifyAdmissionResponse: anything wrong here is a call failure, subject to failurePolicy."""
    if not isinstance(review, Mapping):
        raise ValueError("webhook response was absent")
    response = review.get("response")
    if not isinstance(response, Mapping):
        raise ValueError("webhook response was absent")
    got_uid = str(response.get("uid", ""))
    if got_uid != uid:
        raise ValueError(f'expected response.uid="{uid}", got "{got_uid}"')
    api_version, kind = str(review.get("apiVersion", "")), str(review.get("kind", ""))
    if (api_version, kind) != (ADMISSION_V1, "AdmissionReview"):
        group, _, version = api_version.rpartition("/")
        expected = f"{ADMISSION_V1}, Kind=AdmissionReview"
        raise ValueError(f"expected webhook response of {expected}, got {group}/{version}, Kind={kind}")
    patch = str(response.get("patch") or "")
    patch_type = str(response.get("patchType") or "")
    if patch and not patch_type:
        raise ValueError("webhook returned response.patch but not response.patchType")
    if patch_type:
        if not mutating:
            raise ValueError("validating webhook may not return response.patchType")
        if patch_type != "JSONPatch":
            raise ValueError(f'invalid response.patchType "{patch_type}"')
    result = response.get("status")
    return _Reply(
        allowed=response.get("allowed") is True,
        result=result if isinstance(result, Mapping) else None,
        patch=patch,
        patch_type=patch_type,
        warnings=[str(w) for w in response.get("warnings") or []],
    )


def _describe_http_failure(status: int, text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, Mapping) and body.get("kind") == "Status" and body.get("message"):
        return str(body["message"])
    if status >= 500 and text.strip():
        return f'an error on the server ("{text.strip()[:200]}") has prevented the request from succeeding'
    return f"the server responded with the status code {status} but did not return more information"


def _describe_transport_failure(exc: BaseException, dial: str, server_name: str) -> str:
    """Go-like wording for the failures people grep for: refused, deadline, untrusted certificate."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "context deadline exceeded"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert_error = exc.certificate_error
        if isinstance(cert_error, ssl.SSLCertVerificationError) and cert_error.verify_code == 62:
            return f"tls: failed to verify certificate: x509: certificate is not valid for {server_name}"
        return "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return f"dial tcp {dial}: connect: connection refused"
        return f"dial tcp {dial}: {exc.os_error.strerror or exc.os_error}"
    return str(exc) or type(exc).__name__


class WebhookCaller:
    """Calls the webhooks of MutatingWebhookConfigurations and ValidatingWebhookConfigurations over HTTPS."""

    def __init__(self, resolve_service: ServiceResolver, *, json_patch: JsonPatchFn | None = None) -> None:
        self._resolve_service = resolve_service
        self._json_patch = json_patch
        self._session: aiohttp.ClientSession | None = None
        self._ssl_contexts: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def _ssl_context(self, ca_bundle: str) -> ssl.SSLContext:
        """Trust only the configuration's caBundle; without one, the system roots (as upstream)."""
        ctx = self._ssl_contexts.get(ca_bundle)
        if ctx is None:
            if ca_bundle:
                pem = base64.b64decode(ca_bundle, validate=True).decode("ascii")
                ctx = ssl.create_default_context(cadata=pem)
            else:
                ctx = ssl.create_default_context()
            if len(self._ssl_contexts) >= 64:  # bundles rotate: keep the cache bounded
                self._ssl_contexts.clear()
            self._ssl_contexts[ca_bundle] = ctx
        return ctx

    def _apply_patch(self, doc: dict[str, Any], ops: Any) -> Any:
        patcher = self._json_patch
        if patcher is None:
            try:  # written concurrently by someone else; looked up at call time
                module = importlib.import_module("gpuops_sim.apiserver.patch")
            except ImportError as exc:
                raise internal(f"JSON patch support is not available: {exc}") from exc
            patcher = module.apply_json_patch
        return patcher(doc, ops)

    async def _post(self, hook: _Hook, review: dict[str, Any]) -> Any:
        """POST the review; returns the decoded JSON reply or raises _CallError."""
        spec = hook.spec
        cc = spec.get("clientConfig") or {}
        timeout = spec.get("timeoutSeconds")
        timeout = timeout if isinstance(timeout, int) and timeout > 0 else DEFAULT_TIMEOUT_SECONDS
        headers = {"Content-Type": "application/json", "Accept": "application/json, */*"}
        server_name: str | None = None
        try:
            if cc.get("url"):
                shown = str(cc["url"])
                parts = urlsplit(shown)
                target = shown
                server_name = parts.hostname
                dial = f"{server_name}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
            else:
                svc = cc.get("service") or {}
                namespace, name = str(svc.get("namespace", "")), str(svc.get("name", ""))
                port = int(svc.get("port") or 443)
                path = str(svc.get("path") or "")
                server_name = f"{name}.{namespace}.svc"
                shown = f"https://{server_name}:{port}{path}"
                dial = self._resolve_service(namespace, name, port)
                target = f"https://{dial}{path or '/'}"
                headers["Host"] = f"{server_name}:{port}"
            https = urlsplit(target).scheme == "https"
            ssl_ctx = self._ssl_context(str(cc.get("caBundle") or "")) if https else None
        except StatusError as exc:
            raise _CallError(hook.name, f"failed to call webhook: {exc.message}") from exc
        except Exception as exc:  # resolver, caBundle: any failure means "cannot reach the webhook"
            raise _CallError(hook.name, f"failed to call webhook: {exc}") from exc
        query = f"timeout={timeout}s"
        shown_with_query = f"{shown}{'&' if '?' in shown else '?'}{query}"
        target = f"{target}{'&' if '?' in target else '?'}{query}"
        data = json.dumps(review, separators=(",", ":")).encode()
        extra: dict[str, Any] = {}
        if ssl_ctx is not None:
            extra = {"ssl": ssl_ctx, "server_hostname": server_name}
        try:
            async with self._session_now().post(
                target, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout), **extra
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            detail = _describe_transport_failure(exc, dial, server_name or "")
            reason = f'failed to call webhook: Post "{shown_with_query}": {detail}'
            raise _CallError(hook.name, reason) from exc
        if not 200 <= status < 300:
            raise _CallError(hook.name, f"failed to call webhook: {_describe_http_failure(status, text)}")
        try:
            return json.loads(text)
        except ValueError as exc:
            raise _CallError(hook.name, f"failed to call webhook: {exc}") from exc

    async def _call(self, hook: _Hook, req: AdmissionRequest, mutating: bool) -> _Reply:
        if req.dry_run:
            side_effects = hook.spec.get("sideEffects")
            if side_effects is None:
                raise _CallError(hook.name, "Webhook SideEffects is nil")
            if side_effects not in ("None", "NoneOnDryRun"):
                raise StatusError(
                    400, "BadRequest", f'admission webhook "{hook.name}" does not support dry run'
                )
        uid = req.uid or str(uuid.uuid4())
        reply = await self._post(hook, admission_review(req, uid))
        try:
            return _verify_reply(reply, uid, mutating)
        except ValueError as exc:
            raise _CallError(hook.name, f"received invalid webhook response: {exc}") from exc

    async def mutate(
        self,
        configs: Sequence[Mapping[str, Any]],
        req: AdmissionRequest,
        namespace_labels: Mapping[str, str] | None,
        *,
        warnings: list[str] | None = None,
    ) -> dict[str, Any] | None:
        """Run mutating webhooks in order, each seeing the previous ones' patches; None if nothing changed.

        `reinvocationPolicy: IfNeeded` webhooks are called once more if a later webhook changed the object.
        Webhook warnings are appended to `warnings` (also when the request ends up rejected).
        """
        hooks = _ordered_hooks(configs)
        current = req.obj
        previously_invoked: set[tuple[str, int]] = set()
        reinvoke: set[tuple[str, int]] = set()
        for round_ in (0, 1):
            if round_ == 1 and not reinvoke:
                break
            for hook in hooks:
                key = (hook.configuration, hook.index)
                if round_ == 1 and key not in reinvoke:
                    continue
                attrs = replace(req, obj=current)
                if not webhook_matches(hook.spec, attrs, namespace_labels):
                    continue
                try:
                    if not conditions_hold(hook.spec, attrs, attrs.uid or ""):
                        continue
                except _CallError as exc:
                    if not hook.fail_open:
                        raise internal(str(exc)) from exc
                    continue
                changed = False
                try:
                    reply = await self._call(hook, attrs, mutating=True)
                    if warnings is not None:
                        warnings.extend(reply.warnings)
                    if not reply.allowed:
                        raise _denied(hook.name, reply.result)
                    patched = self._patched(hook, current, reply)
                    if patched is not None and patched != current:
                        current, changed = patched, True
                except _CallError as exc:
                    if not hook.fail_open:
                        raise internal(str(exc)) from exc
                if changed:
                    reinvoke |= previously_invoked
                    previously_invoked = set()
                if hook.reinvoke_if_needed:
                    previously_invoked.add(key)
        return current if current != req.obj else None

    def _patched(self, hook: _Hook, current: dict[str, Any] | None, reply: _Reply) -> dict[str, Any] | None:
        if not reply.patch:
            return None
        try:
            ops = json.loads(base64.b64decode(reply.patch, validate=True))
        except (ValueError, binascii.Error) as exc:
            raise internal(str(exc)) from exc
        if not isinstance(ops, list):
            raise internal("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        if not ops:
            return None
        if current is None:
            raise internal(
                f'admission webhook "{hook.name}" attempted to modify the object, '
                "which is not supported for this operation"
            )
        try:
            patched = self._apply_patch(copy.deepcopy(current), ops)
        except StatusError as exc:
            raise internal(exc.message) from exc
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise internal(str(exc)) from exc
        if not isinstance(patched, dict):
            raise internal(f'admission webhook "{hook.name}" patched the object into a non-object')
        return patched

    async def validate(
        self,
        configs: Sequence[Mapping[str, Any]],
        req: AdmissionRequest,
        namespace_labels: Mapping[str, str] | None,
        *,
        warnings: list[str] | None = None,
    ) -> list[str]:
        """Call all matching validating webhooks concurrently; the first failure in webhook order wins."""
        hooks = [h for h in _ordered_hooks(configs) if webhook_matches(h.spec, req, namespace_labels)]
        outcomes = await asyncio.gather(*(self._validate_one(h, req) for h in hooks))
        collected = warnings if warnings is not None else []
        for hook_warnings, _ in outcomes:
            collected.extend(hook_warnings)
        for _, error in outcomes:
            if error is not None:
                raise error
        return collected

    async def _validate_one(self, hook: _Hook, req: AdmissionRequest) -> tuple[list[str], StatusError | None]:
        try:
            if not conditions_hold(hook.spec, req, req.uid or ""):
                return [], None
            reply = await self._call(hook, req, mutating=False)
        except _CallError as exc:
            return [], None if hook.fail_open else internal(str(exc))
        except StatusError as exc:
            return [], exc
        if not reply.allowed:
            return reply.warnings, _denied(hook.name, reply.result)
        return reply.warnings, None
