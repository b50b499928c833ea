"""One logging flag style on the command line: `--log-format json|console` on every command that runs something,
and no second spelling (the top-level `--log-json` is gone)."""

from __future__ import annotations

import pytest

from gpuops import logs
from gpuops.cli import build_parser

RUNNING = [["sim", "apiserver"], ["sim", "up"], ["demo"], ["run"], ["agent"]]


@pytest.mark.parametrize("command", RUNNING, ids=" ".join)
def test_every_running_command_takes_log_format(command: list[str]) -> None:
    parser = build_parser()
    assert logs.json_of(parser.parse_args([*command, "--log-format", "json"])) is True
    assert logs.json_of(parser.parse_args([*command, "--log-format", "console"])) is False
    assert logs.json_of(parser.parse_args(command)) is None  # unset: JSON unless stderr is a terminal


@pytest.mark.parametrize("argv", [["--log-json", "run"], ["run", "--log-json"], ["sim", "up", "--log-json"]])
def test_log_json_is_not_a_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2 and "--log-json" in capsys.readouterr().err
