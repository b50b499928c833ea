"""Compact msgspec models of the API objects controllers read.

Why not the generated kubernetes models: they cost two JSON passes and a Python object per field on every
watch event, and a cache of them takes many kilobytes per pod. These Structs keep only
what our controllers read; unknown fields (managedFields, volumes, env, ...) are skipped while decoding, so
they never reach memory. Every field has a default, so a missing field never fails a decode; timestamps
(RFC 3339 / MicroTime) and quantities stay as the strings the server sent; parsing is the reader's job.

Conventions that keep a cached pod small (tests/kube/test_objects.py measures it: about 1.5 KiB for a
Deployment replica, 1.9 KiB for a GPU Job pod with six labels, against 6 KiB without the last two points):
* `gc=False`: decoded API objects never form reference cycles, so the GC header and its scans are waste;
* absent maps and lists decode to None rather than to empty containers (an empty dict costs 64 bytes), and
  lists decode to tuples (smaller, and a cached object should not be changed in place anyway);
* strings with few distinct values (namespace, phase, condition types, node names, label values, second-
  precision timestamps, ...) are interned in `__post_init__`, so pods share one copy of "Running";
* values that replicas of a workload have in common (containers with their resources, tolerations, owner
  references, finalizers, and the condition lists and container statuses of pods that changed state in the
  same second) are frozen and shared: decoding the 1000th pod of a Job reuses the first one's. Their maps
  are typed `Mapping`: read-only, since changing one in place would change it for every pod.

All of this runs in three `__post_init__` hooks per pod (metadata, spec, status), not one per nested struct:
at tens of thousands of watch events per second the Python call per struct cost more than the interning.

`apiVersion` and `kind` are not kept: list items often lack them, and `Client` fills them in from the
`ResourceType` on writes. Models a controller needs beyond these can be declared the same way and passed to
`ResourceType.typed(...)`.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from functools import lru_cache
from typing import Annotated, Any, ClassVar, TypeVar, cast

import msgspec
from msgspec.structs import force_setattr as _set

from .crd.markers import Rule, crd, marker
from .crd.patterns import LABEL_KEY, LABEL_VALUE, label_map, syntax

__all__ = [
    "Affinity",
    "Condition",
    "ConfigMap",
    "Container",
    "ContainerState",
    "ContainerStateRunning",
    "ContainerStateTerminated",
    "ContainerStateWaiting",
    "ContainerStatus",
    "Event",
    "EventSeries",
    "EventSource",
    "Job",
    "JobCondition",
    "JobSpec",
    "JobStatus",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Lease",
    "LeaseSpec",
    "ListMeta",
    "Namespace",
    "NamespaceSpec",
    "NamespaceStatus",
    "Node",
    "NodeAddress",
    "NodeAffinity",
    "NodeCondition",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeSpec",
    "NodeStatus",
    "ObjectList",
    "ObjectMeta",
    "ObjectReference",
    "OwnerReference",
    "PartialObjectMetadata",
    "Pod",
    "PodCondition",
    "PodDisruptionBudget",
    "PodDisruptionBudgetSpec",
    "PodDisruptionBudgetStatus",
    "PodSchedulingGate",
    "PodSpec",
    "PodStatus",
    "PodTemplateSpec",
    "Quantity",
    "ResourceRequirements",
    "Secret",
    "Taint",
    "Toleration",
    "decode",
    "decoder",
    "encode",
    "to_builtins",
]

S = TypeVar("S")

# The apiserver always sends quantities as strings; numbers are accepted too (what users may write and what
# a lenient server may echo back) so a decode never fails on them.
Quantity = str | int | float

# sys.intern keeps strings mortal: a value is shared while some object uses it and freed afterwards, so
# interning node names or label values does not leak as pods come and go.
_intern = sys.intern

# msgspec already shares dict keys of up to this many characters between decodes.
_KEY_CACHE_LEN = 32
# Longer map values (last-applied-configuration, JSON blobs in annotations) are rarely shared: hashing them
# would cost more than it saves. Label values and quantities are at most 63 characters.
_VALUE_INTERN_LEN = 64


# Immutable values that repeat across many objects (the default tolerations of every pod, the owner reference
# and finalizers of a Job's pods) are kept once. The table is bounded: when full it is simply dropped, which
# costs some sharing but never correctness.
_SHARED_MAX = 8192
_shared: dict[Any, Any] = {}

H = TypeVar("H")


def _share(value: H) -> H:
    if len(_shared) >= _SHARED_MAX:
        _shared.clear()
    shared: H = _shared.setdefault(value, value)
    return shared


# Values that are often unique (condition lists and container statuses carry per-pod timestamps, a pod's owner
# is unique to it for bare pods and StatefulSets) are shared through a smaller table of recent values: equal
# ones arrive together (the pods of one workload, listed or changed together), and a table slot per unique
# value would otherwise cost as much as interning saves.
_RECENT_MAX = 1024
_recent: dict[Any, Any] = {}


def _share_new(value: H) -> tuple[H, bool]:
    """(the shared copy, whether `value` itself became it): a first copy is worth compacting further."""
    shared: H | None = _recent.get(value)
    if shared is not None:
        return shared, False
    if len(_recent) >= _RECENT_MAX:
        _recent.clear()
    _recent[value] = value
    return value, True


def _share_containers(containers: tuple[Container, ...]) -> tuple[Container, ...]:
    """Containers hold dicts, so they are shared under a key built from their contents."""
    key: list[Any] = [_share_containers]
    for c in containers:
        r = c.resources
        key.append(c.name)
        key.append(c.restart_policy)
        if r is None:
            key.append(None)
        else:
            key.append(tuple(r.requests.items()) if r.requests else None)
            key.append(tuple(r.limits.items()) if r.limits else None)
    if len(_shared) >= _SHARED_MAX:
        _shared.clear()
    shared: tuple[Container, ...] = _shared.setdefault(tuple(key), containers)
    return shared


def _i_map(d: dict[str, Any] | None) -> dict[str, Any] | None:
    """Intern short string values in place; rebuild the dict only if a key is too long for msgspec's cache."""
    if not d:
        return d
    rebuild = False
    for k, v in d.items():
        if type(v) is str and len(v) <= _VALUE_INTERN_LEN:
            d[k] = _intern(v)
        if len(k) > _KEY_CACHE_LEN:
            rebuild = True
    if rebuild:
        return {_intern(k): v for k, v in d.items()}
    return d


