"""The demo report's figures on constructed inputs: MIG compute slices (capacity, used, fragmented, free, demand,
wait reasons) from known MigNodes, claims and pods; budgets as % of their quotas with enforcement moments; and
every plot drawn from them with its legends off the data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuops.accounting import mig
from gpuops_sim.report import plots
from gpuops_sim.report.timeline import (
    CANNOT_PLACE,
    CREATING,
    HANDING_OVER,
    MIG_PARTS,
    NO_PLACEMENT,
    NOT_PLANNED,
    QUEUED,
    UNSCHEDULABLE,
    BudgetPoint,
    MigPoint,
    PoolPoint,
    Sample,
    Timeline,
    mig_point,
    sample_from,
)

PNG = b"\x89PNG\r\n\x1a\n"


def gpu(uuid: str, *slices: tuple[str, int, str], model: str = "A100-40GB", mode: str = "Enabled") -> dict[str, Any]:
    """A MigNode GPU holding slices given as (profile, start, claim)."""
    sizes = {"1g.5gb": 1, "1g.10gb": 2, "3g.20gb": 4, "7g.40gb": 8}
    return {"index": 0, "uuid": uuid, "model": model, "migMode": mode,
            "slices": [{"profile": p, "start": s, "size": sizes[p], "claim": c} for p, s, c in slices]}


def mig_node(name: str, *gpus: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": name}, "status": {"gpus": list(gpus)}}


def claim(name: str, pod_uid: str, node: str, gpu_uuid: str, profile: str, start: int, size: int,
          phase: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": name},
            "spec": {"podName": name, "podUID": pod_uid, "nodeName": node, "gpuUUID": gpu_uuid, "profile": profile,
                     "start": start, "size": size},
            "status": {"phase": phase}}


def mig_pod(name: str, wants: dict[str, int], *, gated: bool = True, reason: str | None = None,
            unschedulable: bool = False, node: str | None = None, init: dict[str, int] | None = None,
            deleting: bool = False) -> dict[str, Any]:
    def container(res: dict[str, int]) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {f"gpuops.io/mig-{p}": str(n) for p, n in res.items()}}}

    spec: dict[str, Any] = {"containers": [container(wants)]}
    if init:
        spec["initContainers"] = [container(init)]
    if gated:
        spec["schedulingGates"] = [{"name": "gpuops.io/mig-slicer"}]
    if node:
        spec["nodeName"] = node
    conditions = []
    if reason:
        conditions.append({"type": "gpuops.io/MigSlices", "status": "False", "reason": reason})
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    meta: dict[str, Any] = {"namespace": "t", "name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending", "conditions": conditions}}


def cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two MIG nodes of A100-40GB (7 compute slices each GPU) and the claims on them:
    GPU-a: 1g.5gb at 0 and at 4 (claimed): 2 used, 5 free where no 3g.20gb fits (3g starts at 0 or 4 only);
    GPU-b: 3g.20gb at 0 (claimed), 1g.5gb at 4 being made (a Pending claim, not reported yet), 1g.5gb at 5 whose
           claim was Released (the agent destroys it): 4 used, 1 unowned, 2 free (memory slices 6-7, no 3g);
    GPU-c: MIG disabled, GPU-d: no known model: no capacity; mig-1's GPU-e: empty, 6 of its 7 fit 3g.20gb."""
    nodes = [
        mig_node("mig-0",
                 gpu("GPU-a", ("1g.5gb", 0, "t/c1"), ("1g.5gb", 4, "t/c2")),
                 gpu("GPU-b", ("3g.20gb", 0, "t/c3"), ("1g.5gb", 5, "t/old")),
                 gpu("GPU-c", mode="Disabled"),
                 gpu("GPU-d", model="")),
        mig_node("mig-1", gpu("GPU-e")),
    ]
    claims = [
        claim("c1", "uid-run1", "mig-0", "GPU-a", "1g.5gb", 0, 1, "Bound"),
        claim("c2", "uid-run2", "mig-0", "GPU-a", "1g.5gb", 4, 1, "Bound"),
        claim("c3", "uid-run3", "mig-0", "GPU-b", "3g.20gb", 0, 4, "Bound"),
        claim("c4", "uid-creating", "mig-0", "GPU-b", "1g.5gb", 4, 1, "Pending"),
        claim("old", "uid-gone", "mig-0", "GPU-b", "1g.5gb", 5, 1, "Released"),
        claim("c5", "uid-handoff", "mig-0", "GPU-c", "1g.5gb", 0, 1, "Created"),  # on no MIG-enabled GPU
        claim("c6", "uid-queued", "mig-0", "GPU-c", "1g.5gb", 1, 1, "Created"),
    ]
    return nodes, claims


