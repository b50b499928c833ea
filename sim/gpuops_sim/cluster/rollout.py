"""The arithmetic of Deployment rollouts, as pure functions over stored objects (JSON dicts).

Kept apart from the controller so that the numbers users reason about (the pod-template-hash, maxSurge and
maxUnavailable resolved against replicas, proportional scaling, the revision annotations `kubectl rollout
history` and `undo` read, the status conditions `kubectl rollout status` waits on) can be tested without a
cluster. The API server may or may not have defaulted a Deployment when the controller reads it, so every
reader here applies upstream's defaults itself (RollingUpdate 25%/25%, revisionHistoryLimit 10,
progressDeadlineSeconds 600, replicas 1).

The pod-template-hash has upstream's shape (FNV-1a 32 of the template, the collisionCount mixed in as eight
little-endian bytes, the decimal sum spelt in the vowel-free alphabet of `rand.SafeEncodeString`), but it
hashes a canonical JSON form of the template, not Go's printed struct, so its value differs from a real
cluster's for the same template. It is stable, a valid label value, and changes whenever the template does.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..apiserver.quantity import parse_quantity

Obj = dict[str, Any]

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
REVISION_HISTORY = "deployment.kubernetes.io/revision-history"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ROLLBACK_TO = "deprecated.deployment.rollback.to"
# Annotations of a Deployment that are never copied onto its ReplicaSets (nor back by `kubectl rollout undo`).
SKIPPED_ANNOTATIONS = frozenset({LAST_APPLIED, REVISION, REVISION_HISTORY, DESIRED_REPLICAS, MAX_REPLICAS,
                                 ROLLBACK_TO})
REVISION_HISTORY_CHARS = 2000  # the revision-history annotation stops growing past this length
MAX_INT32 = 2**31 - 1  # revisionHistoryLimit / progressDeadlineSeconds: "keep all" / "no deadline"

NEW_RS_CREATED = "NewReplicaSetCreated"
FOUND_NEW_RS = "FoundNewReplicaSet"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"
RS_CREATE_ERROR = "ReplicaSetCreateError"
PAUSED = "DeploymentPaused"
RESUMED = "DeploymentResumed"
MIN_AVAILABLE = "MinimumReplicasAvailable"
MIN_UNAVAILABLE = "MinimumReplicasUnavailable"

_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # rand.SafeEncodeString: no vowels, no 0/1/3 look-alikes


# ------------------------------------------------------------------------------------------ pod-template-hash


def fnv32a(data: bytes) -> int:
    """FNV-1a, 32 bits: the hash function upstream's ComputeHash feeds."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def safe_encode(text: str) -> str:
    """Each byte mapped onto an alphabet without vowels, so a hash never spells a word in a resource name."""
    return "".join(_SAFE_ALPHABET[b % len(_SAFE_ALPHABET)] for b in text.encode())


def _quantity(value: Any) -> Any:
    try:
        return str(parse_quantity(value))
    except Exception:  # an unparsable quantity compares as written
        return value


