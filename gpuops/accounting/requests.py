"""The effective request of a pod for any resource, computed the way the scheduler computes it.

Summing the GPU requests of regular containers only would miss an init container that needs more GPUs than
the main containers, a sidecar (restartable init container) that holds a GPU for the pod's whole life, and
pod overhead. This follows `PodRequests` of k8s.io/component-helpers/resource (read at
HEAD 1961876) with default options, i.e. what the scheduler's fit check uses:

    request(r) = max( sum over containers and sidecars of req(r),
                      max over init containers i of init_use_i(r) )  [then pod-level override]  + overhead(r)

where sidecars are init containers with `restartPolicy: Always`, and for the i-th init container
`init_use_i = req_i + sum of the sidecars declared before it` (a regular init container runs alongside the
sidecars already started; for a sidecar itself the term is the sum of the sidecars up to and including it,
which never exceeds the first term). Pod-level requests (`spec.resources.requests`, PodLevelResources) replace
the aggregate for the resources they support (cpu, memory, hugepages-*) before overhead is added.

A container's requests default to its limits per resource, as the apiserver's Pod defaulting does, so a pod
that only sets `limits: {nvidia.com/gpu: 1}` requests one GPU. Pod-level requests are taken as stored (the
apiserver has already defaulted them); pass the stored values.

Out of scope, on purpose: in-place resize (`UseStatusResources`: max of spec, allocated and actuated), DRA
node-allocatable claims, and the scheduler's scoring-only defaults for containers without requests. Values
are exact; the scheduler then compares cpu in milli-units and other resources in whole units (`Value()`,
rounded up), which callers comparing against node allocatable must apply themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType

import msgspec

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.quantity import NegativeQuantityError, parse_quantity

__all__ = [
    "Container",
    "PodSpecRequests",
    "QuantityLike",
    "RequestsInputError",
    "container_requests",
    "pod_request",
    "pod_requests",
]

QuantityLike = Fraction | int | float | str
"""A quantity as it appears in a decoded pod (string or JSON number) or an exact amount (Fraction/int)."""

_POD_LEVEL = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX = "hugepages-"


class RequestsInputError(AccountingError):
    """A malformed container or pod description: wrong type or empty resource name."""


def _amount(raw: object, what: str) -> Fraction:
    if isinstance(raw, Fraction):
        if raw < 0:
            raise NegativeQuantityError(f"{what}: {raw} is negative; a resource request must be >= 0")
        return raw
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        return parse_quantity(raw, what=what)
    raise RequestsInputError(f"{what}: expected a quantity string, int, float or Fraction, got {raw!r}")


def _resource_list(raw: object, what: str) -> Mapping[str, Fraction]:
    if not isinstance(raw, Mapping):
        raise RequestsInputError(f"{what}: expected a mapping of resource name to quantity, got {raw!r}")
    parsed: dict[str, Fraction] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise RequestsInputError(f"{what}: resource names must be non-empty strings, got {name!r}")
        parsed[name] = _amount(value, f"{what}[{name!r}]")
    return MappingProxyType(parsed)


class Container(msgspec.Struct, frozen=True):
    """A container's resources as written in the pod spec; values are parsed (and checked) on construction.

    `restartable` is True for an init container with `restartPolicy: Always` (a sidecar); it is meaningless
    for regular containers and ignored there.
    """

    name: str
    requests: Mapping[str, QuantityLike] = {}
    limits: Mapping[str, QuantityLike] = {}
    restartable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise RequestsInputError(f"Container.name must be a string, got {self.name!r}")
        if not isinstance(self.restartable, bool):
            raise RequestsInputError(f"container {self.name!r}: restartable must be a bool, got {self.restartable!r}")
        where = f"container {self.name!r}"
        msgspec.structs.force_setattr(self, "requests", _resource_list(self.requests, f"{where} requests"))
        msgspec.structs.force_setattr(self, "limits", _resource_list(self.limits, f"{where} limits"))


class PodSpecRequests(msgspec.Struct, frozen=True):
    """The parts of a pod spec that decide its effective request.

    `overhead` is `spec.overhead` (set by the RuntimeClass admission plugin); `pod_requests` is
    `spec.resources.requests` (PodLevelResources) or None when the pod has no pod-level resources.
    """

    init_containers: Sequence[Container] = ()
    containers: Sequence[Container] = ()
    overhead: Mapping[str, QuantityLike] = {}
    pod_requests: Mapping[str, QuantityLike] | None = None

    def __post_init__(self) -> None:
        for field in ("init_containers", "containers"):
            raw: object = getattr(self, field)
            if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
                raise RequestsInputError(f"PodSpecRequests.{field} must be a sequence of Container, got {raw!r}")
            for i, item in enumerate(raw):
                if not isinstance(item, Container):
                    raise RequestsInputError(f"PodSpecRequests.{field}[{i}] must be a Container, got {item!r}")
            msgspec.structs.force_setattr(self, field, tuple(raw))
        msgspec.structs.force_setattr(self, "overhead", _resource_list(self.overhead, "pod overhead"))
        if self.pod_requests is not None:
            msgspec.structs.force_setattr(self, "pod_requests", _resource_list(self.pod_requests, "pod-level requests"))


def container_requests(container: Container) -> Mapping[str, Fraction]:
    """A container's requests after apiserver defaulting: each resource with a limit but no request gets it."""
    merged: dict[str, Fraction] = {name: Fraction(v) for name, v in container.limits.items()}
    merged.update((name, Fraction(v)) for name, v in container.requests.items())
    return MappingProxyType(merged)


def _add(total: dict[str, Fraction], extra: Mapping[str, Fraction]) -> None:
    for name, value in extra.items():
        total[name] = total.get(name, Fraction(0)) + value


def _max_into(total: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for name, value in other.items():
        if name not in total or value > total[name]:
            total[name] = value


def _supports_pod_level(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith(_HUGEPAGES_PREFIX)


def pod_requests(pod: PodSpecRequests, *, include_overhead: bool = True) -> Mapping[str, Fraction]:
    """Effective requests for every resource the pod names (zero-valued entries kept, as upstream does)."""
    if not isinstance(pod, PodSpecRequests):
        raise RequestsInputError(f"pod must be a PodSpecRequests, got {pod!r}")
    total: dict[str, Fraction] = {}
    for container in pod.containers:
        _add(total, container_requests(container))

    sidecars: dict[str, Fraction] = {}  # sidecars started so far, in declaration order
    init_peak: dict[str, Fraction] = {}
    for container in pod.init_containers:
        own = container_requests(container)
        if container.restartable:
            _add(total, own)  # runs for the pod's whole life, alongside the regular containers
            _add(sidecars, own)
            _max_into(init_peak, sidecars)
        else:
            during = dict(sidecars)  # runs alongside the sidecars declared before it
            _add(during, own)
            _max_into(init_peak, during)
    _max_into(total, init_peak)

    if pod.pod_requests is not None:
        for name, value in pod.pod_requests.items():
            if _supports_pod_level(name):
                total[name] = Fraction(value)
    if include_overhead:
        _add(total, {name: Fraction(v) for name, v in pod.overhead.items()})
    return MappingProxyType(total)


def pod_request(pod: PodSpecRequests, resource: str, *, include_overhead: bool = True) -> Fraction:
    """Effective request of one resource (0 when the pod does not name it), e.g. "nvidia.com/gpu"."""
    if not isinstance(resource, str) or not resource:
        raise RequestsInputError(f"resource must be a non-empty resource name, got {resource!r}")
    return pod_requests(pod, include_overhead=include_overhead).get(resource, Fraction(0))
