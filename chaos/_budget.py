"""What the budget chaos scenarios share: the rig, the ground-truth pod log, snapshots against the truth.

Ground truth. `PodLog` is a synchronous listener on the emulator's store, attached before the cluster starts:
it sees every version of every pod of the namespace, in order, including the last state of pods that are
deleted (Job TTL + garbage collection, evictions). Unlike an HTTP watch it cannot be dropped, compacted or
failed by the faults a scenario injects into the API server, so the truth never depends on the very
machinery under test. Truth itself is `gpuops_sim.budget_workload.truth` (exact arithmetic on the
emulator's container timestamps, none of the controller's code); a pod that disappears while one of its
containers has no terminated state (a grace-0 eviction removes a running pod at once) is given a terminated
state that ends at the instant the store removed it, since that is when its GPUs were taken back.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from _common import OnHarness

from gpuops.accounting.reporting import counting_instant
from gpuops_sim.apiserver.faults import Faults
from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.budget_workload import MICROS, micros, scenario, truth
from gpuops_sim.cluster.access import EVENTS, JOBS, PODS
from gpuops_sim.cluster.cluster import BUDGETS, SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value, now_us, until

__all__ = [
    "BUDGETS_PATH", "CRDS", "GPU", "METRIC", "NS", "TARGET", "Chaos", "PodLog", "PodRecord", "accuracy_ok",
    "gpu_seconds", "metric_gpu_hours", "open_rig", "ratio", "set_labels", "snapshot", "snapshot_ok", "window_accuracy",
]

ROOT = Path(__file__).resolve().parents[1]
CRDS = [ROOT / "manifests" / "crds" / f"{plural}.gpuops.io.yaml" for plural in ("gpuworkloadbudgets", "gpupricelists")]
"""The budget controller's CRDs: budgets and the price lists it reads."""
NS = "chaos"
BUDGETS_PATH = f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/gpuworkloadbudgets"
METRIC = "gpuops_budget_consumed_gpu_seconds"  # GPU-seconds: `metric_gpu_hours` divides the scraped float by 3600
GPU = "nvidia.com/gpu"
TARGET = Fraction(999, 1000)


# ---------------------------------------------------------------------------------------------- ground truth


@dataclass
class PodRecord:
    last: dict[str, Any]
    created_at: int
    terminal_at: int | None = None
    """When the store first held the pod Succeeded/Failed (µs)."""
    deletion_at: int | None = None
    """When the store first held the pod with a deletionTimestamp, or removed it (µs)."""
    gone_at: int | None = None
    """When the store removed the pod (µs)."""


