"""`make test` runs the suite on two pytest-xdist workers with `--dist loadgroup`, grouped by tests/conftest.py.
Two things about that run are only visible from outside it, so a small project run the same way checks them:

- the groups take effect: a file's tests run in one worker, and the host-process tests all in one worker. A
  plugin order or a pytest release can make pytest-xdist ignore the marks without a word (it did: the marks were
  added after pytest-xdist had read them, and pytest 9.2 drops the group suffix pytest-xdist writes);
- a worker that crashes (a segfault in a C extension) fails the test it was running and the run goes on to its
  end. Without the groups, a crash left `--dist loadgroup` waiting for the dead worker until CI gave up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import importlib.util
import sys

sys.path.insert(0, {str(TESTS)!r})
_spec = importlib.util.spec_from_file_location("gpuops_suite_conftest", {str(TESTS / "conftest.py")!r})
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
pytest_collection_modifyitems = _suite.pytest_collection_modifyitems
"""
"""The mini project groups its tests with the suite's own hook, so a change to that hook is what is checked."""

RECORDING_TESTS = """
import os
import signal
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[{depth}] / "ran.txt"


@pytest.mark.parametrize("i", range(12))
def test_step(i: int) -> None:
    with RECORD.open("a") as f:
        f.write(f"{{__name__}} {{i}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
    crash_once = Path(__file__).with_suffix(".crash")
    if i == 5 and crash_once.exists():
        crash_once.unlink()
        os.kill(os.getpid(), signal.SIGSEGV)
"""

FILES = {
    "tests/test_alpha.py": 1, "tests/test_beta.py": 1, "tests/test_gamma.py": 1,
    "tests/e2e/test_one.py": 2, "tests/e2e/test_two.py": 2,
}


def _xdist_options() -> list[str]:
    """The pytest-xdist options `make test` passes (the Makefile's XDIST), so what is checked is what CI runs."""
    found = re.search(r"^XDIST\s*:=\s*(.+)$", (TESTS.parent / "Makefile").read_text(), re.MULTILINE)
    assert found, "the Makefile defines no XDIST options"
    return found.group(1).split()


def _run(root: Path, *, crash: bool) -> subprocess.CompletedProcess[str]:
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST)
    for name, depth in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(RECORDING_TESTS.format(depth=depth)))
    if crash:
        (root / "tests/test_beta.crash").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_xdist_options(),
         "--rootdir", str(root), "-c", str(root / "pytest.ini"), str(root / "tests")],
        cwd=root, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def _records(root: Path) -> list[tuple[str, int, str]]:
    """(module, step, worker) of every test step that ran."""
    lines = (root / "ran.txt").read_text().splitlines()
    return [(module, int(step), worker) for module, step, worker in (line.split() for line in lines)]


def _workers_by_module(root: Path) -> dict[str, set[str]]:
    workers: dict[str, set[str]] = defaultdict(set)
    for module, _, worker in _records(root):
        workers[module].add(worker)
    return workers


def test_each_file_runs_in_one_worker_and_the_host_process_files_in_the_same_one(tmp_path: Path) -> None:
    run = _run(tmp_path, crash=False)
    assert run.returncode == 0, run.stdout + run.stderr
    ran: dict[str, set[int]] = defaultdict(set)
    for module, step, _ in _records(tmp_path):
        ran[module].add(step)
    assert len(ran) == len(FILES) and all(steps == set(range(12)) for steps in ran.values()), dict(ran)
    workers = _workers_by_module(tmp_path)
    split = {module: sorted(w) for module, w in workers.items() if len(w) > 1}
    assert not split, f"groups split across workers: {split}"
    assert workers["test_one"] == workers["test_two"], (
        f"the host-process files ran on {sorted(workers['test_one'])} and {sorted(workers['test_two'])}")


def test_a_crashed_worker_fails_its_test_and_the_run_ends(tmp_path: Path) -> None:
    run = _run(tmp_path, crash=True)  # a run left waiting raises TimeoutExpired here
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "crashed while running 'tests/test_beta.py::test_step[5]" in out, out
    # Replacing the crashed worker is what can leave the run waiting; a replacement would run the crashed test
    # again (its group goes back to the queue), so it must have run once only.
    assert sum(1 for r in _records(tmp_path) if r[:2] == ("test_beta", 5)) == 1, out
