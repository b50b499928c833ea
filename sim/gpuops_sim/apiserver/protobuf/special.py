"""The message types whose JSON form is hand-written in Go (a custom MarshalJSON, or a non-struct Go type).

Each entry decodes the message's bytes into that JSON value and encodes the JSON value back into the bytes
gogo's generated (or hand-written) Marshal writes. Everything else follows the table generically.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from . import wire
from .wire import WireError

META = "k8s.io.apimachinery.pkg.apis.meta.v1"
QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "k8s.io.apimachinery.pkg.util.intstr.IntOrString"
RAW_EXTENSION = "k8s.io.apimachinery.pkg.runtime.RawExtension"
APIEXT = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1"
SCHEMA = f"{APIEXT}.JSONSchemaProps"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Decoder = Callable[[bytes], Any]
Encoder = Callable[[Any], bytes]


class EncodeError(ValueError):
    """A JSON value that has no protobuf form in its field's type."""


def _fields(data: bytes) -> dict[int, wire.RawValue]:
    """Last value per field number (scalars take the last occurrence, as gogo's Unmarshal does)."""
    return {number: value for number, _, value in wire.read_fields(data)}


def _as_bytes(value: wire.RawValue | None) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, bytes):
        raise WireError("wrong wireType for a length-delimited field")
    return value


def _as_int(value: wire.RawValue | None, bits: int = 64) -> int:
    if value is None:
        return 0
    if not isinstance(value, int):
        raise WireError("wrong wireType for a varint field")
    return wire.signed(value, bits)


def _text(value: wire.RawValue | None) -> str:
    return _as_bytes(value).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------- time


def _seconds_nanos(data: bytes) -> tuple[int, int]:
    fields = _fields(data)
    return _as_int(fields.get(1)), _as_int(fields.get(2), 32)


