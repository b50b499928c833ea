"""The emulated kube-scheduler: binds pending pods to nodes with kube-scheduler's filters and messages.

Scale decides the design (5,000 nodes, 100,000 pods, thousands of bindings a second in one process):

* Allocation is counted incrementally from the store listener: per node, the sum of the effective requests
  of its non-terminal pods (pods being deleted still hold theirs), in scheduler units.
* Nodes with equal labels (hostname aside), taints, cordon, readiness and allocatable form a class. The
  class-level filters (NodeUnschedulable, TaintToleration, NodeAffinity) run once per (pod constraints,
  class) and are cached on the class.
* Each class keeps, per allocatable resource, its nodes ordered by free amount (nodes without a free pod
  slot aside). A pod walks one ordering: that of the requested resource the fewest nodes have enough of
  (counted by bisection; on ties the dominant one, the largest requested fraction of allocatable, so GPUs
  lead GPU pods), and the first node that fits everything else is the class's best. MostAllocated walks
  from the tightest fit up (bin-packing), LeastAllocated from the emptiest down (spreading); across classes
  the higher (resp. lower) fraction of that resource after placement wins, ties by node name. The same
  orderings count "Insufficient <resource>" nodes by bisection for the failure message.
* Unschedulable pods wait in groups of equal (constraints, request). A change that frees capacity on a
  node (a pod deleted or finished, a node added, changed or made ready) tests each group against that node
  only; a group that now fits releases its best pod, and each binding releases the next, so a freed GPU
  does not wake 10,000 equal pods. Every `unschedulable_retry_seconds` all of them are retried (their
  messages refreshed); a per-step cache answers equal pods once.

Preemption is not emulated: the PostFilter part of the message says what DefaultPreemption says when it
finds no victims ("No preemption victims found for incoming pod", or "Preemption is not helpful for
scheduling" for nodes that failed an unresolvable filter). Scoring is this module's simplification of
NodeResourcesFit (dominant resource instead of the weighted cpu/memory average, GPUs included).
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from ..apiserver.errors import StatusError
from ..apiserver.server import APIServer
from ..apiserver.store import WatchEvent
from .access import NODES, PODS, ClusterAccess
from .fit import (
    HOSTNAME_LABEL,
    POD_SLOTS,
    REASON_AFFINITY,
    Constraints,
    Taint,
    Vec,
    allocatable,
    constraints,
    insufficient,
    pod_vector,
)
from .loop import Loop
from .spread import REASON_SPREAD_LABEL, EligibleNode, domain_counts, spread_reason

log = structlog.get_logger("gpuops_sim.scheduler")

__all__ = ["Scheduler", "SchedulerOptions"]

Key = tuple[str, str]
SortKey = tuple[int, str, str, str]
Eq = tuple[bytes, Vec]
Shape = tuple[str, ...]  # a failure message without its counts: which reasons, not how many nodes

TERMINAL = ("Succeeded", "Failed")
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NO_NODES = "no nodes available to schedule pods"
USER = "system:kube-scheduler"
COUNTS_REFRESH_SECONDS = 300.0
"""A message that differs only in its counts is rewritten at most this often per pod (upstream's
podMaxInUnschedulablePodsDuration): while a cluster fills, every retry would otherwise rewrite every
unschedulable pod."""


@dataclass
class SchedulerOptions:
    scheduler_name: str = "default-scheduler"
    scoring: str = "LeastAllocated"  # or "MostAllocated" (bin-packing); ties by node name
    batch: int = 1000  # pods decided per step before yielding the loop
    events: bool = True  # Scheduled / FailedScheduling Events
    unschedulable_retry_seconds: float = 10.0  # periodic retry besides event-driven retries


# ------------------------------------------------------------------------------------------ nodes


class _Node:
    __slots__ = ("cls", "labels", "name", "raw", "used")

    def __init__(self, name: str, used: dict[str, int]) -> None:
        self.name = name
        self.used = used
        self.labels: Mapping[str, str] = {}
        self.raw: tuple[Any, ...] = ()
        self.cls: _Class | None = None


class _Class:
    """Nodes that every filter but resources treats alike, with per-resource orderings by free amount.

    A node without a free pod slot can host nothing: it is kept out of `index` (which placement walks) for
    every resource but pod slots and ordered in `closed` instead, where only failure messages count it.
    """

    __slots__ = (
        "alloc", "closed", "dominants", "filters", "index", "key", "labels", "nodes", "sign", "taints", "unschedulable"
    )

    def __init__(
        self,
        key: tuple[Any, ...],
        labels: Mapping[str, str],
        taints: tuple[Taint, ...],
        unschedulable: bool,
        alloc: dict[str, int],
        sign: int,
    ) -> None:
        self.key = key
        self.labels = labels
        self.taints = taints
        self.unschedulable = unschedulable
        self.alloc = alloc
        self.sign = sign  # index key is sign * free: +1 ascending free (MostAllocated), -1 descending
        self.nodes: dict[str, _Node] = {}
        self.index: dict[str, list[tuple[int, str]]] = {r: [] for r in alloc}
        self.closed: dict[str, list[tuple[int, str]]] = {r: [] for r in alloc if r != POD_SLOTS}
        self.filters: dict[bytes, str | None] = {}
        self.dominants: dict[Vec, tuple[str, int] | None] = {}

    def is_open(self, used: Mapping[str, int]) -> bool:
        return self.alloc[POD_SLOTS] - used.get(POD_SLOTS, 0) >= 1

    def place(self, node: _Node, resources: Iterable[str]) -> None:
        """Enter the node's current free amounts of `resources` in the orderings."""
        self._entries(node, resources, insort)

    def unplace(self, node: _Node, resources: Iterable[str]) -> None:
        self._entries(node, resources, _discard)

    def _entries(
        self, node: _Node, resources: Iterable[str], op: Callable[[list[tuple[int, str]], tuple[int, str]], None]
    ) -> None:
        used, alloc, sign, name = node.used, self.alloc, self.sign, node.name
        lists = self.index if self.is_open(used) else self.closed
        for r in resources:
            a = alloc.get(r)
            if a is not None:
                op(self.index[r] if r == POD_SLOTS else lists[r], (sign * (a - used.get(r, 0)), name))

    def add(self, node: _Node) -> None:
        self.nodes[node.name] = node
        node.cls = self
        self.place(node, self.alloc)

    def remove(self, node: _Node) -> None:
        self.unplace(node, self.alloc)
        self.nodes.pop(node.name, None)
        node.cls = None

    def dominant(self, vec: Vec) -> tuple[str, int] | None:
        """The resource the pod asks the largest share of, or None if no node of the class could hold it."""
        if vec in self.dominants:
            return self.dominants[vec]
        best: tuple[str, int] | None = None
        best_share = -1.0
        for r, p in vec:
            a = self.alloc.get(r, 0)
            if a < p:
                best = None
                break
            share = p / a
            if share > best_share or (share == best_share and best is not None and best[0] == POD_SLOTS):
                best, best_share = (r, p), share
        if len(self.dominants) > 4096:
            self.dominants.clear()
        self.dominants[vec] = best
        return best

    def unresolvable(self, vec: Vec) -> bool:
        """A request above allocatable: removing pods cannot help (pod slots excepted, as upstream)."""
        return any(r != POD_SLOTS and p > self.alloc.get(r, 0) for r, p in vec)

    def short(self, r: str, p: int) -> int:
        """How many nodes of the class have less than `p` of `r` free."""
        lst = self.index.get(r)
        if lst is None:
            return len(self.nodes)
        lists = (lst,) if r == POD_SLOTS else (lst, self.closed[r])
        if self.sign > 0:
            return sum(bisect_left(x, (p,)) for x in lists)
        return sum(len(x) - bisect_left(x, (1 - p,)) for x in lists)

    def enough(self, r: str, p: int) -> int:
        """How many open nodes have at least `p` of `r` free (bisection)."""
        lst = self.index[r]
        if self.sign > 0:
            return len(lst) - bisect_left(lst, (p,))
        return bisect_left(lst, (1 - p,))

    def walk_by(self, vec: Vec, dom: tuple[str, int]) -> tuple[str, int] | None:
        """The resource to walk: the one the fewest nodes have enough of (so nodes that lack another
        resource are rarely visited), the dominant one on ties; None when some resource is short everywhere."""
        best = dom
        fewest = self.enough(*dom)
        if fewest == 0:
            return None
        for r, p in vec:
            if r != dom[0]:
                n = self.enough(r, p)
                if n == 0:
                    return None
                if n < fewest:
                    best, fewest = (r, p), n
        return best

    def best(self, vec: Vec, by: tuple[str, int]) -> _Node | None:
        """The first node in `by`'s order that fits: tightest for MostAllocated, emptiest for LeastAllocated."""
        r, p = by
        lst = self.index[r]
        nodes = self.nodes
        alloc = self.alloc
        if self.sign > 0:
            for i in range(bisect_left(lst, (p,)), len(lst)):
                node = nodes[lst[i][1]]
                if _fits(alloc, node.used, vec):
                    return node
            return None
        for k, name in lst:
            if -k < p:
                return None
            node = nodes[name]
            if _fits(alloc, node.used, vec):
                return node
        return None


