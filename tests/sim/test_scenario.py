"""Scenario files: shipped ones load, bad ones fail naming the field; workload draws are reproducible."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpuops_sim.scenario import ScenarioError, builtin_names, load, parse
from gpuops_sim.workload import EXIT_CODE, RUNTIME, WORKLOAD_LABEL, manifest


def test_shipped_scenarios_load() -> None:
    names = builtin_names()
    assert {"idle", "demo"} <= set(names)
    for name in names:
        sc = load(name)
        assert sc.name == name


def test_idle_is_a_blank_canvas() -> None:
    sc = load("idle")
    assert sc.workload == [] and sc.faults == []
    models = {g.gpu_model for g in sc.node_groups if g.gpu_model}
    assert len(models) >= 2
    assert all(g.powered_off == 0 for g in sc.node_groups)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"name": "x", "nodeGroups": [{"name": "a", "count": "three"}]}, "$.nodeGroups[0].count"),
        ({"name": "x", "nodeGroups": [{"name": "a", "gpuModel": "Z9000", "gpusPerNode": 1}]}, "gpuModel"),
        ({"name": "x", "nodeGroups": [{"name": "a", "gpusPerNode": 4}]}, "gpuModel: required"),
        ({"name": "x", "nodeGroups": [{"name": "a", "count": 2, "poweredOff": 3}]}, "poweredOff"),
        ({"name": "x", "nodeGroups": [{"name": "a", "cout": 2}]}, "cout"),
        ({"name": "x", "nodeGroups": [{"name": "A_b"}]}, "DNS label"),
        ({"name": "x", "workload": [{"name": "w", "arrival": {}}]}, "exactly one of every, perMinute, at"),
        ({"name": "x", "workload": [{"name": "w", "arrival": {"every": 1}, "namespace": "nope"}]},
         "not listed in namespaces"),
        ({"name": "x", "workload": [{"name": "w", "arrival": {"every": 1}, "gpus": {"uniform": {"low": 3,
                                                                                               "high": 1}}}]},
         "low <= high"),
        ({"name": "x", "faults": [{"at": 1, "action": "explode"}]}, "$.faults[0].action"),
    ],
)
def test_bad_scenarios_name_the_field(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse(data, "t.yaml")
    assert needle in str(e.value)
    assert "t.yaml" in str(e.value)


def test_unknown_name_lists_shipped(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"shipped: .*demo"):
        load("no-such-scenario")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load(str(bad))


def test_manifests_are_reproducible_and_carry_the_draws() -> None:
    sc = parse({"name": "x", "namespaces": ["t"], "workload": [
        {"name": "w", "namespace": "t", "arrival": {"every": 1},
         "gpus": {"choice": {"values": [1, 2, 4]}}, "runtimeSeconds": {"exponential": {"mean": 10}},
         "failureRate": 0.5},
        {"name": "j", "namespace": "t", "kind": "Job", "arrival": {"every": 1}, "gpus": 2, "runtimeSeconds": 5,
         "parallelism": 2, "completions": 4, "ttlSecondsAfterFinished": 30}]})
    w, j = sc.workload
    a = [manifest(w, random.Random(3), i) for i in range(20)]
    b = [manifest(w, random.Random(3), i) for i in range(20)]
    assert a == b
    pods = [obj for _, obj in a]
    assert {p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods} <= {"1", "2", "4"}
    assert all(float(p["metadata"]["annotations"][RUNTIME]) >= 0 for p in pods)
    assert any(EXIT_CODE in p["metadata"]["annotations"] for p in pods)
    assert all(p["metadata"]["labels"][WORKLOAD_LABEL] == "w" for p in pods)
    gr, job = manifest(j, random.Random(1), 0)
    assert gr == ("batch", "jobs")
    assert job["spec"]["parallelism"] == 2 and job["spec"]["completions"] == 4
    assert job["spec"]["ttlSecondsAfterFinished"] == 30
    assert job["spec"]["template"]["metadata"]["annotations"][RUNTIME] == "5.000"
