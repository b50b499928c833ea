"""MIG geometry per GPU model, and fragmentation-aware placement of GPU instances (slices).

Why this exists: a MIG GPU instance occupies a contiguous run of memory slices at one of a few fixed
starts, so where a slice goes decides what can still be created next to it. First-fit in request order
(what DAS does) rejects batches that fit, e.g. `[2g.10gb, 4g.20gb]` on an A100-40GB. Here a batch is
solved jointly (the answer depends on the multiset, never on the order; a batch fits iff some valid
layout holds it), and among all layouts that hold it we keep the one that keeps the most placements
possible (see `place`). Across a node's GPUs, partly used GPUs fill first, busy ones before nearly
empty ones (`place_on_node`).

Geometry comes from NVIDIA's placement tables (`nvidia-smi mig -lgipp`), keyed by the nvidia-smi
profile ID and the size in memory slices; names are derived per model (1g.5gb on A100-40GB is the
same geometry as 1g.10gb on A100-80GB). The slice count of a GPU is the largest placement end in its
table (8, or 4 on A30), never a constant. Validity of a layout: placements start where the table
allows, do not overlap, and respect the per-profile maximum counts, with at most one media-extension
(`+me`) instance per GPU (the A30's two `+me` profiles are assumed to exclude each other).

Model names are normalised (see `normalize_model`): the canonical keys are `KNOWN_MODELS`; NVML names
("NVIDIA A100-PCIE-40GB"), GPU feature discovery labels ("NVIDIA-A100-SXM4-40GB",
"NVIDIA-H100-80GB-HBM3-MIG-1g.10gb") and short forms ("A100-40GB", "h100 nvl") map onto them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache, lru_cache

import msgspec

from .errors import PlacementError, ProfileError, UnknownGPUModelError

__all__ = [
    "ACCEPTED_MODELS",
    "GPU",
    "KNOWN_MODELS",
    "GPUPlacement",
    "Geometry",
    "Node",
    "NodePlacement",
    "Placement",
    "Profile",
    "accepted_models_text",
    "allocate",
    "check_layout",
    "free_capacity",
    "free_placements",
    "future_options",
    "geometry",
    "normalize_model",
    "parse_profile",
    "place",
    "place_in_cluster",
    "place_on_node",
    "release",
    "slice_at",
    "usable_compute",
]


# ------------------------------------------------------------------------------------------ tables


class Profile(msgspec.Struct, frozen=True):
    """One GPU-instance profile of one GPU model.

    `profile_id` is what `nvidia-smi mig -cgi/-lgip` show (19, 20, 15, 14, 9, 5, 0 on 8-slice GPUs);
    `nvml_index` is the NVML_GPU_INSTANCE_PROFILE_* index that NVML's GetGpuInstanceProfileInfo takes
    (and DAS stores as giProfileId). Both are kept because mixing them up is a known source of bugs.
    """

    name: str
    profile_id: int
    nvml_index: int
    compute: int
    size: int
    starts: tuple[int, ...]
    max_count: int
    media_extensions: bool
    memory_gb: int


class Geometry(msgspec.Struct, frozen=True):
    """The MIG geometry of one GPU model: its profiles and how many memory/compute slices it has."""

    model: str
    memory_gb: int
    slices: int
    compute_slices: int
    profiles: tuple[Profile, ...]

    def profile(self, name: str | Profile) -> Profile:
        return parse_profile(self, name)


class Placement(msgspec.Struct, frozen=True):
    """One GPU instance: `start` and `size` in memory slices, as NVML's nvmlGpuInstancePlacement_t.

    Its JSON form is what `gpuops mig plan` prints. Layouts are kept sorted by start (see `check_layout`).
    """

    profile: str
    start: int
    size: int


def _physical(pl: Placement) -> tuple[int, int, str]:
    return pl.start, pl.size, pl.profile


# (profile_id, nvml_index, compute, size, starts, max_count, +me): NVIDIA's tables (`nvidia-smi mig -lgipp`).
_Row = tuple[int, int, int, int, tuple[int, ...], int, bool]
_EIGHT_SLICE: tuple[_Row, ...] = (
    (19, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False),
    (20, 7, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True),
    (15, 9, 1, 2, (0, 2, 4, 6), 4, False),
    (14, 1, 2, 2, (0, 2, 4), 3, False),
    (9, 2, 3, 4, (0, 4), 2, False),
    (5, 3, 4, 4, (0,), 1, False),
    (0, 4, 7, 8, (0,), 1, False),
)
_A30: tuple[_Row, ...] = (
    (14, 0, 1, 1, (0, 1, 2, 3), 4, False),
    (21, 7, 1, 1, (0, 1, 2, 3), 1, True),
    (5, 1, 2, 2, (0, 2), 2, False),
    (6, 8, 2, 2, (0, 2), 1, True),
    (0, 3, 4, 4, (0,), 1, False),
)
_MODEL_TABLES: dict[str, tuple[int, tuple[_Row, ...]]] = {
    "A100-40GB": (40, _EIGHT_SLICE),
    "A100-80GB": (80, _EIGHT_SLICE),
    "H100-80GB": (80, _EIGHT_SLICE),
    "H100-94GB": (94, _EIGHT_SLICE),
    "H100-96GB": (96, _EIGHT_SLICE),
    "H200-141GB": (141, _EIGHT_SLICE),
    "B200-180GB": (180, _EIGHT_SLICE),
    "A30-24GB": (24, _A30),
}
KNOWN_MODELS: tuple[str, ...] = tuple(_MODEL_TABLES)
"""Canonical model keys, one per MIG geometry/naming we know."""


def _name(compute: int, memory_gb: int, media: bool) -> str:
    return f"{compute}g.{memory_gb}gb" + ("+me" if media else "")


def _build(model: str) -> Geometry:
    total_gb, rows = _MODEL_TABLES[model]
    slices = max(start + size for _, _, _, size, starts, _, _ in rows for start in starts)
    profiles = []
    for pid, index, compute, size, starts, max_count, media in rows:
        # NVIDIA's naming (mig-parted, DAS discovery): memory share of the GPU, rounded half up to whole GB.
        gb = int(Fraction(size * total_gb, slices) + Fraction(1, 2))
        profiles.append(Profile(_name(compute, gb, media), pid, index, compute, size, starts, max_count, media, gb))
    return Geometry(model, total_gb, slices, max(p.compute for p in profiles), tuple(profiles))


_GEOMETRIES: dict[str, Geometry] = {m: _build(m) for m in KNOWN_MODELS}


# ------------------------------------------------------------------------------------------ names

# Family -> {memory in GB written in the name (None: not written) -> canonical model}.
_FAMILIES: dict[str, dict[int | None, str]] = {
    "A100": {40: "A100-40GB", 80: "A100-80GB"},  # no default: both sizes are common
    "A30": {24: "A30-24GB", None: "A30-24GB"},
    "H100": {80: "H100-80GB", 94: "H100-94GB", 96: "H100-96GB", None: "H100-80GB"},
    "GH200": {96: "H100-96GB", 480: "H100-96GB", None: "H100-96GB"},  # "GH200 480GB" = 96 GB HBM3 + LPDDR
    "H200": {141: "H200-141GB", None: "H200-141GB"},
    "B200": {180: "B200-180GB", None: "B200-180GB"},
}
ACCEPTED_MODELS: tuple[str, ...] = tuple(
    f"{family}-{memory}GB"
    for family, sizes in _FAMILIES.items()
    for memory in sorted(m for m in sizes if m is not None)
)
"""Every model name `normalize_model` accepts, written FAMILY-MEMORY: what its errors and `gpuops mig plan --help`
list. Not the families: "GH200" in such a list reads as every GH200, and a GH200 144GB has no table here."""
_DEFAULT_SIZED = tuple(family for family, sizes in _FAMILIES.items() if None in sizes)
"""Families whose bare name (no memory) is accepted."""
_NOISE = frozenset({"NVIDIA", "TESLA", "SXM", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3", "HBM3E", "NVL"})
_MEMORY_TOKEN = re.compile(r"^(\d+)GB?$")
_MIG_SUFFIX = re.compile(r"[\s_-]+MIG[\s_-].*$", re.IGNORECASE)


def accepted_models_text() -> str:
    """The models `normalize_model` accepts, for humans (an unknown model's error, `gpuops mig plan --help`):
    every name in it is accepted, and it promises nothing broader."""
    *most, last = _DEFAULT_SIZED
    bare = f"{', '.join(most)} and {last}" if most else last
    return (f"{', '.join(ACCEPTED_MODELS)}; also their NVML names and GPU feature discovery labels (such as "
            f"'NVIDIA A100-SXM4-40GB'), and {bare} without the memory")


def _unknown_model(model: str, why: str) -> UnknownGPUModelError:
    return UnknownGPUModelError(f"gpu model {model!r}: {why}; accepted models: {accepted_models_text()}")


def normalize_model(model: str) -> str:
    """The canonical key (one of KNOWN_MODELS) of a GPU model name as NVIDIA and Kubernetes write it.

    Mapping: the family token (A100, A30, H100, GH200, H200, B200) plus the memory written in the name
    picks the geometry. Form-factor and memory-type tokens (SXM4/SXM5/PCIe/HBM3/HBM3e/NVL, "NVIDIA",
    "Tesla") are ignored, as is a trailing "-MIG-<profile>" (GFD's single-strategy product label).
    Without a memory token: A30 -> 24GB, H100 -> 80GB, H100 NVL -> 94GB, GH200 -> 96GB (also
    "GH200 480GB"), H200 -> 141GB, B200 -> 180GB; a bare "A100" is ambiguous (40 or 80 GB) and rejected.
    """
    if not isinstance(model, str) or not model.strip():
        raise _unknown_model(str(model), "a model name must be a non-empty string")
    return model if model in _MODEL_TABLES else _normalize(model)


@lru_cache(maxsize=256)
def _normalize(model: str) -> str:
    text = _MIG_SUFFIX.sub("", model.strip()).upper()
    tokens = [t for t in re.split(r"[\s_-]+", text) if t]
    family: str | None = None
    memory: int | None = None
    nvl = False
    unknown: list[str] = []
    for tok in tokens:
        if tok in _FAMILIES and family is None:
            family = tok
        elif (m := _MEMORY_TOKEN.match(tok)) and memory is None:
            memory = int(m.group(1))
        elif tok == "NVL":
            nvl = True
        elif tok not in _NOISE:
            unknown.append(tok)
    if family is None:
        raise _unknown_model(model, "not a MIG-capable GPU model gpuops has tables for")
    if unknown:
        raise _unknown_model(model, f"unrecognised part {unknown[0]!r}")
    if memory is None and nvl and family == "H100":
        memory = 94
    sizes = _FAMILIES[family]
    if memory not in sizes:
        if memory is None:
            raise _unknown_model(model, f"ambiguous, say the memory: {' or '.join(sorted(set(sizes.values())))}")
        raise _unknown_model(model, f"no MIG geometry for {family} with {memory}GB")
    return sizes[memory]


def geometry(model: str) -> Geometry:
    """The MIG geometry of a GPU model (any spelling `normalize_model` accepts)."""
    return _GEOMETRIES[normalize_model(model)]


_PROFILE_NAME = re.compile(r"^(\d+)g\.(\d+)gb((?:[+.-][a-z]+(?:\.[a-z]+)?)*)$")
_PREFIXES = ("nvidia.com/mig-", "gpuops.io/mig-", "mig ")


def _canonical_attrs(attrs: str) -> str:
    # The device plugin writes "+" as "." in resource names (nvidia.com/mig-1g.10gb.me).
    return "+me" if attrs in ("+me", ".me") else attrs


def _canonical_name(name: str) -> str:
    """NVIDIA's spelling of a profile name, independent of the model; ProfileError if it is not one."""
    if not isinstance(name, str):
        raise ProfileError(f"profile must be a string such as '1g.10gb', got {type(name).__name__}")
    text = name.strip().lower()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):].strip()
            break
    m = _PROFILE_NAME.match(text)
    if m is None:
        raise ProfileError(
            f"profile {name!r} is not a MIG profile name: expected '<G>g.<GB>gb' with an optional '+me', "
            "e.g. '1g.10gb', '1g.10gb+me', 'nvidia.com/mig-1g.10gb', 'MIG 1g.10gb'"
        )
    return f"{int(m.group(1))}g.{int(m.group(2))}gb{_canonical_attrs(m.group(3))}"


