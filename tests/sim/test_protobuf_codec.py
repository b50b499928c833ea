"""The protobuf codec against properties and an implementation we did not write.

Round trip: every canonical object of every served built-in kind survives encode -> decode unchanged. The
official protobuf runtime (google.protobuf, with message types built from our table) parses every body we
encode, and what it re-serializes decodes to the same object: our varints, lengths, doubles and negative
integers are the wire format, not a private dialect. Garbage never gets past the decoder as anything but a
DecodeError.
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protobuf_objects import message

from gpuops_sim.apiserver.protobuf import DecodeError, decode_object, encode_object
from gpuops_sim.apiserver.protobuf.codec import MAGIC, decode_message, encode_message
from gpuops_sim.apiserver.protobuf.table import table
from gpuops_sim.apiserver.resources import builtin_resources

SERVED = sorted({(r.api_version, r.kind) for r in builtin_resources()}
                | {(r.api_version, r.list_kind) for r in builtin_resources() if not r.create_only}
                | {("v1", "DeleteOptions"), ("v1", "Status"), ("policy/v1", "Eviction"),
                   ("authentication.k8s.io/v1", "TokenRequest"), ("v1", "Binding")})


def _served_message(api_version: str, kind: str) -> str:
    found = table().message_for(api_version, kind)
    assert found is not None, f"the table has no message for {api_version} {kind}"
    return found.name


def test_every_served_kind_has_a_message() -> None:
    for api_version, kind in SERVED:
        assert _served_message(api_version, kind).endswith("." + kind)


@pytest.mark.parametrize(("api_version", "kind"), SERVED, ids=[f"{v}/{k}" for v, k in SERVED])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_round_trip(api_version: str, kind: str, data: st.DataObject) -> None:
    name = _served_message(api_version, kind)
    obj = {"kind": kind, "apiVersion": api_version, **data.draw(message(name, max_depth=3))}
    raw = encode_object(obj)
    assert raw.startswith(MAGIC)
    assert decode_object(raw) == obj


# ------------------------------------------------------------------------------ the official runtime


_PB_TYPES = {"string": 9, "bool": 8, "int32": 5, "int64": 3, "bytes": 12, "double": 1}  # FieldDescriptorProto.Type


def _flat(name: str) -> str:
    return name.replace(".", "_")


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    """Our table as a FileDescriptorProto (maps as repeated key/value entries, which is their wire form)."""
    fd = descriptor_pb2.FileDescriptorProto(name="k8s_table.proto", package="k8s", syntax="proto2")
    for name, msg in table().messages.items():
        out = fd.message_type.add(name=_flat(name))
        for f in msg.fields:
            field = out.field.add(name=f"f{f.number}", number=f.number)
            field.label = 3 if f.label in ("r", "m") else 1
            if f.label == "m":
                entry = fd.message_type.add(name=f"{_flat(name)}_Entry{f.number}")
                entry.field.add(name="key", number=1, label=1, type=9)
                value = entry.field.add(name="value", number=2, label=1)
                _set_type(value, f.type)
                field.type, field.type_name = 11, f".k8s.{entry.name}"
            else:
                _set_type(field, f.type)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return pool


def _set_type(field: descriptor_pb2.FieldDescriptorProto, type_: str) -> None:
    if type_ in _PB_TYPES:
        field.type = _PB_TYPES[type_]  # type: ignore[assignment]
    else:
        field.type, field.type_name = 11, f".k8s.{_flat(type_)}"  # type: ignore[assignment]


def _official(name: str) -> Any:
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"k8s.{_flat(name)}"))


OFFICIAL_KINDS = [("v1", "Pod"), ("v1", "ConfigMap"), ("v1", "Secret"), ("apps/v1", "Deployment"),
                  ("apiextensions.k8s.io/v1", "CustomResourceDefinition"), ("v1", "Node"),
                  ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"), ("batch/v1", "Job")]


@pytest.mark.parametrize(("api_version", "kind"), OFFICIAL_KINDS, ids=[k for _, k in OFFICIAL_KINDS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_official_runtime_reads_what_we_write(api_version: str, kind: str, data: st.DataObject) -> None:
    name = _served_message(api_version, kind)
    obj = data.draw(message(name, max_depth=3))
    raw = encode_message(table().message(name), obj)
    parsed = _official(name)()
    parsed.ParseFromString(raw)
    assert len(UnknownFieldSet(parsed)) == 0
    assert decode_message(table().message(name), parsed.SerializeToString()) == obj


def test_negative_integers_are_ten_byte_varints_as_the_official_runtime_writes_them() -> None:
    name = _served_message("v1", "Pod")
    obj = decode_message(table().message(name), b"")
    obj["spec"]["activeDeadlineSeconds"] = -5
    raw = encode_message(table().message(name), obj)
    parsed = _official(name)()
    parsed.ParseFromString(raw)
    assert decode_message(table().message(name), parsed.SerializeToString())["spec"]["activeDeadlineSeconds"] == -5


# ----------------------------------------------------------------------------------------- garbage


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=64))
def test_garbage_is_a_decode_error(body: bytes) -> None:
    for raw in (body, MAGIC + body):
        with contextlib.suppress(DecodeError):
            decode_object(raw, "v1", "Pod")


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_truncated_and_flipped_bodies_are_decode_errors_or_objects(data: st.DataObject) -> None:
    obj = {"kind": "ConfigMap", "apiVersion": "v1", **data.draw(message(_served_message("v1", "ConfigMap")))}
    raw = bytearray(encode_object(obj))
    cut = data.draw(st.integers(len(MAGIC), len(raw)))
    if cut < len(raw):
        raw[cut] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_object(bytes(raw))
    except DecodeError:
        return
    assert isinstance(decoded, dict)
