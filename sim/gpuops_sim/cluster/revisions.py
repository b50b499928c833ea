"""What the DaemonSet and StatefulSet controllers share: ControllerRevisions, hashes and pod readiness.

A ControllerRevision records one version of a workload's pod template as the patch that would restore it
(`{"spec":{"template":{..., "$patch":"replace"}}}`), with a revision number that grows with every new or
re-adopted template. Both controllers name revisions `<owner>-<hash>` and compare them by their data bytes, so
the bytes must be stable: they are serialised the way Go's encoding/json writes a map (sorted keys, compact,
HTML characters escaped), which is what kube-controller-manager stores.

Hashes follow upstream's algorithms (FNV over the data, the collision count mixed in, digits mapped to a
consonant alphabet so no word is spelled): DaemonSets hash the template itself (`ComputeHash`, FNV-1a),
StatefulSets hash the revision data (`HashControllerRevision`, FNV-1). The byte streams differ from Go's
(which walks the Go structs), so names have the right shape and stability, not the same digits.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ..apiserver.errors import StatusError
from ..apiserver.selectors import LabelSelector, label_selector_from_object
from ..apiserver.store import GroupResource, WatchEvent
from .access import CONTROLLER_REVISIONS, PODS, ClusterAccess

CONTROLLER_REVISION_HASH = "controller-revision-hash"  # on pods (and DaemonSet revisions)
REVISION_HASH_LABEL = "controller.kubernetes.io/hash"  # on StatefulSet revisions
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand's alphabet: no vowels, no 0/1/3
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_MAX_PREFIX = 223  # revision names stay within 253 characters


# ------------------------------------------------------------------------------------------ bytes and hashes


def go_json(value: Any) -> bytes:
    """`value` as Go marshals a decoded map: sorted keys, no spaces, UTF-8, `<>&` escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for raw, escaped in _GO_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text.encode()


def fnv32(data: bytes) -> int:
    """FNV-1 (multiply, then xor), Go's `hash/fnv.New32`."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h * _FNV_PRIME) & 0xFFFFFFFF) ^ b
    return h


def fnv32a(data: bytes) -> int:
    """FNV-1a (xor, then multiply), Go's `hash/fnv.New32a`."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    """Map each byte onto the consonant alphabet, as `rand.SafeEncodeString` does (no accidental words)."""
    return "".join(_SAFE[b % len(_SAFE)] for b in text.encode())


def template_hash(template: Any, collision_count: int | None) -> str:
    """The DaemonSet revision hash (`controller.ComputeHash`): the template, then the collision count."""
    data = go_json(template)
    if collision_count is not None:
        data += struct.pack("<Q", collision_count & 0xFFFFFFFF)
    return safe_encode(str(fnv32a(data)))


def revision_hash(data: bytes, probe: int | None) -> str:
    """The StatefulSet revision hash (`history.HashControllerRevision`): the data bytes, then the probe."""
    if probe is not None:
        data += str(probe).encode()
    return safe_encode(str(fnv32(data)))


def revision_name(prefix: str, hash_: str) -> str:
    return f"{prefix[:_MAX_PREFIX]}-{hash_}"


# ------------------------------------------------------------------------------------------ revision objects


def template_patch(owner: dict[str, Any]) -> dict[str, Any]:
    """The revision data: a strategic merge patch that puts the owner's current pod template back whole."""
    template = dict(((owner.get("spec") or {}).get("template")) or {})
    template["$patch"] = "replace"
    return {"spec": {"template": template}}


def template_of(revision: dict[str, Any]) -> dict[str, Any]:
    """The pod template a revision restores (its data without the patch directive)."""
    template = dict((((revision.get("data") or {}).get("spec") or {}).get("template")) or {})
    template.pop("$patch", None)
    return template


def revision_data(revision: dict[str, Any]) -> bytes:
    return go_json(revision.get("data"))


def revision_number(revision: dict[str, Any]) -> int:
    return int(revision.get("revision") or 0)


def revision_order(revision: dict[str, Any]) -> tuple[int, str, str]:
    """Upstream's `byRevision`: revision number, then creation time, then name."""
    meta = revision["metadata"]
    return revision_number(revision), str(meta.get("creationTimestamp") or ""), str(meta["name"])


