"""The test code waits one way: tests/waiting.py's helpers, on a condition, with a deadline. No other module polls
by hand, and no test sleeps and hopes (tests/polling_scan.py defines both precisely).

A sleep in a test stays only where the passing time is itself under test, each named below with why; the test then
still waits for proof that the code looked before it asserts that nothing happened.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from polling_scan import Finding, bare_sleeps, polling_helpers

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "bench", "chaos")
POLLING_HOME = "tests/waiting.py"
HELPERS_CHECKED = ("tests",)
"""Where only tests/waiting.py may poll. bench/ and chaos/ are scripts with their own waiting helpers
(chaos/_common.py and their neighbours), run apart from pytest; their bare sleeps in test functions are checked."""

SLEEPS_UNDER_TEST: dict[tuple[str, str, str], str] = {
    ("tests/controllers/autoprovision/test_autoprovision_e2e.py",
     "test_a_refused_webhook_is_shown_and_the_fixed_spec_sends_the_same_transition", "asyncio.sleep(1.5)"):
        "the refused webhook's 10 s backoff must hold meanwhile: the passing time is under test",
    ("tests/controllers/autoprovision/test_autoprovision_e2e.py",
     "test_an_idle_node_with_a_do_not_evict_pod_stays_on_until_it_goes", "asyncio.sleep(2.5)"):
        "scaleDownUnneededSeconds (1 s) must run out before the machine may be kept on by its blocker alone",
    ("tests/controllers/migslicer/test_mig_webhook_limits.py",
     "test_slow_clients_and_large_reviews_do_not_starve_anyone", "asyncio.sleep(1.0)"):
        "lets the large reviews flow before the measurement window opens",
    ("tests/controllers/migslicer/test_mig_webhook_limits.py",
     "test_slow_clients_and_large_reviews_do_not_starve_anyone", "asyncio.sleep(0.01)"):
        "the probe of the event loop's lag: how late a 10 ms timer fires is what is measured",
    ("tests/controllers/migslicer/test_mig_webhook_limits.py",
     "test_slow_clients_and_large_reviews_do_not_starve_anyone", "asyncio.sleep(0.02)"):
        "paces the small reviews over the fixed six-second measurement window",
    ("tests/controllers/spotpool/test_spotpool_e2e.py", "test_credentials_secret_missing_then_fixed",
     "asyncio.sleep(1.0)"):
        "counts the cloud calls in one second (no hot loop): the rate over a window is under test",
    ("tests/kube/test_controller.py", "test_outcomes_metrics_and_backoff", "asyncio.sleep(30)"):
        "a reconcile that outlasts its 0.1 s timeout, which is under test",
    ("tests/kube/test_informer.py", "test_slow_handler_backpressures_the_reflector_without_loss",
     "asyncio.sleep(0.2)"):
        "a correct reflector is parked on the full buffer (already awaited), which shows nothing more to wait for;"
        " a buggy one gets this time to run ahead",
    ("tests/kube/test_informer.py", "test_current_through_follows_the_watch_and_holds_while_it_is_down",
     "asyncio.sleep(0.5)"):
        "the hold is a timestamp that must not move while time passes",
    ("tests/kube/test_manager.py", "test_metrics_healthz_and_readyz", "time.sleep(0.3)"):
        "blocks the event loop, which the health check must notice",
    ("tests/kube/test_manager.py", "test_cancel_drains_in_flight_reconciles_within_the_bound",
     "asyncio.sleep(0.3 if req.name == 'slow' else 3600)"):
        "a reconcile's work in progress, which stopping must drain or cut",
    ("tests/kube/test_reflector_faults.py", "test_a_quiet_watch_cut_after_a_second_is_reopened_at_once",
     "asyncio.sleep(1.2)"):
        "the watch must outlive the 1 s very-short-watch threshold",
    ("tests/sim/cluster/test_kubelet.py", "test_pod_without_runtime_runs_until_deleted", "asyncio.sleep(0.6)"):
        "a pod without a runtime must not end by itself as time passes",
    ("tests/sim/cluster/test_kubelet.py",
     "test_power_off_stops_the_kubelet_and_a_reboot_restarts_or_fails_its_pods", "asyncio.sleep(0.4)"):
        "several lease periods pass without a renewal from the powered-off kubelet",
    ("tests/sim/cluster/test_nodelifecycle.py", "test_when_every_node_is_down_nothing_is_evicted",
     "asyncio.sleep(1.5)"):
        "the pods' 1 s unreachable toleration must run out",
    ("tests/sim/test_api_semantics.py", "test_too_large_rv_waits_then_504", "asyncio.sleep(0.1)"):
        "the write arrives while the read waits for its resourceVersion: the delay is under test",
}


def sources(*tops: str) -> list[tuple[str, str]]:
    return [(path.relative_to(ROOT).as_posix(), path.read_text())
            for top in tops for path in sorted((ROOT / top).rglob("*.py"))]


def shown(path: str, findings: list[Finding]) -> list[str]:
    return [f"{path}:{f.line} {f.function}: {f.sleep}" for f in findings]


def test_only_the_waiting_module_polls() -> None:
    found = [line for path, text in sources(*HELPERS_CHECKED) if path != POLLING_HOME
             for line in shown(path, polling_helpers(text))]
    assert not found, "hand-rolled polling; use tests/waiting.py (until, until_holds, wait_until):\n" + "\n".join(found)


def test_no_test_sleeps_and_hopes() -> None:
    found, used = [], set()
    for path, text in sources(*SCANNED):
        for f in bare_sleeps(text):
            key = (path, f.function, f.sleep)
            if key in SLEEPS_UNDER_TEST:
                used.add(key)
            else:
                found += shown(path, [f])
    assert not found, ("a test sleeps, then asserts: wait on a condition (tests/waiting.py), or for proof that the "
                       "code looked (two_passes, looked), or name the sleep in SLEEPS_UNDER_TEST with why:\n"
                       + "\n".join(found))
    assert not set(SLEEPS_UNDER_TEST) - used, f"stale entries: {sorted(set(SLEEPS_UNDER_TEST) - used)}"


POLLING = [
    ("while not ready():\n    time.sleep(0.1)", "loops on a condition"),
    ("while True:\n    if ready():\n        return\n    await asyncio.sleep(0.1)", "returns when it holds"),
    ("for _ in range(50):\n    if ready():\n        break\n    await asyncio.sleep(0.1)", "breaks when it holds"),
    ("deadline = time.monotonic() + 5\nwhile time.monotonic() < deadline:\n    if ready():\n        return\n"
     "    await nap(0.1)", "a deadline, and `from asyncio import sleep as nap`"),
]
NOT_POLLING = [
    ("while True:\n    work()\n    await asyncio.sleep(0.1)", "a background loop that never ends by a condition"),
    ("for _ in range(5):\n    work()\n    await asyncio.sleep(0.1)", "paces work"),
    ("end = time.monotonic() + 5\nwhile time.monotonic() < end:\n    work()\n    await asyncio.sleep(0.1)",
     "runs for a fixed time"),
    ("while not ready():\n    await asyncio.sleep(0)", "yields to the loop without waiting for time"),
    ("while not ready():\n    for _ in range(3):\n        break\n    work()", "no sleep"),
]
HEADER = "import asyncio\nimport time\nfrom asyncio import sleep as nap\n\n\nasync def helper():\n"


@pytest.mark.parametrize(("body", "why"), POLLING)
def test_a_polling_loop_is_found(body: str, why: str) -> None:
    assert [f.function for f in polling_helpers(HEADER + textwrap.indent(body, "    "))] == ["helper"], why


@pytest.mark.parametrize(("body", "why"), NOT_POLLING)
def test_a_loop_that_does_not_poll_is_left_alone(body: str, why: str) -> None:
    assert polling_helpers(HEADER + textwrap.indent(body, "    ")) == [], why


def test_bare_sleeps_are_found_in_tests_only() -> None:
    module = textwrap.dedent("""
        import asyncio
        import time


        async def test_hopes():
            start()
            await asyncio.sleep(0.5)
            assert nothing_happened()


        async def test_yields():
            await asyncio.sleep(0)


        async def test_hides_it_in_a_closure():
            async def later():
                time.sleep(1)


        async def helper():
            await asyncio.sleep(1)


        class TestSome:
            def test_method(self):
                time.sleep(1)
    """)
    assert [(f.function, f.sleep) for f in bare_sleeps(module)] == [
        ("test_hopes", "asyncio.sleep(0.5)"), ("test_hides_it_in_a_closure", "time.sleep(1)"),
        ("TestSome.test_method", "time.sleep(1)")]
