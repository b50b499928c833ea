"""When the ConflictDetected condition is (re)written: only on a change, never for an object without a conflict."""

from __future__ import annotations

from gpuops.controllers.coexistence import NO_CONFLICT, conflict_condition

FOUND = ("KarpenterManagedNode", "node n is in NodePool gpu")


def test_a_new_conflict_is_written_once() -> None:
    assert conflict_condition(None, FOUND, "clear") == ("True", *FOUND)
    assert conflict_condition(("True", *FOUND), FOUND, "clear") is None


def test_a_changed_conflict_is_rewritten() -> None:
    assert conflict_condition(("True", "NodeProtected", "old"), FOUND, "clear") == ("True", *FOUND)


def test_clearing_happens_only_after_a_conflict() -> None:
    assert conflict_condition(None, None, "clear") is None
    assert conflict_condition(("True", *FOUND), None, "clear") == ("False", NO_CONFLICT, "clear")
    assert conflict_condition(("False", NO_CONFLICT, "clear"), None, "clear") is None