class PodLog:
    """Every pod of NS as the store last had it (see the module docstring); attach before the first pod."""

    def __init__(self, cluster: SimCluster) -> None:
        self.records: dict[str, PodRecord] = {}
        cluster.access.listen(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.gr != PODS or ev.key[0] != NS:
            return
        at = now_us()
        obj = ev.new.obj  # stored objects are never mutated in place (writers clone), so keeping it is safe
        uid = obj["metadata"]["uid"]
        rec = self.records.get(uid)
        if rec is None:
            rec = self.records[uid] = PodRecord(obj, at)
        rec.last = obj
        if rec.terminal_at is None and (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            rec.terminal_at = at
        if rec.deletion_at is None and (obj["metadata"].get("deletionTimestamp") or ev.type == "DELETED"):
            rec.deletion_at = at
        if ev.type == "DELETED":
            rec.gone_at = at

    def select(self, labels: Mapping[str, str]) -> list[PodRecord]:
        return [r for r in self.records.values()
                if all((r.last["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())]

    @staticmethod
    def final_state(rec: PodRecord) -> dict[str, Any]:
        """The pod's last state; if it vanished with a container not terminated, that container ends then."""
        pod = rec.last
        if rec.gone_at is None:
            return pod
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if all((s.get("state") or {}).get("terminated") for s in statuses):
            return pod
        end = datetime.fromtimestamp(rec.gone_at / MICROS, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        closed = []
        for s in statuses:
            state = s.get("state") or {}
            if state.get("terminated"):
                closed.append(s)
                continue
            started = (state.get("running") or {}).get("startedAt")
            closed.append({**s, "state": {"terminated": {"startedAt": started, "finishedAt": end, "exitCode": 137,
                                                         "reason": "DeletedWhileRunning"}}
                           if started else state})
        return {**pod, "status": {**pod["status"], "containerStatuses": closed}}

    precise_kills: bool = False
    """Truth ends a pod killed by its (grace-0) deletion at the store's microsecond instant of that deletion
    instead of its finishedAt, which Kubernetes truncates to the second (so it can precede the deletion that
    killed the pod). Set by scenarios whose operator ends such pods from its own clock (Evict)."""

    def truth(self, labels: Mapping[str, str], at: int, resource: str = GPU) -> Fraction:
        """Exact GPU-hours of the selected pods (deleted ones included) up to instant `at` (µs)."""
        states = [self.killed_state(r) if self.precise_kills else self.final_state(r) for r in self.select(labels)]
        return truth(states, resource, at)

    @classmethod
    def killed_state(cls, rec: PodRecord) -> dict[str, Any]:
        """`final_state`, with containers that ended in the second of the pod's deletion ending at it (µs)."""
        pod = cls.final_state(rec)
        if rec.deletion_at is None:
            return pod
        killed = datetime.fromtimestamp(rec.deletion_at / MICROS, UTC)
        stamp = killed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        second = killed.strftime("%Y-%m-%dT%H:%M:%SZ")
        out = []
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (c.get("state") or {}).get("terminated")
            if term and term.get("finishedAt") == second:
                c = {**c, "state": {"terminated": {**term, "finishedAt": stamp}}}
            out.append(c)
        return {**pod, "status": {**pod["status"], "containerStatuses": out}}


def set_labels(scenario: str, name: str) -> dict[str, str]:
    """The labels of the pods of one of a scenario's pod sets, which the set's budget selects; a new dict each time,
    since a pod body holds the very dict it is given."""
    return {"chaos": scenario, "set": name}


def gpu_seconds(rec: PodRecord, resource: str = GPU) -> Fraction:
    """A finished pod's whole usage (GPU-seconds) from its container timestamps."""
    return truth([PodLog.final_state(rec)], resource, now_us()) * 3600


# ---------------------------------------------------------------------------------------------- the rig


@dataclass
class Chaos(OnHarness):
    log: PodLog
    injected: list[str] = field(default_factory=list)

    def budget_obj(self, name: str) -> dict[str, Any]:
        """The budget as the store holds it (in-process: unaffected by faults injected into HTTP requests)."""
        obj = self.cluster.access.get(BUDGETS, NS, name)
        if obj is None:
            raise LookupError(f"budget {NS}/{name} is gone")
        return obj

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.budget_obj(name).get("status") or {})

    async def create_budget(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        await self.rig.request("POST", BUDGETS_PATH, body)

        async def accounted() -> bool:
            return bool(self.status(name).get("computedAt"))

        await until(f"budget {name}'s first status", accounted, 30)

    async def create_pod(self, body: dict[str, Any]) -> None:
        """In-process, as bench/budget_accuracy.py's scale run does: faults injected into HTTP requests are the
        operator's to face, not the scenario driver's."""
        await self.cluster.access.create(PODS, NS, body)

    async def create_job(self, body: dict[str, Any]) -> None:
        await self.cluster.access.create(JOBS, NS, body)

    def events(self, reason: str, name: str | None = None) -> int:
        """Events of NS with this reason (about object `name`, if given), their counts summed."""
        return sum(int(e.get("count") or 1) for e in self.cluster.access.iter(EVENTS, NS)
                   if e.get("reason") == reason and (name is None or e["involvedObject"].get("name") == name))

    async def metrics(self) -> str:
        text, _, _ = await self.rig.scrape()
        return text


@contextlib.asynccontextmanager
async def open_rig(name: str, gpus: int, *, seed: int, log_level: str = "WARNING") -> AsyncIterator[Chaos]:
    """An emulated cluster with room for `gpus` 1-GPU pods (A100 nodes of 8, one spare), Events on, kubelet
    start latency 0.5 s (as the accuracy bench), the CRDs installed and `gpuops run --controllers budget`."""
    nodes = -(-gpus // 8) + 1
    sc = scenario(name, nodes, namespaces=[NS], events=True, start_latency=0.5)
    cluster = SimCluster(sc, workload=False, faults=False)
    cluster.server.faults = Faults(seed)  # the injector's draws follow --seed
    log = PodLog(cluster)
    with tempfile.TemporaryDirectory() as tmp:
        async with OperatorHarness(cluster, Path(tmp), crds=CRDS, log_level=log_level) as rig:
            yield Chaos(rig, log)


# ---------------------------------------------------------------------------------------------- snapshots


def ratio(reported: Fraction, truth_value: Fraction) -> float:
    if truth_value == 0:
        return 1.0 if reported == 0 else float("inf")
    return round(float(reported / truth_value), 6)


def accuracy_ok(*values: float) -> bool:
    return all(float(TARGET) <= v <= 2 - float(TARGET) for v in values)


def snapshot_ok(snap: Mapping[str, Any]) -> bool:
    """Status exact at computedAt and metric exact at the counting instant (whole second) of some instant of its
    scrape, both to 0.999..1.001: never below 0.999 of the truth, and above 1.001 only by what the budget itself
    states it may over-count (status.ledger.errorBoundGpuHours: seconds counted before a pod's finish reached the
    operator, which a reported figure does not take back).

    The metric's instant is only known to lie inside the scrape's HTTP request; when the request straddles a
    second, the midpoint's second (reported as accuracy_metric) can be the wrong one by running GPUs x 1 s.
    accuracy_metric_in_window is 1 when the metric equals the truth at the counting instant of some instant of
    the request, else its ratio to the nearer end."""
    low, high = float(TARGET), 2 - float(TARGET)
    return (low <= snap["accuracy_status"] and snap["accuracy_status_less_bound"] <= high
            and low <= snap["accuracy_metric_in_window"] and snap["accuracy_metric_in_window_less_bound"] <= high)


def window_accuracy(metric: Fraction | None, lo: Fraction, hi: Fraction) -> float:
    """The operator evaluates the metric at an instant inside the scrape's HTTP request, whose truth lies in
    [lo, hi]: 1 inside that range, else the ratio to its nearer end (0 for a missing series)."""
    if metric is None:
        return 0.0
    return 1.0 if lo <= metric <= hi else ratio(metric, lo if metric < lo else hi)


def metric_gpu_hours(text: str, name: str) -> Fraction | None:
    """Budget `name`'s scraped METRIC in GPU-hours: the exact quotient of the float GPU-seconds by 3600."""
    value = metric_value(text, METRIC, {"namespace": NS, "name": name})
    return Fraction(value) / 3600 if value is not None else None


async def snapshot(chaos: Chaos, name: str, labels: Mapping[str, str], origin_us: int) -> dict[str, Any]:
    """The budget's status (at its computedAt) and its metric (at the scrape's midpoint) against the truth."""
    text, s0, s1 = await chaos.rig.scrape()
    st = chaos.status(name)
    taken = now_us()
    computed = micros(st["computedAt"])
    status = Fraction(st["consumedGpuHours"])
    # figures are counted at whole seconds (gpuops.accounting.reporting): computedAt is one, and the metric is
    # the figure at the counting instant of its scrape, which lies inside the request
    t_status, t_metric = chaos.log.truth(labels, computed), chaos.log.truth(labels, counting_instant((s0 + s1) // 2))
    lo, hi = chaos.log.truth(labels, counting_instant(s0)), chaos.log.truth(labels, counting_instant(s1))
    metric = metric_gpu_hours(text, name)
    in_window = window_accuracy(metric, lo, hi)
    bound = Fraction((st.get("ledger") or {}).get("errorBoundGpuHours") or "0")
    return {
        "offset_seconds": round((taken - origin_us) / MICROS, 3),
        "status_gpu_hours": str(status), "truth_status_gpu_hours": float(t_status),
        "accuracy_status": ratio(status, t_status),
        "error_bound_gpu_hours": str(bound),
        "accuracy_status_less_bound": ratio(status - bound, t_status),
        "accuracy_metric_in_window_less_bound": window_accuracy(metric - bound if metric is not None else None,
                                                                lo, hi),
        "delta_gpu_seconds_status": round(float((status - t_status) * 3600), 3),
        "metric_gpu_hours": float(metric) if metric is not None else None, "truth_metric_gpu_hours": float(t_metric),
        # a missing series (no reconcile since a restart) is an accuracy of 0, not a crash
        "accuracy_metric": ratio(metric, t_metric) if metric is not None else 0.0,
        "accuracy_metric_in_window": in_window,
        "scrape_window_gpu_seconds": round(float((hi - lo) * 3600), 4),
        "delta_gpu_seconds_metric": round(float((metric - t_metric) * 3600), 3) if metric is not None else None,
        "staleness_seconds": round((taken - computed) / MICROS, 3),
        "scrape_window_ms": round((s1 - s0) / 1000, 2),
    }
