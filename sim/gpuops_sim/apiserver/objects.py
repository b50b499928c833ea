"""The write and read paths of the API: create, update, patch, delete, get, eviction, binding.

This is where the apiserver's generic registry rules live (resourceVersion preconditions, generation,
status-subresource split, finalizers, graceful deletion, dry run, admission, managedFields); kind-specific
rules come from `builtin` and, for custom resources, from the CRD schema.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from . import builtin, crds, defaults, schema, serviceaccount_admission, services
from . import policies as policies_
from .admission import AdmissionRequest, WebhookCaller
from .apply import SchemaHints, server_side_apply, update_managed_fields
from .auth import UserInfo
from .builtin_schemas import builtin_schema
from .errors import Cause, StatusError, bad_request, conflict, invalid, not_found, unsupported_media_type
from .patch import apply_json_patch, apply_merge_patch, apply_strategic_merge_patch
from .protobuf import gojson
from .registry import Registry
from .resources import ResourceInfo
from .selectors import label_selector_from_object
from .store import Store, Stored, clone

CORE_NS: tuple[str, str] = ("", "namespaces")
SERVICES_GR: tuple[str, str] = ("", "services")
SERVICE_ACCOUNTS_GR: tuple[str, str] = ("", "serviceaccounts")
MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")
CRD_GR = ("apiextensions.k8s.io", "customresourcedefinitions")
PDB_GR = ("policy", "poddisruptionbudgets")
PODS_GR = ("", "pods")
CRD_CLEANUP = "customresourcecleanup.apiextensions.k8s.io"

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
APPLY_PATCH_CBOR = "application/apply-patch+cbor"


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_ALWAYS_CHECKED = frozenset({"apiVersion", "kind", "metadata"})


@dataclass
class WriteContext:
    """What every write carries besides the object: who, dry run, field manager and validation mode."""

    user: UserInfo
    dry_run: bool = False
    field_manager: str = ""
    field_validation: str = ""
    warnings: list[str] = field(default_factory=list)


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON, for certain: equal and encoding alike."""
    try:
        return bool(a == b) and msgspec.json.encode(a) == msgspec.json.encode(b)
    except (TypeError, msgspec.EncodeError):
        return False


def _ns_and_name(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", "") or "", meta.get("name", "")


def _without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def _meta_sans_volatile(meta: dict[str, Any]) -> dict[str, Any]:
    return _without(meta, "resourceVersion", "generation")


def _stamp_new_identity(meta: dict[str, Any], now: datetime) -> None:
    """A new object's uid and creationTimestamp are the server's; what the client sent for them (and for
    the other server-owned fields) is dropped."""
    for k in (
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "generation",
        "selfLink",
    ):
        meta.pop(k, None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = rfc3339(now)


def _check_update_target(info: ResourceInfo, namespace: str, name: str, meta: dict[str, Any]) -> None:
    """The body may not name another object than the URL does."""
    if meta.get("name") and meta["name"] != name:
        raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
    if info.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")


def _check_update_version(
    info: ResourceInfo, name: str, rv: Any, old: dict[str, Any], require_rv: bool | None
) -> None:
    """A resourceVersion in the body is a precondition (409 if stale); custom resources require one unless
    the caller says otherwise (a patch never does)."""
    if require_rv is None:
        require_rv = info.is_custom
    if rv:
        if rv != old["metadata"]["resourceVersion"]:
            raise conflict(info.resource, info.group, name)
    elif require_rv:
        raise invalid(
            info.kind,
            info.group,
            name,
            [
                Cause(
                    "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update",
                    "metadata.resourceVersion",
                )
            ],
        )


def _keep_server_metadata(
    info: ResourceInfo, namespace: str, name: str, meta: dict[str, Any], old_meta: dict[str, Any]
) -> None:
    """Identity, timestamps and generation are the server's: an update keeps the stored ones."""
    meta["name"] = name
    if info.namespaced:
        meta["namespace"] = namespace
    for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
        if k in old_meta:
            meta[k] = old_meta[k]
        else:
            meta.pop(k, None)
    meta["generation"] = old_meta.get("generation")
    if meta["generation"] is None:
        meta.pop("generation")


def _refuse_new_finalizers(info: ResourceInfo, name: str, meta: dict[str, Any], old_meta: dict[str, Any]) -> None:
    """An object being deleted may lose finalizers but gain none."""
    added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
    if added:
        raise invalid(
            info.kind,
            info.group,
            name,
            [
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being "
                    "deleted, found new finalizers []string{"  # Go's %#v of the sorted names
                    + ", ".join(f'"{f}"' for f in sorted(added))
                    + "}",
                    "metadata.finalizers",
                )
            ],
        )


def _patched(info: ResourceInfo, ctype: str, old: dict[str, Any], body: Any) -> Any:
    """The stored object with a JSON, merge or strategic merge patch applied (strategic: built-ins only)."""
    if ctype == JSON_PATCH:
        return apply_json_patch(old, body)
    if ctype == MERGE_PATCH:
        if not isinstance(body, dict):
            raise bad_request("the body of a merge patch must be a JSON object")
        return apply_merge_patch(old, body)
    if ctype == STRATEGIC_PATCH:
        if info.is_custom:
            raise unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )
        if not isinstance(body, dict):
            raise bad_request("the body of a strategic merge patch must be a JSON object")
        return apply_strategic_merge_patch(old, body, info.group, info.kind)
    accepted = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    if not info.is_custom:
        accepted = (
            "application/json-patch+json, application/merge-patch+json, "
            "application/strategic-merge-patch+json, application/apply-patch+yaml"
        )
    raise unsupported_media_type(
        f"the body of the request was in an unknown format - accepted media types include: {accepted}"
    )


