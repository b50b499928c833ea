"""`gpuops`: the command line. Lists only the commands that exist."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence

from . import __version__, logs
from .kube.manager import ControllerRegistry, UnknownControllers

CONTROLLERS = ControllerRegistry()
"""The controllers `gpuops run` knows, by name. Each controller registers its setup here, lazily, e.g.
`CONTROLLERS.register("budget", "gpuops.controllers.budget:setup")`, where `setup(manager)` creates its
informers (`manager.informer(...)`) and controllers and `manager.add(...)`s them."""
CONTROLLERS.register("budget", "gpuops.controllers.budget:setup")
CONTROLLERS.register("autoprovision", "gpuops.controllers.autoprovision:setup")
CONTROLLERS.register("spotpool", "gpuops.controllers.spotpool.setup:setup")
CONTROLLERS.register("migslicer", "gpuops.controllers.migslicer.setup:setup")


COMMANDS_GROUP = "gpuops.commands"
"""Entry-point group through which other installed distributions add commands: each entry point names a
function `register(subparsers)` that adds its parser(s) and sets `handler(args, argv) -> int` as their default
(the emulator distribution contributes `sim` and `demo` this way)."""

_OPTIONAL_COMMANDS = {"sim": "gpuops-sim", "demo": "gpuops-sim"}
"""Commands of distributions users commonly add, so a missing one gets an install hint, not argparse's error."""


def _add_contributed_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        if ep.name in sub.choices:
            continue  # two distributions contributing one name: the first (by sort order) wins
        try:
            register = ep.load()
        except ImportError as e:
            print(f"gpuops: command {ep.name!r} ({ep.value}) cannot be loaded: {e}", file=sys.stderr)
            continue
        register(sub)


