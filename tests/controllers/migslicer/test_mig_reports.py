"""Which MigNode reports the allocator refuses, for any set of reports: exactly those that list a GPU UUID twice,
share one with another report, or describe a node other than their name; the rest are all used."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gpuops.controllers.migslicer.api import MigGPU, MigNode, MigNodeSpec, MigNodeStatus
from gpuops.controllers.migslicer.reports import refused_reports
from gpuops.kube.objects import ObjectMeta

UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(6)]


def report(name: str, uuids: list[str], described: str = "") -> MigNode:
    gpus = tuple(MigGPU(index=i, uuid=u, model="A100-40GB") for i, u in enumerate(uuids))
    return MigNode(metadata=ObjectMeta(name=name), spec=MigNodeSpec(node_name=described),
                   status=MigNodeStatus(gpus=gpus))


reports = st.lists(st.tuples(st.sampled_from(["n0", "n1", "n2", "n3"]), st.lists(st.sampled_from(UUIDS), max_size=3),
                             st.sampled_from(["", "same", "n9"])),
                   max_size=4, unique_by=lambda r: r[0])


@given(reports)
def test_refused_exactly_when_contradicting(raw: list[tuple[str, list[str], str]]) -> None:
    nodes = [report(name, uuids, name if described == "same" else described) for name, uuids, described in raw]
    owners = Counter(u for _, uuids, _ in raw for u in set(uuids))
    refused = refused_reports(nodes)
    for name, uuids, described in raw:
        wrong_node = described == "n9"
        doubled = len(set(uuids)) < len(uuids)
        shared = any(owners[u] > 1 for u in uuids)
        assert (name in refused) == (wrong_node or doubled or shared), (name, refused)
    assert set(refused) <= {name for name, _, _ in raw}


def test_the_reasons_say_what_contradicts() -> None:
    refused = refused_reports([report("a", [UUIDS[0]]), report("b", [UUIDS[0], UUIDS[1]]),
                               report("c", [UUIDS[2], UUIDS[2]]), report("d", [UUIDS[3]], "e"),
                               report("f", [UUIDS[4]], "f")])
    assert refused == {
        "a": f"lists GPU {UUIDS[0]}, which MigNode b reports too (a GPU is in one node)",
        "b": f"lists GPU {UUIDS[0]}, which MigNode a reports too (a GPU is in one node)",
        "c": f"lists GPU {UUIDS[2]} twice",
        "d": "describes node e but is named d: an agent reports its own node in the MigNode of that name",
    }
