"""SpotPool's CRD against the emulator (defaults, CEL rules that name the field, the sample) and `check_spec`
for objects that predate the rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from waiting import emulator_with_crds

from gpuops.controllers.spotpool.api import POOLS, PoolSpec, SpecError, SpotPool, check_spec
from gpuops.kube.client import Client
from gpuops.kube.errors import Invalid

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "manifests" / "samples" / "spotpool.yaml"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with emulator_with_crds(tmp_path, ["spotpools"], [POOLS]) as c:
        yield c


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"provider": "sim", "endpoint": "http://cloud/spot/v1", "minimum": 1, "maximum": 3,
                            "template": {"instanceTypes": ["gpu.l4.1x"]}}
    base.update(spec)
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": "p1"}, "spec": base}


async def test_the_sample_is_accepted_and_defaults_are_applied(client: Client) -> None:
    sample = next(d for d in yaml.safe_load_all(SAMPLE.read_text()) if d["kind"] == "SpotPool")
    got = await client.create(POOLS, sample)
    assert isinstance(got, SpotPool)
    check_spec(got.spec)
    minimal = await client.create(POOLS, pool(minimum=0) | {"metadata": {"name": "p2"}})
    s = minimal.spec
    assert (s.drain_timeout_seconds, s.deletion_policy, s.scale_on_demand) == (600, "Terminate", False)
    assert (s.template.gpus_per_instance, s.template.gpu_resource_name) == (1, "nvidia.com/gpu")


@pytest.mark.parametrize(("spec", "needle"), [
    ({"minimum": 4, "maximum": 2}, "spec.minimum must be <= spec.maximum"),
    ({"provider": "gcp"}, "spec.provider"),
    ({"endpoint": None}, "spec.endpoint"),
    ({"provider": "tencent", "endpoint": None, "template": {"region": "ap-guangzhou", "instanceTypes": ["x"]}},
     "credentialsSecretRef"),
    ({"provider": "aws", "credentialsSecretRef": {"name": "k", "namespace": "ns"},
      "template": {"instanceTypes": ["x"]}}, "region"),
    ({"provider": "tencent", "endpoint": None, "credentialsSecretRef": {"name": "k", "namespace": "ns"},
      "template": {"region": "ap-guangzhou", "instanceTypes": ["x"]}}, "spec.template.zones"),
    ({"template": {"instanceTypes": []}}, "spec.template.instanceTypes"),
    ({"template": {"instanceTypes": ["x"], "maxPrice": "cheap"}}, "spec.template.maxPrice"),
    ({"template": {"instanceTypes": ["x"], "tags": {"gpuops.io/pool": "other"}}}, "reserved"),
    ({"deletionPolicy": "Orphan"}, "spec.deletionPolicy"),
])
async def test_invalid_pools_are_refused_at_admission(client: Client, spec: dict[str, Any], needle: str) -> None:
    body = pool(**spec)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    with pytest.raises(Invalid) as e:
        await client.create(POOLS, body)
    assert needle in str(e.value)


@pytest.mark.parametrize(("changes", "field"), [
    ({"minimum": 3, "maximum": 2}, "spec.maximum"),
    ({"provider": "azure"}, "spec.provider"),
    ({"endpoint": None}, "spec.endpoint"),
    ({"template": {"instanceTypes": ["x"], "gpusPerInstance": 0}}, "spec.template.gpusPerInstance"),
    ({"credentialsSecretRef": {"name": "k"}}, "spec.credentialsSecretRef"),
    ({"provider": "tencent", "credentialsSecretRef": {"name": "k", "namespace": "ns"},
      "template": {"region": "ap-guangzhou", "instanceTypes": ["x"]}}, "spec.template.zones"),
    ({"onDemandFallback": {"afterCapacityErrors": 0}}, "spec.onDemandFallback.afterCapacityErrors"),
])
def test_check_spec_names_the_field(changes: dict[str, Any], field: str) -> None:
    spec = msgspec.convert({**pool()["spec"], **changes}, PoolSpec)
    with pytest.raises(SpecError) as e:
        check_spec(spec)
    assert e.value.field == field
