"""The workload driver: submits a scenario's Pods and Jobs as users would, on the scenario's arrival process.

Draws are seeded (scenario seed + stream index), so a scenario replays the same submissions. The simulated
runtime and exit code travel as annotations the emulated kubelet honours (`sim.gpuops.io/runtime-seconds`,
`sim.gpuops.io/exit-code`); a pod without a runtime runs until deleted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import structlog

from .apiserver.errors import StatusError
from .cluster.access import JOBS, PODS, ClusterAccess
from .cluster.loop import Loop
from .scenario import Distribution, Number, WorkloadSpec

log = structlog.get_logger("gpuops_sim.workload")

RUNTIME = "sim.gpuops.io/runtime-seconds"
EXIT_CODE = "sim.gpuops.io/exit-code"
WORKLOAD_LABEL = "sim.gpuops.io/workload"
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def draw(rng: random.Random, d: Number) -> float:
    if isinstance(d, float | int):
        return float(d)
    if d.value is not None:
        return d.value
    if d.exponential is not None:
        return rng.expovariate(1.0 / d.exponential.mean)
    if d.uniform is not None:
        return rng.uniform(d.uniform.low, d.uniform.high)
    assert d.choice is not None
    return rng.choices(d.choice.values, d.choice.weights)[0]


@dataclass
class Stream:
    spec: WorkloadSpec
    rng: random.Random
    submitted: int = 0
    failed_submissions: int = 0
    started_at: float = 0.0
    offsets: list[float] = field(default_factory=list)


def pod_template(spec: WorkloadSpec, rng: random.Random, seq: int) -> dict[str, Any]:
    """The pod (or Job pod template) of one arrival: GPUs, runtime and exit code drawn here."""
    gpus = round(draw(rng, spec.gpus))
    annotations = dict(spec.annotations)
    if spec.runtime_seconds is not None:
        annotations[RUNTIME] = f"{max(0.0, draw(rng, spec.runtime_seconds)):.3f}"
    if spec.failure_rate and rng.random() < spec.failure_rate:
        annotations[EXIT_CODE] = "1"
    limits: dict[str, str] = dict(spec.resources)
    if gpus > 0:
        limits["nvidia.com/gpu"] = str(gpus)
    requests = {"cpu": spec.cpu, "memory": spec.memory, **limits}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": IMAGE, "resources": {"requests": requests, "limits": limits}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = list(spec.tolerations)
    if gpus > 0:
        pod_spec.setdefault("tolerations", []).append(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        )
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    return {
        "metadata": {"labels": {**spec.labels, WORKLOAD_LABEL: spec.name}, "annotations": annotations},
        "spec": pod_spec,
    }


def manifest(spec: WorkloadSpec, rng: random.Random, seq: int) -> tuple[tuple[str, str], dict[str, Any]]:
    """(group-resource, object) of one arrival."""
    tmpl = pod_template(spec, rng, seq)
    name = f"{spec.name}-{seq:06d}"
    if spec.kind == "Pod":
        tmpl["metadata"]["name"] = name
        return PODS, {"apiVersion": "v1", "kind": "Pod", **tmpl}
    job_spec: dict[str, Any] = {
        "parallelism": spec.parallelism,
        "backoffLimit": 0,
        "template": {"metadata": tmpl["metadata"], "spec": tmpl["spec"]},
    }
    if spec.completions is not None:
        job_spec["completions"] = spec.completions
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {**spec.labels, WORKLOAD_LABEL: spec.name}},
        "spec": job_spec,
    }
    return JOBS, job


class WorkloadDriver(Loop):
    """Submits every stream's arrivals on time; a rejected submission is counted and logged, not retried."""

    name = "workload"

    def __init__(self, access: ClusterAccess, specs: list[WorkloadSpec], seed: int) -> None:
        super().__init__()
        self.access = access
        self.streams = [Stream(s, random.Random(seed * 1_000_003 + i)) for i, s in enumerate(specs)]
        self.paused = False

    def start(self) -> None:
        now = self.clock()
        for i, st in enumerate(self.streams):
            st.started_at = now
            first = st.spec.start_seconds
            if st.spec.arrival.at is not None:
                st.offsets = sorted(st.spec.arrival.at)
                if st.offsets:
                    first = st.spec.start_seconds + st.offsets.pop(0)
                else:
                    continue
            self.at(i, now + first)
        super().start()

    def _next_gap(self, st: Stream) -> float | None:
        a = st.spec.arrival
        if a.every is not None:
            return a.every
        if a.per_minute is not None:
            return st.rng.expovariate(a.per_minute / 60.0)
        if st.offsets:
            prev = st.offsets.pop(0)
            return max(0.0, st.spec.start_seconds + prev - (self.clock() - st.started_at))
        return None

    def _exhausted(self, st: Stream) -> bool:
        if st.spec.count is not None and st.submitted >= st.spec.count:
            return True
        stop = st.spec.stop_seconds
        return stop is not None and self.clock() - st.started_at >= stop

    async def step(self) -> None:
        for i in self.due():
            assert isinstance(i, int)
            st = self.streams[i]
            if self._exhausted(st):
                continue
            if not self.paused:
                await self._submit(st)
            gap = self._next_gap(st)
            if gap is not None and not self._exhausted(st):
                self.after(i, gap)

    async def _submit(self, st: Stream) -> None:
        seq = st.submitted
        gr, obj = manifest(st.spec, st.rng, seq)
        st.submitted += 1
        try:
            await self.access.create(gr, st.spec.namespace, obj)
        except StatusError as e:
            st.failed_submissions += 1
            log.warning("workload submission rejected", workload=st.spec.name, code=e.code, error=str(e))

    def counts(self) -> dict[str, int]:
        return {st.spec.name: st.submitted for st in self.streams}


__all__ = ["EXIT_CODE", "RUNTIME", "WORKLOAD_LABEL", "Distribution", "WorkloadDriver", "draw", "manifest"]
