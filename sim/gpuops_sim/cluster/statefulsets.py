"""The StatefulSet controller of kube-controller-manager (apps/v1): stable, ordered pod identities.

Pods are named `<set>-<ordinal>` for ordinals `[start, start + replicas)` and carry hostname = pod name,
subdomain = serviceName and the labels `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index`
and `controller-revision-hash` (the name of the ControllerRevision they were made from). Every
volumeClaimTemplate becomes a PersistentVolumeClaim `<claim>-<set>-<ordinal>` before its pod (the objects
only: nothing binds them), with owner references following persistentVolumeClaimRetentionPolicy.

OrderedReady (the default) is upstream's monotonic mode: ordinals are walked upwards and the walk stops at the
first pod that had to be created, is terminating, or is not yet Running, Ready and available, so pod i exists
only once 0..i-1 are Ready; extra pods are removed from the highest ordinal down, one at a time. Parallel
walks everything in one pass. RollingUpdate replaces pods whose revision is not the update revision from the
highest ordinal down to `partition`, never making more than maxUnavailable replicas unavailable; OnDelete
leaves that to the user. Status follows `updateStatefulSetStatus`, including completing a rollout by making
the update revision current. Orphaned pods named after the set and matching its selector are adopted (a set
deleted with `--cascade=orphan` and created again keeps its pods); relabelled pods are released.

Like the other controllers here, it is driven by store events (pods indexed by the uid of their controlling
StatefulSet), reads the store directly and writes as the statefulset-controller service account.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent, clone
from .access import CONTROLLER_REVISIONS, PODS, PVCS, STATEFULSETS, ClusterAccess
from .pod_owners import PodOwnerController
from .revisions import (
    CONTROLLER_REVISION_HASH,
    REVISION_HASH_LABEL,
    Orphans,
    adopt,
    adoptable,
    available_after,
    controller_ref,
    controller_uid,
    delete_revision,
    go_json,
    new_revision,
    owned_revisions,
    phase,
    release,
    revision_data,
    revision_hash,
    revision_name,
    revision_number,
    scaled_value,
    selector_of,
    set_revision_number,
    template_of,
    template_patch,
    terminal,
    terminating,
)

log = structlog.get_logger("gpuops_sim.statefulsets")

USER = "system:serviceaccount:kube-system:statefulset-controller"
COMPONENT = "statefulset-controller"
KIND = "StatefulSet"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
RETRY_SECONDS = 1.0
STALE_CLAIM_SECONDS = 0.5  # a claim still owned by a previous pod: wait for the garbage collector
MAX_COLLISIONS = 100
_ORDINAL = re.compile(r"(.*)-([0-9]+)$")

Key = tuple[str, str]
Pod = dict[str, Any]


@dataclass
class StatefulSetOptions:
    events: bool = True  # SuccessfulCreate / SuccessfulDelete Events on the StatefulSet


# ------------------------------------------------------------------------------------------ pure helpers


def parent_and_ordinal(name: str) -> tuple[str, int]:
    """`getParentNameAndOrdinal`: ("", -1) for a name that is not `<parent>-<int32>`."""
    m = _ORDINAL.match(name)
    if m is None:
        return "", -1
    ordinal = int(m.group(2))
    return (m.group(1), ordinal) if ordinal < 2**31 else (m.group(1), -1)


def claim_name(template: dict[str, Any], set_name: str, ordinal: int) -> str:
    return f"{(template.get('metadata') or {}).get('name', '')}-{set_name}-{ordinal}"


@dataclass
class _View:
    """The parts of a StatefulSet a sync reads, with the API's defaults applied to absent fields."""

    key: Key
    uid: str
    replicas: int
    start: int
    parallel: bool
    rolling: bool
    partition: int
    max_unavailable: Any
    min_ready: int
    history_limit: int
    service: str
    claims: list[dict[str, Any]]
    selector_labels: dict[str, str]
    when_deleted: str
    when_scaled: str

    @classmethod
    def of(cls, sts: dict[str, Any]) -> _View:
        meta, spec = sts["metadata"], sts.get("spec") or {}
        strategy = spec.get("updateStrategy") or {}
        ru = strategy.get("rollingUpdate") or {}
        retention = spec.get("persistentVolumeClaimRetentionPolicy") or {}
        return cls(
            key=(meta.get("namespace", ""), meta["name"]),
            uid=meta["uid"],
            replicas=int(_default(spec.get("replicas"), 1)),
            start=int(((spec.get("ordinals") or {}).get("start")) or 0),
            parallel=spec.get("podManagementPolicy") == "Parallel",
            rolling=(strategy.get("type") or "RollingUpdate") == "RollingUpdate",
            partition=int(ru.get("partition") or 0),
            max_unavailable=ru.get("maxUnavailable"),
            min_ready=int(spec.get("minReadySeconds") or 0),
            history_limit=int(_default(spec.get("revisionHistoryLimit"), 10)),
            service=str(spec.get("serviceName") or ""),
            claims=[c for c in spec.get("volumeClaimTemplates") or () if isinstance(c, dict)],
            selector_labels=dict((spec.get("selector") or {}).get("matchLabels") or {}),
            when_deleted=str(retention.get("whenDeleted") or "Retain"),
            when_scaled=str(retention.get("whenScaled") or "Retain"),
        )

    @property
    def name(self) -> str:
        return self.key[1]

    def in_range(self, ordinal: int) -> bool:
        return self.start <= ordinal < self.start + self.replicas