def _discard(lst: list[tuple[int, str]], item: tuple[int, str]) -> None:
    i = bisect_left(lst, item)
    if i < len(lst) and lst[i] == item:
        del lst[i]


def _fits(alloc: Mapping[str, int], used: Mapping[str, int], vec: Vec) -> bool:
    return all(alloc.get(r, 0) - used.get(r, 0) >= p for r, p in vec)


def _ready(status: Mapping[str, Any]) -> str:
    for c in status.get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == "Ready":
            return str(c.get("status") or "Unknown")
    return "False"


def _taints(raw: Any, ready: str) -> tuple[Taint, ...]:
    """NoSchedule/NoExecute taints, plus the one the node lifecycle controller puts on a node not Ready
    (not-ready for False, unreachable for Unknown) when it is not there yet."""
    out = [
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in raw or ()
        if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute")
    ]
    if ready != "True":
        key = "node.kubernetes.io/unreachable" if ready == "Unknown" else "node.kubernetes.io/not-ready"
        if not any(k == key and e == "NoSchedule" for k, _, e in out):
            out.append((key, "", "NoSchedule"))
    return tuple(out)


# ------------------------------------------------------------------------------------------ queue


class _Pending:
    __slots__ = ("drain", "group", "key", "seq", "sortkey", "uid", "written")

    def __init__(self, key: Key, uid: str, sortkey: SortKey) -> None:
        self.key = key
        self.uid = uid
        self.sortkey = sortkey
        self.seq = -1  # the live heap entry's sequence number; -1 when not in the active queue
        self.group: _Group | None = None
        self.drain = False  # released alone from its group: on binding, release the next one
        self.written: tuple[str, Shape, float] | None = None  # our last message, its shape, when (monotonic)


