"""The emulator's commands, `gpuops sim ...` and `gpuops demo`, contributed to the `gpuops` command line
through the `gpuops.commands` entry-point group (see `register`). Heavy imports wait until a command runs, so
`gpuops --help` stays fast."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpuops import logs

__all__ = ["register_demo", "register_sim"]

Handler = Callable[[argparse.Namespace, Sequence[str]], int]


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
    logs.add_format_argument(p)


def _add_cluster_args(p: argparse.ArgumentParser, default_scenario: str) -> None:
    p.add_argument("--scenario", default=default_scenario, metavar="NAME|FILE",
                   help="a shipped scenario (idle, demo, ...) or a scenario YAML file (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    p.add_argument("--port", type=int, default=0, help="API server port; 0 picks a free one (printed)")
    p.add_argument("--kubeconfig", metavar="PATH", help="write a kubeconfig for kubectl and the operator here")
    p.add_argument("--seconds", type=float, default=None, metavar="N",
                   help="stop after N seconds (demo: also $DEMO_SECONDS); default: until Ctrl-C")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   default="WARNING" if default_scenario == "demo" else "INFO",
                   help="the emulated cluster's log level (default: %(default)s)")
    logs.add_format_argument(p)


def _missing_dependency(command: str, e: ImportError) -> int:
    print(f"gpuops {command}: the emulated cluster needs {e.name or e}, which is not installed: "
          "pip install gpuops-sim", file=sys.stderr)
    return 2


def _load_scenario(name: str, command: str) -> Any:
    from .scenario import ScenarioError, load

    try:
        return load(name)
    except ScenarioError as e:
        print(f"gpuops {command}: {e}", file=sys.stderr)
        return None


def _guarded(command: str, handler: Handler) -> Handler:
    """A handler whose missing third-party dependency becomes one line naming it, not a traceback."""

    def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
        try:
            return handler(args, argv)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in ("gpuops_sim", "gpuops"):
                raise
            return _missing_dependency(command, e)

    return run


def _run_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from gpuops.kube.gctune import tune_for_large_heaps

    from .demo import run_demo, seconds_from_env

    scenario = _load_scenario(args.scenario, "demo")
    if scenario is None:
        return 2
    tune_for_large_heaps()
    return asyncio.run(run_demo(scenario, kubeconfig=args.kubeconfig or "demo.kubeconfig",
                                seconds=seconds_from_env(args.seconds), port=args.port,
                                operator=not args.no_operator,
                                report_dir=None if args.no_report else args.report_dir))


def _run_up(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.detach:
        return _up_detached(argv, args)
    from gpuops.kube.gctune import tune_for_large_heaps

    from .up import run_up

    scenario = _load_scenario(args.scenario, "sim up")
    if scenario is None:
        return 2
    tune_for_large_heaps()
    if args.kubeconfig:  # a kubeconfig of an earlier run must not pass for this cluster being up
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.kubeconfig)
    return asyncio.run(run_up(scenario, host=args.host, port=args.port, cloud_port=args.cloud_port,
                              kubeconfig=args.kubeconfig, tls=args.tls, workload=not args.no_workload,
                              seconds=args.seconds, status_every=args.status_every,
                              authorization=args.authorization, run_pods=args.run_pods, state_dir=args.state_dir))


def _up_detached(argv: Sequence[str], args: argparse.Namespace) -> int:
    from .detach import up_detached

    if not args.kubeconfig:
        print("gpuops sim up: --detach needs --kubeconfig (the file tells when the cluster is up)", file=sys.stderr)
        return 2
    return up_detached([a for a in argv if a != "--detach"], args.kubeconfig)


def _run_down(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .detach import down

    return down(args.kubeconfig)


def _run_apiserver(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .apiserver import APIServer

    server = APIServer(args.host, args.port, authorization=args.authorization, admin_token=args.token,
                       history_size=args.history_size, history_age=args.history_age,
                       bookmark_interval=args.bookmark_interval,
                       terminated_pod_gc_threshold=args.terminated_pod_gc_threshold, tls=args.tls)
    return asyncio.run(_serve_apiserver(server, args))


async def _serve_apiserver(server: Any, args: argparse.Namespace) -> int:
    from gpuops.kube.gctune import freeze_current_heap, tune_for_large_heaps

    tune_for_large_heaps()
    if args.restore:
        server.restore(args.restore)
        freeze_current_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(f"gpuops sim apiserver listening on {server.url} (port {server.port})", flush=True)
        await stop.wait()
        if args.save_on_exit:
            server.save(args.save_on_exit)
    return 0


def _add_up_args(up: argparse.ArgumentParser) -> None:
    _add_cluster_args(up, default_scenario="idle")
    up.add_argument("--cloud-port", type=int, default=0, help="port of the emulated cloud API; 0 picks a free one")
    up.add_argument("--tls", action="store_true", help="serve the API over HTTPS (kubectl sends tokens only over TLS)")
    up.add_argument("--no-workload", action="store_true", help="start the cluster without the scenario's workload")
    up.add_argument("--authorization", choices=["AlwaysAllow", "RBAC"], default="AlwaysAllow",
                    help="RBAC enforces Roles/ClusterRoles and their bindings (use with --tls for kubectl)")
    up.add_argument("--status-every", type=float, default=30.0, metavar="SECONDS",
                    help="print a one-line status this often; 0 = never (default: %(default)s)")
    up.add_argument("--no-run-pods", dest="run_pods", action="store_false",
                    help="simulate every pod; by default pods of the gpuops image (the installed operator and "
                         "agents) run as real processes, with a pod network and the site's services")
    up.add_argument("--state-dir", metavar="DIR",
                    help="where running pods keep their files and logs (default: a fresh folder in /tmp, removed "
                         "at the end)")
    up.add_argument("--detach", action="store_true",
                    help="run in the background; return once the cluster answers and --kubeconfig is written "
                         "(stop it with: gpuops sim down --kubeconfig PATH)")


def _usage(parser: argparse.ArgumentParser) -> Handler:
    def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
        parser.print_help(sys.stderr)
        return 2

    return run


def register_sim(commands: Any) -> None:
    """`gpuops sim apiserver|up|down`: the entry point `sim` of group `gpuops.commands`."""
    sim = commands.add_parser("sim", help="the emulated Kubernetes cluster (no real cluster needed)")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    sim.set_defaults(handler=_usage(sim))
    api = sim_sub.add_parser("apiserver", help="run the emulated Kubernetes API server on loopback")
    _add_apiserver_args(api)
    api.set_defaults(handler=_guarded("sim apiserver", _run_apiserver))
    up = sim_sub.add_parser("up", help="run a whole emulated GPU cluster (API server, nodes, scheduler, cloud)")
    _add_up_args(up)
    up.set_defaults(handler=_guarded("sim up", _run_up))
    down = sim_sub.add_parser("down", help="stop a cluster started with `gpuops sim up --detach`")
    down.add_argument("--kubeconfig", metavar="PATH", required=True,
                      help="the kubeconfig the cluster was started with")
    down.set_defaults(handler=_guarded("sim down", _run_down))


def register_demo(commands: Any) -> None:
    """`gpuops demo`: the entry point `demo` of group `gpuops.commands`."""
    demo = commands.add_parser("demo", help="the demo scenario, our operator against it and a live view (make demo)")
    _add_cluster_args(demo, default_scenario="demo")
    demo.add_argument("--no-operator", action="store_true", help="do not start `gpuops run`")
    demo.add_argument("--report-dir", default="demo-report", metavar="DIR",
                      help="write the report (README.md and PNG plots) here at the end (default: %(default)s)")
    demo.add_argument("--no-report", action="store_true", help="write no report folder")
    demo.set_defaults(handler=_guarded("demo", _run_demo))
