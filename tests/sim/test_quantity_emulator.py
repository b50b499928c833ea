"""The emulator's Quantity canonical form against the operator's own, written separately from the same
documentation: for every quantity of ordinary size, the two must print the same text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.quantity import canonicalize_quantity
from gpuops_sim.apiserver import quantity

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3", "e-3", "E6",
            "e0", "e-9", "e12"]


@st.composite
def quantities(draw: st.DrawFn) -> str:
    sign = draw(st.sampled_from(["", "-", "+"]))
    whole = draw(st.integers(0, 10**6))
    fraction = draw(st.one_of(st.just(""), st.text("0123456789", min_size=0, max_size=6).map(lambda d: "." + d)))
    return f"{sign}{whole}{fraction}{draw(st.sampled_from(SUFFIXES))}"


@settings(max_examples=1000, deadline=None)
@given(text=quantities())
def test_the_emulator_and_the_operator_agree_on_the_canonical_form(text: str) -> None:
    assert quantity.canonical(text) == canonicalize_quantity(text)


def test_documented_cases() -> None:
    cases = {"1024Mi": "1Gi", "0.5": "500m", "1.5Gi": "1536Mi", "2000": "2k", "1500": "1500", "12e6": "12e6",
             "1.0000000001": "1000000001n", "5e-10": "1e-9", "2.5Ki": "2560", "1024Ei": "9223372036854775807",
             "1e1000": "10e999", "0": "0", "-1.5": "-1500m"}
    assert {k: quantity.canonical(k) for k in cases} == cases


def test_text_that_is_no_quantity_is_refused() -> None:
    for text in ("", " 1", "1 ", "1.5.5", "m", "e3", "1e", "Ki"):
        try:
            quantity.canonical(text)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} was accepted")
