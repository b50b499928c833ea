"""The MIG tables and placement rules of the emulated NVIDIA driver, per GPU model.

Written from NVIDIA's MIG user guide, independently of the operator's accounting package, so that a test
comparing the two catches a misreading in either:

* "Supported MIG Profiles": each model's profile names, the fraction of compute and memory each takes, its
  hardware units, and the "Number of Instances Available" of each profile;
* `nvidia-smi mig -lgip` / `-lgipp` as printed there: each profile's ID and its placements `{starts}:size`
  in memory slices. Every 8-slice GPU (A100, H100, H200, B200) lists the same placements; the A30 has 4.

Rules the driver applies when a GPU instance is created: the start must be one the profile lists (else the
placement is invalid); its memory slices must be free, the profile must be below its instance count, and the
GPU's one optical flow accelerator (OFA) can be held by one instance only: the media-extension (`+me`)
profiles and the whole-GPU profile each take it (the hardware-units column gives them "1 OFA", the GPU has
one). A refusal for any of those three is "insufficient resources".

Names are NVIDIA's as the guide writes them per model (1g.5gb on A100-40GB is 1g.10gb on A100-80GB); the
NVML profile index of each profile follows from NVML's NVML_GPU_INSTANCE_PROFILE_* constants: one per compute
size, `_REV1` for the media-extension variants, `_REV2` for a 1g profile with twice the memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["MODELS", "MigModel", "MigProfile", "Placement", "free_capacity", "free_starts", "refusal"]


class Placement(NamedTuple):
    """One GPU instance: its profile's name on its model, and the memory slices it covers."""

    profile: str
    start: int
    size: int


