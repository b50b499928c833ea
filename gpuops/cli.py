"""`gpuops`: the command line. Lists only the commands that exist."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
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


def _load_scenario(name: str, command: str) -> object | None:
    try:
        from .sim.scenario import ScenarioError, load
    except ImportError as e:  # PyYAML and cel-python come with the "sim" extra only
        print(f"gpuops {command}: the emulated cluster needs the 'sim' extra ({e.name} is missing): "
              "pip install 'gpuops[sim]'", file=sys.stderr)
        return None
    try:
        return load(name)
    except ScenarioError as e:
        print(f"gpuops {command}: {e}", file=sys.stderr)
        return None


def _run_cluster(args: argparse.Namespace) -> int:
    from .sim.apiserver.gctune import tune_for_large_heaps

    command = "demo" if args.command == "demo" else "sim up"
    scenario = _load_scenario(args.scenario, command)
    if scenario is None:
        return 2
    tune_for_large_heaps()
    if args.command == "demo":
        from .sim.demo import run_demo, seconds_from_env

        kubeconfig = args.kubeconfig or "demo.kubeconfig"
        return asyncio.run(run_demo(scenario, kubeconfig=kubeconfig,  # type: ignore[arg-type]
                                    seconds=seconds_from_env(args.seconds), port=args.port,
                                    operator=not args.no_operator,
                                    report_dir=None if args.no_report else args.report_dir))
    from .sim.up import run_up

    if args.kubeconfig:  # a kubeconfig of an earlier run must not pass for this cluster being up
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.kubeconfig)
    return asyncio.run(run_up(scenario, host=args.host, port=args.port, cloud_port=args.cloud_port,  # type: ignore[arg-type]
                              kubeconfig=args.kubeconfig, tls=args.tls, workload=not args.no_workload,
                              seconds=args.seconds, status_every=args.status_every,
                              authorization=args.authorization, run_pods=args.run_pods, state_dir=args.state_dir))


def _sim_up_detached(argv: Sequence[str], args: argparse.Namespace) -> int:
    from .sim.detach import up_detached

    if not args.kubeconfig:
        print("gpuops sim up: --detach needs --kubeconfig (the file tells when the cluster is up)", file=sys.stderr)
        return 2
    return up_detached([a for a in argv if a != "--detach"], args.kubeconfig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuops", description="GPU cluster operators for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sim = sub.add_parser("sim", help="the emulated Kubernetes cluster (no real cluster needed)")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    api = sim_sub.add_parser("apiserver", help="run the emulated Kubernetes API server on loopback")
    _add_apiserver_args(api)
    up = sim_sub.add_parser("up", help="run a whole emulated GPU cluster (API server, nodes, scheduler, cloud)")
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
    down = sim_sub.add_parser("down", help="stop a cluster started with `gpuops sim up --detach`")
    down.add_argument("--kubeconfig", metavar="PATH", required=True,
                      help="the kubeconfig the cluster was started with")
    demo = sub.add_parser("demo", help="the demo scenario, our operator against it and a live view (make demo)")
    _add_cluster_args(demo, default_scenario="demo")
    demo.add_argument("--no-operator", action="store_true", help="do not start `gpuops run`")
    demo.add_argument("--report-dir", default="demo-report", metavar="DIR",
                      help="write the report (README.md and PNG plots) here at the end (default: %(default)s)")
    demo.add_argument("--no-report", action="store_true", help="write no report folder")
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


async def _run_apiserver(args: argparse.Namespace) -> int:
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
    from .sim.apiserver.gctune import freeze_current_heap, tune_for_large_heaps

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(json=logs.json_of(args), level=getattr(args, "log_level", "INFO"))
    if args.command == "sim" and args.sim_command == "apiserver":
        return asyncio.run(_run_apiserver(args))
    if args.command == "sim" and args.sim_command == "up" and args.detach:
        return _sim_up_detached(list(sys.argv[1:] if argv is None else argv), args)
    if args.command == "sim" and args.sim_command == "down":
        from .sim.detach import down

        return down(args.kubeconfig)
    if (args.command == "sim" and args.sim_command == "up") or args.command == "demo":
        return _run_cluster(args)
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
    if args.command == "sim":
        parser.parse_args(["sim", "--help"])
    if args.command == "mig":
        parser.parse_args(["mig", "--help"])
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
