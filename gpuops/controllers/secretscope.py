"""Which Secrets our cluster-scoped objects may make the operator read.

GPUNodeGroups and SpotPools name a Secret (webhook token, HMAC key, cloud keys) that the operator reads and
sends somewhere the object chooses. If any Secret could be named, whoever may write those objects could read
every Secret in the cluster through us (a confused deputy). So a reference is honoured only in the
operator's own namespace, plus namespaces the operator was started with (`--secret-namespaces`, which the
installed Deployment takes from ConfigMap gpuops-secret-namespaces, the same list admission checks against);
the operator's RBAC grants Secret `get` in exactly those namespaces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuops.kube.ownnamespace import own_namespace

from .errors import SpecError

__all__ = ["DEFAULT_NAMESPACE", "SecretScope", "parse_namespaces"]

DEFAULT_NAMESPACE = "gpuops-system"
"""The operator's namespace when it runs outside a pod (as installed by manifests/)."""


def parse_namespaces(text: str) -> tuple[str, ...]:
    """'a, b c' -> ('a', 'b', 'c'): commas or spaces, blanks dropped, order kept, no repeats."""
    out: list[str] = []
    for part in text.replace(",", " ").split():
        if part not in out:
            out.append(part)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SecretScope:
    home: str = DEFAULT_NAMESPACE
    """The operator's namespace: always allowed."""
    also: tuple[str, ...] = ()
    """Namespaces the operator was explicitly started with."""

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SecretScope:
        """The manager's settings (`gpuops run --secret-namespaces`) and the namespace this process runs in."""
        home = own_namespace() or DEFAULT_NAMESPACE
        also = tuple(n for n in settings.get("secret_namespaces") or () if n != home)
        return cls(home, also)

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