def controller_ref(owner: dict[str, Any], kind: str, api_version: str = "apps/v1") -> dict[str, Any]:
    """`metav1.NewControllerRef`: the owner as controller, blocking its foreground deletion."""
    meta = owner["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True,
            "blockOwnerDeletion": True}


def controller_uid(obj: dict[str, Any], kind: str) -> str | None:
    """The uid of the controlling owner of `kind`, if the object has one."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("uid") or "") or None
    return None


def has_controller(obj: dict[str, Any]) -> bool:
    return any(ref.get("controller") for ref in obj["metadata"].get("ownerReferences") or ())


def selector_of(owner: dict[str, Any]) -> LabelSelector:
    """The owner's spec.selector; one that cannot be parsed selects nothing (and so adopts nothing)."""
    try:
        return label_selector_from_object((owner.get("spec") or {}).get("selector"))
    except ValueError:
        return LabelSelector.match_none()


def adoptable(owner: dict[str, Any], pod: dict[str, Any], selector: LabelSelector) -> bool:
    """`ClaimPods` adopts a live orphan whose labels the (live) owner's selector matches."""
    return (not has_controller(pod) and not pod["metadata"].get("deletionTimestamp")
            and not owner["metadata"].get("deletionTimestamp") and not selector.empty
            and selector.matches(pod["metadata"].get("labels")))


async def adopt(access: ClusterAccess, owner: dict[str, Any], kind: str, obj: dict[str, Any], gr: GroupResource,
                api_version: str = "apps/v1") -> bool:
    """Add the owner as controller; False when the object changed meanwhile (looked at again later)."""
    meta = obj["metadata"]
    refs = [*(meta.get("ownerReferences") or ()), controller_ref(owner, kind, api_version)]
    return await _set_refs(access, obj, gr, refs)


async def release(access: ClusterAccess, owner_uid: str, obj: dict[str, Any], gr: GroupResource) -> bool:
    """Drop the owner's reference from an object its selector no longer matches (`ClaimPods` releasing)."""
    refs = [r for r in obj["metadata"].get("ownerReferences") or () if r.get("uid") != owner_uid]
    return await _set_refs(access, obj, gr, refs)


async def _set_refs(access: ClusterAccess, obj: dict[str, Any], gr: GroupResource, refs: list[dict[str, Any]]) -> bool:
    meta = obj["metadata"]
    body = {"metadata": {"ownerReferences": refs or None, "resourceVersion": meta.get("resourceVersion")}}
    try:
        await access.patch(gr, meta.get("namespace", ""), meta["name"], body)
    except StatusError as e:
        if e.code in (404, 409):
            return False
        raise
    return True


class Orphans:
    """Pods without a controller that an owner of one kind might adopt, routed to the owners whose selector
    matches them. Only pods that are new, freshly released or relabelled are looked at, so bare pods that
    merely change status cost nothing."""

    def __init__(self, access: ClusterAccess, owners: GroupResource,
                 member: Callable[[dict[str, Any], dict[str, Any]], bool]) -> None:
        self.access = access
        self.owners = owners
        self.member = member  # beyond the selector: a StatefulSet adopts only pods named after it
        self._pending: set[tuple[str, str]] = set()
        self._routed: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def note(self, ev: WatchEvent) -> bool:
        """Remember a pod event's orphan if it is worth routing; True if it is."""
        new = ev.new.obj
        if ev.type == "DELETED" or has_controller(new) or new["metadata"].get("deletionTimestamp"):
            return False
        prev = ev.prev.obj if ev.prev is not None else None
        if prev is None or has_controller(prev) or prev["metadata"].get("labels") != new["metadata"].get("labels"):
            self._pending.add(ev.key)
            return True
        return False

    def scan(self, namespace: str) -> None:
        """Every orphan of the namespace (a new owner may adopt pods that were already there)."""
        for pod in self.access.iter(PODS, namespace):
            if not has_controller(pod) and not pod["metadata"].get("deletionTimestamp"):
                self._pending.add((namespace, pod["metadata"]["name"]))

    def route(self) -> set[tuple[str, str]]:
        """Hand pending orphans to the owners that would adopt them; returns those owners' keys."""
        touched: set[tuple[str, str]] = set()
        pending, self._pending = self._pending, set()
        for ns, name in pending:
            pod = self.access.get(PODS, ns, name)
            if pod is None:
                continue
            for owner in self.access.iter(self.owners, ns):
                if adoptable(owner, pod, selector_of(owner)) and self.member(owner, pod):
                    key = (ns, owner["metadata"]["name"])
                    self._routed.setdefault(key, set()).add((ns, name))
                    touched.add(key)
        return touched

    def take(self, owner_key: tuple[str, str]) -> list[dict[str, Any]]:
        """The orphans routed to this owner that are still orphans."""
        out = []
        for key in sorted(self._routed.pop(owner_key, ())):
            pod = self.access.get(PODS, *key)
            if pod is not None and not has_controller(pod):
                out.append(pod)
        return out

    def forget(self, owner_key: tuple[str, str]) -> None:
        self._routed.pop(owner_key, None)


