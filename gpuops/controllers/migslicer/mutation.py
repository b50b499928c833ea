"""What the admission webhook does to a pod, as a pure function of the pod (no I/O, easy to property-test).

A pod asking for `nvidia.com/mig-<profile>` gets it renamed to `gpuops.io/mig-<profile>` (so only slices this
operator created, advertised by its own device plugin, can satisfy it; NVIDIA's static plugin never serves
our name) and the scheduling gate `gpuops.io/mig-slicer` (so the default scheduler waits until the allocator
has created a slice and pinned the pod). Both must happen at creation: requests and gates are immutable
afterwards. The result is a JSON patch against the object the webhook was shown; an already mutated pod
(reinvocation, a controller re-posting its own output) gets an empty one.

Pods we cannot serve are denied here, with a message that names the container and the resource, instead of
being admitted into a state that never schedules (a gated pod whose profile no GPU offers) or failing later
in the apiserver's validation with names the user never wrote.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any, Final

from gpuops.accounting.mig import KNOWN_MODELS, geometry
from gpuops.accounting.quantity import parse_quantity
from gpuops.kube.admission.review import JSONPatchOp, MutationResult

from .api import GATE, NVIDIA_PREFIX, OUR_PREFIX, profile_of_resource, resource_of_profile

__all__ = ["WHOLE_GPU", "JSONPatchOp", "MutationResult", "escape_pointer", "known_profiles", "mutate"]

WHOLE_GPU: Final = "nvidia.com/gpu"
_CONTAINER_KINDS: Final = ("initContainers", "containers")
_EXPECTED: Final = (
    f"expected {NVIDIA_PREFIX}<compute>g.<memory>gb, optionally with -me for a media-extension profile "
    f"(e.g. {NVIDIA_PREFIX}1g.10gb, {NVIDIA_PREFIX}3g.40gb, {NVIDIA_PREFIX}1g.10gb-me)"
)


def escape_pointer(token: str) -> str:
    """RFC 6901: `~` first (else the `~` of `~1` would be escaped again), then `/`."""
    return token.replace("~", "~0").replace("/", "~1")


@cache
def known_profiles() -> frozenset[str]:
    """Every profile some GPU model in gpuops' catalogue offers: anything else could never be allocated."""
    return frozenset(p.name for m in KNOWN_MODELS for p in geometry(m).profiles)


class _Denied(Exception):
    pass


def _is_mig(resource: str) -> bool:
    return resource.startswith((NVIDIA_PREFIX, OUR_PREFIX))


def _maps(resources: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(requests, limits) of a container's `resources`, tolerating absent or null members."""
    if not isinstance(resources, Mapping):
        return {}, {}
    requests, limits = resources.get("requests"), resources.get("limits")
    return (dict(requests) if isinstance(requests, Mapping) else {},
            dict(limits) if isinstance(limits, Mapping) else {})


def _containers(spec: Mapping[str, Any], kind: str) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    items = spec.get(kind)
    for i, c in enumerate(items if isinstance(items, list) else []):
        if isinstance(c, Mapping):
            yield i, str(c.get("name") or f"#{i}"), c


def _where(kind: str, index: int, name: str) -> str:
    return f'container "{name}" (spec.{kind}[{index}])'


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except Exception:  # a malformed quantity is the apiserver's validation's to report, not ours
        return str(a) == str(b)


def _check_profile(where: str, resource: str) -> str:
    profile = profile_of_resource(resource)
    if "+" in resource:  # Kubernetes rejects it without us: say how to spell it instead of fixing it silently
        raise _Denied(f'{where} asks for "{resource}", but resource names cannot contain "+"; '
                      f"write {resource.replace('+', '-')}; {_EXPECTED}")
    if profile is None:
        raise _Denied(f'{where} asks for "{resource}", which does not name a MIG profile; {_EXPECTED}')
    if profile not in known_profiles():
        offered = ", ".join(sorted(known_profiles(), key=_profile_order))
        raise _Denied(
            f'{where} asks for "{resource}", but no GPU model gpuops knows offers MIG profile {profile} '
            f"(models: {', '.join(KNOWN_MODELS)}; profiles: {offered})"
        )
    return profile


def _profile_order(profile: str) -> tuple[int, int, str]:
    compute, _, rest = profile.partition("g.")
    memory = rest.split("gb", 1)[0]
    return (int(compute) if compute.isdigit() else 0, int(memory) if memory.isdigit() else 0, profile)


def _container_ops(kind: str, index: int, name: str, container: Mapping[str, Any]) -> tuple[list[JSONPatchOp], bool]:
    """The ops renaming one container's MIG resources, and whether it asks for MIG at all (ours or NVIDIA's)."""
    where = _where(kind, index, name)
    resources = container.get("resources")
    requests, limits = _maps(resources)
    mig = sorted({k for k in (*requests, *limits) if _is_mig(k)})
    if not mig:
        return [], False
    if WHOLE_GPU in requests or WHOLE_GPU in limits:
        raise _Denied(
            f'{where} asks for both "{WHOLE_GPU}" and "{mig[0]}": a container gets whole GPUs or MIG slices, '
            f"not both; split the work into two containers or ask for a larger MIG profile"
        )
    for resource in mig:
        _check_profile(where, resource)
        if resource in requests and resource not in limits:
            raise _Denied(
                f'{where} requests "{resource}" without a limit; extended resources cannot be overcommitted, '
                f"so set resources.limits (requests may then be left out)"
            )
        if resource in requests and not _same_quantity(requests[resource], limits[resource]):
            raise _Denied(
                f'{where} requests {requests[resource]} of "{resource}" but limits it to {limits[resource]}; '
                f"for extended resources the request must equal the limit"
            )
    for resource in mig:
        target = resource_of_profile(profile_of_resource(resource) or "")
        if resource != target and (target in requests or target in limits):
            raise _Denied(f'{where} asks for both "{resource}" and "{target}", which are the same MIG slice; '
                          f"ask for {resource} only")

    base = f"/spec/{kind}/{index}/resources"
    ops: list[JSONPatchOp] = []
    renamed = {r: resource_of_profile(profile_of_resource(r) or "") for r in mig if r.startswith(NVIDIA_PREFIX)}
    for old, new in renamed.items():
        ops.append({"op": "remove", "path": f"{base}/limits/{escape_pointer(old)}"})
        ops.append({"op": "add", "path": f"{base}/limits/{escape_pointer(new)}", "value": limits[old]})
    # Kubernetes defaults a missing request to the limit before admission; mirror that for anything that
    # did not (the renamed key must still be requested, or the scheduler would not count it).
    mirror = {new: limits[old] for old, new in renamed.items() if old not in requests}
    mirror |= {r: limits[r] for r in mig if r.startswith(OUR_PREFIX) and r not in requests}
    requests_present = isinstance(resources, Mapping) and isinstance(resources.get("requests"), Mapping)
    for old, new in renamed.items():
        if old in requests:
            ops.append({"op": "remove", "path": f"{base}/requests/{escape_pointer(old)}"})
            ops.append({"op": "add", "path": f"{base}/requests/{escape_pointer(new)}", "value": requests[old]})
    if mirror and not requests_present:
        ops.append({"op": "add", "path": f"{base}/requests", "value": mirror})
    else:
        ops.extend({"op": "add", "path": f"{base}/requests/{escape_pointer(k)}", "value": v}
                   for k, v in mirror.items())
    return ops, True


def _gate_ops(spec: Mapping[str, Any]) -> list[JSONPatchOp]:
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    if any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]


