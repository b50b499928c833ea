"""Every failure class of the MIG slicer that leaves a pod waiting, seen in the four places an on-call engineer
looks: the pod's gpuops.io/MigSlices condition (with a specific reason), a Warning Event on the pod, a
`gpuops_migslicer_*` series on /metrics, and a JSON log line carrying the pod's key. The operator is a real
`gpuops run --controllers migslicer` process against the emulated cluster; each MIG node's agent report (its
MigNode, as `gpuops agent` writes it) is written here with the state of the class: MIG mode off, a mode change
waiting for a GPU reset, a GPU model without MIG tables, a heartbeat ten minutes old; the last class asks for a
profile no GPU offers. Each pod is pinned to its own node (nodeSelector), so its wait has exactly one cause. The
expected sightings are tests/failure_matrix.py's rows, which the README's "What you see when ..." table is
generated from.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from failure_matrix import MIGSLICER, Seen, log_lines, still_missing
from waiting import until

from gpuops.controllers.migslicer.api import GATE, OUR_PREFIX
from gpuops_sim.apiserver.objects import rfc3339
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value
from gpuops_sim.migfarm import CLAIMS, MIG_NODES, gpu_uuids
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
CRDS = [ROOT / "manifests" / "crds" / f"{name}.gpuops.io.yaml" for name in ("mignodes", "allocationclaims")]
NS = "ml"
CASES = list(MIGSLICER)
TAINT = {"key": "gpuops.io/mig", "value": "true", "effect": "NoSchedule"}
SCENARIO = {
    "name": "mig-failures",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "m", "gpuModel": "A100-80GB", "gpusPerNode": 1, "count": len(CASES),
                    "taints": [TAINT], "bootSeconds": 0.05, "devicePluginSeconds": 0.05}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def report(node: str, case: str, now: datetime) -> dict[str, Any]:
    """The node agent's MigNode status for `case`."""
    mode = {"mig-disabled": "Disabled", "reset-pending": "Pending"}.get(case, "Enabled")
    model = "" if case == "unknown-model" else "A100-80GB"
    beat = now - timedelta(minutes=10) if case == "agent-silent" else now
    return {"backend": "emulated", "agentVersion": "test", "heartbeat": rfc3339(beat),
            "gpus": [{"index": 0, "uuid": gpu_uuids(node, 1)[0], "model": model, "product": "NVIDIA-X",
                      "memoryMiB": 81920, "migMode": mode, "slices": []}]}