def _i_strmap(d: dict[str, str], short: bool = False) -> dict[str, str]:
    """`_i_map` for a non-empty map of strings, without its type checks; `short`: every value is known to be
    short (label values are at most 63 characters)."""
    long_key = False
    for k, v in d.items():
        if short or len(v) <= _VALUE_INTERN_LEN:
            d[k] = _intern(v)
        if len(k) > _KEY_CACHE_LEN:
            long_key = True
    if long_key:
        return {_intern(k): v for k, v in d.items()}
    return d


class _Model(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, gc=False):
    """Base of all models (config is inherited)."""


class _Frozen(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, gc=False, frozen=True):
    """Base of values shared between objects: they must never change in place."""


# ---------------------------------------------------------------------------------------------- meta


class OwnerReference(_Frozen, frozen=True):
    """Frozen: the references of all pods of one Job or ReplicaSet are a single shared tuple."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Model):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: tuple[OwnerReference, ...] | None = None
    finalizers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # One hook per object part, not one per nested struct: each Python call costs more than the work.
        if self.namespace:
            self.namespace = _intern(self.namespace)
        if self.generate_name:
            self.generate_name = _intern(self.generate_name)
        if self.creation_timestamp:
            self.creation_timestamp = _intern(self.creation_timestamp)
        if self.labels:
            self.labels = _i_strmap(self.labels, True)
        if self.annotations:
            self.annotations = _i_strmap(self.annotations)
        if self.owner_references:
            refs, first = _share_new(self.owner_references)
            if first:  # the owner's name and kind recur even where its uid does not
                for r in refs:
                    _set(r, "api_version", _intern(r.api_version))
                    _set(r, "kind", _intern(r.kind))
                    _set(r, "name", _intern(r.name))
            self.owner_references = refs
        if self.finalizers:
            self.finalizers = _share(self.finalizers)


class ListMeta(_Model):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")
    remaining_item_count: int | None = None


class Condition(_Model):
    """Condition contains details for one aspect of the current state (metav1.Condition, as on PDBs and custom
    resources)."""

    type: Annotated[str, crd(required=True, max_length=316)] = ""
    """CamelCase condition type."""
    status: Annotated[str, crd(required=True, enum=("True", "False", "Unknown"))] = ""
    """True, False or Unknown."""
    observed_generation: Annotated[int, crd(format="int64", minimum=0)] = 0
    """The generation the condition was set for."""
    last_transition_time: Annotated[str | None, crd(format="date-time")] = None
    """When the status last changed."""
    reason: Annotated[str, crd(min_length=1, max_length=1024)] = ""
    """CamelCase reason for the last transition."""
    message: Annotated[str, crd(max_length=32768)] = ""
    """Details for humans."""

    def __post_init__(self) -> None:
        self.type = _intern(self.type)
        self.status = _intern(self.status)
        self.reason = _intern(self.reason)


class LabelSelectorRequirement(_Model):
    """A label requirement (key, operator, values)."""

    __crd_rules__: ClassVar[tuple[Rule, ...]] = (
        Rule("self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : "
             "(!has(self.values) || size(self.values) == 0)",
             "operators In and NotIn need values; Exists and DoesNotExist take none"),
    )

    key: Annotated[str, syntax(LABEL_KEY, "must be a label key: an optional DNS-subdomain prefix and '/', then at "
                               "most 63 letters, digits, '-', '_' or '.' (e.g. app.kubernetes.io/name)",
                               max_length=317, required=True)] = ""
    """The label key."""
    operator: Annotated[str, crd(required=True, enum=("In", "NotIn", "Exists", "DoesNotExist"))] = ""
    """How the key relates to the values."""
    values: Annotated[tuple[str, ...] | None, crd(max_items=64, items=marker(max_length=63), rules=(
        Rule(f"self.all(v, v.matches(r'{LABEL_VALUE}'))",
             "every value must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.' starting and "
             "ending with a letter or digit"),
    ))] = None
    """Values for In and NotIn; empty for Exists and DoesNotExist."""


class LabelSelector(_Model):
    """A label query over a set of objects; its requirements are ANDed."""

    match_labels: Annotated[dict[str, str] | None, label_map("matchLabels")] = None
    """Objects must carry all of these labels with these values."""
    match_expressions: Annotated[tuple[LabelSelectorRequirement, ...] | None, crd(max_items=32)] = None
    """Objects must satisfy all of these requirements."""


class NodeSelectorRequirement(_Frozen, frozen=True):
    """Operators In, NotIn, Exists, DoesNotExist, Gt, Lt (Gt/Lt compare one integer value)."""

    key: str = ""
    operator: str = ""
    values: tuple[str, ...] | None = None


class NodeSelectorTerm(_Frozen, frozen=True):
    match_expressions: tuple[NodeSelectorRequirement, ...] | None = None
    match_fields: tuple[NodeSelectorRequirement, ...] | None = None


class NodeSelector(_Frozen, frozen=True):
    node_selector_terms: tuple[NodeSelectorTerm, ...] | None = None


class NodeAffinity(_Frozen, frozen=True):
    """Only the required part: preferences do not decide whether a pod can run on a node."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(_Frozen, frozen=True):
    """Pod (anti-)affinity is not modelled: it depends on other pods, not on the node."""

    node_affinity: NodeAffinity | None = None


