"""An emulated Kubernetes API server on loopback, faithful enough for real clients (see DESIGN.md)."""

from .faults import Faults
from .server import APIServer

__all__ = ["APIServer", "Faults"]
