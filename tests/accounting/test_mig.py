"""MIG geometry and placement: tables vs NVIDIA's, brute-force completeness, order invariance, release inverse,
DAS's first-fit regressions, names and models, node and cluster choice."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting import mig
from gpuops.accounting.errors import AccountingError, PlacementError, ProfileError, UnknownGPUModelError
from gpuops.accounting.mig import GPU, GPUPlacement, Node, Placement

EIGHT = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H100-96GB", "H200-141GB", "B200-180GB"]
ALL = [*EIGHT, "A30-24GB"]

# NVIDIA's placement tables (MIG User Guide, nvidia-smi mig -lgipp) for 8-memory-slice GPUs, column by column:
# (ID, NVML index, g, size, starts, max) and each SKU's names in row order.
EIGHT_ROWS = [
    (19, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    (20, 7, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    (15, 9, 1, 2, (0, 2, 4, 6), 4),
    (14, 1, 2, 2, (0, 2, 4), 3),
    (9, 2, 3, 4, (0, 4), 2),
    (5, 3, 4, 4, (0,), 1),
    (0, 4, 7, 8, (0,), 1),
]
EIGHT_NAMES = {
    "A100-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-94GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H100-96GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "B200-180GB": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
}
# The same for the A30-24GB (4 memory slices): (name, ID, NVML index, g, size, starts, max)
A30_ROWS = [
    ("1g.6gb", 14, 0, 1, 1, (0, 1, 2, 3), 4),
    ("1g.6gb+me", 21, 7, 1, 1, (0, 1, 2, 3), 1),
    ("2g.12gb", 5, 1, 2, 2, (0, 2), 2),
    ("2g.12gb+me", 6, 8, 2, 2, (0, 2), 1),
    ("4g.24gb", 0, 3, 4, 4, (0,), 1),
]


# ------------------------------------------------------------------------------------------ brute-force oracle
# Independent of the module's search: every subset of (profile, start) pairs, kept if no two overlap, no profile
# exceeds its table maximum and at most one +me instance is present.

Layout = frozenset[tuple[str, int]]


@cache
def brute_layouts(model: str) -> tuple[Layout, ...]:
    geom = mig.geometry(model)
    prof = {p.name: p for p in geom.profiles}
    singles = [(p.name, s) for p in geom.profiles for s in p.starts]

    def ok(layout: list[tuple[str, int]]) -> bool:
        used: set[int] = set()
        for name, s in layout:
            cells = set(range(s, s + prof[name].size))
            if used & cells:
                return False
            used |= cells
        counts = Counter(name for name, _ in layout)
        if any(n > prof[name].max_count for name, n in counts.items()):
            return False
        return sum(n for name, n in counts.items() if name.endswith("+me")) <= 1

    out: list[Layout] = []

    def grow(i: int, layout: list[tuple[str, int]]) -> None:
        out.append(frozenset(layout))
        for j in range(i, len(singles)):
            layout.append(singles[j])
            if ok(layout):
                grow(j + 1, layout)
            layout.pop()

    grow(0, [])
    return tuple(out)


def multiset(layout: Layout | Sequence[tuple[str, int]]) -> tuple[str, ...]:
    return tuple(sorted(name for name, _ in layout))


@cache
def feasible_multisets(model: str) -> frozenset[tuple[str, ...]]:
    return frozenset(multiset(layout) for layout in brute_layouts(model))


def brute_fits(model: str, existing: Layout, batch: Sequence[str]) -> bool:
    want = tuple(sorted(batch))
    return any(existing <= lay and multiset(lay - existing) == want for lay in brute_layouts(model))


def as_layout(placements: Sequence[Placement]) -> Layout:
    return frozenset((p.profile, p.start) for p in placements)


def to_placements(model: str, layout: Layout) -> list[Placement]:
    geom = mig.geometry(model)
    return [mig.slice_at(geom, name, s) for name, s in sorted(layout, key=lambda x: x[1])]


def first_fit(model: str, existing: Layout, order: Sequence[str]) -> bool:
    """DAS's Filter on one GPU: each request, in order, at the lowest free start of its placement list."""
    geom = mig.geometry(model)
    layout = set(existing)
    for name in order:
        p = geom.profile(name)
        for s in p.starts:
            if brute_ok_with(model, layout, (p.name, s)):
                layout.add((p.name, s))
                break
        else:
            return False
    return True


