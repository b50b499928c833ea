"""`gpuops agent`: the MIG node agent's command line (one per MIG node, a DaemonSet)."""

from __future__ import annotations

import argparse
import os
import sys

import structlog

from gpuops import logs

__all__ = ["add_arguments", "run"]

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), metavar="NAME",
                   help="this node's name (default: $NODE_NAME, from the downward API)")
    p.add_argument("--backend", default="nvml", metavar="NAME",
                   help="nvml: the GPUs through nvidia-ml-py; any other name: an NVML-shaped module an installed "
                        "distribution contributes (the emulator's is 'emulated'; default: %(default)s)")
    p.add_argument("--emulated", action="store_true", help="same as --backend emulated")
    p.add_argument("--gpus", default="A100-40GB:2", metavar="MODEL:N,...",
                   help="emulated backends: the GPUs to emulate, e.g. A100-40GB:2,H100-80GB:1 (default: %(default)s)")
    p.add_argument("--state-file", metavar="PATH",
                   help="emulated: where the fake driver keeps its slices, so an agent restart finds them "
                        "(put it on a path a node reboot clears, such as /run)")
    p.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR, metavar="DIR",
                   help="the kubelet's device-plugin directory, holding kubelet.sock (default: %(default)s)")
    p.add_argument("--orphan-grace", type=float, default=30.0, metavar="SECONDS",
                   help="destroy a slice no claim names after this long (default: %(default)s)")
    p.add_argument("--heartbeat", type=float, default=15.0, metavar="SECONDS",
                   help="rewrite the MigNode at least this often (default: %(default)s)")
    # probes 8082, metrics 8083: clear of `gpuops run`'s 8080 and 8081, so both run on one host with their defaults
    p.add_argument("--metrics-bind-address", default=":8083", metavar="ADDR",
                   help="metrics endpoint (0: off; default: %(default)s)")
    p.add_argument("--health-probe-bind-address", default=":8082", metavar="ADDR",
                   help="/healthz and /readyz (0: off; default: %(default)s)")
    logs.add_format_argument(p)
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO")


async def run(args: argparse.Namespace) -> int:
    from gpuops.kube.client import Client
    from gpuops.kube.manager import Manager, ManagerOptions

    from .agent import AgentSettings, install
    from .backends import BackendOptions, load_nvml
    from .gpus import MigBackend, MigBackendError

    log = structlog.get_logger("gpuops.agent")
    if not args.node_name:
        print("gpuops agent: --node-name (or $NODE_NAME) is required", file=sys.stderr)
        return 2
    backend_name = "emulated" if args.emulated else args.backend
    try:
        nvml = load_nvml(backend_name, BackendOptions(args.node_name, gpus=args.gpus, state_file=args.state_file))
        backend = MigBackend(nvml)
    except (MigBackendError, ValueError) as e:
        print(f"gpuops agent: {e}", file=sys.stderr)
        return 2
    try:
        client = await Client.auto(args.kubeconfig, args.context)
    except Exception as e:
        print(f"gpuops agent: cannot load the cluster configuration: {e}", file=sys.stderr)
        return 1
    try:
        manager = Manager(client, ManagerOptions(metrics_bind_address=args.metrics_bind_address,
                                                 health_probe_bind_address=args.health_probe_bind_address))
        try:
            install(manager, args.node_name, backend, plugin_dir=args.device_plugin_dir,
                    settings=AgentSettings(grace=args.orphan_grace, heartbeat=args.heartbeat,
                                           backend_name=backend_name))
        except MigBackendError as e:
            print(f"gpuops agent: the GPUs cannot be used: {e}", file=sys.stderr)
            return 1
        log.info("starting MIG agent", node=args.node_name, backend=backend_name,
                 device_plugin_dir=args.device_plugin_dir)
        manager.handle_signals()
        await manager.run()
    except Exception as e:
        log.exception("agent failed", error=str(e))
        return 1
    finally:
        await client.close()
    return 0
