"""Every failure class of the node autoprovision controller, seen in the four places an on-call engineer looks:
the GPUNodeGroup's conditions (with their reasons), a Warning Event on the group, a `gpuops_autoprovision_*` series
on /metrics, and a JSON log line carrying the group's name (as `group`, or as the reconcile's `key`). The operator
is a real `gpuops run --controllers autoprovision` process against the emulated cluster and its power API
(`OperatorHarness`). Each class gets its own group with a pending GPU pod only that group could serve, so the
planner powers it on and the power-on webhook meets the failure: a missing Secret or key, a host that does not
resolve, a closed port, TLS to a plain-HTTP server, the power API's own answers (401 without the token it wants,
404 for a machine it does not know, injected 403/429/503 and a hang); and a group claiming a node an older group
manages. One class at a time. The expected sightings are tests/failure_matrix.py's rows, which the README's
"What you see when ..." table is generated from.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from failure_matrix import AUTOPROVISION, Seen, closed_port, conditions, expected_conditions, log_lines, still_missing
from waiting import until

from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.harness import OperatorHarness, metric_value
from gpuops_sim.scenario import parse

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "manifests" / "crds" / "gpunodegroups.gpuops.io.yaml"
GROUPS_PATH = "/apis/gpuops.io/v1alpha1/gpunodegroups"
NS = "work"
CASE_LABEL = "gpuops.io/failure-case"
SCENARIO = {
    "name": "autoprovision-failures",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [{"name": "small", "gpuModel": "A100-80GB", "gpusPerNode": 2, "count": 1, "poweredOff": 1,
                    "bootSeconds": 0.4, "devicePluginSeconds": 0.2, "shutdownSeconds": 0.2}],
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def group_body(name: str, node: str, url: str, **up: Any) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": name},
            "spec": {"nodeName": node, "gpuCount": 1, "bootTimeoutSeconds": 300,
                     "scaleUp": {"url": url, "timeoutSeconds": 1, **up}, "scaleDown": {"url": url},
                     "template": {"labels": {CASE_LABEL: name}}}}


def waiting_pod(group: str) -> dict[str, Any]:
    """A 1-GPU pod only `group`'s node could take (its template label)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"wants-{group}"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {CASE_LABEL: group},
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def induce(rig: OperatorHarness, case: str, group: str) -> list[int]:
    """Create the group (and what it needs) with `case`'s failure in place; the fault rules to remove after."""
    cloud = rig.cluster.cloud
    power = f"{cloud.url}/power/v1/machines/{group}/start"
    rules: list[int] = []
    up: dict[str, Any] = {}
    url = power
    if case == "secret-missing":
        up.update(secretRef={"name": "no-such-secret", "namespace": NS}, insecureAllowHTTP=True)
    elif case == "secret-key-missing":
        await rig.request("POST", f"/api/v1/namespaces/{NS}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other-keys"},
            "data": {"password": base64.b64encode(b"x").decode()}})
        up.update(secretRef={"name": "other-keys", "namespace": NS}, insecureAllowHTTP=True)
    elif case == "secret-not-allowed":
        up.update(secretRef={"name": "bmc-root", "namespace": "kube-system"}, insecureAllowHTTP=True)
    elif case == "plain-http-token":
        up.update(secretRef={"name": "bmc", "namespace": NS})
    elif case == "dns":
        url = "http://power-api.invalid/start"
    elif case == "refused":
        url = f"http://127.0.0.1:{closed_port()}/start"
    elif case == "tls":
        url = power.replace("http://", "https://")
    elif case == "timeout":
        rules.append(cloud.faults.add(api="power", op="start", hang=True, hang_seconds=5).id)
    elif case == "unauthorized":
        cloud.options.token = "the-token"
    elif case in ("forbidden", "throttled", "server-error"):
        status = {"forbidden": 403, "throttled": 429, "server-error": 503}[case]
        rules.append(cloud.faults.add(api="power", op="start", status=status).id)
    elif case == "node-claimed":  # an older group manages small-0 (observed by the controller); this one names it too
        await rig.request("POST", GROUPS_PATH, group_body(f"{group}-owner", "small-0", power))

        async def managing() -> bool:
            owner = await rig.request("GET", f"{GROUPS_PATH}/{group}-owner")
            return bool((owner.get("status") or {}).get("state"))

        await until("the owner group observed", managing, 30)
        await rig.request("POST", GROUPS_PATH, group_body(group, "small-0", power))
        return rules
    # not-found: the power API knows no machine of this name and answers 404
    await rig.request("POST", GROUPS_PATH, group_body(group, group, url, **up))
    await rig.request("POST", f"/api/v1/namespaces/{NS}/pods", waiting_pod(group))
    return rules


def four_places(rig: OperatorHarness, group: str, seen: Seen) -> Callable[[], Awaitable[str]]:
    """A probe: "" once the conditions, the Event, the metric and the log line all show the failure, else what
    is still missing."""
    want = expected_conditions(seen)
    series, _, labels_text = seen.metric.partition("{")
    labels = dict(kv.split("=") for kv in labels_text.split("}")[0].split(","))
    labels = {k: v.strip('"') for k, v in labels.items()}

    async def probe() -> str:
        missing = []
        have = conditions(await rig.request("GET", f"{GROUPS_PATH}/{group}"))
        if any(have.get(k) != v for k, v in want.items()):
            missing.append(f"conditions {have}")
        events = (await rig.request("GET", "/api/v1/namespaces/default/events"))["items"]
        if not any(e["involvedObject"].get("name") == group and e["reason"] == seen.event and e["type"] == "Warning"
                   for e in events):
            missing.append(f"a Warning Event {seen.event}")
        text, _, _ = await rig.scrape()
        if seen.metric.endswith(" 1"):
            if metric_value(text, series, {**labels, "group": group}) != 1:
                missing.append(seen.metric)
        elif not (metric_value(text, series, labels) or 0) > 0:
            missing.append(seen.metric)
        if not any(r.get("event") == seen.log and group in (r.get("group"), r.get("key"))
                   and r.get("level") == "warning" for r in log_lines(rig.log_path)):
            missing.append(f"a warning log line {seen.log!r} for {group}")
        return "; ".join(missing)

    return probe


async def test_every_node_group_failure_shows_as_condition_event_metric_and_log(tmp_path: Path) -> None:
    cluster = SimCluster(parse(SCENARIO), workload=False)
    # the groups name Secrets in the workload namespace: the operator is started allowing it
    async with OperatorHarness(cluster, tmp_path, crds=[CRD], controllers=["autoprovision"], log_level="INFO",
                               extra_args=["--secret-namespaces", NS]) as rig:
        failed = []
        for case, seen in AUTOPROVISION.items():
            group = f"gx-{case}"
            began = time.monotonic()
            rules = await induce(rig, case, group)
            probe = four_places(rig, group, seen)
            missing = await still_missing(f"{case} shown in the four places", probe)
            if missing:
                failed.append(f"{case}: missing {missing}")
            for rule in rules:
                rig.cluster.cloud.faults.remove(rule)
            rig.cluster.cloud.options.token = None
            if case != "node-claimed":
                await rig.request("DELETE", f"/api/v1/namespaces/{NS}/pods/wants-{group}")
            await rig.request("DELETE", f"{GROUPS_PATH}/{group}")
            print(f"{case}: {time.monotonic() - began:.1f} s")
        assert not failed, "\n".join(failed)