def brute_ok_with(model: str, layout: set[tuple[str, int]], item: tuple[str, int]) -> bool:
    return item not in layout and frozenset(layout | {item}) in set(brute_layouts(model))


def assert_sound(model: str, existing: Sequence[Placement], placed: Sequence[Placement], batch: Sequence[str]) -> None:
    geom = mig.geometry(model)
    for pl, want in zip(placed, batch, strict=True):
        p = geom.profile(want)
        assert pl.profile == p.name and pl.size == p.size and pl.start in p.starts
    union = as_layout([*existing, *placed])
    assert len(union) == len(existing) + len(placed)  # no duplicate (profile, start)
    assert union in set(brute_layouts(model))  # no overlap, caps, +me singleton
    cells = [c for pl in [*existing, *placed] for c in range(pl.start, pl.start + pl.size)]
    assert len(cells) == len(set(cells)) and all(0 <= c < geom.slices for c in cells)
    assert sum(geom.profile(pl.profile).compute for pl in [*existing, *placed]) <= geom.compute_slices


# ------------------------------------------------------------------------------------------ tables


@pytest.mark.parametrize("model", EIGHT)
def test_eight_slice_tables_match_mig_md(model: str) -> None:
    geom = mig.geometry(model)
    assert geom.model == model and geom.slices == 8 and geom.compute_slices == 7
    got = [(p.profile_id, p.nvml_index, p.compute, p.size, p.starts, p.max_count) for p in geom.profiles]
    assert got == EIGHT_ROWS
    assert [p.name for p in geom.profiles] == EIGHT_NAMES[model]
    assert [p.media_extensions for p in geom.profiles] == [False, True, False, False, False, False, False]


def test_a30_table_matches_mig_md_and_has_4_slices() -> None:
    geom = mig.geometry("A30-24GB")
    assert geom.slices == 4 and geom.compute_slices == 4
    got = [(p.name, p.profile_id, p.nvml_index, p.compute, p.size, p.starts, p.max_count) for p in geom.profiles]
    assert got == A30_ROWS
    assert mig.place(geom, [], ["1g.6gb"] * 4) is not None
    assert mig.place(geom, [], ["1g.6gb"] * 5) is None
    assert mig.place(geom, [], ["4g.24gb"]) == (Placement("4g.24gb", 0, 4),)


@pytest.mark.parametrize(
    ("model", "counts"),
    [
        ("A100-40GB", (2318, 239, 127, 64)),
        ("H200-141GB", (2318, 239, 127, 64)),
        ("A30-24GB", (75, 17, 19, None)),
    ],
)
def test_brute_force_counts_from_mig_md(model: str, counts: tuple[int, int, int, int | None]) -> None:
    layouts = set(brute_layouts(model)) - {frozenset()}
    geom = mig.geometry(model)
    singles = [(p.name, s) for p in geom.profiles for s in p.starts]
    maximal = [lay for lay in layouts if not any(lay | {x} in layouts for x in singles if x not in lay)]
    sets = {multiset(lay) for lay in layouts}
    assert (len(layouts), len(maximal), len(sets)) == counts[:3]
    if counts[3] is not None:  # "distinct maximal multisets": the multisets of the maximal layouts
        assert len({multiset(lay) for lay in maximal}) == counts[3]
    assert mig.future_options(geom, []) == counts[2]


