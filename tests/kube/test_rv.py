"""resourceVersion ordering per KEP-5504: positive integers without leading zeros, length first, then lexical."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.kube.rv import NotComparable, comparable, compare, is_newer_or_equal

# Beyond 2**64 too: the comparison must not depend on a fixed-width parse.
rvs = st.integers(min_value=1, max_value=10**40).map(str)


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


@given(rvs, rvs)
def test_matches_integer_comparison(a: str, b: str) -> None:
    assert compare(a, b) == sign(int(a) - int(b))
    assert is_newer_or_equal(a, b) == (int(a) >= int(b))


@given(rvs, rvs)
def test_antisymmetric(a: str, b: str) -> None:
    assert compare(a, b) == -compare(b, a)
    assert (compare(a, b) == 0) == (a == b)


@given(rvs, rvs, rvs)
def test_transitive(a: str, b: str, c: str) -> None:
    if compare(a, b) <= 0 and compare(b, c) <= 0:
        assert compare(a, c) <= 0
    if compare(a, b) >= 0 and compare(b, c) >= 0:
        assert compare(a, c) >= 0


@given(rvs)
def test_reflexive(a: str) -> None:
    assert compare(a, a) == 0 and is_newer_or_equal(a, a)


@pytest.mark.parametrize(
    "bad", ["", "0", "01", "007", "-1", "+1", "1.0", "1e3", " 1", "1 ", "abc", "12a", "\u0661\u0662"]
)
def test_malformed_versions_are_not_comparable(bad: str) -> None:
    assert not comparable(bad)
    with pytest.raises(NotComparable):
        compare(bad, "1")
    with pytest.raises(NotComparable):
        compare("1", bad)
    with pytest.raises(NotComparable):
        is_newer_or_equal(bad, "5")


def test_length_decides_before_digits() -> None:
    assert compare("10", "9") == 1
    assert compare("99", "100") == -1
    assert compare("123", "124") == -1
    assert issubclass(NotComparable, ValueError)
