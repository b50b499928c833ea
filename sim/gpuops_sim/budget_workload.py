"""Budget benchmarks' and chaos scenarios' shared pieces: the cluster, the objects, and the ground truth.

Truth is computed from the emulator's own container timestamps with exact arithmetic and none of the
controller's code (its own RFC 3339 parser, its own request sum), so a shared bug cannot hide.
"""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from typing import Any

from .apiserver.quantity import parse_quantity
from .scenario import Scenario, parse

__all__ = ["MICROS", "RUNTIME", "budget", "job", "micros", "pod", "scenario", "truth"]

MICROS = 1_000_000
RUNTIME = "sim.gpuops.io/runtime-seconds"


def scenario(name: str, nodes: int, *, namespaces: list[str], events: bool, start_latency: float,
             max_pods: int = 110, lease: float = 2.0, node_status: float = 10.0,
             history: int | None = None) -> Scenario:
    """`nodes` A100 nodes (8 GPUs, `max_pods` pods each) that boot at once; no workload, no faults."""
    doc: dict[str, Any] = {
        "name": name,
        "namespaces": namespaces,
        "kubelet": {"startLatencySeconds": start_latency, "leaseSeconds": lease, "nodeStatusSeconds": node_status,
                    "events": events},
        "scheduler": {"events": events},
        "nodeGroups": [{"name": "a100", "gpuModel": "A100-80GB", "gpusPerNode": 8, "count": nodes,
                        "maxPods": max_pods, "bootSeconds": 0.05, "devicePluginSeconds": 0.05}],
    }
    if history is not None:
        doc["apiserver"] = {"historySize": history}
    return parse(doc)


def pod(name: str, labels: dict[str, str], resource: str, amount: str, runtime: float,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod that runs `runtime` seconds on the emulated kubelet, asking for `amount` of `resource`."""
    res = {"limits": {resource: amount}}
    if resource == "cpu":
        res["requests"] = {resource: amount}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {RUNTIME: f"{runtime:g}", **(annotations or {})}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "cuda", "resources": res}],
        },
    }


def job(name: str, template: dict[str, Any], ttl: int | None) -> dict[str, Any]:
    """A one-pod batch/v1 Job running `template` (a pod from `pod`), deleted `ttl` s after it ends; with `ttl`
    None it has no ttlSecondsAfterFinished, so the Job and its finished pod stay in the API until deleted."""
    meta = template["metadata"]
    spec: dict[str, Any] = {"backoffLimit": 0, "completions": 1, "parallelism": 1,
                            "template": {"metadata": {"labels": dict(meta["labels"]),
                                                      "annotations": dict(meta["annotations"])},
                                         "spec": template["spec"]}}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": dict(meta["labels"])},
            "spec": spec}


def budget(name: str, labels: dict[str, str], resource: str, *, quota: str = "100000", action: str = "AlertOnly",
           delay: int = 60, retain: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": labels}, "gpuResourceName": resource,
                            "quota": {"gpuHours": quota, "windowHours": 1},
                            "enforcement": {"action": action, "delaySeconds": delay}}
    if retain:
        spec["accounting"] = {"retainFinishedPods": True}
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget", "metadata": {"name": name},
            "spec": spec}


def micros(text: str) -> int:
    """RFC 3339 -> integer microseconds since the epoch (independent of the controller's parser)."""
    d = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(d.timestamp()) * MICROS + d.microsecond


def truth(pods: list[dict[str, Any]], resource: str, at: int) -> Fraction:
    """GPU-hours used by `pods` up to instant `at` (µs), from their container timestamps alone.

    Pods whose containers never started count 0; a container still running (or a pod deleted while running,
    given as its last known state) counts up to `at`.
    """
    total = Fraction(0)
    for p in pods:
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        starts, ends, done = [], [], bool(statuses)
        for s in statuses:
            state = s.get("state") or {}
            run, term = state.get("running") or {}, state.get("terminated") or {}
            if run.get("startedAt"):
                starts.append(micros(run["startedAt"]))
            if term.get("startedAt"):
                starts.append(micros(term["startedAt"]))
            if term.get("finishedAt"):
                ends.append(micros(term["finishedAt"]))
            else:
                done = False
        if not starts:
            continue
        start = min(starts)
        end = min(max(ends), at) if done and ends else at
        if end > start:
            amount = sum(parse_quantity(c["resources"]["limits"][resource]) for c in p["spec"]["containers"])
            total += amount * Fraction(end - start, 3600 * MICROS)
    return total