_NVML_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}  # NVML_GPU_INSTANCE_PROFILE_<n>_SLICE
_NVML_REV1 = {1: 7, 2: 8}  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, _2_SLICE_REV1: the +me variants
_NVML_1_SLICE_REV2 = 9  # a 1g profile with twice the memory


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one model."""

    name: str  # "1g.5gb", "1g.5gb+me"
    profile_id: int  # nvidia-smi's ID (-cgi, -lgip)
    nvml_index: int  # what nvmlDeviceGetGpuInstanceProfileInfo takes
    compute: int  # compute slices: the "<n>g" of the name
    size: int  # memory slices
    starts: tuple[int, ...]  # -lgipp
    instances: int  # "Number of Instances Available"
    media: bool  # a +me profile
    ofa: bool  # holds the GPU's optical flow accelerator


@dataclass(frozen=True)
class MigModel:
    """One MIG-capable GPU model."""

    key: str
    memory_gb: int
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def by_id(self, profile_id: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def by_name(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


# nvidia-smi ID -> (starts, memory slices, instances available), from -lgipp and the profiles table.
_EIGHT_SLICES: dict[int, tuple[tuple[int, ...], int, int]] = {
    19: ((0, 1, 2, 3, 4, 5, 6), 1, 7),
    20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    15: ((0, 2, 4, 6), 2, 4),
    14: ((0, 2, 4), 2, 3),
    9: ((0, 4), 4, 2),
    5: ((0,), 4, 1),
    0: ((0,), 8, 1),
}
_FOUR_SLICES: dict[int, tuple[tuple[int, ...], int, int]] = {
    14: ((0, 1, 2, 3), 1, 4),
    21: ((0, 1, 2, 3), 1, 1),
    5: ((0, 2), 2, 2),
    6: ((0, 2), 2, 1),
    0: ((0,), 4, 1),
}

# model -> (memory in GB, placements, nvidia-smi ID -> profile name on that model)
_NAMES: dict[str, tuple[int, dict[int, tuple[tuple[int, ...], int, int]], dict[int, str]]] = {
    "A100-40GB": (40, _EIGHT_SLICES, {19: "1g.5gb", 20: "1g.5gb+me", 15: "1g.10gb", 14: "2g.10gb",
                                      9: "3g.20gb", 5: "4g.20gb", 0: "7g.40gb"}),
    "A100-80GB": (80, _EIGHT_SLICES, {19: "1g.10gb", 20: "1g.10gb+me", 15: "1g.20gb", 14: "2g.20gb",
                                      9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"}),
    "H100-80GB": (80, _EIGHT_SLICES, {19: "1g.10gb", 20: "1g.10gb+me", 15: "1g.20gb", 14: "2g.20gb",
                                      9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"}),
    "H100-94GB": (94, _EIGHT_SLICES, {19: "1g.12gb", 20: "1g.12gb+me", 15: "1g.24gb", 14: "2g.24gb",
                                      9: "3g.47gb", 5: "4g.47gb", 0: "7g.94gb"}),
    "H100-96GB": (96, _EIGHT_SLICES, {19: "1g.12gb", 20: "1g.12gb+me", 15: "1g.24gb", 14: "2g.24gb",
                                      9: "3g.48gb", 5: "4g.48gb", 0: "7g.96gb"}),
    "H200-141GB": (141, _EIGHT_SLICES, {19: "1g.18gb", 20: "1g.18gb+me", 15: "1g.35gb", 14: "2g.35gb",
                                        9: "3g.71gb", 5: "4g.71gb", 0: "7g.141gb"}),
    "B200-180GB": (180, _EIGHT_SLICES, {19: "1g.23gb", 20: "1g.23gb+me", 15: "1g.45gb", 14: "2g.45gb",
                                        9: "3g.90gb", 5: "4g.90gb", 0: "7g.180gb"}),
    "A30-24GB": (24, _FOUR_SLICES, {14: "1g.6gb", 21: "1g.6gb+me", 5: "2g.12gb", 6: "2g.12gb+me", 0: "4g.24gb"}),
}


def _model(key: str) -> MigModel:
    memory_gb, placements, names = _NAMES[key]
    slices = max(start + size for starts, size, _ in placements.values() for start in starts)
    smallest_1g = min(size for pid, (_, size, _) in placements.items() if names[pid].startswith("1g."))
    profiles = []
    for pid, (starts, size, instances) in placements.items():
        name = names[pid]
        compute = int(name.split("g.", 1)[0])
        media = name.endswith("+me")
        if media:
            index = _NVML_REV1[compute]
        elif compute == 1 and size > smallest_1g:
            index = _NVML_1_SLICE_REV2
        else:
            index = _NVML_INDEX[compute]
        profiles.append(MigProfile(name, pid, index, compute, size, starts, instances, media,
                                   media or size == slices))
    return MigModel(key, memory_gb, slices, max(p.compute for p in profiles), tuple(profiles))


MODELS: dict[str, MigModel] = {key: _model(key) for key in _NAMES}
"""Every MIG-capable model the emulator offers, by its key."""


def _held(model: MigModel, layout: Iterable[Placement]) -> tuple[int, list[MigProfile]]:
    """(memory slices in use as a bit mask, the profiles of the instances)."""
    mask, held = 0, []
    for pl in layout:
        p = model.by_name(pl.profile)
        if p is None:
            raise ValueError(f"{model.key} has no profile {pl.profile!r}")
        mask |= ((1 << pl.size) - 1) << pl.start
        held.append(p)
    return mask, held


def refusal(model: MigModel, layout: Iterable[Placement], profile: MigProfile, start: int) -> str | None:
    """Why the driver refuses one more `profile` instance at `start` next to `layout`, or None if it fits:
    "placement" (not a start the profile lists), "occupied" (its memory slices are in use), "instances" (the
    profile is at its instance count) or "ofa" (another instance holds the optical flow accelerator)."""
    if start not in profile.starts:
        return "placement"
    mask, held = _held(model, layout)
    if mask & (((1 << profile.size) - 1) << start):
        return "occupied"
    if sum(1 for p in held if p.profile_id == profile.profile_id) >= profile.instances:
        return "instances"
    if profile.ofa and any(p.ofa for p in held):
        return "ofa"
    return None


def free_starts(model: MigModel, layout: Iterable[Placement], profile: MigProfile) -> tuple[int, ...]:
    """The starts where one more `profile` instance could be created now."""
    layout = list(layout)
    return tuple(s for s in profile.starts if refusal(model, layout, profile, s) is None)


def free_capacity(model: MigModel, layout: Iterable[Placement], profile: MigProfile) -> int:
    """How many more instances of `profile` alone could still be created (the driver's remaining capacity).

    Placements of one profile all have its size, so taking the lowest free start each time packs the most."""
    layout = list(layout)
    mask, held = _held(model, layout)
    if profile.ofa and any(p.ofa for p in held):
        return 0
    room = profile.instances - sum(1 for p in held if p.profile_id == profile.profile_id)
    if profile.ofa:
        room = min(room, 1)
    count = 0
    for start in profile.starts:
        span = ((1 << profile.size) - 1) << start
        if count < room and not mask & span:
            mask |= span
            count += 1
    return count