def _canonical(value: Any, key: str = "") -> Any:
    """Drop what JSON can say in two ways (null or empty versus absent), compare quantities by amount: Go's
    semantic equality on the decoded structs draws the same lines for the templates kubectl sends back."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            c = _canonical(v, k)
            if key == "resources" and k in ("limits", "requests") and isinstance(c, dict):
                c = {rk: _quantity(rv) for rk, rv in c.items()}
            if c is None or c == {} or c == []:
                continue
            out[k] = c
        return out
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def canonical_template(template: Obj | None) -> Obj:
    """A pod template without its pod-template-hash label, in the canonical form hashes and comparisons use."""
    t = dict(template or {})
    meta = dict(t.get("metadata") or {})
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != HASH_LABEL}
    meta["labels"] = labels
    t["metadata"] = meta
    out: Obj = _canonical(t)
    return out


def compute_hash(template: Obj | None, collision_count: int | None) -> str:
    """The pod-template-hash label value (and ReplicaSet name suffix) for a template; see the module doc."""
    data = json.dumps(canonical_template(template), sort_keys=True, separators=(",", ":")).encode()
    if collision_count is not None:
        data += struct.pack("<I", collision_count & 0xFFFFFFFF) + b"\0\0\0\0"
    return safe_encode(str(fnv32a(data)))


def equal_ignore_hash(a: Obj | None, b: Obj | None) -> bool:
    """Whether two pod templates are the same apart from the pod-template-hash label (EqualIgnoreHash)."""
    return canonical_template(a) == canonical_template(b)


# ------------------------------------------------------------------------------------------ the spec, defaulted


def int_or_percent(value: Any, total: int, round_up: bool) -> int:
    """An IntOrString against `total`: "25%" rounds up for maxSurge and down for maxUnavailable."""
    if isinstance(value, bool):
        raise ValueError(f"invalid value for IntOrString: {value!r}")
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        raise ValueError(f"invalid value for IntOrString: invalid type: string is not a percentage: {text!r}")
    pct = int(text[:-1])
    return -((-pct * total) // 100) if round_up else (pct * total) // 100


def _opt_int(value: Any, default: int) -> int:
    return default if value is None else int(value)


@dataclass(frozen=True)
class Plan:
    """What a Deployment's spec asks for, with upstream's defaults and its fenceposts resolved."""

    replicas: int
    rolling: bool
    max_surge: int
    max_unavailable: int
    min_ready: int
    history_limit: int | None  # None: keep every old ReplicaSet
    deadline: int | None  # None: no progress deadline
    paused: bool

    @property
    def min_available(self) -> int:
        return self.replicas - self.max_unavailable

    @classmethod
    def of(cls, dep: Obj) -> Plan:
        spec = dep.get("spec") or {}
        replicas = _opt_int(spec.get("replicas"), 1)
        strategy = spec.get("strategy") or {}
        rolling = (strategy.get("type") or "RollingUpdate") == "RollingUpdate"
        surge = unavailable = 0
        if rolling:
            ru = strategy.get("rollingUpdate") or {}
            surge = int_or_percent(ru.get("maxSurge", "25%"), replicas, True)
            unavailable = int_or_percent(ru.get("maxUnavailable", "25%"), replicas, False)
            if surge == 0 and unavailable == 0:
                unavailable = 1  # both rounded down to zero: let one pod go rather than stall (ResolveFenceposts)
            unavailable = 0 if replicas == 0 else min(unavailable, replicas)
        history = _opt_int(spec.get("revisionHistoryLimit"), 10)
        deadline = _opt_int(spec.get("progressDeadlineSeconds"), 600)
        return cls(replicas=replicas, rolling=rolling, max_surge=surge, max_unavailable=unavailable,
                   min_ready=_opt_int(spec.get("minReadySeconds"), 0),
                   history_limit=None if history == MAX_INT32 else history,
                   deadline=None if deadline == MAX_INT32 else deadline, paused=bool(spec.get("paused")))


# ------------------------------------------------------------------------------------------ ReplicaSets


def replicas_of(rs: Obj | None) -> int:
    """spec.replicas of a ReplicaSet (1 when unset, as the API defaults it); 0 for no ReplicaSet."""
    if rs is None:
        return 0
    return _opt_int((rs.get("spec") or {}).get("replicas"), 1)


def status_int(obj: Obj | None, field: str) -> int:
    return int(((obj or {}).get("status") or {}).get(field) or 0)


def revision_of(rs: Obj) -> int:
    """The revision annotation as a number (0 when absent); ValueError when it is not one."""
    value = (rs["metadata"].get("annotations") or {}).get(REVISION)
    return 0 if value is None else int(value)


def max_revision(rss: list[Obj]) -> int:
    best = 0
    for rs in rss:
        try:
            best = max(best, revision_of(rs))
        except ValueError:
            continue  # an unreadable revision is skipped, as upstream skips it
    return best


def by_creation(rs: Obj) -> tuple[str, str]:
    """ReplicaSetsByCreationTimestamp: oldest first, then by name."""
    meta = rs["metadata"]
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def by_revision(rs: Obj) -> tuple[int, str, str]:
    try:
        rev = revision_of(rs)
    except ValueError:
        rev = 0
    return (rev, *by_creation(rs))


def active(rss: Sequence[Obj | None]) -> list[Obj]:
    """ReplicaSets that are asked for pods (FilterActiveReplicaSets)."""
    return [rs for rs in rss if rs is not None and replicas_of(rs) > 0]


def find_new(template: Obj | None, rss: list[Obj]) -> Obj | None:
    """The oldest ReplicaSet whose template is the Deployment's (more than one only after odd histories)."""
    want = canonical_template(template)
    for rs in sorted(rss, key=by_creation):
        if canonical_template((rs.get("spec") or {}).get("template")) == want:
            return rs
    return None


def find_active_or_latest(new: Obj | None, old: list[Obj]) -> Obj | None:
    """The one ReplicaSet with pods (or the newest when none has any); None when several have pods."""
    if new is None and not old:
        return None
    newest_first = sorted(old, key=by_creation, reverse=True)
    live = active([*newest_first, new])
    if not live:
        return new if new is not None else newest_first[0]
    return live[0] if len(live) == 1 else None