class ObjectReference(_Model):
    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""
    resource_version: str = ""
    field_path: str = ""


class PartialObjectMetadata(_Model):
    """Metadata only: enough for caches that key, select and own but never read a spec."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class ObjectList(_Model):
    """A list response with undecoded items (decode each with the type the caller needs)."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


# ---------------------------------------------------------------------------------------------- pods


class ResourceRequirements(_Frozen, frozen=True):
    """Read-only (frozen, Mapping): the containers of a workload's pods are one shared value, see PodSpec."""

    requests: Mapping[str, Quantity] | None = None
    limits: Mapping[str, Quantity] | None = None


class Container(_Frozen, frozen=True):
    """Only name, resources and restartPolicy (init containers with Always are sidecars)."""

    name: str = ""
    resources: ResourceRequirements | None = None
    restart_policy: str = ""


class Toleration(_Frozen, frozen=True):
    """Frozen: nearly every pod carries the same tolerations, so the tuple of them is shared."""

    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class PodSchedulingGate(_Frozen, frozen=True):
    name: str = ""


class PodSpec(_Model):
    containers: tuple[Container, ...] | None = None
    init_containers: tuple[Container, ...] | None = None
    overhead: dict[str, Quantity] | None = None
    node_name: str = ""
    node_selector: dict[str, str] | None = None
    tolerations: tuple[Toleration, ...] | None = None
    scheduling_gates: tuple[PodSchedulingGate, ...] | None = None
    priority: int | None = None
    priority_class_name: str = ""
    scheduler_name: str = ""
    restart_policy: str = ""
    termination_grace_period_seconds: int | None = None
    affinity: Affinity | None = None

    def __post_init__(self) -> None:
        # Replicas of a workload have equal containers: keep one tuple of them, however many pods there are.
        if self.containers:
            self.containers = _share_containers(self.containers)
        if self.init_containers:
            self.init_containers = _share_containers(self.init_containers)
        if self.overhead:
            self.overhead = _i_map(self.overhead)
        if self.node_name:
            self.node_name = _intern(self.node_name)
        if self.tolerations:
            self.tolerations = _share(self.tolerations)
        if self.scheduling_gates:
            self.scheduling_gates = _share(self.scheduling_gates)
        if self.node_selector:
            self.node_selector = _i_strmap(self.node_selector, True)
        if self.priority_class_name:
            self.priority_class_name = _intern(self.priority_class_name)
        if self.scheduler_name:
            self.scheduler_name = _intern(self.scheduler_name)
        if self.restart_policy:
            self.restart_policy = _intern(self.restart_policy)