def _is_member(sts: dict[str, Any], pod: Pod) -> bool:
    """`isMemberOf`: the pod is named `<set>-<ordinal>`."""
    return parent_and_ordinal(str(pod["metadata"]["name"]))[0] == str(sts["metadata"]["name"])


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def stateful_pod(sts: dict[str, Any], view: _View, template: dict[str, Any], ordinal: int,
                 revision: str) -> Pod:
    """`newVersionedStatefulSetPod`: the template of `revision` with the pod's identity and claims."""
    name = f"{view.name}-{ordinal}"
    tmeta = template.get("metadata") or {}
    labels = {**(tmeta.get("labels") or {}), POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal),
              CONTROLLER_REVISION_HASH: revision}
    spec: dict[str, Any] = clone(template.get("spec") or {})
    spec["hostname"] = name
    if view.service:
        spec["subdomain"] = view.service
    claimed = [c.get("metadata", {}).get("name", "") for c in view.claims]
    volumes = [{"name": n, "persistentVolumeClaim": {"claimName": claim_name(c, view.name, ordinal)}}
               for n, c in zip(claimed, view.claims, strict=True)]
    volumes += [v for v in spec.get("volumes") or () if v.get("name") not in claimed]
    if volumes:
        spec["volumes"] = volumes
    meta: dict[str, Any] = {"name": name, "generateName": f"{view.name}-", "namespace": view.key[0],
                            "labels": labels, "ownerReferences": [controller_ref(sts, KIND)]}
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def claim_for(view: _View, template: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """One pod's PersistentVolumeClaim from a template, labelled with the set's selector labels."""
    tmeta = template.get("metadata") or {}
    meta: dict[str, Any] = {"name": claim_name(template, view.name, ordinal), "namespace": view.key[0],
                            "labels": {**(tmeta.get("labels") or {}), **view.selector_labels}}
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": clone(template.get("spec") or {})}


def _is_ref(ref: dict[str, Any], kind: str, name: str) -> bool:
    return ref.get("kind") == kind and ref.get("name") == name


def claim_refs(view: _View, sts: dict[str, Any], pod: Pod | None, ordinal: int,
               claim: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The owner references a claim should have under the retention policy, or None to leave it alone
    (it names a previous set or pod of the same name: the garbage collector decides)."""
    refs = list(claim["metadata"].get("ownerReferences") or ())
    pod_name = f"{view.name}-{ordinal}"
    for ref in refs:
        if (_is_ref(ref, KIND, view.name) and ref.get("uid") != view.uid) or (
                _is_ref(ref, "Pod", pod_name) and (pod is None or ref.get("uid") != pod["metadata"].get("uid"))):
            return None
    out = [r for r in refs if not _is_ref(r, KIND, view.name) and not _is_ref(r, "Pod", pod_name)]
    scaled_down = not view.in_range(ordinal)
    if view.when_deleted == "Delete" and (view.when_scaled != "Delete" or not scaled_down):
        out.append(controller_ref(sts, KIND))
    if view.when_scaled == "Delete" and scaled_down and pod is not None:
        out.append(controller_ref(pod, "Pod", "v1"))
    return out


def _ref_ids(refs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((str(r.get("kind")), str(r.get("name")), str(r.get("uid"))) for r in refs)


# ------------------------------------------------------------------------------------------ controller


class StatefulSetController(PodOwnerController):
    """apps/v1 StatefulSet controller, writing as the statefulset-controller service account."""

    name = "statefulset-controller"
    kind = KIND
    resource = STATEFULSETS
    timer_tag = "sts"
    retry_seconds = RETRY_SECONDS

    def __init__(self, server: APIServer, options: StatefulSetOptions | None = None) -> None:
        super().__init__()
        self.options = options or StatefulSetOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT,
                                    groups=("system:serviceaccounts", "system:serviceaccounts:kube-system"))
        self.store = self.access.store
        self._pods: dict[str, set[Key]] = {}  # StatefulSet uid -> its pods
        self._dirty: set[Key] = set()
        self._wake_at: dict[Key, float] = {}
        self._writing: str | None = None
        self._scanned = False
        self._orphans = Orphans(self.access, STATEFULSETS, _is_member)
        self.syncs = 0
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._on_pod(ev)
        elif ev.gr == STATEFULSETS:
            self._on_set(ev)
        elif ev.gr == CONTROLLER_REVISIONS:
            uid = controller_uid(ev.new.obj, KIND)
            if uid and uid != self._writing:
                self._mark_uid(uid)

    def _mark_uid(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        if where is not None and where[0] == STATEFULSETS:
            self._dirty.add(where[1])
            self.wake()

    def _on_pod(self, ev: WatchEvent) -> None:
        uid = controller_uid(ev.new.obj, KIND)
        prev = controller_uid(ev.prev.obj, KIND) if ev.prev is not None else None
        if prev and prev != uid:
            self._pods.get(prev, set()).discard(ev.key)
            self._mark_uid(prev)
        if not uid:
            if self._orphans.note(ev):
                self.wake()
            return
        if ev.type == "DELETED":
            self._pods.get(uid, set()).discard(ev.key)
        else:
            self._pods.setdefault(uid, set()).add(ev.key)
        self._mark_uid(uid)

    def _on_set(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = obj["metadata"].get("uid", "")
        if ev.type == "DELETED":
            self._dirty.discard(ev.key)
            self._orphans.forget(ev.key)
            return
        if ev.type == "ADDED":
            self._orphans.scan(ev.key[0])
        prev = ev.prev.obj if ev.prev is not None else None
        if (self._writing == uid and prev is not None and prev.get("spec") == obj.get("spec")
                and prev["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")):
            return  # our own status write
        self._dirty.add(ev.key)
        self.wake()

    # ------------------------------------------------------------------------------------ sync

    async def _sync(self, key: Key) -> None:
        sts = self.access.get(STATEFULSETS, *key)
        if sts is None:
            return
        self.syncs += 1
        view = _View.of(sts)
        self._writing = view.uid
        await self._claim(sts, view)
        revisions = owned_revisions(self.access, view.key[0], view.uid, KIND)
        cur, upd, collisions = await self._revisions(sts, view, revisions)
        if not sts["metadata"].get("deletionTimestamp"):
            await self._update_pods(sts, view, cur, upd)
        await self._update_status(view, cur, upd, collisions)
        await self._truncate_history(view, revisions, cur, upd)

    async def _claim(self, sts: dict[str, Any], view: _View) -> None:
        """`ClaimPods` for members: adopt matching orphans named after the set, release relabelled pods."""
        selector = selector_of(sts)
        for pod in self._orphans.take(view.key):
            if adoptable(sts, pod, selector) and _is_member(sts, pod):
                await adopt(self.access, sts, KIND, pod, PODS)
        for key in list(self._pods.get(view.uid, ())):
            owned = self.access.get(PODS, *key)
            if owned is not None and controller_uid(owned, KIND) == view.uid and not selector.matches(
                    owned["metadata"].get("labels")):
                await release(self.access, view.uid, owned, PODS)

    def _members(self, view: _View) -> dict[int, Pod]:
        """The set's pods by ordinal (`isMemberOf`: owned, and named after the set)."""
        out: dict[int, Pod] = {}
        for key in list(self._pods.get(view.uid, ())):
            pod = self.access.get(PODS, *key)
            if pod is None or controller_uid(pod, KIND) != view.uid:
                continue
            parent, ordinal = parent_and_ordinal(pod["metadata"]["name"])
            if parent == view.name and ordinal >= 0:
                out[ordinal] = pod
        return out

    def _unavailable(self, pod: Pod | None, view: _View) -> bool:
        """`isUnavailable`: missing, terminating, or not Running, Ready and available."""
        if pod is None or terminating(pod) or phase(pod) != "Running":
            return True
        return available_after(pod, view.min_ready, self.access.now()) != 0.0

    # ------------------------------------------------------------------------------------ revisions

    async def _revisions(self, sts: dict[str, Any], view: _View,
                         revisions: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], int]:
        """`getStatefulSetRevisions`: the current and update revisions (creating or renumbering the latter)
        and the collision count used for names."""
        collisions = int((sts.get("status") or {}).get("collisionCount") or 0)
        data = go_json(template_patch(sts))
        number = revision_number(revisions[-1]) + 1 if revisions else 1
        equal = [r for r in revisions if revision_data(r) == data]
        if equal and revision_data(revisions[-1]) == data:
            upd = revisions[-1]
        elif equal:
            upd = await set_revision_number(self.access, equal[-1], number)  # a rollback: newest again
        else:
            upd, collisions = await self._create_revision(sts, view, data, number, collisions)
        wanted = (sts.get("status") or {}).get("currentRevision")
        cur = next((r for r in revisions if r["metadata"]["name"] == wanted), upd)
        return cur, upd, collisions

    async def _create_revision(self, sts: dict[str, Any], view: _View, data: bytes, number: int,
                               collisions: int) -> tuple[dict[str, Any], int]:
        """`CreateControllerRevision`: a name taken by different data bumps the collision count."""
        template = (sts.get("spec") or {}).get("template") or {}
        labels = {**((template.get("metadata") or {}).get("labels") or {}),
                  REVISION_HASH_LABEL: revision_hash(data, collisions)}
        for _ in range(MAX_COLLISIONS):
            name = revision_name(view.name, revision_hash(data, collisions))
            rev = new_revision(sts, KIND, name, labels, number, sts["metadata"].get("annotations"))
            try:
                return await self.access.create(CONTROLLER_REVISIONS, view.key[0], rev), collisions
            except StatusError as e:
                if e.code != 409:
                    raise
            existing = self.access.get(CONTROLLER_REVISIONS, view.key[0], name)
            if existing is not None and revision_data(existing) == data:
                return existing, collisions
            collisions += 1
        raise RuntimeError(f"no free ControllerRevision name for StatefulSet {view.name} after {MAX_COLLISIONS}")

    async def _truncate_history(self, view: _View, revisions: list[dict[str, Any]], cur: dict[str, Any],
                                upd: dict[str, Any]) -> None:
        """Delete the oldest revisions beyond revisionHistoryLimit that are neither current, update nor run."""
        live = {cur["metadata"]["name"], upd["metadata"]["name"]}
        live.update((p["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH, "")
                    for p in self._members(view).values())
        history = [r for r in revisions if r["metadata"]["name"] not in live]
        if view.history_limit < 0 or len(history) <= view.history_limit:
            return
        for rev in history[: len(history) - view.history_limit]:
            await delete_revision(self.access, rev)

    # ------------------------------------------------------------------------------------ pods

    async def _update_pods(self, sts: dict[str, Any], view: _View, cur: dict[str, Any],
                           upd: dict[str, Any]) -> None:
        """`updateStatefulSet`: replicas in ordinal order, then condemned pods downwards, then the rollout."""
        members = self._members(view)
        ordinals = range(view.start, view.start + view.replicas)
        condemned = sorted((p for o, p in members.items() if not view.in_range(o)),
                           key=lambda p: -parent_and_ordinal(p["metadata"]["name"])[1])
        first_unavailable = next((f"{view.name}-{o}" for o in ordinals if self._unavailable(members.get(o), view)),
                                 None)
        if first_unavailable is None:
            first_unavailable = next((p["metadata"]["name"] for p in reversed(condemned)
                                      if self._unavailable(p, view)), None)
        monotonic = not view.parallel
        for ordinal in ordinals:
            blocked = await self._process_replica(sts, view, ordinal, members.get(ordinal), cur, upd, monotonic)
            if blocked and monotonic:
                return
        for pod in condemned:
            await self._fix_claims(sts, view, pod)
        for pod in condemned:
            blocked = await self._process_condemned(sts, view, pod, first_unavailable, monotonic)
            if blocked and monotonic:
                return
        if view.rolling:
            await self._rolling_update(sts, view, upd)

    async def _process_replica(self, sts: dict[str, Any], view: _View, ordinal: int, pod: Pod | None,
                               cur: dict[str, Any], upd: dict[str, Any], monotonic: bool) -> bool:
        """`processReplica`: True when the walk must stop here (in OrderedReady)."""
        if pod is not None and terminal(pod):
            if not terminating(pod):
                await self._delete_pod(sts, pod)  # a finished pod is replaced on the next sync
            return True
        if pod is None:
            if self._claims_stale(view, ordinal):
                self._requeue(view.key, STALE_CLAIM_SECONDS)
                return True
            at_current = view.rolling and ordinal < view.start + view.partition
            revision = cur if at_current else upd
            await self._create_pod(sts, view, ordinal, revision)
            return monotonic
        if phase(pod) == "Pending":
            await self._create_claims(sts, view, pod, ordinal)
        if monotonic and (terminating(pod) or phase(pod) != "Running"):
            return True
        after = available_after(pod, view.min_ready, self.access.now())
        if monotonic and after != 0.0:
            if after:
                self._requeue(view.key, after + 0.01)
            return True
        await self._fix_claims(sts, view, pod)
        await self._fix_identity(sts, view, pod, ordinal)
        return False

    async def _process_condemned(self, sts: dict[str, Any], view: _View, pod: Pod, first_unavailable: str | None,
                                 monotonic: bool) -> bool:
        """`processCondemned`: in OrderedReady one pod at a time, and only once everything is healthy (or this
        pod is the one unhealthy pod)."""
        if terminating(pod):
            return monotonic
        if monotonic and self._unavailable(pod, view) and pod["metadata"]["name"] != first_unavailable:
            after = available_after(pod, view.min_ready, self.access.now())
            if after:
                self._requeue(view.key, after + 0.01)
            return True
        await self._delete_pod(sts, pod)
        return True

    async def _rolling_update(self, sts: dict[str, Any], view: _View, upd: dict[str, Any]) -> None:
        """Delete outdated pods from the highest ordinal down to the partition, keeping at most maxUnavailable
        replicas unavailable (deleted pods come back at the update revision through the walk above)."""
        members = self._members(view)
        replicas = [members.get(view.start + i) for i in range(view.replicas)]
        limit = max(1, scaled_value(view.max_unavailable, view.replicas, round_up=False, default=1))
        unavailable = sum(1 for p in replicas if self._unavailable(p, view))
        budget = limit - unavailable
        target = len(replicas) - 1
        while budget > 0 and target >= view.partition:
            pod = replicas[target]
            target -= 1
            if pod is None or terminating(pod):
                continue
            if (pod["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) != upd["metadata"]["name"]:
                await self._delete_pod(sts, pod)
                budget -= 1

    async def _create_pod(self, sts: dict[str, Any], view: _View, ordinal: int, revision: dict[str, Any]) -> None:
        """Claims first, then the pod (`CreateStatefulPod`)."""
        pod = stateful_pod(sts, view, template_of(revision), ordinal, revision["metadata"]["name"])
        name = pod["metadata"]["name"]
        await self._create_claims(sts, view, pod, ordinal)
        try:
            created = await self.access.create(PODS, view.key[0], pod)
        except StatusError as e:
            if e.reason != "AlreadyExists":
                await self._event(sts, "Warning", "FailedCreate",
                                  f"create Pod {name} in StatefulSet {view.name} failed error: {e}")
            raise
        await self._event(sts, "Normal", "SuccessfulCreate", f"create Pod {name} in StatefulSet {view.name} successful")
        await self._fix_claims(sts, view, created)

    async def _delete_pod(self, sts: dict[str, Any], pod: Pod) -> None:
        name = pod["metadata"]["name"]
        try:
            await self.access.delete(PODS, pod["metadata"].get("namespace", ""), name)
        except StatusError as e:
            await self._event(sts, "Warning", "FailedDelete",
                              f"delete Pod {name} in StatefulSet {sts['metadata']['name']} failed error: {e}")
            raise
        await self._event(sts, "Normal", "SuccessfulDelete",
                          f"delete Pod {name} in StatefulSet {sts['metadata']['name']} successful")

    async def _fix_identity(self, sts: dict[str, Any], view: _View, pod: Pod, ordinal: int) -> None:
        """`UpdateStatefulPod` for identity: restore the pod-name and pod-index labels if someone changed them."""
        labels = pod["metadata"].get("labels") or {}
        name = pod["metadata"]["name"]
        if labels.get(POD_NAME_LABEL) == name and labels.get(POD_INDEX_LABEL) is not None:
            return
        await self.access.patch(PODS, view.key[0], name,
                                {"metadata": {"labels": {POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)}}})
        await self._event(sts, "Normal", "SuccessfulUpdate", f"update Pod {name} in StatefulSet {view.name} successful")

    # ------------------------------------------------------------------------------------ claims

    async def _create_claims(self, sts: dict[str, Any], view: _View, pod: Pod, ordinal: int) -> None:
        """Create the pod's missing PersistentVolumeClaims (existing ones are reused, as upstream)."""
        pod_name = pod["metadata"]["name"]
        for template in view.claims:
            claim = claim_for(view, template, ordinal)
            name = claim["metadata"]["name"]
            if self.access.get(PVCS, view.key[0], name) is not None:
                continue
            try:
                await self.access.create(PVCS, view.key[0], claim)
            except StatusError as e:
                if e.reason == "AlreadyExists":
                    continue
                await self._event(sts, "Warning", "FailedCreate", f"create Claim {name} for Pod {pod_name} in "
                                  f"StatefulSet {view.name} failed error: {e}")
                raise
            await self._event(sts, "Normal", "SuccessfulCreate",
                              f"create Claim {name} Pod {pod_name} in StatefulSet {view.name} success")

    def _claims_stale(self, view: _View, ordinal: int) -> bool:
        """`PodClaimIsStale`: with whenScaled Delete, a claim still owned by an earlier pod of this name must
        be collected before the pod is made again."""
        if view.when_scaled != "Delete":
            return False
        pod_name = f"{view.name}-{ordinal}"
        for template in view.claims:
            claim = self.access.get(PVCS, view.key[0], claim_name(template, view.name, ordinal))
            if claim is not None and any(_is_ref(r, "Pod", pod_name)
                                         for r in claim["metadata"].get("ownerReferences") or ()):
                return True
        return False

    async def _fix_claims(self, sts: dict[str, Any], view: _View, pod: Pod) -> None:
        """Owner references on the pod's claims as persistentVolumeClaimRetentionPolicy wants them."""
        _, ordinal = parent_and_ordinal(pod["metadata"]["name"])
        for template in view.claims:
            claim = self.access.get(PVCS, view.key[0], claim_name(template, view.name, ordinal))
            if claim is None:
                continue
            refs = claim_refs(view, sts, pod, ordinal, claim)
            if refs is None or _ref_ids(refs) == _ref_ids(list(claim["metadata"].get("ownerReferences") or ())):
                continue
            await self.access.patch(PVCS, view.key[0], claim["metadata"]["name"],
                                    {"metadata": {"ownerReferences": refs or None}})

    # ------------------------------------------------------------------------------------ status

    def _status(self, view: _View, cur: dict[str, Any], upd: dict[str, Any], collisions: int,
                generation: int) -> dict[str, Any]:
        now = self.access.now()
        replicas = ready = available = current = updated = 0
        cur_name, upd_name = cur["metadata"]["name"], upd["metadata"]["name"]
        for pod in self._members(view).values():
            created = phase(pod) != ""
            replicas += created
            after = available_after(pod, view.min_ready, now) if phase(pod) == "Running" else None
            ready += after is not None
            available += after == 0.0
            if created and not terminating(pod):
                revision = (pod["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH)
                current += revision == cur_name
                updated += revision == upd_name
        if view.rolling and updated == view.replicas and ready == view.replicas and replicas == view.replicas:
            current, cur_name = updated, upd_name  # the rollout is complete
        status: dict[str, Any] = {"observedGeneration": generation, "replicas": replicas, "readyReplicas": ready,
                                  "currentReplicas": current, "updatedReplicas": updated,
                                  "currentRevision": cur_name, "updateRevision": upd_name,
                                  "collisionCount": collisions, "availableReplicas": available}
        for optional in ("readyReplicas", "currentReplicas", "updatedReplicas"):
            if not status[optional]:
                del status[optional]  # omitempty, as Go writes them
        return status

    async def _update_status(self, view: _View, cur: dict[str, Any], upd: dict[str, Any], collisions: int) -> None:
        sts = self.access.get(STATEFULSETS, *view.key)
        if sts is None:
            return
        old = sts.get("status") or {}
        new = self._status(view, cur, upd, collisions, int(sts["metadata"].get("generation") or 1))
        patch = {k: v for k, v in new.items() if old.get(k) != v}
        for gone in ("readyReplicas", "currentReplicas", "updatedReplicas"):
            if gone in old and gone not in new:
                patch[gone] = None
        if patch:
            await self.access.patch(STATEFULSETS, view.key[0], view.key[1], {"status": patch}, subresource="status")
        if view.min_ready > 0 and new.get("readyReplicas", 0) != new["availableReplicas"]:
            self._requeue(view.key, float(view.min_ready))

    async def _event(self, sts: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.options.events:
            await self.access.event(sts, KIND, type_, reason, message)


__all__ = ["StatefulSetController", "StatefulSetOptions", "claim_for", "parent_and_ordinal", "stateful_pod"]