def parse_profile(geom: Geometry, name: str | Profile) -> Profile:
    """The profile `name` denotes on this model: "1g.10gb", "1g.10gb+me", "MIG 1g.10gb",
    "nvidia.com/mig-1g.10gb" and "nvidia.com/mig-1g.10gb.me" (the device plugin's spelling of +me)."""
    if isinstance(name, Profile):
        if name in geom.profiles:
            return name
        raise ProfileError(f"profile {name.name!r} (ID {name.profile_id}) is not one of {geom.model}'s profiles")
    lookup = _profile_lookup(geom.model)
    hit = lookup.get(name)
    if hit is not None:
        return hit
    canonical = _canonical_name(name)
    hit = lookup.get(canonical)
    if hit is None:
        raise ProfileError(
            f"profile {name!r} is not offered by {geom.model}; it offers: {', '.join(p.name for p in geom.profiles)}"
        )
    return hit


@cache
def _profile_lookup(model: str) -> dict[str, Profile]:
    return {p.name: p for p in _GEOMETRIES[model].profiles}


# ------------------------------------------------------------------------------------------ layouts


def slice_at(geom: Geometry, profile: str | Profile, start: int) -> Placement:
    """A placement of `profile` at `start` (checked against the table)."""
    p = parse_profile(geom, profile)
    if start not in p.starts:
        raise PlacementError(
            f"{p.name} cannot start at memory slice {start} on {geom.model}; valid starts: {list(p.starts)}"
        )
    return Placement(p.name, start, p.size)


