"""Commands and NVML backends other distributions contribute through entry points: present when the emulator
(gpuops-sim) is installed, and, when it is not, a one-line answer naming what to install instead of argparse's
"invalid choice" or a traceback. The absence is produced by hiding the entry-point groups, as a machine without
gpuops-sim would show them; the image check (.ci/image_check.py) does the same on a real install."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from gpuops import cli
from gpuops.controllers.migslicer.agent import backends
from gpuops.controllers.migslicer.agent.gpus import MigBackendError


def _without_contributions(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.entry_points

    def hidden(**select: Any) -> Any:
        if select.get("group") in (cli.COMMANDS_GROUP, backends.ENTRY_POINT_GROUP):
            return importlib.metadata.EntryPoints(())
        return real(**select)

    monkeypatch.setattr(importlib.metadata, "entry_points", hidden)
    monkeypatch.setattr(backends, "entry_points", hidden)


def test_the_emulator_contributes_its_commands_and_backend() -> None:
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert {"sim", "demo"} <= set(commands.choices)  # type: ignore[arg-type]
    names = backends.backend_names()
    assert names[0] == "nvml" and "emulated" in names


@pytest.mark.parametrize("argv", [["sim", "up"], ["demo", "--seconds", "5"], ["sim"]])
def test_without_the_emulator_its_commands_name_the_distribution(
        argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _without_contributions(monkeypatch)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "pip install gpuops-sim" in err and "Traceback" not in err and "invalid choice" not in err


def test_without_the_emulator_the_agent_names_the_backends_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_contributions(monkeypatch)
    assert backends.backend_names() == ["nvml"]
    with pytest.raises(MigBackendError, match=r"no such NVML backend.*known: nvml.*pip install gpuops-sim"):
        backends.load_nvml("emulated", backends.BackendOptions("node-1", gpus="A100-40GB:1"))


def test_the_emulated_backend_serves_the_node_it_is_given() -> None:
    nvml = backends.load_nvml("emulated", backends.BackendOptions("node-1", gpus="A100-40GB:2"))
    nvml.nvmlInit()
    try:
        assert nvml.nvmlDeviceGetCount() == 2
    finally:
        nvml.nvmlShutdown()
