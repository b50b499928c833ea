"""The emulated cloud: a power API for on-prem machines and a spot-instance API whose instances join the fleet.

`CloudServer` serves both over HTTP on loopback (the controllers only ever talk HTTP to it); the same
objects are reachable from Python for tests and chaos scenarios (faults, reclaims, capacity).
"""

from .config import CloudOptions, InstanceType, default_instance_types
from .errors import CloudError
from .faults import CloudFaults, FaultRule
from .server import CloudServer
from .spot import Instance, LaunchRequest, SpotCloud

__all__ = [
    "CloudError",
    "CloudFaults",
    "CloudOptions",
    "CloudServer",
    "FaultRule",
    "Instance",
    "InstanceType",
    "LaunchRequest",
    "SpotCloud",
    "default_instance_types",
]
