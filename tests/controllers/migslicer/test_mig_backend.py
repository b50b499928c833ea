"""The agent's MIG backend over the NVML-shaped fake (no GPU here: the fake is what this tests against), plus the
same backend over the real `pynvml` wrappers with the fake standing in for libnvidia-ml at the C-call level.

Covered: every allowed start of every profile on A100-40GB/H100-80GB/A30-24GB, overlap and limit errors with the
driver's codes, the +me singleton, rollback of half-made slices, idempotent destroy, agent restart and node reboot
over the state file, MIG mode, and a property test that the fake and the backend agree with our accounting.
"""

from __future__ import annotations

import ctypes
import importlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.accounting import mig
from gpuops.accounting.errors import PlacementError
from gpuops.controllers.migslicer.agent.gpus import GpuInfo, MigBackend, MigBackendError, SliceInfo
from gpuops_sim import fakenvml
from gpuops_sim import gpus as simgpus
from gpuops_sim.fakenvml import FakeNVML

MODELS = ["A100-40GB", "H100-80GB", "A30-24GB"]
INSUFFICIENT = fakenvml.NVML_ERROR_INSUFFICIENT_RESOURCES
INVALID = fakenvml.NVML_ERROR_INVALID_ARGUMENT


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[FakeNVML, MigBackend]]]:
    opened: list[MigBackend] = []

    def _make(models: list[str] | str, node: str = "node-a", **kw: Any) -> tuple[FakeNVML, MigBackend]:
        fake = FakeNVML.from_spec(models, node, **kw) if isinstance(models, str) else FakeNVML(models, node, **kw)
        backend = MigBackend(fake)
        backend.open()
        opened.append(backend)
        return fake, backend

    yield _make
    for b in opened:
        b.close()


def shape(slices: list[SliceInfo]) -> list[tuple[str, int, int]]:
    return [(s.profile, s.start, s.size) for s in slices]


# ---------------------------------------------------------------------------------------------- identity, GPUs


