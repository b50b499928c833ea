"""GPU choice on a node: the emptying delay (busy GPUs take new pods before nearly empty ones) and what it must
never override: partly used GPUs before empty ones, exact integer costs, order invariance."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting import mig
from gpuops.accounting.mig import GPU, GPUPlacement, Placement

A100 = "A100-40GB"


def gpu(name: str, *slices: tuple[str, int], model: str = A100) -> GPU:
    geom = mig.geometry(model)
    return GPU(name, model, tuple(mig.slice_at(geom, p, s) for p, s in slices))


@pytest.mark.parametrize("model", mig.KNOWN_MODELS)
def test_emptying_delay_is_exact_and_falls_with_the_instances_held(model: str) -> None:
    geom = mig.geometry(model)
    delays = [mig._emptying_delay(geom.model, held) for held in range(geom.slices)]
    for held, d in enumerate(delays):
        assert d * (held + 1) == geom.compute_slices * mig._SCALE  # no rounding: 1/(n+1) exactly
    assert delays == sorted(delays, reverse=True) and len(set(delays)) == len(delays)


def test_same_free_shape_goes_to_the_gpu_holding_more_instances() -> None:
    # Both GPUs have memory slices 0-3 taken and 4-7 free, so a 1g loses the same capacity on either; the one
    # with four 1g instances stays busy anyway, the one with a single 4g empties as soon as that 4g leaves.
    lone = gpu("lone", ("4g.20gb", 0))
    busy = gpu("busy", ("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3))
    for gpus in ([lone, busy], [busy, lone]):
        got = mig.place_on_node(gpus, ["1g.5gb"])
        assert got is not None and got[0].gpu == "busy"
        got = mig.place_on_node(gpus, ["2g.10gb", "1g.5gb"])  # a pod's slices leave together: one GPU
        assert got is not None and {x.gpu for x in got} == {"busy"}


def test_capacity_still_comes_before_emptying() -> None:
    # On the lone 4g a 1g goes to slice 6 and costs the 3g slot of slices 4-7; on the busy GPU (1g at 4, 5, 6)
    # it must go into slices 0-3 and costs the 4g and 3g slots there. Capacity outweighs the emptying delay.
    lone = gpu("lone", ("4g.20gb", 0))
    busy = gpu("busy", ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6))
    for gpus in ([lone, busy], [busy, lone]):
        assert mig.place_on_node(gpus, ["1g.5gb"]) == (GPUPlacement("lone", Placement("1g.5gb", 6, 1)),)


def test_an_empty_gpu_only_when_no_partly_used_one_can() -> None:
    lone = gpu("lone", ("1g.5gb", 6))  # one instance: the dearest partly used GPU to add to
    empty = gpu("empty")
    for gpus in ([lone, empty], [empty, lone]):
        got = mig.place_on_node(gpus, ["3g.20gb"])
        assert got is not None and got[0].gpu == "lone"
        got = mig.place_on_node(gpus, ["7g.40gb"])
        assert got is not None and got[0].gpu == "empty"


_LAYOUTS: list[tuple[Placement, ...]] = []


def _layouts() -> list[tuple[Placement, ...]]:
    """A few hundred random valid A100 layouts (grown slice by slice from an empty GPU)."""
    if not _LAYOUTS:
        geom = mig.geometry(A100)
        rnd = random.Random(5)
        names = [p.name for p in geom.profiles]
        for _ in range(400):
            layout: tuple[Placement, ...] = ()
            for _ in range(rnd.randrange(0, 6)):
                got = mig.place(geom, layout, [rnd.choice(names)])
                if got is not None:
                    layout = mig.check_layout(geom, (*layout, *got))
            _LAYOUTS.append(layout)
    return _LAYOUTS


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 399), min_size=1, max_size=8), st.lists(
    st.sampled_from([p.name for p in mig.geometry(A100).profiles]), min_size=1, max_size=3), st.randoms())
def test_node_choice_keeps_its_guarantees(picks: list[int], batch: list[str], rnd: random.Random) -> None:
    gpus = [GPU(f"g{i}", A100, _layouts()[k]) for i, k in enumerate(picks)]
    got = mig.place_on_node(gpus, batch)
    shuffled = list(batch)
    rnd.shuffle(shuffled)
    again = mig.place_on_node(gpus, shuffled)
    assert (got is None) == (again is None)
    if got is None:
        return
    assert sorted(got, key=str) == sorted(again or (), key=str)  # the same decision in any request order
    by_gpu: dict[str, list[Placement]] = {}
    for x in got:
        by_gpu.setdefault(x.gpu, []).append(x.placement)
    for g in gpus:
        mig.allocate(mig.geometry(A100), g.slices, by_gpu.get(g.name, []))  # valid next to what is there
    # Partly used GPUs first: the batch starts no empty GPU if the partly used ones alone can hold it.
    used = [g for g in gpus if g.slices]
    if used and mig.place_on_node(used, batch) is not None:
        assert all(g.slices for g in gpus if g.name in by_gpu)
