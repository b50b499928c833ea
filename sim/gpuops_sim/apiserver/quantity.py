"""resource.Quantity as the API server stores it: parsed exactly, then printed in canonical form, so a
request's `1024Mi` is read back as `1Gi` and `0.5` as `500m`.

Written from the Quantity documentation, independently of the operator's accounting package: the two are
compared in a differential test, so a misreading of the rules shows up as a disagreement, not a shared bug.
The canonical form loses no precision, prints no fraction, and uses the largest suffix that allows both;
binary-suffixed values that are not whole numbers of at least 1024 print in decimal SI, and are capped at
2^63-1; anything finer than a nano unit rounds up (away from zero) to one. `parse_quantity` gives that stored
amount as an exact Fraction, which is what the emulated scheduler and kubelets compare.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_FORM = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {e: s for s, e in _DECIMAL_EXPONENTS.items()}
_BINARY_POWERS = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_BINARY_SUFFIX = {p: s for s, p in _BINARY_POWERS.items()}
_NANO = Fraction(1, 10**9)
_MAX_EXPONENT = 1000  # beyond this the value is refused rather than expanded
_MAX_BINARY = 2**63 - 1  # binary-suffixed amounts are capped here; decimal ones are not


def parse(text: str) -> tuple[Fraction, str]:
    """(exact value, format) with format one of "BinarySI", "DecimalSI", "DecimalExponent"; ValueError
    for text that is not a quantity."""
    m = _FORM.match(text.strip() if isinstance(text, str) else "")
    if m is None or text != text.strip():
        raise ValueError(f"quantities must match the regular expression '{_FORM.pattern}'")
    sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
    value = Fraction(number)
    if suffix in _BINARY_POWERS:
        value *= 1024 ** _BINARY_POWERS[suffix]
        form = "BinarySI"
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError("quantity exponent out of range")
        value *= Fraction(10) ** exponent
        form = "DecimalExponent"
    else:
        value *= Fraction(10) ** _DECIMAL_EXPONENTS[suffix]
        form = "DecimalSI"
    return (-value if sign == "-" else value), form


def _round_to_nano(value: Fraction) -> Fraction:
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    whole = -(-abs(scaled.numerator) // scaled.denominator)  # ceiling of |scaled|: away from zero
    return Fraction(whole if value > 0 else -whole) * _NANO


def _decimal(value: Fraction, exponent_form: bool) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value == 0:
        return "0"
    exponent = -9
    while (value / Fraction(10) ** (exponent + 3)).denominator == 1 and (exponent + 3 <= 18 or exponent_form):
        exponent += 3
    mantissa = value / Fraction(10) ** exponent
    assert mantissa.denominator == 1
    if exponent_form:
        return f"{sign}{mantissa.numerator}{f'e{exponent}' if exponent else ''}"
    return f"{sign}{mantissa.numerator}{_DECIMAL_SUFFIX[exponent]}"


def _binary(value: Fraction) -> str:
    sign, n = ("-" if value < 0 else ""), abs(value.numerator)
    power = 0
    while power < 6 and n % 1024 == 0 and n:
        n //= 1024
        power += 1
    return f"{sign}{n}{_BINARY_SUFFIX.get(power, '')}"


def _stored(text: str) -> tuple[Fraction, str]:
    """(value, format) of what the API server keeps for `text`: rounded to nano units, binary ones capped."""
    value, form = parse(text)
    value = _round_to_nano(value)
    if form == "BinarySI" and abs(value) > _MAX_BINARY:
        value = Fraction(_MAX_BINARY if value > 0 else -_MAX_BINARY)
    return value, form


def parse_quantity(raw: str | int | float, *, allow_negative: bool = False) -> Fraction:
    """The exact amount a quantity stands for once stored: the number `canonical` prints.

    A JSON number in a quantity field is read as the literal it was written as (Python's `repr` of a float is
    the literal `json.dumps` sends). ValueError for anything that is not a quantity, and for a negative amount
    unless `allow_negative`: requests, limits, overhead and allocatable amounts are never negative.
    """
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"a quantity is a string or a JSON number, not {type(raw).__name__}")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ValueError(f"{raw!r} is not a quantity")
    text = raw if isinstance(raw, str) else str(raw) if isinstance(raw, int) else repr(raw)
    value, _ = _stored(text)
    if value < 0 and not allow_negative:
        raise ValueError(f"quantity {text!r} is negative")
    return value


def canonical(text: str) -> str:
    """The string the API server stores for `text` (ValueError if it is not a quantity)."""
    value, form = _stored(text)
    if form == "BinarySI" and (abs(value) < 1024 or value.denominator != 1):
        form = "DecimalSI"
    if form == "BinarySI":
        return _binary(value)
    return _decimal(value, exponent_form=form == "DecimalExponent")
