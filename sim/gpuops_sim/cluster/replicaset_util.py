"""What the ReplicaSet and Deployment controllers share about the objects they manage: controller
references (claiming: adopt matching orphans, release what stopped matching), pod states (active,
terminating, Ready, available after minReadySeconds), the pods a ReplicaSet creates, the order in which a
scale-down picks its victims, and the ReplicaSet status its pods add up to. Pure functions over stored
objects, apart from the two ownerReference writes.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..apiserver.errors import StatusError
from ..apiserver.selectors import LabelSelector, label_selector_from_object
from ..apiserver.store import GroupResource, clone
from .access import ClusterAccess
from .rollout import parse_time

Obj = dict[str, Any]
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


# ------------------------------------------------------------------------------------------ ownership


def controller_ref(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def controlled_by(obj: Obj, kind: str) -> str | None:
    """The uid of the apps/* `kind` controlling this object, if that is what controls it."""
    ref = controller_ref(obj)
    if ref is None or ref.get("kind") != kind or not str(ref.get("apiVersion", "")).startswith("apps/"):
        return None
    return str(ref.get("uid") or "") or None


def owner_reference(owner: Obj, kind: str) -> Obj:
    meta = owner["metadata"]
    return {"apiVersion": "apps/v1", "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True,
            "blockOwnerDeletion": True}


def labels_of(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def selector_of(obj: Obj) -> LabelSelector:
    """spec.selector parsed; ValueError for one upstream would refuse to convert."""
    return label_selector_from_object((obj.get("spec") or {}).get("selector"))


async def adopt(access: ClusterAccess, gr: GroupResource, obj: Obj, ref: Obj) -> bool:
    """Add a controller reference to an orphan; False if it changed or went away meanwhile."""
    meta = obj["metadata"]
    refs = [r for r in meta.get("ownerReferences") or () if r.get("uid") != ref["uid"]] + [ref]
    return await _set_refs(access, gr, obj, refs)


async def release(access: ClusterAccess, gr: GroupResource, obj: Obj, owner_uid: str) -> bool:
    """Drop our controller reference from an object whose labels no longer match our selector."""
    refs = [r for r in obj["metadata"].get("ownerReferences") or () if r.get("uid") != owner_uid]
    return await _set_refs(access, gr, obj, refs)


async def _set_refs(access: ClusterAccess, gr: GroupResource, obj: Obj, refs: list[Obj]) -> bool:
    meta = obj["metadata"]
    body = {"metadata": {"ownerReferences": refs or None, "resourceVersion": meta.get("resourceVersion")}}
    try:
        await access.patch(gr, meta.get("namespace", ""), meta["name"], body)
    except StatusError as e:
        if e.code in (404, 409):
            return False  # its next event brings the owner back here with the fresh object
        raise
    return True


# ------------------------------------------------------------------------------------------ pods


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_active(pod: Obj) -> bool:
    return not is_terminal(pod) and not pod["metadata"].get("deletionTimestamp")


def is_terminating(pod: Obj) -> bool:
    return not is_terminal(pod) and bool(pod["metadata"].get("deletionTimestamp"))


def _ready_condition(pod: Obj) -> Obj | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return dict(c)
    return None


def is_ready(pod: Obj) -> bool:
    c = _ready_condition(pod)
    return c is not None and c.get("status") == "True"


def ready_since(pod: Obj) -> datetime | None:
    c = _ready_condition(pod)
    return parse_time(c.get("lastTransitionTime")) if c is not None and c.get("status") == "True" else None


def is_available(pod: Obj, min_ready: int, now: datetime) -> bool:
    """Ready, and for longer than minReadySeconds (IsPodAvailable)."""
    if not is_ready(pod):
        return False
    if min_ready <= 0:
        return True
    since = ready_since(pod)
    return since is not None and since + timedelta(seconds=min_ready) < now


def pod_from_template(rs: Obj) -> Obj:
    """The pod a ReplicaSet creates: its template's labels, annotations, finalizers and spec, owned by it."""
    meta = rs["metadata"]
    tmpl = (rs.get("spec") or {}).get("template") or {}
    tmeta = tmpl.get("metadata") or {}
    pmeta: Obj = {"generateName": f"{meta['name']}-", "namespace": meta.get("namespace", "default"),
                  "ownerReferences": [owner_reference(rs, "ReplicaSet")]}
    for field in ("labels", "annotations", "finalizers"):
        if tmeta.get(field):
            pmeta[field] = clone(tmeta[field])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pmeta, "spec": clone(tmpl.get("spec") or {})}


def _deletion_cost(pod: Obj) -> int:
    try:
        return int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, 0))
    except ValueError:
        return 0


def _restarts(pod: Obj) -> int:
    return max((int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or ()),
               default=0)


def _log_rank(t: datetime, now: datetime) -> int:
    ns = (now - t) // timedelta(microseconds=1) * 1000
    return int(math.log2(ns)) if ns > 0 else -1


def _newer_first(t1: datetime | None, t2: datetime | None, uid1: str, uid2: str, now: datetime) -> int:
    """Younger first, compared in powers of two of their age (LogarithmicScaleDown); unset times first."""
    if t1 is None or t2 is None:
        return -1 if t1 is None else 1
    diff = _log_rank(t1, now) - _log_rank(t2, now)
    if diff == 0:
        return (uid1 > uid2) - (uid1 < uid2)
    return -1 if diff < 0 else 1


@dataclass
class _Ranked:
    pod: Obj
    doubled_up: int  # active pods of the same owner on this pod's node

    def key(self) -> tuple[int, int, int, int, int]:
        spec, status = self.pod.get("spec") or {}, self.pod.get("status") or {}
        phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(str(status.get("phase")), 0)
        return (1 if spec.get("nodeName") else 0, phase, 1 if is_ready(self.pod) else 0, _deletion_cost(self.pod),
                -self.doubled_up)


def _deletion_order(a: _Ranked, b: _Ranked, now: datetime) -> int:
    """Which of two pods a scale-down deletes first: unscheduled, pending, unready, cheap, doubled up, then the
    most recently ready, the most restarted, the youngest."""
    ka, kb = a.key(), b.key()
    if ka != kb:
        return -1 if ka < kb else 1
    ua, ub = str(a.pod["metadata"].get("uid", "")), str(b.pod["metadata"].get("uid", ""))
    if is_ready(a.pod) and is_ready(b.pod):
        ra, rb = ready_since(a.pod), ready_since(b.pod)
        if ra != rb:
            return _newer_first(ra, rb, ua, ub, now)
    if _restarts(a.pod) != _restarts(b.pod):
        return -1 if _restarts(a.pod) > _restarts(b.pod) else 1
    ca, cb = (parse_time(p["metadata"].get("creationTimestamp")) for p in (a.pod, b.pod))
    return 0 if ca == cb else _newer_first(ca, cb, ua, ub, now)


def pods_to_delete(active: list[Obj], related: list[Obj], count: int, now: datetime) -> list[Obj]:
    """The `count` pods a scale-down removes (getPodsToDelete), related pods spreading the doubled-up rank."""
    if count >= len(active):
        return active[:count]
    on_node = Counter(str((p.get("spec") or {}).get("nodeName") or "") for p in related if is_active(p))
    ranked = [_Ranked(p, on_node[str((p.get("spec") or {}).get("nodeName") or "")]) for p in active]
    ranked.sort(key=functools.cmp_to_key(lambda a, b: _deletion_order(a, b, now)))
    return [r.pod for r in ranked[:count]]


# ------------------------------------------------------------------------------------------ status


def _set_rs_condition(conds: list[Obj], cond: Obj) -> list[Obj]:
    cur = next((c for c in conds if c.get("type") == cond["type"]), None)
    if cur is not None and cur.get("status") == cond["status"] and cur.get("reason") == cond["reason"]:
        return conds
    return [*(c for c in conds if c.get("type") != cond["type"]), cond]


def rs_status(rs: Obj, pods: list[Obj], now: datetime, failure: tuple[str, str] | None, stamp: str) -> Obj:
    """The status a ReplicaSet's claimed pods add up to; `failure` (reason, message) from the last sync's
    creates or deletes becomes the ReplicaFailure condition, which goes once a sync succeeds."""
    spec = rs.get("spec") or {}
    min_ready = int(spec.get("minReadySeconds") or 0)
    want = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    live = [p for p in pods if is_active(p)]
    status = dict(rs.get("status") or {})
    status.update(
        replicas=len(live),
        fullyLabeledReplicas=sum(1 for p in live if all(labels_of(p).get(k) == v for k, v in want.items())),
        readyReplicas=sum(1 for p in live if is_ready(p)),
        availableReplicas=sum(1 for p in live if is_available(p, min_ready, now)),
        terminatingReplicas=sum(1 for p in pods if is_terminating(p)),
        observedGeneration=int(rs["metadata"].get("generation") or 0),
    )
    conds = [dict(c) for c in status.get("conditions") or ()]
    has_failure = any(c.get("type") == "ReplicaFailure" for c in conds)
    if failure is not None and not has_failure:
        conds = _set_rs_condition(conds, {"type": "ReplicaFailure", "status": "True", "lastTransitionTime": stamp,
                                          "reason": failure[0], "message": failure[1]})
    elif failure is None and has_failure:
        conds = [c for c in conds if c.get("type") != "ReplicaFailure"]
    status["conditions"] = conds
    # int32 counters with omitempty vanish at zero; replicas and the terminatingReplicas pointer stay
    return {k: v for k, v in status.items() if v not in (0, []) or k in ("replicas", "terminatingReplicas")}


__all__ = ["adopt", "controlled_by", "controller_ref", "is_active", "is_available", "is_ready", "is_terminal",
           "is_terminating", "labels_of", "owner_reference", "pod_from_template", "pods_to_delete", "ready_since",
           "release", "rs_status", "selector_of"]
