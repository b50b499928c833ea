"""A container runtime for the emulated kubelets: pods whose containers use the gpuops image run as real
`gpuops` processes on this machine, with the flags, environment and volumes their spec gives them.

This is how `kubectl apply -k manifests/emulated` gets a working operator: the Deployment's pods run `gpuops
run`, the agent DaemonSet's pods `gpuops agent` next to their node's emulated kubelet, and the webhook Service
reaches the operator through its endpoints. Every other pod stays simulated (it "runs" for a time its
annotations give, as before).

What a container runtime would provide, emulated without privileges:
- network: an address of the pod's own (see `network.PodNetwork` and `podnet/sitecustomize.py`);
- API access: the pod's ServiceAccount, as a kubeconfig with that account's token in $KUBECONFIG (the process
  cannot read /var/run/secrets, and a kubeconfig is what every client honours first);
- volumes: hostPath in a per-node folder (the kubelet's device-plugin folder is the emulated kubelet's own
  socket folder of that node), emptyDir in a per-pod folder; paths under a mount are rewritten in the
  arguments and variables, and /tmp becomes $TMPDIR;
- trust: $SSL_CERT_FILE holds the system's CAs plus the emulated site's CA, like a node's image with the
  site's CA installed;
- probes: readiness and liveness httpGet / tcpSocket probes with the spec's timing;
- logs: stdout and stderr per container run, served by `kubectl logs` (with --previous).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ..apiserver.server import APIServer
from .network import SHIM_DIR, PodNetwork
from .podspec import ContainerConfigError, command_line, container_env, mount_dirs, rewrite_paths

log = structlog.get_logger("gpuops_sim.processes")

IMAGE = "ghcr.io/gpuops/gpuops"
"""The image whose containers run as processes (any tag or digest)."""
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
Key = tuple[str, str]

__all__ = ["IMAGE", "ContainerConfigError", "ProcessRuntime", "runs_as_process"]


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def runs_as_process(pod: Mapping[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return bool(containers) and all(_repository(str(c.get("image", ""))) == IMAGE for c in containers)


def gpuops_entrypoint() -> list[str]:
    exe = Path(sys.executable).parent / "gpuops"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuops"]


@dataclass(eq=False)
class _Run:
    key: Key
    uid: str
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    ready: bool = False
    exited: bool = False


class ProcessRuntime:
    """`start` a pod's processes (the kubelet calls it when the containers start), `terminate` / `kill` them,
    `stop` all at the end. `on_exit(code)` and `on_ready(ready)` report back to the kubelet."""

    def __init__(self, server: APIServer, network: PodNetwork, root: Path, *, device_plugin_root: Path,
                 ca_pem: bytes | None = None, entrypoint: list[str] | None = None) -> None:
        self.server = server
        self.network = network
        self.root = root
        self.device_plugin_root = device_plugin_root
        self.entrypoint = entrypoint or gpuops_entrypoint()
        self.ca_bundle = self._write_ca_bundle(ca_pem) if ca_pem else None
        self._runs: dict[Key, _Run] = {}
        self._killers: set[asyncio.Task[None]] = set()
        self._logs: dict[Key, dict[str, list[Path]]] = {}
        self._closing = False  # set by stop(): a pod's restart must not outlive the cluster

    def _write_ca_bundle(self, ca_pem: bytes) -> Path:
        system = ssl.get_default_verify_paths().cafile
        bundle = self.root / "ca-bundle.pem"
        bundle.parent.mkdir(parents=True, exist_ok=True)
        existing = Path(system).read_bytes() if system and Path(system).is_file() else b""
        bundle.write_bytes(existing + b"\n" + ca_pem)
        return bundle

    # ------------------------------------------------------------------------------------ start

    async def start(self, pod: Mapping[str, Any], *, node: str, pod_ip: str, on_exit: Callable[[int], None],
                    on_ready: Callable[[bool], None]) -> bool:
        """Start every container's process; True when the pod is ready at once (no readiness probe). Raises
        ContainerConfigError when the spec cannot be run as it stands."""
        if self._closing:
            raise ContainerConfigError("the emulated cluster is shutting down")
        meta = pod["metadata"]
        key: Key = (meta.get("namespace", ""), meta["name"])
        await self.kill(key)
        run = _Run(key, str(meta.get("uid", "")))
        address = self.network.sandbox(pod_ip)
        base = self._base_env(pod, address)
        prepared = [(c, *self.prepare(pod, c, node, base)) for c in (pod.get("spec") or {}).get("containers") or []]
        self._runs[key] = run
        for container, argv, env in prepared:
            name = str(container.get("name", ""))
            log_path = self._log_path(key, run.uid, name)
            out = log_path.open("ab")  # the child keeps its own descriptor; ours closes right after the start
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True, cwd=str(self._pod_dir(key, run.uid)))
            finally:
                out.close()
            run.procs[name] = proc
            run.tasks.append(asyncio.get_running_loop().create_task(self._watch(run, proc, on_exit)))
            log.info("pod process started", pod=f"{key[0]}/{key[1]}", container=name, pid=proc.pid, node=node)
        probes = [(c, address) for c in (pod.get("spec") or {}).get("containers") or []]
        has_readiness = any(c.get("readinessProbe") for c, _ in probes)
        for container, addr in probes:
            if container.get("readinessProbe"):
                run.tasks.append(asyncio.get_running_loop().create_task(
                    self._probe_loop(run, container, addr, "readinessProbe", on_ready)))
            if container.get("livenessProbe"):
                run.tasks.append(asyncio.get_running_loop().create_task(
                    self._probe_loop(run, container, addr, "livenessProbe", on_ready)))
        run.ready = not has_readiness
        return run.ready

    def _base_env(self, pod: Mapping[str, Any], address: str) -> dict[str, str]:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        namespace = str(meta.get("namespace", "default"))
        account = str(spec.get("serviceAccountName") or "default")
        key: Key = (namespace, str(meta["name"]))
        kubeconfig = self._pod_dir(key, str(meta.get("uid", ""))) / "kubeconfig"
        kubeconfig.write_text(self.server.kubeconfig(self.server.pod_token(pod),
                                                     user=f"system:serviceaccount:{namespace}:{account}",
                                                     namespace=namespace))  # as in-cluster config's namespace
        kubeconfig.chmod(0o600)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "HOME": str(kubeconfig.parent), "HOSTNAME": str(meta["name"]), "KUBECONFIG": str(kubeconfig),
               "PYTHONPATH": str(SHIM_DIR), "GPUOPS_SIM_POD_ADDRESS": address,
               "GPUOPS_SIM_NETWORK": str(self.network.table_path), "GPUOPS_SIM_POD_NAMESPACE": namespace,
               "TMPDIR": str(self._pod_dir(key, str(meta.get("uid", ""))) / "tmp")}
        if self.ca_bundle is not None:
            env["SSL_CERT_FILE"] = str(self.ca_bundle)
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
        return env

    def prepare(self, pod: Mapping[str, Any], container: Mapping[str, Any], node: str,
                base: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command line and environment a container of `pod` starts with on `node` (over `base`)."""
        uid = str(pod["metadata"].get("uid", ""))
        key: Key = (str(pod["metadata"].get("namespace", "")), str(pod["metadata"]["name"]))
        own = container_env(pod, container, self._lookup)
        mounts = mount_dirs(pod, container, lambda v: self._volume_dir(v, key, uid, node))
        env = {**base, **{k: rewrite_paths(v, mounts) for k, v in own.items()}}
        if "/tmp" in mounts:
            env["TMPDIR"] = str(mounts["/tmp"])
        argv = command_line(container, own, self.entrypoint, ("gpuops",))
        skip = len(self.entrypoint)  # the image's own program is this machine's path, outside every volume
        return [*argv[:skip], *(rewrite_paths(a, mounts) for a in argv[skip:])], env

    def _lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        gr = ("", "secrets") if kind == "Secret" else ("", "configmaps")
        got = self.server.store.get(gr, namespace, name)
        return None if got is None else got.obj

    def _volume_dir(self, volume: Mapping[str, Any], key: Key, uid: str, node: str) -> Path | None:
        if "hostPath" in volume:
            path = str(volume["hostPath"].get("path", "")).rstrip("/")
            where = self.device_plugin_root / node if path == DEVICE_PLUGIN_DIR else \
                self.root / "nodes" / node / path.lstrip("/")
        elif "emptyDir" in volume:
            where = self._pod_dir(key, uid) / "volumes" / str(volume.get("name", ""))
        else:
            return None  # projected tokens, ConfigMaps, Secrets: not provided as files here
        where.mkdir(parents=True, exist_ok=True)
        return where

    def _pod_dir(self, key: Key, uid: str) -> Path:
        d = self.root / "pods" / f"{key[0]}_{key[1]}_{uid[:8]}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _log_path(self, key: Key, uid: str, container: str) -> Path:
        runs = self._logs.setdefault(key, {}).setdefault(container, [])
        path = self._pod_dir(key, uid) / "logs" / f"{container}-{len(runs)}.log"
        path.parent.mkdir(exist_ok=True)
        runs.append(path)
        return path

    # ------------------------------------------------------------------------------------ running

    async def _watch(self, run: _Run, proc: asyncio.subprocess.Process, on_exit: Callable[[int], None]) -> None:
        code = await proc.wait()
        if run.exited:
            return
        run.exited = True
        for other in run.procs.values():  # the pod's containers restart together here
            if other is not proc and other.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
        log.info("pod process exited", pod=f"{run.key[0]}/{run.key[1]}", code=code)
        on_exit(128 - code if code < 0 else code)

    async def _probe_loop(self, run: _Run, container: Mapping[str, Any], address: str, kind: str,
                          on_ready: Callable[[bool], None]) -> None:
        probe = container[kind]
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        failures = successes = 0
        while not run.exited:
            ok = await probe_once(probe, container, address)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if kind == "readinessProbe":
                if ok and not run.ready and successes >= int(probe.get("successThreshold", 1)):
                    run.ready = True
                    on_ready(True)
                elif not ok and run.ready and failures >= int(probe.get("failureThreshold", 3)):
                    run.ready = False
                    on_ready(False)
            elif failures >= int(probe.get("failureThreshold", 3)):
                log.info("liveness probe failed: restarting the container", pod=f"{run.key[0]}/{run.key[1]}")
                self.terminate(run.key, signal.SIGKILL)
                return
            await asyncio.sleep(period if ok or kind == "livenessProbe" else min(period, 1.0))

    def ready(self, key: Key) -> bool:
        run = self._runs.get(key)
        return run is not None and run.ready and not run.exited

    def terminate(self, key: Key, sig: int = signal.SIGTERM) -> bool:
        """Signal the pod's processes; False when none runs."""
        run = self._runs.get(key)
        if run is None or run.exited:
            return False
        for proc in run.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        return True

    async def kill(self, key: Key) -> None:
        """SIGKILL whatever still runs of the pod and wait for it."""
        run = self._runs.pop(key, None)
        if run is None:
            return
        for proc in run.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await proc.wait()
        run.exited = True
        for task in run.tasks:
            task.cancel()

    def forget(self, key: Key, pod_ip: str) -> None:
        """The pod is gone: nothing of it may keep running, and its address is free again."""
        run = self._runs.get(key)
        if run is not None:
            task = asyncio.get_running_loop().create_task(self.kill(key))
            self._killers.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._killers.discard)
        if pod_ip:
            self.network.release(pod_ip)

    async def stop(self) -> None:
        self._closing = True
        for key in list(self._runs):
            self.terminate(key)
        for key in list(self._runs):
            run = self._runs[key]
            for proc in run.procs.values():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 10)
            await self.kill(key)

    def log_text(self, namespace: str, name: str, container: str, previous: bool) -> str | None:
        """What the container wrote (its last run, or the one before with `previous`); None when it never ran
        as a process."""
        runs = (self._logs.get((namespace, name)) or {}).get(container)
        if not runs or (previous and len(runs) < 2):
            return None
        path = runs[-2] if previous else runs[-1]
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""


