"""The ServiceAccount admission plugin for new Pods: the pod's service account must exist in its namespace,
and unless the pod or the account opts out (`automountServiceAccountToken: false`) every container gets the
projected token volume at /var/run/secrets/kubernetes.io/serviceaccount (a bound token, the cluster CA from
kube-root-ca.crt, and the namespace), which is what a pod on a real cluster carries.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from .errors import StatusError

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3607  # an hour and the kubelet's refresh margin, as upstream projects it
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _volume(name: str) -> dict[str, Any]:
    return {"name": name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}


def _automount(spec: Mapping[str, Any], account: Mapping[str, Any]) -> bool:
    if spec.get("automountServiceAccountToken") is not None:
        return bool(spec["automountServiceAccountToken"])
    return account.get("automountServiceAccountToken") is not False


def admit(pod: dict[str, Any], account: Mapping[str, Any] | None) -> None:
    """Admit a new pod in place, or refuse it (403) when its service account does not exist."""
    meta, spec = pod["metadata"], pod.setdefault("spec", {})
    name = str(spec.get("serviceAccountName") or "default")
    if account is None:
        raise StatusError(
            403, "Forbidden",
            f'pods "{meta.get("name", "")}" is forbidden: error looking up service account '
            f'{meta.get("namespace", "")}/{name}: serviceaccount "{name}" not found',
            name=meta.get("name", ""), kind="pods",
        )
    spec["serviceAccountName"] = name
    spec["serviceAccount"] = name  # the deprecated alias every v1 Pod still prints
    if not _automount(spec, account):
        return
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)]
    if any(m.get("mountPath") == MOUNT_PATH for c in containers for m in c.get("volumeMounts") or []):
        return  # the pod mounts something of its own there
    volume = f"kube-api-access-{''.join(random.choices(_ALPHABET, k=5))}"
    spec["volumes"] = [*(spec.get("volumes") or []), _volume(volume)]
    for c in containers:
        c["volumeMounts"] = [*(c.get("volumeMounts") or []),
                             {"name": volume, "readOnly": True, "mountPath": MOUNT_PATH}]
