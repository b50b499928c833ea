"""An emulated Kubernetes API server on loopback, faithful enough for real clients (kubectl, kubernetes-asyncio,
the official `kubernetes` client)."""

from .faults import Faults
from .server import APIServer

__all__ = ["APIServer", "Faults"]