class _Group:
    """Unschedulable pods with equal constraints and request: one fits wherever any of them fits."""

    __slots__ = ("cons", "eq", "heap", "size", "vec")

    def __init__(self, eq: Eq, cons: Constraints, vec: Vec) -> None:
        self.eq = eq
        self.cons = cons
        self.vec = vec
        self.heap: list[tuple[SortKey, Key]] = []
        self.size = 0


class _Failure:
    __slots__ = ("message", "node_gen", "pos", "shape")

    def __init__(self, pos: int, node_gen: int, diagnosis: tuple[str, Shape]) -> None:
        self.pos = pos
        self.node_gen = node_gen
        self.message, self.shape = diagnosis


def _sortkey(obj: Mapping[str, Any]) -> SortKey:
    meta = obj["metadata"]
    prio = (obj.get("spec") or {}).get("priority") or 0
    return (-int(prio), str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""), meta["name"])


def _meaningful_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """An update that may change the scheduling decision (not our own or the kubelet's status writes)."""
    if old.get("spec") != new.get("spec"):
        return True
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    return bool(om.get("labels") != nm.get("labels") or om.get("annotations") != nm.get("annotations"))


# ------------------------------------------------------------------------------------------ scheduler


def _fit_error(
    total: int, reasons: Counter[str], hopeless: int, victimless: int, never_preempts: bool
) -> tuple[str, Shape]:
    """The FitError message and its shape (the reasons, without counts) from the filters' histogram and
    the PostFilter's verdict on preemption."""
    histogram = ", ".join(sorted(f"{count} {why}" for why, count in reasons.items() if count))
    message = f"0/{total} nodes are available: {histogram}."
    shape = tuple(sorted(why for why, count in reasons.items() if count))
    if never_preempts:
        return f"{message} preemption: not eligible due to preemptionPolicy=Never.", shape
    post = [(why, count) for why, count in ((NOT_HELPFUL, hopeless), (NO_VICTIMS, victimless)) if count]
    listed = ", ".join(sorted(f"{count} {why}" for why, count in post))
    return f"{message} preemption: 0/{total} nodes are available: {listed}.", (*shape, "|", *(w for w, _ in post))


