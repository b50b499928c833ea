"""Scenarios: a YAML description of an emulated cluster, the workload it runs and the faults it suffers.

A scenario is data, not code, so users, tests, benchmarks and chaos runs describe clusters the same way and
a bad file fails with the path of the bad field (`$.nodeGroups[0].count`) before anything starts. Named
scenarios ship in `sim/gpuops_sim/scenarios/`; `load("demo")` or `load("path/to/file.yaml")`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from . import gpus


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file, the field and the fix."""


class _Spec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    pass


# ------------------------------------------------------------------------------------------ cluster


class NodeGroup(_Spec, kw_only=True):
    """`count` machines named `<name>-<i>`; the last `powered_off` of them start powered off."""

    name: str
    count: int = 1
    gpu_model: str | None = None
    gpus_per_node: int = 0
    cpu: str = "64"
    memory: str = "512Gi"
    max_pods: int = 110
    powered_off: int = 0
    labels: dict[str, str] = {}
    taints: list[dict[str, Any]] = []
    boot_seconds: float = 30.0
    device_plugin_seconds: float = 5.0
    shutdown_seconds: float = 5.0


class InstanceTypeSpec(_Spec, kw_only=True):
    name: str
    gpu_model: str | None = None
    gpus: int = 0
    cpu: str = "64"
    memory: str = "512Gi"
    capacity: int | None = None


class CloudSpec(_Spec, kw_only=True):
    launch_seconds: float = 5.0
    boot_seconds: float = 10.0
    device_plugin_seconds: float = 2.0
    terminate_seconds: float = 2.0
    reclaim_notice_seconds: float = 120.0
    notice_poll_seconds: float = 5.0  # the node agent's metadata poll: a notice reaches the Node within this
    instance_types: list[InstanceTypeSpec] = []


class KubeletSpec(_Spec, kw_only=True):
    start_latency_seconds: float = 1.0
    lease_seconds: float = 10.0
    node_status_seconds: float = 60.0
    events: bool = True


class SchedulerSpec(_Spec, kw_only=True):
    scoring: Literal["LeastAllocated", "MostAllocated"] = "MostAllocated"
    events: bool = True


class NodeLifecycleSpec(_Spec, kw_only=True):
    node_monitor_grace_seconds: float = 40.0
    pod_gc_orphan_seconds: float = 40.0


class APIServerSpec(_Spec, kw_only=True):
    terminated_pod_gc_threshold: int | None = None
    history_size: int = 100_000


# ------------------------------------------------------------------------------------------ workload


class Exponential(_Spec, kw_only=True):
    mean: float


class Uniform(_Spec, kw_only=True):
    low: float
    high: float


class Choice(_Spec, kw_only=True):
    values: list[float]
    weights: list[float] | None = None


class Distribution(_Spec, kw_only=True):
    """Exactly one of: a fixed value, exponential(mean), uniform(low, high), or a weighted choice."""

    value: float | None = None
    exponential: Exponential | None = None
    uniform: Uniform | None = None
    choice: Choice | None = None


Number = float | Distribution


class Arrival(_Spec, kw_only=True):
    """Exactly one of: `every` seconds, Poisson with `per_minute`, or explicit offsets `at`."""

    every: float | None = None
    per_minute: float | None = None
    at: list[float] | None = None


class WorkloadSpec(_Spec, kw_only=True):
    """A stream of bare Pods or Jobs. Runtimes and GPU counts are drawn per arrival; `count` caps arrivals."""

    name: str
    namespace: str = "default"
    kind: Literal["Pod", "Job"] = "Pod"
    arrival: Arrival
    count: int | None = None
    start_seconds: float = 0.0
    stop_seconds: float | None = None
    gpus: Number = 1.0
    runtime_seconds: Number | None = None  # None: runs until deleted
    failure_rate: float = 0.0
    cpu: str = "1"
    memory: str = "4Gi"
    resources: dict[str, str] = {}  # extra requests, e.g. {"nvidia.com/mig-1g.10gb": "1"}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    priority_class_name: str | None = None
    parallelism: int = 1
    completions: int | None = None
    ttl_seconds_after_finished: int | None = None


# ------------------------------------------------------------------------------------------ faults

FaultAction = Literal[
    "power-off", "power-on", "reclaim-spot", "apiserver-outage", "drop-watches", "delete-node", "cordon"
]


class Fault(_Spec, kw_only=True):
    at: float
    action: FaultAction
    target: str | None = None  # a machine name, a node group, or a spot tag `key=value`
    count: int = 1
    seconds: float = 10.0


# ------------------------------------------------------------------------------------------ scenario