def _format_time(seconds: int, micros: int | None) -> str:
    try:
        moment = _EPOCH + timedelta(seconds=seconds, microseconds=micros or 0)
    except OverflowError:
        raise WireError("Time.MarshalJSON: year outside of range [0,9999]") from None
    if micros is None:
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: Any) -> datetime:
    if not isinstance(text, str):
        raise EncodeError(f"a time must be an RFC 3339 string, not {text!r}")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise EncodeError(f"{text!r} is not an RFC 3339 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def decode_time(data: bytes) -> Any:
    """meta/v1 Time: seconds only (nanoseconds are dropped on decode, as the JSON form has none); no bytes at
    all is the zero time, which prints as null."""
    if not data:
        return None
    seconds, _ = _seconds_nanos(data)
    return _format_time(seconds, None)


def encode_time(value: Any) -> bytes:
    if value is None:
        return b""
    seconds = int((_parse_time(value) - _EPOCH).total_seconds() // 1)
    return wire.varint_field(1, seconds) + wire.varint_field(2, 0)


def decode_micro_time(data: bytes) -> Any:
    if not data:
        return None
    seconds, nanos = _seconds_nanos(data)
    return _format_time(seconds, nanos // 1000)


def encode_micro_time(value: Any) -> bytes:
    if value is None:
        return b""
    delta = _parse_time(value) - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    return wire.varint_field(1, seconds) + wire.varint_field(2, delta.microseconds * 1000)


_UNITS = (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3), ("µs", 10**3),
          ("ns", 1))


def format_duration(ns: int) -> str:
    """Go's time.Duration.String(): "1h0m0s", "1.5s", "300ms", "0s"."""
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 10**9:
        for unit, size in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = _decimal(rest, 10**9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    return f"{sign}{minutes}m{text}" if minutes else sign + text


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def parse_duration(text: Any) -> int:
    if not isinstance(text, str) or not re.fullmatch(r"[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+|0", text):
        raise EncodeError(f"{text!r} is not a duration")
    sign = -1 if text.startswith("-") else 1
    total = 0
    for number, unit in re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text):
        total += round(float(number) * dict(_UNITS)[unit])
    return sign * total


def decode_duration(data: bytes) -> Any:
    return format_duration(_as_int(_fields(data).get(1)))


def encode_duration(value: Any) -> bytes:
    return wire.varint_field(1, parse_duration(value))


# ------------------------------------------------------------------------------- quantities, int-or-string


def decode_quantity(data: bytes) -> Any:
    return _text(_fields(data).get(1)) or "0"


def encode_quantity(value: Any) -> bytes:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise EncodeError(f"a quantity must be a string or a number, not {value!r}")
    text = value if isinstance(value, str) else json.dumps(value)
    return wire.bytes_field(1, text.encode())


def decode_int_or_string(data: bytes) -> Any:
    fields = _fields(data)
    if _as_int(fields.get(1)) == 1:
        return _text(fields.get(3))
    return _as_int(fields.get(2), 32)


def encode_int_or_string(value: Any) -> bytes:
    if isinstance(value, str):
        return wire.varint_field(1, 1) + wire.varint_field(2, 0) + wire.bytes_field(3, value.encode())
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodeError(f"an int-or-string must be an integer or a string, not {value!r}")
    return wire.varint_field(1, 0) + wire.varint_field(2, value) + wire.bytes_field(3, b"")


# ------------------------------------------------------------------------------------- raw JSON payloads


def _raw_json(data: bytes) -> Any:
    raw = _as_bytes(_fields(data).get(1))
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise WireError("embedded JSON is not valid JSON") from None


def _json_field(value: Any) -> bytes:
    if value is None:
        return b""
    return wire.bytes_field(1, json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def decode_raw_extension(data: bytes) -> Any:
    """A RawExtension holds JSON, or (in a protobuf stream) a whole protobuf-enveloped object."""
    raw = _as_bytes(_fields(data).get(1))
    if raw.startswith(b"k8s\x00"):
        from .codec import decode_object  # an enveloped object inside an object: the codec recurses

        return decode_object(raw)
    return _raw_json(data)


def decode_string_items(data: bytes) -> Any:
    """ExtraValue and Verbs are Go []string types with a wrapper message on the wire."""
    items = [_text(v) for n, _, v in wire.read_fields(data) if n == 1]
    return items or None


def encode_string_items(value: Any) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EncodeError(f"expected a list of strings, not {value!r}")
    return b"".join(wire.bytes_field(1, v.encode()) for v in value)


# -------------------------------------------------------------------------- apiextensions schema unions


def _schema_codec() -> tuple[Decoder, Encoder]:
    from .codec import decode_message_named, encode_message_named

    return (lambda b: decode_message_named(SCHEMA, b)), (lambda v: encode_message_named(SCHEMA, v))


def decode_props_or_bool(data: bytes) -> Any:
    decode, _ = _schema_codec()
    schemas = [v for n, _, v in wire.read_fields(data) if n == 2]
    if schemas:
        return decode(b"".join(_as_bytes(s) for s in schemas))
    return bool(_as_int(_fields(data).get(1)))


def encode_props_or_bool(value: Any) -> bytes:
    _, encode = _schema_codec()
    if isinstance(value, bool):
        return wire.varint_field(1, int(value))
    return wire.varint_field(1, 1) + wire.bytes_field(2, encode(value))


def decode_props_or_array(data: bytes) -> Any:
    decode, _ = _schema_codec()
    fields = wire.read_fields(data)
    items = [decode(_as_bytes(v)) for n, _, v in fields if n == 2]
    if items:
        return items
    schemas = [_as_bytes(v) for n, _, v in fields if n == 1]
    return decode(b"".join(schemas)) if schemas else None


def encode_props_or_array(value: Any) -> bytes:
    _, encode = _schema_codec()
    if isinstance(value, list):
        return b"".join(wire.bytes_field(2, encode(v)) for v in value)
    return b"" if value is None else wire.bytes_field(1, encode(value))


def decode_props_or_strings(data: bytes) -> Any:
    decode, _ = _schema_codec()
    fields = wire.read_fields(data)
    strings = [_text(v) for n, _, v in fields if n == 2]
    if strings:
        return strings
    schemas = [_as_bytes(v) for n, _, v in fields if n == 1]
    return decode(b"".join(schemas)) if schemas else None


def encode_props_or_strings(value: Any) -> bytes:
    _, encode = _schema_codec()
    if isinstance(value, list):
        return b"".join(wire.bytes_field(2, str(v).encode()) for v in value)
    return b"" if value is None else wire.bytes_field(1, encode(value))


def decode_group_version(data: bytes) -> Any:
    """meta/v1 GroupVersion prints as "group/version" (just "version" for the core group)."""
    fields = _fields(data)
    group, version = _text(fields.get(1)), _text(fields.get(2))
    return f"{group}/{version}" if group else version


def encode_group_version(value: Any) -> bytes:
    if not isinstance(value, str):
        raise EncodeError(f"a group/version must be a string, not {value!r}")
    group, _, version = value.rpartition("/")
    return wire.bytes_field(1, group.encode()) + wire.bytes_field(2, version.encode())


SPECIAL: dict[str, tuple[Decoder, Encoder]] = {
    f"{META}.Time": (decode_time, encode_time),
    f"{META}.MicroTime": (decode_micro_time, encode_micro_time),
    f"{META}.Duration": (decode_duration, encode_duration),
    f"{META}.FieldsV1": (_raw_json, _json_field),
    f"{META}.Verbs": (decode_string_items, encode_string_items),
    QUANTITY: (decode_quantity, encode_quantity),
    INT_OR_STRING: (decode_int_or_string, encode_int_or_string),
    RAW_EXTENSION: (decode_raw_extension, _json_field),
    f"{APIEXT}.JSON": (_raw_json, _json_field),
    f"{APIEXT}.JSONSchemaPropsOrBool": (decode_props_or_bool, encode_props_or_bool),
    f"{APIEXT}.JSONSchemaPropsOrArray": (decode_props_or_array, encode_props_or_array),
    f"{APIEXT}.JSONSchemaPropsOrStringArray": (decode_props_or_strings, encode_props_or_strings),
    "k8s.io.api.authentication.v1.ExtraValue": (decode_string_items, encode_string_items),
    "k8s.io.api.authorization.v1.ExtraValue": (decode_string_items, encode_string_items),
    "k8s.io.api.certificates.v1.ExtraValue": (decode_string_items, encode_string_items),
    "k8s.io.api.authentication.v1.AttestationValue": (decode_string_items, encode_string_items),
    f"{QUANTITY}Value": (decode_quantity, encode_quantity),
    f"{META}.GroupVersion": (decode_group_version, encode_group_version),
}