class Scheduler(Loop):
    """kube-scheduler for one scheduler name; `bound` counts bindings, `unschedulable` pods waiting."""

    name = "scheduler"

    def __init__(self, server: APIServer, options: SchedulerOptions | None = None) -> None:
        super().__init__()
        self.options = options or SchedulerOptions()
        if self.options.scoring not in ("LeastAllocated", "MostAllocated"):
            raise ValueError(f"scoring must be LeastAllocated or MostAllocated, not {self.options.scoring!r}")
        self.access = ClusterAccess(server, USER, component=self.options.scheduler_name)
        self._sign = 1 if self.options.scoring == "MostAllocated" else -1
        self.bound = 0
        self.unschedulable = 0
        self._nodes: dict[str, _Node] = {}
        self._classes: dict[tuple[Any, ...], _Class] = {}
        self._used: dict[str, dict[str, int]] = {}  # by node name, also for pods on nodes not (yet) known
        self._placed: dict[Key, tuple[str, Vec]] = {}
        self._by_host: dict[str, set[str]] = {}
        self._pending: dict[Key, _Pending] = {}
        self._heap: list[tuple[SortKey, int, Key]] = []
        self._seq = itertools.count()
        self._groups: dict[Eq, _Group] = {}
        self._dirty: set[str] = set()  # nodes with more room since the last step: retry groups there
        self._freed: list[str] = []  # the same, within a step: invalidates cached failures
        self._failures: dict[Eq, _Failure] = {}
        self._spread_counts: dict[bytes, list[dict[str, int]]] = {}  # per constraints key, until the next binding
        self._node_gen = 0
        self._retry_armed = False
        self._retry_all = False
        self.access.listen(self._on_event)
        for node in self.access.iter(NODES):
            self._upsert_node(node)
        for pod in self.access.iter(PODS):
            meta = pod["metadata"]
            self._on_pod((str(meta.get("namespace") or ""), meta["name"]), pod, None)

    # ------------------------------------------------------------------------------------ listener

    def _on_event(self, ev: WatchEvent) -> None:
        gr = ev.gr
        if gr != PODS and gr != NODES:
            return
        try:
            if gr == PODS:
                new = None if ev.type == "DELETED" else ev.new.obj
                self._on_pod(ev.key, new, ev.prev.obj if ev.prev is not None else None)
            elif ev.type == "DELETED":
                self._remove_node(ev.key[1])
            else:
                self._upsert_node(ev.new.obj)
        except Exception:  # the listener runs inside someone else's write: never fail it
            self.errors += 1
            log.exception("scheduler listener failed", resource=gr[1], key="/".join(ev.key))

    def _wants(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return not (
            spec.get("nodeName")
            or (spec.get("schedulerName") or "default-scheduler") != self.options.scheduler_name
            or spec.get("schedulingGates")
            or pod["metadata"].get("deletionTimestamp")
            or (pod.get("status") or {}).get("phase") in TERMINAL
        )

    def _on_pod(self, key: Key, pod: Mapping[str, Any] | None, prev: Mapping[str, Any] | None) -> None:
        # Accounting: non-terminal pods on a node hold their request there.
        node = None
        if pod is not None:
            node = (pod.get("spec") or {}).get("nodeName") or None
            if node and (pod.get("status") or {}).get("phase") in TERMINAL:
                node = None
        placed = self._placed.get(key)
        if placed is not None and placed[0] != node:
            del self._placed[key]
            self._adjust(placed[0], placed[1], -1)
            self._more_room(placed[0])
            placed = None
        if placed is None and node is not None and pod is not None:
            vec = pod_vector(pod.get("spec") or {})
            self._placed[key] = (node, vec)
            self._adjust(node, vec, 1)
        # Queue: pending pods of this scheduler.
        entry = self._pending.get(key)
        if pod is None or not self._wants(pod):
            if entry is not None:
                self._forget(entry)
            return
        uid = str(pod["metadata"].get("uid") or "")
        if entry is not None and entry.uid != uid:
            self._forget(entry)
            entry = None
        if entry is None:
            entry = self._pending[key] = _Pending(key, uid, _sortkey(pod))
            self._push(entry)
        elif entry.group is not None and prev is not None and _meaningful_change(prev, pod):
            self._ungroup(entry)
            self._push(entry)

    def _adjust(self, name: str, vec: Vec, sign: int) -> None:
        used = self._used.get(name)
        if used is None:
            used = self._used[name] = {}
        node = self._nodes.get(name)
        cls = node.cls if node is not None else None
        touched: Iterable[str] = ()
        if node is not None and cls is not None:
            was_open = cls.is_open(used)
            slots = cls.alloc[POD_SLOTS] - used.get(POD_SLOTS, 0) - sign * dict(vec).get(POD_SLOTS, 0)
            touched = [r for r, _ in vec] if was_open == (slots >= 1) else cls.alloc
            cls.unplace(node, touched)
        for r, p in vec:
            new = used.get(r, 0) + sign * p
            if new:
                used[r] = new
            else:
                used.pop(r, None)
        if node is not None and cls is not None:
            cls.place(node, touched)
        if not used and node is None:
            del self._used[name]

    def _more_room(self, name: str) -> None:
        if name in self._nodes:
            self._freed.append(name)
            if self._groups:
                self._dirty.add(name)
                self.wake()

    def _upsert_node(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        labels = meta.get("labels") or {}
        ready = _ready(status)
        raw = (labels, spec.get("taints"), bool(spec.get("unschedulable")), ready, status.get("allocatable"))
        node = self._nodes.get(name)
        if node is not None and node.raw == raw:
            return  # a heartbeat: nothing the scheduler looks at changed
        if node is None:
            used = self._used.get(name)
            if used is None:
                used = self._used[name] = {}
            node = self._nodes[name] = _Node(name, used)
        else:
            self._unhost(node)
        node.raw = raw
        node.labels = labels
        host = labels.get(HOSTNAME_LABEL)
        if host is not None:
            self._by_host.setdefault(host, set()).add(name)
        alloc = allocatable(status)
        taints = _taints(spec.get("taints"), ready)
        class_labels = {k: v for k, v in labels.items() if k != HOSTNAME_LABEL}
        key = (tuple(sorted(class_labels.items())), taints, raw[2], tuple(sorted(alloc.items())))
        cls = node.cls
        if cls is None or cls.key != key:
            if cls is not None:
                self._leave(node)
            cls = self._classes.get(key)
            if cls is None:
                cls = self._classes[key] = _Class(key, class_labels, taints, raw[2], alloc, self._sign)
            cls.add(node)
        self._node_gen += 1
        self._more_room(name)

    def _unhost(self, node: _Node) -> None:
        host = node.labels.get(HOSTNAME_LABEL)
        if host is not None:
            names = self._by_host.get(host)
            if names is not None:
                names.discard(node.name)
                if not names:
                    del self._by_host[host]

    def _leave(self, node: _Node) -> None:
        cls = node.cls
        if cls is not None:
            cls.remove(node)
            if not cls.nodes:
                del self._classes[cls.key]

    def _remove_node(self, name: str) -> None:
        node = self._nodes.pop(name, None)
        if node is None:
            return
        self._unhost(node)
        self._leave(node)
        if not node.used:
            self._used.pop(name, None)
        self._node_gen += 1

    # ------------------------------------------------------------------------------------ queue

    def _push(self, entry: _Pending) -> None:
        entry.seq = next(self._seq)
        heapq.heappush(self._heap, (entry.sortkey, entry.seq, entry.key))
        self.wake()

    def _forget(self, entry: _Pending) -> None:
        if entry.group is not None:
            self._ungroup(entry)
        entry.seq = -1
        if self._pending.get(entry.key) is entry:
            del self._pending[entry.key]

    def _ungroup(self, entry: _Pending) -> None:
        group = entry.group
        if group is None:
            return
        entry.group = None
        group.size -= 1
        self.unschedulable -= 1
        if group.size <= 0 and self._groups.get(group.eq) is group:
            del self._groups[group.eq]

    def _join(self, entry: _Pending, eq: Eq, cons: Constraints, vec: Vec) -> None:
        group = self._groups.get(eq)
        if group is None:
            group = self._groups[eq] = _Group(eq, cons, vec)
        entry.group = group
        entry.drain = False
        entry.seq = -1
        group.size += 1
        self.unschedulable += 1
        heapq.heappush(group.heap, (entry.sortkey, entry.key))
        if not self._retry_armed:
            self._retry_armed = True
            self.after("retry", self.options.unschedulable_retry_seconds)

    def _release(self, group: _Group, *, everyone: bool) -> None:
        """Back to the active queue: the group's best pod (which then pulls the next), or all of them."""
        while group.heap:
            _, key = heapq.heappop(group.heap)
            entry = self._pending.get(key)
            if entry is None or entry.group is not group:
                continue  # left the group since
            self._ungroup(entry)
            entry.drain = not everyone
            self._push(entry)
            if not everyone:
                return

    def _retry_groups(self) -> None:
        if self._retry_all:
            self._retry_all = False
            self._dirty.clear()
            for group in list(self._groups.values()):
                self._release(group, everyone=True)
            return
        if not self._dirty:
            return
        dirty = [self._nodes[n] for n in self._dirty if n in self._nodes]
        self._dirty.clear()
        for group in list(self._groups.values()):
            if len(dirty) > 32:
                if self._find(group.cons, group.vec) is not None:
                    self._release(group, everyone=False)
            elif any(self._fits_node(group.cons, group.vec, node) for node in dirty):
                self._release(group, everyone=False)

    # ------------------------------------------------------------------------------------ filtering

    def _reason(self, cons: Constraints, cls: _Class) -> str | None:
        try:
            return cls.filters[cons.key]
        except KeyError:
            if len(cls.filters) > 20_000:
                cls.filters.clear()  # e.g. one pinned pod per node: keep the cache bounded
            got = cls.filters[cons.key] = cons.class_reason(cls.labels, cls.taints, cls.unschedulable)
            return got

    def _fits_node(self, cons: Constraints, vec: Vec, node: _Node) -> bool:
        cls = node.cls
        if cls is None or self._reason(cons, cls) is not None:
            return False
        if cons.per_node and not cons.node_ok(node.name, node.labels):
            return False
        if not _fits(cls.alloc, node.used, vec):
            return False
        return not cons.spread or spread_reason(cons.spread, self._counts(cons), node.labels) is None

    def _counts(self, cons: Constraints) -> list[dict[str, int]]:
        """Matching pods per topology domain for each of the pod's spread constraints (kept until a binding)."""
        got = self._spread_counts.get(cons.key)
        if got is None:
            nodes = [EligibleNode(n.name, n.labels, cons.node_ok(n.name, n.labels),
                                  n.cls is not None and cons.tolerates(n.cls.taints)) for n in self._nodes.values()]
            pods = list(self.access.iter(PODS, cons.namespace))
            got = self._spread_counts[cons.key] = [domain_counts(s, nodes, pods) for s in cons.spread]
        return got

    def _rank(self, cls: _Class, node: _Node, dom: tuple[str, int]) -> tuple[float, str]:
        r, p = dom
        a = cls.alloc[r]
        share = (node.used.get(r, 0) + p) / a
        return (-share if self._sign > 0 else share, node.name)

    def _find(self, cons: Constraints, vec: Vec) -> _Node | None:
        best: _Node | None = None
        best_rank: tuple[float, str] | None = None
        if cons.per_node:
            names = cons.candidates(self._by_host)
            pool = (
                [self._nodes[n] for n in names if n in self._nodes] if names is not None else self._nodes.values()
            )
            for node in pool:
                if not self._fits_node(cons, vec, node):
                    continue
                assert node.cls is not None
                dom = node.cls.dominant(vec)
                if dom is None:
                    continue
                rank = self._rank(node.cls, node, dom)
                if best_rank is None or rank < best_rank:
                    best, best_rank = node, rank
            return best
        for cls in self._classes.values():
            if self._reason(cons, cls) is not None:
                continue
            dom = cls.dominant(vec)
            if dom is None:
                continue
            by = cls.walk_by(vec, dom)
            if by is None:
                continue
            found = cls.best(vec, by)
            if found is None:
                continue
            rank = self._rank(cls, found, by)
            if best_rank is None or rank < best_rank:
                best, best_rank = found, rank
        return best

    def _still_failing(self, failure: _Failure, cons: Constraints, vec: Vec) -> bool:
        if failure.node_gen != self._node_gen:
            return False
        for name in self._freed[failure.pos :]:
            node = self._nodes.get(name)
            if node is not None and self._fits_node(cons, vec, node):
                return False
        failure.pos = len(self._freed)
        return True

    def _diagnose(self, cons: Constraints, vec: Vec) -> tuple[str, Shape]:
        """kube-scheduler's FitError text: the histogram of first failing filters, then the PostFilter's."""
        total = len(self._nodes)
        if total == 0:
            return NO_NODES, (NO_NODES,)
        reasons: Counter[str] = Counter()
        hopeless = 0  # failed an UnschedulableAndUnresolvable filter: preemption cannot help there
        victimless = 0
        by_class = self._candidates_by_class(cons)
        for cls in self._classes.values():
            h, v = self._diagnose_class(cons, vec, cls, by_class, reasons)
            hopeless += h
            victimless += v
        return _fit_error(total, reasons, hopeless, victimless, cons.never_preempts)

    def _candidates_by_class(self, cons: Constraints) -> dict[tuple[Any, ...], list[_Node]] | None:
        """The nodes a per-node constraint can name at all, by class; None: every node is a candidate."""
        if not cons.per_node:
            return None
        names = cons.candidates(self._by_host)
        if names is None:
            return None
        by_class: dict[tuple[Any, ...], list[_Node]] = {}
        for node_name in names:
            node = self._nodes.get(node_name)
            if node is not None and node.cls is not None:
                by_class.setdefault(node.cls.key, []).append(node)
        return by_class

    def _diagnose_class(
        self,
        cons: Constraints,
        vec: Vec,
        cls: _Class,
        by_class: dict[tuple[Any, ...], list[_Node]] | None,
        reasons: Counter[str],
    ) -> tuple[int, int]:
        """Count why one class's nodes fail into `reasons`; returns how many of them preemption cannot help
        and how many it could, were there victims."""
        n = len(cls.nodes)
        reason = self._reason(cons, cls)
        if reason is not None:
            reasons[reason] += n
            return n, 0
        unresolvable = cls.unresolvable(vec)
        if not cons.per_node:
            for res, amount in vec:
                short = cls.short(res, amount)
                if short:
                    reasons[insufficient(res)] += short
            return (n, 0) if unresolvable else (0, n)
        pool = cls.nodes.values() if by_class is None else by_class.get(cls.key, [])
        hopeless = victimless = matched = 0
        for node in pool:
            if not cons.node_ok(node.name, node.labels):
                continue
            matched += 1
            short_of = [res for res, amount in vec if cls.alloc.get(res, 0) - node.used.get(res, 0) < amount]
            for res in short_of:
                reasons[insufficient(res)] += 1
            spread = None if short_of or not cons.spread else \
                spread_reason(cons.spread, self._counts(cons), node.labels)
            if spread is not None:
                reasons[spread] += 1
            if unresolvable or spread == REASON_SPREAD_LABEL:
                hopeless += 1
            elif short_of or spread is not None:
                victimless += 1
        reasons[REASON_AFFINITY] += n - matched
        return hopeless + n - matched, victimless

    # ------------------------------------------------------------------------------------ the loop

    async def step(self) -> None:
        for key in self.due():
            if key == "retry":
                self._retry_armed = False
                self._retry_all = True
        self._failures.clear()
        self._freed.clear()
        self._retry_groups()
        done = 0
        heap = self._heap
        while heap and done < self.options.batch:
            _, seq, key = heapq.heappop(heap)
            entry = self._pending.get(key)
            if entry is None or entry.seq != seq or entry.group is not None:
                continue  # superseded heap entry
            entry.seq = -1
            done += 1
            await self._schedule(entry)
        if heap:
            self.wake()
        if self._groups and not self._retry_armed:
            self._retry_armed = True
            self.after("retry", self.options.unschedulable_retry_seconds)

    async def _schedule(self, entry: _Pending) -> None:
        ns, name = entry.key
        pod = self.access.get(PODS, ns, name)
        if pod is None or pod["metadata"].get("uid") != entry.uid or not self._wants(pod):
            self._forget(entry)
            return
        spec = pod["spec"]
        cons = constraints(spec, pod["metadata"])
        vec = pod_vector(spec)
        eq = (cons.key, vec)
        failure = self._failures.get(eq)
        node = None
        if failure is None or cons.spread or not self._still_failing(failure, cons, vec):
            node = self._find(cons, vec)
            if node is None:
                failure = self._failures[eq] = _Failure(len(self._freed), self._node_gen, self._diagnose(cons, vec))
        if node is None:
            assert failure is not None
            self._join(entry, eq, cons, vec)
            await self._unschedulable(entry, pod, failure)
            return
        drain = entry.drain
        try:
            await self.access.bind(ns, name, node.name)
        except StatusError as e:
            if e.code not in (404, 409):
                raise
            # Changed under us (bound elsewhere, deleted, gated): look again if it still needs a node.
            current = self.access.get(PODS, ns, name)
            if current is not None and self._pending.get(entry.key) is entry and self._wants(current):
                self._push(entry)
            return
        self.bound += 1
        self._spread_counts.clear()
        if drain:
            group = self._groups.get(eq)
            if group is not None:
                self._release(group, everyone=False)
        if self.options.events:
            message = f"Successfully assigned {ns}/{name} to {node.name}"
            await self.access.event(pod, "Pod", "Normal", "Scheduled", message)

    async def _unschedulable(self, entry: _Pending, pod: dict[str, Any], failure: _Failure) -> None:
        """PodScheduled=False/Unschedulable with the message, written only when it changes (and, when only
        the counts changed, at most every COUNTS_REFRESH_SECONDS)."""
        ns, name = pod["metadata"].get("namespace") or "", pod["metadata"]["name"]
        message = failure.message
        now = self.clock()
        for _ in range(3):
            conditions = list((pod.get("status") or {}).get("conditions") or [])
            at = next((i for i, c in enumerate(conditions) if c.get("type") == "PodScheduled"), None)
            old = conditions[at] if at is not None else None
            if old is not None and old.get("status") == "False" and old.get("reason") == "Unschedulable":
                if old.get("message") == message:
                    return
                written = entry.written
                if (written is not None and written[0] == old.get("message") and written[1] == failure.shape
                        and now - written[2] < COUNTS_REFRESH_SECONDS):
                    return
            cond = {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": (
                    old.get("lastTransitionTime") if old is not None and old.get("status") == "False"
                    else self.access.stamp()
                ),
                "reason": "Unschedulable",
                "message": message,
            }
            if at is None:
                conditions.append(cond)
            else:
                conditions[at] = cond
            patch = {"metadata": {"resourceVersion": pod["metadata"].get("resourceVersion")},
                     "status": {"conditions": conditions}}
            try:
                await self.access.patch(PODS, ns, name, patch, subresource="status")
                entry.written = (message, failure.shape, now)
            except StatusError as e:
                if e.code == 409:
                    current = self.access.get(PODS, ns, name)
                    if current is None or current["metadata"].get("uid") != pod["metadata"].get("uid"):
                        return
                    pod = current
                    continue
                if e.code == 404:
                    return
                raise
            if self.options.events:
                await self.access.event(pod, "Pod", "Warning", "FailedScheduling", message)
            return
