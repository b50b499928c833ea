"""Any budget the CRD schema admits is handled: hypothesis draws specs from the schema itself (so the draws
follow every change to it), the API server admits or refuses each, and the budget controller, running on the
emulated cluster with pods of several teams, reconciles every admitted one without raising, without a hot loop,
and with a Ready condition for its generation (Ready=False with a reason and an Event when it cannot act)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from budget_harness import NS, SCENARIO, pod
from hypothesis import event, given, reject
from hypothesis import strategies as st
from live_controller import ANY_ADMITTED, Expect, Live, handles_admitted
from schema_strategies import for_schema

from gpuops.controllers.budget.api import BUDGETS
from gpuops.controllers.budget.pricelist import PRICE_LISTS
from gpuops.controllers.budget.setup import install
from gpuops.kube.manager import Manager
from gpuops.kube.resources import PODS
from gpuops_sim.cluster.cluster import SimCluster

ROOT = Path(__file__).resolve().parents[3]
SPEC = yaml.safe_load((ROOT / "manifests/crds/gpuworkloadbudgets.gpuops.io.yaml").read_text())[
    "spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
NAMES = itertools.count()


def _install(manager: Manager, _cluster: SimCluster) -> Any:
    return install(manager)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    crds = ["gpuworkloadbudgets", "gpupricelists"]
    with Live(tmp_path_factory.mktemp("budget-any"), SCENARIO, crds, [BUDGETS, PRICE_LISTS], _install) as lv:

        async def workload() -> None:
            for i, (gpus, labels) in enumerate([(1, {"team": "a"}), ("500m", {"team": "b", "tier": "x"}),
                                                (2, {})]):
                await lv.client.create(PODS, pod(f"w{i}", gpus, 0.5 if i == 0 else None, labels), NS)
            await lv.client.create(PRICE_LISTS, {  # the default: budgets naming no list, with a EUR cost quota, count
                "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUPriceList", "metadata": {"name": "default"},
                "spec": {"currency": "EUR", "default": True, "fallback": {"onDemand": "2.5", "weight": "2"}}})

        lv.run(workload())
        yield lv


QUOTA = SPEC["properties"]["quota"]
AMOUNTS = ("gpuHours", "weightedGpuHours", "cost")
WINDOWS = ("windowHours", "window")


@st.composite
def quotas(draw: st.DrawFn) -> dict[str, Any]:
    """A quota drawn from its schema with one amount and one window kept (a CEL rule admits exactly one of each,
    which a draw of every optional field would rarely meet); the currency is mostly the default list's."""
    over = {"spec.quota.cost.currency": st.sampled_from(["EUR", "EUR", "USD"])}
    drawn = {name: draw(for_schema(sub, f"spec.quota.{name}", over)) for name, sub in QUOTA["properties"].items()}
    keep = {draw(st.sampled_from(AMOUNTS)), draw(st.sampled_from(WINDOWS))}
    return {k: v for k, v in drawn.items() if k in keep or k not in (*AMOUNTS, *WINDOWS)}


@ANY_ADMITTED
@given(spec=for_schema(SPEC, "spec", {"spec.quota": quotas(), "spec.priceList": st.sampled_from(["default", "gone"])}))
def test_any_admitted_budget_is_reconciled_without_raising_or_looping(live: Live, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUWorkloadBudget",
            "metadata": {"name": f"any-{next(NAMES)}"}, "spec": spec}
    admitted = live.run(handles_admitted(live, BUDGETS, body, NS, Expect()))
    event("admitted" if admitted else "refused")
    if not admitted:
        reject()
