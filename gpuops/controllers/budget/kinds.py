"""What a pod's GPU time was of: the GPU model and capacity type of the node it ran on, as one ledger key.

The accounting package keeps usage apart by an opaque key (`LedgerEntry.key`, `consumed_by_key`); here the key is
"<model>|<capacity type>" (label values cannot contain "|"), "" where the pod's node was not known. A pod's kind is
taken once, the first time the budget controller sees it on a node it knows, and kept for the pod's life: the
model and capacity type it is charged as are those of its node while it ran, whatever the node's labels say later.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuops.controllers.nodelabels import attribution

__all__ = ["join", "key_of_node", "model_of", "split"]


def key_of_node(labels: Mapping[str, str]) -> str:
    model, capacity = attribution(labels)
    return f"{model}|{capacity}"


def join(model: str | None, capacity: str | None) -> str:
    """The key of a status item's model and capacityType ("" if it names neither)."""
    return f"{model or ''}|{capacity}" if capacity else ""


def split(key: str) -> tuple[str | None, str | None]:
    """(model, capacity type) for status; (None, None) for the unknown kind."""
    if not key:
        return None, None
    model, _, capacity = key.rpartition("|")
    return model, capacity


def model_of(key: str) -> str:
    """The GPU model of a kind ("" if unknown)."""
    return split(key)[0] or ""