def test_free_capacity_is_lgip_free_semantics() -> None:
    h100 = mig.geometry("H100-80GB")
    assert mig.free_capacity(h100, [])["1g.10gb"] == 7
    assert mig.free_capacity(h100, [mig.slice_at(h100, "3g.40gb", 0)])["1g.10gb"] == 3
    assert mig.free_capacity(h100, [mig.slice_at(h100, "3g.40gb", 4)])["4g.40gb"] == 1
    after_me = mig.free_capacity(h100, [mig.slice_at(h100, "1g.10gb+me", 6)])
    assert after_me["1g.10gb+me"] == 0 and after_me["1g.10gb"] == 6
    assert mig.free_placements(h100, [mig.slice_at(h100, "3g.40gb", 4)])["2g.20gb"] == (0, 2)


# ------------------------------------------------------------------------------------------ fixed regressions


@pytest.mark.parametrize(
    "batch",
    [
        ["2g.10gb", "4g.20gb"],
        ["1g.5gb", "4g.20gb"],
        ["1g.10gb", *["1g.5gb"] * 6],
    ],
)
def test_das_first_fit_failures_fit_in_every_order(batch: list[str]) -> None:
    geom = mig.geometry("NVIDIA A100-PCIE-40GB")
    assert not first_fit("A100-40GB", frozenset(), batch)  # DAS's lowest-free-slot fails in this order
    results = {as_layout(r) for o in set(itertools.permutations(batch)) if (r := mig.place(geom, [], o)) is not None}
    assert len(results) == 1  # placed, in every order, identically
    (layout,) = results
    assert multiset(layout) == tuple(sorted(batch))


def test_regression_layouts_are_the_ones_mig_md_gives() -> None:
    geom = mig.geometry("A100-40GB")
    assert mig.place(geom, [], ["2g.10gb", "4g.20gb"]) == (Placement("2g.10gb", 4, 2), Placement("4g.20gb", 0, 4))
    placed = mig.place(geom, [], ["1g.10gb", *["1g.5gb"] * 6])
    assert placed is not None and placed[0] == Placement("1g.10gb", 6, 2)
    assert sorted(p.start for p in placed[1:]) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "batch",
    [
        ["4g.20gb", "3g.20gb", "1g.5gb"],
        ["3g.20gb", "3g.20gb", "1g.5gb"],
        ["1g.5gb+me", "1g.5gb+me"],
        ["7g.40gb", "1g.5gb"],
        ["1g.5gb"] * 8,
    ],
)
def test_infeasible_batches_are_rejected(batch: list[str]) -> None:
    assert mig.place(mig.geometry("A100-40GB"), [], batch) is None


def test_a30_media_extension_profiles_exclude_each_other() -> None:
    geom = mig.geometry("A30-24GB")
    assert mig.place(geom, [], ["1g.6gb+me", "2g.12gb+me"]) is None
    assert mig.place(geom, [], ["1g.6gb+me", "2g.12gb"]) is not None
    with pytest.raises(PlacementError, match="at most one"):
        mig.check_layout(geom, [mig.slice_at(geom, "1g.6gb+me", 0), mig.slice_at(geom, "2g.12gb+me", 2)])


def test_4g_plus_3g_only_as_4g_at_0_and_3g_at_4() -> None:
    geom = mig.geometry("H100-80GB")
    assert set(mig.place(geom, [], ["3g.40gb", "4g.40gb"]) or ()) == {
        Placement("3g.40gb", 4, 4),
        Placement("4g.40gb", 0, 4),
    }
    assert mig.place(geom, [mig.slice_at(geom, "3g.40gb", 0)], ["4g.40gb"]) is None


# ------------------------------------------------------------------------------------------ exhaustive completeness


