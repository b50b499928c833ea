"""The DaemonSet controller of kube-controller-manager (apps/v1): one pod per eligible node.

A node is eligible when the pod template's nodeName (if any), nodeSelector and required node affinity match
it and every NoSchedule/NoExecute taint on it is tolerated, counting the tolerations every DaemonSet pod gets
(not-ready and unreachable NoExecute; disk/memory/pid pressure and unschedulable NoSchedule; network
unavailable for hostNetwork pods). A cordoned node therefore keeps and gets its daemon pod. Each pod is pinned
to its node through a required node affinity `metadata.name In [node]` and the scheduler binds it, as since
Kubernetes 1.12. Pods carry `controller-revision-hash` and `pod-template-generation`; every template is kept
as a ControllerRevision; RollingUpdate replaces pods within maxUnavailable (or surges up to maxSurge), OnDelete
waits for the user to delete them. Orphans the selector matches are adopted and owned pods relabelled out of
it are released, as `ClaimPods` does.

Work is event driven: pods are indexed by their controlling DaemonSet's uid, a node change that can alter
eligibility (added, removed, labels or taints) marks every DaemonSet, and only marked DaemonSets are synced.
The store is read directly and is never behind our own writes, so upstream's expectations are not needed; a
sync that created or deleted pods leaves the rolling update to the next sync, as expectations would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent, clone
from .access import CONTROLLER_REVISIONS, DAEMONSETS, NODES, PODS, ClusterAccess
from .fit import constraints
from .jobs import merge_diff
from .nodelifecycle import tolerates
from .pod_owners import PodOwnerController
from .revisions import (
    CONTROLLER_REVISION_HASH,
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
    pod_available,
    pod_ready,
    release,
    revision_data,
    revision_number,
    scaled_value,
    selector_of,
    set_revision_number,
    template_hash,
    template_patch,
    terminal,
    terminating,
)

log = structlog.get_logger("gpuops_sim.daemonsets")

USER = "system:serviceaccount:kube-system:daemon-set-controller"
COMPONENT = "daemonset-controller"
KIND = "DaemonSet"
BURST_REPLICAS = 250  # creates (and deletes) per sync, as upstream's BurstReplicas
GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
GENERATION_LABEL = "pod-template-generation"
BACKOFF_INITIAL = 1.0  # failed daemon pods are replaced with a backoff: 1 s doubling to 15 min
BACKOFF_MAX = 900.0
RETRY_SECONDS = 1.0
DEFAULT_TOLERATIONS = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
)
HOST_NETWORK_TOLERATION = ("node.kubernetes.io/network-unavailable", "NoSchedule")

Key = tuple[str, str]


@dataclass
class DaemonSetOptions:
    events: bool = True  # SuccessfulCreate / SuccessfulDelete / FailedDaemonPod Events


# ------------------------------------------------------------------------------------------ pure helpers


def daemon_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The template's tolerations with the DaemonSet defaults added or replacing their equals
    (`AddOrUpdateDaemonPodTolerations`): a matching toleration with tolerationSeconds becomes unbounded."""
    out = [dict(t) for t in spec.get("tolerations") or () if isinstance(t, dict)]
    wanted = list(DEFAULT_TOLERATIONS) + ([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])
    for key, effect in wanted:
        tol = {"key": key, "operator": "Exists", "effect": effect}
        same = [i for i, t in enumerate(out) if t.get("key") == key and t.get("operator") == "Exists"
                and not t.get("value") and t.get("effect") == effect]
        if same:
            out[same[0]] = tol
        else:
            out.append(tol)
    return out


def should_run(node: dict[str, Any], spec: dict[str, Any]) -> tuple[bool, bool]:
    """(shouldRun, shouldContinueRunning) of `NodeShouldRunDaemonPod`; `spec` carries the daemon tolerations."""
    name = node["metadata"]["name"]
    pinned = spec.get("nodeName")
    if pinned and pinned != name:
        return False, False
    if not constraints(spec).node_ok(name, node["metadata"].get("labels") or {}):
        return False, False
    tolerations = spec.get("tolerations") or ()
    untolerated = [t for t in (node.get("spec") or {}).get("taints") or ()
                   if t.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(x, t) for x in tolerations)]
    if not untolerated:
        return True, True
    return False, not any(t.get("effect") == "NoExecute" for t in untolerated)


