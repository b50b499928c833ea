"""Protobuf wire primitives: varints, the four wire types Kubernetes' messages use, and their writers.

Kubernetes' generated code uses no zigzag encoding: negative int32/int64 values are ten-byte two's
complement varints. Repeated scalars are written unpacked; a reader accepts both forms, as gogo's does.
"""

from __future__ import annotations

import struct

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise WireError("unexpected EOF")
        if shift >= 64:
            raise WireError("integer overflow")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value & _MASK64, i
        shift += 7


RawValue = int | bytes  # varints and fixed numbers as int, length-delimited fields as bytes


def read_fields(data: bytes) -> list[tuple[int, int, RawValue]]:
    """(field number, wire type, raw value) of every field of one message, in wire order."""
    out: list[tuple[int, int, RawValue]] = []
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if number <= 0:
            raise WireError(f"illegal tag {number} (wire type {wire})")
        value: RawValue
        if wire == VARINT:
            value, i = read_varint(data, i)
        elif wire == LENGTH:
            size, i = read_varint(data, i)
            if size > len(data) - i:
                raise WireError("unexpected EOF")
            value, i = data[i:i + size], i + size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if i + width > len(data):
                raise WireError("unexpected EOF")
            value, i = int.from_bytes(data[i:i + width], "little"), i + width
        else:
            raise WireError(f"proto: illegal wireType {wire}")
        out.append((number, wire, value))
    return out


def read_packed_varints(data: bytes) -> list[int]:
    values: list[int] = []
    i = 0
    while i < len(data):
        v, i = read_varint(data, i)
        values.append(v)
    return values


def signed(value: int, bits: int) -> int:
    """A varint read as Go's int32/int64 (int32 takes the low 32 bits, as Go's conversion does)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def double_from_bits(value: int) -> float:
    return float(struct.unpack("<d", value.to_bytes(8, "little"))[0])


# ----------------------------------------------------------------------------------------- writers


def varint(value: int) -> bytes:
    value &= _MASK64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def varint_field(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def bytes_field(number: int, value: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(value)) + value


def double_field(number: int, value: float) -> bytes:
    return tag(number, FIXED64) + struct.pack("<d", value)