@pytest.mark.parametrize("model", ALL)
def test_complete_on_empty_gpu_for_every_small_multiset(model: str) -> None:
    """place succeeds iff the brute force finds a layout, for every multiset of up to 4 profiles (and all
    feasible ones of any size)."""
    geom = mig.geometry(model)
    names = [p.name for p in geom.profiles]
    feasible = feasible_multisets(model)
    candidates = {m for k in range(1, 5) for m in itertools.combinations_with_replacement(names, k)} | feasible
    for batch in candidates:
        placed = mig.place(geom, [], batch)
        assert (placed is not None) == (tuple(sorted(batch)) in feasible), batch
        if placed is not None:
            assert_sound(model, [], placed, batch)


# ------------------------------------------------------------------------------------------ properties


@st.composite
def gpu_cases(draw: st.DrawFn) -> tuple[str, Layout, tuple[str, ...]]:
    """A model, an existing layout, and a batch: half the time a feasible one (the rest of a bigger layout),
    otherwise random profiles (often infeasible)."""
    model = draw(st.sampled_from(ALL))
    layouts = brute_layouts(model)
    full = draw(st.sampled_from(layouts))
    items = sorted(full, key=lambda x: (x[1], x[0]))
    keep = draw(st.lists(st.booleans(), min_size=len(items), max_size=len(items)))
    existing = frozenset(x for x, k in zip(items, keep, strict=True) if k)
    if draw(st.booleans()):
        batch = tuple(name for (name, _), k in zip(items, keep, strict=True) if not k)
    else:
        names = [p.name for p in mig.geometry(model).profiles]
        batch = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=4)))
    batch = tuple(draw(st.permutations(batch)))
    return model, existing, batch


@settings(max_examples=400, deadline=None)
@given(gpu_cases())
def test_place_is_sound_and_complete_against_brute_force(case: tuple[str, Layout, tuple[str, ...]]) -> None:
    model, existing, batch = case
    geom = mig.geometry(model)
    have = to_placements(model, existing)
    placed = mig.place(geom, have, batch)
    assert (placed is not None) == brute_fits(model, existing, batch)
    if placed is not None:
        assert_sound(model, have, placed, batch)


@settings(max_examples=200, deadline=None)
@given(gpu_cases(), st.randoms(use_true_random=False))
def test_place_is_order_invariant(case: tuple[str, Layout, tuple[str, ...]], rnd: random.Random) -> None:
    """Every order of the batch gives the same answer: the same layout, or None for all."""
    model, existing, batch = case
    geom = mig.geometry(model)
    have = to_placements(model, existing)
    orders = list(set(itertools.permutations(batch)))
    rnd.shuffle(orders)
    results = set()
    for order in orders[:30]:
        placed = mig.place(geom, have, order)
        results.add(None if placed is None else as_layout(placed))
        if placed is not None:
            assert [p.profile for p in placed] == [geom.profile(x).name for x in order]  # aligned with requests
    assert len(results) == 1


@settings(max_examples=200, deadline=None)
@given(gpu_cases(), st.randoms(use_true_random=False))
def test_release_is_the_exact_inverse_of_allocate(
    case: tuple[str, Layout, tuple[str, ...]], rnd: random.Random
) -> None:
    model, existing, batch = case
    geom = mig.geometry(model)
    have = mig.check_layout(geom, to_placements(model, existing))
    placed = mig.place(geom, have, batch)
    if not placed:
        return
    grown = mig.allocate(geom, have, placed)
    assert as_layout(grown) == existing | as_layout(placed)
    gone = list(placed)
    rnd.shuffle(gone)
    assert mig.release(geom, grown, gone) == have
    # Releasing one at a time in any order passes through valid layouts back to the start.
    layout = grown
    for pl in gone:
        layout = mig.release(geom, layout, [pl])
    assert layout == have
    with pytest.raises(PlacementError, match="not allocated"):
        mig.release(geom, have, placed)


def test_release_then_place_again_restores_the_same_choice() -> None:
    geom = mig.geometry("A100-40GB")
    base = [mig.slice_at(geom, "3g.20gb", 4)]
    first = mig.place(geom, base, ["1g.5gb", "2g.10gb"])
    assert first is not None
    back = mig.release(geom, mig.allocate(geom, base, first), first)
    assert mig.place(geom, back, ["2g.10gb", "1g.5gb"]) == (first[1], first[0])


