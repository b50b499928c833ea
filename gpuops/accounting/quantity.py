"""Kubernetes quantities ("100m", "1.5", "1Gi", "2e3") as exact numbers, and back to their canonical text.

Quotas and requests are compared against each other, so they must be exact: reading them with `AsApproximateFloat64`
and rounding a status to milli-units loses GPU-seconds that add up. Here a quantity is a `Fraction` and the text
form follows apimachinery's `resource.Quantity` (k8s.io/apimachinery/pkg/api/resource, read at HEAD eed236c):

Accepted syntax is what both `ParseQuantity` and the OpenAPI pattern of Quantity accept::

    [+-]? ( digits [ . digits? ] | . digits ) ( Ki|Mi|Gi|Ti|Pi|Ei | n|u|m|k|M|G|T|P|E | (e|E) [+-]? digits )?

(`ParseQuantity` also takes digit-less strings such as "-", "." or "Ki" as zero and the pattern also takes
fractional exponents such as "1e1.5" that `ParseQuantity` rejects; we reject both, as the apiserver does for
a CRD field. No surrounding whitespace: only the JSON decoder trims it, `ParseQuantity` does not.)

Precision and range, as upstream does it:

* a non-zero magnitude finer than 1n (10^-9) is rounded *up* to the next nano ("0.1n" -> 1n, "3.001n" -> 4n,
  "0.000000000001Ki" -> 2n), so a tiny request never becomes zero;
* a binary-SI magnitude above 2^63-1 is capped at 2^63-1 ("9Ei" -> 9223372036854775807), and a binary-SI
  value below 1 switches to decimal SI (as upstream, it would print in decimal anyway);
* decimal values are not capped upstream (despite the type's doc comment); we keep them exact but refuse
  magnitudes >= 10^100, more than 1000 significant digits, and exponents outside int32 (upstream silently
  wraps those to int32), so that a hostile string cannot make us build a gigantic integer. These are the only
  inputs `ParseQuantity` accepts and we reject.

Canonical text keeps the format family of the input and picks the largest suffix that leaves an integer
mantissa: decimal SI and decimal exponent use exponents that are multiples of 3 ("1.5" -> "1500m",
"12e4" -> "120e3", "1000m" -> "1"), binary SI uses powers of 1024 ("1.5Gi" -> "1536Mi") but falls back to
decimal SI for values below 1024 in magnitude or with a fractional part ("0.5Ki" -> "512"); zero is "0".
Two deviations, both so that canonical text is a fixed point (parse, print, parse, print gives the same text):
upstream emits no suffix at all for decimal-SI exponents above 18 (so "1000E" prints as "1", a bug); we keep
"E" and grow the mantissa ("1000E"). And upstream prints a binary-SI integer that no binary suffix divides as
plain digits in the binary way ("4.8828125Ki" -> "5000"), which it re-reads as decimal SI and then prints as
"5k"; we print such values as decimal SI right away ("5k"). Values are never affected.
"""

from __future__ import annotations

import enum
import math
import re
from fractions import Fraction

import msgspec

from gpuops.accounting.errors import NegativeValueError, QuantityError

__all__ = [
    "MAX_BINARY_SI",
    "NANO",
    "NegativeQuantityError",
    "Quantity",
    "QuantityFormat",
    "canonicalize_quantity",
    "format_quantity",
    "parse_quantity",
    "parse_quantity_with_format",
    "round_up_to_nano",
]

NANO = Fraction(1, 10**9)
"""The smallest non-zero magnitude a Kubernetes quantity can hold."""

MAX_BINARY_SI = 2**63 - 1
"""Upstream caps binary-SI magnitudes here (it cannot cap decimal ones: they are kept exactly)."""

_MAX_DECIMAL_DIGITS = 100  # |value| < 10**100
_MAX_SIGNIFICANT_DIGITS = 1000
_INT32_MAX = 2**31 - 1

_SYNTAX = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?"
)

_NUMBER = re.compile(r"[+-]?[0-9]*(?:\.[0-9]*)?")
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_BY_POWER = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]  # index k -> 1024**k
_HELP = "a Kubernetes quantity such as '2', '100m', '1.5', '1Gi' or '2e3'"


class QuantityFormat(enum.StrEnum):
    """The three suffix families; a parsed quantity remembers its family so it prints back in the same one."""

    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


class NegativeQuantityError(QuantityError, NegativeValueError):
    """A negative quantity where only non-negative ones make sense (a resource request, a quota).

    Kubernetes itself accepts negative quantities, so this is both a quantity error and a negative-value error.
    """