def check_layout(geom: Geometry, placements: Iterable[Placement]) -> tuple[Placement, ...]:
    """The canonical (sorted, canonical names) form of a layout, or PlacementError/ProfileError if the
    GPU could not hold it: a start the table does not offer, a wrong size, an overlap, too many of a
    profile, or more than one media-extension instance."""
    out: list[Placement] = []
    for pl in placements:
        if not isinstance(pl, Placement):
            raise PlacementError(f"layout entries must be Placement, got {type(pl).__name__}")
        p = parse_profile(geom, pl.profile)
        if pl.size != p.size:
            raise PlacementError(
                f"{p.name} at {pl.start} has size {pl.size}; on {geom.model} it occupies {p.size} memory slices"
            )
        out.append(slice_at(geom, p, pl.start))
    out.sort(key=_physical)
    _state(geom, out)
    return tuple(out)


def allocate(geom: Geometry, existing: Iterable[Placement], new: Iterable[Placement]) -> tuple[Placement, ...]:
    """The layout after creating `new` next to `existing` (PlacementError if they collide)."""
    return check_layout(geom, [*existing, *new])


def release(geom: Geometry, existing: Iterable[Placement], gone: Iterable[Placement]) -> tuple[Placement, ...]:
    """The layout after destroying `gone`; each must be allocated in `existing` (exact inverse of allocate)."""
    left = list(check_layout(geom, existing))
    for pl in gone:
        p = parse_profile(geom, pl.profile)
        target = Placement(p.name, pl.start, pl.size)
        if target not in left:
            raise PlacementError(
                f"cannot release {p.name}@{pl.start} (size {pl.size}) on {geom.model}: not allocated; "
                f"allocated: {', '.join(f'{x.profile}@{x.start}' for x in left) or 'nothing'}"
            )
        left.remove(target)
    return tuple(left)