def _check_patched(info: ResourceInfo, name: str, patched: Any, stored: dict[str, Any]) -> None:
    """The patched object must still be an object of this kind, with the URL's name. Only the top-level parts
    the patch changed are decoded again: every stored part decoded when it was written (`_validate` checks
    each part that is not the same JSON as the stored one)."""
    if not isinstance(patched, dict):
        raise StatusError(422, "Invalid", "the patch produced an object that is not a JSON object")
    patched.setdefault("metadata", {})
    if not isinstance(patched["metadata"], dict):
        raise StatusError(422, "Invalid", "metadata must be an object")
    if patched["metadata"].get("name") != name:
        # Upstream's checkName on the patched object: a patch cannot rename (or unname) it.
        raise bad_request(
            f"the name of the object ({patched['metadata'].get('name') or ''}) does not match the name on "
            f"the URL ({name})"
        )
    bschema = builtin_schema(info)
    changed = {k: v for k, v in patched.items() if k not in stored or not _same_json(v, stored[k])}
    decode_err = builtin.builtin_decode_error(bschema, info.kind, changed) if bschema is not None else None
    if decode_err:
        raise invalid(
            info.kind, info.group, name, [Cause("FieldValueInvalid", f"Invalid value: {decode_err}", "patch")]
        )


def _apply_config(info: ResourceInfo, name: str, body: Any, ctx: WriteContext) -> dict[str, Any]:
    """The applied configuration, which needs a field manager and the URL's name; fields the kind's schema
    does not know are warned about or refused as fieldValidation says."""
    if not ctx.field_manager:
        raise invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            [Cause("FieldValueRequired", "Required value: is required for apply patch", "fieldManager")],
        )
    config = builtin.ensure_object(body)
    cmeta = config["metadata"]
    if cmeta.get("name") and cmeta["name"] != name:
        raise bad_request(f"the name of the object ({cmeta['name']}) does not match the name on the URL ({name})")
    if info.is_custom or builtin_schema(info) is not None:
        target_schema = info.schema if info.is_custom else builtin_schema(info)
        if target_schema is not None:
            unknown = schema.unknown_fields(target_schema, config)
            ctx.warnings.extend(schema.check_field_validation(unknown, ctx.field_validation))
    return config


def _check_delete_preconditions(
    info: ResourceInfo, name: str, meta: dict[str, Any], options: dict[str, Any]
) -> None:
    """DeleteOptions.preconditions: the uid and resourceVersion the caller expects (409 if they differ)."""
    pre = options.get("preconditions") or {}
    if pre.get("uid") and pre["uid"] != meta.get("uid"):
        raise conflict(
            info.resource,
            info.group,
            name,
            f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
            f"{meta.get('uid')}",
        )
    if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
        raise conflict(
            info.resource,
            info.group,
            name,
            f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
            f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
        )


def _propagation_policy(options: dict[str, Any]) -> str | None:
    """propagationPolicy, or what the older orphanDependents asks for; None lets the kind decide."""
    policy = options.get("propagationPolicy")
    if policy is None and options.get("orphanDependents") is not None:
        policy = "Orphan" if options["orphanDependents"] else "Background"
    if policy not in (None, "Background", "Foreground", "Orphan"):
        raise invalid(
            "DeleteOptions",
            "meta.k8s.io",
            "",
            [
                Cause(
                    "FieldValueNotSupported",
                    f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan", "nil"',
                    "propagationPolicy",
                )
            ],
        )
    return policy



