"""What a container runtime makes of a pod's spec before it starts a process: the environment (values, field
references, ConfigMap and Secret keys, `$(VAR)` expansion), the command line, and where each volume lives.

Pure functions of the pod and what they look up, so the rules Kubernetes documents are tested on their own.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Lookup = Callable[[str, str, str], Mapping[str, Any] | None]
"""(kind, namespace, name) -> the ConfigMap or Secret, None when it does not exist."""


class ContainerConfigError(Exception):
    """The container cannot be created from its spec as it stands (a missing ConfigMap key, ...): the kubelet
    reports CreateContainerConfigError and tries again later."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an undefined reference stays as written,
    and `$$` escapes a `$` (so `$$(VAR)` is the literal `$(VAR)`)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"), "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
    }
    if path not in simple:
        raise ContainerConfigError(f"fieldRef {path!r} is not supported by the emulated kubelet")
    return str(simple[path] or "")


def _key_ref(kind: str, ref: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    obj = lookup(kind, namespace, str(ref.get("name", "")))
    key = str(ref.get("key", ""))
    if obj is None:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(f'{kind.lower()} "{ref.get("name")}" not found')
    if kind == "Secret":
        raw = (obj.get("data") or {}).get(key)
        value = None if raw is None else base64.b64decode(raw).decode("utf-8", "replace")
    else:
        value = (obj.get("data") or {}).get(key)
    if value is None:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{ref.get('name')}")
    return str(value)


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env in order (each value may
    refer to the variables before it)."""
    namespace = str((pod.get("metadata") or {}).get("namespace", "default"))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind, ref = ("ConfigMap", source.get("configMapRef")) if "configMapRef" in source else \
            ("Secret", source.get("secretRef"))
        obj = lookup(kind, namespace, str((ref or {}).get("name", "")))
        if obj is None:
            if (ref or {}).get("optional"):
                continue
            raise ContainerConfigError(f'{kind.lower()} "{(ref or {}).get("name")}" not found')
        for k, v in (obj.get("data") or {}).items():
            env[f"{source.get('prefix', '')}{k}"] = base64.b64decode(v).decode("utf-8", "replace") \
                if kind == "Secret" else str(v)
    for var in container.get("env") or []:
        name, source = str(var.get("name", "")), var.get("valueFrom")
        if source is None:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        value: str | None
        if "fieldRef" in source:
            value = _field(pod, str(source["fieldRef"].get("fieldPath", "")))
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, lookup)
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, lookup)
        else:
            raise ContainerConfigError(f"env {name}: only value, fieldRef, configMapKeyRef and secretKeyRef are "
                                       "supported by the emulated kubelet")
        if value is not None:
            env[name] = value
    return env


def mount_dirs(pod: Mapping[str, Any], container: Mapping[str, Any],
               volume_dir: Callable[[Mapping[str, Any]], Path | None]) -> dict[str, Path]:
    """mountPath -> the directory on this machine holding the volume (`volume_dir` places one volume; None for a
    volume the emulation does not provide, whose mount is then left out)."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    out: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount.get("name"))
        if volume is None:
            continue
        where = volume_dir(volume)
        if where is not None:
            sub = str(mount.get("subPath") or "")
            out[str(mount.get("mountPath", "")).rstrip("/") or "/"] = where / sub if sub else where
    return out


def rewrite_paths(text: str, mounts: Mapping[str, Path]) -> str:
    """A path under a mount, inside an argument or variable, pointed at where the volume lives here (the
    emulation has no mount namespace, so the process sees this machine's file system)."""
    for mount_path in sorted(mounts, key=len, reverse=True):
        pattern = r"(?<![\w./-])" + re.escape(mount_path) + r"(?=/|$|[\s,:;=])"
        text = re.sub(pattern, _replacement(str(mounts[mount_path])), text)
    return text


def _replacement(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value  # a function, so backslashes in the path are not read as group references


def command_line(container: Mapping[str, Any], env: Mapping[str, str], entrypoint: list[str],
                 known: tuple[str, ...]) -> list[str]:
    """The process to start: the image's entrypoint (or `command` naming it) with the expanded args."""
    command = [expand(str(c), env) for c in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if command:
        if Path(command[0]).name not in known:
            raise ContainerConfigError(f"command {command[0]!r}: the emulated kubelet runs only the image's own "
                                       f"entrypoint ({', '.join(known)})")
        return [*entrypoint, *command[1:], *args]
    return [*entrypoint, *args]