# ------------------------------------------------------------------------------------------ search state
#
# A GPU's state is (mask, counts): the occupied memory slices as a bit mask, and how many instances each
# capped group holds (profiles whose table maximum is below what the slices alone allow, i.e. the +me
# singletons, and the "one media-extension instance per GPU" group). Requests are count vectors over the
# model's profiles. `_options(state)` is the set of every request vector that still fits: the exact
# feasibility oracle (a few hundred states per model, each computed once), from which `_value` scores
# fragmentation. The search only ever steps into states whose remaining request is still in `_options`,
# so it never backtracks out of a dead end.

_State = tuple[int, tuple[int, ...]]
_Vec = tuple[int, ...]
_Value = tuple[int, int, int]


@dataclass(eq=False)
class _Compiled:
    geom: Geometry
    full: int
    masks: tuple[tuple[tuple[int, int], ...], ...]  # per profile: (start, mask)
    at_start: tuple[tuple[tuple[int, int], ...], ...]  # per slice: (profile, mask) starting there
    groups: tuple[tuple[frozenset[int], int], ...]  # (profiles, cap)
    group_of: tuple[tuple[int, ...], ...]  # per profile: its groups
    search_order: tuple[int, ...]  # most constrained profile first
    zero: _Vec
    index: dict[str, int]
    options: dict[_State, frozenset[_Vec]] = field(default_factory=dict)
    values: dict[_State, _Value] = field(default_factory=dict)


def _disjoint_capacity(p: Profile) -> int:
    """How many instances the slice table alone allows (greedy by end is optimal for equal sizes)."""
    count, end = 0, -1
    for s in sorted(p.starts):
        if s > end:
            count, end = count + 1, s + p.size - 1
    return count


@cache
def _compiled(model: str) -> _Compiled:
    geom = _GEOMETRIES[model]
    n = len(geom.profiles)
    masks = tuple(tuple((s, ((1 << p.size) - 1) << s) for s in p.starts) for p in geom.profiles)
    at_start = tuple(
        tuple((i, m) for i in range(n) for s, m in masks[i] if s == slot) for slot in range(geom.slices)
    )
    groups: list[tuple[frozenset[int], int]] = [
        (frozenset({i}), p.max_count) for i, p in enumerate(geom.profiles) if p.max_count < _disjoint_capacity(p)
    ]
    media = frozenset(i for i, p in enumerate(geom.profiles) if p.media_extensions)
    if len(media) > 1:
        groups.append((media, 1))
    group_of = tuple(tuple(g for g, (members, _) in enumerate(groups) if i in members) for i in range(n))
    order = sorted(range(n), key=lambda i: (len(geom.profiles[i].starts), -geom.profiles[i].size, i))
    return _Compiled(
        geom, (1 << geom.slices) - 1, masks, at_start, tuple(groups), group_of, tuple(order), (0,) * n,
        {p.name: i for i, p in enumerate(geom.profiles)},
    )


def _bump(c: _Compiled, counts: tuple[int, ...], p: int) -> tuple[int, ...] | None:
    if not c.group_of[p]:
        return counts
    new = list(counts)
    for g in c.group_of[p]:
        new[g] += 1
        if new[g] > c.groups[g][1]:
            return None
    return tuple(new)


