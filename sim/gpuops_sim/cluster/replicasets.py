"""The ReplicaSet controller of kube-controller-manager (apps/v1): keep `spec.replicas` pods of a template.

It serves bare ReplicaSets and the ones Deployments create alike. Pods are indexed by the uid of the
ReplicaSet that controls them; a pod change marks that ReplicaSet dirty, and `step()` syncs it: claim the
pods (adopt matching orphans, release owned pods whose labels stopped matching), create missing pods
(`<rs-name>-<5 chars>` through generateName, in slow-start batches, at most `burst_replicas` a sync) or
delete surplus ones (least valuable first, upstream's ranking), then write the status the Deployment
controller adds up: replicas, fullyLabeledReplicas, readyReplicas, availableReplicas (Ready for at least
minReadySeconds, woken by a timer when that moment comes), terminatingReplicas, observedGeneration and a
ReplicaFailure condition while creates or deletes fail.

Controllers here read the store the API server writes, so a pod this controller created is visible the
moment `create` returns: no expectations bookkeeping is needed to avoid creating it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.selectors import LabelSelector
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import PODS, REPLICASETS, ClusterAccess
from .jobs import merge_diff
from .loop import Loop
from .replicaset_util import (
    adopt,
    controlled_by,
    controller_ref,
    is_active,
    is_available,
    labels_of,
    owner_reference,
    pod_from_template,
    pods_to_delete,
    ready_since,
    release,
    rs_status,
    selector_of,
)
from .rollout import replicas_of

log = structlog.get_logger("gpuops_sim.replicasets")

USER = "system:serviceaccount:kube-system:replicaset-controller"
COMPONENT = "replicaset-controller"
GENERATE_NAME_ATTEMPTS = 8  # kube-apiserver retries a colliding generated name as well (RetryGenerateName)

Obj = dict[str, Any]
Key = tuple[str, str]


@dataclass
class ReplicaSetOptions:
    events: bool = True  # SuccessfulCreate / SuccessfulDelete / FailedCreate Events on the ReplicaSet
    burst_replicas: int = 500  # creates or deletes in one sync, as kube-controller-manager's BurstReplicas
    retry_base_seconds: float = 0.5  # a failed sync is retried with exponential backoff from here ...
    retry_max_seconds: float = 60.0  # ... up to here


# ------------------------------------------------------------------------------------------ controller


class ReplicaSetController(Loop):
    """kube-controller-manager's replicaset controller for every ReplicaSet in the emulator."""

    name = "replicasets"

    def __init__(self, server: APIServer, options: ReplicaSetOptions | None = None) -> None:
        super().__init__()
        self.options = options or ReplicaSetOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT)
        self.store = server.store
        self._pods: dict[str, set[Key]] = {}  # ReplicaSet uid -> the pods it controls
        self._orphans: dict[str, set[str]] = {}  # namespace -> active pods no controller owns
        self._candidates: dict[str, set[str]] = {}  # ReplicaSet uid -> orphans that may be its to adopt
        self._scan_orphans: set[str] = set()  # ReplicaSets whose selector is new: every orphan is a candidate
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._wake_at: dict[str, float] = {}
        self._writing: str | None = None
        self._scanned = False
        self.syncs = 0
        self.pods_created = 0
        self.pods_deleted = 0
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _mark(self, uid: str) -> None:
        self._dirty.add(uid)
        self.wake()

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._on_pod(ev)
        elif ev.gr == REPLICASETS:
            self._on_rs(ev)

    def _on_rs(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = str(obj["metadata"].get("uid", ""))
        if ev.type == "DELETED":
            self._dirty.discard(uid)
            self._failures.pop(uid, None)
            self._candidates.pop(uid, None)
            self._scan_orphans.discard(uid)
            return
        prev = ev.prev.obj if ev.prev is not None else None
        if prev is None or (prev.get("spec") or {}).get("selector") != (obj.get("spec") or {}).get("selector"):
            self._scan_orphans.add(uid)
        if (self._writing == uid and prev is not None and prev.get("spec") == obj.get("spec")
                and prev["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")):
            return  # our own status write
        self._mark(uid)

    def _on_pod(self, ev: WatchEvent) -> None:
        ns, name = ev.key
        new = ev.new.obj
        prev = ev.prev.obj if ev.prev is not None else None
        owner = controlled_by(new, "ReplicaSet")
        before = controlled_by(prev, "ReplicaSet") if prev is not None else None
        if before and before != owner:
            self._unindex(before, ev.key)
            self._mark(before)
        if owner:
            if ev.type == "DELETED":
                self._unindex(owner, ev.key)
            else:
                self._pods.setdefault(owner, set()).add(ev.key)
            self._mark(owner)
        orphans = self._orphans.setdefault(ns, set())
        if ev.type != "DELETED" and controller_ref(new) is None and is_active(new):
            orphans.add(name)
            if prev is None or controller_ref(prev) is not None or labels_of(prev) != labels_of(new):
                self._offer_orphan(ns, name, labels_of(new))
        else:
            orphans.discard(name)

    def _offer_orphan(self, ns: str, name: str, labels: dict[str, str]) -> None:
        """A new or relabelled orphan: every ReplicaSet of its namespace that selects it may adopt it."""
        for rs in self.access.iter(REPLICASETS, ns):
            try:
                matches = selector_of(rs).matches(labels)
            except ValueError:
                continue
            if matches:
                uid = str(rs["metadata"]["uid"])
                self._candidates.setdefault(uid, set()).add(name)
                self._mark(uid)

    def _unindex(self, uid: str, key: Key) -> None:
        pods = self._pods.get(uid)
        if pods is not None:
            pods.discard(key)
            if not pods:
                del self._pods[uid]

    def _scan(self) -> None:
        """The informers' initial list: pods and ReplicaSets that existed before this controller was built."""
        self._scanned = True
        for pod in self.access.iter(PODS):
            key = (str(pod["metadata"].get("namespace", "")), str(pod["metadata"]["name"]))
            owner = controlled_by(pod, "ReplicaSet")
            if owner:
                self._pods.setdefault(owner, set()).add(key)
            elif controller_ref(pod) is None and is_active(pod):
                self._orphans.setdefault(key[0], set()).add(key[1])
        for rs in self.access.iter(REPLICASETS):
            uid = str(rs["metadata"]["uid"])
            self._dirty.add(uid)
            self._scan_orphans.add(uid)

    def _requeue(self, uid: str, delay: float) -> None:
        when = self.clock() + max(0.0, delay)
        cur = self._wake_at.get(uid)
        if cur is None or when < cur - 1e-3:
            self._wake_at[uid] = when
            self.at(("rs", uid), when)

    def _retry(self, uid: str) -> None:
        n = self._failures[uid] = self._failures.get(uid, 0) + 1
        self._requeue(uid, min(self.options.retry_base_seconds * 2.0 ** (n - 1), self.options.retry_max_seconds))

    # ------------------------------------------------------------------------------------ loop

    async def step(self) -> None:
        if not self._scanned:
            self._scan()
        now = self.clock()
        for key in self.due(now):
            if isinstance(key, tuple) and key[0] == "rs":
                uid = str(key[1])
                if self._wake_at.get(uid, now + 1) <= now:
                    del self._wake_at[uid]
                self._dirty.add(uid)
        dirty, self._dirty = self._dirty, set()
        # Scale-downs first: a rolling update's old pods go before the new ones its surge bound makes room for.
        for uid in sorted(dirty, key=self._growing):
            await self._sync_one(uid)
        if self._dirty:
            self.wake()  # changes our own writes caused: handled on the next turn, after other components ran

    def _growing(self, uid: str) -> int:
        rs = self._lookup(uid)
        if rs is None:
            return 0
        live = sum(1 for p in self._owned(uid, str(rs["metadata"].get("namespace", ""))) if is_active(p))
        return 0 if live > replicas_of(rs) else 1

    async def _sync_one(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        ns, name = where[1] if where is not None else ("", "")
        try:
            if await self._sync(uid):
                self._failures.pop(uid, None)
            else:
                self._retry(uid)  # creates or deletes failed: back off before trying again
        except StatusError as e:
            if e.code == 409:
                self._dirty.add(uid)  # written meanwhile: the next step reads the fresh object
            elif e.code != 404:
                log.warning("replicaset sync failed", namespace=ns, replicaset=name, code=e.code, error=str(e))
                self._retry(uid)
        except Exception:  # one broken ReplicaSet must not stall the others
            self.errors += 1
            log.exception("replicaset sync failed", namespace=ns, replicaset=name)
            self._retry(uid)

    # ------------------------------------------------------------------------------------ sync

    def _lookup(self, uid: str) -> Obj | None:
        where = self.store.by_uid.get(uid)
        if where is None or where[0] != REPLICASETS:
            return None
        return self.access.get(REPLICASETS, *where[1])

    def _owned(self, uid: str, ns: str) -> list[Obj]:
        out = []
        for key in sorted(self._pods.get(uid, ())):
            pod = self.access.get(PODS, *key)
            if pod is not None and key[0] == ns and controlled_by(pod, "ReplicaSet") == uid:
                out.append(pod)
        return out

    async def _sync(self, uid: str) -> bool:
        """One ReplicaSet's sync; False when some of its pod creates or deletes failed."""
        rs = self._lookup(uid)
        if rs is None:
            self._candidates.pop(uid, None)
            return True
        self.syncs += 1
        ns = str(rs["metadata"].get("namespace", ""))
        try:
            selector = selector_of(rs)
        except ValueError as e:
            log.error("replicaset selector invalid", namespace=ns, replicaset=rs["metadata"]["name"], error=str(e))
            return True  # nothing to retry until the ReplicaSet changes
        pods = await self._claim(rs, selector)
        failure = None
        if not rs["metadata"].get("deletionTimestamp"):
            failure = await self._manage(rs, [p for p in pods if is_active(p)])
        rs = self._lookup(uid) or rs
        pods = [p for p in self._owned(uid, ns) if selector.matches(labels_of(p))]
        now = self.access.now()
        await self._write_status(rs, rs_status(rs, pods, now, failure, self.access.stamp()))
        self._schedule_availability(uid, rs, pods, now)
        return failure is None

    async def _claim(self, rs: Obj, selector: LabelSelector) -> list[Obj]:
        """ClaimPods: keep owned pods that match, release active ones that don't, adopt matching orphans."""
        meta = rs["metadata"]
        uid, ns = str(meta["uid"]), str(meta.get("namespace", ""))
        deleting = bool(meta.get("deletionTimestamp"))
        out = []
        for pod in self._owned(uid, ns):
            if selector.matches(labels_of(pod)):
                out.append(pod)
            elif is_active(pod) and not deleting:
                await release(self.access, PODS, pod, uid)
        names = set(self._orphans.get(ns, ())) if uid in self._scan_orphans else set()
        names |= self._candidates.pop(uid, set())
        self._scan_orphans.discard(uid)
        if deleting or selector.matches_nothing:
            return out
        ref = owner_reference(rs, "ReplicaSet")
        for name in sorted(names):
            orphan = self.access.get(PODS, ns, name)
            if orphan is None or controller_ref(orphan) is not None or not is_active(orphan):
                continue
            if selector.matches(labels_of(orphan)) and await adopt(self.access, PODS, orphan, ref):
                out.append(self.access.get(PODS, ns, name) or orphan)
        return out

    async def _manage(self, rs: Obj, active: list[Obj]) -> tuple[str, str] | None:
        """Create or delete pods toward spec.replicas; (reason, message) of the first failure, if any."""
        diff = len(active) - replicas_of(rs)
        if diff < 0:
            error = await self._scale_up(rs, min(-diff, self.options.burst_replicas))
            return None if error is None else ("FailedCreate", error)
        if diff > 0:
            now = self.access.now()
            victims = pods_to_delete(active, self._related(rs), min(diff, self.options.burst_replicas), now)
            errors = [e for e in [await self._delete_pod(rs, p) for p in victims] if e is not None]
            return ("FailedDelete", errors[0]) if errors else None
        return None

    def _related(self, rs: Obj) -> list[Obj]:
        """Pods of every ReplicaSet sharing this one's controller (a Deployment's other revisions)."""
        ns = str(rs["metadata"].get("namespace", ""))
        owner = controller_ref(rs)
        if owner is None:
            return self._owned(str(rs["metadata"]["uid"]), ns)
        out: list[Obj] = []
        for sibling in self.access.iter(REPLICASETS, ns):
            sref = controller_ref(sibling)
            if sref is not None and sref.get("uid") == owner.get("uid"):
                out.extend(self._owned(str(sibling["metadata"]["uid"]), ns))
        return out

    async def _scale_up(self, rs: Obj, count: int) -> str | None:
        """Slow start: batches of 1, 2, 4 ... so a template the API refuses fails once, not `count` times."""
        remaining, batch = count, 1
        while remaining > 0:
            size = min(batch, remaining)
            errors = [e for e in [await self._create_pod(rs) for _ in range(size)] if e is not None]
            if errors:
                return errors[0]
            remaining -= size
            batch *= 2
        return None

    async def _create_pod(self, rs: Obj) -> str | None:
        ns = str(rs["metadata"].get("namespace", "default"))
        try:
            for attempt in range(GENERATE_NAME_ATTEMPTS):
                try:
                    pod = await self.access.create(PODS, ns, pod_from_template(rs))
                    break
                except StatusError as e:  # a generateName collision: draw another suffix
                    if e.reason != "AlreadyExists" or attempt == GENERATE_NAME_ATTEMPTS - 1:
                        raise
        except StatusError as e:
            log.warning("replicaset pod create failed", namespace=ns, replicaset=rs["metadata"]["name"],
                        code=e.code, error=str(e))
            await self._event(rs, "Warning", "FailedCreate", f"Error creating: {e}")
            return str(e)
        self.pods_created += 1
        await self._event(rs, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")
        return None

    async def _delete_pod(self, rs: Obj, pod: Obj) -> str | None:
        meta = pod["metadata"]
        ns, name = str(meta.get("namespace", "")), str(meta["name"])
        try:
            gone = await self.access.delete(PODS, ns, name, uid=str(meta.get("uid") or "") or None)
        except StatusError as e:
            if e.code == 409:
                return None  # a new pod took the name: ours is gone already
            log.warning("replicaset pod delete failed", namespace=ns, replicaset=rs["metadata"]["name"], pod=name,
                        code=e.code, error=str(e))
            await self._event(rs, "Warning", "FailedDelete", f"Error deleting: {e}")
            return str(e)
        if gone is not None:
            self.pods_deleted += 1
            await self._event(rs, "Normal", "SuccessfulDelete", f"Deleted pod: {name}")
        return None

    async def _event(self, rs: Obj, type_: str, reason: str, message: str) -> None:
        if self.options.events:
            await self.access.event(rs, "ReplicaSet", type_, reason, message)

    async def _write_status(self, rs: Obj, status: Obj) -> None:
        meta = rs["metadata"]
        patch = merge_diff(rs.get("status") or {}, status)
        if not patch:
            return
        self._writing = str(meta["uid"])
        try:
            await self.access.patch(REPLICASETS, str(meta.get("namespace", "")), str(meta["name"]),
                                    {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch},
                                    subresource="status")
        finally:
            self._writing = None

    def _schedule_availability(self, uid: str, rs: Obj, pods: list[Obj], now: datetime) -> None:
        """Wake when the next Ready pod has been Ready for minReadySeconds: nothing else would announce it."""
        min_ready = int((rs.get("spec") or {}).get("minReadySeconds") or 0)
        if min_ready <= 0:
            return
        soonest: datetime | None = None
        for pod in pods:
            since = ready_since(pod)
            if since is None or not is_active(pod) or is_available(pod, min_ready, now):
                continue
            at = since + timedelta(seconds=min_ready)
            soonest = at if soonest is None or at < soonest else soonest
        if soonest is not None:
            self._requeue(uid, (soonest - now).total_seconds() + 0.01)


__all__ = ["ReplicaSetController", "ReplicaSetOptions"]