class PodCondition(_Frozen, frozen=True):
    """Frozen: equal condition lists (pods of a workload that changed state in the same second) are one tuple."""

    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class ContainerStateRunning(_Frozen, frozen=True):
    started_at: str | None = None


class ContainerStateTerminated(_Frozen, frozen=True):
    exit_code: int = 0
    signal: int = 0
    reason: str = ""
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None


class ContainerStateWaiting(_Frozen, frozen=True):
    reason: str = ""
    message: str = ""


class ContainerState(_Frozen, frozen=True):
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None
    waiting: ContainerStateWaiting | None = None


_EMPTY_STATE = ContainerState()


class ContainerStatus(_Frozen, frozen=True):
    """Frozen like the conditions: a pod's container statuses are shared with its equals."""

    name: str = ""
    ready: bool = False
    started: bool | None = None
    restart_count: int = 0
    state: ContainerState | None = None
    last_state: ContainerState | None = None


def _share_conditions(conditions: tuple[PodCondition, ...]) -> tuple[PodCondition, ...]:
    shared, first = _share_new(conditions)
    if first:  # unique (a timestamp nobody shares): still share the strings that recur
        for c in shared:
            _set(c, "type", _intern(c.type))
            _set(c, "status", _intern(c.status))
            if c.reason:
                _set(c, "reason", _intern(c.reason))
            if c.last_transition_time:
                _set(c, "last_transition_time", _intern(c.last_transition_time))
    return shared


def _share_statuses(statuses: tuple[ContainerStatus, ...]) -> tuple[ContainerStatus, ...]:
    for cs in statuses:
        if cs.last_state is not None and cs.last_state == _EMPTY_STATE:
            _set(cs, "last_state", None)  # the API sends "lastState": {} for containers that never restarted
    shared, first = _share_new(statuses)
    if first:
        for cs in shared:
            _set(cs, "name", _intern(cs.name))
            for st in (cs.state, cs.last_state):
                if st is None:
                    continue
                if st.running is not None and st.running.started_at:
                    _set(st.running, "started_at", _intern(st.running.started_at))
                if st.terminated is not None and st.terminated.reason:
                    _set(st.terminated, "reason", _intern(st.terminated.reason))
                if st.waiting is not None and st.waiting.reason:
                    _set(st.waiting, "reason", _intern(st.waiting.reason))
    return shared