def _missing_command(argv: Sequence[str], sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> str | None:
    """The install hint for a well-known optional command that is not installed here, if argv asks for one."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command in sub.choices or command not in _OPTIONAL_COMMANDS:
        return None
    return (f"gpuops {command}: this command comes with the {_OPTIONAL_COMMANDS[command]} distribution, which is not "
            f"installed: pip install {_OPTIONAL_COMMANDS[command]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuops", description="GPU cluster operators for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_contributed_commands(sub)
    run = sub.add_parser("run", help="run the controllers against a cluster (the operator's entrypoint)")
    _add_run_args(run)
    agent = sub.add_parser("agent", help="the MIG node agent (one per MIG node: slices, device plugins, MigNode)")
    from .controllers.migslicer.agent.main import add_arguments as _agent_args

    _agent_args(agent)
    mig = sub.add_parser("mig", help="MIG planning tools (no GPU needed)")
    mig_sub = mig.add_subparsers(dest="mig_command", metavar="MIG_COMMAND")
    # `plan` parses its own arguments (gpuops.accounting.migplan): prefix_chars="+" keeps this parser from
    # claiming --gpu/--existing/--help, so everything after `plan` reaches migplan.main unchanged.
    plan = mig_sub.add_parser("plan", add_help=False, prefix_chars="+",
                              help="where MIG slices would go on one GPU, as JSON (see: gpuops mig plan --help)")
    plan.add_argument("plan_argv", nargs="*")
    return parser


def _controllers_arg(value: str) -> list[str]:
    try:
        return CONTROLLERS.select(value)
    except UnknownControllers as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _bind_address_arg(value: str) -> str:
    from .kube.health import parse_bind_address

    try:
        parse_bind_address(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _seconds_arg(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (e.g. 60 or 0.5)") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: must be a finite number of seconds >= 0")
    return seconds


def _positive_seconds_arg(value: str) -> float:
    seconds = _seconds_arg(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be more than 0 seconds")
    return seconds


def _workers_arg(value: str) -> int:
    count = _count_arg(value)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: must be at least 1")
    return count


def _count_arg(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be >= 0")
    return count


def _namespaces_arg(value: str) -> tuple[str, ...]:
    from .controllers.secretscope import parse_namespaces

    names = parse_namespaces(value)
    bad = [n for n in names if not _DNS_LABEL.fullmatch(n)]
    if bad:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: not a namespace name (lowercase letters, digits, '-')")
    return names


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    known = ", ".join(CONTROLLERS.names()) or "none registered yet"
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="kubeconfig file (default: $KUBECONFIG, then in-cluster config, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--namespace", metavar="NS", help="watch only this namespace (default: all namespaces)")
    p.add_argument("--controllers", type=_controllers_arg, metavar="LIST",
                   help=f"comma-separated controllers to run; '*' means all, '-NAME' leaves one out "
                        f"(default: all; known: {known})")
    p.add_argument("--leader-elect", action="store_true",
                   help="run the controllers only while holding a coordination.k8s.io Lease (for several replicas)")
    p.add_argument("--leader-elect-lease-name", default="gpuops-controller-manager", metavar="NAME",
                   help="name of the Lease (default: %(default)s)")
    p.add_argument("--leader-elect-namespace", metavar="NS",
                   help="namespace of the Lease (default: the pod's namespace, or the kubeconfig context's)")
    p.add_argument("--leader-elect-lease-duration", type=float, default=15.0, metavar="SECONDS",
                   help="how long standbys wait before taking over an unrenewed Lease (default: %(default)s)")
    p.add_argument("--leader-elect-renew-deadline", type=float, default=10.0, metavar="SECONDS",
                   help="the leader steps down if it cannot renew within this (default: %(default)s)")
    p.add_argument("--leader-elect-retry-period", type=float, default=2.0, metavar="SECONDS",
                   help="interval between acquire/renew attempts (default: %(default)s)")
    p.add_argument("--metrics-bind-address", type=_bind_address_arg, default=":8080", metavar="ADDR",
                   help='serve /metrics here; "0" disables (default: %(default)s)')
    p.add_argument("--metrics-secure", action="store_true",
                   help="serve /metrics over HTTPS, only to bearer tokens the API server authenticates "
                        "(TokenReview) whose user may get the path (SubjectAccessReview; e.g. the "
                        "gpuops-metrics-reader ClusterRole); the operator needs create on tokenreviews and "
                        "subjectaccessreviews (gpuops-metrics-auth)")
    p.add_argument("--metrics-cert-dir", metavar="DIR",
                   help="with --metrics-secure: serve DIR/tls.crt and DIR/tls.key (e.g. a mounted Secret), "
                        "reloaded when they change (default: a self-signed certificate made at start)")
    p.add_argument("--health-probe-bind-address", type=_bind_address_arg, default=":8081", metavar="ADDR",
                   help='serve /healthz and /readyz here; "0" disables (default: %(default)s)')
    p.add_argument("--graceful-shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long in-flight reconciles get after SIGTERM (default: %(default)s)")
    p.add_argument("--budget-status-refresh", type=_seconds_arg, default=60.0, metavar="SECONDS",
                   help="rewrite a budget's status at least this often while its pods run, so `kubectl get gwb` "
                        "stays fresh between pod changes (0: only on changes; the metrics are exact at scrape "
                        "time either way; default %(default)s)")
    p.add_argument("--budget-max-concurrent-reconciles", type=_workers_arg, default=16, metavar="N",
                   help="budgets reconciled at once (each mostly waits on its status write; default %(default)s)")
    p.add_argument("--autoprovision-min-warm-gpus", type=_count_arg, default=0, metavar="N",
                   help="GPUs of powered-on, idle GPUNodeGroup machines kept warm for the next pods (default 0)")
    p.add_argument("--autoprovision-max-concurrent-power-offs", type=_count_arg, default=10, metavar="N",
                   help="machines draining or powering off at once, at most (default %(default)s)")
    p.add_argument("--mig-webhook-port", type=int, default=9443, metavar="PORT",
                   help="port of the MIG slicer's admission webhook (HTTPS, own CA; 0: no webhook; "
                        "default %(default)s)")
    p.add_argument("--mig-webhook-host", default="", metavar="ADDR",
                   help="address the webhook listens on (default: all)")
    p.add_argument("--mig-webhook-service", default="gpuops-webhook", metavar="NAME",
                   help="the webhook's Service, which its certificate names (default %(default)s)")
    p.add_argument("--mig-webhook-namespace", default=None, metavar="NS",
                   help="the Service's namespace (default: the operator's, else gpuops-system)")
    p.add_argument("--mig-webhook-cert-dir", default=None, metavar="DIR",
                   help="keep the webhook's CA here across restarts (a writable volume; default: memory)")
    p.add_argument("--mig-advertise-timeout", type=_seconds_arg, default=60.0, metavar="SECONDS",
                   help="a MIG pod whose slices exist but are not offered to the kubelet this long after the "
                        "allocator asked (the agent's device plugin not registered, the kubelet not listing them) "
                        "is marked DeviceNotAdvertised with a Warning Event (default %(default)s)")
    p.add_argument("--secret-namespaces", type=_namespaces_arg, metavar="LIST",
                   default=os.environ.get("GPUOPS_SECRET_NAMESPACES", ""),  # argparse parses a string default
                   help="namespaces besides the operator's own whose Secrets GPUNodeGroups and SpotPools may name "
                        "(comma-separated; default $GPUOPS_SECRET_NAMESPACES, which the installed Deployment takes "
                        "from ConfigMap gpuops-secret-namespaces; grant the operator Secret get there too)")
    p.add_argument("--spotpool-resync", type=_seconds_arg, default=30.0, metavar="SECONDS",
                   help="describe every SpotPool's instances at least this often, to notice reclaims no node agent "
                        "reported (node events and pool changes describe at once; default %(default)s)")
    p.add_argument("--spotpool-call-timeout", type=_positive_seconds_arg, default=15.0, metavar="SECONDS",
                   help="how long one cloud API call of a SpotPool may take before it counts as failed (a launch "
                        "that timed out is retried with the same client token; default %(default)s)")
    logs.add_format_argument(p)
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO",
                   help="(default: %(default)s)")


async def _run_manager(args: argparse.Namespace) -> int:
    import structlog

    from .kube.client import Client
    from .kube.leaderelection import LeaderElectionLost
    from .kube.manager import Manager

    log = structlog.get_logger("gpuops")
    names: list[str] = args.controllers if args.controllers is not None else CONTROLLERS.select(None)
    try:
        client = await Client.auto(args.kubeconfig, args.context)
    except Exception as e:
        print(f"gpuops run: cannot load the cluster configuration: {e}", file=sys.stderr)
        return 1
    try:
        try:
            manager = Manager(
                client,
                namespace=args.namespace,
                leader_election=args.leader_elect,
                leader_election_id=args.leader_elect_lease_name,
                leader_election_namespace=args.leader_elect_namespace,
                lease_duration=args.leader_elect_lease_duration,
                renew_deadline=args.leader_elect_renew_deadline,
                retry_period=args.leader_elect_retry_period,
                metrics_bind_address=args.metrics_bind_address,
                metrics_secure=args.metrics_secure,
                metrics_cert_dir=args.metrics_cert_dir,
                health_probe_bind_address=args.health_probe_bind_address,
                graceful_shutdown_timeout=args.graceful_shutdown_timeout,
                settings={"budget_status_refresh": args.budget_status_refresh,
                          "budget_max_concurrent_reconciles": args.budget_max_concurrent_reconciles,
                          "autoprovision_min_warm_gpus": args.autoprovision_min_warm_gpus,
                          "autoprovision_max_concurrent_power_offs": args.autoprovision_max_concurrent_power_offs,
                          "spotpool_resync": args.spotpool_resync,
                          "spotpool_call_timeout": args.spotpool_call_timeout,
                          "mig_webhook_port": args.mig_webhook_port,
                          "mig_webhook_host": args.mig_webhook_host or None,
                          "mig_webhook_service": args.mig_webhook_service,
                          "mig_webhook_namespace": args.mig_webhook_namespace,
                          "mig_webhook_cert_dir": args.mig_webhook_cert_dir,
                          "mig_advertise_timeout": args.mig_advertise_timeout,
                          "secret_namespaces": args.secret_namespaces},
            )
        except ValueError as e:
            print(f"gpuops run: {e}", file=sys.stderr)
            return 2
        await CONTROLLERS.setup(manager, names)
        if not names:
            log.warning("no controllers selected; serving metrics and probes only", known=CONTROLLERS.names())
        log.info("starting manager", controllers=names, namespace=args.namespace or "(all)",
                 leader_elect=args.leader_elect)
        manager.handle_signals()
        await manager.run()
    except LeaderElectionLost as e:
        log.error("leader election lost, exiting", error=str(e))
        return 1
    except Exception as e:
        log.exception("manager failed", error=str(e))
        return 1
    finally:
        await client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    hint = _missing_command(argv, commands)
    if hint:
        print(hint, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logs.configure(json=logs.json_of(args), level=getattr(args, "log_level", "INFO"))
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args, argv))
    if args.command == "run":
        from .kube.gctune import tune_for_large_heaps

        tune_for_large_heaps()  # the informer caches are large and long-lived (see gctune)
        return asyncio.run(_run_manager(args))
    if args.command == "agent":
        from .controllers.migslicer.agent.main import run as run_agent

        return asyncio.run(run_agent(args))
    if args.command == "mig" and args.mig_command == "plan":
        from . import migplan

        return migplan.main(args.plan_argv)
    if args.command == "mig":
        parser.parse_args(["mig", "--help"])
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