def _state(geom: Geometry, layout: Sequence[Placement]) -> _State:
    c = _compiled(geom.model)
    mask = 0
    counts: tuple[int, ...] | None = (0,) * len(c.groups)
    by_start: dict[int, Placement] = {}
    for pl in layout:
        p = c.index[pl.profile]
        m = ((1 << pl.size) - 1) << pl.start
        if mask & m:
            other = next(o for s, o in sorted(by_start.items()) if s <= pl.start + pl.size - 1
                         and s + o.size > pl.start)
            raise PlacementError(
                f"{pl.profile}@{pl.start} overlaps {other.profile}@{other.start} on {geom.model} "
                f"(memory slices {pl.start}-{pl.start + pl.size - 1})"
            )
        mask |= m
        by_start[pl.start] = pl
        assert counts is not None
        counts = _bump(c, counts, p)
        if counts is None:
            members = [geom.profiles[i].name for g in c.group_of[p] for i in sorted(c.groups[g][0])]
            raise PlacementError(
                f"too many {pl.profile} on one {geom.model}: at most one of {', '.join(dict.fromkeys(members))} "
                "per GPU" if geom.profiles[p].media_extensions else
                f"too many {pl.profile} on one {geom.model}: at most {geom.profiles[p].max_count} per GPU"
            )
    assert counts is not None
    return mask, counts


def _options(c: _Compiled, mask: int, counts: tuple[int, ...]) -> frozenset[_Vec]:
    """Every request vector (including the empty one) that fits on the free slices of this state."""
    key = (mask, counts)
    hit = c.options.get(key)
    if hit is not None:
        return hit
    if mask == c.full:
        out = frozenset({c.zero})
    else:
        slot = (~mask & (mask + 1)).bit_length() - 1  # lowest free slice: anything covering it starts here
        acc = set(_options(c, mask | (1 << slot), counts))  # ... or it stays free for good
        for p, m in c.at_start[slot]:
            if m & mask:
                continue
            bumped = _bump(c, counts, p)
            if bumped is None:
                continue
            for v in _options(c, mask | m, bumped):
                acc.add((*v[:p], v[p] + 1, *v[p + 1:]))
        out = frozenset(acc)
    c.options[key] = out
    return out


def _singles(c: _Compiled, mask: int, counts: tuple[int, ...]) -> int:
    return sum(
        1 for p, starts in enumerate(c.masks) for _, m in starts if not m & mask and _bump(c, counts, p) is not None
    )


def _capacity(c: _Compiled, mask: int, counts: tuple[int, ...]) -> tuple[int, ...]:
    """Per profile, how many more of it alone fit (nvidia-smi's "Free" column)."""
    cap = [0] * len(c.zero)
    for v in _options(c, mask, counts):
        nonzero = [i for i, x in enumerate(v) if x]
        if len(nonzero) == 1:
            i = nonzero[0]
            cap[i] = max(cap[i], v[i])
    return tuple(cap)



def _value(c: _Compiled, mask: int, counts: tuple[int, ...]) -> _Value:
    """How much a GPU state can still take, compared lexicographically: the compute of every profile
    times how many of it still fit (so a free 4g slot outweighs a free 1g slot), then how many
    different requests still fit, then how many single placements are open. Placement keeps the most."""
    key = (mask, counts)
    hit = c.values.get(key)
    if hit is None:
        weighted = sum(p.compute * n for p, n in zip(c.geom.profiles, _capacity(c, mask, counts), strict=True))
        hit = (weighted, len(_options(c, mask, counts)), _singles(c, mask, counts))
        c.values[key] = hit
    return hit


@lru_cache(maxsize=1 << 16)
def _solve(model: str, mask: int, counts: tuple[int, ...], vec: _Vec) -> tuple[tuple[int, int], ...] | None:
    """The best joint placement of request vector `vec` on a state: (profile, start) pairs, or None."""
    c = _compiled(model)
    if vec not in _options(c, mask, counts):
        return None
    todo = [p for p in c.search_order for _ in range(vec[p])]
    best: list[tuple[_Value, tuple[tuple[int, int], ...]]] = []

    def dfs(i: int, mask: int, counts: tuple[int, ...], rest: list[int], floor: int,
            chosen: tuple[tuple[int, int], ...]) -> None:
        if i == len(todo):
            key = _value(c, mask, counts)
            if not best or key > best[0][0]:
                best[:] = [(key, chosen)]
            return
        p = todo[i]
        rest[p] -= 1
        tail = tuple(rest)
        same_next = i + 1 < len(todo) and todo[i + 1] == p
        for s, m in c.masks[p]:
            if s < floor or m & mask:  # identical requests take increasing starts (no duplicate layouts)
                continue
            bumped = _bump(c, counts, p)
            if bumped is None or tail not in _options(c, mask | m, bumped):
                continue
            dfs(i + 1, mask | m, bumped, rest, s + 1 if same_next else 0, (*chosen, (p, s)))
        rest[p] += 1

    dfs(0, mask, counts, list(vec), 0, ())
    return best[0][1] if best else None


def _request_vector(c: _Compiled, profiles: Sequence[Profile]) -> _Vec:
    vec = [0] * len(c.zero)
    for p in profiles:
        vec[c.index[p.name]] += 1
    return tuple(vec)


# ------------------------------------------------------------------------------------------ one GPU