class PodStatus(_Model):
    phase: str = ""
    reason: str = ""
    message: str = ""
    nominated_node_name: str = ""
    conditions: tuple[PodCondition, ...] | None = None
    container_statuses: tuple[ContainerStatus, ...] | None = None
    init_container_statuses: tuple[ContainerStatus, ...] | None = None
    start_time: str | None = None

    def __post_init__(self) -> None:
        if self.phase:
            self.phase = _intern(self.phase)
        if self.reason:
            self.reason = _intern(self.reason)
        if self.nominated_node_name:
            self.nominated_node_name = _intern(self.nominated_node_name)
        if self.start_time:
            self.start_time = _intern(self.start_time)
        if self.conditions:
            self.conditions = _share_conditions(self.conditions)
        if self.container_statuses:
            self.container_statuses = _share_statuses(self.container_statuses)
        if self.init_container_statuses:
            self.init_container_statuses = _share_statuses(self.init_container_statuses)


class Pod(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class PodTemplateSpec(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


# ---------------------------------------------------------------------------------------------- nodes


class Taint(_Model):
    """A node taint."""

    key: Annotated[str, syntax(LABEL_KEY, "must be a label key: an optional DNS-subdomain prefix and '/', then at "
                               "most 63 letters, digits, '-', '_' or '.' (e.g. nvidia.com/gpu)", max_length=317,
                               required=True)] = ""
    """The taint key: a label key (an optional DNS-subdomain prefix and '/', then a name)."""
    value: Annotated[str, syntax(LABEL_VALUE, "must be empty or a label value: at most 63 letters, digits, '-', '_' "
                                 "or '.' starting and ending with a letter or digit", max_length=63,
                                 min_length=0)] = ""
    """The taint value (may be empty; a label value's syntax)."""
    effect: Annotated[str, crd(required=True, enum=("NoSchedule", "PreferNoSchedule", "NoExecute"))] = ""
    """NoSchedule, PreferNoSchedule or NoExecute; pods do not need to tolerate PreferNoSchedule."""
    time_added: Annotated[str | None, crd(format="date-time")] = None
    """When a NoExecute taint was added (set by the node lifecycle controller)."""

    def __post_init__(self) -> None:
        self.key = _intern(self.key)
        self.value = _intern(self.value)
        self.effect = _intern(self.effect)


class NodeSpec(_Model):
    unschedulable: bool = False
    taints: tuple[Taint, ...] | None = None
    provider_id: str = msgspec.field(default="", name="providerID")
    pod_cidr: str = msgspec.field(default="", name="podCIDR")


class NodeCondition(_Model):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_heartbeat_time: str | None = None
    last_transition_time: str | None = None

    def __post_init__(self) -> None:
        self.type = _intern(self.type)
        self.status = _intern(self.status)
        self.reason = _intern(self.reason)
        self.message = _intern(self.message)


class NodeAddress(_Model):
    type: str = ""
    address: str = ""

    def __post_init__(self) -> None:
        self.type = _intern(self.type)


class NodeStatus(_Model):
    capacity: dict[str, Quantity] | None = None
    allocatable: dict[str, Quantity] | None = None
    conditions: tuple[NodeCondition, ...] | None = None
    addresses: tuple[NodeAddress, ...] | None = None

    def __post_init__(self) -> None:
        self.capacity = _i_map(self.capacity)
        self.allocatable = _i_map(self.allocatable)


class Node(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


# ---------------------------------------------------------------------------------------------- events


class EventSource(_Model):
    component: str = ""
    host: str = ""


class EventSeries(_Model):
    count: int = 0
    last_observed_time: str | None = None  # MicroTime


class Event(_Model):
    """core/v1 Event, all fields (the shape client-go's recorder writes and kubectl describe reads)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involved_object: ObjectReference = msgspec.field(default_factory=ObjectReference)
    reason: str = ""
    message: str = ""
    source: EventSource | None = None
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    count: int = 0
    type: str = ""
    event_time: str | None = None  # MicroTime
    series: EventSeries | None = None
    action: str = ""
    related: ObjectReference | None = None
    reporting_component: str = ""
    reporting_instance: str = ""


# ---------------------------------------------------------------------------------------------- leases


class LeaseSpec(_Model):
    """Optional fields stay None when absent, so an explicit "" holder or 0 transitions is still written."""

    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None  # MicroTime
    renew_time: str | None = None  # MicroTime
    lease_transitions: int | None = None
    strategy: str | None = None
    preferred_holder: str | None = None


class Lease(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


# ---------------------------------------------------------------------------------------------- policy, batch


class PodDisruptionBudgetSpec(_Model):
    min_available: int | str | None = None
    max_unavailable: int | str | None = None
    selector: LabelSelector | None = None
    unhealthy_pod_eviction_policy: str = ""


class PodDisruptionBudgetStatus(_Model):
    observed_generation: int = 0
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0
    expected_pods: int = 0
    disrupted_pods: dict[str, str] | None = None
    conditions: tuple[Condition, ...] | None = None


class PodDisruptionBudget(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodDisruptionBudgetSpec = msgspec.field(default_factory=PodDisruptionBudgetSpec)
    status: PodDisruptionBudgetStatus = msgspec.field(default_factory=PodDisruptionBudgetStatus)


class JobSpec(_Model):
    parallelism: int | None = None
    completions: int | None = None
    completion_mode: str = ""
    active_deadline_seconds: int | None = None
    backoff_limit: int | None = None
    suspend: bool | None = None
    selector: LabelSelector | None = None
    template: PodTemplateSpec | None = None
    ttl_seconds_after_finished: int | None = None
    managed_by: str = ""
    """The controller that runs the Job; empty or kubernetes.io/job-controller: the built-in one."""


class JobCondition(_Model):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_probe_time: str | None = None
    last_transition_time: str | None = None

    def __post_init__(self) -> None:
        self.type = _intern(self.type)
        self.status = _intern(self.status)
        self.reason = _intern(self.reason)


class JobStatus(_Model):
    conditions: tuple[JobCondition, ...] | None = None
    start_time: str | None = None
    completion_time: str | None = None
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    ready: int | None = None
    terminating: int | None = None


class Job(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: JobSpec = msgspec.field(default_factory=JobSpec)
    status: JobStatus = msgspec.field(default_factory=JobStatus)


# ---------------------------------------------------------------------------------------------- core misc


class NamespaceSpec(_Model):
    finalizers: tuple[str, ...] | None = None


class NamespaceStatus(_Model):
    phase: str = ""
    conditions: tuple[Condition, ...] | None = None

    def __post_init__(self) -> None:
        self.phase = _intern(self.phase)


class Namespace(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NamespaceSpec = msgspec.field(default_factory=NamespaceSpec)
    status: NamespaceStatus = msgspec.field(default_factory=NamespaceStatus)


class ConfigMap(_Model):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] | None = None
    binary_data: dict[str, str] | None = None
    immutable: bool | None = None


class Secret(_Model):
    """`data` values are base64, as on the wire; `string_data` is write-only upstream (never read back)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    data: dict[str, str] | None = None
    type: str = ""


# ---------------------------------------------------------------------------------------------- codec helpers

_encoder = msgspec.json.Encoder()


@lru_cache(maxsize=256)
def decoder(type_: Any) -> msgspec.json.Decoder[Any]:
    """A cached JSON decoder for `type_` (building one per call costs more than decoding a small object)."""
    return msgspec.json.Decoder(type_)


def decode(data: bytes, type_: type[S]) -> S:
    result: S = decoder(cast(Hashable, type_)).decode(data)
    return result


def to_builtins(obj: Any) -> Any:
    """JSON-shaped Python values (dicts, lists, str, ...) of a model, with defaults left out."""
    return msgspec.to_builtins(obj)


def encode(obj: Any) -> bytes:
    """JSON bytes of a model or of plain JSON-shaped values."""
    return _encoder.encode(obj)
