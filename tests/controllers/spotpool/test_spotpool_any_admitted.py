"""Any SpotPool the CRD schema admits is handled: hypothesis draws specs from the schema (see
schema_strategies.py), the API server admits or refuses each, and the spot pool controller, running on the
emulated cluster, reconciles every admitted pool without raising, without a hot loop, and with a Ready condition
for its generation that names a reason (and an Event) when the pool is not Ready.

Endpoints come from this machine (the emulated cloud, a closed port, an unresolvable name): a host drawn from
the schema alone, or the public endpoint a pool without one uses, would reach out. Credentials name a Secret
with every provider's keys, one without them, or none at all; sizes stay small (an admitted maximum of 10,000
would make the emulated cloud launch that many instances)."""

from __future__ import annotations

import base64
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

from gpuops.controllers.spotpool.api import POOLS
from gpuops.controllers.spotpool.settings import Settings
from gpuops.controllers.spotpool.setup import install
from gpuops.kube.manager import Manager
from gpuops.kube.resources import SECRETS
from gpuops_sim.cluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[3]
SPEC = yaml.safe_load((ROOT / "manifests/crds/spotpools.gpuops.io.yaml").read_text())[
    "spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
OPERATOR_NS = "gpuops-system"
SCENARIO = {
    "name": "spotpool-any",
    "namespaces": [OPERATOR_NS, "work"],
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.3, "nodeStatusSeconds": 5, "events": False},
    "scheduler": {"events": False},
    "cloud": {"launchSeconds": 0.1, "bootSeconds": 0.2, "devicePluginSeconds": 0.05, "terminateSeconds": 0.1,
              "instanceTypes": [{"name": "gpu.l4.1x", "gpuModel": "L4-24GB", "gpus": 1}]},
}
KEYS = {"secretId": "AKIDEXAMPLE", "secretKey": "c2VjcmV0", "accessKeyId": "AKIAEXAMPLE",
        "secretAccessKey": "wJalrXUtnFEMI", "token": "t0ken"}
NAMES = itertools.count()
EXPECT = Expect(progressing=frozenset({"InstancesNotReady"}))


def _install(manager: Manager, _cluster: SimCluster) -> Any:
    return install(manager, settings=Settings(drain_recheck=0.2, resync_seconds=2.0, retry_base=0.1,
                                              secret_recheck=0.3))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with Live(tmp_path_factory.mktemp("spotpool-any"), SCENARIO, ["spotpools"], [POOLS], _install) as lv:
        for name, data in (("creds", KEYS), ("empty", {"unrelated": "x"})):
            secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                      "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
            lv.run(lv.client.create(SECRETS, secret, OPERATOR_NS))
        yield lv


def _specs(cloud: str) -> st.SearchStrategy[Any]:
    endpoints = st.sampled_from([f"{cloud}/spot/v1", "http://127.0.0.1:9/spot/v1", "https://no-such-host.invalid/x",
                                 "127.0.0.1:9"])
    secrets = st.sampled_from([
        {"name": "creds", "namespace": OPERATOR_NS}, {"name": "empty", "namespace": OPERATOR_NS},
        {"name": "missing", "namespace": OPERATOR_NS}, {"name": "creds", "namespace": "work"},
    ])
    local = for_schema(SPEC, "spec", {
        "spec.endpoint": endpoints,
        "spec.credentialsSecretRef": secrets,
        "spec.minimum": st.integers(0, 2),
        "spec.maximum": st.one_of(st.integers(0, 3), st.just(10_000)),
        "spec.template.instanceTypes": st.lists(st.sampled_from(["gpu.l4.1x", "gpu.none.8x"]), min_size=1,
                                                max_size=2, unique=True),
    })
    # without an endpoint the tencent and aws providers call the public cloud: always one of ours here
    return st.tuples(local, endpoints).map(lambda d: {"endpoint": d[1], **d[0]})


@pytest.fixture(scope="module")
def cloud_url(live: Live) -> str:
    return str(live.cluster.cloud.url)


@ANY_ADMITTED
@given(data=st.data())
def test_any_admitted_pool_is_reconciled_without_raising_or_looping(
    live: Live, cloud_url: str, data: st.DataObject,
) -> None:
    spec = data.draw(_specs(cloud_url), label="spec")
    body = {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool",
            "metadata": {"name": f"any-{next(NAMES)}"}, "spec": spec}
    admitted = live.run(handles_admitted(live, POOLS, body, None, EXPECT))
    event("admitted" if admitted else "refused")
    if not admitted:
        reject()
