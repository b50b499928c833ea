"""`pods/log`: what a container wrote when the emulated kubelet runs it as a process (the gpuops image), else
the lines a kubelet could honestly report for a simulated container, one per lifecycle transition it recorded
in the pod's status (created, started, restarted, terminated).

The errors are kube-apiserver's: a container must be named when a pod has several, an unknown container is
a 400, a container that has not started yet has no log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import bad_request

T = TypeVar("T")
_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
_STATUS_KINDS = {"initContainers": "initContainerStatuses", "containers": "containerStatuses",
                 "ephemeralContainers": "ephemeralContainerStatuses"}


def _names(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    spec = pod.get("spec") or {}
    return [(kind, c.get("name", "")) for kind in _CONTAINER_KINDS for c in spec.get(kind) or []]


def _container(pod: Mapping[str, Any], requested: str | None) -> tuple[str, str]:
    meta = pod["metadata"]
    names = _names(pod)
    regular = [n for k, n in names if k == "containers"]
    if not requested:
        default = (meta.get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
        if default or len(regular) == 1:
            requested = default or regular[0]
        else:
            raise bad_request(f"a container name must be specified for pod {meta['name']}, choose one of: "
                              f"[{' '.join(regular)}]")
    for kind, name in names:
        if name == requested:
            return kind, name
    raise bad_request(f"container {requested} is not valid for pod {meta['name']}")


def _status(pod: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    for st in (pod.get("status") or {}).get(_STATUS_KINDS[kind]) or []:
        if st.get("name") == name:
            return dict(st)
    return {}


def _lines(name: str, image: str, status: Mapping[str, Any], previous: bool) -> list[tuple[str, str]]:
    """(time, text) per transition of the current run, or of the last terminated one with `previous`."""
    state = (status.get("lastState") if previous else status.get("state")) or {}
    running, terminated = state.get("running"), state.get("terminated")
    lines: list[tuple[str, str]] = []
    if running:
        lines.append((running.get("startedAt", ""), f"container {name} started (image {image})"))
    if terminated:
        started = terminated.get("startedAt", "")
        if started:
            lines.append((started, f"container {name} started (image {image})"))
        reason = terminated.get("reason") or "Completed"
        lines.append((terminated.get("finishedAt", ""),
                      f"container {name} exited with code {terminated.get('exitCode', 0)} ({reason})"))
    return lines


LogSource = Callable[[str, str, str, bool], str | None]
"""(namespace, pod, container, previous) -> what a container that really ran wrote; None when it never did."""


def pod_log(pod: Mapping[str, Any], query: Mapping[str, str], source: LogSource | None = None) -> str:
    """The log text of one container (query: container, previous, timestamps, tailLines): what the process
    wrote when it runs as one (`source`), else the lifecycle lines."""
    kind, name = _container(pod, query.get("container"))
    status = _status(pod, kind, name)
    previous = query.get("previous", "false").lower() not in ("0", "false")
    meta = pod["metadata"]
    written = None if source is None else source(meta.get("namespace", ""), meta["name"], name, previous)
    if written is not None:
        return "".join(_tail(written.splitlines(keepends=True), query.get("tailLines")))
    image = next((c.get("image", "") for c in (pod.get("spec") or {}).get(kind) or [] if c.get("name") == name), "")
    state = status.get("lastState" if previous else "state") or {}
    if not state.get("running") and not state.get("terminated"):
        if previous:
            raise bad_request(f'previous terminated container "{name}" in pod "{pod["metadata"]["name"]}" not found')
        waiting = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
        raise bad_request(f'container "{name}" in pod "{pod["metadata"]["name"]}" is waiting to start: {waiting}')
    lines = _tail(_lines(name, image, status, previous), query.get("tailLines"))
    timestamps = query.get("timestamps", "false").lower() not in ("0", "false")
    return "".join(f"{t} {text}\n" if timestamps and t else f"{text}\n" for t, text in lines)


def _tail(lines: list[T], tail: str | None) -> list[T]:
    if tail is None:
        return lines
    try:
        return lines[-int(tail):] if int(tail) > 0 else []
    except ValueError:
        raise bad_request(f"tailLines: invalid value {tail!r}") from None


def refused(resource: str, sub: str) -> str:
    """Why a streaming subresource is not served: nothing runs in the emulated cluster's containers."""
    return (f"{resource}/{sub} is not available in the emulated cluster: its kubelets only simulate containers "
            "(or run the gpuops image as a plain process), so there is nothing to exec into, attach to, forward "
            "ports of or proxy to")
