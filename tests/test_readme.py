"""The README's generated blocks (benchmark headlines, chaos summary, CRD reference) match the files they come
from, so what the README claims is what was measured and what the API server enforces."""

from __future__ import annotations

import readme_sections as rs
import yaml


def test_every_generated_block_is_current() -> None:
    text = rs.README.read_text()
    assert sorted(rs.blocks(text)) == sorted(rs.SECTIONS), "README.md lacks a generated block"
    assert rs.render(text) == text, "README.md is stale: run `make readme`"


def test_every_crd_field_is_in_the_reference() -> None:
    reference = rs.crd_reference()
    for path in rs.CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        assert f"### {crd['spec']['names']['kind']}" in reference
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for name in (schema["properties"].get("spec") or {}).get("properties") or {}:
            assert f"`spec.{name}`" in reference


def test_headline_keys_exist_and_numbers_read_well() -> None:
    assert rs.bench_table().count("\n| ") >= sum(len(h) for _, h in rs.HEADLINES.values())
    assert rs._number(1336) == "1,336" and rs._number(0.0926, " s") == "0.093 s"
    assert rs._number(123.456) == "123.5" and rs._number(2.0) == "2"
