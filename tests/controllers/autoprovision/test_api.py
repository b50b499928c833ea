"""GPUNodeGroup's CRD against the emulator (defaults, admission errors that name the field) and the seed's
environment-variable form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from waiting import emulator_with_crds

from gpuops.controllers.autoprovision.api import (
    GROUPS,
    GPUNodeGroup,
    GroupSpec,
    SpecError,
    check_spec,
    groups_from_env,
)
from gpuops.kube.client import Client
from gpuops.kube.errors import ApiError, Invalid

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "manifests" / "samples" / "gpunodegroup.yaml"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    async with emulator_with_crds(tmp_path, ["gpunodegroups"], [GROUPS]) as c:
        yield c


def group(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"nodeName": "n1", "gpuCount": 4,
                            "scaleUp": {"url": "http://power/on"}, "scaleDown": {"url": "http://power/off"}}
    base.update(spec)
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": "g1"}, "spec": base}


async def test_the_sample_is_accepted_and_defaults_are_applied(client: Client) -> None:
    sample = yaml.safe_load(SAMPLE.read_text())
    got = await client.create(GROUPS, sample)
    assert isinstance(got, GPUNodeGroup) and got.spec.gpu_count == 8
    check_spec(got.spec)
    minimal = await client.create(GROUPS, group())
    spec = minimal.spec
    assert (spec.gpu_resource_name, spec.priority, spec.boot_timeout_seconds) == ("nvidia.com/gpu", 0, 900)
    assert (spec.scale_down_unneeded_seconds, spec.scale_down_delay_after_scale_up_seconds) == (600, 600)
    assert spec.scale_up.timeout_seconds == 10


@pytest.mark.parametrize(("spec", "field"), [
    ({"gpuCount": 0}, "spec.gpuCount"),
    ({"nodeName": ""}, "spec.nodeName"),
    ({"scaleUp": {"url": "ftp://power/on"}}, "spec.scaleUp"),
    ({"scaleDown": {"url": "http://x", "secretRef": {"name": "s"}}}, "spec.scaleDown.secretRef.namespace"),
    ({"bootTimeoutSeconds": 0}, "spec.bootTimeoutSeconds"),
])
async def test_invalid_groups_are_refused_at_admission_naming_the_field(
    client: Client, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(Invalid) as err:
        await client.create(GROUPS, group(**spec))
    assert field in str(err.value)


async def test_missing_webhooks_are_refused(client: Client) -> None:
    body = group()
    del body["spec"]["scaleDown"]
    with pytest.raises(ApiError, match="scaleDown"):
        await client.create(GROUPS, body)


def test_check_spec_names_the_field_and_the_fix() -> None:
    """For objects no API server validated (the seed's env vars, objects older than the CRD's rules)."""
    bad = msgspec.convert(group(scaleUp={"url": "power/on"})["spec"], GroupSpec)
    with pytest.raises(SpecError, match="http") as err:
        check_spec(bad)
    assert err.value.field == "spec.scaleUp.url"


def test_the_seeds_environment_variables_define_groups() -> None:
    env = {
        "GPU_NODE_1_NAME": "gpu-a", "GPU_NODE_1_GPU_COUNT": "8",
        "GPU_NODE_1_SCALE_UP_ENDPOINT": "http://bmc/a/on", "GPU_NODE_1_SCALE_DOWN_ENDPOINT": "http://bmc/a/off",
        "GPU_NODE_2_NAME": "gpu-b", "GPU_NODE_2_GPU_COUNT": "2",
        "GPU_NODE_2_SCALE_UP_ENDPOINT": "http://bmc/b/on", "GPU_NODE_2_SCALE_DOWN_ENDPOINT": "http://bmc/b/off",
        "POD_NAME": "gpuops-0",  # not a group
    }
    groups = groups_from_env(env)
    assert [(g.prefix, g.spec.node_name, g.spec.gpu_count) for g in groups] == [
        ("GPU_NODE_1", "gpu-a", 8), ("GPU_NODE_2", "gpu-b", 2)]
    assert groups[1].spec.scale_down.url == "http://bmc/b/off"
    with pytest.raises(SpecError, match="GPU_NODE_3_SCALE_DOWN_ENDPOINT"):
        groups_from_env({"GPU_NODE_3_NAME": "c", "GPU_NODE_3_GPU_COUNT": "1",
                         "GPU_NODE_3_SCALE_UP_ENDPOINT": "http://x/on"})
    with pytest.raises(SpecError, match="integer"):
        groups_from_env({"P_NAME": "c", "P_GPU_COUNT": "two", "P_SCALE_UP_ENDPOINT": "http://x/on",
                         "P_SCALE_DOWN_ENDPOINT": "http://x/off"})
