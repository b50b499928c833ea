"""The CRDs in manifests/crds are generated from the API types: the committed YAML is what `make manifests`
writes, and every schema it writes is one the emulated API server accepts as structural."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuops.controllers.crds import CRDS, generated, main

CRD_DIR = Path(__file__).resolve().parents[1] / "manifests" / "crds"


def test_every_crd_file_is_generated() -> None:
    """No hand-written CRD beside the generated ones: the Kustomization lists exactly what the types produce."""
    kustomization = yaml.safe_load((CRD_DIR / "Kustomization").read_text())
    assert sorted(kustomization["resources"]) == sorted(generated())
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == sorted(generated())


@pytest.mark.parametrize("name", sorted(generated()))
def test_committed_crd_equals_what_the_types_generate(name: str) -> None:
    committed = (CRD_DIR / name).read_text()
    assert committed == generated()[name], f"manifests/crds/{name} is stale: run `make manifests`"


def test_the_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path), "--check"]) == 0
    victim = tmp_path / f"{CRDS[0].name}.yaml"
    victim.write_text(victim.read_text().replace("minimum: 1", "minimum: 2", 1))
    assert main([str(tmp_path), "--check"]) == 1
    assert victim.name in capsys.readouterr().err