class Quantity(msgspec.Struct, frozen=True):
    """An exact value with the format family it was written in; `str()` gives the canonical text."""

    value: Fraction
    format: QuantityFormat = QuantityFormat.DECIMAL_SI

    def __post_init__(self) -> None:
        value: object = self.value
        if isinstance(value, bool) or not isinstance(value, Fraction | int):
            raise QuantityError(f"Quantity.value must be a Fraction or int, got {value!r}")
        msgspec.structs.force_setattr(self, "value", Fraction(value))
        if not isinstance(self.format, QuantityFormat):
            raise QuantityError(f"Quantity.format must be a QuantityFormat, got {self.format!r}")

    def __str__(self) -> str:
        return format_quantity(self.value, self.format)


def _show(raw: object) -> str:
    """repr() cut short: error messages must not echo a megabyte of hostile digits."""
    text = repr(raw)
    return text if len(text) <= 40 else f"{text[:37]}..."


def round_up_to_nano(value: Fraction | int) -> Fraction:
    """Round the magnitude up to a multiple of 1n, as upstream does when parsing, so no request rounds to 0."""
    value = Fraction(value)
    nanos = -((-abs(value) * 10**9) // 1)  # ceil of the magnitude in nanos
    return Fraction(nanos if value >= 0 else -nanos, 10**9)


def _exponent(text: str, what: str, raw: object) -> int:
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 10 or int(digits) > _INT32_MAX:
        raise QuantityError(
            f"{what}: the exponent of {_show(raw)} is outside the int32 range (Kubernetes would silently wrap"
            f" it); write {_HELP}"
        )
    return -int(digits) if text.startswith("-") else int(digits)


def _number_text(raw: object, what: str) -> str:
    """The text the apiserver would parse: JSON numbers arrive as their literal, which repr() reproduces."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bool) or raw is None:
        raise QuantityError(f"{what}: {_show(raw)} is not a quantity; write {_HELP}")
    if isinstance(raw, int):
        if abs(raw) >= 10**_MAX_DECIMAL_DIGITS:
            raise QuantityError(f"{what}: {raw} is out of range (we accept magnitudes below 10^100)")
        return str(raw)
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise QuantityError(f"{what}: {_show(raw)} is not a quantity; write {_HELP}")
        # repr is the shortest decimal that reads back as the same float: what json.dumps sends and what the
        # apiserver then parses (the exact binary expansion of 0.1 would round up to 100000001n instead).
        return repr(raw)
    raise QuantityError(f"{what}: expected a string, int or float quantity, got {type(raw).__name__} {_show(raw)}")


def parse_quantity_with_format(
    text: str | int | float, *, allow_negative: bool = False, what: str = "quantity"
) -> Quantity:
    """Parse like `resource.ParseQuantity` (see the module docstring for syntax, rounding and range).

    `what` names the field in error messages (e.g. "containers[0].resources.requests['cpu']").
    Negative values raise `NegativeQuantityError` unless `allow_negative`: they are valid quantities but not
    valid requests or quotas.
    """
    source = _number_text(text, what)
    match = _SYNTAX.fullmatch(source)
    int_part = match.group("int") if match else ""
    frac_part = (match.group("frac") or "") if match else ""
    if match is None or not (int_part or frac_part):
        number = _NUMBER.match(source)
        if number is not None and any(c.isdigit() for c in number.group()) and number.end() < len(source):
            raise QuantityError(
                f"{what}: {_show(source)} has an unknown suffix {_show(source[number.end() :])}; use one of"
                f" {', '.join(s for s in _DECIMAL_SUFFIXES if s)}, {', '.join(_BINARY_SUFFIXES)} or e<integer>"
            )
        raise QuantityError(f"{what}: {_show(source)} is not a valid quantity; write {_HELP}")
    suffix = match.group("suffix") or ""
    negative = match.group("sign") == "-"

    if suffix in _BINARY_SUFFIXES:
        base, exp, fmt = 2, _BINARY_SUFFIXES[suffix], QuantityFormat.BINARY_SI
    elif suffix in _DECIMAL_SUFFIXES:
        base, exp, fmt = 10, _DECIMAL_SUFFIXES[suffix], QuantityFormat.DECIMAL_SI
    else:
        base, exp, fmt = 10, _exponent(suffix[1:], what, text), QuantityFormat.DECIMAL_EXPONENT

    # value = int(sig) * 10**shift * base**exp, with sig free of leading and trailing zeros
    digits = (int_part + frac_part).lstrip("0")
    shift = -len(frac_part)
    if not digits:
        return Quantity(Fraction(0), fmt)
    sig = digits.rstrip("0")
    shift += len(digits) - len(sig)

    if base == 10:
        shift += exp
        top = shift + len(sig)  # 10**(top-1) <= |value| < 10**top
        if top > _MAX_DECIMAL_DIGITS:
            raise QuantityError(f"{what}: {_show(text)} is out of range (we accept magnitudes below 10^100)")
        # below 1n it rounds up to exactly 1n, however many digits it has
        value = NANO if top <= -9 else round_up_to_nano(_exact(sig, shift, 1, what, text))
    else:
        if shift + len(sig) - 1 >= 19:  # >= 10**19 > 2**63 - 1 before even applying the suffix
            value = Fraction(MAX_BINARY_SI)
        else:
            value = min(round_up_to_nano(_exact(sig, shift, 2**exp, what, text)), Fraction(MAX_BINARY_SI))
        if value < 1:
            fmt = QuantityFormat.DECIMAL_SI
    if negative:
        value = -value
        if not allow_negative:
            raise NegativeQuantityError(f"{what}: {_show(text)} is negative; a resource request or quota must be >= 0")
    return Quantity(value, fmt)


def _exact(sig: str, shift: int, factor: int, what: str, raw: object) -> Fraction:
    if len(sig) > _MAX_SIGNIFICANT_DIGITS:
        raise QuantityError(f"{what}: {_show(raw)} has more than {_MAX_SIGNIFICANT_DIGITS} significant digits")
    mantissa = int(sig) * factor
    return Fraction(mantissa * 10**shift) if shift >= 0 else Fraction(mantissa, 10**-shift)


def parse_quantity(text: str | int | float, *, allow_negative: bool = False, what: str = "quantity") -> Fraction:
    """The exact value of a quantity (see `parse_quantity_with_format`)."""
    return parse_quantity_with_format(text, allow_negative=allow_negative, what=what).value


def _ten_valuation(n: int) -> int:
    """How many times 10 divides n (n != 0)."""
    count = 0
    while n % 10 == 0:
        n //= 10
        count += 1
    return count


def format_quantity(value: Fraction | int, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> str:
    """Canonical text of an exact value in a format family, as `resource.Quantity.String()` prints it.

    The value must be what a quantity can hold: a multiple of 1n (use `round_up_to_nano` first, as upstream
    would) with magnitude below 10^100. A binary-SI value above 2^63-1 (reachable only by arithmetic, never by
    parsing) is printed in decimal SI so that it parses back to the same number instead of being capped.
    """
    value = Fraction(value)
    if not isinstance(fmt, QuantityFormat):
        raise QuantityError(f"format must be a QuantityFormat, got {fmt!r}")
    if value == 0:
        return "0"
    nanos = value * 10**9
    if nanos.denominator != 1:
        raise QuantityError(
            f"value {value} is not a multiple of 1n (10^-9) and no quantity can hold it; round it with"
            " round_up_to_nano() first"
        )
    if abs(value) >= 10**_MAX_DECIMAL_DIGITS:
        raise QuantityError(f"value {value} is out of range (we accept magnitudes below 10^100)")
    sign = "-" if value < 0 else ""
    magnitude = abs(value)

    if fmt is QuantityFormat.BINARY_SI:
        if magnitude >= 1024 and magnitude.denominator == 1 and magnitude <= MAX_BINARY_SI:
            mantissa, power = magnitude.numerator, 0
            while power < len(_BINARY_BY_POWER) - 1 and mantissa % 1024 == 0:
                mantissa //= 1024
                power += 1
            if power:
                return f"{sign}{mantissa}{_BINARY_BY_POWER[power]}"
        # below 1024, fractional, too large, or no binary suffix applies: print as decimal SI
        fmt = QuantityFormat.DECIMAL_SI

    n = abs(nanos.numerator)
    exponent = (_ten_valuation(n) - 9) // 3 * 3  # largest multiple of 3 that keeps the mantissa integral
    if fmt is QuantityFormat.DECIMAL_SI:
        exponent = min(exponent, 18)  # "E" is the largest decimal-SI suffix
    mantissa = n // 10 ** (exponent + 9)
    if fmt is QuantityFormat.DECIMAL_SI:
        return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
    return f"{sign}{mantissa}e{exponent}" if exponent else f"{sign}{mantissa}"


def canonicalize_quantity(text: str | int | float, *, what: str = "quantity") -> str:
    """The text the apiserver would store for `text` (negative values allowed: this is about syntax)."""
    return str(parse_quantity_with_format(text, allow_negative=True, what=what))