def place(geom: Geometry, existing: Iterable[Placement], requests: Sequence[str | Profile]) -> (
        tuple[Placement, ...] | None):
    """Where to create `requests` on a GPU that already holds `existing`, or None if no layout holds both.

    The batch is solved as a multiset: it fits iff some valid layout contains existing + batch, and the
    chosen layout is the same whatever the order of `requests`. Among the layouts that fit, the one that
    keeps the most placements possible wins: the most compute still creatable per profile (a free 4g slot
    counts 4, a free 1g slot 1), then the most different future requests that still fit, then the most
    open single placements, then the lowest starts. The result is aligned with `requests` (identical
    profiles get increasing starts). Existing slices never move.
    """
    layout = check_layout(geom, existing)
    profiles = [parse_profile(geom, r) for r in requests]
    if not profiles:
        return ()
    c = _compiled(geom.model)
    mask, counts = _state(geom, layout)
    found = _solve(geom.model, mask, counts, _request_vector(c, profiles))
    if found is None:
        return None
    starts: dict[int, list[int]] = {}
    for p, s in found:
        starts.setdefault(p, []).append(s)
    for lst in starts.values():
        lst.sort(reverse=True)
    out = []
    for prof in profiles:
        s = starts[c.index[prof.name]].pop()
        out.append(Placement(prof.name, s, prof.size))
    return tuple(out)


def future_options(geom: Geometry, existing: Iterable[Placement]) -> int:
    """Fragmentation score of a layout: how many different non-empty requests (profile multisets) still
    fit on it. 127 on an empty 8-slice GPU, 19 on an empty A30; 0 on a full one."""
    c = _compiled(geom.model)
    mask, counts = _state(geom, check_layout(geom, existing))
    return len(_options(c, mask, counts)) - 1


def free_placements(geom: Geometry, existing: Iterable[Placement]) -> dict[str, tuple[int, ...]]:
    """Per profile, the starts where one more instance could be created now (`-lgipp`, minus what is taken)."""
    c = _compiled(geom.model)
    mask, counts = _state(geom, check_layout(geom, existing))
    return {
        p.name: tuple(s for s, m in c.masks[i] if not m & mask) if _bump(c, counts, i) is not None else ()
        for i, p in enumerate(geom.profiles)
    }


def free_capacity(geom: Geometry, existing: Iterable[Placement]) -> dict[str, int]:
    """Per profile, how many more instances of it alone could still be created (`nvidia-smi mig -lgip` Free)."""
    c = _compiled(geom.model)
    mask, counts = _state(geom, check_layout(geom, existing))
    return {p.name: n for p, n in zip(geom.profiles, _capacity(c, mask, counts), strict=True)}


def usable_compute(geom: Geometry, existing: Iterable[Placement],
                   profiles: Iterable[str | Profile] | None = None) -> int:
    """The most compute slices that new instances of `profiles` (default: any of the model's) could still take
    on this layout, together. Free compute beyond it is stranded by placement rules: after `1g.5gb` at 0 and at
    4, four compute slices are free but no `3g.20gb` fits (usable 0 for it, 4 for `1g.5gb`)."""
    c = _compiled(geom.model)
    mask, counts = _state(geom, check_layout(geom, existing))
    if profiles is None:
        allowed = frozenset(range(len(geom.profiles)))
    else:
        allowed = frozenset(c.index[parse_profile(geom, p).name] for p in profiles)
    return _best_compute(geom.model, mask, counts, allowed)


@lru_cache(maxsize=4096)
def _best_compute(model: str, mask: int, counts: tuple[int, ...], allowed: frozenset[int]) -> int:
    """Cached: a fleet's GPUs share few states, and callers ask again every time they look."""
    c = _compiled(model)
    compute = [p.compute for p in c.geom.profiles]
    return max((sum(n * compute[i] for i, n in enumerate(v)) for v in _options(c, mask, counts)
                if all(n == 0 or i in allowed for i, n in enumerate(v))), default=0)


# ------------------------------------------------------------------------------------------ node and cluster


class GPU(msgspec.Struct, frozen=True):
    """One MIG-enabled GPU of a node: its model (any spelling) and the slices it holds."""

    name: str
    model: str
    slices: tuple[Placement, ...] = ()


class GPUPlacement(msgspec.Struct, frozen=True):
    gpu: str
    placement: Placement


class Node(msgspec.Struct, frozen=True):
    name: str
    gpus: tuple[GPU, ...]


class NodePlacement(msgspec.Struct, frozen=True):
    """Where a batch goes: a node, and per request (same order) a GPU of that node and a placement."""

    node: str
    slices: tuple[GPUPlacement, ...]


# A node decision minimises a cost, compared lexicographically: how many empty GPUs it starts using (so
# partly used GPUs fill first), then the loss of `_value`'s weighted capacity plus the emptying delay of
# each GPU it touches (`_emptying_delay`), in 1/_SCALE compute slice, then the rest of `_value`'s loss.
_Cost = tuple[int, int, int, int]
_NO_COST: _Cost = (0, 0, 0, 0)
# An instance takes at least one memory slice, so a GPU that can take one more holds n < slices of them and
# 1/(n+1) is exact in these units.
_SCALE = math.lcm(*range(1, max(g.slices for g in _GEOMETRIES.values()) + 1))


