"""The emulated driver's MIG tables and rules (`gpuops_sim.migtables`, what the fake NVML serves) against the
operator's (`gpuops.accounting.mig`), written separately from NVIDIA's MIG user guide: every model must have
the same profiles, and after any sequence of creates and destroys both must agree on what fits where and on
how much of each profile is still free. Also: no emulating module reads the operator's accounting package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuops_sim
from gpuops.accounting import mig
from gpuops.accounting.errors import PlacementError
from gpuops_sim import fakenvml, gpus, migtables
from gpuops_sim.migtables import Placement

MODELS = sorted(migtables.MODELS)


def test_both_know_the_same_models() -> None:
    assert set(migtables.MODELS) == set(mig.KNOWN_MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_profile_tables_agree(model: str) -> None:
    ours, theirs = migtables.MODELS[model], mig.geometry(model)
    assert (ours.memory_gb, ours.memory_slices, ours.compute_slices) == (
        theirs.memory_gb, theirs.slices, theirs.compute_slices)
    assert sorted((p.name, p.profile_id, p.nvml_index, p.compute, p.size, p.starts, p.instances, p.media)
                  for p in ours.profiles) == sorted(
        (p.name, p.profile_id, p.nvml_index, p.compute, p.size, p.starts, p.max_count, p.media_extensions)
        for p in theirs.profiles)


@pytest.mark.parametrize("model", MODELS)
def test_names_the_driver_reports_map_to_the_same_model(model: str) -> None:
    for name in (model, fakenvml.nvml_name(model), gpus.model(model).product):
        assert gpus.model(name).key == mig.normalize_model(name) == model


@st.composite
def _histories(draw: st.DrawFn) -> tuple[str, list[tuple[bool, int, int]]]:
    model = draw(st.sampled_from(MODELS))
    tables = migtables.MODELS[model]
    ops = draw(st.lists(st.tuples(
        st.sampled_from([True, True, True, False]),  # create (mostly) or destroy
        st.integers(0, len(tables.profiles) - 1),
        st.integers(0, tables.memory_slices - 1),  # any start, listed or not
    ), min_size=1, max_size=30))
    return model, ops


def _assert_same_free(model: str, layout: list[Placement]) -> None:
    tables, geom = migtables.MODELS[model], mig.geometry(model)
    theirs = [mig.Placement(*pl) for pl in layout]
    capacity, starts = mig.free_capacity(geom, theirs), mig.free_placements(geom, theirs)
    for p in tables.profiles:
        assert migtables.free_capacity(tables, layout, p) == capacity[p.name], (p.name, layout)
        assert migtables.free_starts(tables, layout, p) == starts[p.name], (p.name, layout)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_histories())
def test_fit_and_free_capacity_agree_over_creates_and_destroys(case: tuple[str, list[tuple[bool, int, int]]]) -> None:
    model, ops = case
    tables, geom = migtables.MODELS[model], mig.geometry(model)
    layout: list[Placement] = []
    for create, pi, start in ops:
        if not create:
            if layout:
                layout.pop((pi + start) % len(layout))
        else:
            p = tables.profiles[pi]
            why = migtables.refusal(tables, layout, p, start)
            try:
                mig.allocate(geom, [mig.Placement(*pl) for pl in layout], [mig.Placement(p.name, start, p.size)])
            except PlacementError:
                assert why is not None, f"the operator refuses {p.name}@{start} on {layout}, the driver would not"
            else:
                assert why is None, f"the driver refuses {p.name}@{start} on {layout} ({why}), the operator would not"
                layout.append(Placement(p.name, start, p.size))
        _assert_same_free(model, layout)


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_no_emulating_module_imports_the_operators_accounting() -> None:
    """Only the report, which plots the operator's own view, may read `gpuops.accounting`."""
    root = Path(gpuops_sim.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "report":
            continue
        names = _imports(ast.parse(path.read_text(), str(path)))
        if any(n == "gpuops.accounting" or n.startswith("gpuops.accounting.") for n in names):
            offenders.append(str(path.relative_to(root)))
    assert offenders == []