def mutate(pod: Mapping[str, Any]) -> MutationResult:
    """The JSON patch for `pod` (empty when it asks for no MIG slice or was mutated already), or a denial."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return MutationResult()  # nothing we could rename; the apiserver's validation reports the pod
    try:
        for index, name, container in _containers(spec, "ephemeralContainers"):
            requests, limits = _maps(container.get("resources"))
            mig = sorted(k for k in {*requests, *limits} if _is_mig(k))
            if mig:
                raise _Denied(f'{_where("ephemeralContainers", index, name)} asks for "{mig[0]}": ephemeral '
                              f"containers cannot be given MIG slices (they get no resources of their own)")
        ops: list[JSONPatchOp] = []
        warnings: list[str] = []
        wants_mig = False
        for kind in _CONTAINER_KINDS:
            for index, name, container in _containers(spec, kind):
                container_ops, has_mig = _container_ops(kind, index, name, container)
                ops.extend(container_ops)
                wants_mig = wants_mig or has_mig
                if has_mig and (warning := _mixed_profiles_warning(kind, index, name, container)):
                    warnings.append(warning)
        if not wants_mig:
            return MutationResult()
        if spec.get("nodeName"):
            raise _Denied(
                f'spec.nodeName is set ("{spec["nodeName"]}"), but a pod asking for MIG slices is placed by the '
                f"gpuops MIG slicer once its slice exists; remove nodeName (use a nodeSelector to restrict nodes)"
            )
    except _Denied as denied:
        return MutationResult(denied=str(denied))
    return MutationResult(patch=ops + _gate_ops(spec), warnings=warnings)


def _mixed_profiles_warning(kind: str, index: int, name: str, container: Mapping[str, Any]) -> str | None:
    """Each profile is its own kubelet resource with its own device plugin, and the kubelet keeps one value per
    environment variable: a runtime that reads NVIDIA_VISIBLE_DEVICES (legacy mode) exposes one profile's
    slices only. CDI devices add up, so CDI-enabled runtimes show all. Admitted, with a warning `kubectl`
    prints."""
    requests, limits = _maps(container.get("resources"))
    profiles = sorted({p for k in (*requests, *limits) if _is_mig(k) and (p := profile_of_resource(k))})
    if len(profiles) < 2:
        return None
    return (f"{_where(kind, index, name)} asks for MIG profiles {', '.join(profiles)}: the container sees all of "
            f"them only on a CDI-enabled runtime (containerd >= 1.7 or CRI-O with CDI); with the legacy "
            f"NVIDIA_VISIBLE_DEVICES mode it sees one profile's slices. Prefer one profile per container.")
