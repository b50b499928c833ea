"""Which Secrets our cluster-scoped objects may make the operator read.

GPUNodeGroups and SpotPools name a Secret (webhook token, HMAC key, cloud keys) that the operator reads and
sends somewhere the object chooses. If any Secret could be named, whoever may write those objects could read
every Secret in the cluster through us (a confused deputy). So a reference is honoured only in the
operator's own namespace, plus namespaces the operator was started with (`--secret-namespaces`, which the
installed Deployment takes from ConfigMap gpuops-secret-namespaces, the same list admission checks against);
the operator's RBAC grants Secret `get` in exactly those namespaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

import msgspec

from gpuops.kube.ownnamespace import own_namespace
from gpuops.kube.settings import flag

from .errors import SpecError

__all__ = ["DEFAULT_NAMESPACE", "SecretNamespaces", "SecretScope"]

DEFAULT_NAMESPACE = "gpuops-system"
"""The operator's namespace when it runs outside a pod (as installed by manifests/)."""


_DNS_LABEL = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"

SecretNamespaces = Annotated[
    tuple[Annotated[str, msgspec.Meta(pattern=_DNS_LABEL)], ...],
    flag("namespaces besides the operator's own whose Secrets GPUNodeGroups and SpotPools may name "
         "(comma-separated; the installed Deployment takes it from ConfigMap gpuops-secret-namespaces; grant the "
         "operator Secret get there too)", metavar="LIST", shared=True, env="GPUOPS_SECRET_NAMESPACES",
         hint="namespace names: lowercase letters, digits and '-'"),
]
"""The `--secret-namespaces` setting, shared by every controller that reads Secrets objects name."""


@dataclass(frozen=True, slots=True)
class SecretScope:
    home: str = DEFAULT_NAMESPACE
    """The operator's namespace: always allowed."""
    also: tuple[str, ...] = ()
    """Namespaces the operator was explicitly started with."""

    @classmethod
    def of_process(cls, namespaces: Iterable[str]) -> SecretScope:
        """The namespace this process runs in, plus `namespaces` (`gpuops run --secret-namespaces`)."""
        home = own_namespace() or DEFAULT_NAMESPACE
        return cls(home, tuple(n for n in namespaces if n != home))

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.home, *self.also)

    def allows(self, namespace: str) -> bool:
        return namespace in self.namespaces

    def check(self, field: str, namespace: str, kind: str) -> None:
        """Raise SpecError naming the field and both ways out unless `namespace` may be read."""
        if self.allows(namespace):
            return
        places = " or ".join(self.namespaces)
        raise SpecError(f"{field}.namespace", f"a {kind} may name a Secret only in {places} (the operator reads it "
                        f"on the object's behalf), not in {namespace!r}: move the Secret there, or add {namespace!r}"
                        " to the operator's --secret-namespaces (ConfigMap gpuops-secret-namespaces when installed "
                        "from manifests/) and grant it Secret get there")

    def check_all(self, refs: Iterable[tuple[str, str]], kind: str) -> None:
        for field, namespace in refs:
            self.check(field, namespace, kind)