def mig_pod(name: str, node: str, profile: str) -> dict[str, Any]:
    """As the slicer's webhook leaves a MIG pod: our resource, gated; pinned to `node`."""
    res = {OUR_PREFIX + profile: "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"restartPolicy": "Never", "schedulingGates": [{"name": GATE}],
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": dict(res), "requests": dict(res)}}]}}


async def make_slice_never_offer_it(rig: OperatorHarness, access: Any, node: str) -> None:
    """Play an agent whose device plugin never registered with the kubelet: it makes the slice of the node's claim
    (Created, with a device UUID) but never sets `advertised`."""
    async def claim() -> dict[str, Any] | None:
        items = (await rig.request("GET", f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/allocationclaims"))["items"]
        return next((c for c in items if c["spec"]["nodeName"] == node), None)

    made = await until(f"a claim on {node}", claim)

    async def pending() -> dict[str, Any] | None:  # the allocator writes the phase (no blank PHASE column)
        c = await rig.request("GET", f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/allocationclaims/"
                                     f"{made['metadata']['name']}")
        status = c.get("status") or {}
        return c if status.get("phase") == "Pending" and status.get("message", "").startswith(
            f"waiting for the node agent on {node} to make the slice") else None

    await until(f"the claim on {node} Pending, saying whom it waits for", pending)
    await access.patch(CLAIMS, NS, made["metadata"]["name"], {"status": {
        "phase": "Created", "deviceUUID": "MIG-00000000-0000-0000-0000-000000000001",
        "createdAt": rfc3339(access.now()), "message": "made"}}, "status")


def metric_shown(text: str, seen: Seen, node: str) -> bool:
    series, _, rest = seen.metric.partition("{")
    if not rest:  # "name > 120": the node's sample
        name, _, bound = seen.metric.partition(" > ")
        return (metric_value(text, name, {"node": node}) or 0) > float(bound)
    label, _, value = rest.split("}")[0].partition("=")
    labels = {label: value.strip('"')}
    if seen.metric.endswith(" 1"):
        return metric_value(text, series, {**labels, "node": node}) == 1
    return (metric_value(text, series, labels) or 0) > 0


async def test_every_mig_wait_shows_its_cause_as_condition_event_metric_and_log(tmp_path: Path) -> None:
    cluster = SimCluster(parse(SCENARIO), workload=False)
    async with OperatorHarness(cluster, tmp_path, crds=CRDS, controllers=["migslicer"], log_level="INFO",
                               extra_args=["--mig-webhook-port", "0", "--mig-advertise-timeout", "2"]) as rig:
        access = cluster.access
        failed = []
        for i, (case, seen) in enumerate(MIGSLICER.items()):
            node, pod = f"m-{i}", f"waits-{case}"
            began = time.monotonic()
            if case != "no-agent":
                await access.create(MIG_NODES, "", {"apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode",
                                                    "metadata": {"name": node}, "spec": {"nodeName": node}})
                await access.patch(MIG_NODES, "", node, {"status": report(node, case, access.now())}, "status")
            await rig.request("POST", f"/api/v1/namespaces/{NS}/pods",
                              mig_pod(pod, node, "9g.99gb" if case == "unsatisfiable" else "3g.40gb"))
            if case == "not-advertised":
                await make_slice_never_offer_it(rig, access, node)
            if case == "report-refused":  # a second report of the node's GPU (named for no node: affects no other)
                await access.create(MIG_NODES, "", {"apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode",
                                                    "metadata": {"name": "twin"}, "spec": {"nodeName": "twin"}})
                await access.patch(MIG_NODES, "", "twin", {"status": report(node, case, access.now())}, "status")
            reason = seen.condition.split("(")[1].split(")")[0]
            async def probe(pod: str = pod, node: str = node, seen: Seen = seen, reason: str = reason) -> str:
                missing = []
                obj = await rig.request("GET", f"/api/v1/namespaces/{NS}/pods/{pod}")
                have = {c["type"]: (c["status"], c.get("reason")) for c in obj["status"].get("conditions") or ()}
                if have.get("gpuops.io/MigSlices") != ("False", reason):
                    missing.append(f"conditions {have}")
                said = " ".join(c.get("message", "") for c in obj["status"].get("conditions") or ())
                if "(0 " in said or "; 0 " in said:  # a cause counted zero times is no cause
                    missing.append(f"a message without zero counts: {said!r}")
                events = (await rig.request("GET", f"/api/v1/namespaces/{NS}/events"))["items"]
                if not any(e["involvedObject"].get("name") == pod and e["reason"] == seen.event for e in events):
                    missing.append(f"a Warning Event {seen.event}")
                text, _, _ = await rig.scrape()
                if not metric_shown(text, seen, node):
                    missing.append(seen.metric)
                if not any(r.get("event") == seen.log and r.get("pod") == f"{NS}/{pod}" and r.get("reason") == reason
                           and r.get("level") == "warning" for r in log_lines(rig.log_path)):
                    missing.append(f"a warning log line {seen.log!r} with pod={NS}/{pod} reason={reason}")
                return "; ".join(missing)

            missing = await still_missing(f"{case} shown in the four places", probe)
            if missing:
                failed.append(f"{case}: missing {missing}")
            print(f"{case}: {time.monotonic() - began:.1f} s")
        assert not failed, "\n".join(failed)
