"""The pod contract: what a pod's usage is, in every budget (of its namespace) that selects it.

    gpus   the effective request of `spec.gpuResourceName` (`gpuops.accounting.requests`: init containers,
           sidecars and overhead as the scheduler counts them); `cpu` works and may be fractional.
    start  the earliest container start (init and regular: state.running/terminated.startedAt,
           lastState.terminated.startedAt), else status.startTime; a pod with neither has not used anything.
    end    for a Succeeded/Failed pod, or a deleted pod whose containers have all terminated: the latest
           finishedAt, else deletionTimestamp, else its latest condition transition. Otherwise the pod is open
           (it accrues up to now, CrashLoopBackOff included: the device stays allocated). A pod that vanishes
           while still open has no recorded finish: it ends when we saw it vanish (microseconds), or at its
           deletionTimestamp if earlier. A pod we evict with no grace period stops accruing at once, at the
           counting instant we sent the eviction (`Enforcer.stopped_at`), in the scrape snapshot too; its
           finishedAt, never earlier, replaces that end once it is in, or, if it vanished while still running,
           the middle of the eviction request (microseconds; the server stopped it inside).
And a pod's end is never before what an already reported figure counted it through (`counted_through` of the
budget's last snapshot): a cache that still showed a finished pod running made us report more than its
finishedAt says, and that figure stands (`gpuops.accounting.reporting.settle_end`); the time counted past the
recorded finish is the pod's `late` part.
"""

from __future__ import annotations

import contextlib
import re
from fractions import Fraction
from typing import Any, NamedTuple

import structlog

from gpuops.accounting.errors import AccountingError
from gpuops.accounting.gpuhours import LedgerEntry
from gpuops.accounting.pricing import mig_share
from gpuops.accounting.reporting import settle_end
from gpuops.accounting.requests import Container, PodSpecRequests, pod_request
from gpuops.controllers.apigroup import DEFAULT_RESOURCE, MIG_RESOURCE_PREFIXES
from gpuops.kube.objects import Pod
from gpuops.kube.times import parse_time_or_none as _t

__all__ = ["PodSpan", "counted_end", "departed_entry", "pod_gpus", "pod_span"]

log = structlog.get_logger("gpuops.controllers.budget")

_TERMINAL = ("Succeeded", "Failed")


class PodSpan(NamedTuple):
    start: int | None
    end: int | None
    final: bool


def pod_span(pod: Pod) -> PodSpan:
    """When the pod started and ended using its devices (see the module docstring for the contract)."""
    st = pod.status
    starts: list[int] = []
    finishes: list[int] = []
    statuses = pod.status.container_statuses or ()
    all_terminated = bool(statuses)
    for i, cs in enumerate((*statuses, *(st.init_container_statuses or ()))):
        state = cs.state
        if i < len(statuses) and (state is None or state.terminated is None):
            all_terminated = False
        for s in (state, cs.last_state):
            if s is None:
                continue
            if s.running is not None and (at := _t(s.running.started_at)) is not None:
                starts.append(at)
            if s.terminated is not None:
                if (at := _t(s.terminated.started_at)) is not None:
                    starts.append(at)
                if s is state and (at := _t(s.terminated.finished_at)) is not None:
                    finishes.append(at)
    start = min(starts) if starts else _t(st.start_time)
    deleted = _t(pod.metadata.deletion_timestamp)
    final = st.phase in _TERMINAL or (deleted is not None and all_terminated)
    if start is None or not final:
        return PodSpan(start, None, final)
    if finishes:
        end = max(finishes)
    elif deleted is not None:
        end = deleted
    else:
        end = max((t for c in st.conditions or () if (t := _t(c.last_transition_time)) is not None), default=start)
    return PodSpan(start, max(start, end), True)


_COMPUTE = re.compile(r"^(\d+)g\.")


