"""`gpuops`: the command line. Lists only the commands that exist."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from . import __version__, logs


def _add_apiserver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    p.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one (printed)")
    p.add_argument("--kubeconfig", metavar="PATH", help="write a kubeconfig with an admin bearer token here")
    p.add_argument("--token", help="admin bearer token (default: random)")
    p.add_argument("--authorization", choices=["AlwaysAllow", "RBAC"], default="AlwaysAllow",
                   help="RBAC enforces Roles/ClusterRoles and their bindings")
    p.add_argument("--history-size", type=int, default=100_000,
                   help="watch events kept for watch-from-resourceVersion; older ones answer 410 Gone")
    p.add_argument("--history-age", type=float, default=300.0, help="seconds a watch event is kept")
    p.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS with a fresh CA (in the kubeconfig); kubectl sends tokens only over TLS")
    p.add_argument("--terminated-pod-gc-threshold", type=int, default=None, metavar="N",
                   help="delete the oldest terminated pods beyond N (default: keep them all)")
    p.add_argument("--restore", metavar="FILE", help="start from a snapshot written by --save-on-exit")
    p.add_argument("--save-on-exit", metavar="FILE", help="write a snapshot of all objects on shutdown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuops", description="GPU cluster operators for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuops {__version__}")
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs (default: when no TTY)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sim = sub.add_parser("sim", help="the emulated Kubernetes cluster (no real cluster needed)")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    api = sim_sub.add_parser("apiserver", help="run the emulated Kubernetes API server on loopback")
    _add_apiserver_args(api)
    demo = sub.add_parser("demo", help="start the emulated API server with sample objects and show how to use it")
    _add_apiserver_args(demo)
    return parser


async def _run_apiserver(args: argparse.Namespace, demo: bool) -> int:
    try:
        from .sim.apiserver import APIServer
    except ImportError as e:  # cel-python and PyYAML come with the "sim" extra only
        print(f"gpuops: the emulated cluster needs the 'sim' extra ({e.name} is missing): "
              "pip install 'gpuops[sim]'", file=sys.stderr)
        return 2

    server = APIServer(
        args.host,
        args.port,
        authorization=args.authorization,
        admin_token=args.token,
        history_size=args.history_size,
        history_age=args.history_age,
        bookmark_interval=args.bookmark_interval,
        terminated_pod_gc_threshold=args.terminated_pod_gc_threshold,
        tls=args.tls,
    )
    if args.restore:
        server.restore(args.restore)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(f"gpuops sim apiserver listening on {server.url} (port {server.port})", flush=True)
        if demo:
            from .sim.demo import describe, populate

            await populate(server)
            print(describe(server, args.kubeconfig), flush=True)
        await stop.wait()
        if args.save_on_exit:
            server.save(args.save_on_exit)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(json=args.log_json)
    if args.command == "sim" and args.sim_command == "apiserver":
        return asyncio.run(_run_apiserver(args, demo=False))
    if args.command == "demo":
        return asyncio.run(_run_apiserver(args, demo=True))
    if args.command == "sim":
        parser.parse_args(["sim", "--help"])
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