def test_place_prefers_layouts_that_keep_big_slots() -> None:
    geom = mig.geometry("A100-40GB")
    one = mig.place(geom, [], ["1g.5gb"])
    assert one is not None and one[0].start >= 4  # a 1g never takes the 4g's only start range first
    assert mig.place(geom, [], ["3g.20gb"]) == (Placement("3g.20gb", 4, 4),)  # keeps 4g@0 possible
    two = mig.place(geom, [], ["2g.10gb"])
    assert two == (Placement("2g.10gb", 4, 2),)


# ------------------------------------------------------------------------------------------ layouts and errors


def test_check_layout_rejects_what_a_gpu_would_reject() -> None:
    geom = mig.geometry("A100-40GB")
    with pytest.raises(PlacementError, match="overlaps"):
        mig.check_layout(geom, [Placement("4g.20gb", 0, 4), Placement("2g.10gb", 2, 2)])
    with pytest.raises(PlacementError, match="valid starts"):
        mig.check_layout(geom, [Placement("1g.5gb", 7, 1)])
    with pytest.raises(PlacementError, match="valid starts"):
        mig.check_layout(geom, [Placement("3g.20gb", 2, 4)])
    with pytest.raises(PlacementError, match="occupies 4"):
        mig.check_layout(geom, [Placement("3g.20gb", 0, 3)])  # go-nvml's Hopper mocks say size 3: wrong
    with pytest.raises(PlacementError, match="at most one"):
        mig.check_layout(geom, [Placement("1g.5gb+me", 0, 1), Placement("1g.5gb+me", 1, 1)])
    with pytest.raises(ProfileError):
        mig.check_layout(geom, [Placement("1g.6gb", 0, 1)])
    assert mig.check_layout(geom, [Placement("nvidia.com/mig-2g.10gb", 4, 2), Placement("1g.5gb", 0, 1)]) == (
        Placement("1g.5gb", 0, 1),
        Placement("2g.10gb", 4, 2),
    )
    with pytest.raises(PlacementError, match="overlaps"):
        mig.place(geom, [Placement("7g.40gb", 0, 8), Placement("1g.5gb", 3, 1)], ["1g.5gb"])


@pytest.mark.parametrize(
    ("spelling", "want"),
    [
        ("1g.10gb", "1g.10gb"),
        ("1g.10gb+me", "1g.10gb+me"),
        ("MIG 1g.10gb", "1g.10gb"),
        ("nvidia.com/mig-1g.10gb", "1g.10gb"),
        ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),
        ("gpuops.io/mig-7g.80gb", "7g.80gb"),
        (" 1G.20GB ", "1g.20gb"),
        ("7g.80gb", "7g.80gb"),
    ],
)
def test_profile_names_as_nvidia_writes_them(spelling: str, want: str) -> None:
    geom = mig.geometry("H100-80GB")
    assert geom.profile(spelling).name == want


def test_same_name_means_different_geometry_per_model() -> None:
    a40, a80 = mig.geometry("A100-40GB"), mig.geometry("A100-80GB")
    assert a40.profile("1g.10gb").size == 2 and a40.profile("1g.10gb").profile_id == 15
    assert a80.profile("1g.10gb").size == 1 and a80.profile("1g.10gb").profile_id == 19


