"""Finds hand-rolled waiting in test code by reading its syntax tree: polling loops, and sleeps in test functions.

Definitions (tests/test_test_hygiene.py applies them):
- A *sleep* is a call of asyncio.sleep, time.sleep, anyio.sleep or trio.sleep, however imported, unless its
  duration is the literal 0: a zero sleep yields to the event loop once and waits for no time.
- A *polling loop* is a `while`, `for` or `async for` loop, directly in a function's own body (nested functions,
  lambdas and classes are theirs, not its), that sleeps and can end on a condition: its `while` test is neither a
  constant nor a bare comparison of a clock reading, or it holds a `break` or `return` of its own. A loop that only
  paces work (`while True`, `for _ in range(n)` without an exit, `while time.monotonic() < end`) is not one.
  A polling loop needs no deadline to count: one without a deadline is worse, not better.
- A *polling helper* is a function holding a polling loop. Only tests/waiting.py may define one.
- A *test function* is a `test*` function at module level or in a `Test*` class. A sleep in one, nested
  functions and lambdas included, that is not part of a polling loop is a *bare sleep*: sleep-and-hope unless it
  is itself the thing under test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

SLEEP_MODULES = frozenset({"asyncio", "time", "anyio", "trio"})
CLOCKS = frozenset({"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "current_time"})
Scope = ast.FunctionDef | ast.AsyncFunctionDef
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
LOOPS = (ast.While, ast.For, ast.AsyncFor)


@dataclass(frozen=True, slots=True)
class Finding:
    """One place that waits by hand: the enclosing function's dotted name, its line, and the sleep's source."""

    function: str
    line: int
    sleep: str


def sleep_names(tree: ast.Module) -> tuple[frozenset[str], frozenset[str]]:
    """The names under which this module reaches a sleep: module aliases (`import time as t`) and bare
    functions (`from asyncio import sleep as nap`)."""
    modules: set[str] = set()
    functions: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name in SLEEP_MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module in SLEEP_MODULES:
            functions.update(a.asname or a.name for a in node.names if a.name == "sleep")
    return frozenset(modules), frozenset(functions)


class Sleeps:
    """Recognises the sleeps of one module."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules, self.functions = sleep_names(tree)

    def is_sleep(self, node: ast.AST) -> TypeGuard[ast.Call]:
        """A nonzero sleep call (see the module's definition)."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        named = (isinstance(func, ast.Name) and func.id in self.functions) or (
            isinstance(func, ast.Attribute) and func.attr == "sleep"
            and isinstance(func.value, ast.Name) and func.value.id in self.modules)
        zero = bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0
        return named and not zero


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node` that belongs to its scope: not inside a nested function, lambda or class."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, NESTED):
            yield from own_nodes(child)


def loop_exits(loop: ast.While | ast.For | ast.AsyncFor) -> bool:
    """Whether a `return`, or a `break` of this loop (not of an inner one), lies in its body."""
    def exits(node: ast.AST, inner: bool) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Return) or (isinstance(child, ast.Break) and not inner):
                return True
            if not isinstance(child, NESTED) and exits(child, inner or isinstance(child, LOOPS)):
                return True
        return False

    return any(exits(ast.Module(body=[stmt], type_ignores=[]), False) for stmt in loop.body)


def is_clock_reading(node: ast.AST) -> bool:
    """A call such as time.monotonic() or loop.time(): no argument, named like a clock."""
    return (isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLOCKS)


def waits_on_condition(loop: ast.While | ast.For | ast.AsyncFor) -> bool:
    """Whether the loop can end because something became true (see the module's definition)."""
    if isinstance(loop, ast.While):
        test = loop.test
        pure_clock = isinstance(test, ast.Compare) and any(is_clock_reading(n) for n in ast.walk(test)) and not any(
            isinstance(n, ast.Call) and not is_clock_reading(n) for n in ast.walk(test))
        if not isinstance(test, ast.Constant) and not pure_clock:
            return True
    return loop_exits(loop)


def polling_loops(function: Scope, sleeps: Sleeps) -> list[tuple[ast.AST, ast.Call]]:
    """The polling loops in a function's own body, each with the first sleep it makes."""
    found: list[tuple[ast.AST, ast.Call]] = []
    for node in own_nodes(function):
        if isinstance(node, LOOPS) and waits_on_condition(node):
            calls = [n for n in own_nodes(node) if sleeps.is_sleep(n)]
            if calls:
                found.append((node, calls[0]))
    return found


def functions(tree: ast.Module) -> Iterator[tuple[str, Scope, bool]]:
    """Every function with its dotted name and whether it is a test function."""
    def visit(node: ast.AST, prefix: str, in_test_class: bool) -> Iterator[tuple[str, Scope, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.", child.name.startswith("Test") and not prefix)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                is_test = child.name.startswith("test") and (not prefix or in_test_class)
                yield f"{prefix}{child.name}", child, is_test
                yield from visit(child, f"{prefix}{child.name}.", False)
            else:
                yield from visit(child, prefix, in_test_class)

    yield from visit(tree, "", False)


def polling_helpers(source: str) -> list[Finding]:
    """Every function in the module that holds a polling loop."""
    tree = ast.parse(source)
    sleeps = Sleeps(tree)
    return [Finding(name, fn.lineno, ast.unparse(call))
            for name, fn, _ in functions(tree) for _, call in polling_loops(fn, sleeps)]


def bare_sleeps(source: str) -> list[Finding]:
    """Every sleep lexically inside a test function (nested functions and lambdas included) that is not part of a
    polling loop."""
    tree = ast.parse(source)
    sleeps = Sleeps(tree)
    found = []
    for name, fn, is_test in functions(tree):
        if not is_test:
            continue
        scopes = [fn, *(n for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
        polled = {id(n) for scope in scopes for loop, _ in polling_loops(scope, sleeps) for n in ast.walk(loop)}
        found += [Finding(name, n.lineno, ast.unparse(n)) for n in ast.walk(fn)
                  if sleeps.is_sleep(n) and id(n) not in polled]
    return found
