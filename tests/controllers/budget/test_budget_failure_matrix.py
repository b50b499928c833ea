"""The budget controller's failure classes, seen in the four places an on-call engineer looks: the budget's
Degraded condition (with its reason), a Warning Event on the budget, `gpuops_budget_enforcement_actions_total` on
/metrics, and a JSON log line carrying the budget's key. The operator is a real `gpuops run --controllers budget`
process against the emulated cluster; an Evict budget goes over quota at once, and its eviction meets a
PodDisruptionBudget that allows none, or the API server's injected 500. A budget's spec cannot be the cause:
admission refuses every spec the controller would (tests/admission). The expected sightings are
tests/failure_matrix.py's rows, which the README's "What you see when ..." table is generated from.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from failure_matrix import BUDGET, Seen, conditions, expected_conditions, log_lines, still_missing
from waiting import until

from gpuops_sim.budget_workload import budget, pod
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "gpuworkloadbudgets.gpuops.io.yaml"
PRICE_CRD = ROOT / "manifests" / "crds" / "gpupricelists.gpuops.io.yaml"
NS = "team"
BUDGETS_PATH = f"/apis/gpuops.io/v1alpha1/namespaces/{NS}/gpuworkloadbudgets"
SCENARIO = {
    "name": "budget-failures",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "cpu", "count": 1, "cpu": "8", "memory": "32Gi"}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def induce(rig: OperatorHarness, case: str) -> dict[str, Any]:
    """The case's running pod (and its PDB, or the eviction fault); returns the Evict budget to create."""
    labels = {"case": case}
    await rig.request("POST", f"/api/v1/namespaces/{NS}/pods", pod(f"hog-{case}", labels, "cpu", "100m", 100_000))

    async def running() -> bool:
        p = await rig.request("GET", f"/api/v1/namespaces/{NS}/pods/hog-{case}")
        return (p.get("status") or {}).get("phase") == "Running"

    await until(f"hog-{case} running", running, 20)
    if case == "pdb-blocked":
        await rig.request("POST", f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": f"keep-{case}"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})
    else:  # the eviction (a create on pods/eviction) fails; the test made its pods already
        rig.cluster.server.faults.add_error(500, verbs=["create"], resources=["pods"])
    return budget(f"b-{case}", labels, "cpu", quota="0.000001", action="Evict", delay=0)


async def test_every_budget_failure_shows_as_condition_event_metric_and_log(tmp_path: Path) -> None:
    cluster = SimCluster(parse(SCENARIO), workload=False)
    async with OperatorHarness(cluster, tmp_path, crds=[CRD, PRICE_CRD], controllers=["budget"],
                               log_level="INFO") as rig:
        failed = []
        for case, seen in BUDGET.items():
            name = f"b-{case}"
            began = time.monotonic()
            await rig.request("POST", BUDGETS_PATH, await induce(rig, case))
            async def probe(name: str = name, seen: Seen = seen) -> str:
                missing = []
                have = conditions(await rig.request("GET", f"{BUDGETS_PATH}/{name}"))
                if any(have.get(k) != v for k, v in expected_conditions(seen).items()):
                    missing.append(f"conditions {have}")
                events = (await rig.request("GET", f"/api/v1/namespaces/{NS}/events"))["items"]
                if not any(e["involvedObject"].get("name") == name and e["reason"] == seen.event
                           and e["type"] == "Warning" for e in events):
                    missing.append(f"a Warning Event {seen.event}")
                series, _, rest = seen.metric.partition("{")
                labels = {k: v.strip('"') for k, v in (kv.split("=") for kv in rest.rstrip("}").split(","))}
                text, _, _ = await rig.scrape()
                if not (metric_value(text, series, {**labels, "namespace": NS, "name": name}) or 0) > 0:
                    missing.append(seen.metric)
                if not any(r.get("event") == seen.log and r.get("key") == f"{NS}/{name}"
                           and r.get("level") == "warning" for r in log_lines(rig.log_path)):
                    missing.append(f"a warning log line {seen.log!r} with key={NS}/{name}")
                return "; ".join(missing)

            missing = await still_missing(f"{case} shown in the four places", probe)
            if missing:
                failed.append(f"{case}: missing {missing}")
            print(f"{case}: {time.monotonic() - began:.1f} s")
        assert not failed, "\n".join(failed)
