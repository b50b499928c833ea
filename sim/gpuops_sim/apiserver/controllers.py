"""The kube-controller-manager loops the API depends on, run inside the emulator.

Garbage collection by owner references, namespace deletion, the disruption controller that keeps
PodDisruptionBudget status current, PodGC and CRD instance cleanup. They react to store changes through
a synchronous listener that only records work; one async task does the work, so writes never re-enter
the store from inside another write.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import datetime, timedelta
from typing import Any

import structlog

from .auth import UserInfo
from .errors import StatusError
from .namespace_content import CONFIG_MAPS, DEFAULT_SERVICE_ACCOUNT, ROOT_CA_CONFIGMAP, SERVICE_ACCOUNTS
from .objects import CORE_NS, CRD_CLEANUP, CRD_GR, PDB_GR, PODS_GR, ObjectAPI, WriteContext, rfc3339
from .resources import ResourceInfo
from .selectors import label_selector_from_object
from .store import GroupResource, Store, WatchEvent, clone

log = structlog.get_logger("gpuops_sim.controllers")

SYSTEM = UserInfo("system:kube-controller-manager", groups=("system:masters", "system:authenticated"))
Ref = tuple[GroupResource, str, str]
_PER_NAMESPACE = {(SERVICE_ACCOUNTS, DEFAULT_SERVICE_ACCOUNT), (CONFIG_MAPS, ROOT_CA_CONFIGMAP)}


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        frac = total * int(value[:-1]) / 100
        return math.ceil(frac) if round_up else math.floor(frac)
    return int(value)


def pdb_status(pdb: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """What the disruption controller would write for this PDB given the matching pods."""
    spec = pdb.get("spec") or {}
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    expected = len(live)
    healthy = sum(1 for p in live if _ready(p) and not p["metadata"].get("deletionTimestamp"))
    if "minAvailable" in spec:
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    elif "maxUnavailable" in spec:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = expected
    old = pdb.get("status") or {}
    present = {p["metadata"]["name"]: p for p in live if not p["metadata"].get("deletionTimestamp")}
    disrupted = {}
    for name, when in (old.get("disruptedPods") or {}).items():
        try:
            t = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
        except ValueError:
            continue
        if name in present and now - t < timedelta(minutes=2):
            disrupted[name] = when
    allowed = max(0, healthy - desired - len(disrupted))
    generation = int(pdb["metadata"].get("generation") or 1)
    cond_status = "True" if allowed > 0 else "False"
    prev = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    transition = (
        prev.get("lastTransitionTime") if prev and prev.get("status") == cond_status else rfc3339(now)
    )
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": cond_status,
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": generation,
                "lastTransitionTime": transition,
            }
        ],
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return status


class ControllerLoops:
    def __init__(self, api: ObjectAPI, terminated_pod_gc_threshold: int | None = None) -> None:
        self.api = api
        self.store: Store = api.store
        # PodGC: None keeps terminated pods forever, like a cluster below the 12,500 default.
        self.terminated_pod_gc_threshold = terminated_pod_gc_threshold
        self._terminated: set[Ref] = set()
        self._dependents: dict[str, set[Ref]] = {}
        self._gone_owners: set[str] = set()
        self._check: set[Ref] = set()
        self._owners_finalizing: set[Ref] = set()
        self._namespaces: set[str] = set()
        self._pdb_namespaces: set[str] = set()
        self._crds: set[str] = set()
        self._refill: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.store.add_listener(self._on_event)

    # ---------------------------------------------------------------- event intake (synchronous)

    def _on_event(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        meta = obj["metadata"]
        ref: Ref = (ev.gr, ev.key[0], ev.key[1])
        old_refs = (
            {r.get("uid") for r in (ev.prev.obj["metadata"].get("ownerReferences") or [])}
            if ev.prev
            else set()
        )
        new_refs = (
            {r.get("uid") for r in (meta.get("ownerReferences") or [])} if ev.type != "DELETED" else set()
        )
        for uid in old_refs - new_refs:
            deps = self._dependents.get(uid or "")
            if deps:
                deps.discard(ref)
        for uid in new_refs:
            if uid:
                self._dependents.setdefault(uid, set()).add(ref)
        if new_refs:
            self._check.add(ref)
        if ev.type == "DELETED":
            if (ev.gr, ev.key[1]) in _PER_NAMESPACE:
                self._refill.add(ev.key[0])
            if meta.get("uid") in self._dependents:
                self._gone_owners.add(meta["uid"])
            if ev.gr == CRD_GR:
                self._unregister_crd(obj)
        else:
            fins = meta.get("finalizers") or []
            if meta.get("deletionTimestamp") and ("foregroundDeletion" in fins or "orphan" in fins):
                self._owners_finalizing.add(ref)
            if ev.gr == CORE_NS and meta.get("deletionTimestamp"):
                self._namespaces.add(ev.key[1])
            if ev.gr == CRD_GR and meta.get("deletionTimestamp"):
                self._crds.add(ev.key[1])
        if ev.gr in (PODS_GR, PDB_GR) and self.store.count(PDB_GR):
            self._pdb_namespaces.add(ev.key[0])
        if ev.gr == PODS_GR:
            if ev.type != "DELETED" and (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self._terminated.add(ref)
            else:
                self._terminated.discard(ref)
        self._wake.set()

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        self.api.registry.remove_crd(crd["metadata"]["name"])

    # ---------------------------------------------------------------- loop

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-controllers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.step()
            except Exception:  # the loop must survive one bad object, as controller-manager does
                log.exception("sim controller step failed")
            await asyncio.sleep(0)

    def _info(self, gr: GroupResource) -> ResourceInfo | None:
        infos = self.api.registry.for_group_resource(*gr)
        return infos[0] if infos else None

    async def _delete(self, ref: Ref, policy: str = "Background") -> None:
        info = self._info(ref[0])
        if info is None:
            return
        with contextlib.suppress(StatusError):
            await self.api.delete(info, ref[1], ref[2], {"propagationPolicy": policy}, WriteContext(SYSTEM))

    async def _write(self, ref: Ref, obj: dict[str, Any]) -> None:
        info = self._info(ref[0])
        if info is None:
            return
        with contextlib.suppress(StatusError):
            await self.api.update(
                info,
                ref[1],
                ref[2],
                obj,
                WriteContext(SYSTEM, field_manager="sim-controllers"),
                require_rv=False,
                check_unknown=False,
            )

    async def step(self) -> None:
        """One pass over all recorded work; safe to call directly from tests."""
        await self._gc()
        await self._finalize_owners()
        await self._namespace_cleanup()
        await self._crd_cleanup()
        await self._pod_gc()
        self._refill_namespaces()
        self._disruption()

    def _refill_namespaces(self) -> None:
        """The ServiceAccount controller and root-CA publisher put back what was deleted from a live namespace."""
        refill, self._refill = self._refill, set()
        for ns in refill:
            live = self.store.get(CORE_NS, "", ns)
            if live is not None and not live.obj["metadata"].get("deletionTimestamp"):
                for hook in self.api.on_namespace_created:
                    hook(ns)

    # ---------------------------------------------------------------- pod GC

    async def _pod_gc(self) -> None:
        limit = self.terminated_pod_gc_threshold
        if limit is None or len(self._terminated) <= limit:
            return
        pods = [(s.obj["metadata"].get("creationTimestamp", ""), ref)
                for ref in self._terminated if (s := self.store.get(*ref)) is not None]
        pods.sort()
        for _, ref in pods[: len(pods) - limit]:
            await self._delete(ref)

    # ---------------------------------------------------------------- garbage collector

    def _owner_alive(self, uid: str) -> bool:
        return uid in self.store.by_uid

    async def _gc(self) -> None:
        gone, self._gone_owners = self._gone_owners, set()
        for uid in gone:
            self._check.update(self._dependents.pop(uid, set()))
        check, self._check = self._check, set()
        for ref in check:
            s = self.store.get(*ref)
            if s is None:
                continue
            refs = s.obj["metadata"].get("ownerReferences") or []
            if not refs:
                continue
            alive = [r for r in refs if self._owner_alive(r.get("uid", ""))]
            if len(alive) == len(refs):
                continue
            if alive:
                new = clone(s.obj)
                new["metadata"]["ownerReferences"] = alive
                await self._write(ref, new)
            elif not s.obj["metadata"].get("deletionTimestamp"):
                await self._delete(ref, "Background")

    async def _finalize_owners(self) -> None:
        owners, self._owners_finalizing = self._owners_finalizing, set()
        for ref in owners:
            s = self.store.get(*ref)
            if s is None:
                continue
            meta = s.obj["metadata"]
            fins = meta.get("finalizers") or []
            uid = meta.get("uid", "")
            deps = [d for d in self._dependents.get(uid, set()) if self.store.get(*d) is not None]
            if "orphan" in fins:
                for d in deps:
                    ds = self.store.get(*d)
                    if ds is None:
                        continue
                    new = clone(ds.obj)
                    new["metadata"]["ownerReferences"] = [
                        r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid
                    ]
                    await self._write(d, new)
                await self._drop_finalizer(ref, "orphan")
            elif "foregroundDeletion" in fins:
                blocking = []
                for d in deps:
                    ds = self.store.get(*d)
                    if ds is None:
                        continue
                    if not ds.obj["metadata"].get("deletionTimestamp"):
                        await self._delete(d, "Foreground")
                    ds = self.store.get(*d)
                    if ds is not None and any(
                        r.get("uid") == uid and r.get("blockOwnerDeletion")
                        for r in ds.obj["metadata"].get("ownerReferences") or []
                    ):
                        blocking.append(d)
                if blocking:
                    for d in blocking:  # re-check when those dependents change or go
                        self._dependents.setdefault(uid, set()).add(d)
                    self._pending_owner(ref)
                else:
                    await self._drop_finalizer(ref, "foregroundDeletion")

    def _pending_owner(self, ref: Ref) -> None:
        # Re-examined on the next event that touches anything (dependents' deletion produces events).
        self._owners_finalizing.add(ref)

    async def _drop_finalizer(self, ref: Ref, fin: str) -> None:
        s = self.store.get(*ref)
        if s is None:
            return
        new = clone(s.obj)
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != fin]
        await self._write(ref, new)

    # ---------------------------------------------------------------- namespace controller

    async def _namespace_cleanup(self) -> None:
        for ns in list(self._namespaces):
            s = self.store.get(CORE_NS, "", ns)
            if s is None:
                self._namespaces.discard(ns)
                continue
            for info in self.api.registry.all():
                if not info.namespaced or info.create_only:
                    continue
                for obj in list(self.store.iter(info.storage_key, ns)):
                    if not obj.obj["metadata"].get("deletionTimestamp"):
                        await self._delete((info.storage_key, ns, obj.obj["metadata"]["name"]))
            if any(True for gr in self._namespaced_grs() for _ in self.store.iter(gr, ns)):
                continue  # objects still terminating (finalizers, graceful pods): retried on their next event
            self._namespaces.discard(ns)
            new = clone(s.obj)
            spec = new.setdefault("spec", {})
            spec["finalizers"] = [f for f in spec.get("finalizers") or [] if f != "kubernetes"]
            if not new["metadata"].get("finalizers"):
                self.store.remove(CORE_NS, "", ns)
            else:
                await self._write((CORE_NS, "", ns), new)

    def _namespaced_grs(self) -> set[GroupResource]:
        return {i.storage_key for i in self.api.registry.all() if i.namespaced and not i.create_only}

    # ---------------------------------------------------------------- CRD cleanup

    async def _crd_cleanup(self) -> None:
        for name in list(self._crds):
            s = self.store.get(CRD_GR, "", name)
            if s is None or CRD_CLEANUP not in (s.obj["metadata"].get("finalizers") or []):
                self._crds.discard(name)
                continue
            spec = s.obj.get("spec") or {}
            gr = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
            left = list(self.store.iter(gr))
            for obj in left:
                if not obj.obj["metadata"].get("deletionTimestamp"):
                    m = obj.obj["metadata"]
                    await self._delete((gr, m.get("namespace", "") or "", m["name"]))
            if any(True for _ in self.store.iter(gr)):
                continue
            self._crds.discard(name)
            await self._drop_finalizer((CRD_GR, "", name), CRD_CLEANUP)

    # ---------------------------------------------------------------- disruption controller

    def _disruption(self) -> None:
        namespaces, self._pdb_namespaces = self._pdb_namespaces, set()
        now = self.api.clock()
        for ns in namespaces:
            pdbs = list(self.store.iter(PDB_GR, ns))
            if not pdbs:
                continue
            pods = [p.obj for p in self.store.iter(PODS_GR, ns)]
            for s in pdbs:
                try:
                    sel = label_selector_from_object((s.obj.get("spec") or {}).get("selector"))
                except ValueError:
                    continue
                matching = [p for p in pods if sel.matches(p["metadata"].get("labels") or {})]
                status = pdb_status(s.obj, matching, now)
                old = s.obj.get("status") or {}
                if {k: v for k, v in status.items() if k != "conditions"} == {
                    k: v for k, v in old.items() if k != "conditions"
                } and [dict(c, lastTransitionTime=None) for c in status["conditions"]] == [
                    dict(c, lastTransitionTime=None) for c in old.get("conditions") or []
                ]:
                    continue
                new = dict(s.obj, metadata=dict(s.obj["metadata"]))  # the stored version stays as it was
                new["status"] = status
                self.store.put(PDB_GR, new)
