"""Shared fixtures: the emulated API server running in a background thread, reachable over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import structlog
from running_server import RunningServer

from gpuops_sim.apiserver import answered_warnings

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    """structlog's default console renderer formats a logged exception with `rich` when that is installed (the
    mutation tester brings it), printing every frame's locals: seconds per retried reconcile error. Tests log
    tracebacks as the operator does, plain; the rest of structlog's default chain stays."""
    processors = list(structlog.get_config()["processors"])
    if processors and isinstance(processors[-1], structlog.dev.ConsoleRenderer):
        processors[-1] = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
        structlog.configure(processors=processors)


HOST_PROCESS_TESTS = ("tests/e2e/", "tests/sim/test_demo_report.py", "tests/sim/cluster/test_process_pods.py")
"""Tests that run the operator, or the emulator's process pods, as real processes of this machine."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs two pytest-xdist workers (--dist loadgroup). Each file's tests stay in one worker, in
    order, as they would run alone; the tests in HOST_PROCESS_TESTS all run in one worker, one after another, so
    they never contend with each other for host ports (a process pod listens where its manifest says) or for the
    CPU their timing assumes. Without xdist the marks change nothing.

    First among the hooks: pytest-xdist's worker reads the marks in its own implementation of this hook, so marks
    added after it would group nothing (tests/test_parallel_runs.py checks that they take effect)."""
    for item in items:
        path = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("host-processes" if path.startswith(HOST_PROCESS_TESTS) else path))


@pytest.fixture(autouse=True)
def _apiserver_warnings_are_failures(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A warning from the API server means part of a write was not taken as sent (a field pruned, a duplicate
    field, a deprecated API): every test fails on one it did not name with `@pytest.mark.apiserver_warnings`.
    Emulators in this process and in subprocesses (which inherit the variable) append to the same log."""
    log = tmp_path_factory.mktemp("apiserver-warnings") / "answered.jsonl"
    monkeypatch.setenv(answered_warnings.LOG_ENV, str(log))
    yield
    expected = [str(text) for m in request.node.iter_markers("apiserver_warnings") for text in m.args]
    unexpected = [w for w in answered_warnings.read_log(str(log)) if not any(text in w.text for text in expected)]
    if unexpected:
        listed = "\n  ".join(dict.fromkeys(str(w) for w in unexpected))
        pytest.fail(f"the API server answered {len(unexpected)} unexpected warning(s):\n  {listed}", pytrace=False)


def _options(request: pytest.FixtureRequest) -> dict[str, object]:
    """Server options a test asks for with `@pytest.mark.apiserver_options(...)` (e.g. root_ca_publisher=False
    for a test that counts the ConfigMaps of a namespace)."""
    out: dict[str, object] = {}
    for mark in request.node.iter_markers("apiserver_options"):
        out.update(mark.kwargs)
    return out


@pytest.fixture
def apiserver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "kubeconfig", bookmark_interval=1.0, **_options(request))
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


@pytest.fixture
def rbac_apiserver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "kubeconfig", authorization="RBAC", bookmark_interval=1.0, **_options(request))
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


@pytest.fixture
def tls_rbac_apiserver(tmp_path: Path) -> Iterator[RunningServer]:
    """RBAC enforced over HTTPS (kubectl sends bearer tokens only over TLS); the kubeconfig is admin.kubeconfig."""
    rs = RunningServer(tmp_path / "admin.kubeconfig", authorization="RBAC", tls=True)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()
