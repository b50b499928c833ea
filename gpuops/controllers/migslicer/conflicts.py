"""Report, on each MigNode, whether another component manages or advertises its node's MIG geometry.

NVIDIA's MIG manager re-applies its configuration and a device plugin with a MIG strategy offers the slices it
finds: on a node the gpuops agent also slices, each would undo or hand out the other's slices. The rule is
`gpuops.controllers.coexistence.mig_manager_conflict` (Node labels). What follows from it:
  * the allocator plans no slice on such a node (it reads the same labels, so it never waits for this report);
  * this controller sets the MigNode's ConflictDetected condition (True with the reason, False once resolved)
    and records one Warning Event on the Node when the conflict starts or changes;
  * the agent, which may not read Nodes, sees the condition in the answer to its own MigNode status write and
    then creates and destroys no slice on its node (`NodeAgent.held`).
"""

from __future__ import annotations

import structlog

from gpuops.controllers.coexistence import CONDITION, ConflictCondition, conflict_to_write, mig_manager_conflict
from gpuops.kube import conditions as cond
from gpuops.kube.client import Client
from gpuops.kube.controller import Request, Result
from gpuops.kube.errors import ApiError, NotFound
from gpuops.kube.events import EventRecorder
from gpuops.kube.informer import Informer
from gpuops.kube.objects import Node
from gpuops.kube.times import format_time, wall_clock

from .api import MIG_NODES, MigNode

__all__ = ["MigConflicts"]

log = structlog.get_logger("gpuops.controllers.migslicer.conflicts")
_SECOND = 1_000_000


class MigConflicts:
    """Keeps each MigNode's ConflictDetected condition in step with its Node's labels (one item per node)."""

    def __init__(self, client: Client, nodes: Informer[Node], mig_nodes: Informer[MigNode],
                 recorder: EventRecorder) -> None:
        self.client = client
        self.nodes = nodes
        self.mig_nodes = mig_nodes
        self.recorder = recorder

    def map_node(self, node: Node) -> list[Request]:
        name = node.metadata.name
        return [Request("", name)] if self.mig_nodes.store.get(name) is not None else []

    @staticmethod
    def map_mig_node(mig_node: MigNode) -> list[Request]:
        return [Request("", mig_node.metadata.name)]

    async def reconcile(self, req: Request) -> Result | None:
        mn = self.mig_nodes.store.get(req.name)
        if mn is None:
            return None
        node = self.nodes.store.get(mn.spec.node_name or mn.metadata.name)
        found = mig_manager_conflict(node.metadata.labels) if node is not None else None
        want = conflict_to_write(mn.status.conditions, found, "no other MIG manager or MIG device plugin on the node")
        if want is None or not await self._write(mn, want):
            return None
        if node is not None and want.status == "True":
            self.recorder.record(node, "Warning", want.reason, want.message)
            log.warning("MIG node held: another MIG manager", node=node.metadata.name, reason=want.reason)
        else:
            log.info("MIG node no longer held", mig_node=mn.metadata.name)
        return None

    async def _write(self, mn: MigNode, want: ConflictCondition) -> bool:
        """Merge-patch the conditions (only the operator writes them; the agent's patches leave them alone)."""
        items = cond.set_condition(mn.status.conditions, CONDITION, *want,
                                   now=format_time(wall_clock() // _SECOND * _SECOND))
        try:
            await self.client.patch(MIG_NODES, mn.metadata.name, {"status": {"conditions": items}},
                                    subresource="status")
        except NotFound:
            return False
        except ApiError as e:
            log.info("MigNode condition not written", mig_node=mn.metadata.name, error=str(e))
            raise
        return True
