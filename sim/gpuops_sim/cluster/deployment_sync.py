"""The writes of one Deployment sync: its ReplicaSets, the rollout strategies, and the status.

`DeploymentController` (deployments.py) decides when a Deployment syncs and which ReplicaSets are its;
`Rollouts` does what upstream's sync.go, rolling.go, recreate.go and progress.go do with them. A `SyncRun`
carries one sync's working state so that the steps see each other's effects the way upstream's in-memory
Deployment does, while every write still goes through the API with the resourceVersion it was computed from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.store import clone
from .access import DEPLOYMENTS, PODS, REPLICASETS, ClusterAccess
from .jobs import merge_diff
from .replicaset_util import controlled_by, is_terminal, owner_reference
from .rollout import (
    DESIRED_REPLICAS,
    FOUND_NEW_RS,
    HASH_LABEL,
    NEW_RS_AVAILABLE,
    NEW_RS_CREATED,
    PAUSED,
    RESUMED,
    REVISION,
    RS_CREATE_ERROR,
    RS_UPDATED,
    TIMED_OUT,
    Plan,
    active,
    annotation_int,
    as_written,
    bump_revision,
    by_creation,
    by_revision,
    calculate_status,
    compute_hash,
    condition,
    copy_annotations,
    deployment_complete,
    deployment_progressing,
    equal_ignore_hash,
    find_active_or_latest,
    find_new,
    is_saturated,
    max_revision,
    new_condition,
    new_rs_replicas,
    progress_due,
    proportion,
    replica_failures,
    replicas_of,
    set_condition,
    set_replicas_annotations,
    status_int,
    timed_out,
    without_condition,
)

log = structlog.get_logger("gpuops_sim.deployments")

Obj = dict[str, Any]
Key = tuple[str, str]


class Requeue(Exception):
    """Stop this sync and run it again on the next step (a pod-template-hash collision was recorded)."""


@dataclass
class SyncRun:
    """One sync's working state. `status` plays upstream's `d.Status`: the status as read, plus the
    conditions and collisionCount set along the way; `dep` is the object as last written (its
    resourceVersion is the next write's precondition)."""

    dep: Obj
    plan: Plan
    status: Obj
    rss: list[Obj]

    @classmethod
    def of(cls, dep: Obj, rss: list[Obj]) -> SyncRun:
        return cls(dep=dep, plan=Plan.of(dep), status=clone(dep.get("status") or {}), rss=rss)

    @property
    def ns(self) -> str:
        return str(self.dep["metadata"].get("namespace", ""))

    @property
    def name(self) -> str:
        return str(self.dep["metadata"]["name"])

    @property
    def generation(self) -> int:
        return int(self.dep["metadata"].get("generation") or 0)

    def set_condition(self, cond: Obj) -> None:
        self.status["conditions"] = set_condition(list(self.status.get("conditions") or []), cond)


class Rollouts:
    """The deployment controller's writes, as its service account. `writing` names the Deployment whose
    own write is in flight, so the controller's listener can tell it from a user's change; `pods` is the
    controller's index of pods by ReplicaSet uid; `requeue` schedules a Deployment's next sync."""

    def __init__(self, access: ClusterAccess, *, events: bool, pods: dict[str, set[Key]],
                 requeue: Callable[[str, float], None]) -> None:
        self.access = access
        self.events = events
        self.pods = pods
        self.requeue = requeue
        self.writing: str | None = None

    async def selecting_all(self, dep: Obj) -> None:
        """An empty selector would claim every pod of the namespace: refuse, say so, and observe the spec."""
        await self._event(dep, "Warning", "SelectingAll",
                          "This deployment is selecting all pods. A non-empty selector is required.")
        gen = int(dep["metadata"].get("generation") or 0)
        if status_int(dep, "observedGeneration") < gen:
            run = SyncRun(dep=dep, plan=Plan.of(dep), status={}, rss=[])
            await self._write_status(run, {**(dep.get("status") or {}), "observedGeneration": gen})

    def check_paused(self, run: SyncRun) -> None:
        """Progressing Unknown while paused, so a pause longer than the deadline is not read as no progress."""
        if run.plan.deadline is None:
            return
        cond = condition(run.status.get("conditions") or [], "Progressing")
        if cond is not None and cond.get("reason") == TIMED_OUT:
            return
        was_paused = cond is not None and cond.get("reason") == PAUSED
        stamp = self.access.stamp()
        if run.plan.paused and not was_paused:
            run.set_condition(new_condition("Progressing", "Unknown", PAUSED, "Deployment is paused", stamp))
        elif not run.plan.paused and was_paused:
            run.set_condition(new_condition("Progressing", "Unknown", RESUMED, "Deployment is resumed", stamp))

    def scaling_event(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> bool:
        """spec.replicas differs from what an active ReplicaSet was last sized for (its desired-replicas)."""
        for rs in active([*old, new]):
            desired = annotation_int(rs, DESIRED_REPLICAS)
            if desired is not None and desired != run.plan.replicas:
                return True
        return False

    # ------------------------------------------------------------------------------------ ReplicaSets

    async def get_all(self, run: SyncRun, *, create: bool) -> tuple[Obj | None, list[Obj]]:
        """The new ReplicaSet (created when asked and missing) and the old ones, revisions brought in line."""
        new = find_new((run.dep.get("spec") or {}).get("template"), run.rss)
        old = [rs for rs in run.rss if new is None or rs["metadata"]["uid"] != new["metadata"]["uid"]]
        revision = max_revision(old) + 1
        if new is not None:
            return await self._sync_new_rs(run, new, revision), old
        if not create:
            return None, old
        return await self._create_new_rs(run, old, revision), old

    async def _sync_new_rs(self, run: SyncRun, rs: Obj, revision: int) -> Obj:
        """Carry the Deployment's annotations and minReadySeconds onto its new ReplicaSet, raise its revision
        above every old one (a rollback), and copy that revision onto the Deployment."""
        annotations = dict(rs["metadata"].get("annotations") or {})
        changed = copy_annotations(run.dep, annotations)
        changed = bump_revision(annotations, revision) or changed
        min_ready = int((rs.get("spec") or {}).get("minReadySeconds") or 0)
        if changed or min_ready != run.plan.min_ready:
            rs = await self._patch_rs(rs, {"metadata": {"annotations": annotations},
                                           "spec": {"minReadySeconds": run.plan.min_ready or None}})
        await self._set_revision(run, annotations.get(REVISION))
        if run.plan.deadline is not None and condition(run.status.get("conditions") or [], "Progressing") is None:
            msg = f'Found new replica set "{rs["metadata"]["name"]}"'
            run.set_condition(new_condition("Progressing", "True", FOUND_NEW_RS, msg, self.access.stamp()))
        return rs

    def _new_rs_body(self, run: SyncRun, old: list[Obj], revision: int) -> Obj:
        spec = run.dep.get("spec") or {}
        pod_hash = compute_hash(spec.get("template"), run.status.get("collisionCount"))
        template = clone(spec.get("template") or {})
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: pod_hash}
        selector = clone(spec.get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: pod_hash}
        annotations: dict[str, str] = {}
        copy_annotations(run.dep, annotations)
        bump_revision(annotations, revision)
        set_replicas_annotations(annotations, run.plan.replicas, run.plan.replicas + run.plan.max_surge)
        rs_spec: Obj = {"replicas": new_rs_replicas(run.plan, [*old], 0), "selector": selector, "template": template}
        if run.plan.min_ready:
            rs_spec["minReadySeconds"] = run.plan.min_ready
        meta = {"name": f"{run.name}-{pod_hash}", "namespace": run.ns, "labels": dict(tmeta["labels"]),
                "annotations": annotations, "ownerReferences": [owner_reference(run.dep, "Deployment")]}
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": rs_spec}

    async def _create_new_rs(self, run: SyncRun, old: list[Obj], revision: int) -> Obj:
        body = self._new_rs_body(run, old, revision)
        name, replicas = str(body["metadata"]["name"]), int(body["spec"]["replicas"])
        try:
            rs, existed = await self.access.create(REPLICASETS, run.ns, body), False
        except StatusError as e:
            if e.reason != "AlreadyExists":
                await self._create_failed(run, name, e)
                raise
            rs, existed = await self._name_taken(run, name), True
        if not existed and replicas > 0:
            await self._event(run.dep, "Normal", "ScalingReplicaSet", f"Scaled up replica set {name} to {replicas}")
        await self._set_revision(run, str(revision))
        if not existed and run.plan.deadline is not None:
            msg = f'Created new replica set "{name}"'
            run.set_condition(new_condition("Progressing", "True", NEW_RS_CREATED, msg, self.access.stamp()))
        run.rss.append(rs)
        return rs

    async def _name_taken(self, run: SyncRun, name: str) -> Obj:
        """The hash-named ReplicaSet exists: ours with this template (a stale read), or a hash collision, which
        bumps collisionCount so the next sync draws another name."""
        rs = self.access.get(REPLICASETS, run.ns, name)
        spec = run.dep.get("spec") or {}
        if rs is not None and controlled_by(rs, "Deployment") == run.dep["metadata"]["uid"] and equal_ignore_hash(
                spec.get("template"), (rs.get("spec") or {}).get("template")):
            return rs
        before = run.status.get("collisionCount")
        run.status["collisionCount"] = int(before or 0) + 1
        await self._write_status(run, run.status)
        log.info("pod-template-hash collision", namespace=run.ns, deployment=run.name, replicaset=name,
                 collision_count=run.status["collisionCount"])
        raise Requeue()

    async def _create_failed(self, run: SyncRun, name: str, e: StatusError) -> None:
        msg = f'Failed to create new replica set "{name}": {e}'
        if run.plan.deadline is not None:
            run.set_condition(new_condition("Progressing", "False", RS_CREATE_ERROR, msg, self.access.stamp()))
            await self._write_status(run, run.status)
        await self._event(run.dep, "Warning", RS_CREATE_ERROR, msg)

    async def _set_revision(self, run: SyncRun, revision: str | None) -> None:
        if revision is None or (run.dep["metadata"].get("annotations") or {}).get(REVISION) == revision:
            return
        body = {"metadata": {"annotations": {REVISION: revision},
                             "resourceVersion": run.dep["metadata"].get("resourceVersion")}}
        self.writing = str(run.dep["metadata"]["uid"])
        try:
            run.dep = await self.access.patch(DEPLOYMENTS, run.ns, run.name, body)
        finally:
            self.writing = None

    async def _patch_rs(self, rs: Obj, body: Obj) -> Obj:
        meta = rs["metadata"]
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": meta.get("resourceVersion")}
        return await self.access.patch(REPLICASETS, str(meta.get("namespace", "")), str(meta["name"]), body)

    async def _resize(self, run: SyncRun, rs: Obj, size: int, op: str) -> Obj:
        """scaleReplicaSet: the size and the desired/max-replicas annotations the next scaling event reads."""
        annotations = dict(rs["metadata"].get("annotations") or {})
        grows = replicas_of(rs) != size
        marked = set_replicas_annotations(annotations, run.plan.replicas, run.plan.replicas + run.plan.max_surge)
        if not grows and not marked:
            return rs
        before = replicas_of(rs)
        rs = await self._patch_rs(rs, {"metadata": {"annotations": annotations}, "spec": {"replicas": size}})
        if grows:
            msg = f"Scaled {op} replica set {rs['metadata']['name']} to {size} from {before}"
            await self._event(run.dep, "Normal", "ScalingReplicaSet", msg)
        return rs

    async def _scale_to(self, run: SyncRun, rs: Obj, size: int) -> tuple[bool, Obj]:
        if replicas_of(rs) == size:
            return False, rs
        return True, await self._resize(run, rs, size, "up" if replicas_of(rs) < size else "down")

    # ------------------------------------------------------------------------------------ strategies

    async def scale(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> None:
        """A scaling event: all to the one active ReplicaSet, or spread proportionally over several."""
        plan = run.plan
        only = find_active_or_latest(new, old)
        if only is not None:
            if replicas_of(only) != plan.replicas:
                await self._scale_to(run, only, plan.replicas)
            return
        if is_saturated(plan, new):
            for rs in active(list(old)):
                await self._scale_to(run, rs, 0)
            return
        if not plan.rolling:
            return
        live = active([*old, new])
        allowed = plan.replicas + plan.max_surge if plan.replicas > 0 else 0
        to_add = allowed - sum(replicas_of(rs) for rs in live)
        # Equal sizes: scale newer ReplicaSets up first and older ones down first.
        live.sort(key=by_creation, reverse=to_add > 0)
        live.sort(key=replicas_of, reverse=True)
        sizes: dict[str, int] = {}
        added = 0
        for rs in live:
            share = proportion(rs, plan, status_int(run.dep, "replicas"), to_add, added) if to_add else 0
            sizes[rs["metadata"]["uid"]] = replicas_of(rs) + share
            added += share
        op = "up" if to_add > 0 else "down" if to_add < 0 else ""
        for i, rs in enumerate(live):
            size = sizes[rs["metadata"]["uid"]]
            if i == 0 and to_add:
                size = max(0, size + to_add - added)  # leftovers to the largest
            await self._resize(run, rs, size, op)

    async def rolling(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> None:
        if new is None:
            new, old = await self.get_all(run, create=True)
        assert new is not None
        all_rs = [*old, new]
        if await self._reconcile_new(run, all_rs, new) or await self._reconcile_old(run, all_rs, active(old), new):
            await self._rollout_status(run, new, old)
            return
        if deployment_complete(run.plan, run.generation, run.status):
            await self.cleanup(run, old)
        await self._rollout_status(run, new, old)

    async def _reconcile_new(self, run: SyncRun, all_rs: list[Obj], new: Obj) -> bool:
        """Grow the new ReplicaSet as far as the surge bound lets it (or shrink it to spec.replicas)."""
        size, want = replicas_of(new), run.plan.replicas
        if size == want:
            return False
        target = want if size > want else new_rs_replicas(run.plan, all_rs, size)
        scaled, _ = await self._scale_to(run, new, target)
        return scaled

    async def _reconcile_old(self, run: SyncRun, all_rs: list[Obj], old: list[Obj], new: Obj) -> bool:
        """Shrink old ReplicaSets: unavailable pods first (they cost no availability), then available ones
        while more than replicas-maxUnavailable pods stay available, counting the new ReplicaSet's
        not-yet-available pods against that budget."""
        if sum(replicas_of(rs) for rs in old) == 0:
            return False
        unavailable_new = replicas_of(new) - status_int(new, "availableReplicas")
        budget = sum(replicas_of(rs) for rs in all_rs) - run.plan.min_available - unavailable_new
        if budget <= 0:
            return False
        old, cleaned = await self._cleanup_unhealthy(run, old, budget)
        return cleaned + await self._scale_down_old(run, [*old, new], old) > 0

    async def _cleanup_unhealthy(self, run: SyncRun, old: list[Obj], budget: int) -> tuple[list[Obj], int]:
        out = sorted(old, key=by_creation)
        total = 0
        for i, rs in enumerate(out):
            if total >= budget:
                break
            size, ok = replicas_of(rs), status_int(rs, "availableReplicas")
            if size == 0 or size <= ok:
                continue
            down = min(budget - total, size - ok)
            _, out[i] = await self._scale_to(run, rs, size - down)
            total += down
        return out, total

    async def _scale_down_old(self, run: SyncRun, all_rs: list[Obj], old: list[Obj]) -> int:
        available = sum(status_int(rs, "availableReplicas") for rs in all_rs)
        budget = available - run.plan.min_available
        total = 0
        for rs in sorted(old, key=by_creation):
            if total >= budget:
                break
            size = replicas_of(rs)
            if size == 0:
                continue
            down = min(size, budget - total)
            await self._scale_to(run, rs, size - down)
            total += down
        return total

    async def recreate(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> None:
        """Every old pod gone before the first new one: scale old ReplicaSets to zero, wait, then the new."""
        scaled = False
        for rs in active(list(old)):
            did, _ = await self._scale_to(run, rs, 0)
            scaled = scaled or did
        if scaled or self._old_pods_running(new, old):
            await self._rollout_status(run, new, old)
            return
        if new is None:
            new, old = await self.get_all(run, create=True)
        assert new is not None
        await self._scale_to(run, new, run.plan.replicas)
        if deployment_complete(run.plan, run.generation, run.status):
            await self.cleanup(run, old)
        await self._rollout_status(run, new, old)

    def _old_pods_running(self, new: Obj | None, old: list[Obj]) -> bool:
        if sum(status_int(rs, "replicas") for rs in old) > 0:
            return True
        new_uid = new["metadata"]["uid"] if new is not None else None
        for rs in old:
            uid = str(rs["metadata"]["uid"])
            if uid == new_uid:
                continue
            for key in self.pods.get(uid, ()):
                pod = self.access.get(PODS, *key)
                if pod is not None and not is_terminal(pod):
                    return True
        return False

    async def cleanup(self, run: SyncRun, old: list[Obj]) -> None:
        """Delete the oldest revisions beyond revisionHistoryLimit, once they have no pods left."""
        limit = run.plan.history_limit
        if limit is None:
            return
        fresh = [rs for rs in (self.access.get(REPLICASETS, run.ns, r["metadata"]["name"]) for r in old)
                 if rs is not None and not rs["metadata"].get("deletionTimestamp")]
        excess = len(fresh) - limit
        for rs in sorted(fresh, key=by_revision)[:max(0, excess)]:
            busy = status_int(rs, "replicas") != 0 or replicas_of(rs) != 0
            if busy or int(rs["metadata"].get("generation") or 0) > status_int(rs, "observedGeneration"):
                continue
            meta = rs["metadata"]
            await self.access.delete(REPLICASETS, run.ns, str(meta["name"]), uid=str(meta["uid"]))

    # ------------------------------------------------------------------------------------ status

    def _fresh(self, rs: Obj | None) -> Obj | None:
        """A ReplicaSet as the store holds it now, after this sync's own writes."""
        return None if rs is None else self.access.get(REPLICASETS, *_key(rs))

    def _fresh_all(self, rss: list[Obj | None]) -> list[Obj]:
        return [got for rs in rss if (got := self._fresh(rs)) is not None]

    async def sync_status(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> None:
        all_rs, fresh_new = self._fresh_all([*old, new]), self._fresh(new)
        status = calculate_status(all_rs, fresh_new, run.dep, run.plan, run.status, self.access.stamp())
        await self._write_status(run, status)

    async def _rollout_status(self, run: SyncRun, new: Obj | None, old: list[Obj]) -> None:
        """syncRolloutStatus: the counts, Available, and Progressing estimated against the progress deadline."""
        all_rs, fresh_new = self._fresh_all([*old, new]), self._fresh(new)
        stamp = self.access.stamp()
        status = calculate_status(all_rs, fresh_new, run.dep, run.plan, run.status, stamp)
        conds: list[Obj] = list(status["conditions"])
        if run.plan.deadline is None:
            conds = without_condition(conds, "Progressing")
        current = condition(run.status.get("conditions") or [], "Progressing")
        settled = (status["replicas"] == status["updatedReplicas"] and current is not None
                   and current.get("reason") == NEW_RS_AVAILABLE)
        if run.plan.deadline is not None and not settled:
            conds = self._progress(run, status, conds, current, fresh_new, stamp)
        failures = replica_failures(all_rs, fresh_new)
        conds = set_condition(conds, failures[0]) if failures else without_condition(conds, "ReplicaFailure")
        status["conditions"] = conds
        await self._write_status(run, status)
        self._requeue_stuck(run, status)

    def _progress(self, run: SyncRun, status: Obj, conds: list[Obj], current: Obj | None, new: Obj | None,
                  stamp: str) -> list[Obj]:
        subject = f'ReplicaSet "{new["metadata"]["name"]}"' if new is not None else f'Deployment "{run.name}"'
        if deployment_complete(run.plan, run.generation, status):
            cond = new_condition("Progressing", "True", NEW_RS_AVAILABLE, f"{subject} has successfully progressed.",
                                 stamp)
            return set_condition(conds, cond)
        if deployment_progressing(run.status, status):
            cond = new_condition("Progressing", "True", RS_UPDATED, f"{subject} is progressing.", stamp)
            if current is not None and current.get("status") == "True":
                cond["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
            return [*without_condition(conds, "Progressing"), cond]
        if timed_out(run.plan, {"conditions": conds}, self.access.now()):
            cond = new_condition("Progressing", "False", TIMED_OUT, f"{subject} has timed out progressing.", stamp)
            return set_condition(conds, cond)
        return conds

    def _requeue_stuck(self, run: SyncRun, status: Obj) -> None:
        """Come back when the progress deadline would pass, since no event would announce that."""
        cond = condition(status.get("conditions") or [], "Progressing")
        if cond is None or cond.get("reason") == TIMED_OUT or deployment_complete(run.plan, run.generation, status):
            return
        due = progress_due(run.plan, cond)
        if due is None:
            return
        after = (due - self.access.now()).total_seconds()
        self.requeue(str(run.dep["metadata"]["uid"]), after + 1.0 if after >= 1.0 else max(after, 0.0) + 0.05)

    async def _write_status(self, run: SyncRun, status: Obj) -> None:
        patch = merge_diff(run.dep.get("status") or {}, as_written(status))
        if not patch:
            return
        body = {"metadata": {"resourceVersion": run.dep["metadata"].get("resourceVersion")}, "status": patch}
        self.writing = str(run.dep["metadata"]["uid"])
        try:
            run.dep = await self.access.patch(DEPLOYMENTS, run.ns, run.name, body, subresource="status")
        finally:
            self.writing = None

    async def _event(self, dep: Obj, type_: str, reason: str, message: str) -> None:
        if self.events:
            await self.access.event(dep, "Deployment", type_, reason, message)


def _key(obj: Obj) -> Key:
    return str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"])


__all__ = ["Requeue", "Rollouts", "SyncRun"]