@pytest.mark.parametrize("bad", ["", "1g", "1g.10", "g.10gb", "1x.10gb", "nvidia.com/gpu", "10gb", "1g.10gb@0"])
def test_malformed_profile_is_a_profile_error(bad: str) -> None:
    with pytest.raises(ProfileError, match="not a MIG profile name"):
        mig.parse_profile(mig.geometry("A100-40GB"), bad)


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("A100-40GB", "1g.6gb"),
        ("A100-80GB", "1g.5gb"),
        ("A100-40GB", "2g.10gb+me"),
        ("B200-180GB", "1g.23gb-me"),
        ("H100-80GB", "1g.10gb+gfx"),
        ("A30-24GB", "3g.24gb"),
        ("A30-24GB", "7g.24gb"),
    ],
)
def test_profile_not_offered_is_a_profile_error_listing_offers(model: str, name: str) -> None:
    geom = mig.geometry(model)
    with pytest.raises(ProfileError, match="not offered") as info:
        mig.place(geom, [], [name])
    assert geom.profiles[0].name in str(info.value)
    assert issubclass(ProfileError, AccountingError) and issubclass(AccountingError, ValueError)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("A100-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("a100-80gb", "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-94GB"),
        ("H100-94GB", "H100-94GB"),
        ("NVIDIA GH200 480GB", "H100-96GB"),
        ("H100-96GB", "H100-96GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("NVIDIA-A30", "A30-24GB"),
    ],
)
def test_model_names_are_normalised(name: str, want: str) -> None:
    assert mig.normalize_model(name) == want
    assert mig.geometry(name).model == want


@pytest.mark.parametrize(
    "bad",
    ["A100", "X100", "NVIDIA A100 24GB", "NVIDIA A100X", "", "GH200 144GB", "NVIDIA A100-SXM4-40GB-FOO", "Tesla T4"],
)
def test_unknown_model_names_the_known_ones(bad: str) -> None:
    with pytest.raises(UnknownGPUModelError) as info:
        mig.geometry(bad)
    assert all(m in str(info.value) for m in mig.KNOWN_MODELS)


def test_slice_count_comes_from_the_table() -> None:
    assert {m: mig.geometry(m).slices for m in ALL} == {**dict.fromkeys(EIGHT, 8), "A30-24GB": 4}
    for m in ALL:
        geom = mig.geometry(m)
        assert geom.slices == max(s + p.size for p in geom.profiles for s in p.starts)
        assert geom.memory_gb == int(m.split("-")[1].removesuffix("GB"))


# ------------------------------------------------------------------------------------------ node and cluster


def gpu(name: str, model: str, *slices: tuple[str, int]) -> GPU:
    geom = mig.geometry(model)
    return GPU(name, model, tuple(mig.slice_at(geom, p, s) for p, s in slices))


def test_node_packs_partly_used_gpus_first() -> None:
    gpus = [gpu("g0", "A100-40GB"), gpu("g1", "A100-40GB", ("3g.20gb", 4)), gpu("g2", "A100-40GB")]
    got = mig.place_on_node(gpus, ["1g.5gb"])
    assert got is not None and got[0].gpu == "g1"
    got = mig.place_on_node(gpus, ["4g.20gb"])
    assert got == (GPUPlacement("g1", Placement("4g.20gb", 0, 4)),)
    got = mig.place_on_node(gpus, ["7g.40gb"])
    assert got is not None and got[0].gpu == "g0"  # an empty GPU only when no partly used one can
    assert mig.place_on_node(gpus, ["7g.40gb"] * 3) is None


def test_node_splits_a_batch_over_gpus_and_keeps_request_order() -> None:
    gpus = [gpu("a", "A100-40GB", ("4g.20gb", 0)), gpu("b", "A100-40GB", ("3g.20gb", 0))]
    batch = ["1g.5gb", "3g.20gb", "2g.10gb"]  # 3g fills one right half, 2g@4 + 1g@6 the other
    assert mig.place_on_node(gpus, [*batch, "1g.5gb"]) is None
    got = mig.place_on_node(gpus, batch)
    assert got is not None and [g.placement.profile for g in got] == batch
    by_gpu: dict[str, list[Placement]] = {}
    for x in got:
        by_gpu.setdefault(x.gpu, []).append(x.placement)
    for g in gpus:
        mig.allocate(mig.geometry(g.model), g.slices, by_gpu.get(g.name, []))  # valid next to what is there


