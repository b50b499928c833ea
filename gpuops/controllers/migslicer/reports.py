"""Which node agents' reports the allocator does not plan on.

Admission confines each agent to its own MigNode, but a report can still contradict the others (a forged or
corrupted report, a policy not installed, a node renamed): the same GPU UUID twice in one report, a GPU UUID
that another node also reports (a GPU sits in one machine), or a MigNode describing a node other than the one
it is named after. Planning slices on such a report could place a pod on a GPU that is not there, or hand out
another node's slices, so every report involved is left out until it is corrected. Which of two reports
naming the same GPU is the true one cannot be told from here, so neither is trusted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .api import MigNode

__all__ = ["refused_reports"]


def refused_reports(reports: Iterable[MigNode]) -> dict[str, str]:
    """MigNode name -> why the allocator leaves it out (empty when every report is consistent)."""
    out: dict[str, str] = {}
    owners: defaultdict[str, list[str]] = defaultdict(list)
    for mn in reports:
        name = mn.metadata.name
        if mn.spec.node_name and mn.spec.node_name != name:
            out[name] = (f"describes node {mn.spec.node_name} but is named {name}: an agent reports its own node in "
                         "the MigNode of that name")
        seen: set[str] = set()
        for g in mn.status.gpus:
            if g.uuid in seen:
                out.setdefault(name, f"lists GPU {g.uuid} twice")
            seen.add(g.uuid)
        for uuid in seen:
            owners[uuid].append(name)
    for uuid, names in owners.items():
        if len(names) > 1:
            for name in names:
                others = ", ".join(sorted(n for n in names if n != name))
                out.setdefault(name, f"lists GPU {uuid}, which MigNode {others} reports too (a GPU is in one node)")
    return out