def annotation_int(rs: Obj, key: str) -> int | None:
    value = (rs["metadata"].get("annotations") or {}).get(key)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def is_saturated(plan: Plan, rs: Obj | None) -> bool:
    """The new ReplicaSet owns every desired replica and all of them are available."""
    if rs is None:
        return False
    return (replicas_of(rs) == plan.replicas and annotation_int(rs, DESIRED_REPLICAS) == plan.replicas
            and status_int(rs, "availableReplicas") == plan.replicas)


def new_rs_replicas(plan: Plan, all_rs: Sequence[Obj | None], new_replicas: int) -> int:
    """How far the new ReplicaSet may grow now: up to the surge bound (RollingUpdate) or at once (Recreate)."""
    if not plan.rolling:
        return plan.replicas
    current = sum(replicas_of(rs) for rs in all_rs)
    ceiling = plan.replicas + plan.max_surge
    if current >= ceiling:
        return new_replicas
    return new_replicas + min(ceiling - current, plan.replicas - new_replicas)


def go_round(x: float) -> int:
    """math.Round: halves away from zero (Python's round() goes to even)."""
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


def proportion(rs: Obj, plan: Plan, status_replicas: int, to_add: int, added: int) -> int:
    """This ReplicaSet's share of a scaling event during a rollout (GetProportion)."""
    size = replicas_of(rs)
    if size == 0 or to_add == 0 or to_add == added:
        return 0
    if plan.replicas == 0:
        fraction = -size
    else:
        annotated = annotation_int(rs, MAX_REPLICAS)
        base = annotated if annotated is not None else status_replicas
        fraction = go_round(size * (plan.replicas + plan.max_surge) / base) - size if base else 0
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


# ------------------------------------------------------------------------------------------ annotations


def copy_annotations(dep: Obj, annotations: dict[str, str]) -> bool:
    """Copy the Deployment's annotations (bar the skipped ones) onto a ReplicaSet's; True if any changed."""
    changed = False
    for k, v in (dep["metadata"].get("annotations") or {}).items():
        if k in SKIPPED_ANNOTATIONS or annotations.get(k) == v:
            continue
        annotations[k] = v
        changed = True
    return changed


def set_replicas_annotations(annotations: dict[str, str], desired: int, ceiling: int) -> bool:
    changed = False
    for key, value in ((DESIRED_REPLICAS, str(desired)), (MAX_REPLICAS, str(ceiling))):
        if annotations.get(key) != value:
            annotations[key] = value
            changed = True
    return changed


def bump_revision(annotations: dict[str, str], new_revision: int) -> bool:
    """Raise a ReplicaSet's revision to `new_revision`; a rollback keeps its earlier numbers in the history."""
    old = annotations.get(REVISION)
    try:
        old_int = int(old) if old is not None and old != "" else 0
    except ValueError:
        return False
    if old_int >= new_revision:
        return False
    annotations[REVISION] = str(new_revision)
    if old is not None and old != "":
        history = annotations.get(REVISION_HISTORY, "")
        parts = history.split(",") if history else []
        parts.append(old)
        while len(",".join(parts)) > REVISION_HISTORY_CHARS and len(parts) > 1:
            parts.pop(0)
        if len(",".join(parts)) <= REVISION_HISTORY_CHARS:
            annotations[REVISION_HISTORY] = ",".join(parts)
    return True


# ------------------------------------------------------------------------------------------ status


def condition(conds: list[Obj], type_: str) -> Obj | None:
    for c in conds:
        if c.get("type") == type_:
            return c
    return None


def new_condition(type_: str, status: str, reason: str, message: str, stamp: str) -> Obj:
    return {"type": type_, "status": status, "lastUpdateTime": stamp, "lastTransitionTime": stamp,
            "reason": reason, "message": message}


def set_condition(conds: list[Obj], cond: Obj) -> list[Obj]:
    """SetDeploymentCondition: unchanged when status and reason match; a status kept keeps its transition time;
    the written condition moves to the end of the list."""
    cur = condition(conds, cond["type"])
    if cur is not None and cur.get("status") == cond["status"] and cur.get("reason") == cond["reason"]:
        return conds
    if cur is not None and cur.get("status") == cond["status"]:
        cond = {**cond, "lastTransitionTime": cur.get("lastTransitionTime", cond["lastTransitionTime"])}
    return [*without_condition(conds, cond["type"]), cond]


def without_condition(conds: list[Obj], type_: str) -> list[Obj]:
    return [c for c in conds if c.get("type") != type_]


