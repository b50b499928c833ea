"""The namespace this process runs in, as a pod knows it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["own_namespace"]

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str | None:
    """$POD_NAMESPACE (the downward API), else the mounted service account's namespace; None outside a pod."""
    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        return _SA_NAMESPACE.read_text().strip() or None
    except OSError:
        return None
