"""The scale subresource (autoscaling/v1 Scale) of Deployments, ReplicaSets, StatefulSets and
ReplicationControllers: what `kubectl scale` and a HorizontalPodAutoscaler read and write.

A Scale is a view of its parent: `spec.replicas` is the parent's, `status.replicas` the parent's status
count, `status.selector` its label selector in string form. Writing it writes the parent's replicas (with
the Scale's resourceVersion as the precondition, when it carries one).
"""

from __future__ import annotations

from typing import Any

from .errors import Cause, bad_request, conflict, invalid, unsupported_media_type
from .objects import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, ObjectAPI, WriteContext
from .patch import apply_json_patch, apply_merge_patch
from .resources import ResourceInfo
from .selectors import label_selector_from_object

SCALE_API_VERSION = "autoscaling/v1"


def _selector_text(info: ResourceInfo, obj: dict[str, Any]) -> str:
    selector = (obj.get("spec") or {}).get("selector")
    if info.kind == "ReplicationController":  # a plain map of labels
        return ",".join(f"{k}={v}" for k, v in sorted((selector or {}).items()))
    return str(label_selector_from_object(selector)) if isinstance(selector, dict) else ""


def scale_of(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    status: dict[str, Any] = {"replicas": int((obj.get("status") or {}).get("replicas") or 0)}
    selector = _selector_text(info, obj)
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": SCALE_API_VERSION,
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {"replicas": int((obj.get("spec") or {}).get("replicas") or 0)},
        "status": status,
    }


def _replicas(info: ResourceInfo, name: str, scale: Any) -> int:
    if not isinstance(scale, dict) or not isinstance(scale.get("spec", {}), dict):
        raise bad_request("the body of a scale request must be a Scale object")
    replicas = scale.get("spec", {}).get("replicas", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise bad_request(f"spec.replicas: must be an integer, not {replicas!r}")
    if replicas < 0:
        cause = Cause("FieldValueInvalid", f"Invalid value: {replicas}: must be greater than or equal to 0",
                      "spec.replicas")
        raise invalid("Scale", "autoscaling", name, [cause])
    return replicas


async def write_scale(
    api: ObjectAPI, info: ResourceInfo, namespace: str, name: str, scale: Any, ctx: WriteContext
) -> dict[str, Any]:
    """Set the parent's spec.replicas from a Scale; answer the Scale after the write."""
    replicas = _replicas(info, name, scale)
    current = api.get(info, namespace, name).obj
    rv = ((scale.get("metadata") or {}) if isinstance(scale, dict) else {}).get("resourceVersion")
    if rv and rv != current["metadata"].get("resourceVersion"):
        raise conflict(info.resource, info.group, name)
    new = dict(current, spec=dict(current.get("spec") or {}, replicas=replicas))
    written = await api.update(info, namespace, name, new, ctx, "scale", require_rv=False)
    return scale_of(info, written)


async def patch_scale(
    api: ObjectAPI, info: ResourceInfo, namespace: str, name: str, content_type: str, body: Any,
    ctx: WriteContext,
) -> dict[str, Any]:
    """A JSON, merge or strategic merge patch of the Scale view (a Scale has no list to merge by key, so
    the strategic patch merges as a merge patch does)."""
    ctype = content_type.split(";")[0].strip().lower()
    current = scale_of(info, api.get(info, namespace, name).obj)
    if ctype == JSON_PATCH:
        patched = apply_json_patch(current, body)
    elif ctype in (MERGE_PATCH, STRATEGIC_PATCH):
        if not isinstance(body, dict):
            raise bad_request("the body of a merge patch must be a JSON object")
        patched = apply_merge_patch(current, body)
    else:
        raise unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: "
            f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}"
        )
    return await write_scale(api, info, namespace, name, patched, ctx)