async def probe_once(probe: Mapping[str, Any], container: Mapping[str, Any], address: str) -> bool:
    """One httpGet or tcpSocket probe against the pod's address (success: connected / HTTP 200-399)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if not action:
        return True  # exec and grpc probes are not emulated: taken as passing
    port = _port(action.get("port"), container)
    if port is None:
        return False
    try:
        if "httpGet" in probe:
            return await asyncio.wait_for(_http_get(address, port, action), timeout)
        _, writer = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
        writer.close()
        return True
    except (OSError, TimeoutError, ValueError):
        return False


async def _http_get(address: str, port: int, action: Mapping[str, Any]) -> bool:
    tls = str(action.get("scheme", "HTTP")).upper() == "HTTPS"
    ctx = ssl.create_default_context() if tls else None
    if ctx is not None:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the kubelet does not verify a probe's certificate either
    reader, writer = await asyncio.open_connection(address, port, ssl=ctx)
    try:
        path = str(action.get("path") or "/")
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}:{port}\r\nUser-Agent: kube-probe/1.37\r\n\r\n".encode())
        await writer.drain()
        line = await reader.readline()
        parts = line.split()
        return len(parts) >= 2 and parts[1].isdigit() and 200 <= int(parts[1]) < 400
    finally:
        writer.close()


def _port(value: Any, container: Mapping[str, Any]) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    for p in container.get("ports") or []:
        if p.get("name") == value:
            return int(p["containerPort"])
    return None