class ObjectAPI:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        webhooks: WebhookCaller | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.webhooks = webhooks
        self.clock = clock or (lambda: datetime.now(UTC))
        # Called with (info, stored) after a CRD is written so the server can (re)register its resources.
        self.on_crd_change: list[Callable[[dict[str, Any], bool], None]] = []
        # Called with a namespace's name once it is created (what its controllers put in every namespace).
        self.on_namespace_created: list[Callable[[str], None]] = []

    # ------------------------------------------------------------------------------------ reads

    def get(self, info: ResourceInfo, namespace: str, name: str) -> Stored:
        s = self.store.get(info.storage_key, namespace if info.namespaced else "", name)
        if s is None:
            raise not_found(info.resource, info.group, name)
        return s

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        s = self.store.get(CORE_NS, "", namespace)
        return dict(s.obj["metadata"].get("labels") or {}) if s else None

    # ------------------------------------------------------------------------------------ helpers

    def _check_namespace(self, info: ResourceInfo, namespace: str, creating: bool) -> None:
        if not info.namespaced:
            return
        if not namespace:
            raise bad_request("the server could not find the requested resource: a namespace is required")
        ns = self.store.get(CORE_NS, "", namespace)
        if ns is None:
            raise not_found("namespaces", "", namespace)
        if creating and ns.obj["metadata"].get("deletionTimestamp"):
            raise StatusError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being terminated",
                name=namespace,
                kind="namespaces",
                causes=[
                    Cause(
                        "NamespaceTerminating",
                        f"namespace {namespace} is being terminated",
                        "metadata.namespace",
                    )
                ],
            )

    def _validate(
        self,
        info: ResourceInfo,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        ctx: WriteContext,
        check_unknown: bool,
    ) -> dict[str, Any]:
        """Schema (CRs) or registry-strategy (built-ins) validation; returns the pruned, defaulted object."""
        obj.setdefault("apiVersion", info.api_version)
        obj.setdefault("kind", info.kind)
        if obj.get("kind") != info.kind or obj.get("apiVersion") != info.api_version:
            raise bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected API version "
                f"({info.api_version})"
                if obj.get("apiVersion") != info.api_version
                else f"the kind in the data ({obj.get('kind')}) does not match the expected kind ({info.kind})"
            )
        if info.is_custom:
            out, warnings = schema.process_custom_resource(
                info, obj, old=old, field_validation=ctx.field_validation if check_unknown else "Ignore"
            )
            ctx.warnings.extend(warnings)
            meta_causes = builtin.validate_metadata(out["metadata"])
            if meta_causes:
                raise invalid(info.kind, info.group, out["metadata"].get("name", ""), meta_causes)
            return out
        bschema = builtin_schema(info)
        if bschema is not None:
            # Top-level parts equal to the stored object's were checked and pruned when it was written: an
            # update (a kubelet's status write above all) only pays for what it changes. A part counts as
            # equal only when it encodes alike (Python's == takes True for 1, and 1.0 for 1).
            if old is None:
                part = obj
            else:
                part = {k: v for k, v in obj.items()
                        if k in _ALWAYS_CHECKED or k not in old or not _same_json(old[k], v)}
                if "metadata" in part and _same_json(part["metadata"], old.get("metadata")):
                    del part["metadata"]
            decode_err = builtin.builtin_decode_error(bschema, info.kind, part)
            if decode_err:
                raise bad_request(
                    f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: {decode_err}'
                )
            if check_unknown and ctx.field_validation != "Ignore":
                unknown = schema.unknown_fields(bschema, part)
                ctx.warnings.extend(schema.check_field_validation(unknown, ctx.field_validation))
            pruned = schema.prune(bschema, part)
            obj = pruned if part is obj else {**obj, **pruned}
            defaults.apply(info.group, info.kind, obj)
            if old is not None:  # a create is put in Go's form after its defaults (create())
                obj = gojson.canonical(info.api_version, info.kind, obj, only=part.keys())
        builtin.normalize(info.group, info.kind, obj)
        builtin.check_valid(info.group, info.kind, obj, old)
        if info.storage_key == CRD_GR:
            obj = crds.default_crd(obj)
            crds.validate_crd(obj)
        return obj

    async def _admit(
        self,
        info: ResourceInfo,
        operation: str,
        obj: dict[str, Any] | None,
        old: dict[str, Any] | None,
        ctx: WriteContext,
        subresource: str = "",
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        mutating = [s.obj for s in self.store.iter(MUTATING)] if self.webhooks is not None else []
        validating = [s.obj for s in self.store.iter(VALIDATING)] if self.webhooks is not None else []
        policies = [s.obj for s in self.store.iter(policies_.POLICIES)]
        if not mutating and not validating and not policies:
            return obj
        ref = obj if obj is not None else old
        assert ref is not None
        ns, name = _ns_and_name(ref)
        req = AdmissionRequest(
            operation=operation,
            group=info.group,
            version=info.version,
            resource=info.resource,
            subresource=subresource,
            kind=info.kind,
            namespace=ns,
            name=name,
            obj=obj,
            old_obj=old,
            dry_run=ctx.dry_run,
            user=ctx.user,
            options=options,
        )
        ns_labels = self.namespace_labels(ns) if ns else None
        if info.storage_key == CORE_NS and ref is not None:
            ns_labels = dict(ref["metadata"].get("labels") or {})
        if mutating and obj is not None and self.webhooks is not None:
            mutated = await self.webhooks.mutate(mutating, req, ns_labels, warnings=ctx.warnings)
            if mutated is not None:
                builtin.redefault(info.group, info.kind, mutated)  # as kube-apiserver defaults after each patch
                obj = self._validate(info, mutated, old, ctx, check_unknown=False)
                req.obj = obj
        if policies:  # the ValidatingAdmissionPolicy plugin runs before the validating webhooks
            bindings = [s.obj for s in self.store.iter(policies_.BINDINGS)]
            ns_object = self.store.get(CORE_NS, "", req.effective_namespace) if req.effective_namespace else None
            ctx.warnings.extend(policies_.enforce(
                policies, bindings, req, ns_labels,
                namespace_object=ns_object.obj if ns_object is not None and not req.is_namespace_object else None,
                find_params=self._find_params))
        if validating and self.webhooks is not None:
            ctx.warnings.extend(await self.webhooks.validate(validating, req, ns_labels))
        return obj

    def _find_params(self, api_version: str, kind: str, namespace: str, name: str,
                     selector: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
        """A policy binding's params: by name, or every object its selector matches (None: unknown kind)."""
        group = api_version.rpartition("/")[0]
        info = self.registry.by_kind(group, kind)
        if info is None:
            return None
        ns = namespace if info.namespaced else ""
        if name:
            found = self.store.get(info.storage_key, ns, name)
            return [found.obj] if found is not None else []
        return [s.obj for s in self.store.iter(info.storage_key, ns if info.namespaced else None)
                if policies_.selector_matches(selector, s.obj)]

    def _bump_generation(self, info: ResourceInfo, new: dict[str, Any], old: dict[str, Any]) -> None:
        if not info.has_generation:
            return
        ignore = ("metadata", "status") if (info.status_subresource or not info.is_custom) else ("metadata",)
        gen = int(old["metadata"].get("generation") or 1)
        if _without(new, *ignore) != _without(old, *ignore):
            gen += 1
        new["metadata"]["generation"] = gen

    def _persist(self, info: ResourceInfo, obj: dict[str, Any], ctx: WriteContext) -> dict[str, Any]:
        if ctx.dry_run:
            return obj
        stored = self.store.put(info.storage_key, obj)
        if info.storage_key == CRD_GR:
            for hook in self.on_crd_change:
                hook(stored.obj, False)
        return stored.obj

    @staticmethod
    def _list_keys(info: ResourceInfo) -> SchemaHints | None:
        """List and map types for ownership tracking: CRD schema markers for CRs, built-in tables otherwise."""
        return SchemaHints(info.schema) if info.is_custom else None

    @staticmethod
    def _reset_fields(info: ResourceInfo, subresource: str) -> list[tuple[str, ...]] | None:
        """Fields an apply to this endpoint can never own (status on the main resource, when split off)."""
        if not subresource and info.status_subresource:
            return [("status",)]
        return None

    def _manager(self, ctx: WriteContext, default: str = "unknown") -> str:
        return ctx.field_manager or default

    # ------------------------------------------------------------------------------------ create

    async def create(
        self,
        info: ResourceInfo,
        namespace: str,
        body: Any,
        ctx: WriteContext,
        *,
        applied_fields: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        obj = builtin.ensure_object(body)
        self._name_new_object(info, namespace, obj["metadata"])
        self._check_namespace(info, namespace, creating=True)
        now = self.clock()
        _stamp_new_identity(obj["metadata"], now)
        if info.status_subresource and info.is_custom:
            obj.pop("status", None)
        obj = self._validate(info, obj, None, ctx, check_unknown=True)
        obj = self._prepare_created(info, obj, now)
        admitted = await self._admit(info, "CREATE", obj, None, ctx)
        assert admitted is not None
        obj = admitted
        ns, name = _ns_and_name(obj)
        if self.store.get(info.storage_key, ns, name) is not None:
            raise StatusError(
                409,
                "AlreadyExists",
                f'{info.resource}{"." + info.group if info.group else ""} "{name}" already exists',
                name=name,
                group=info.group,
                kind=info.resource,
            )
        obj = self._created_managed_fields(info, obj, ctx, applied_fields, now)
        created = self._persist(info, obj, ctx)
        if info.storage_key == CORE_NS and not ctx.dry_run:
            for hook in self.on_namespace_created:
                hook(name)
        return created

    def _name_new_object(self, info: ResourceInfo, namespace: str, meta: dict[str, Any]) -> None:
        """The request's namespace becomes the object's (the body may not name another; a cluster-scoped object
        has none), and a generateName a free name."""
        body_ns = meta.get("namespace")
        if info.namespaced:
            if body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            meta["name"] = self._generated_name(info, namespace, meta.get("generateName"))

    def _generated_name(self, info: ResourceInfo, namespace: str, gen: Any) -> str:
        """kube-apiserver's alphabet (no vowels), and its retry on a taken name (RetryGenerateName, GA 1.31)."""
        if not gen:
            raise invalid(
                info.kind,
                info.group,
                "",
                [
                    Cause(
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                        "metadata.name",
                    )
                ],
            )
        store_ns = namespace if info.namespaced else ""
        name = ""
        for _ in range(8):
            name = f"{gen[:58]}{''.join(random.choices(_GENERATE_ALPHABET, k=5))}"
            if self.store.get(info.storage_key, store_ns, name) is None:
                break
        return name

    def _prepare_created(self, info: ResourceInfo, obj: dict[str, Any], now: datetime) -> dict[str, Any]:
        """The fields the server sets on a validated new object: generation, kind defaults, a Service's
        cluster IP, a pod's service account token volume, Go's form for built-ins, a CRD's status."""
        if info.has_generation:
            obj["metadata"]["generation"] = 1
        builtin.prepare_create(info.group, info.kind, obj)
        if info.storage_key == SERVICES_GR:
            services.allocate(obj, (s.obj for s in self.store.iter(SERVICES_GR)))
        if info.storage_key == PODS_GR:
            account = (obj.get("spec") or {}).get("serviceAccountName") or "default"
            found = self.store.get(SERVICE_ACCOUNTS_GR, obj["metadata"].get("namespace", ""), str(account))
            serviceaccount_admission.admit(obj, found.obj if found is not None else None)
        if not info.is_custom:
            obj = gojson.canonical(info.api_version, info.kind, obj)
            builtin.normalize(info.group, info.kind, obj)
        if info.storage_key == CRD_GR:
            obj["status"] = crds.crd_established_status(obj, rfc3339(now))
            fins = obj["metadata"].setdefault("finalizers", [])
            if CRD_CLEANUP not in fins:
                fins.append(CRD_CLEANUP)
        return obj

    def _created_managed_fields(
        self,
        info: ResourceInfo,
        obj: dict[str, Any],
        ctx: WriteContext,
        applied_fields: list[dict[str, Any]] | None,
        now: datetime,
    ) -> dict[str, Any]:
        """managedFields of a new object: the applier's (which may own nothing), or the creator's."""
        obj["metadata"].pop("managedFields", None)
        if applied_fields is not None:
            if applied_fields:
                obj["metadata"]["managedFields"] = applied_fields
            return obj
        return update_managed_fields(
            None,
            obj,
            manager=self._manager(ctx),
            operation="Update",
            api_version=info.api_version,
            now=rfc3339(now),
            list_keys=self._list_keys(info),
        )

    # ------------------------------------------------------------------------------------ update

    def _merge_for_subresource(
        self, info: ResourceInfo, old: dict[str, Any], new: dict[str, Any], subresource: str
    ) -> dict[str, Any]:
        """Status split: the main resource ignores status, /status ignores everything else."""
        if subresource == "status":
            merged = dict(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            merged["metadata"] = dict(old["metadata"])
            # The status endpoint still honours the caller's resourceVersion precondition.
            if new.get("metadata", {}).get("resourceVersion"):
                merged["metadata"]["resourceVersion"] = new["metadata"]["resourceVersion"]
            return merged
        if info.status_subresource:
            new = dict(new)
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        return new

    async def update(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        body: Any,
        ctx: WriteContext,
        subresource: str = "",
        *,
        require_rv: bool | None = None,
        operation_manager: str = "Update",
        check_unknown: bool = True,
        owned: bool = False,
    ) -> dict[str, Any]:
        """Replace the stored object (PUT, and every patch once applied). `owned`: `body` is a fresh object no
        one else holds (a patch's result), so it is not copied again before the write edits it."""
        new = builtin.ensure_object(body)
        _check_update_target(info, namespace, name, new["metadata"])
        self._check_namespace(info, namespace, creating=False)
        current = self.get(info, namespace, name)
        old = current.obj
        _check_update_version(info, name, new["metadata"].get("resourceVersion"), old, require_rv)
        if not owned:
            new = clone(new)
        new = self._merge_for_subresource(info, old, new, subresource)
        _keep_server_metadata(info, namespace, name, new["metadata"], old["metadata"])
        if old["metadata"].get("deletionTimestamp"):
            _refuse_new_finalizers(info, name, new["metadata"], old["metadata"])
        new = self._validate(info, new, old, ctx, check_unknown=check_unknown)
        if info.storage_key == SERVICES_GR and not subresource:
            services.keep_allocated(old, new, (s.obj for s in self.store.iter(SERVICES_GR)))
        admitted = await self._admit(info, "UPDATE", new, old, ctx, subresource)
        assert admitted is not None
        new = admitted
        self._bump_generation(info, new, old)
        if operation_manager == "Update":
            new = update_managed_fields(
                old,
                new,
                manager=self._manager(ctx),
                operation="Update",
                api_version=info.api_version,
                now=rfc3339(self.clock()),
                subresource=subresource,
                list_keys=self._list_keys(info),
            )
        return self._finish_update(info, old, new, ctx)

    def _finish_update(
        self, info: ResourceInfo, old: dict[str, Any], new: dict[str, Any], ctx: WriteContext
    ) -> dict[str, Any]:
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if _without(new, "metadata") == _without(old, "metadata") and _meta_sans_volatile(
            new["metadata"]
        ) == _meta_sans_volatile(old["metadata"]):
            return old  # a no-op write: no new resourceVersion, no event
        if (
            new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
            # A graceful deletion still running (a pod its kubelet has not confirmed) outlives its last
            # finalizer: only the grace-0 delete removes it (the registry's shouldDeleteDuringUpdate).
            and not old["metadata"].get("deletionGracePeriodSeconds")
        ):
            if ctx.dry_run:
                return new
            ns, name = _ns_and_name(new)
            gone = self.store.remove(info.storage_key, ns, name)
            assert gone is not None
            self._after_delete(info, gone.obj)
            return gone.obj
        return self._persist(info, new, ctx)

    # ------------------------------------------------------------------------------------ patch

    async def patch(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        ctx: WriteContext,
        subresource: str = "",
        force: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        ctype = content_type.split(";")[0].strip().lower()
        if ctype in (APPLY_PATCH, APPLY_PATCH_CBOR):
            return await self._apply(info, namespace, name, body, ctx, subresource, force)
        if force:
            raise bad_request("force: Invalid value: true: may not be specified for non-apply patch")
        supported = (JSON_PATCH, MERGE_PATCH) if info.is_custom else (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)
        if ctype not in supported:
            # Upstream negotiates the patch type before it looks the object up: 415 even when it is missing.
            accepted = ", ".join([*supported, APPLY_PATCH])
            raise unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types include: {accepted}"
            )
        self._check_namespace(info, namespace, creating=False)
        current = self.get(info, namespace, name)
        patched = _patched(info, ctype, current.obj, body)
        _check_patched(info, name, patched, current.obj)
        # A JSON or merge patch builds its result from copies of the stored object and the patch's values.
        owned = ctype in (JSON_PATCH, MERGE_PATCH)
        obj = await self.update(info, namespace, name, patched, ctx, subresource, require_rv=False, owned=owned)
        return 200, obj

    async def _apply(
        self,
        info: ResourceInfo,
        namespace: str,
        name: str,
        body: Any,
        ctx: WriteContext,
        subresource: str,
        force: bool,
    ) -> tuple[int, dict[str, Any]]:
        config = _apply_config(info, name, body, ctx)
        self._check_namespace(info, namespace, creating=False)
        live = self.store.get(info.storage_key, namespace if info.namespaced else "", name)
        cmeta = config["metadata"]
        cmeta.setdefault("name", name)
        if info.namespaced:
            cmeta.setdefault("namespace", namespace)
        if live is None:
            if subresource:
                raise not_found(info.resource, info.group, name)
            return 201, await self._apply_create(info, namespace, config, ctx, force)
        old = live.obj
        merged = server_side_apply(
            clone(old),
            clone(config),
            manager=ctx.field_manager,
            force=force,
            api_version=info.api_version,
            now=rfc3339(self.clock()),
            subresource=subresource,
            list_keys=self._list_keys(info),
            reset_fields=self._reset_fields(info, subresource),
        )
        rv = cmeta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(info.resource, info.group, name)
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        obj = await self.update(
            info,
            namespace,
            name,
            merged,
            ctx,
            subresource,
            require_rv=False,
            operation_manager="Apply",
            check_unknown=False,
        )
        return 200, obj

    async def _apply_create(
        self, info: ResourceInfo, namespace: str, config: dict[str, Any], ctx: WriteContext, force: bool
    ) -> dict[str, Any]:
        """An apply to a missing object creates it, owned by the applier alone."""
        obj = server_side_apply(
            None,
            clone(config),
            manager=ctx.field_manager,
            force=force,
            api_version=info.api_version,
            now=rfc3339(self.clock()),
            list_keys=self._list_keys(info),
            reset_fields=self._reset_fields(info, ""),
        )
        return await self.create(
            info,
            namespace,
            obj,
            WriteContext(ctx.user, ctx.dry_run, ctx.field_manager, "Ignore", ctx.warnings),
            applied_fields=obj["metadata"].get("managedFields") or [],
        )

    # ------------------------------------------------------------------------------------ delete

    async def delete(
        self, info: ResourceInfo, namespace: str, name: str, options: dict[str, Any], ctx: WriteContext
    ) -> tuple[int, dict[str, Any]]:
        current = self.get(info, namespace, name)
        old = current.obj
        _check_delete_preconditions(info, name, old["metadata"], options)
        await self._admit(
            info,
            "DELETE",
            None,
            old,
            ctx,
            options=dict(options, kind="DeleteOptions", apiVersion="meta.k8s.io/v1"),
        )
        policy = _propagation_policy(options)
        new = clone(old)
        nmeta = new["metadata"]
        now = self.clock()
        if info.storage_key == PODS_GR:
            grace = options.get("gracePeriodSeconds")
            pending = self._graceful_pod_delete(info, old, new, grace, policy, ctx, now)
            if pending is not None:
                return 200, pending
        self._add_policy_finalizer(nmeta, policy)
        if nmeta.get("finalizers"):
            if not nmeta.get("deletionTimestamp"):
                nmeta["deletionTimestamp"] = rfc3339(now)
                nmeta["deletionGracePeriodSeconds"] = 0
                if info.has_generation and "generation" in nmeta:
                    nmeta["generation"] = int(nmeta["generation"]) + 1
            elif nmeta.get("deletionGracePeriodSeconds"):
                nmeta["deletionGracePeriodSeconds"] = 0
            if info.storage_key == CORE_NS:
                new.setdefault("status", {})["phase"] = "Terminating"
            return 200, self._write_deleting(info, old, new, ctx)
        if info.storage_key == CORE_NS:
            # Namespaces always go through the namespace controller (spec.finalizers: kubernetes).
            nmeta["deletionTimestamp"] = nmeta.get("deletionTimestamp") or rfc3339(now)
            nmeta["deletionGracePeriodSeconds"] = 0
            new.setdefault("status", {})["phase"] = "Terminating"
            return 200, self._write_deleting(info, old, new, ctx)
        if ctx.dry_run:
            return 200, old
        gone = self.store.remove(info.storage_key, namespace if info.namespaced else "", name)
        assert gone is not None
        self._after_delete(info, gone.obj)
        return 200, gone.obj

    def _graceful_pod_delete(
        self,
        info: ResourceInfo,
        old: dict[str, Any],
        new: dict[str, Any],
        grace: Any,
        policy: str | None,
        ctx: WriteContext,
        now: datetime,
    ) -> dict[str, Any] | None:
        """Pod graceful deletion: a bound, non-terminal pod gets a deletionTimestamp its grace period ahead and
        waits for its kubelet (a shorter grace period brings it closer). None: the pod goes the usual way."""
        nmeta = new["metadata"]
        phase = (old.get("status") or {}).get("phase")
        bound = bool((old.get("spec") or {}).get("nodeName"))
        if grace is None:
            grace = (old.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if not bound or phase in ("Succeeded", "Failed"):
            grace = 0
        current_grace = nmeta.get("deletionGracePeriodSeconds")
        if int(grace) > 0 and (current_grace is None or int(grace) < int(current_grace)):
            nmeta["deletionTimestamp"] = rfc3339(now + timedelta(seconds=int(grace)))
            if current_grace is None and "generation" in nmeta:
                nmeta["generation"] = int(nmeta["generation"]) + 1
            nmeta["deletionGracePeriodSeconds"] = int(grace)
            self._add_policy_finalizer(nmeta, policy)
            if ctx.dry_run:
                return new
            return self.store.put(info.storage_key, new).obj
        if int(grace) > 0 and current_grace is not None:
            return old  # already terminating with a shorter grace period
        return None

    def _write_deleting(
        self, info: ResourceInfo, old: dict[str, Any], new: dict[str, Any], ctx: WriteContext
    ) -> dict[str, Any]:
        """Store an object marked for deletion that waits for its finalizers (unless nothing changed)."""
        if ctx.dry_run:
            return new
        if new == old:
            return old
        return self.store.put(info.storage_key, new).obj

    @staticmethod
    def _add_policy_finalizer(meta: dict[str, Any], policy: str | None) -> None:
        if policy in ("Foreground", "Orphan"):
            fin = "foregroundDeletion" if policy == "Foreground" else "orphan"
            existing = meta.get("finalizers") or []
            if fin not in existing:
                meta["finalizers"] = [*existing, fin]

    def _after_delete(self, info: ResourceInfo, obj: dict[str, Any]) -> None:
        if info.storage_key == CRD_GR:
            for hook in self.on_crd_change:
                hook(obj, True)

    # ------------------------------------------------------------------------------------ subresources

    async def evict(self, namespace: str, name: str, body: Any, ctx: WriteContext) -> dict[str, Any]:
        """Eviction: PDB-guarded graceful delete."""
        if not isinstance(body, dict):
            raise bad_request("the body of an eviction must be an Eviction object")
        bname = (body.get("metadata") or {}).get("name")
        if bname and bname != name:
            raise bad_request(f"name in URL does not match name in Eviction object: {name} != {bname}")
        info = self.registry.lookup("", "v1", "pods")
        assert info is not None
        pod = self.get(info, namespace, name).obj
        opts = dict(body.get("deleteOptions") or {})
        if body.get("dryRun") or opts.get("dryRun"):
            ctx.dry_run = True
        phase = (pod.get("status") or {}).get("phase")
        skip_pdb = (
            phase in ("Pending", "Succeeded", "Failed")
            or pod["metadata"].get("deletionTimestamp")
            or not (pod.get("spec") or {}).get("nodeName")
        )
        pdb: Stored | None = None
        if not skip_pdb:
            labels = pod["metadata"].get("labels") or {}
            matching = []
            for s in self.store.iter(PDB_GR, namespace):
                try:
                    sel = label_selector_from_object((s.obj.get("spec") or {}).get("selector"))
                except ValueError:
                    continue
                if sel.matches(labels):
                    matching.append(s)
            if len(matching) > 1:
                raise StatusError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                    "does not support.",
                )
            if matching:
                pdb = matching[0]
                self._check_pdb(pdb.obj, pod)
        if pdb is not None and not ctx.dry_run:
            p = clone(pdb.obj)
            st = p.setdefault("status", {})
            st["disruptionsAllowed"] = max(0, int(st.get("disruptionsAllowed", 0)) - 1)
            st.setdefault("disruptedPods", {})[name] = rfc3339(self.clock())
            self.store.put(PDB_GR, p)
        await self.delete(info, namespace, name, opts, ctx)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _check_pdb(self, pdb: dict[str, Any], pod: dict[str, Any]) -> None:
        st = pdb.get("status") or {}
        meta = pdb["metadata"]
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if not ready and policy == "AlwaysAllow":
            return
        if int(st.get("observedGeneration", 0)) < int(meta.get("generation", 1)):
            raise StatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    Cause(
                        "DisruptionBudget",
                        f"The disruption budget {meta['name']} is still being processed by the server.",
                    )
                ],
                retry_after=10,
            )
        if (
            not ready
            and int(st.get("currentHealthy", 0)) >= int(st.get("desiredHealthy", 0))
            and int(st.get("desiredHealthy", 0)) > 0
        ):
            return  # IfHealthyBudget: unready pods may go while the budget is healthy
        if int(st.get("disruptionsAllowed", 0)) <= 0:
            raise StatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    Cause(
                        "DisruptionBudget",
                        f"The disruption budget {meta['name']} needs {st.get('desiredHealthy', 0)} healthy "
                        f"pods and has {st.get('currentHealthy', 0)} currently",
                    )
                ],
                retry_after=10,
            )

    async def bind(self, namespace: str, name: str, body: Any, ctx: WriteContext) -> dict[str, Any]:
        """Binding: sets spec.nodeName and PodScheduled=True once."""
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise bad_request("the body of a binding must be a Binding with a target")
        target = body["target"].get("name")
        if not target:
            raise invalid("Binding", "", name, [Cause("FieldValueRequired", "Required value", "target.name")])
        info = self.registry.lookup("", "v1", "pods")
        assert info is not None
        pod = self.get(info, namespace, name).obj
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict("pods", "", name, "pod is being deleted, cannot be assigned to a host")
        if (pod.get("spec") or {}).get("nodeName"):
            raise conflict(
                "pods", "", name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        if (pod.get("spec") or {}).get("schedulingGates"):
            raise conflict("pods", "", name, f"pod {name} has non-empty .spec.schedulingGates")
        new = clone(pod)
        new["spec"]["nodeName"] = target
        st = new.setdefault("status", {})
        conds = [c for c in st.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(self.clock()),
            }
        )
        st["conditions"] = conds
        if not ctx.dry_run:
            self.store.put(info.storage_key, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def decode_json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise bad_request(f"the body of the request could not be decoded as JSON: {e}") from None


def scrub_surrogates(value: Any) -> Any:
    """Lone UTF-16 surrogates (YAML `"\\ud800"`) become U+FFFD as in Go's decoder; they cannot be re-encoded.
    (msgspec already refuses them in JSON.)"""
    if isinstance(value, str):
        if any("\ud800" <= c <= "\udfff" for c in value):
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
        return value
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    return value

