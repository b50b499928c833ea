"""`gpuops`: the command line. Lists only the commands that exist."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Sequence

from . import __version__, logs
from .controllers.registry import CONTROLLERS as DEFINITIONS
from .kube.registry import ControllerRegistry, UnknownControllers

CONTROLLERS = ControllerRegistry(DEFINITIONS)
"""The controllers `gpuops run` knows (gpuops/controllers/registry.py), each with its settings and flags."""


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


def build_parser(controllers: ControllerRegistry = CONTROLLERS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuops", description="GPU cluster operators for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpuops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the controllers against a cluster (the operator's entrypoint)")
    _add_run_args(run, controllers)
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
    budget = sub.add_parser("budget", help="GPU budget tools")
    budget_sub = budget.add_subparsers(dest="budget_command", metavar="BUDGET_COMMAND")
    report = budget_sub.add_parser(
        "report", help="usage and cost per budget, namespace, GPU model and capacity type (table, CSV, JSON)",
        description="Usage and cost per budget, namespace, GPU model and capacity type, from the budgets' status: "
                    "the current window, or the calendar period that ended last.")
    from .controllers.budget.report import add_arguments as _report_args

    _report_args(report)
    _add_contributed_commands(sub)
    return parser


def _controllers_arg(controllers: ControllerRegistry) -> Callable[[str], list[str]]:
    def select(value: str) -> list[str]:
        try:
            return controllers.select(value)
        except UnknownControllers as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return select


def _add_run_args(p: argparse.ArgumentParser, controllers: ControllerRegistry) -> None:
    """The process's flags here; the manager's come from ManagerOptions, each controller's from its settings."""
    from .kube.manager import ManagerOptions
    from .kube.settings import add_flags

    known = ", ".join(controllers.names()) or "none registered yet"
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="kubeconfig file (default: $KUBECONFIG, then in-cluster config, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument("--controllers", type=_controllers_arg(controllers), metavar="LIST",
                   help=f"comma-separated controllers to run; '*' means all, '-NAME' leaves one out "
                        f"(default: all; known: {known})")
    add_flags(p, ManagerOptions, prefix="")
    controllers.add_flags(p)
    logs.add_format_argument(p)
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO",
                   help="(default: %(default)s)")


async def _run_manager(args: argparse.Namespace, controllers: ControllerRegistry) -> int:
    import structlog

    from .kube.client import Client
    from .kube.leaderelection import LeaderElectionLost
    from .kube.manager import Manager, ManagerOptions
    from .kube.settings import from_args

    log = structlog.get_logger("gpuops")
    names: list[str] = args.controllers if args.controllers is not None else controllers.select(None)
    try:
        client = await Client.auto(args.kubeconfig, args.context)
    except Exception as e:
        print(f"gpuops run: cannot load the cluster configuration: {e}", file=sys.stderr)
        return 1
    try:
        try:
            manager = Manager(client, from_args(args, ManagerOptions, prefix=""))
        except ValueError as e:
            print(f"gpuops run: {e}", file=sys.stderr)
            return 2
        await controllers.setup(manager, names, controllers.settings_from_args(args))
        if not names:
            log.warning("no controllers selected; serving metrics and probes only", known=controllers.names())
        log.info("starting manager", controllers=names, namespace=args.namespace or "(all)",
                 leader_elect=manager.options.leader_election)
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


def main(argv: Sequence[str] | None = None, controllers: ControllerRegistry = CONTROLLERS) -> int:
    """`gpuops`; `controllers` lets an embedding program (or a test) run its own set with `gpuops run`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(controllers)
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
        return asyncio.run(_run_manager(args, controllers))
    if args.command == "agent":
        from .controllers.migslicer.agent.main import run as run_agent

        return asyncio.run(run_agent(args))
    if args.command == "mig" and args.mig_command == "plan":
        from . import migplan

        return migplan.main(args.plan_argv)
    if args.command == "mig":
        parser.parse_args(["mig", "--help"])
    if args.command == "budget" and args.budget_command == "report":
        from .controllers.budget import report

        return report.main(args)
    if args.command == "budget":
        parser.parse_args(["budget", "--help"])
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
