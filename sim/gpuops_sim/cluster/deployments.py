"""The Deployment controller of kube-controller-manager (apps/v1): rollouts through ReplicaSets.

A Deployment owns one ReplicaSet per pod template it has had, named `<deployment>-<pod-template-hash>`; the
one whose template is the Deployment's is the new ReplicaSet, the others old. Each sync does what upstream's
does, in its order: claim ReplicaSets (adopt matching orphans, release ones whose labels stopped matching),
note a pause or resume, then either scale proportionally (paused, or `spec.replicas` changed mid-rollout) or
roll out: RollingUpdate grows the new ReplicaSet within replicas+maxSurge and shrinks old ones while
replicas-maxUnavailable stay available; Recreate scales every old ReplicaSet to zero, waits until none of
their pods runs, then scales the new one up. Revisions are the `deployment.kubernetes.io/revision`
annotations `kubectl rollout history` lists and `kubectl rollout undo` (client-side) rolls back by, old
ReplicaSets beyond revisionHistoryLimit are deleted once complete, and the status (replica counts, the
Available and Progressing conditions, ProgressDeadlineExceeded) is what `kubectl rollout status` waits on.

The controller reacts to store events only: a Deployment's own changes, its ReplicaSets' changes (spec or
the status the ReplicaSet controller writes), the deletion of a pod of one of its ReplicaSets (Recreate
waits for those); the one timer is the progress-deadline check. Every write carries the resourceVersion it
was computed from; a conflict sends the Deployment back to the next step with fresh objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import DEPLOYMENTS, PODS, REPLICASETS, ClusterAccess
from .deployment_sync import Requeue, Rollouts, SyncRun
from .loop import Loop
from .replicaset_util import adopt, controlled_by, controller_ref, labels_of, owner_reference, release, selector_of
from .rollout import ROLLBACK_TO, Plan

log = structlog.get_logger("gpuops_sim.deployments")

USER = "system:serviceaccount:kube-system:deployment-controller"
COMPONENT = "deployment-controller"

Obj = dict[str, Any]
Key = tuple[str, str]


@dataclass
class DeploymentOptions:
    events: bool = True  # ScalingReplicaSet Events on the Deployment
    retry_base_seconds: float = 0.5  # a failed sync is retried with exponential backoff from here ...
    retry_max_seconds: float = 60.0  # ... up to here


def _selects_everything(dep: Obj) -> bool:
    sel = (dep.get("spec") or {}).get("selector")
    return isinstance(sel, dict) and not sel.get("matchLabels") and not sel.get("matchExpressions")


class DeploymentController(Loop):
    """kube-controller-manager's deployment controller for every Deployment in the emulator."""

    name = "deployments"

    def __init__(self, server: APIServer, options: DeploymentOptions | None = None) -> None:
        super().__init__()
        self.options = options or DeploymentOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT)
        self.store = server.store
        self._rs: dict[str, set[Key]] = {}  # Deployment uid -> the ReplicaSets it controls
        self._rs_owner: dict[str, str] = {}  # ReplicaSet uid -> its Deployment's uid
        self._orphan_rs: dict[str, set[str]] = {}  # namespace -> ReplicaSets no controller owns
        self._pods: dict[str, set[Key]] = {}  # ReplicaSet uid -> its pods (Recreate waits for them to go)
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._wake_at: dict[str, float] = {}
        self._scanned = False
        self.syncs = 0
        self.rollouts = Rollouts(self.access, events=self.options.events, pods=self._pods, requeue=self._requeue)
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _mark(self, uid: str) -> None:
        self._dirty.add(uid)
        self.wake()

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == DEPLOYMENTS:
            self._on_deployment(ev)
        elif ev.gr == REPLICASETS:
            self._on_rs(ev)
        elif ev.gr == PODS:
            self._on_pod(ev)

    def _on_deployment(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = str(obj["metadata"].get("uid", ""))
        if ev.type == "DELETED":
            self._dirty.discard(uid)
            self._failures.pop(uid, None)
            return
        prev = ev.prev.obj if ev.prev is not None else None
        if (self.rollouts.writing == uid and prev is not None and prev.get("spec") == obj.get("spec")
                and prev["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")):
            return  # our own status or revision write
        self._mark(uid)

    def _on_rs(self, ev: WatchEvent) -> None:
        ns, name = ev.key
        new = ev.new.obj
        prev = ev.prev.obj if ev.prev is not None else None
        uid = str(new["metadata"].get("uid", ""))
        owner = controlled_by(new, "Deployment")
        before = controlled_by(prev, "Deployment") if prev is not None else None
        if before and before != owner:
            self._unindex(self._rs, before, ev.key)
            self._mark(before)
        if owner and ev.type != "DELETED":
            self._rs.setdefault(owner, set()).add(ev.key)
            self._rs_owner[uid] = owner
        elif owner:
            self._unindex(self._rs, owner, ev.key)
        if owner:
            self._mark(owner)
        if ev.type == "DELETED" or not owner:
            self._rs_owner.pop(uid, None)
        orphans = self._orphan_rs.setdefault(ns, set())
        if ev.type != "DELETED" and controller_ref(new) is None:
            orphans.add(name)
            if prev is None or controller_ref(prev) is not None or labels_of(prev) != labels_of(new):
                self._offer_orphan(ns, labels_of(new))
        else:
            orphans.discard(name)

    def _offer_orphan(self, ns: str, labels: dict[str, str]) -> None:
        """A new or relabelled orphan ReplicaSet: Deployments of its namespace that select it may adopt it."""
        for dep in self.access.iter(DEPLOYMENTS, ns):
            try:
                if not _selects_everything(dep) and selector_of(dep).matches(labels):
                    self._mark(str(dep["metadata"]["uid"]))
            except ValueError:
                continue

    def _on_pod(self, ev: WatchEvent) -> None:
        new = ev.new.obj
        prev = ev.prev.obj if ev.prev is not None else None
        owner = controlled_by(new, "ReplicaSet")
        before = controlled_by(prev, "ReplicaSet") if prev is not None else None
        if before and before != owner:
            self._unindex(self._pods, before, ev.key)
        if not owner:
            return
        if ev.type != "DELETED":
            self._pods.setdefault(owner, set()).add(ev.key)
            return
        self._unindex(self._pods, owner, ev.key)
        dep_uid = self._rs_owner.get(owner)
        dep = self._lookup(dep_uid) if dep_uid else None
        if dep_uid and dep is not None and not Plan.of(dep).rolling:
            self._mark(dep_uid)  # Recreate starts the new pods once the old ones are gone

    @staticmethod
    def _unindex(index: dict[str, set[Key]], uid: str, key: Key) -> None:
        keys = index.get(uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[uid]

    def _scan(self) -> None:
        """The informers' initial list: objects that existed before this controller was built."""
        self._scanned = True
        for rs in self.access.iter(REPLICASETS):
            meta = rs["metadata"]
            key = (str(meta.get("namespace", "")), str(meta["name"]))
            owner = controlled_by(rs, "Deployment")
            if owner:
                self._rs.setdefault(owner, set()).add(key)
                self._rs_owner[str(meta["uid"])] = owner
            elif controller_ref(rs) is None:
                self._orphan_rs.setdefault(key[0], set()).add(key[1])
        for pod in self.access.iter(PODS):
            owner = controlled_by(pod, "ReplicaSet")
            if owner:
                self._pods.setdefault(owner, set()).add((str(pod["metadata"].get("namespace", "")),
                                                         str(pod["metadata"]["name"])))
        for dep in self.access.iter(DEPLOYMENTS):
            self._dirty.add(str(dep["metadata"]["uid"]))

    def _requeue(self, uid: str, delay: float) -> None:
        when = self.clock() + max(0.0, delay)
        cur = self._wake_at.get(uid)
        if cur is None or when < cur - 1e-3:
            self._wake_at[uid] = when
            self.at(("deployment", uid), when)

    def _retry(self, uid: str) -> None:
        n = self._failures[uid] = self._failures.get(uid, 0) + 1
        self._requeue(uid, min(self.options.retry_base_seconds * 2.0 ** (n - 1), self.options.retry_max_seconds))

    # ------------------------------------------------------------------------------------ loop

    async def step(self) -> None:
        if not self._scanned:
            self._scan()
        now = self.clock()
        for key in self.due(now):
            if isinstance(key, tuple) and key[0] == "deployment":
                uid = str(key[1])
                if self._wake_at.get(uid, now + 1) <= now:
                    del self._wake_at[uid]
                self._dirty.add(uid)
        dirty, self._dirty = self._dirty, set()
        for uid in sorted(dirty):
            await self._sync_one(uid)
        if self._dirty:
            self.wake()  # changes our own writes caused: handled on the next turn, after other components ran

    async def _sync_one(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        ns, name = where[1] if where is not None else ("", "")
        try:
            await self._sync(uid)
            self._failures.pop(uid, None)
        except Requeue:
            self._dirty.add(uid)
        except StatusError as e:
            if e.code == 409:
                self._dirty.add(uid)  # written meanwhile: the next step reads the fresh objects
            elif e.code != 404:
                log.warning("deployment sync failed", namespace=ns, deployment=name, code=e.code, error=str(e))
                self._retry(uid)
        except Exception:  # one broken Deployment must not stall the others
            self.errors += 1
            log.exception("deployment sync failed", namespace=ns, deployment=name)
            self._retry(uid)

    def _lookup(self, uid: str) -> Obj | None:
        where = self.store.by_uid.get(uid)
        if where is None or where[0] != DEPLOYMENTS:
            return None
        return self.access.get(DEPLOYMENTS, *where[1])

    # ------------------------------------------------------------------------------------ sync

    async def _sync(self, uid: str) -> None:
        dep = self._lookup(uid)
        if dep is None:
            return
        self.syncs += 1
        ro = self.rollouts
        if _selects_everything(dep):
            await ro.selecting_all(dep)
            return
        run = SyncRun.of(dep, await self._claim(dep))
        if dep["metadata"].get("deletionTimestamp"):
            new, old = await ro.get_all(run, create=False)
            await ro.sync_status(run, new, old)
            return
        ro.check_paused(run)
        new, old = await ro.get_all(run, create=False)
        if run.plan.paused or ro.scaling_event(run, new, old):
            await ro.scale(run, new, old)
            if run.plan.paused and ROLLBACK_TO not in (dep["metadata"].get("annotations") or {}):
                await ro.cleanup(run, old)
            await ro.sync_status(run, new, old)
        elif run.plan.rolling:
            await ro.rolling(run, new, old)
        else:
            await ro.recreate(run, new, old)


    async def _claim(self, dep: Obj) -> list[Obj]:
        """ClaimReplicaSets: keep owned ones that match, release those that don't, adopt matching orphans."""
        meta = dep["metadata"]
        uid, ns = str(meta["uid"]), str(meta.get("namespace", ""))
        deleting = bool(meta.get("deletionTimestamp"))
        selector = selector_of(dep)
        out: list[Obj] = []
        for key in sorted(self._rs.get(uid, ())):
            rs = self.access.get(REPLICASETS, *key)
            if rs is None or controlled_by(rs, "Deployment") != uid:
                continue
            if selector.matches(labels_of(rs)):
                out.append(rs)
            elif not deleting:
                await release(self.access, REPLICASETS, rs, uid)
        if deleting or selector.matches_nothing:
            return out
        ref = owner_reference(dep, "Deployment")
        for name in sorted(self._orphan_rs.get(ns, ())):
            rs = self.access.get(REPLICASETS, ns, name)
            if rs is None or controller_ref(rs) is not None or rs["metadata"].get("deletionTimestamp"):
                continue
            if selector.matches(labels_of(rs)) and await adopt(self.access, REPLICASETS, rs, ref):
                out.append(self.access.get(REPLICASETS, ns, name) or rs)
        return out



__all__ = ["DeploymentController", "DeploymentOptions"]
