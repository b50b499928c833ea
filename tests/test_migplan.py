"""`gpuops mig plan`: JSON placements on stdout, exit 1 when the request does not fit, exit 2 for bad input."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest

from gpuops import cli, migplan
from gpuops.accounting import mig


def plan(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = migplan.main(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_prints_placements_in_request_order() -> None:
    rc, out, err = plan("--gpu", "A100-40GB", "2g.10gb", "4g.20gb")
    assert rc == 0 and err == ""
    assert json.loads(out) == [{"profile": "2g.10gb", "start": 4, "size": 2},
                               {"profile": "4g.20gb", "start": 0, "size": 4}]


@pytest.mark.parametrize("batch", [["2g.10gb", "4g.20gb"], ["1g.5gb", "4g.20gb"], ["1g.10gb"] + ["1g.5gb"] * 6])
def test_das_regressions_fit_in_both_orders(batch: list[str]) -> None:
    for order in (batch, batch[::-1]):
        rc, out, _ = plan("--gpu", "NVIDIA A100-PCIE-40GB", *order)
        assert rc == 0
        got = json.loads(out)
        assert [g["profile"] for g in got] == order
        cells = [c for g in got for c in range(g["start"], g["start"] + g["size"])]
        assert len(cells) == len(set(cells))


def test_existing_slices_in_every_spelling() -> None:
    want = [{"profile": "1g.5gb", "start": 1, "size": 1}, {"profile": "2g.10gb", "start": 2, "size": 2}]
    for existing in (["--existing", "1g.5gb@0", "--existing", "3g.20gb@4"], ["--existing", "1g.5gb@0,3g.20gb@4"],
                     ["--existing", "1g.5gb@0", "3g.20gb@4"], ["nvidia.com/mig-1g.5gb@0", "MIG 3g.20gb@4"]):
        rc, out, err = plan("--gpu", "A100-40GB", *existing, "1g.5gb", "2g.10gb")
        assert (rc, err) == (0, ""), existing
        assert json.loads(out) == want


def test_does_not_fit_exits_1_with_a_reason() -> None:
    rc, out, err = plan("--gpu", "A100-40GB", "--existing", "1g.5gb@0", "--existing", "3g.20gb@4", "4g.20gb")
    assert rc == 1 and out == ""
    assert "does not fit" in err and "1g.5gb@0" in err and "2g.10gb x1" in err
    rc, _, err = plan("--gpu", "A30", "1g.6gb+me", "2g.12gb+me")
    assert rc == 1 and "A30-24GB" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpu", "X100", "1g.5gb"], "accepted models: A100-40GB"),
    (["--gpu", "A100", "1g.5gb"], "ambiguous"),
    (["--gpu", "A100-40GB", "1g.6gb"], "not offered by A100-40GB"),
    (["--gpu", "A100-40GB", "one-slice"], "not a MIG profile name"),
    (["--gpu", "A100-40GB", "--existing", "1g.5gb@7", "1g.5gb"], "valid starts"),
    (["--gpu", "A100-40GB", "--existing", "4g.20gb@0", "--existing", "2g.10gb@2", "1g.5gb"], "overlaps"),
    (["--gpu", "A100-40GB", "--existing", "1g.5gb", "1g.5gb"], "PROFILE@START"),
    (["--gpu", "A100-40GB", "--existing", "1g.5gb@x", "1g.5gb"], "START must be"),
    (["--gpu", "A100-40GB"], "at least one PROFILE"),
    (["1g.5gb"], "--gpu"),
    (["--gpu", "A100-40GB", "--bogus", "1g.5gb"], "unrecognized"),
])
def test_bad_input_exits_2_with_the_error(argv: list[str], message: str) -> None:
    rc, out, err = plan(*argv)
    assert rc == 2 and out == ""
    assert message in err


MODEL_WORD = re.compile(r"\b(?:[ABH]|GH)\d{2,3}(?:-\d+GB)?\b")
"""A GPU model or family as an error message names one (A100, GH200, H100-80GB, ...)."""


def named_models(text: str) -> list[str]:
    """The models `text` names outside quotes (the rejected input and examples are quoted)."""
    return MODEL_WORD.findall(re.sub(r"'[^']*'", "", text))


@pytest.mark.parametrize("gpu", ["X100", "GH200-144GB", "GH200 144GB", "B200-192GB", "A100"])
def test_the_models_a_rejection_lists_are_the_ones_accepted(gpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every model the error names is then accepted (it named GH200, whose 144 GB version it rejects, and a bare
    A100, which is ambiguous), and it names every accepted one; --help lists the same."""
    rc, _, err = plan("--gpu", gpu, "1g.5gb")
    assert rc == 2
    named = named_models(err)
    for model in named:
        assert mig.normalize_model(model), model
    assert set(mig.ACCEPTED_MODELS) <= set(named)
    assert migplan.main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert set(named_models(help_text)) == set(named)


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert migplan.main(["--help"]) == 0
    assert "--existing PROFILE@START" in capsys.readouterr().out


def test_gpuops_cli_dispatches_mig_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mig", "plan", "--gpu", "A30-24GB", "2g.12gb", "2g.12gb"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"profile": "2g.12gb", "start": 0, "size": 2},
                                                   {"profile": "2g.12gb", "start": 2, "size": 2}]
    assert cli.main(["mig", "plan", "--gpu", "A30-24GB", "4g.24gb", "1g.6gb"]) == 1
    assert cli.main(["mig", "plan", "--gpu", "nope", "1g.6gb"]) == 2
    assert cli.main(["mig", "plan", "--help"]) == 0
    assert "gpuops mig plan" in capsys.readouterr().out


def test_console_script_end_to_end() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpuops", "mig", "plan", "--gpu", "H100-80GB",
                           "--existing", "3g.40gb@4", "4g.40gb"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"profile": "4g.40gb", "start": 0, "size": 4}]
