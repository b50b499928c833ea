"""The import layering ARCHITECTURE.md describes, checked on the source (every import, lazy ones included):

    gpuops.accounting   pure numbers: imports only itself, msgspec and side-effect-free standard modules
    gpuops.kube         the framework: imports only itself (it knows Kubernetes, not GPUs or our controllers)
    gpuops.controllers  each controller package imports kube, accounting, the shared controller modules and
                        itself, never another controller; the shared modules import no controller package;
                        only the lists (registry.py, crds.py) name every controller
    gpuops (cli, ...)   the command line may import all of the above
    gpuops_sim          the emulator, on top: may import gpuops; nothing in gpuops imports it
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "gpuops"
CONTROLLER_PACKAGES = sorted(p.name for p in (PRODUCT / "controllers").iterdir()
                             if p.is_dir() and (p / "__init__.py").exists())
LISTS = {"gpuops.controllers.registry", "gpuops.controllers.crds"}
TOP_LEVEL_SHARED = {"gpuops", "gpuops.logs"}  # the package's version and metric defaults; structured logging
ACCOUNTING_STDLIB = {"__future__", "collections", "dataclasses", "datetime", "decimal", "enum", "fractions",
                     "functools", "heapq", "bisect", "itertools", "math", "operator", "re", "types", "typing"}
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
"""Calls that read a clock (datetime's among them): accounting takes `now` as an argument."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[str, int]]:
    """Absolute names of the modules `path` imports, with their line numbers."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
                if node.module is None:  # from . import a, b: each name may be a module
                    yield from ((f"{target}.{alias.name}", node.lineno) for alias in node.names)
                    continue
                yield target, node.lineno
            elif node.module:
                yield node.module, node.lineno


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(folder: Path, allowed: Callable[[str, str], bool], root: Path = ROOT) -> list[str]:
    out = []
    for path in _sources(folder):
        for name, line in imports(path, root):
            if not allowed(_module_name(path, root), name):
                out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return out


def _ours(name: str) -> bool:
    return _within(name, "gpuops") or _within(name, "gpuops_sim")


def _controller_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "controllers" and parts[2] in CONTROLLER_PACKAGES else None


def accounting_may_import(module: str, name: str) -> bool:
    if _ours(name):
        return _within(name, "gpuops.accounting")
    return name.split(".")[0] in ACCOUNTING_STDLIB | {"msgspec"}


def kube_may_import(module: str, name: str) -> bool:
    return not _ours(name) or _within(name, "gpuops.kube")


def controllers_may_import(module: str, name: str) -> bool:
    if _within(name, "gpuops_sim"):
        return False
    if not _ours(name) or module in LISTS:
        return True
    if _within(name, "gpuops.kube") or _within(name, "gpuops.accounting") or name in TOP_LEVEL_SHARED:
        return True
    theirs = _controller_of(name)
    if theirs is not None:
        return _controller_of(module) == theirs  # a shared module (no controller of its own) imports none
    return _within(name, "gpuops.controllers") and name not in LISTS


RULES = {"accounting": accounting_may_import, "kube": kube_may_import, "controllers": controllers_may_import}


@pytest.mark.parametrize("layer", sorted(RULES))
def test_each_layer_imports_only_what_it_may(layer: str) -> None:
    assert _violations(PRODUCT / layer, RULES[layer]) == []


def test_the_product_never_imports_the_emulator() -> None:
    assert _violations(PRODUCT, lambda m, name: not _within(name, "gpuops_sim")) == []


def clock_reads(folder: Path) -> list[str]:
    return [f"{path.name}:{node.lineno}" for path in _sources(folder)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_READS]


def test_accounting_reads_no_clock(tmp_path: Path) -> None:
    """datetime is allowed for calendar arithmetic; its clock is not."""
    assert clock_reads(PRODUCT / "accounting") == []
    (tmp_path / "probe.py").write_text("import datetime\nx = datetime.datetime.now()\ny = datetime.date.today()\n")
    assert len(clock_reads(tmp_path)) == 2


@pytest.mark.parametrize(("folder", "text"), [
    ("accounting", "import time\nfrom gpuops.kube import client\n"),
    ("kube", "from gpuops.accounting import mig\nfrom ..controllers import budget\n"),
    ("controllers/budget", "from gpuops.controllers.spotpool import api\nfrom ..migslicer import settings\n"),
    ("controllers", "from .budget import api\nfrom gpuops_sim import fakenvml\n"),
])
def test_the_rules_see_a_module_that_breaks_them(folder: str, text: str, tmp_path: Path) -> None:
    """Each rule fails on a module breaking it twice (the scan must not pass by seeing nothing)."""
    path = tmp_path / "gpuops" / folder / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    layer = folder.split("/")[0]
    assert len(_violations(tmp_path / "gpuops" / layer, RULES[layer], root=tmp_path)) == 2


@pytest.mark.parametrize("module", ["gpuops.accounting", "gpuops.kube"])
def test_importing_a_lower_layer_loads_no_higher_one(module: str) -> None:
    """At run time too: importing the layer pulls in no controller, no CLI and no emulator module."""
    import subprocess

    code = (f"import sys, {module}; bad = [m for m in sys.modules if m.startswith(('gpuops.controllers', "
            f"'gpuops.cli', 'gpuops_sim'))]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