class Scenario(_Spec, kw_only=True):
    name: str
    description: str = ""
    seed: int = 1
    namespaces: list[str] = []
    node_groups: list[NodeGroup] = []
    cloud: CloudSpec = msgspec.field(default_factory=CloudSpec)
    kubelet: KubeletSpec = msgspec.field(default_factory=KubeletSpec)
    scheduler: SchedulerSpec = msgspec.field(default_factory=SchedulerSpec)
    node_lifecycle: NodeLifecycleSpec = msgspec.field(default_factory=NodeLifecycleSpec)
    apiserver: APIServerSpec = msgspec.field(default_factory=APIServerSpec)
    workload: list[WorkloadSpec] = []
    faults: list[Fault] = []
    # Objects created at start, after the namespaces and CRDs (e.g. GPUWorkloadBudgets for the demo); "${SIM_CLOUD_URL}"
    # in their strings becomes the emulated cloud's URL (GPUNodeGroup webhooks at its power API).
    objects: list[dict[str, Any]] = []


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_distribution(d: Number | None, where: str) -> None:
    if d is None or isinstance(d, float | int):
        if isinstance(d, float | int) and d < 0:
            raise ScenarioError(f"{where}: must be >= 0, got {d}")
        return
    set_ = [k for k in ("value", "exponential", "uniform", "choice") if getattr(d, k) is not None]
    if len(set_) != 1:
        raise ScenarioError(f"{where}: give exactly one of value, exponential, uniform, choice (got {set_ or 'none'})")
    if d.uniform is not None and not 0 <= d.uniform.low <= d.uniform.high:
        raise ScenarioError(f"{where}.uniform: need 0 <= low <= high")
    if d.exponential is not None and d.exponential.mean <= 0:
        raise ScenarioError(f"{where}.exponential.mean: must be > 0")
    if d.choice is not None:
        if not d.choice.values:
            raise ScenarioError(f"{where}.choice.values: must not be empty")
        if d.choice.weights is not None and len(d.choice.weights) != len(d.choice.values):
            raise ScenarioError(f"{where}.choice.weights: need one weight per value")


def validate(sc: Scenario, source: str = "scenario") -> Scenario:
    """Checks msgspec's types cannot express; every message names the field."""
    names: set[str] = set()
    for i, g in enumerate(sc.node_groups):
        where = f"{source}: nodeGroups[{i}] ({g.name})"
        if not _DNS_LABEL.match(g.name):
            raise ScenarioError(f"{where}.name: must be a DNS label (lowercase letters, digits, '-')")
        if g.name in names:
            raise ScenarioError(f"{where}.name: duplicate node group name")
        names.add(g.name)
        if g.count < 0 or not 0 <= g.powered_off <= g.count:
            raise ScenarioError(f"{where}: need count >= 0 and 0 <= poweredOff <= count")
        if g.gpu_model is not None:
            try:
                gpus.model(g.gpu_model)
            except ValueError as e:
                raise ScenarioError(f"{where}.gpuModel: {e}") from None
            if g.gpus_per_node <= 0:
                raise ScenarioError(f"{where}.gpusPerNode: must be > 0 when gpuModel is set")
        elif g.gpus_per_node:
            raise ScenarioError(f"{where}.gpuModel: required when gpusPerNode > 0")
    for i, t in enumerate(sc.cloud.instance_types):
        if t.gpu_model is not None:
            try:
                gpus.model(t.gpu_model)
            except ValueError as e:
                raise ScenarioError(f"{source}: cloud.instanceTypes[{i}].gpuModel: {e}") from None
    for i, w in enumerate(sc.workload):
        where = f"{source}: workload[{i}] ({w.name})"
        a = w.arrival
        given = [k for k in ("every", "per_minute", "at") if getattr(a, k) is not None]
        if len(given) != 1:
            raise ScenarioError(f"{where}.arrival: give exactly one of every, perMinute, at")
        if (a.every is not None and a.every <= 0) or (a.per_minute is not None and a.per_minute <= 0):
            raise ScenarioError(f"{where}.arrival: the rate must be > 0")
        _check_distribution(w.gpus, f"{where}.gpus")
        _check_distribution(w.runtime_seconds, f"{where}.runtimeSeconds")
        if not 0.0 <= w.failure_rate <= 1.0:
            raise ScenarioError(f"{where}.failureRate: must be within [0, 1]")
        if w.namespace not in sc.namespaces and w.namespace != "default":
            raise ScenarioError(f"{where}.namespace: {w.namespace!r} is not listed in namespaces")
    return sc


def parse(data: Any, source: str = "scenario") -> Scenario:
    try:
        sc = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as e:
        raise ScenarioError(f"{source}: {e}") from None
    return validate(sc, source)


def builtin_names() -> list[str]:
    folder = resources.files("gpuops_sim") / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str) -> Scenario:
    """A shipped scenario by name, or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise ScenarioError(f"cannot read scenario file {path}: {e.strerror}") from None
        source = str(path)
    else:
        res = resources.files("gpuops_sim") / "scenarios" / f"{name_or_path}.yaml"
        if not res.is_file():
            raise ScenarioError(
                f"no scenario named {name_or_path!r}; shipped: {', '.join(builtin_names())} (or give a .yaml path)"
            )
        text = res.read_text()
        source = f"scenario {name_or_path}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{source}: not valid YAML: {e}") from None
    return parse(data, source)
