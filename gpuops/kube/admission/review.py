"""One AdmissionReview (admission.k8s.io/v1) in, one out: parsing, the answer, and the bounds a hostile body meets.

A pure function of the request body and the route's mutation, so that a server may run it in a worker process
(a pod of thousands of containers then costs that process's CPU, not a lock the server's threads wait on).
"""

from __future__ import annotations

import base64
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from .http import Answer

__all__ = ["ADMISSION_V1", "MAX_DEPTH", "JSONPatchOp", "MutationResult", "Reviewed", "review", "text_answer"]

ADMISSION_V1: Final = "admission.k8s.io/v1"

JSONPatchOp = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MutationResult:
    """`patch` applies to the pod as given; `denied` (when set) is the message the user sees instead."""

    patch: list[JSONPatchOp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    denied: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.patch)


class _BadReview(ValueError):
    pass


def _parse_review(body: Any) -> tuple[str, Mapping[str, Any]]:
    """(uid, request) of an admission.k8s.io/v1 AdmissionReview; anything else is the caller's error (400)."""
    if not isinstance(body, Mapping):
        raise _BadReview("the body is not a JSON object")
    if body.get("apiVersion") != ADMISSION_V1 or body.get("kind") != "AdmissionReview":
        raise _BadReview(f"expected an AdmissionReview of {ADMISSION_V1}, got apiVersion={body.get('apiVersion')!r} "
                         f"kind={body.get('kind')!r}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise _BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise _BadReview("the AdmissionReview request has no uid")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, Mapping):
        raise _BadReview("request.object is not an object")
    return uid, request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind") or {}
    return (
        request.get("operation") == "CREATE"
        and isinstance(kind, Mapping)
        and (kind.get("group"), kind.get("kind")) == ("", "Pod")
        and not request.get("subResource")
        and isinstance(request.get("object"), Mapping)
    )


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "response": response}


def _pod_ref(request: Mapping[str, Any]) -> str:
    meta = (request.get("object") or {}).get("metadata") or {}
    name = meta.get("name") or request.get("name") or (f"{meta.get('generateName')}*" if meta.get("generateName")
                                                        else "?")
    return f"{request.get('namespace') or meta.get('namespace') or ''}/{name}"


@dataclass(frozen=True, slots=True)
class Reviewed:
    answer: Answer
    result: str
    """The requests metric's label: mutated, unchanged, denied or error."""
    notes: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    """Log lines (level, event, fields) for the server to write: a worker process has no log of its own."""


def review(body: bytes, mutate_pod: Callable[[Mapping[str, Any]], MutationResult]) -> Reviewed:
    """The answer to one AdmissionReview body; pure, so that it can run in a worker process."""
    try:
        uid, req = _parse_review(_decode(body))
    except _BadReview as e:
        return Reviewed(text_answer(400, f"bad AdmissionReview: {e}"), "error")
    if not _is_pod_create(req):  # a misconfigured rule: never block what we do not handle
        return Reviewed(_json({"uid": uid, "allowed": True}), "unchanged")
    try:
        outcome = mutate_pod(_with_namespace(req))
    except Exception:
        return Reviewed(text_answer(500, "internal error while mutating the pod"), "error",
                        (("error", "mutating a pod failed", {"pod": _pod_ref(req), "error": traceback.format_exc()}),))
    response: dict[str, Any] = {"uid": uid, "allowed": outcome.denied is None}
    result = "unchanged"
    notes: list[tuple[str, str, dict[str, Any]]] = []
    if outcome.denied is not None:
        result = "denied"
        response["status"] = {"status": "Failure", "code": 403, "reason": "Forbidden", "message": outcome.denied}
        notes.append(("info", "pod denied", {"pod": _pod_ref(req), "reason": outcome.denied}))
    elif outcome.patch:
        result = "mutated"
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(msgspec.json.encode(outcome.patch)).decode()
        notes.append(("debug", "pod mutated", {"pod": _pod_ref(req), "operations": len(outcome.patch)}))
    if outcome.warnings:
        response["warnings"] = list(outcome.warnings)
    return Reviewed(_json(response), result, tuple(notes))


def _with_namespace(request: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod as the mutation sees it: a pod created without metadata.namespace (the usual case: it is in the
    URL) gets the request's, so the mutation knows where the pod is. The patch paths stay valid either way."""
    obj: Mapping[str, Any] = request["object"]
    meta = obj.get("metadata")
    namespace = request.get("namespace")
    if not namespace or (isinstance(meta, Mapping) and meta.get("namespace")):
        return obj
    return {**obj, "metadata": {**(meta if isinstance(meta, Mapping) else {}), "namespace": namespace}}


MAX_DEPTH: Final = 64
"""Nesting a review may have: a pod nests about 15 levels (managedFields about 20); deeper is refused (400)."""


def _decode(body: bytes) -> Any:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise _BadReview(f"not JSON: {e}") from None
    except RecursionError:
        raise _BadReview(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _deeper_than(doc, MAX_DEPTH):
        raise _BadReview(f"JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def _deeper_than(doc: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        if children and depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def text_answer(status: int, text: str) -> Answer:
    return Answer(status, f"{text}\n".encode(), "text/plain")


def _json(response: dict[str, Any]) -> Answer:
    return Answer(200, msgspec.json.encode(_review(response)))