def target_node(pod: dict[str, Any]) -> str | None:
    """The node a daemon pod is for: its nodeName, or before binding its `metadata.name In [node]` affinity."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or ():
        for req in term.get("matchFields") or ():
            values = req.get("values") or []
            if req.get("key") == "metadata.name" and req.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def pin_to_node(spec: dict[str, Any], node: str) -> None:
    """Replace the required node affinity with one term naming the node (`ReplaceDaemonSetPodNodeNameNodeAffinity`)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [term]}


def creation_order(pod: dict[str, Any]) -> tuple[int, str, str]:
    """`podByCreationTimestampAndPhase`: scheduled pods first, then the oldest, then by name."""
    meta = pod["metadata"]
    scheduled = 0 if (pod.get("spec") or {}).get("nodeName") else 1
    return scheduled, str(meta.get("creationTimestamp") or ""), str(meta["name"])


@dataclass
class _View:
    """The parts of a DaemonSet a sync reads, with the API's defaults applied to absent fields."""

    key: Key
    uid: str
    spec: dict[str, Any]  # the template's pod spec with the daemon tolerations
    generation: int | None  # the template generation, for the pod-template-generation label
    min_ready: int
    rolling: bool
    max_surge: Any
    max_unavailable: Any
    history_limit: int
    hash: str = ""
    fit_cache: dict[str, tuple[bool, bool]] = field(default_factory=dict)

    @classmethod
    def of(cls, ds: dict[str, Any]) -> _View:
        meta, spec = ds["metadata"], ds.get("spec") or {}
        template_spec = clone(((spec.get("template") or {}).get("spec")) or {})
        template_spec["tolerations"] = daemon_tolerations(template_spec)
        strategy = spec.get("updateStrategy") or {}
        rolling = (strategy.get("type") or "RollingUpdate") == "RollingUpdate"
        ru = strategy.get("rollingUpdate") or {}
        return cls(
            key=(meta.get("namespace", ""), meta["name"]),
            uid=meta["uid"],
            spec=template_spec,
            generation=_template_generation(ds),
            min_ready=int(spec.get("minReadySeconds") or 0),
            rolling=rolling,
            max_surge=ru.get("maxSurge") if rolling else None,
            max_unavailable=ru.get("maxUnavailable", 1) if rolling else None,
            history_limit=int(_default(spec.get("revisionHistoryLimit"), 10)),
        )

    def fits(self, node: dict[str, Any]) -> tuple[bool, bool]:
        """`should_run` for this template, remembered until the template or a node's labels or taints change."""
        name = node["metadata"]["name"]
        got = self.fit_cache.get(name)
        if got is None:
            got = self.fit_cache[name] = should_run(node, self.spec)
        return got

    @property
    def surge(self) -> bool:
        """`AllowsSurge`: a rolling update whose maxSurge is above zero."""
        return self.rolling and scaled_value(self.max_surge, 1, round_up=True, default=0) > 0

    def updated(self, pod: dict[str, Any]) -> bool:
        """`IsPodUpdated`: the pod carries the current hash or the current template generation."""
        labels = pod["metadata"].get("labels") or {}
        gen = self.generation is not None and labels.get(GENERATION_LABEL) == str(self.generation)
        return (bool(self.hash) and labels.get(CONTROLLER_REVISION_HASH) == self.hash) or gen


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _template_generation(ds: dict[str, Any]) -> int | None:
    """The API server's `deprecated.daemonset.template.generation`, or the object's generation without it
    (which moves with every template change too, so `IsPodUpdated` stays right)."""
    meta = ds["metadata"]
    value = (meta.get("annotations") or {}).get(GENERATION_ANNOTATION)
    try:
        return int(value) if value is not None else int(meta["generation"]) if meta.get("generation") else None
    except (TypeError, ValueError):
        return None


def daemon_pod(ds: dict[str, Any], view: _View, node: str) -> dict[str, Any]:
    """The pod for one node (`CreatePodTemplate` plus the node affinity), created with generateName."""
    meta = ds["metadata"]
    tmeta = ((ds.get("spec") or {}).get("template") or {}).get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    if view.generation is not None:
        labels[GENERATION_LABEL] = str(view.generation)
    labels[CONTROLLER_REVISION_HASH] = view.hash
    spec = clone(view.spec)
    pin_to_node(spec, node)
    pmeta: dict[str, Any] = {"generateName": f"{meta['name']}-", "namespace": meta.get("namespace", "default"),
                             "labels": labels, "ownerReferences": [controller_ref(ds, KIND)]}
    if tmeta.get("annotations"):
        pmeta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        pmeta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pmeta, "spec": spec}