@st.composite
def node_cases(draw: st.DrawFn) -> tuple[list[str], list[Layout], tuple[str, ...]]:
    models = draw(st.lists(st.sampled_from(["A100-40GB", "A100-80GB", "A30-24GB"]), min_size=1, max_size=3))
    layouts = [draw(st.sampled_from(brute_layouts(m))) for m in models]
    names = sorted({p.name for m in models for p in mig.geometry(m).profiles})
    batch = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=4)))
    return models, layouts, batch


def brute_node_fits(models: list[str], layouts: list[Layout], batch: tuple[str, ...]) -> bool:
    for assignment in itertools.product(range(len(models)), repeat=len(batch)):
        ok = True
        for i, (model, layout) in enumerate(zip(models, layouts, strict=True)):
            part = [b for b, a in zip(batch, assignment, strict=True) if a == i]
            offered = {p.name for p in mig.geometry(model).profiles}
            if part and (not set(part) <= offered or not brute_fits(model, layout, part)):
                ok = False
                break
        if ok:
            return True
    return False


@settings(max_examples=200, deadline=None)
@given(node_cases())
def test_node_placement_is_sound_and_complete(case: tuple[list[str], list[Layout], tuple[str, ...]]) -> None:
    models, layouts, batch = case
    gpus = [
        GPU(f"g{i}", m, tuple(to_placements(m, lay))) for i, (m, lay) in enumerate(zip(models, layouts, strict=True))
    ]
    got = mig.place_on_node(gpus, batch)
    assert (got is not None) == brute_node_fits(models, layouts, batch)
    if got is None:
        return
    assert [g.placement.profile for g in got] == list(batch)
    for i, g in enumerate(gpus):
        mine = [x.placement for x in got if x.gpu == g.name]
        assert_sound(models[i], list(g.slices), mine, [p.profile for p in mine])
    rev = mig.place_on_node(gpus, batch[::-1])
    assert rev is not None and Counter(rev) == Counter(got)  # order invariant on a node too


def test_cluster_prefers_a_node_with_room_on_a_partly_used_gpu() -> None:
    empty = Node("empty", (gpu("e0", "A100-40GB"), gpu("e1", "A100-40GB")))
    busy = Node("busy", (gpu("b0", "A100-40GB", ("4g.20gb", 0)), gpu("b1", "A100-40GB")))
    full = Node("full", (gpu("f0", "A100-40GB", ("7g.40gb", 0)),))
    got = mig.place_in_cluster([empty, full, busy], ["2g.10gb"])
    assert got is not None and got.node == "busy" and got.slices[0].gpu == "b0"
    got = mig.place_in_cluster([empty, full, busy], ["7g.40gb", "7g.40gb"])
    assert got is not None and got.node == "empty"
    assert mig.place_in_cluster([full], ["1g.5gb"]) is None
    assert mig.place_in_cluster([], ["1g.5gb"]) is None


def test_cluster_names_mean_what_they_mean_on_each_model() -> None:
    a40 = Node("a40", (gpu("x", "A100-40GB", ("3g.20gb", 4)),))
    a80 = Node("a80", (gpu("y", "NVIDIA A100-SXM4-80GB", ("3g.40gb", 4)),))
    got = mig.place_in_cluster([a40, a80], ["1g.5gb"])  # only an A100-40GB offers 1g.5gb
    assert got is not None and got.node == "a40"
    got = mig.place_in_cluster([a40, a80], ["1g.20gb", "1g.20gb"])  # only the 80GB one
    assert got is not None and got.node == "a80"
    with pytest.raises(ProfileError):
        mig.place_in_cluster([a40, a80], ["1g.20"])
    with pytest.raises(UnknownGPUModelError):
        mig.place_on_node([GPU("t4", "Tesla T4")], ["1g.5gb"])
