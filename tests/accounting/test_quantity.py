"""Kubernetes quantities: upstream parse/print vectors, our documented deviations, and round-trip properties.

The fixed vectors are the expected values of apimachinery's own quantity tests (pkg/api/resource/quantity_test.go:
TestQuantityParse, TestQuantityString, TestQuantityParseEmit, TestParseQuantity), restated as exact numbers.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.accounting.errors import AccountingError, NegativeValueError, QuantityError
from gpuops.accounting.quantity import (
    MAX_BINARY_SI,
    NANO,
    NegativeQuantityError,
    Quantity,
    QuantityFormat,
    canonicalize_quantity,
    format_quantity,
    parse_quantity,
    parse_quantity_with_format,
    round_up_to_nano,
)

B, D, X = QuantityFormat.BINARY_SI, QuantityFormat.DECIMAL_SI, QuantityFormat.DECIMAL_EXPONENT
F = Fraction

# (input, exact value, remembered format): upstream TestQuantityParse
PARSE_VECTORS = [
    ("0", F(0), D),
    ("0n", F(0), D),
    ("0Ki", F(0), B),
    ("1", F(1), D),
    ("1Ki", F(1024), B),
    ("8Ki", F(8 * 1024), B),
    ("7Mi", F(7 * 2**20), B),
    ("6Gi", F(6 * 2**30), B),
    ("5Ti", F(5 * 2**40), B),
    ("4Pi", F(4 * 2**50), B),
    ("3Ei", F(3 * 2**60), B),
    ("100Ti", F(100 * 2**40), B),
    ("5n", F(5, 10**9), D),
    ("4u", F(4, 10**6), D),
    ("3m", F(3, 1000), D),
    ("50k", F(50_000), D),
    ("300T", F(300 * 10**12), D),
    ("2P", F(2 * 10**15), D),
    ("1E", F(10**18), D),
    ("1E-3", F(1, 1000), X),
    ("1e3", F(1000), X),
    ("1E18", F(10**18), X),
    ("1e14", F(10**14), X),
    ("100.035k", F(100035), D),
    ("0.0005k", F(1, 2), D),
    ("0.00500", F(5, 1000), D),
    ("0.5e-2", F(5, 1000), X),
    ("10.035M", F(10035000), D),
    ("1.3E+6", F(1300000), X),
    ("1.53E12", F(153 * 10**10), X),
    ("7.123456M", F(7123456), D),
    ("6.987654321G", F(6987654321), D),
    ("1.01E", F(101 * 10**16), D),
    # things that saturate or round up (magnitude to the next nano; binary capped at 2^63-1)
    ("3.001n", F(4, 10**9), D),
    ("1.1E-9", F(2, 10**9), X),
    ("0.0000000001", NANO, D),
    ("0.0000000005", NANO, D),
    ("0.5e-9", NANO, X),
    ("0.9n", NANO, D),
    ("0.00000012345", F(124, 10**9), D),
    ("9Ei", F(MAX_BINARY_SI), B),
    ("9223372036854775807Ki", F(MAX_BINARY_SI), B),
    ("12E", F(12 * 10**18), D),
    ("100.035Ki", F(10243584, 100), B),
    ("0.5Mi", F(2**19), B),
    ("0.05Gi", F(536870912, 10), B),
    ("0.000000000001Ki", F(2, 10**9), D),  # rounds up and changes format
    (".001", F(1, 1000), D),
    (".0001k", F(1, 10), D),
    ("1.", F(1), D),
    ("1.G", F(10**9), D),
    # decimal values are not capped upstream (TestParseQuantity)
    ("9223372036854775808", F(2**63), D),
    ("-9223372036854775809.1", -F(92233720368547758091, 10), D),
    ("10E", F(10**19), D),
]

# (input, canonical text): upstream TestQuantityString alternates, TestQuantityParseEmit, TestParseQuantity
CANONICAL_VECTORS = [
    ("1024Mi", "1Gi"),
    ("307200Ki", "300Mi"),
    ("1025024Mi", "1001Gi"),
    ("1024Gi", "1Ti"),
    ("5000m", "5"),
    ("0.5", "500m"),
    ("1000M", "1G"),
    ("0.001T", "1G"),
    ("1000u", "1m"),
    ("1.08", "1080m"),
    ("1080000000n", "1080m"),
    (".001e12", "1e9"),
    ("0.001e0", "1e-3"),
    ("1000e-12", "1e-9"),
    ("00", "0"),
    ("1Ki", "1Ki"),
    ("1025", "1025"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    (".000000000001Ki", "2n"),
    ("999999999999999999.1", "999999999999999999100m"),
    ("1000000000000000000", "1E"),
    ("9999999999999999999000m", "9999999999999999999"),
    ("1.0000000000000000001E", "1000000000000000000100m"),
    ("1.000000000000000001E", "1000000000000000001"),
    ("10000000000000000000000m", "10E"),
    ("-10.0E", "-10E"),
    ("9223372036854775808.1", "9223372036854775808100m"),
    # everyday spellings: milli, binary suffixes, exponents, signs
    ("1000m", "1"),
    ("1.5", "1500m"),
    ("1536Mi", "1536Mi"),
    ("1.5Gi", "1536Mi"),
    ("2e3", "2e3"),
    ("100m", "100m"),
    ("12e4", "120e3"),
    ("1.5e3", "1500"),
    ("-1Ki", "-1Ki"),
    ("0.5Ki", "512"),
    ("1.1Gi", "1181116006400m"),
    ("9Ei", "9223372036854775807"),
    ("+5", "5"),
    ("-0", "0"),
]

INVALID = ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 ", ""]
# accepted by ParseQuantity but not by the OpenAPI pattern (digit-less or fractional exponent): we reject
PATTERN_REJECTS = ["-", "+", ".", "Ki", "m", "-.", "1e1.5", "1e.5", "1K", "1ki", "1e", "1E+"]


@pytest.mark.parametrize(("text", "value", "fmt"), PARSE_VECTORS)
def test_upstream_parse_vectors(text: str, value: Fraction, fmt: QuantityFormat) -> None:
    q = parse_quantity_with_format(text, allow_negative=True)
    assert (q.value, q.format) == (value, fmt)
    if value != 0:
        neg = parse_quantity_with_format("-" + text.lstrip("-"), allow_negative=True)
        assert (neg.value, neg.format) == (-abs(value), fmt)
        assert parse_quantity("+" + text.lstrip("-"), allow_negative=True) == abs(value)


@pytest.mark.parametrize(("text", "canonical"), CANONICAL_VECTORS)
def test_canonical_form(text: str, canonical: str) -> None:
    assert canonicalize_quantity(text) == canonical
    assert canonicalize_quantity(canonical) == canonical


@pytest.mark.parametrize("text", INVALID + PATTERN_REJECTS)
def test_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text, allow_negative=True)


def test_unknown_suffix_message_names_field_and_fix() -> None:
    with pytest.raises(QuantityError, match=r"requests\['cpu'\].*unknown suffix 'x'.*Ki"):
        parse_quantity("1x", what="requests['cpu']")


def test_documented_deviations() -> None:
    # upstream prints "1000E" as "1" (no suffix for exponent 21); we keep the value
    assert canonicalize_quantity("1000E") == "1000E"
    # upstream prints binary 5000 as "5000" and, re-read as decimal, as "5k"; we print "5k" at once
    assert canonicalize_quantity("4.8828125Ki") == "5k"
    assert canonicalize_quantity("5000") == "5k"
    assert format_quantity(F(10**21), D) == "1000E"
    assert format_quantity(F(10**21), X) == "1e21"
    # magnitudes >= 10^100, > 1000 significant digits, exponents outside int32: refused, not built
    for text in ["1e100", "1" * 101, "1e2147483648", "1e-99999999999", "0." + "1" * 1001]:
        with pytest.raises(QuantityError):
            parse_quantity(text)
    assert parse_quantity("9" * 100) == 10**100 - 1
    # tiny values with any number of zeros still round up to 1n, huge binary ones still cap
    assert parse_quantity("0." + "0" * 5000 + "1") == NANO
    assert parse_quantity("1e-2147483647") == NANO
    assert parse_quantity("1" * 300 + "Ki") == MAX_BINARY_SI
    assert parse_quantity("0e2147483647") == 0


def test_negative_quantities() -> None:
    with pytest.raises(NegativeQuantityError) as info:
        parse_quantity("-100m", what="quota.gpuHours")
    assert isinstance(info.value, QuantityError)
    assert isinstance(info.value, NegativeValueError)
    assert isinstance(info.value, AccountingError) and isinstance(info.value, ValueError)
    assert "quota.gpuHours" in str(info.value)
    assert parse_quantity("-100m", allow_negative=True) == F(-1, 10)
    assert parse_quantity("-0") == 0  # negative zero is zero


def test_json_numbers_as_the_apiserver_reads_them() -> None:
    assert parse_quantity(3) == 3
    assert parse_quantity(0.1) == F(1, 10)  # the literal 0.1, not the binary double
    assert parse_quantity(1.5) == F(3, 2)
    assert parse_quantity(1e16) == 10**16
    assert parse_quantity(1e-05) == F(1, 100000)
    assert parse_quantity(-2.5, allow_negative=True) == F(-5, 2)
    assert parse_quantity(1e-12) == NANO  # rounds up like the string "1e-12"
    for bad in [True, None, math.nan, math.inf, -math.inf, b"1", [1], 10**200]:
        with pytest.raises(QuantityError):
            parse_quantity(bad)  # type: ignore[arg-type]


def test_format_refuses_values_no_quantity_holds() -> None:
    with pytest.raises(QuantityError, match="round_up_to_nano"):
        format_quantity(F(1, 3))
    with pytest.raises(QuantityError):
        format_quantity(F(1, 10**10))
    with pytest.raises(QuantityError):
        format_quantity(F(10**100))
    assert format_quantity(round_up_to_nano(F(1, 3))) == "333333334n"
    assert round_up_to_nano(F(-1, 3)) == F(-333333334, 10**9)
    # binary above the cap (only reachable by arithmetic) prints exactly, in decimal
    assert format_quantity(F(2**63), B) == "9223372036854775808"
    assert str(Quantity(F(3, 2), B)) == "1500m"
    assert str(Quantity(F(2**30), B)) == "1Gi"
    assert str(Quantity(F(2**70), B)) == str(2**70)
    assert format_quantity(F(2**60 * 1024), D) == str(2**70)


# ---------------------------------------------------------------------------------------------------- properties

FORMATS = st.sampled_from(list(QuantityFormat))
NANOS = st.one_of(
    st.integers(-(10**30), 10**30),
    st.integers(-(10**6), 10**6),
    st.builds(lambda m, k: m * 10**k, st.integers(-999, 999), st.integers(0, 40)),
    st.builds(lambda m, k: m * 1024**k, st.integers(-2000, 2000), st.integers(0, 7)),
)


@settings(max_examples=400, deadline=None)
@given(nanos=NANOS, fmt=FORMATS)
def test_round_trip_and_idempotent(nanos: int, fmt: QuantityFormat) -> None:
    value = F(nanos, 10**9)
    text = format_quantity(value, fmt)
    parsed = parse_quantity_with_format(text, allow_negative=True)
    assert parsed.value == value
    assert str(parsed) == text  # canonical text is a fixed point
    assert format_quantity(value, fmt) == format_quantity(parse_quantity(text, allow_negative=True), fmt)


CANONICAL = re.compile(r"-?(?P<mantissa>[0-9]+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|e-?[0-9]+)?")


@settings(max_examples=400, deadline=None)
@given(nanos=NANOS, fmt=FORMATS)
def test_canonical_text_uses_the_largest_suffix(nanos: int, fmt: QuantityFormat) -> None:
    text = format_quantity(F(nanos, 10**9), fmt)
    match = CANONICAL.fullmatch(text)
    assert match is not None, text
    mantissa, suffix = int(match["mantissa"]), match["suffix"] or ""
    assert text == "0" or (mantissa != 0 and not match["mantissa"].startswith("0"))
    if suffix.endswith("i"):
        assert fmt is B and (mantissa % 1024 != 0 or suffix == "Ei")
    elif suffix.startswith("e"):
        assert fmt is X and int(suffix[1:]) % 3 == 0 and int(suffix[1:]) != 0 and mantissa % 1000 != 0
    elif suffix != "E":
        assert mantissa % 1000 != 0 or text == "0"  # one more factor of 1000 would fit the next suffix up


SIGNS = st.sampled_from(["", "+", "-"])
SUFFIXES = st.one_of(
    st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
    st.builds(lambda e, sign, n: f"{e}{sign}{n}", st.sampled_from("eE"), SIGNS, st.integers(0, 40)),
)


@st.composite
def quantity_texts(draw: st.DrawFn) -> str:
    int_part = draw(st.text("0123456789", max_size=22))
    frac = draw(st.none() | st.text("0123456789", max_size=22))
    if not int_part and not frac:
        int_part = "0"
    number = int_part if frac is None else f"{int_part}.{frac}"
    return f"{draw(SIGNS)}{number}{draw(SUFFIXES)}"


def reference_value(text: str) -> tuple[Fraction, QuantityFormat]:
    """Straight from the definition: exact rational, magnitude rounded up to 1n, binary capped."""
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    i = 0
    while i < len(body) and (body[i].isdigit() or body[i] == "."):
        i += 1
    number, suffix = body[:i], body[i:]
    whole, _, frac = number.partition(".")
    exact = F(int(whole or "0")) + (F(int(frac), 10 ** len(frac)) if frac else 0)
    binary = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
    decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
    if suffix in binary:
        exact *= 2 ** binary[suffix]
        fmt = B
    elif suffix in decimal:
        exact *= F(10) ** decimal[suffix]
        fmt = D
    else:
        exact *= F(10) ** int(suffix[1:])
        fmt = X
    magnitude = F(math.ceil(exact * 10**9), 10**9)
    if fmt is B:
        magnitude = min(magnitude, F(MAX_BINARY_SI))
        if 0 < magnitude < 1:
            fmt = D
    return sign * magnitude, fmt


@settings(max_examples=500, deadline=None)
@given(text=quantity_texts())
def test_parse_matches_the_definition_and_canonicalizes_idempotently(text: str) -> None:
    value, fmt = reference_value(text)
    parsed = parse_quantity_with_format(text, allow_negative=True)
    assert parsed.value == value
    if value != 0:
        assert parsed.format == fmt
    canonical = str(parsed)
    assert canonicalize_quantity(canonical) == canonical
    assert parse_quantity(canonical, allow_negative=True) == value
    if value < 0:
        with pytest.raises(NegativeQuantityError):
            parse_quantity(text)


@settings(max_examples=200, deadline=None)
@given(number=st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e90))
def test_floats_read_as_their_json_literal(number: float) -> None:
    assert parse_quantity(number) == parse_quantity(repr(number))
    assert parse_quantity(number) == round_up_to_nano(F(repr(number)))
