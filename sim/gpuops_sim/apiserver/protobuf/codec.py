"""Protobuf bodies <-> the JSON objects the emulator stores, by the table of Kubernetes' wire format.

Decoding produces exactly what Go's encoding/json prints for the struct gogo's Unmarshal fills: absent
non-pointer scalars print their zero value unless `omitempty`, absent pointers, slices and maps are nil
(omitted under `omitempty`, else null), non-pointer structs always print, inline embeddings flatten into
their parent. Encoding is the inverse and writes what gogo's Marshal writes: fields in ascending number,
non-pointer scalars and structs always, map entries sorted by key with both key and value.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from . import wire
from .special import SPECIAL, EncodeError
from .table import Field, Message, table
from .wire import WireError

MAGIC = b"k8s\x00"
_ABSENT: Any = object()
_ZERO = {"string": "", "bool": False, "int32": 0, "int64": 0, "double": 0}


class DecodeError(ValueError):
    """A body that is not a protobuf-encoded object of a kind the table knows."""


# ------------------------------------------------------------------------------------------- decoding


def decode_object(raw: bytes, api_version: str = "", kind: str = "") -> dict[str, Any]:
    """The JSON object of an enveloped body (magic, then runtime.Unknown{typeMeta, raw}). The envelope's
    apiVersion and kind win; `api_version`/`kind` (from the URL) fill them when the envelope has none."""
    if not raw:
        raise DecodeError("empty data")
    if not raw.startswith(MAGIC):
        prefix = " ".join(str(b) for b in MAGIC)
        raise DecodeError(f"provided data does not appear to be a protobuf message, expected prefix [{prefix}]")
    try:
        envelope = wire.read_fields(raw[len(MAGIC):])
        type_meta = b"".join(v for n, _, v in envelope if n == 1 and isinstance(v, bytes))
        body = b"".join(v for n, _, v in envelope if n == 2 and isinstance(v, bytes))
        names = {n: v for n, _, v in wire.read_fields(type_meta) if isinstance(v, bytes)}
    except WireError as e:
        raise DecodeError(str(e)) from None
    api_version = names[1].decode(errors="replace") if names.get(1) else api_version
    kind = names[2].decode(errors="replace") if names.get(2) else kind
    if not kind:
        raise DecodeError("Object 'Kind' is missing in the protobuf envelope")
    if not api_version:
        raise DecodeError("Object 'apiVersion' is missing in the protobuf envelope")
    message = table().message_for(api_version, kind)
    if message is None:
        raise DecodeError(f"no kind {kind!r} is registered for version {api_version!r}")
    try:
        obj = decode_message(message, body)
    except (WireError, RecursionError) as e:
        raise DecodeError(f"unable to decode {api_version}, Kind={kind}: {e}") from None
    return {"kind": kind, "apiVersion": api_version, **obj}


def decode_message_named(name: str, data: bytes) -> Any:
    return _message_value(name, data)


def decode_message(message: Message, data: bytes) -> dict[str, Any]:
    occurrences: dict[int, list[tuple[int, wire.RawValue]]] = {}
    for number, wire_type, value in wire.read_fields(data):
        occurrences.setdefault(number, []).append((wire_type, value))
    out: dict[str, Any] = {}
    for field in message.fields:
        found = occurrences.get(field.number, [])
        if field.inline:
            out.update(decode_message(table().message(field.type), _joined(field, found)))
            continue
        value = _field_value(field, found)
        if field.json_name != "-" and not _omitted(field, value):
            out[field.json_name] = None if value is _ABSENT else value
    return out


def _field_value(field: Field, found: list[tuple[int, wire.RawValue]]) -> Any:
    """The decoded value, `_ABSENT` for a nil pointer, slice or map."""
    if field.label == "r":
        items = _repeated(field, found)
        return items if items else _ABSENT
    if field.label == "m":
        entries = dict(_map_entry(field, _length(field, v)) for w, v in found)
        return {k: entries[k] for k in sorted(entries)} if entries else _ABSENT
    if field.is_message:
        if not found:
            return _ABSENT if field.pointer else _message_value(field.type, b"")
        if field.type in SPECIAL:  # hand-written Unmarshal: a later occurrence replaces
            return _message_value(field.type, _length(field, found[-1][1]))
        return _message_value(field.type, _joined(field, found))
    if not found:
        return _ABSENT if field.pointer or field.type == "bytes" else _ZERO[field.type]
    wire_type, value = found[-1]
    return _scalar(field, wire_type, value)


def _omitted(field: Field, value: Any) -> bool:
    """encoding/json's rules: omitempty drops nil and zero scalars but never a struct; omitzero drops a
    zero struct too; a non-nil pointer, slice or map read from the wire always prints."""
    if value is _ABSENT:
        return field.omitempty or field.omitzero
    if field.label != "o" or field.pointer:
        return False
    if field.is_message:
        return field.omitzero and value == _message_value(field.type, b"")
    return (field.omitempty or field.omitzero) and value in ("", 0, False)


def _repeated(field: Field, found: list[tuple[int, wire.RawValue]]) -> list[Any]:
    items: list[Any] = []
    for wire_type, value in found:
        if field.is_message:
            items.append(_message_value(field.type, _length(field, value)))
        elif wire_type == wire.LENGTH and field.type not in ("string", "bytes"):
            items.extend(_scalar(field, _scalar_wire(field), v) for v in _packed(field, value))
        else:
            items.append(_scalar(field, wire_type, value))
    return items


def _packed(field: Field, value: wire.RawValue) -> list[int]:
    data = _length(field, value)
    if field.type == "double":
        return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data) - len(data) % 8, 8)]
    return wire.read_packed_varints(data)


def _map_entry(field: Field, data: bytes) -> tuple[str, Any]:
    key, value = "", _ABSENT
    for number, wire_type, raw in wire.read_fields(data):
        if number == 1:
            key = _length(field, raw).decode("utf-8", errors="replace")
        elif number == 2:
            value = (_message_value(field.type, _length(field, raw)) if field.is_message
                     else _scalar(field, wire_type, raw))
    if value is _ABSENT:  # an entry without a value holds the type's zero value
        value = _message_value(field.type, b"") if field.is_message else _zero_scalar(field.type)
    return key, value


def _zero_scalar(type_: str) -> Any:
    return "" if type_ == "bytes" else _ZERO[type_]


def _message_value(name: str, data: bytes) -> Any:
    special = SPECIAL.get(name)
    if special is not None:
        return special[0](data)
    return decode_message(table().message(name), data)


def _joined(field: Field, found: list[tuple[int, wire.RawValue]]) -> bytes:
    """Several occurrences of a message field merge, which is what decoding their concatenation does."""
    return b"".join(_length(field, v) for _, v in found)


def _length(field: Field, value: wire.RawValue) -> bytes:
    if not isinstance(value, bytes):
        raise WireError(f"proto: wrong wireType for field {field.proto_name}")
    return value


def _scalar_wire(field: Field) -> int:
    if field.type in ("string", "bytes"):
        return wire.LENGTH
    return wire.FIXED64 if field.type == "double" else wire.VARINT


def _scalar(field: Field, wire_type: int, value: wire.RawValue) -> Any:
    if wire_type != _scalar_wire(field):
        raise WireError(f"proto: wrong wireType = {wire_type} for field {field.proto_name}")
    if isinstance(value, bytes):
        if field.type == "bytes":
            return base64.b64encode(value).decode()
        return value.decode("utf-8", errors="replace")  # Go's JSON output replaces invalid UTF-8
    if field.type == "bool":
        return value != 0
    if field.type == "double":
        number = wire.double_from_bits(value)
        return int(number) if number.is_integer() and abs(number) < 1e21 else number
    return wire.signed(value, 32 if field.type == "int32" else 64)


# ------------------------------------------------------------------------------------------- encoding


def encode_object(obj: dict[str, Any]) -> bytes:
    """The enveloped protobuf form of a built-in object (EncodeError for a kind the table does not know)."""
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    message = table().message_for(api_version, kind)
    if message is None:
        raise EncodeError(f"{api_version}, Kind={kind} has no protobuf form")
    type_meta = wire.bytes_field(1, api_version.encode()) + wire.bytes_field(2, kind.encode())
    body = encode_message(message, obj)
    return (MAGIC + wire.bytes_field(1, type_meta) + wire.bytes_field(2, body)
            + wire.bytes_field(3, b"") + wire.bytes_field(4, b""))


def encode_message_named(name: str, value: Any) -> bytes:
    return _encode_value(name, value)


def encode_message(message: Message, obj: dict[str, Any]) -> bytes:
    if not isinstance(obj, dict):
        raise EncodeError(f"{message.name}: expected an object, not {type(obj).__name__}")
    out = bytearray()
    for field in sorted(message.fields, key=lambda f: f.number):
        if field.inline:
            out += wire.bytes_field(field.number, encode_message(table().message(field.type), obj))
            continue
        value = obj.get(field.json_name, _ABSENT) if field.json_name not in ("", "-") else _ABSENT
        out += _encode_field(field, None if value is _ABSENT else value)
    return bytes(out)


def _encode_field(field: Field, value: Any) -> bytes:
    try:
        if field.label == "r":
            return b"".join(_encode_single(field, v) for v in _as_list(field, value))
        if field.label == "m":
            return b"".join(
                wire.bytes_field(field.number, _encode_single(_KEY, k) + _encode_single(_value_field(field), v))
                for k, v in sorted(_as_map(field, value).items())
            )
        if value is None and (field.pointer or (field.type == "bytes") or (field.is_message
                                                                            and not field.value_struct)):
            return b""
        return _encode_single(field, value)
    except EncodeError as e:
        raise EncodeError(f"{field.json_name or field.proto_name}: {e}") from None


_KEY = Field(1, "key", "key", "o", "string", False, False, False, False, False)


def _value_field(field: Field) -> Field:
    return field._replace(number=2, label="o", pointer=False)


def _as_list(field: Field, value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise EncodeError(f"expected a list, not {type(value).__name__}")
    return value


def _as_map(field: Field, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise EncodeError(f"expected an object, not {type(value).__name__}")
    return value


def _encode_single(field: Field, value: Any) -> bytes:
    if field.is_message:
        return wire.bytes_field(field.number, _encode_value(field.type, value))
    if value is None:
        value = _zero_scalar(field.type)
    if field.type == "string":
        if not isinstance(value, str):
            raise EncodeError(f"expected a string, not {value!r}")
        return wire.bytes_field(field.number, value.encode())
    if field.type == "bytes":
        return wire.bytes_field(field.number, _base64(value))
    if field.type == "double":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EncodeError(f"expected a number, not {value!r}")
        return wire.double_field(field.number, float(value))
    if field.type == "bool":
        if not isinstance(value, bool):
            raise EncodeError(f"expected a boolean, not {value!r}")
        return wire.varint_field(field.number, int(value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodeError(f"expected an integer, not {value!r}")
    return wire.varint_field(field.number, value)


def _base64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise EncodeError(f"expected base64 data, not {value!r}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise EncodeError("illegal base64 data") from None


def _encode_value(name: str, value: Any) -> bytes:
    special = SPECIAL.get(name)
    if special is not None:
        return special[1](value)
    return encode_message(table().message(name), {} if value is None else value)


# ---------------------------------------------------------------------------------------------- watch


def encode_watch_frame(event_type: str, obj: dict[str, Any]) -> bytes:
    """One frame of a protobuf watch stream: a 4-byte big-endian length, then a WatchEvent whose object
    (a RawExtension) holds the enveloped object."""
    event = wire.bytes_field(1, event_type.encode()) + wire.bytes_field(2, wire.bytes_field(1, encode_object(obj)))
    return len(event).to_bytes(4, "big") + event