def waiting_pods() -> list[dict[str, Any]]:
    return [
        mig_pod("no-fit", {"3g.20gb": 1}, reason="NoCapacity"),
        mig_pod("new", {"3g.20gb": 2}, init={"3g.20gb": 1}),  # init container within the containers' sum: 2
        mig_pod("creating", {"1g.5gb": 1}, reason="NoCapacity"),  # its Pending claim is newer than the condition
        mig_pod("handoff", {"1g.5gb": 1}, reason="Advertising"),
        mig_pod("queued", {"1g.5gb": 1}, reason="WaitingForNode"),  # another pod is in hand-off on mig-0
        mig_pod("unsched", {"1g.5gb": 1}, gated=False, unschedulable=True),
        mig_pod("bad", {"4g.99gb": 1}, reason="Unsatisfiable"),  # a profile no GPU offers: no fragmentation for it
        mig_pod("running", {"1g.5gb": 1}, gated=False, node="mig-0"),
        mig_pod("going", {"3g.20gb": 1}, deleting=True),
        {"metadata": {"name": "cpu"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}},
    ]


def test_mig_point_splits_capacity_in_compute_slices() -> None:
    nodes, claims = cluster()
    p = mig_point(nodes, claims, waiting_pods())
    assert (p.capacity, p.gpus) == (21, 3)  # three MIG-enabled A100-40GB with tables, 7 compute slices each
    assert p.used == 2 + 3 + 1  # GPU-a's two 1g, GPU-b's 3g and the 1g being made; the Created claim on GPU-c not
    assert p.unowned == 1
    assert p.fragmented == 5 + 2 + 1  # free compute no 3g.20gb (what waits unplaced) can take
    assert p.free == 6  # two 3g.20gb on the empty GPU-e
    assert p.used + p.unowned + p.fragmented + p.free == p.capacity
    assert p.demand == 3 + 6 + 4  # the unplaced pods: no-fit, new (2 x 3g), bad (4g)
    assert p.waiting == {NO_PLACEMENT: 1, NOT_PLANNED: 1, CREATING: 1, QUEUED: 1, HANDING_OVER: 1, UNSCHEDULABLE: 1,
                         CANNOT_PLACE: 1}


def test_mig_point_without_waiting_pods_counts_only_compute_stranded_for_every_profile() -> None:
    nodes, claims = cluster()
    stranded = mig_node("mig-2", gpu("GPU-f", *(("1g.10gb", s, "") for s in (0, 2, 4, 6))))
    p = mig_point([*nodes, stranded], claims, [])
    assert (p.capacity, p.used, p.unowned) == (28, 6, 1 + 4)  # GPU-f's four 1g.10gb have no claim
    # GPU-f: every memory slice is taken, 3 compute slices are left for nothing; GPU-b: memory slices 6-7 are free,
    # but only one 1g (at 6) fits there, so one of its 2 free compute slices is stranded
    assert p.fragmented == 3 + 1
    assert p.free == 5 + 1 + 7
    assert sum(getattr(p, k) for k in MIG_PARTS) == p.capacity
    assert p.demand == 0 and p.waiting == {}


def test_sample_from_carries_the_mig_point_and_budget_enforcement() -> None:
    nodes, claims = cluster()
    budget = {"metadata": {"namespace": "a", "name": "b"},
              "spec": {"quota": {"gpuHours": "0.2", "windowHours": 1}, "enforcement": {"action": "Pause"}},
              "status": {"consumedGpuHours": "0.3",
                         "lastEnforcement": {"result": "Suspended", "time": "2025-01-01T00:00:01.5Z"}}}
    s = sample_from(1.0, mig_nodes=iter(nodes), claims=claims, pods=iter(waiting_pods()), budgets=[budget])
    assert s.mig.capacity == 21 and s.mig.fragmented == 8 and s.mig_waiting == 6
    assert s.slices == {"1g.5gb": 3, "3g.20gb": 1} and s.slices_in_use == 4  # the per-profile view is kept
    b = s.budgets["a/b"]
    assert (b.window_hours, b.enforcement, b.enforced_at) == (1.0, "Suspended", "2025-01-01T00:00:01.5Z")


