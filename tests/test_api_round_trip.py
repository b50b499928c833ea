"""Nothing we write is pruned: a fully populated instance of every spec and status Struct of our API, written
through the emulated API server (create, then the /status subresource), reads back field for field.

The instance is built from the generated schema, so a field added to a Struct is populated here without
anyone remembering to: every property at every depth gets a value that differs from the field's default
(`omit_defaults` would leave a default out of the request and hide it from the check), within the schema's
bounds, enums and patterns. The autouse fixture in conftest.py fails the test on any warning the server
answers (an unknown field it pruned would be one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from waiting import emulator_with_crds

from gpuops.controllers.crds import CRDS
from gpuops.kube.crd import CustomResource, resource_schema

pytestmark = pytest.mark.anyio

SAMPLES_BY_FIELD = {
    # fields with a pattern: a value the pattern admits (the builder checks it does)
    "gpuResourceName": "example.com/gpu",
    "maxPrice": "1.25",
    "profile": "3g.40gb",
    "gpuHours": "2500m",
    "weightedGpuHours": "4",
    "amount": "5000",
    "currency": "EUR",
    "onDemand": "2.49",
    "spot": "0.75",
    "weight": "4",
    "model": "NVIDIA-H100-80GB-HBM3",
    # fields CEL rules relate to others
    "url": "https://power.example.com/hook",
    "operator": "In",
    "provider": "sim",
    # fields whose syntax a CEL rule checks
    "uuid": "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f",
    "gpuUUID": "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f",
    "deviceUUID": "MIG-0c9d8e7f-2a1b-4e8b-9c3d-5b1c7d2e0f4a",
    "podUID": "0f4a4e8b-9c3d-2a1b-0c9d-8e7f5b1c7d2e",
    "claim": "default/round-trip",
}
MAP_KEYS = {"headers": "X-Site"}
ONE_OF = {"GPUWorkloadBudget": (("spec.quota.windowHours", "spec.quota.window"),
                                 ("spec.quota.gpuHours", "spec.quota.weightedGpuHours", "spec.quota.cost"))}
"""Groups of fields a CEL rule lets only one of be set: each is written in a round trip of its own, without the
others of its group (and with the first of every other group)."""
TIME = "2026-01-02T03:04:05Z"


def sample(schema: Mapping[str, Any], name: str, path: str) -> Any:
    """A value of `schema` that the API server admits and that is not the field's default."""
    if schema.get("x-kubernetes-int-or-string"):
        return SAMPLES_BY_FIELD.get(name, "2")
    kind = schema.get("type")
    if kind == "object":
        if "properties" in schema:
            return {k: sample(sub, k, f"{path}.{k}") for k, sub in schema["properties"].items()}
        value = sample(schema.get("additionalProperties") or {"type": "string"}, name, f"{path}{{}}")
        return {MAP_KEYS.get(name, "example.com/key"): value}
    if kind == "array":
        return [sample(schema["items"], name, f"{path}[]")]
    if kind == "boolean":
        return not schema.get("default", False)
    if kind == "integer":
        low, high = schema.get("minimum", 0), schema.get("maximum", 1 << 31)
        value = min(high, low + 1)
        return value if value != schema.get("default") else min(high, low + 2)
    assert kind == "string", f"{path}: no sample for {schema}"
    return _string(schema, name, path)


def _string(schema: Mapping[str, Any], name: str, path: str) -> str:
    if name in SAMPLES_BY_FIELD:
        value = SAMPLES_BY_FIELD[name]
    elif "enum" in schema:
        choices = [v for v in schema["enum"] if v != schema.get("default")]
        value = choices[-1]
    elif schema.get("format") == "date-time":
        value = TIME
    else:
        value = f"v-{name.lower()}"[: schema.get("maxLength", 64)]
    pattern = schema.get("pattern")
    assert pattern is None or re.search(pattern, value), f"{path}: sample {value!r} does not match {pattern}"
    assert len(value) >= schema.get("minLength", 0), f"{path}: sample {value!r} too short"
    return value


def populated(resource: CustomResource, keep: str | None = None) -> dict[str, Any]:
    """Every field set; of the kind's ONE_OF fields only `keep`."""
    schema = resource_schema(resource)
    rt = resource.resource
    obj = {k: sample(schema["properties"][k], k, k) for k in ("spec", "status")}
    groups = ONE_OF.get(rt.kind, ())
    kept = {keep} | {g[0] for g in groups if keep not in g}
    for path in (p for g in groups for p in g):
        if path not in kept:
            *parents, last = path.split(".")
            holder = obj
            for part in parents:
                holder = holder[part]
            del holder[last]
    obj["metadata"] = {"name": "round-trip", **({"namespace": "default"} if rt.namespaced else {})}
    return obj


CASES = [(r, keep) for r in CRDS for keep in [p for g in ONE_OF.get(r.resource.kind, ((None,),)) for p in g]]


def leaves(value: Any, path: str = "") -> set[str]:
    if isinstance(value, Mapping):
        return {p for k, v in value.items() for p in leaves(v, f"{path}.{k}")} or {path}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in leaves(v, f"{path}[{i}]")} or {path}
    return {path}


@pytest.mark.parametrize(("resource", "keep"), CASES,
                         ids=[f"{r.resource.kind}-{keep}" if keep else r.resource.kind for r, keep in CASES])
async def test_every_field_survives_a_write(resource: CustomResource, keep: str | None, tmp_path: Path) -> None:
    rt = resource.resource
    sent = populated(resource, keep)
    # The sample decodes into the Struct and encodes back unchanged: Struct and schema name the same fields.
    typed = msgspec.convert(sent, rt.struct)
    assert msgspec.json.decode(msgspec.json.encode(typed)) == sent
    async with emulator_with_crds(tmp_path, [rt.plural], [rt]) as client:
        created = await client.create(rt, typed)
        body = msgspec.structs.replace(typed, metadata=created.metadata)  # type: ignore[type-var]
        await client.replace(rt, body, subresource="status")
        ns = created.metadata.namespace or None
        raw = msgspec.json.decode(await client.request("GET", rt.path(ns, "round-trip")))
    for part in ("spec", "status"):
        lost = sorted(leaves(sent[part], part) - leaves(raw.get(part), part))
        assert not lost, f"{rt.kind}: the API server did not keep {lost}"
        assert raw[part] == sent[part], f"{rt.kind}.{part} came back different"
    back = msgspec.convert(raw, rt.struct)
    assert back.spec == typed.spec  # type: ignore[attr-defined]
    assert back.status == typed.status  # type: ignore[attr-defined]


def test_the_sample_covers_every_field_of_every_struct() -> None:
    """Each Struct field appears in the sample (a field the schema walk skipped would escape the write check)."""
    for resource in CRDS:
        sent = populated(resource)
        typed = msgspec.convert(sent, resource.resource.struct)
        for part in ("spec", "status"):
            encoded = msgspec.json.decode(msgspec.json.encode(getattr(typed, part)))
            assert leaves(encoded, part) == leaves(sent[part], part)
