"""The repository builds two distributions: `gpuops` (the operator, what the image installs) and `gpuops-sim`
(the emulated cluster, in sim/), which depends on gpuops and never the reverse.

Checked here on what pip builds and on the source: the operator's wheel holds no emulator code; the emulator's
wheel holds its data files and contributes its commands and NVML backend through entry points; and each
distribution declares exactly the third-party distributions its code imports (a missing one breaks a clean
install, an extra one is weight nobody asked for)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"gpuops": ROOT / "gpuops", "gpuops-sim": ROOT / "sim" / "gpuops_sim"}
PYPROJECTS = {"gpuops": ROOT / "pyproject.toml", "gpuops-sim": ROOT / "sim" / "pyproject.toml"}
OWN_PACKAGES = {"gpuops": "gpuops", "gpuops_sim": "gpuops-sim"}
DATA_FOR_STDLIB = {"tzdata": "zoneinfo"}
"""Data-only distributions a standard module reads (zoneinfo falls back to tzdata where the system has no
time zone database): declared, they count as used where the code imports that module."""


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirement_name(requirement: str) -> str:
    cut = min((i for i, ch in enumerate(requirement) if ch in "[<>=!~;@ "), default=len(requirement))
    return _canonical(requirement[:cut])


def declared(dist: str, *, extras: bool = True) -> set[str]:
    """The distributions `dist` declares: its dependencies and, unless extras=False, every extra but `test`."""
    project = tomllib.loads(PYPROJECTS[dist].read_text())["project"]
    names = {_requirement_name(r) for r in project.get("dependencies", [])}
    if extras:
        for extra, requirements in project.get("optional-dependencies", {}).items():
            if extra != "test":
                names |= {_requirement_name(r) for r in requirements}
    return names - {dist}


def _imported_modules(folder: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                yield from ((alias.name.split(".")[0], path) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield node.module.split(".")[0], path
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)  # importlib.import_module("x")
                  and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                yield node.args[0].value.split(".")[0], path


def imported(dist: str) -> dict[str, list[str]]:
    """The distributions whose modules `dist`'s code imports (lazily or not), each with the files that do."""
    providers = packages_distributions()
    out: dict[str, list[str]] = {}
    for module, path in _imported_modules(SOURCES[dist]):
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        owners = [OWN_PACKAGES[module]] if module in OWN_PACKAGES else providers.get(module)
        assert owners, f"{path.relative_to(ROOT)} imports {module!r}, which no installed distribution provides"
        names = {_canonical(o) for o in owners}
        # a namespace shared by several distributions (tencentcloud, google) counts for the one declared
        chosen = sorted(names & declared(dist)) or sorted(names)
        out.setdefault(chosen[0], []).append(str(path.relative_to(ROOT)))
    out.pop(dist, None)
    return out


@pytest.mark.parametrize("dist", sorted(SOURCES))
def test_declared_dependencies_are_exactly_the_imported_ones(dist: str) -> None:
    uses = imported(dist)
    undeclared = {d: sorted(set(files))[:3] for d, files in uses.items() if d not in declared(dist)}
    stdlib = {module for module, _ in _imported_modules(SOURCES[dist])}
    unused = declared(dist) - set(uses) - {data for data, module in DATA_FOR_STDLIB.items() if module in stdlib}
    assert not undeclared, f"{dist} imports distributions it does not declare: {undeclared}"
    assert not unused, f"{dist} declares distributions its code never imports: {sorted(unused)}"


def test_the_operator_never_depends_on_the_emulator() -> None:
    assert "gpuops-sim" not in imported("gpuops")
    assert "gpuops-sim" not in declared("gpuops")
    assert "gpuops" in declared("gpuops-sim", extras=False)


def test_tests_benches_and_chaos_import_only_what_some_distribution_declares() -> None:
    """What `make test` installs is the two distributions and gpuops's `test` extra; anything else a test
    imports would pass here and fail on a fresh machine."""
    project = tomllib.loads(PYPROJECTS["gpuops"].read_text())["project"]
    available = declared("gpuops") | declared("gpuops-sim") | {"gpuops", "gpuops-sim"}
    available |= {_requirement_name(r) for r in project["optional-dependencies"]["test"]}
    providers = packages_distributions()
    local = {p.stem for folder in ("tests", "bench", "chaos") for p in (ROOT / folder).rglob("*.py")}
    local |= {p.name for folder in ("tests", "bench", "chaos") for p in (ROOT / folder).rglob("*") if p.is_dir()}
    missing: dict[str, str] = {}
    for folder in ("tests", "bench", "chaos", ".ci"):
        for module, path in _imported_modules(ROOT / folder):
            if module in sys.stdlib_module_names or module in local or module in ("__future__", *OWN_PACKAGES):
                continue
            owners = {_canonical(o) for o in providers.get(module, [])}
            if not owners & available:
                missing.setdefault(module, str(path.relative_to(ROOT)))
    # moto[server] brings werkzeug/flask, boto3 brings botocore: declared as extras of declared ones is not
    # enough for a direct import, so each module imported directly must be a declared distribution.
    assert not missing, f"imported but not declared in any distribution or the test extra: {missing}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "-w", str(out), str(ROOT), str(ROOT / "sim")], check=True, timeout=300)
    built = {w.name.split("-")[0]: zipfile.ZipFile(w) for w in out.glob("*.whl")}
    assert set(built) == {"gpuops", "gpuops_sim"}, sorted(built)
    return built


def test_the_operator_wheel_holds_no_emulator_code(wheels: dict[str, zipfile.ZipFile]) -> None:
    names = wheels["gpuops"].namelist()
    assert not [n for n in names if "gpuops_sim" in n or "fakenvml" in n or "/sim/" in n]
    packaged = {n for n in names if n.endswith(".py")}
    sources = {str(p.relative_to(ROOT)) for p in SOURCES["gpuops"].rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= packaged, f"missing from the wheel: {sorted(sources - packaged)[:5]}"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in wheels["gpuops"].read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires and not [r for r in requires if "gpuops-sim" in r.lower() or "gpuops_sim" in r.lower()]


def test_the_emulator_wheel_holds_its_data_and_entry_points(wheels: dict[str, zipfile.ZipFile]) -> None:
    names = set(wheels["gpuops_sim"].namelist())
    for required in ("gpuops_sim/scenarios/demo.yaml", "gpuops_sim/scenarios/idle.yaml",
                     "gpuops_sim/cluster/podnet/sitecustomize.py", "gpuops_sim/fakenvml.py"):
        assert required in names
    assert any(n.startswith("gpuops_sim/apiserver/protobuf/") and n.endswith(".json") for n in names)
    assert not [n for n in names if n.startswith("gpuops/")]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheels["gpuops_sim"].read(entry_points).decode()
    assert "[gpuops.commands]" in text and "sim = gpuops_sim.cli:register_sim" in text
    assert "demo = gpuops_sim.cli:register_demo" in text
    assert "[gpuops.nvml_backends]" in text and "emulated = gpuops_sim.fakenvml:FakeNVML.from_options" in text