def calculate_status(all_rs: list[Obj], new_rs: Obj | None, dep: Obj, plan: Plan, base: Obj, stamp: str) -> Obj:
    """The Deployment status its ReplicaSets add up to; conditions and collisionCount carried from `base`."""
    live = [rs for rs in all_rs if rs is not None]
    available = sum(status_int(rs, "availableReplicas") for rs in live)
    wanted = sum(replicas_of(rs) for rs in live)
    status: Obj = {
        "observedGeneration": int(dep["metadata"].get("generation") or 0),
        "replicas": sum(status_int(rs, "replicas") for rs in live),
        "updatedReplicas": status_int(new_rs, "replicas"),
        "readyReplicas": sum(status_int(rs, "readyReplicas") for rs in live),
        "availableReplicas": available,
        "unavailableReplicas": max(0, wanted - available),
    }
    if all((rs.get("status") or {}).get("terminatingReplicas") is not None for rs in live):
        status["terminatingReplicas"] = sum(status_int(rs, "terminatingReplicas") for rs in live)
    if base.get("collisionCount") is not None:
        status["collisionCount"] = base["collisionCount"]
    conds = [dict(c) for c in base.get("conditions") or ()]
    if available >= plan.min_available:
        cond = new_condition("Available", "True", MIN_AVAILABLE, "Deployment has minimum availability.", stamp)
    else:
        cond = new_condition("Available", "False", MIN_UNAVAILABLE, "Deployment does not have minimum availability.",
                             stamp)
    status["conditions"] = set_condition(conds, cond)
    return status


def as_written(status: Obj) -> Obj:
    """The status as the API serves it: int32 counters are omitted at zero, pointer fields kept."""
    out = {k: v for k, v in status.items() if not (isinstance(v, int) and v == 0 and k not in _POINTER_FIELDS)}
    if not out.get("conditions"):
        out.pop("conditions", None)
    return out


_POINTER_FIELDS = frozenset({"terminatingReplicas", "collisionCount"})


def deployment_complete(plan: Plan, generation: int, status: Obj) -> bool:
    """Every desired replica updated and available, no old one left, the latest spec observed."""
    return (int(status.get("updatedReplicas") or 0) == plan.replicas
            and int(status.get("replicas") or 0) == plan.replicas
            and int(status.get("availableReplicas") or 0) == plan.replicas
            and int(status.get("observedGeneration") or 0) >= generation)


def deployment_progressing(old: Obj, new: Obj) -> bool:
    """Progress since `old`: more updated, ready or available pods, or fewer old ones."""
    def n(s: Obj, k: str) -> int:
        return int(s.get(k) or 0)

    return (n(new, "updatedReplicas") > n(old, "updatedReplicas")
            or n(new, "replicas") - n(new, "updatedReplicas") < n(old, "replicas") - n(old, "updatedReplicas")
            or n(new, "readyReplicas") > n(old, "readyReplicas")
            or n(new, "availableReplicas") > n(old, "availableReplicas"))


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def progress_due(plan: Plan, cond: Obj | None) -> datetime | None:
    """When the Progressing condition's last update runs out of the progress deadline (None: never)."""
    if plan.deadline is None or cond is None:
        return None
    updated = parse_time(cond.get("lastUpdateTime"))
    return None if updated is None else updated + timedelta(seconds=plan.deadline)


def timed_out(plan: Plan, status: Obj, now: datetime) -> bool:
    """DeploymentTimedOut: the Progressing condition has not moved for progressDeadlineSeconds."""
    cond = condition(status.get("conditions") or [], "Progressing")
    if plan.deadline is None or cond is None or cond.get("reason") == NEW_RS_AVAILABLE:
        return False
    if cond.get("reason") == TIMED_OUT:
        return True
    due = progress_due(plan, cond)
    return due is not None and due < now


def replica_failures(all_rs: list[Obj], new_rs: Obj | None) -> list[Obj]:
    """ReplicaFailure conditions of the ReplicaSets as Deployment conditions, the new ReplicaSet's first."""
    def of(rs: Obj) -> list[Obj]:
        return [{"type": c.get("type"), "status": c.get("status"), "lastUpdateTime": c.get("lastTransitionTime"),
                 "lastTransitionTime": c.get("lastTransitionTime"), "reason": c.get("reason"),
                 "message": c.get("message")}
                for c in (rs.get("status") or {}).get("conditions") or () if c.get("type") == "ReplicaFailure"]

    if new_rs is not None and (found := of(new_rs)):
        return found
    return [c for rs in all_rs if rs is not None for c in of(rs)]


__all__ = [
    "DESIRED_REPLICAS", "HASH_LABEL", "MAX_REPLICAS", "REVISION", "REVISION_HISTORY", "Plan", "calculate_status",
    "compute_hash", "equal_ignore_hash", "find_active_or_latest", "find_new", "fnv32a", "int_or_percent",
    "new_rs_replicas", "proportion", "safe_encode",
]