def _container(c: Any) -> Container:
    r = c.resources
    return Container(
        c.name,
        requests=dict(r.requests or {}) if r is not None else {},
        limits=dict(r.limits or {}) if r is not None else {},
        restartable=c.restart_policy == "Always",
    )


def pod_gpus(pod: Pod, resource: str, model: str = "") -> Fraction:
    """The pod's effective request of `resource` (0 when malformed: the API server would not have taken it).

    Whole GPUs (`nvidia.com/gpu`) include the pod's MIG slices, each as its share of the GPU (`mig_share`) on
    `model`, the GPU model of its node; where that is not known, an "Ng" profile counts N of 7 compute slices (the
    A100's, H100's and later GPUs'), and a profile that names none counts a whole GPU."""
    spec = pod.spec
    try:
        requests = PodSpecRequests(
            init_containers=[_container(c) for c in spec.init_containers or ()],
            containers=[_container(c) for c in spec.containers or ()],
            overhead=dict(spec.overhead or {}),
        )
        total = pod_request(requests, resource)
        if resource == DEFAULT_RESOURCE:
            for name in _mig_resources(requests):
                total += pod_request(requests, name) * _share(name.split("/mig-", 1)[1], model)
        return total
    except AccountingError as e:
        log.warning("pod requests unreadable; counted as 0", pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
                    error=str(e))
        return Fraction(0)


def _mig_resources(pod: PodSpecRequests) -> set[str]:
    names: set[str] = set()
    for c in (*pod.init_containers, *pod.containers):
        names.update(n for n in (*c.requests, *c.limits) if n.startswith(MIG_RESOURCE_PREFIXES))
    return names


def _share(profile: str, model: str) -> Fraction:
    if model:
        with contextlib.suppress(AccountingError):
            return mig_share(model, profile)
    compute = _COMPUTE.match(profile)
    return min(Fraction(1), Fraction(int(compute.group(1)), 7)) if compute else Fraction(1)


def counted_end(span: PodSpan, halted: int | None, counted: int | None) -> tuple[int | None, int]:
    """The end to count for a pod still in the cache (None: it still runs), and how much of it lies past the
    recorded end (the interval's `late` part).

    A pod we evicted with no grace period (`halted`: the counting instant we sent the eviction) ends then while
    the cache still shows it running; once its final state is in, at its finishedAt (the server stopped it
    after we sent). Either end is raised to `counted`, what an already reported figure counted it through
    (`halted` itself, once a figure was reported after it), so its reported usage never shrinks (`settle_end`).
    """
    if span.start is None:
        return span.end, 0
    end = span.end if span.end is not None else halted
    return (None, 0) if end is None else _settled(span.start, end, counted)


def _settled(start: int, end: int, counted: int | None) -> tuple[int, int]:
    """`settle_end`, and the part of the settled end past the given one (the record's late part)."""
    settled = settle_end(start, end, counted)
    return settled, settled - max(start, end)


def departed_entry(
    pod: Pod, seen: int, gpus: Fraction, halted: int | None = None, counted: int | None = None
) -> LedgerEntry | None:
    """The final usage of a pod that left the API (its last known state, `seen` when it went).

    A finished one ends at its finishedAt. One that vanished still running has no recorded finish: it ends when
    our eviction without grace stopped it (`halted`, `Enforcer.vanished_end`), else when we saw it gone or at
    its deletionTimestamp if earlier (microseconds: our own clock's). Either is raised to `counted` (see
    `counted_end`)."""
    span = pod_span(pod)
    if span.start is None or gpus <= 0:
        return None
    end = span.end
    if end is None:
        end = halted if halted is not None else seen
        deleted = _t(pod.metadata.deletion_timestamp)
        if halted is None and deleted is not None:
            end = min(end, deleted)
    settled, late = _settled(span.start, end, counted)
    return LedgerEntry(uid=pod.metadata.uid, start=span.start, end=settled, gpus=gpus, late=late)