def find_updated(view: _View, pods: list[dict[str, Any]]) -> tuple[bool, dict[str, Any] | None, dict[str, Any] | None]:
    """`findUpdatedPodsOnNode`: at most one new and one old live pod on a node, else (False, None, None)."""
    new: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    for pod in pods:
        if terminating(pod):
            continue
        if view.updated(pod):
            if new is not None:
                return False, None, None
            new = pod
        else:
            if old is not None:
                return False, None, None
            old = pod
    return True, new, old


def _set(status: dict[str, Any], key: str, value: int) -> None:
    """Go's omitempty for the optional counters."""
    if value:
        status[key] = value
    else:
        status.pop(key, None)


# ------------------------------------------------------------------------------------------ controller


class DaemonSetController(PodOwnerController):
    """apps/v1 DaemonSet controller, writing as the daemon-set-controller service account."""

    name = "daemonset-controller"
    kind = KIND
    resource = DAEMONSETS
    timer_tag = "ds"
    retry_seconds = RETRY_SECONDS

    def __init__(self, server: APIServer, options: DaemonSetOptions | None = None) -> None:
        super().__init__()
        self.options = options or DaemonSetOptions()
        self.access = ClusterAccess(server, USER, component=COMPONENT,
                                    groups=("system:serviceaccounts", "system:serviceaccounts:kube-system"))
        self.store = self.access.store
        self._pods: dict[str, set[Key]] = {}  # DaemonSet uid -> its pods
        self._dirty: set[Key] = set()
        self._wake_at: dict[Key, float] = {}
        self._backoff: dict[tuple[str, str], tuple[float, float]] = {}  # (uid, node) -> (delay, last failure)
        self._fits: dict[str, tuple[int, dict[str, tuple[bool, bool]]]] = {}  # uid -> (generation, node -> fit)
        self._orphans = Orphans(self.access, DAEMONSETS, lambda owner, pod: True)
        self._writing: str | None = None
        self._scanned = False
        self.syncs = 0
        self.pods_created = 0
        self.pods_deleted = 0
        self.access.listen(self._on_event)

    # ------------------------------------------------------------------------------------ intake

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr == PODS:
            self._on_pod(ev)
        elif ev.gr == DAEMONSETS:
            self._on_daemonset(ev)
        elif ev.gr == NODES:
            self._on_node(ev)
        elif ev.gr == CONTROLLER_REVISIONS:
            uid = controller_uid(ev.new.obj, KIND)
            if uid and uid != self._writing:
                self._mark_uid(uid)

    def _mark_uid(self, uid: str) -> None:
        where = self.store.by_uid.get(uid)
        if where is not None and where[0] == DAEMONSETS:
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

    def _on_daemonset(self, ev: WatchEvent) -> None:
        obj = ev.new.obj
        uid = obj["metadata"].get("uid", "")
        if ev.type == "DELETED":
            self._dirty.discard(ev.key)
            self._backoff = {k: v for k, v in self._backoff.items() if k[0] != uid}
            self._fits.pop(uid, None)
            self._orphans.forget(ev.key)
            return
        if ev.type == "ADDED":
            self._orphans.scan(ev.key[0])
        prev = ev.prev.obj if ev.prev is not None else None
        if (self._writing == uid and prev is not None and prev.get("spec") == obj.get("spec")
                and prev["metadata"].get("annotations") == obj["metadata"].get("annotations")
                and prev["metadata"].get("deletionTimestamp") == obj["metadata"].get("deletionTimestamp")):
            return  # our own status write
        self._dirty.add(ev.key)
        self.wake()

    def _on_node(self, ev: WatchEvent) -> None:
        if ev.type == "MODIFIED" and ev.prev is not None:
            old, new = ev.prev.obj, ev.new.obj
            if (old["metadata"].get("labels") == new["metadata"].get("labels")
                    and (old.get("spec") or {}).get("taints") == (new.get("spec") or {}).get("taints")):
                return  # status and heartbeats do not change where daemons run
        self._fits.clear()
        self._dirty.update(self.store.sorted_keys(DAEMONSETS))
        self.wake()

    # ------------------------------------------------------------------------------------ sync

    async def _sync(self, key: Key) -> None:
        ds = self.access.get(DAEMONSETS, *key)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return  # a DaemonSet being deleted keeps its last status, as upstream
        self.syncs += 1
        selector = (ds.get("spec") or {}).get("selector") or {}
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            await self._event(ds, "Warning", "SelectingAll",
                              "This daemon set is selecting all pods. A non-empty selector is required.")
            return
        view = _View.of(ds)
        generation = int(ds["metadata"].get("generation") or 0)
        cached = self._fits.get(view.uid)
        if cached is None or cached[0] != generation:
            cached = self._fits[view.uid] = (generation, {})
        view.fit_cache = cached[1]
        self._writing = view.uid
        await self._claim(ds, view)
        history = await self._history(ds, view)
        if history is None:
            self._dirty.add(key)  # a hash collision bumped collisionCount: hash again
            return
        cur, old = history
        view.hash = str((cur["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) or "")
        nodes = list(self.access.iter(NODES))
        wrote = await self._manage(ds, view, nodes)
        if not wrote and view.rolling:
            await self._rolling_update(ds, view, nodes)
        await self._cleanup_history(ds, view, old)
        await self._update_status(ds, view, nodes)

    async def _claim(self, ds: dict[str, Any], view: _View) -> None:
        """`ClaimPods`: adopt matching orphans, release owned pods whose labels no longer match."""
        selector = selector_of(ds)
        for pod in self._orphans.take(view.key):
            if adoptable(ds, pod, selector) and await adopt(self.access, ds, KIND, pod, PODS):
                log.info("daemonset adopted pod", namespace=view.key[0], daemonset=view.key[1],
                         pod=pod["metadata"]["name"])
        for key in list(self._pods.get(view.uid, ())):
            owned = self.access.get(PODS, *key)
            if owned is not None and controller_uid(owned, KIND) == view.uid and not selector.matches(
                    owned["metadata"].get("labels")):
                await release(self.access, view.uid, owned, PODS)

    def _by_node(self, view: _View, *, with_finished: bool = False) -> dict[str, list[dict[str, Any]]]:
        """The DaemonSet's pods grouped by the node they are for; deleted terminal pods only if asked."""
        out: dict[str, list[dict[str, Any]]] = {}
        for key in list(self._pods.get(view.uid, ())):
            pod = self.access.get(PODS, *key)
            if pod is None or controller_uid(pod, KIND) != view.uid:
                continue
            if not with_finished and terminal(pod) and terminating(pod):
                continue
            node = target_node(pod)
            if node is not None:
                out.setdefault(node, []).append(pod)
        return out

    # ------------------------------------------------------------------------------------ history

    async def _history(self, ds: dict[str, Any], view: _View) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """`constructHistory`: the revision matching the template (created or renumbered) and the others."""
        ns = view.key[0]
        data = go_json(template_patch(ds))
        current: list[dict[str, Any]] = []
        old: list[dict[str, Any]] = []
        for rev in owned_revisions(self.access, ns, view.uid, KIND):
            (current if revision_data(rev) == data else old).append(rev)
        number = max((revision_number(r) for r in old), default=0) + 1
        if not current:
            snapshot = await self._snapshot(ds, view, number)
            return None if snapshot is None else (snapshot, old)
        cur = await self._dedup(ds, view, current)
        if revision_number(cur) < number:
            cur = await set_revision_number(self.access, cur, number)
        return cur, old

    async def _snapshot(self, ds: dict[str, Any], view: _View, number: int) -> dict[str, Any] | None:
        """Record the current template as a new revision; None after a hash collision (collisionCount bumped)."""
        meta = ds["metadata"]
        template = (ds.get("spec") or {}).get("template") or {}
        collisions = (ds.get("status") or {}).get("collisionCount")
        hash_ = template_hash(template, None if collisions is None else int(collisions))
        labels = {**((template.get("metadata") or {}).get("labels") or {}), CONTROLLER_REVISION_HASH: hash_}
        rev = new_revision(ds, KIND, f"{meta['name']}-{hash_}", labels, number, meta.get("annotations"))
        try:
            return await self.access.create(CONTROLLER_REVISIONS, view.key[0], rev)
        except StatusError as e:
            if e.code != 409:
                raise
        existing = self.access.get(CONTROLLER_REVISIONS, view.key[0], rev["metadata"]["name"])
        if existing is not None and revision_data(existing) == go_json(rev["data"]):
            return existing
        count = int(collisions or 0) + 1
        log.info("daemonset revision hash collision", namespace=view.key[0], daemonset=meta["name"],
                 collision_count=count)
        await self.access.patch(DAEMONSETS, view.key[0], meta["name"], {"status": {"collisionCount": count}},
                                subresource="status")
        return None

    async def _dedup(self, ds: dict[str, Any], view: _View, current: list[dict[str, Any]]) -> dict[str, Any]:
        """Keep the highest-numbered of equal revisions; pods are relabelled to it and the rest deleted."""
        keep = max(current, key=revision_number)
        if len(current) == 1:
            return keep
        hash_ = (keep["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH, "")
        for pods in self._by_node(view, with_finished=True).values():
            for pod in pods:
                if (pod["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) != hash_:
                    await self.access.patch(PODS, view.key[0], pod["metadata"]["name"],
                                            {"metadata": {"labels": {CONTROLLER_REVISION_HASH: hash_}}})
        for rev in current:
            if rev is not keep:
                await delete_revision(self.access, rev)
        return keep

    async def _cleanup_history(self, ds: dict[str, Any], view: _View, old: list[dict[str, Any]]) -> None:
        """Delete the oldest revisions beyond revisionHistoryLimit that no pod still runs."""
        excess = len(old) - view.history_limit
        if excess <= 0:
            return
        live = {(p["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH)
                for pods in self._by_node(view, with_finished=True).values() for p in pods}
        for rev in sorted(old, key=revision_number):
            if excess <= 0:
                break
            if (rev["metadata"].get("labels") or {}).get(CONTROLLER_REVISION_HASH) in live:
                continue
            await delete_revision(self.access, rev)
            excess -= 1

    # ------------------------------------------------------------------------------------ placement

    async def _manage(self, ds: dict[str, Any], view: _View, nodes: list[dict[str, Any]]) -> bool:
        """Create the missing daemon pods and delete the excess, failed or misplaced ones; True if it wrote."""
        by_node = self._by_node(view)
        create: list[str] = []
        delete: list[dict[str, Any]] = []
        names = set()
        for node in nodes:
            name = node["metadata"]["name"]
            names.add(name)
            need, remove = await self._plan_node(ds, view, node, by_node.get(name))
            if need:
                create.append(name)
            delete.extend(remove)
        for name, pods in by_node.items():  # never scheduled, and their node is gone: nobody else removes them
            if name not in names:
                delete.extend(p for p in pods if not (p.get("spec") or {}).get("nodeName"))
        return await self._sync_nodes(ds, view, delete, create)

    async def _plan_node(self, ds: dict[str, Any], view: _View, node: dict[str, Any],
                         pods: list[dict[str, Any]] | None) -> tuple[bool, list[dict[str, Any]]]:
        """`podsShouldBeOnNode`: whether the node needs a pod, and which of its pods go."""
        run, keep = view.fits(node)
        name = node["metadata"]["name"]
        if run and pods is None:
            return True, []
        if not keep:
            return False, [p for p in pods or () if not terminating(p)]
        running: list[dict[str, Any]] = []
        delete: list[dict[str, Any]] = []
        for pod in pods or ():
            if terminating(pod):
                continue
            if phase(pod) == "Failed":
                wait = self._backoff_remaining(view.uid, name)
                if wait > 0:
                    self._requeue(view.key, wait)
                    continue
                self._backoff_next(view.uid, name)
                await self._event(ds, "Warning", "FailedDaemonPod", f"Found failed daemon pod {view.key[0]}/"
                                  f"{pod['metadata']['name']} on node {name}, will try to kill it")
                delete.append(pod)
            elif phase(pod) == "Succeeded":
                await self._event(ds, "Normal", "SucceededDaemonPod", f"Found succeeded daemon pod {view.key[0]}/"
                                  f"{pod['metadata']['name']} on node {name}, will try to delete it")
                delete.append(pod)
            else:
                running.append(pod)
        return self._prune(view, running, run, delete)

    def _prune(self, view: _View, running: list[dict[str, Any]], run: bool,
               delete: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]]]:
        """Extra live pods on a node: keep the oldest, or while surging one old and one new until the new one
        is available (or the old one is not ready)."""
        running.sort(key=creation_order)
        if not view.surge:
            return False, delete + running[1:]
        if len(running) <= 1:
            return not running and run, delete
        newest: dict[str, Any] | None = None
        oldest: dict[str, Any] | None = None
        for pod in running:
            if view.updated(pod) and newest is None:
                newest = pod
            elif not view.updated(pod) and oldest is None:
                oldest = pod
            else:
                delete.append(pod)
        if newest is not None and oldest is not None:
            now = self.access.now()
            if not pod_ready(oldest) or pod_available(newest, view.min_ready, now):
                delete.append(oldest)
        return False, delete

    def _backoff_remaining(self, uid: str, node: str) -> float:
        entry = self._backoff.get((uid, node))
        if entry is None:
            return 0.0
        delay, last = entry
        return max(0.0, last + delay - self.clock())

    def _backoff_next(self, uid: str, node: str) -> None:
        now = self.clock()
        entry = self._backoff.get((uid, node))
        fresh = entry is None or now - entry[1] > 2 * BACKOFF_MAX  # long quiet: start over
        delay = BACKOFF_INITIAL if fresh or entry is None else min(entry[0] * 2, BACKOFF_MAX)
        self._backoff[(uid, node)] = (delay, now)

    async def _sync_nodes(self, ds: dict[str, Any], view: _View, delete: list[dict[str, Any]],
                          create: list[str]) -> bool:
        """At most BURST_REPLICAS creates and deletes; the rest on the next step. A failed create stops the
        batch (upstream's slow start) and is retried after a pause."""
        for node in create[:BURST_REPLICAS]:
            if not await self._create_pod(ds, view, node):
                self._requeue(view.key, RETRY_SECONDS)
                break
        seen: set[str] = set()
        for pod in delete[:BURST_REPLICAS]:
            name = pod["metadata"]["name"]
            if name not in seen:
                seen.add(name)
                await self._delete_pod(ds, pod)
        if len(create) > BURST_REPLICAS or len(delete) > BURST_REPLICAS:
            self._dirty.add(view.key)
        return bool(create or delete)

    async def _create_pod(self, ds: dict[str, Any], view: _View, node: str) -> bool:
        try:
            pod = await self.access.create(PODS, view.key[0], daemon_pod(ds, view, node))
        except StatusError as e:
            log.warning("daemon pod create failed", namespace=view.key[0], daemonset=view.key[1], node=node,
                        code=e.code, error=str(e))
            await self._event(ds, "Warning", "FailedCreate", f"Error creating: {e}")
            return False
        self.pods_created += 1
        await self._event(ds, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")
        return True

    async def _delete_pod(self, ds: dict[str, Any], pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            gone = await self.access.delete(PODS, meta.get("namespace", ""), meta["name"])
        except StatusError as e:
            await self._event(ds, "Warning", "FailedDelete", f"Error deleting: {e}")
            raise
        if gone is not None:
            self.pods_deleted += 1
            await self._event(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {meta['name']}")

    # ------------------------------------------------------------------------------------ rolling update

    async def _rolling_update(self, ds: dict[str, Any], view: _View, nodes: list[dict[str, Any]]) -> None:
        by_node = self._by_node(view)
        desired = 0
        eligible: dict[str, bool] = {}
        for node in nodes:
            name = node["metadata"]["name"]
            eligible[name] = view.fits(node)[0]
            if eligible[name]:
                desired += 1
                by_node.setdefault(name, [])
        max_surge = scaled_value(view.max_surge, desired, round_up=True, default=0) if view.surge else 0
        max_unavailable = scaled_value(view.max_unavailable, desired, round_up=True, default=0)
        if desired > 0 and max_unavailable == 0 and max_surge == 0:
            max_unavailable = 1  # an impossible configuration accepts unavailability, as upstream
        if max_surge == 0:
            await self._sync_nodes(ds, view, self._unavailable_plan(view, by_node, max_unavailable), [])
            return
        delete, create = self._surge_plan(view, by_node, eligible, max_surge, desired)
        await self._sync_nodes(ds, view, delete, create)

    def _unavailable_plan(self, view: _View, by_node: dict[str, list[dict[str, Any]]],
                          max_unavailable: int) -> list[dict[str, Any]]:
        """Old pods to delete so that at most maxUnavailable nodes lack an available daemon pod; old pods that
        are not available anyway go first and regardless."""
        now = self.access.now()
        unavailable = 0
        allowed: list[dict[str, Any]] = []
        candidates: list[dict[str, Any]] = []
        for _, pods in sorted(by_node.items()):
            ok, new, old = find_updated(view, pods)
            if not ok or (new is None) == (old is None):
                unavailable += 1  # the manage step creates or prunes here first
            elif new is not None:
                unavailable += 0 if pod_available(new, view.min_ready, now) else 1
            elif old is not None and not pod_available(old, view.min_ready, now):
                allowed.append(old)
                unavailable += 1
            elif old is not None and unavailable < max_unavailable:
                candidates.append(old)
        room = min(max(max_unavailable - unavailable, 0), len(candidates))
        return allowed + candidates[:room]

    def _surge_plan(self, view: _View, by_node: dict[str, list[dict[str, Any]]], eligible: dict[str, bool],
                    max_surge: int, desired: int) -> tuple[list[dict[str, Any]], list[str]]:
        """While surging: a new pod next to each old one, at most maxSurge at a time (immediately where the old
        one is unavailable); an old pod goes once its replacement is available."""
        now = self.access.now()
        delete: list[dict[str, Any]] = []
        misplaced: list[dict[str, Any]] = []
        allowed: list[str] = []
        candidates: list[str] = []
        surging = available = 0
        for node, pods in sorted(by_node.items()):
            ok, new, old = find_updated(view, pods)
            if not ok:
                surging += 1
                continue
            shown = old if old is not None else new
            available += 1 if shown is not None and pod_available(shown, view.min_ready, now) else 0
            if old is None:
                continue
            if new is not None:
                if pod_available(new, view.min_ready, now):
                    delete.append(old)
                else:
                    surging += 1
            elif not pod_available(old, view.min_ready, now):
                if eligible.get(node):
                    allowed.append(node)  # replace an unavailable old pod right away
                else:
                    delete.append(old)
            elif not eligible.get(node):
                misplaced.append(old)
            elif surging < max_surge:
                candidates.append(node)
        if available > desired:  # pods on nodes that no longer qualify go once others carry the load
            delete.extend(misplaced[: available - desired])
        room = min(max(max_surge - surging, 0), len(candidates))
        return delete, allowed + candidates[:room]

    # ------------------------------------------------------------------------------------ status

    def _status(self, ds: dict[str, Any], view: _View, nodes: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
        """The new status and the seconds until a ready pod becomes available (0 when none is pending)."""
        by_node = self._by_node(view)
        now = self.access.now()
        desired = current = misscheduled = ready = updated = available = 0
        wait = 0.0
        for node in nodes:
            pods = sorted(by_node.get(node["metadata"]["name"]) or [], key=creation_order)
            if not view.fits(node)[0]:
                misscheduled += 1 if pods else 0
                continue
            desired += 1
            if not pods:
                continue
            current += 1
            pod = pods[0]
            after = available_after(pod, view.min_ready, now)
            ready += 1 if after is not None else 0
            available += 1 if after == 0.0 else 0
            if after:
                wait = min(wait, after) if wait else after
            updated += 1 if view.updated(pod) else 0
        status = dict(ds.get("status") or {})
        status.update(currentNumberScheduled=current, numberMisscheduled=misscheduled,
                      desiredNumberScheduled=desired, numberReady=ready)
        status["observedGeneration"] = int(ds["metadata"].get("generation") or 1)
        _set(status, "updatedNumberScheduled", updated)
        _set(status, "numberAvailable", available)
        _set(status, "numberUnavailable", desired - available)
        return status, wait

    async def _update_status(self, ds: dict[str, Any], view: _View, nodes: list[dict[str, Any]]) -> None:
        fresh = self.access.get(DAEMONSETS, *view.key) or ds
        status, wait = self._status(fresh, view, nodes)
        if wait > 0:
            self._requeue(view.key, wait + 0.01)
        patch = merge_diff(fresh.get("status") or {}, status)
        if patch:
            await self.access.patch(DAEMONSETS, view.key[0], view.key[1], {"status": patch}, subresource="status")

    async def _event(self, ds: dict[str, Any], type_: str, reason: str, message: str) -> None:
        if self.options.events:
            await self.access.event(ds, KIND, type_, reason, message)


__all__ = ["DaemonSetController", "DaemonSetOptions", "daemon_tolerations", "should_run", "target_node"]
