"""Any GPUNodeGroup the CRD schema admits is handled: hypothesis draws specs from the schema (see
schema_strategies.py), the API server admits or refuses each, and the autoprovision controller, running on the
emulated cluster with GPU work pending (so its planner decides power-ons), reconciles every admitted group
without raising, without a hot loop, and with a Ready condition for its generation that names a reason (and an
Event) when it is not Ready. Groups named after real machines and with reachable, refusing and unresolvable
webhooks are mixed in; the other groups keep being planned."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, reject
from hypothesis import strategies as st
from live_controller import ANY_ADMITTED, Expect, Live, handles_admitted
from schema_strategies import for_schema

from gpuops.controllers.autoprovision.api import GROUPS
from gpuops.controllers.autoprovision.settings import Settings
from gpuops.controllers.autoprovision.setup import install
from gpuops.kube import conditions as cond
from gpuops.kube.manager import Manager
from gpuops.kube.resources import PODS
from gpuops_sim.cluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[3]
SPEC = yaml.safe_load((ROOT / "manifests/crds/gpunodegroups.gpuops.io.yaml").read_text())[
    "spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
NS = "work"
SCENARIO = {
    "name": "autoprovision-any",
    "namespaces": [NS],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "nodeGroups": [
        {"name": "small", "gpuModel": "A100-80GB", "gpusPerNode": 2, "count": 2, "poweredOff": 2,
         "bootSeconds": 0.4, "devicePluginSeconds": 0.2, "shutdownSeconds": 0.2},
    ],
}
MACHINES = ["small-0", "small-1"]
NAMES = itertools.count()
URL = "spec.scale{}.url"


def _install(manager: Manager, _cluster: SimCluster) -> Any:
    return install(manager, settings=Settings(drain_recheck=0.2, off_recheck=0.2), env={})


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A `neighbour` group manages small-0 throughout (drawn groups naming it must wait their turn, and leave it
    be), and a 3-GPU pod no machine here can hold stays pending (demand the planner decides on every time)."""
    with Live(tmp_path_factory.mktemp("autoprovision-any"), SCENARIO, ["gpunodegroups"], [GROUPS], _install) as lv:
        cloud = lv.cluster.cloud.url
        neighbour = {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "neighbour"},
                     "spec": {"nodeName": MACHINES[0], "gpuCount": 2,
                              "scaleUp": {"url": f"{cloud}/power/v1/machines/{MACHINES[0]}/start"},
                              "scaleDown": {"url": f"{cloud}/power/v1/machines/{MACHINES[0]}/stop"}}}
        pending = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting"},
                   "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [{"name": "main", "image": "cuda",
                                            "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}
        lv.run(lv.client.create(GROUPS, neighbour))
        lv.run(lv.client.create(PODS, pending, NS))
        yield lv

        async def neighbour_managed() -> bool:
            g = await lv.client.get(GROUPS, "neighbour")
            ready = cond.get_condition(g.status.conditions, "Ready")
            return ready is None or ready.reason != "NodeClaimed"

        assert lv.run(neighbour_managed()), "a later group took small-0 from the group created first"


def _specs(cloud: str) -> st.SearchStrategy[Any]:
    """Schema-drawn specs; node names and webhook URLs also from this cluster (a URL drawn from the schema
    alone would name a host that might resolve)."""
    urls = st.sampled_from([
        f"{cloud}/power/v1/machines/{{m}}/{{d}}", "http://127.0.0.1:9/refused", "https://no-such-host.invalid/x",
        f"{cloud}/no-such-path",
    ])
    node = st.one_of(st.sampled_from(MACHINES), for_schema(SPEC["properties"]["nodeName"], "spec.nodeName"))
    return st.fixed_dictionaries({"up": urls, "down": urls, "node": node}).flatmap(
        lambda x: for_schema(SPEC, "spec", {
            "spec.nodeName": st.just(x["node"]),
            "spec.scaleUp.url": st.just(x["up"].format(m=x["node"], d="start")),
            "spec.scaleDown.url": st.just(x["down"].format(m=x["node"], d="stop")),
        }))


@pytest.fixture(scope="module")
def cloud_url(live: Live) -> str:
    return str(live.cluster.cloud.url)


@ANY_ADMITTED
@given(data=st.data())
def test_any_admitted_group_is_reconciled_without_raising_or_looping(
    live: Live, cloud_url: str, data: st.DataObject,
) -> None:
    spec = data.draw(_specs(cloud_url), label="spec")
    body = {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup",
            "metadata": {"name": f"any-{next(NAMES)}"}, "spec": spec}
    admitted = live.run(handles_admitted(live, GROUPS, body, None, Expect()))
    event("admitted" if admitted else "refused")
    if not admitted:
        reject()