@cache
def _emptying_delay(model: str, held: int) -> int:
    """What putting a pod's slices on a GPU that holds `held` instances costs that GPU's chance to empty.

    Only an empty GPU takes a whole-GPU profile, and a GPU empties only when its last instance leaves. With
    independent lifetimes the wait for n of them to all leave grows like the harmonic number H(n), so one
    more lifetime (a pod's slices leave together, so one per pod, however many slices it puts there) delays
    it by about 1/(n+1) lifetimes: cheap on a busy GPU, dear on a nearly empty one. It is priced at the
    whole GPU's compute per lifetime, in 1/_SCALE compute slice. The weighted-capacity loss alone sees only
    what is free now, so it would as soon put a 1g next to one lone instance as on a busy GPU with the same
    free shape; this keeps pods on busy GPUs and lets quiet ones drain. In bench/accounting.py's churn it
    raises acceptance on every row (0.2 to 0.7 points), and by 0.3/0.5 points at load 0.8 on ten other seeds.
    """
    return _GEOMETRIES[model].compute_slices * _SCALE // (held + 1)


def _add(a: _Cost, b: _Cost) -> _Cost:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]


@dataclass(eq=False)
class _GPUView:
    gpu: GPU
    c: _Compiled
    mask: int
    counts: tuple[int, ...]
    reqmap: tuple[int, ...]  # request kind k -> profile index on this GPU's model, or -1 if not offered


def _request_kinds(requests: Sequence[str]) -> tuple[list[str], list[int]]:
    """Distinct requested profiles, spelled canonically (names are per model, so they are matched to
    profiles per GPU later), and each request's kind. Malformed names raise ProfileError here."""
    names = [_canonical_name(r) for r in requests]
    kinds = sorted(set(names))  # sorted, so nothing downstream depends on the order of the requests
    return kinds, [kinds.index(n) for n in names]


@lru_cache(maxsize=1 << 14)
def _gpu_state(model: str, slices: tuple[Placement, ...]) -> tuple[str, int, tuple[int, ...]]:
    """(canonical model, mask, counts) of a GPU; cached because a node's GPUs rarely change between decisions."""
    geom = geometry(model)
    mask, counts = _state(geom, check_layout(geom, slices))
    return geom.model, mask, counts


def _views(gpus: Sequence[GPU], kinds: Sequence[str]) -> list[_GPUView]:
    views = []
    for g in gpus:
        if not isinstance(g, GPU):
            raise PlacementError(f"gpus must hold GPU values, got {type(g).__name__}")
        model, mask, counts = _gpu_state(g.model, tuple(g.slices))
        c = _compiled(model)
        reqmap = tuple(c.index.get(k, -1) for k in kinds)
        views.append(_GPUView(g, c, mask, counts, reqmap))
    return views


@lru_cache(maxsize=1 << 15)
def _gpu_choices(model: str, mask: int, counts: tuple[int, ...], reqmap: tuple[int, ...],
                 need: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], _Cost, int], ...]:
    """Every share of the request vector `need` (over request kinds) this GPU can take, with its cost and
    compute, including the empty share."""
    c = _compiled(model)
    kind_of = {p: k for k, p in enumerate(reqmap) if p >= 0}
    before = _value(c, mask, counts)
    out: list[tuple[tuple[int, ...], _Cost, int]] = []
    for vec in _options(c, mask, counts):
        share = [0] * len(need)
        ok = True
        for p, n in enumerate(vec):
            if n:
                k = kind_of.get(p)
                if k is None or n > need[k]:
                    ok = False
                    break
                share[k] = n
        if not ok:
            continue
        if not any(share):
            out.append((tuple(share), _NO_COST, 0))
            continue
        placed = _solve(model, mask, counts, vec)
        assert placed is not None
        m2, c2 = _after(c, mask, counts, placed)
        after = _value(c, m2, c2)
        cost = (int(mask == 0), (before[0] - after[0]) * _SCALE, before[1] - after[1], before[2] - after[2])
        out.append((tuple(share), cost, sum(c.geom.profiles[p].compute for p, _ in placed)))
    out.sort(key=lambda x: (-x[2], x[1], x[0]))
    return tuple(out)


def _after(c: _Compiled, mask: int, counts: tuple[int, ...], placed: Iterable[tuple[int, int]]) -> _State:
    for p, s in placed:
        mask |= ((1 << c.geom.profiles[p].size) - 1) << s
        bumped = _bump(c, counts, p)
        assert bumped is not None
        counts = bumped
    return mask, counts


