"""The ports `gpuops run` and `gpuops agent` listen on by default: never the same (a developer runs both on one
host with their defaults), and the manifests declare, by name, the ports their containers' arguments make the
process listen on (a probe or a scrape aimed at a port nobody serves fails only in a cluster)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuops.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PORT_FLAGS = {"metrics": "--metrics-bind-address", "probes": "--health-probe-bind-address",
              "webhook": "--mig-webhook-port", "budget-webhook": "--budget-webhook-port"}
"""containerPort name -> the flag that sets that port."""


def _subcommand(name: str) -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            parser: argparse.ArgumentParser = action.choices[name]
            return parser
    raise KeyError(name)


def _port(value: object) -> int:
    """The port of a bind address (":8080", "127.0.0.1:8080") or a plain port number."""
    return int(str(value).rpartition(":")[2])


def listening(command: str, args: list[str]) -> dict[str, int]:
    """containerPort name -> the port `gpuops <command> <args>` listens on (its default unless an arg sets it)."""
    flags = {a.option_strings[0]: a.default for a in _subcommand(command)._actions if a.option_strings}
    for arg in args:
        flag, eq, value = arg.partition("=")
        if eq and flag in flags:
            flags[flag] = value
    return {name: _port(flags[flag]) for name, flag in PORT_FLAGS.items() if flag in flags}


def test_the_agent_defaults_collide_with_none_of_the_operators() -> None:
    operator, agent = listening("run", []), listening("agent", [])
    assert set(agent) == {"metrics", "probes"} and set(operator) == {"metrics", "probes", "webhook", "budget-webhook"}
    assert operator["budget-webhook"] == 0  # off unless asked for (the Deployment does)
    assert not set(agent.values()) & set(operator.values()), (agent, operator)


def _container(path: Path) -> dict[str, Any]:
    body = yaml.safe_load(path.read_text())
    container: dict[str, Any] = body["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("manifest", ["manager/deployment.yaml", "agent/daemonset.yaml",
                                      "emulated/agent-daemonset.yaml"])
def test_the_manifests_declare_the_ports_the_process_listens_on(manifest: str) -> None:
    container = _container(ROOT / "manifests" / manifest)
    command, *args = container["args"]
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert declared == listening(command, args)
