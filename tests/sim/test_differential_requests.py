"""The emulator's effective pod request against the operator's, written separately from the same Kubernetes
documentation: for generated pod specs (init containers, sidecars, overhead, pod-level requests, quantities in
every suffix form and as JSON numbers) both must give the same exact amount for every resource."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.quantity import parse_quantity as operator_quantity
from gpuops.accounting.requests import Container, PodSpecRequests, pod_requests
from gpuops_sim.apiserver.quantity import parse_quantity
from gpuops_sim.cluster.podrequests import effective_requests

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "e0", "e3", "E6", "e-3", "e-9", "E12", "e+2"]
RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "hugepages-2Mi", "gpuops.io/mig-1g.5gb"]


@st.composite
def quantity_texts(draw: st.DrawFn) -> str:
    whole = str(draw(st.one_of(st.integers(0, 20), st.integers(0, 10**7))))
    digits = draw(st.text("0123456789", max_size=7))
    fraction = draw(st.sampled_from(["", f".{digits}"]))
    if digits and fraction and draw(st.booleans()):
        whole = ""  # ".5" is a quantity too
    return f"{draw(st.sampled_from(['', '+']))}{whole}{fraction}{draw(st.sampled_from(SUFFIXES))}"


quantities = st.one_of(
    quantity_texts(),
    st.integers(0, 10**6),  # JSON numbers, as a client may send them
    st.floats(0, 10**6, allow_nan=False, allow_infinity=False),
)
resource_lists = st.dictionaries(st.sampled_from(RESOURCES), quantities, max_size=4)


@st.composite
def containers(draw: st.DrawFn, i: int, init: bool) -> dict[str, Any]:
    c: dict[str, Any] = {"name": f"c{i}", "image": "busybox"}
    kinds = draw(st.sets(st.sampled_from(["requests", "limits"])))
    resources: dict[str, Any] = {}
    for kind in sorted(kinds):
        resources[kind] = draw(resource_lists)
    empty_stanza = draw(st.booleans())
    if resources or empty_stanza:
        c["resources"] = resources
    if init and draw(st.booleans()):
        c["restartPolicy"] = "Always"  # a sidecar
    return c


@st.composite
def pod_specs(draw: st.DrawFn) -> dict[str, Any]:
    n_init, n_app = draw(st.integers(0, 4)), draw(st.integers(0, 3))
    spec: dict[str, Any] = {
        "initContainers": [draw(containers(i, True)) for i in range(n_init)],
        "containers": [draw(containers(n_init + i, False)) for i in range(n_app)],
    }
    if draw(st.booleans()):
        spec["overhead"] = draw(resource_lists)
    if draw(st.booleans()):
        spec["resources"] = {"requests": draw(resource_lists)}
    return spec


def _operator_container(c: Mapping[str, Any]) -> Container:
    res = c.get("resources") or {}
    return Container(name=c["name"], requests=res.get("requests") or {}, limits=res.get("limits") or {},
                     restartable=c.get("restartPolicy") == "Always")


def operator_requests(spec: Mapping[str, Any]) -> Mapping[str, Fraction]:
    return pod_requests(PodSpecRequests(
        init_containers=[_operator_container(c) for c in spec["initContainers"]],
        containers=[_operator_container(c) for c in spec["containers"]],
        overhead=spec.get("overhead") or {},
        pod_requests=(spec.get("resources") or {}).get("requests"),
    ))


@settings(max_examples=500, deadline=None)
@given(spec=pod_specs())
def test_the_emulator_and_the_operator_agree_on_effective_requests(spec: dict[str, Any]) -> None:
    assert effective_requests(spec) == dict(operator_requests(spec))


@settings(max_examples=2000, deadline=None)
@given(raw=quantities)
def test_the_emulator_and_the_operator_agree_on_quantity_values(raw: str | int | float) -> None:
    assert parse_quantity(raw) == operator_quantity(raw)


def test_documented_example() -> None:
    """The Init Containers page's rules on a pod with a sidecar: the init container runs next to the sidecar
    listed before it, and overhead comes on top."""
    spec = {
        "initContainers": [
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
            {"name": "migrate", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        ],
        "containers": [{"name": "app", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": 1}}}],
        "overhead": {"cpu": "100m"},
    }
    assert effective_requests(spec) == {"cpu": Fraction(1350, 1000), "memory": Fraction(2**30),
                                        "nvidia.com/gpu": Fraction(1)}