def _priced(v: _GPUView, need: tuple[int, ...]) -> list[tuple[tuple[int, ...], _Cost, int]]:
    """`_gpu_choices` plus the emptying delay, which depends on how many instances the GPU holds (the
    cached state, a mask and counts, does not say)."""
    model = v.c.geom.model
    delay = _emptying_delay(model, len(v.gpu.slices))
    return [
        (share, (cost[0], cost[1] + delay, cost[2], cost[3]) if any(share) else cost, compute)
        for share, cost, compute in _gpu_choices(model, v.mask, v.counts, v.reqmap, need)
    ]


def _node_plan(gpus: Sequence[GPU], requests: Sequence[str]) -> tuple[_Cost, tuple[GPUPlacement, ...]] | None:
    kinds, of = _request_kinds(requests)
    if not requests:
        return _NO_COST, ()
    need = tuple(of.count(k) for k in range(len(kinds)))
    views = _views(gpus, kinds)
    order = sorted(range(len(views)), key=lambda i: (views[i].mask == 0, -views[i].mask.bit_count(), i))
    choices = [_priced(views[i], need) for i in order]
    zero = (0,) * len(need)
    # best[j][r]: the cheapest way for GPUs order[j:] to take request vector r: ((cost, -compute on GPU j), share).
    # Exact: every split of the batch over the GPUs is considered, so a batch that fits somehow is placed.
    best: list[dict[tuple[int, ...], tuple[tuple[_Cost, int], tuple[int, ...]]]] = [{} for _ in order]
    best.append({zero: ((_NO_COST, 0), zero)})
    for j in range(len(order) - 1, -1, -1):
        here = best[j]
        for rest, ((rest_cost, _), _) in best[j + 1].items():
            for share, cost, compute in choices[j]:
                r = tuple(a + b for a, b in zip(share, rest, strict=True))
                if any(x > n for x, n in zip(r, need, strict=True)):
                    continue
                key = (_add(cost, rest_cost), -compute)
                old = here.get(r)
                if old is None or key < old[0]:
                    here[r] = (key, share)
    top = best[0].get(need)
    if top is None:
        return None
    out: list[GPUPlacement | None] = [None] * len(requests)
    r = need
    for j, i in enumerate(order):
        share = best[j][r][1]
        r = tuple(a - b for a, b in zip(r, share, strict=True))
        if not any(share):
            continue
        v = views[i]
        vec = [0] * len(v.c.zero)
        for k, n in enumerate(share):
            if n:
                vec[v.reqmap[k]] = n
        placed = _solve(v.c.geom.model, v.mask, v.counts, tuple(vec))
        assert placed is not None
        pools: dict[int, list[int]] = {}
        for p, s in sorted(placed, key=lambda x: -x[1]):
            pools.setdefault(p, []).append(s)
        for idx, k in enumerate(of):
            pool = pools.get(v.reqmap[k]) if share[k] else None
            if out[idx] is None and pool:
                prof = v.c.geom.profiles[v.reqmap[k]]
                out[idx] = GPUPlacement(v.gpu.name, Placement(prof.name, pool.pop(), prof.size))
    assert r == zero and all(x is not None for x in out)
    return top[0][0], tuple(x for x in out if x is not None)


def place_on_node(gpus: Sequence[GPU], requests: Sequence[str]) -> tuple[GPUPlacement, ...] | None:
    """Where a batch of profile names goes on one node's GPUs (aligned with `requests`), or None.

    Exact over splits: if the batch fits on these GPUs in any way, it is placed. Among the ways, the
    decision starts using as few empty GPUs as possible (partly used GPUs fill first), then loses the
    least placement capacity summed over the GPUs it touches (see `place`), each touched GPU also charged
    for delaying the moment it can empty again, which is dearer the fewer instances it holds (so pods
    gather on busy GPUs and quiet ones drain), then puts the larger share on the fuller GPU. A profile
    name means what it means on each GPU's model; a GPU whose model does not offer it simply does not
    take it. Malformed names raise ProfileError, unknown models UnknownGPUModelError, impossible existing
    layouts PlacementError.
    """
    plan = _node_plan(gpus, requests)
    return None if plan is None else plan[1]


def place_in_cluster(nodes: Sequence[Node], requests: Sequence[str]) -> NodePlacement | None:
    """The node (and its GPUs and slices) for a batch, or None if no node can hold it.

    Same cost as `place_on_node` across nodes, so a node where the batch lands on partly used GPUs wins
    over one where it must start an empty GPU; then the least capacity lost plus emptying delay; then
    the fullest node (fewest free memory slices); then the node name.
    """
    best: tuple[tuple[_Cost, int, str], NodePlacement] | None = None
    for node in nodes:
        plan = _node_plan(node.gpus, requests)
        if plan is None:
            continue
        free = sum(geometry(g.model).slices - sum(pl.size for pl in g.slices) for g in node.gpus)
        key = (plan[0], free, node.name)
        if best is None or key < best[0]:
            best = (key, NodePlacement(node.name, plan[1]))
    return None if best is None else best[1]