def test_gpus_from_the_emulated_spec(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    _, b = make("A100-40GB:2,H100-80GB:1")
    got = b.gpus()
    assert [g.model for g in got] == ["A100-40GB", "A100-40GB", "H100-80GB"]
    assert [g.index for g in got] == [0, 1, 2]
    assert all(g.mig_mode == "Enabled" and g.mig_capable for g in got)
    assert got[0].uuid == fakenvml.gpu_uuid("node-a", 0) and got[0].uuid.startswith("GPU-")
    assert len({g.uuid for g in got}) == 3
    assert got[2].memory_mib == 80 * 1024
    # a different node has different GPUs; the same node the same ones
    assert FakeNVML.from_spec("A100-40GB:1", "node-b").gpu_uuid(0) != got[0].uuid
    assert FakeNVML.from_spec("A100-40GB:1", "node-a").gpu_uuid(0) == got[0].uuid


@pytest.mark.parametrize("key", list(fakenvml._NVML_NAMES))
def test_nvml_names_map_back_to_our_models_and_gfd_products(key: str) -> None:
    name = fakenvml.nvml_name(key)
    assert name.replace(" ", "-") == simgpus.MODELS[key].product
    if key in mig.KNOWN_MODELS:
        assert mig.normalize_model(name) == key


def test_gpu_spec_parsing() -> None:
    assert fakenvml.parse_gpu_spec("A100-40GB:2, H100-80GB:1") == ["A100-40GB", "A100-40GB", "H100-80GB"]
    assert fakenvml.parse_gpu_spec("A30-24GB") == ["A30-24GB"]
    assert fakenvml.parse_gpu_spec("NVIDIA A100-SXM4-80GB:1") == ["A100-80GB"]
    for bad in ("A100-40GB:x", "Z9000:1", "A100-40GB:-1"):
        with pytest.raises(ValueError):
            fakenvml.parse_gpu_spec(bad)


def test_non_mig_gpu(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    _, b = make(["L4-24GB"])
    (g,) = b.gpus()
    assert (g.model, g.mig_capable, g.mig_mode, g.product) == ("", False, "Disabled", "NVIDIA-L4")
    assert b.slices() == []
    with pytest.raises(MigBackendError) as e:
        b.create(g.uuid, "1g.5gb", 0)
    assert e.value.code == fakenvml.NVML_ERROR_NOT_SUPPORTED and not e.value.retryable


def test_backend_must_be_open() -> None:
    b = MigBackend(FakeNVML(["A30-24GB"]))
    with pytest.raises(MigBackendError) as e:
        b.gpus()
    assert e.value.code == fakenvml.NVML_ERROR_UNINITIALIZED
    with b:
        assert len(b.gpus()) == 1


def test_unknown_gpu_uuid(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    _, b = make(["A30-24GB"])
    with pytest.raises(MigBackendError) as e:
        b.create("GPU-nope", "1g.6gb", 0)
    assert e.value.code == fakenvml.NVML_ERROR_NOT_FOUND


# ---------------------------------------------------------------------------------------------- create / read back


@pytest.mark.parametrize("model", MODELS)
def test_every_allowed_start_of_every_profile(model: str, make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make([model])
    gpu = fake.gpu_uuid(0)
    geom = mig.geometry(model)
    seen_devices: set[str] = set()
    for p in geom.profiles:
        for start in p.starts:
            s = b.create(gpu, p.name, start)
            assert (s.profile, s.start, s.size) == (p.name, start, p.size)
            assert s.complete and s.device_uuid.startswith("MIG-")
            assert s.compute_instance_ids == (s.compute_instance_id,)
            assert s.device_uuid == fakenvml.mig_device_uuid(gpu, s.gpu_instance_id, s.compute_instance_id or 0)
            seen_devices.add(s.device_uuid)
            assert b.slices() == [s]
            assert b.slices(gpu) == [s]
            assert fake.layout(0) == [(p.name, start, p.size)]
            assert b.destroy(gpu, s.gpu_instance_id) is True
            assert b.slices() == [] and fake.instances(0) == {}
    assert seen_devices  # and every create read back what it made


@pytest.mark.parametrize("model", MODELS)
def test_full_layouts_read_back(model: str, make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    """Fill a GPU with the smallest profile, then read the whole layout back from the device."""
    fake, b = make([model])
    gpu = fake.gpu_uuid(0)
    small = mig.geometry(model).profiles[0]
    made = [b.create(gpu, small.name, s) for s in small.starts]
    assert b.slices() == sorted(made, key=lambda s: s.start)
    assert len({s.device_uuid for s in made}) == len(made)
    assert {s.gpu_instance_id for s in made} == set(fake.instances(0))


# ---------------------------------------------------------------------------------------------- driver refusals


def test_overlaps_are_rejected_like_the_driver(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A100-40GB"])
    gpu = fake.gpu_uuid(0)
    b.create(gpu, "3g.20gb", 0)  # memory slices 0-3
    for profile, start in [("1g.5gb", 0), ("1g.5gb", 3), ("1g.10gb", 2), ("2g.10gb", 2), ("3g.20gb", 0),
                           ("4g.20gb", 0), ("7g.40gb", 0)]:
        with pytest.raises(MigBackendError) as e:
            b.create(gpu, profile, start)
        assert e.value.code == INSUFFICIENT, (profile, start)
        assert not e.value.retryable
    assert shape(b.slices()) == [("3g.20gb", 0, 4)]
    b.create(gpu, "2g.10gb", 4)
    b.create(gpu, "1g.10gb", 6)  # covers the memory-only slice 7
    with pytest.raises(MigBackendError) as e:
        b.create(gpu, "1g.5gb", 6)
    assert e.value.code == INSUFFICIENT
    assert shape(b.slices()) == [("3g.20gb", 0, 4), ("2g.10gb", 4, 2), ("1g.10gb", 6, 2)]


def test_bad_starts_are_invalid_argument(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A100-40GB", "A30-24GB"])
    for gpu, profile, start in [(0, "3g.20gb", 2), (0, "1g.5gb", 7), (0, "4g.20gb", 4), (1, "2g.12gb", 1),
                                (1, "1g.6gb", 4)]:
        with pytest.raises(MigBackendError) as e:
            b.create(fake.gpu_uuid(gpu), profile, start)
        assert e.value.code == INVALID
    with pytest.raises(MigBackendError) as e:
        b.create(fake.gpu_uuid(0), "5g.30gb", 0)
    assert e.value.code == INVALID
    # the fake itself, called as the driver: unlisted start, wrong size, unknown profile ID
    fake.nvmlInit()
    dev = fake.nvmlDeviceGetHandleByIndex(0)
    for pid, start, size in [(9, 2, 4), (9, 0, 3), (19, 7, 1), (42, 0, 1)]:
        pl = fakenvml.c_nvmlGpuInstancePlacement_t(start, size)
        with pytest.raises(fakenvml.NVMLError) as err:
            fake.nvmlDeviceCreateGpuInstanceWithPlacement(dev, pid, ctypes.byref(pl))
        assert err.value.value == INVALID
        assert isinstance(err.value, fakenvml.NVMLError_InvalidArgument)  # type: ignore[attr-defined]
    assert fake.layout(0) == []
    fake.nvmlShutdown()


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_me_singleton_and_count_caps(model: str, make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make([model])
    gpu = fake.gpu_uuid(0)
    names = {p.profile_id: p.name for p in mig.geometry(model).profiles}
    me, one = names[20], names[19]
    b.create(gpu, me, 3)
    for start in (0, 6):
        with pytest.raises(MigBackendError) as e:
            b.create(gpu, me, start)
        assert e.value.code == INSUFFICIENT
    for start in (0, 1, 2, 4, 5, 6):
        b.create(gpu, one, start)  # six plain 1g next to the +me one: seven 1g instances in all
    assert [s.profile for s in b.slices()] == [one, one, one, me, one, one, one]


def test_a30_media_profiles_exclude_each_other(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A30-24GB"])
    gpu = fake.gpu_uuid(0)
    b.create(gpu, "1g.6gb+me", 0)
    with pytest.raises(MigBackendError) as e:
        b.create(gpu, "2g.12gb+me", 2)
    assert e.value.code == INSUFFICIENT
    b.create(gpu, "2g.12gb", 2)
    b.create(gpu, "1g.6gb", 1)
    assert shape(b.slices()) == [("1g.6gb+me", 0, 1), ("1g.6gb", 1, 1), ("2g.12gb", 2, 2)]


# ---------------------------------------------------------------------------------------------- rollback, destroy


def test_ci_failure_rolls_back_the_gi(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["H100-80GB"])
    gpu = fake.gpu_uuid(0)
    fake.fail_next("nvmlGpuInstanceCreateComputeInstance", INSUFFICIENT)
    with pytest.raises(MigBackendError) as e:
        b.create(gpu, "3g.40gb", 4)
    assert e.value.code == INSUFFICIENT
    assert fake.instances(0) == {} and b.slices() == []
    assert fake.calls["nvmlGpuInstanceDestroy"] == 1
    # a failure after the CI exists (resolving the MIG device) removes both
    fake.fail_next("nvmlDeviceGetMaxMigDeviceCount", fakenvml.NVML_ERROR_TIMEOUT)
    with pytest.raises(MigBackendError) as e:
        b.create(gpu, "3g.40gb", 4)
    assert e.value.retryable and e.value.code == fakenvml.NVML_ERROR_TIMEOUT
    assert fake.instances(0) == {}
    assert b.create(gpu, "3g.40gb", 4).complete  # the placement is free again


def test_failed_rollback_leaves_a_visible_gi_to_finish_or_destroy(
        make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A100-40GB"])
    gpu = fake.gpu_uuid(0)
    fake.fail_next("nvmlGpuInstanceCreateComputeInstance", fakenvml.NVML_ERROR_UNKNOWN)
    fake.fail_next("nvmlGpuInstanceDestroy", fakenvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(MigBackendError) as e:
        b.create(gpu, "2g.10gb", 2)
    assert any("rollback failed" in n for n in getattr(e.value, "__notes__", []))
    (half,) = b.slices()
    assert (half.profile, half.start, half.compute_instance_id, half.device_uuid) == ("2g.10gb", 2, None, "")
    assert not half.complete and half.compute_instance_ids == ()
    done = b.finish(gpu, half.gpu_instance_id)
    assert done.complete and b.slices() == [done]
    assert b.finish(gpu, half.gpu_instance_id) == done  # already complete
    assert b.destroy(gpu, half.gpu_instance_id) and b.slices() == []


def test_split_gi_is_reported_not_adopted(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    """A GI someone split into two 1-slice CIs: reported with both CI ids and no device, destroyable."""
    fake, b = make(["A100-40GB"])
    gpu = fake.gpu_uuid(0)
    fake.nvmlInit()
    dev = fake.nvmlDeviceGetHandleByIndex(0)
    two_g = fakenvml.c_nvmlGpuInstancePlacement_t(0, 2)
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 14, ctypes.byref(two_g))
    fake.nvmlGpuInstanceCreateComputeInstance(gi, fakenvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    fake.nvmlGpuInstanceCreateComputeInstance(gi, fakenvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    with pytest.raises(fakenvml.NVMLError) as err:
        fake.nvmlGpuInstanceCreateComputeInstance(gi, fakenvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    assert err.value.value == INSUFFICIENT
    with pytest.raises(fakenvml.NVMLError) as err:
        fake.nvmlGpuInstanceDestroy(gi)  # the driver refuses while CIs exist
    assert err.value.value == fakenvml.NVML_ERROR_IN_USE
    fake.nvmlShutdown()
    (s,) = b.slices()
    assert (s.profile, s.compute_instance_id, s.compute_instance_ids, s.complete) == ("2g.10gb", None, (0, 1), False)
    with pytest.raises(MigBackendError):
        b.finish(gpu, s.gpu_instance_id)
    assert b.destroy(gpu, s.gpu_instance_id) and fake.instances(0) == {}


def test_destroy_is_idempotent_and_in_use_is_retryable(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A30-24GB"])
    gpu = fake.gpu_uuid(0)
    s = b.create(gpu, "2g.12gb", 0)
    assert b.destroy(gpu, 99) is False
    fake.set_busy(0, s.gpu_instance_id)
    with pytest.raises(MigBackendError) as e:
        b.destroy(gpu, s.gpu_instance_id)
    assert e.value.code == fakenvml.NVML_ERROR_IN_USE and e.value.retryable
    assert shape(b.slices()) == [("2g.12gb", 0, 2)]
    fake.set_busy(0, s.gpu_instance_id, False)
    assert b.destroy(gpu, s.gpu_instance_id) is True
    assert b.destroy(gpu, s.gpu_instance_id) is False
    assert b.slices() == []


def test_stale_handles_are_invalid(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A30-24GB"])
    s = b.create(fake.gpu_uuid(0), "4g.24gb", 0)
    fake.nvmlInit()
    gi = fake.nvmlDeviceGetGpuInstanceById(fake.nvmlDeviceGetHandleByIndex(0), s.gpu_instance_id)
    b.destroy(fake.gpu_uuid(0), s.gpu_instance_id)
    b.create(fake.gpu_uuid(0), "4g.24gb", 0)  # same GI id again, new instance
    with pytest.raises(fakenvml.NVMLError) as err:
        fake.nvmlGpuInstanceGetInfo(gi)
    assert err.value.value == INVALID
    fake.nvmlShutdown()


# ---------------------------------------------------------------------------------------------- restart, reboot


def test_agent_restart_sees_the_same_slices(tmp_path: Path,
                                            make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    state = tmp_path / "nvml.json"
    fake, b = make("A100-40GB:2,H100-80GB:1", state_file=state)
    made = [b.create(fake.gpu_uuid(0), "3g.20gb", 4), b.create(fake.gpu_uuid(0), "1g.5gb+me", 0),
            b.create(fake.gpu_uuid(2), "7g.80gb", 0)]
    before_gpus, before = b.gpus(), b.slices()
    assert sorted(made, key=lambda s: (s.gpu_uuid, s.start)) == sorted(before, key=lambda s: (s.gpu_uuid, s.start))
    b.close()
    _, b2 = make("A100-40GB:2,H100-80GB:1", state_file=state)
    assert b2.gpus() == before_gpus
    assert b2.slices() == before  # device UUIDs and instance ids included
    # both agents see one driver: a change through one is visible through the other
    b2.destroy(fake.gpu_uuid(2), made[2].gpu_instance_id)
    assert fake.layout(2) == []
    b2.create(fake.gpu_uuid(1), "4g.20gb", 0)
    assert fake.layout(1) == [("4g.20gb", 0, 4)]


def test_reboot_loses_every_slice(tmp_path: Path, make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    state = tmp_path / "nvml.json"
    fake, b = make(["A30-24GB", "A100-40GB"], state_file=state)
    b.create(fake.gpu_uuid(0), "4g.24gb", 0)
    b.create(fake.gpu_uuid(1), "1g.5gb", 6)
    fake.reboot()
    assert b.slices() == []
    _, b2 = make(["A30-24GB", "A100-40GB"], state_file=state)
    assert b2.slices() == []
    b2.create(fake.gpu_uuid(1), "1g.5gb", 6)
    state.unlink()  # no driver state at all: also a fresh boot
    _, b3 = make(["A30-24GB", "A100-40GB"], state_file=state)
    assert b3.slices() == [] and b.slices() == []
    # a different GPU set on the same file is different hardware: nothing carries over
    b3.create(fake.gpu_uuid(0), "4g.24gb", 0)
    _, b4 = make(["A30-24GB"], state_file=state)
    assert b4.slices() == []


# ---------------------------------------------------------------------------------------------- MIG mode


def test_mig_mode_disabled_is_a_clear_error(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A100-40GB", "A100-40GB"])
    fake.set_mig_mode(1, False)
    g0, g1 = b.gpus()
    assert (g0.mig_mode, g1.mig_mode) == ("Enabled", "Disabled")
    with pytest.raises(MigBackendError) as e:
        b.create(g1.uuid, "1g.5gb", 0)
    assert e.value.code == fakenvml.NVML_ERROR_NOT_SUPPORTED and not e.value.retryable
    assert "MIG mode is disabled" in str(e.value) and "nvidia-smi -i 1 -mig 1" in str(e.value)
    assert b.destroy(g1.uuid, 1) is False and b.slices() == []
    # the driver itself says NOT_SUPPORTED for GI calls
    fake.nvmlInit()
    with pytest.raises(fakenvml.NVMLError) as err:
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(fake.nvmlDeviceGetHandleByIndex(1), 19,
                                                      ctypes.byref(fakenvml.c_nvmlGpuInstancePlacement_t(0, 1)))
    assert err.value.value == fakenvml.NVML_ERROR_NOT_SUPPORTED
    fake.nvmlShutdown()


def test_pending_mig_mode_applies_at_reboot(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["H100-80GB"], mig_enabled=False)
    assert b.gpus()[0].mig_mode == "Disabled"
    fake.set_mig_mode(0, False, pending=True)
    assert b.gpus()[0].mig_mode == "Pending"
    with pytest.raises(MigBackendError):
        b.create(fake.gpu_uuid(0), "1g.10gb", 0)
    fake.reboot()
    assert b.gpus()[0].mig_mode == "Enabled"
    assert b.create(fake.gpu_uuid(0), "1g.10gb", 0).complete


# ---------------------------------------------------------------------------------------------- chaos hooks


def test_failure_injection_and_delay(make: Callable[..., tuple[FakeNVML, MigBackend]]) -> None:
    fake, b = make(["A30-24GB"])
    gpu = fake.gpu_uuid(0)
    fake.fail_next("nvmlDeviceCreateGpuInstanceWithPlacement", fakenvml.NVML_ERROR_TIMEOUT, times=2)
    for _ in range(2):
        with pytest.raises(MigBackendError) as e:
            b.create(gpu, "1g.6gb", 0)
        assert e.value.retryable
    assert b.create(gpu, "1g.6gb", 0).complete
    with pytest.raises(AttributeError):
        fake.fail_next("nvmlNoSuchCall", 1)
    fake.set_delay(0.02, "nvmlDeviceCreateGpuInstanceWithPlacement")
    t0 = time.monotonic()
    b.create(gpu, "1g.6gb", 1)
    assert time.monotonic() - t0 >= 0.02
    fake.set_delay(0, "nvmlDeviceCreateGpuInstanceWithPlacement")


def test_concurrent_callers_from_worker_threads(tmp_path: Path) -> None:
    """The agent calls the backend from worker threads: creates and destroys interleave without losing any."""
    from concurrent.futures import ThreadPoolExecutor

    with MigBackend(FakeNVML.from_spec("A100-40GB:2", "threads", state_file=tmp_path / "s.json")) as b:
        gpus = [g.uuid for g in b.gpus()]
        jobs = [(g, s) for g in gpus for s in range(7)]
        with ThreadPoolExecutor(8) as pool:
            made = list(pool.map(lambda job: b.create(job[0], "1g.5gb", job[1]), jobs))
        assert len({m.device_uuid for m in made}) == 14 and len(b.slices()) == 14
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(lambda m: b.destroy(m.gpu_uuid, m.gpu_instance_id), made))
        assert b.slices() == []


def test_load_pynvml_is_the_real_module() -> None:
    from gpuops.controllers.migslicer.agent.gpus import load_pynvml

    assert load_pynvml() is importlib.import_module("pynvml")


# ---------------------------------------------------------------------------------------------- property test


@st.composite
def _ops(draw: st.DrawFn) -> tuple[str, list[tuple[str, int, int]]]:
    model = draw(st.sampled_from(MODELS))
    geom = mig.geometry(model)
    ops = draw(st.lists(st.tuples(
        st.sampled_from(["create", "create", "destroy"]),
        st.integers(0, len(geom.profiles) - 1),
        st.integers(0, geom.slices - 1),  # any start, allowed or not
    ), min_size=1, max_size=25))
    return model, ops


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops())
def test_backend_agrees_with_accounting(case: tuple[str, list[tuple[str, int, int]]]) -> None:
    model, ops = case
    geom = mig.geometry(model)
    fake = FakeNVML([model], "prop")
    with MigBackend(fake) as b:
        gpu = fake.gpu_uuid(0)
        layout: tuple[mig.Placement, ...] = ()
        ids: dict[mig.Placement, int] = {}
        for kind, pi, start in ops:
            if kind == "destroy":
                if not layout:
                    assert b.destroy(gpu, 1) is False
                    continue
                gone = layout[(pi + start) % len(layout)]
                assert b.destroy(gpu, ids.pop(gone)) is True
                layout = mig.release(geom, layout, [gone])
            else:
                p = geom.profiles[pi]
                want = mig.Placement(p.name, start, p.size)
                try:
                    after = mig.allocate(geom, layout, [want])
                except PlacementError:
                    after = None
                try:
                    s = b.create(gpu, p.name, start)
                except MigBackendError as e:
                    assert after is None, f"driver refused {want} on {layout}"
                    assert e.code == (INVALID if start not in p.starts else INSUFFICIENT)
                else:
                    assert after is not None, f"driver accepted {want} on {layout}"
                    assert (s.profile, s.start, s.size) == (p.name, start, p.size)
                    ids[want] = s.gpu_instance_id
                    layout = after
            on_device = tuple(mig.Placement(*pl) for pl in fake.layout(0))
            assert on_device == mig.check_layout(geom, on_device) == layout
            assert shape(b.slices()) == [(pl.profile, pl.start, pl.size) for pl in layout]
            # the driver's remaining capacity is our accounting's "Free" column
            free = mig.free_capacity(geom, layout)
            fake.nvmlInit()
            dev = fake.nvmlDeviceGetHandleByIndex(0)
            for prof in geom.profiles:
                assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, prof.profile_id) == free[prof.name]
            fake.nvmlShutdown()


# ---------------------------------------------------------------------------------------------- real pynvml


pynvml = importlib.import_module("pynvml")  # nvidia-ml-py: the mig extra, which make test installs

_PUBLIC_STRUCTS = [
    "c_nvmlMemory_t", "c_nvmlGpuInstancePlacement_t", "c_nvmlGpuInstanceProfileInfo_t",
    "c_nvmlGpuInstanceProfileInfo_v2_t", "c_nvmlGpuInstanceInfo_t", "c_nvmlComputeInstancePlacement_t",
    "c_nvmlComputeInstanceProfileInfo_t", "c_nvmlComputeInstanceProfileInfo_v2_t", "c_nvmlComputeInstanceInfo_t",
]


def _layout(cls: Any) -> list[tuple[str, int, int]]:
    return [(name, getattr(cls, name).offset, getattr(cls, name).size) for name, *_ in cls._fields_]


@pytest.mark.parametrize("name", _PUBLIC_STRUCTS)
def test_fake_structures_have_pynvmls_layout(name: str) -> None:
    ours, theirs = getattr(fakenvml, name), getattr(pynvml, name)
    assert _layout(ours) == _layout(theirs)
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)


def test_fake_constants_and_errors_match_pynvml() -> None:
    fake = FakeNVML(["A30-24GB"])
    for name in dir(fakenvml):
        if name.startswith("NVML_") or name in ("nvmlGpuInstanceProfileInfo_v2", "nvmlComputeInstanceProfileInfo_v2"):
            assert getattr(pynvml, name) == getattr(fakenvml, name) == getattr(fake, name), name
    for code in (INSUFFICIENT, INVALID, fakenvml.NVML_ERROR_IN_USE, fakenvml.NVML_ERROR_NOT_SUPPORTED):
        assert type(fakenvml.NVMLError(code)).__name__ == type(pynvml.NVMLError(code)).__name__
        assert fakenvml.NVMLError(code).value == code


class _FakeLibNVML:
    """libnvidia-ml's C entry points, as pynvml calls them (ctypes pointers, byref outputs, return codes),
    implemented over a FakeNVML. With it patched in, the backend drives the *real* pynvml wrappers, so the
    argument conventions (byref(placement), arrays plus byref(count), handle types) are checked end to end."""

    def __init__(self, fake: FakeNVML) -> None:
        self.fake = fake
        self.called: list[str] = []

    @staticmethod
    def _out_handle(ref: Any, fake_ptr: Any) -> None:
        assert type(ref).__name__ == "CArgObject"
        ctypes.c_void_p.from_address(ctypes.addressof(ref._obj)).value = ctypes.cast(fake_ptr, ctypes.c_void_p).value

    @staticmethod
    def _copy(ref: Any, struct: Any) -> None:
        assert type(ref).__name__ == "CArgObject"
        dst = ref._obj
        assert ctypes.sizeof(dst) == ctypes.sizeof(struct), type(dst).__name__
        ctypes.memmove(ctypes.addressof(dst), ctypes.addressof(struct), ctypes.sizeof(struct))

    def lookup(self, name: str) -> Callable[..., int]:
        f = self.fake

        def dev(h: Any) -> Any:  # pynvml's handle types -> the fake's (same addresses)
            return ctypes.cast(h, fakenvml.c_nvmlDevice_t)

        def gih(h: Any) -> Any:
            return ctypes.cast(h, fakenvml.c_nvmlGpuInstance_t)

        def cih(h: Any) -> Any:
            return ctypes.cast(h, fakenvml.c_nvmlComputeInstance_t)

        def ptr(x: Any, *, array: bool = False) -> Any:
            """What C receives for a pointer parameter must be one: byref(), pointer(), an array or NULL
            (a struct passed as is would go by value, which the real library would misread)."""
            ok = x is None or type(x).__name__ == "CArgObject" or isinstance(x, ctypes._Pointer) or (
                array and isinstance(x, ctypes.Array))
            assert ok, f"{name}: pointer argument passed as {type(x).__name__}"
            return x

        def set_uint(ref: Any, v: int) -> None:
            ptr(ref)
            ref._obj.value = v

        def set_uints(refs: tuple[Any, ...], values: list[int]) -> None:
            for r, v in zip(refs, values, strict=True):
                set_uint(r, v)

        def set_str(buf: Any, s: str) -> None:
            buf.value = s.encode()

        def listed(kind: Any, real: Any, fn: Callable[..., Any]) -> Callable[..., None]:
            def call(owner: Any, pid: int, arr: Any, count: Any) -> None:
                ptr(arr, array=True), ptr(count)
                mine = (kind * len(arr))() if arr is not None else None
                try:
                    fn(owner, pid, mine, count)
                finally:
                    for i in range(count._obj.value if mine is not None else 0):
                        arr[i] = ctypes.cast(mine[i], real)  # type: ignore[index]
            return call

        impl: dict[str, Callable[..., Any]] = {
            "nvmlInitWithFlags": lambda flags: f.nvmlInit(),
            "nvmlShutdown": lambda: f.nvmlShutdown(),
            "nvmlDeviceGetCount_v2": lambda c: set_uint(c, f.nvmlDeviceGetCount()),
            "nvmlDeviceGetHandleByIndex_v2": lambda i, out: self._out_handle(
                out, f.nvmlDeviceGetHandleByIndex(i.value)),
            "nvmlDeviceGetHandleByUUID": lambda u, out: self._out_handle(
                out, f.nvmlDeviceGetHandleByUUID(u.value)),
            "nvmlDeviceGetUUID": lambda h, buf, n: set_str(buf, f.nvmlDeviceGetUUID(dev(h))),
            "nvmlDeviceGetName": lambda h, buf, n: set_str(buf, f.nvmlDeviceGetName(dev(h))),
            "nvmlDeviceGetMemoryInfo": lambda h, out: self._copy(out, f.nvmlDeviceGetMemoryInfo(dev(h))),
            "nvmlDeviceGetMigMode": lambda h, cur, pend: set_uints((cur, pend), f.nvmlDeviceGetMigMode(dev(h))),
            "nvmlDeviceGetGpuInstanceProfileInfoV": lambda h, p, out: self._copy(
                out, f.nvmlDeviceGetGpuInstanceProfileInfo(dev(h), p)),
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2": lambda h, pid, arr, c: (
                f.nvmlDeviceGetGpuInstancePossiblePlacements(dev(h), pid, ptr(arr, array=True), ptr(c))),
            "nvmlDeviceCreateGpuInstanceWithPlacement": lambda h, pid, pl, out: self._out_handle(
                out, f.nvmlDeviceCreateGpuInstanceWithPlacement(dev(h), pid, ptr(pl))),
            "nvmlDeviceGetGpuInstances": lambda h, pid, arr, c: listed(
                fakenvml.c_nvmlGpuInstance_t, pynvml.c_nvmlGpuInstance_t,
                f.nvmlDeviceGetGpuInstances)(dev(h), pid, arr, c),
            "nvmlDeviceGetGpuInstanceById": lambda h, i, out: self._out_handle(
                out, f.nvmlDeviceGetGpuInstanceById(dev(h), i)),
            "nvmlGpuInstanceGetInfo": lambda g, out: self._copy(out, f.nvmlGpuInstanceGetInfo(gih(g))),
            "nvmlGpuInstanceDestroy": lambda g: f.nvmlGpuInstanceDestroy(gih(g)),
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV": lambda g, p, e, out: self._copy(
                out, f.nvmlGpuInstanceGetComputeInstanceProfileInfo(gih(g), p, e)),
            "nvmlGpuInstanceCreateComputeInstance": lambda g, pid, out: self._out_handle(
                out, f.nvmlGpuInstanceCreateComputeInstance(gih(g), pid)),
            "nvmlGpuInstanceGetComputeInstances": lambda g, pid, arr, c: listed(
                fakenvml.c_nvmlComputeInstance_t, pynvml.c_nvmlComputeInstance_t,
                f.nvmlGpuInstanceGetComputeInstances)(gih(g), pid, arr, c),
            "nvmlComputeInstanceGetInfo_v2": lambda ci, out: self._copy(out, f.nvmlComputeInstanceGetInfo(cih(ci))),
            "nvmlComputeInstanceDestroy": lambda ci: f.nvmlComputeInstanceDestroy(cih(ci)),
            "nvmlDeviceGetMaxMigDeviceCount": lambda h, c: set_uint(c, f.nvmlDeviceGetMaxMigDeviceCount(dev(h))),
            "nvmlDeviceGetMigDeviceHandleByIndex": lambda h, i, out: self._out_handle(
                out, f.nvmlDeviceGetMigDeviceHandleByIndex(dev(h), i.value)),
            "nvmlDeviceGetGpuInstanceId": lambda h, c: set_uint(c, f.nvmlDeviceGetGpuInstanceId(dev(h))),
            "nvmlDeviceGetComputeInstanceId": lambda h, c: set_uint(c, f.nvmlDeviceGetComputeInstanceId(dev(h))),
        }
        if name not in impl:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        body = impl[name]

        def c_function(*args: Any) -> int:
            self.called.append(name)
            try:
                body(*args)
            except fakenvml.NVMLError as e:
                return e.value
            return 0

        return c_function


@pytest.fixture
def real_pynvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeNVML, _FakeLibNVML]]:
    fake = FakeNVML(["A100-40GB", "A30-24GB"], "real-pynvml")
    lib = _FakeLibNVML(fake)
    monkeypatch.setattr(pynvml, "nvmlLib", object())  # "loaded", so nvmlInit does not dlopen libnvidia-ml
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lib.lookup)
    yield fake, lib


def test_backend_over_the_real_pynvml_wrappers(real_pynvml: tuple[FakeNVML, _FakeLibNVML]) -> None:
    fake, lib = real_pynvml
    with MigBackend(pynvml) as b:
        gpus = b.gpus()
        assert [(g.model, g.mig_mode, g.product) for g in gpus] == [
            ("A100-40GB", "Enabled", "NVIDIA-A100-SXM4-40GB"), ("A30-24GB", "Enabled", "NVIDIA-A30")]
        assert all(isinstance(g, GpuInfo) for g in gpus)
        a100, a30 = gpus[0].uuid, gpus[1].uuid
        s = b.create(a100, "3g.20gb", 4)  # byref(c_nvmlGpuInstancePlacement_t(4, 4)) through pynvml
        assert fake.layout(0) == [("3g.20gb", 4, 4)]
        assert s.device_uuid == fakenvml.mig_device_uuid(a100, s.gpu_instance_id, 0)
        b.create(a100, "1g.5gb+me", 0)
        t = b.create(a30, "2g.12gb+me", 2)
        with pytest.raises(MigBackendError) as e:  # pynvml's NVMLError_InsufficientResources, mapped
            b.create(a100, "2g.10gb", 4)
        assert e.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        assert isinstance(e.value.__cause__, pynvml.NVMLError_InsufficientResources)
        with pytest.raises(MigBackendError) as e:
            b.create(a100, "1g.5gb+me", 1)
        assert e.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        assert shape(b.slices(a100)) == [("1g.5gb+me", 0, 1), ("3g.20gb", 4, 4)]
        assert b.slices(a30) == [t]
        assert b.destroy(a100, s.gpu_instance_id) and not b.destroy(a100, s.gpu_instance_id)
        assert shape(b.slices()) == [("1g.5gb+me", 0, 1), ("2g.12gb+me", 2, 2)]
    # the C entry points pynvml itself chose (the _v2 / V variants) were the ones reached
    for c_name in ("nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstanceProfileInfoV",
                   "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlComputeInstanceGetInfo_v2",
                   "nvmlDeviceGetHandleByUUID", "nvmlGpuInstanceDestroy", "nvmlComputeInstanceDestroy"):
        assert c_name in lib.called


def test_a_gi_destroyed_by_another_process_mid_listing_is_read_again(
        tmp_path: Path, make: Callable[..., tuple[FakeNVML, MigBackend]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing spans many NVML calls; another process destroying a GI between them leaves a stale handle.
    The reader reads the GPU again and returns the settled layout, not the driver's INVALID_ARGUMENT."""
    state = tmp_path / "nvml.json"
    fake, reader = make("A100-40GB:1", "shared", state_file=state)
    other_fake, other = make("A100-40GB:1", "shared", state_file=state)
    keep = other.create(other_fake.gpu_uuid(0), "3g.20gb", 4)
    doomed = other.create(other_fake.gpu_uuid(0), "2g.10gb", 0)
    real = fake.nvmlGpuInstanceGetComputeInstances
    raced: list[bool] = []

    def racing(gi: Any, profile_id: int, arr: Any, count: Any) -> int:
        if not raced:  # the other process destroys the GI between our GetGpuInstances and this call
            raced.append(other.destroy(other_fake.gpu_uuid(0), doomed.gpu_instance_id))
        return real(gi, profile_id, arr, count)

    monkeypatch.setattr(fake, "nvmlGpuInstanceGetComputeInstances", racing)
    assert shape(reader.slices()) == [("3g.20gb", 4, 4)]
    assert raced == [True]
    assert reader.slices() == [keep]


def test_a_listing_that_never_settles_is_raised(make: Callable[..., tuple[FakeNVML, MigBackend]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake, b = make(["A30-24GB"])
    b.create(fake.gpu_uuid(0), "4g.24gb", 0)

    def always_stale(*_: Any) -> int:
        raise fakenvml.NVMLError(INVALID)

    monkeypatch.setattr(fake, "nvmlGpuInstanceGetComputeInstances", always_stale)
    with pytest.raises(MigBackendError) as err:
        b.slices()
    assert err.value.code == INVALID
