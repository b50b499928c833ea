"""The loop shared by the controllers that own pods one object at a time (DaemonSets, StatefulSets): an initial
scan of what existed before they started, per-object retry timers, orphan routing, and a sync per dirty key
whose failure is logged and retried without stopping the others.
"""

from __future__ import annotations

from abc import abstractmethod

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.store import GroupResource
from .access import PODS, ClusterAccess
from .loop import Loop
from .revisions import Orphans, controller_uid

log = structlog.get_logger("gpuops_sim.cluster")

Key = tuple[str, str]


class PodOwnerController(Loop):
    """Subclasses set `kind`, `resource`, `timer_tag` and `retry_seconds`, fill the attributes below in their
    constructor, and implement `_sync`."""

    kind: str
    resource: GroupResource
    timer_tag: str
    retry_seconds: float
    access: ClusterAccess
    _pods: dict[str, set[Key]]  # owner uid -> its pods
    _dirty: set[Key]
    _wake_at: dict[Key, float]
    _orphans: Orphans
    _writing: str | None
    _scanned: bool

    @abstractmethod
    async def _sync(self, key: Key) -> None:
        """Bring one owner's pods and status to what its spec asks."""

    def _scan(self) -> None:
        """The informers' initial list: pods and owners that existed before this controller started."""
        self._scanned = True
        for pod in self.access.iter(PODS):
            uid = controller_uid(pod, self.kind)
            if uid:
                meta = pod["metadata"]
                self._pods.setdefault(uid, set()).add((meta.get("namespace", ""), meta["name"]))
        for owner in self.access.iter(self.resource):
            self._dirty.add((owner["metadata"].get("namespace", ""), owner["metadata"]["name"]))
            self._orphans.scan(owner["metadata"].get("namespace", ""))

    def _requeue(self, key: Key, delay: float) -> None:
        when = self.clock() + max(0.0, delay)
        cur = self._wake_at.get(key)
        if cur is None or when < cur - 1e-3 or cur < self.clock():
            self._wake_at[key] = when
            self.at((self.timer_tag, key), when)

    async def step(self) -> None:
        if not self._scanned:
            self._scan()
        now = self.clock()
        for item in self.due(now):
            if isinstance(item, tuple) and item[0] == self.timer_tag:
                key: Key = item[1]
                if self._wake_at.get(key, now + 1) <= now:
                    del self._wake_at[key]
                self._dirty.add(key)
        self._dirty |= self._orphans.route()
        dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            await self._sync_one(key)
        if self._dirty:
            self.wake()

    async def _sync_one(self, key: Key) -> None:
        """One owner's sync; a failure is logged and retried without stopping the others."""
        what = self.kind.lower()
        try:
            await self._sync(key)
        except StatusError as e:
            if e.code == 404:
                return
            if e.code == 409 and e.reason != "AlreadyExists":
                self._dirty.add(key)  # someone wrote first: read again on the next step
                return
            log.warning(f"{what} sync failed", namespace=key[0], code=e.code, error=str(e), **{what: key[1]})
            self._requeue(key, self.retry_seconds)
        except Exception:
            self.errors += 1
            log.exception(f"{what} sync failed", namespace=key[0], **{what: key[1]})
            self._requeue(key, self.retry_seconds)
        finally:
            self._writing = None