def test_usable_compute_follows_placement_rules() -> None:
    geom = mig.geometry("A100-40GB")
    apart = [mig.slice_at(geom, "1g.5gb", 0), mig.slice_at(geom, "1g.5gb", 4)]
    assert mig.usable_compute(geom, apart, ["3g.20gb"]) == 0
    assert mig.usable_compute(geom, apart, ["1g.5gb"]) == 5
    assert mig.usable_compute(geom, [], ["3g.20gb"]) == 6 and mig.usable_compute(geom, []) == 7
    assert mig.usable_compute(geom, [mig.slice_at(geom, "4g.20gb", 0)], ["3g.20gb", "1g.5gb"]) == 3


def budget_point(consumed: float, quota: float, action: str, exceeded: bool, step: str = "",
                 result: str = "") -> BudgetPoint:
    return BudgetPoint(consumed=consumed, quota=quota, action=action, exceeded=exceeded, window_hours=1.0,
                       enforcement=result, enforced_at=step)


def run() -> Timeline:
    """Twenty seconds: a large budget (quota 2) going over at t=8 and paused from t=10; a tiny one (quota 0.01)
    going over at t=3 and alerted at t=4; MIG pods waiting on fragmented GPUs from t=5 to t=12."""
    tl = Timeline()
    for t in range(20):
        big = budget_point(0.2 * t, 2.0, "Pause", t >= 8, "s1" if t >= 10 else "", "Suspended" if t >= 10 else "")
        small = budget_point(0.004 * t, 0.01, "AlertOnly", t >= 3, "a1" if t >= 4 else "", "Alerted" if t >= 4 else "")
        waiting = 3 if 5 <= t <= 12 else 0
        tl.add(Sample(
            t=float(t), budgets={"a/big": big, "b/small": small},
            power={"m-0": "on", "m-1": "booting" if t < 5 else "on"}, pending_gpu_pods=1 if t < 5 else 0,
            pools={"spot": PoolPoint(desired=2, ready=1 if 8 <= t < 12 else 2, live=3 if 8 <= t < 14 else 2)},
            launches=2 if t < 8 else 3, reclaims=0 if t < 7 else 1,
            mig=MigPoint(capacity=28, used=14, unowned=1 if t == 3 else 0, fragmented=8 if waiting else 2,
                         free=(6 if waiting else 12) - (1 if t == 3 else 0), demand=3 * waiting,
                         waiting={NO_PLACEMENT: waiting - 1, CREATING: 1} if waiting else {}),
        ))
    return tl


def test_timeline_budget_percent_and_enforcement_steps() -> None:
    tl = run()
    assert tl.budget_percent("b/small")[5] == pytest.approx(200.0)
    assert tl.budget_percent("a/big")[10] == pytest.approx(100.0)
    assert tl.enforcement_steps("a/big") == [(10.0, "Suspended")]
    assert tl.enforcement_steps("b/small") == [(4.0, "Alerted")]
    series = tl.mig_series()
    assert all(sum(series[k][i] for k in MIG_PARTS) == series["capacity"][i] for i in range(len(tl)))
    assert series["demand"][6] == 9 and series["fragmented"][6] == 8
    assert list(tl.wait_series()) == [NO_PLACEMENT, CREATING]


def overlaps(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


@pytest.mark.parametrize("name", list(plots.PLOTS))
def test_plots_draw_with_legends_off_the_data(name: str, tmp_path: Path) -> None:
    tl = run()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.draw(name, tl, {"a/big": [10.0, 12.0]})
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible() and ax.has_data()]
    legends = [*fig.legends, *(lg for ax in fig.axes if (lg := ax.get_legend()) is not None)]
    assert legends, "every plot explains its colours"
    for lg in legends:
        box = lg.get_window_extent(renderer)
        assert not any(overlaps(box, ax) for ax in boxes), f"{name}: a legend covers an axes"
    for ax in fig.axes:
        if ax.has_data():
            assert ax.get_ylabel(), f"{name}: an axes without a y label"
    written = plots.write_plots(tl, tmp_path, {"a/big": [10.0]})
    assert set(written) == set(plots.PLOTS)
    assert written[name].read_bytes().startswith(PNG)


def test_plots_draw_an_empty_run(tmp_path: Path) -> None:
    tl = Timeline()
    tl.add(Sample(t=0.0))
    written = plots.write_plots(tl, tmp_path, {})
    assert all(p.read_bytes().startswith(PNG) for p in written.values())