def owned_revisions(access: ClusterAccess, namespace: str, owner_uid: str, kind: str) -> list[dict[str, Any]]:
    """The owner's ControllerRevisions, oldest first (revisions are few, so a namespace scan is cheap)."""
    out = [r for r in access.iter(CONTROLLER_REVISIONS, namespace) if controller_uid(r, kind) == owner_uid
           and not r["metadata"].get("deletionTimestamp")]
    return sorted(out, key=revision_order)


def new_revision(owner: dict[str, Any], kind: str, name: str, labels: dict[str, str], number: int,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": owner["metadata"].get("namespace", "default"),
                            "labels": labels, "ownerReferences": [controller_ref(owner, kind)]}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta,
            "data": template_patch(owner), "revision": number}


async def set_revision_number(access: ClusterAccess, revision: dict[str, Any], number: int) -> dict[str, Any]:
    """Renumber a revision (a template rolled back to becomes the newest again)."""
    meta = revision["metadata"]
    return await access.patch(CONTROLLER_REVISIONS, meta.get("namespace", ""), meta["name"], {"revision": number})


async def delete_revision(access: ClusterAccess, revision: dict[str, Any]) -> None:
    meta = revision["metadata"]
    await access.delete(CONTROLLER_REVISIONS, meta.get("namespace", ""), meta["name"], uid=meta.get("uid"))


# ------------------------------------------------------------------------------------------ pods


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def terminal(pod: dict[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def _ready_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return dict(c)
    return None


def pod_ready(pod: dict[str, Any]) -> bool:
    c = _ready_condition(pod)
    return c is not None and c.get("status") == "True"


def available_after(pod: dict[str, Any], min_ready_seconds: int, now: datetime) -> float | None:
    """Seconds until a ready pod counts as available (0 when it already does); None when it is not ready.

    `podutil.IsPodAvailable`: ready, and ready for longer than minReadySeconds."""
    c = _ready_condition(pod)
    if c is None or c.get("status") != "True":
        return None
    if min_ready_seconds <= 0:
        return 0.0
    since = parse_time(c.get("lastTransitionTime"))
    if since is None:
        return 0.0
    remaining = (since + timedelta(seconds=min_ready_seconds) - now).total_seconds()
    return max(remaining, 0.0)


def pod_available(pod: dict[str, Any], min_ready_seconds: int, now: datetime) -> bool:
    return available_after(pod, min_ready_seconds, now) == 0.0


def scaled_value(value: Any, total: int, *, round_up: bool, default: int) -> int:
    """An int-or-percent (`intstr.GetScaledValueFromIntOrPercent`); `default` when unset or unreadable."""
    if value is None:
        return default
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.endswith("%"):
        try:
            return int(text)
        except ValueError:
            return default
    try:
        percent = int(text[:-1])
    except ValueError:
        return default
    scaled = percent * total
    return -(-scaled // 100) if round_up else scaled // 100


__all__ = [
    "CONTROLLER_REVISION_HASH",
    "REVISION_HASH_LABEL",
    "Orphans",
    "adopt",
    "adoptable",
    "available_after",
    "controller_ref",
    "controller_uid",
    "delete_revision",
    "fnv32",
    "fnv32a",
    "go_json",
    "has_controller",
    "new_revision",
    "owned_revisions",
    "parse_time",
    "phase",
    "pod_available",
    "pod_ready",
    "release",
    "revision_data",
    "revision_hash",
    "revision_name",
    "revision_number",
    "revision_order",
    "safe_encode",
    "scaled_value",
    "selector_of",
    "set_revision_number",
    "template_hash",
    "template_of",
    "template_patch",
    "terminal",
    "terminating",
]
