"""Kubernetes' protobuf wire format as data: field numbers, wire types and the JSON facts of the Go types.

The table (`k8s_1_37.json`) is derived by `derive.py` from the published IDL of k8s.io/api,
k8s.io/apimachinery and k8s.io/apiextensions-apiserver plus the Go struct tags of the same packages, because
generated.proto alone does not say which JSON name, `omitempty` or inline embedding a field has. The codec
reads it here; nothing else in the emulator knows a field number.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any, NamedTuple

TABLE_FILE = "k8s_1_37.json"

SCALARS = frozenset({"string", "bool", "int32", "int64", "bytes", "double"})
META = "k8s.io.apimachinery.pkg.apis.meta.v1"


class Field(NamedTuple):
    """One field of a message, in Go declaration order (the order encoding/json prints)."""

    number: int
    proto_name: str
    json_name: str  # "" for an inline embedding, "-" for a field JSON never shows
    label: str  # "o" optional, "r" repeated, "m" map (string keys; `type` is the value type)
    type: str  # a scalar name from SCALARS or a fully qualified message name
    pointer: bool
    omitempty: bool
    omitzero: bool
    inline: bool
    value_struct: bool  # a non-pointer struct: encoding/json prints it even under omitempty

    @property
    def is_message(self) -> bool:
        return self.type not in SCALARS


class Message(NamedTuple):
    name: str
    fields: tuple[Field, ...]  # Go order
    by_number: dict[int, Field]
    by_json: dict[str, Field]  # JSON name -> field (inline fields excluded)
    inline: tuple[Field, ...]


class Table:
    """The loaded table: messages by fully qualified name, and which proto package serves a group/version."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.describes: str = data.get("describes", "")
        self.group_versions: dict[str, str] = dict(data["groupVersions"])
        self.custom: frozenset[str] = frozenset(data.get("custom", ()))
        self.messages: dict[str, Message] = {name: _message(name, rows) for name, rows in data["messages"].items()}

    def message(self, name: str) -> Message:
        return self.messages[name]

    def message_for(self, api_version: str, kind: str) -> Message | None:
        """The message of `kind` in `api_version`; meta.k8s.io kinds (DeleteOptions, Status, the options and
        WatchEvent) are registered in every group/version, as the apiserver's scheme registers them."""
        package = self.group_versions.get(api_version)
        if package is not None and f"{package}.{kind}" in self.messages:
            return self.messages[f"{package}.{kind}"]
        return self.messages.get(f"{META}.{kind}")


def _message(name: str, rows: list[list[Any]]) -> Message:
    fields = tuple(_field(row) for row in rows)
    return Message(
        name=name,
        fields=fields,
        by_number={f.number: f for f in fields},
        by_json={f.json_name: f for f in fields if not f.inline and f.json_name not in ("", "-")},
        inline=tuple(f for f in fields if f.inline),
    )


def _field(row: list[Any]) -> Field:
    number, proto_name, json_name, label, type_, flags = row
    return Field(
        number=int(number),
        proto_name=str(proto_name),
        json_name=str(json_name),
        label=str(label),
        type=str(type_),
        pointer="p" in flags,
        omitempty="e" in flags,
        omitzero="z" in flags,
        inline="i" in flags,
        value_struct="v" in flags,
    )


@functools.cache
def table() -> Table:
    """The table shipped with the package (loaded once)."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return Table(json.loads(text))
