"""Checks the table against the struct tags a Go binary (kubectl) was built with: a second, independent witness of
the version, since the source trees the table is derived from are a snapshot near the release rather than its tag."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .derive_common import GOGO_WIRE, DeriveError
from .idl_go import parse_protobuf_tag
from .idl_proto import go_path_of_proto_package

_BINARY_TAG = re.compile(rb'protobuf:"([^"\x00-\x1f]*)"')
_BINARY_FULL_TAG = re.compile(rb'json:"([^"\x00-\x1f]*)"((?: [A-Za-z]\w*:"[^"\x00-\x1f]*")*) '
                              rb'protobuf:"([^"\x00-\x1f]*)"')
# Go's runtime type names: "*v1.PodSpec" (package name, not path); a type the linker dropped has none
_BINARY_TYPE_NAME = re.compile(rb"\*([a-z]\w*)\.([A-Za-z_]\w*)")
TagKey = tuple[int, str | None]  # (number, name)


@dataclass
class BinaryTags:
    """What a Go binary keeps of struct tags and type names, for matching without knowing which struct is which."""

    wires: dict[TagKey, set[str]] = field(default_factory=dict)  # protobuf tags: (number, name) -> wire words
    json: dict[TagKey, set[str]] = field(default_factory=dict)  # json tags written beside a protobuf tag
    type_names: set[str] = field(default_factory=set)  # "v1.PodSpec"


def read_binary(data: bytes) -> BinaryTags:
    """Collects the protobuf and json struct tags and the type names of a Go binary (kept for reflection)."""
    tags = BinaryTags()
    for match in _BINARY_TAG.finditer(data):
        try:
            tag = parse_protobuf_tag(match[1].decode("utf-8", "replace"), "binary")
        except DeriveError:
            continue  # `protobuf:"-"` and the like
        tags.wires.setdefault((tag.number, tag.name), set()).add(tag.wire)
    for match in _BINARY_FULL_TAG.finditer(data):
        try:
            tag = parse_protobuf_tag(match[3].decode("utf-8", "replace"), "binary")
        except DeriveError:
            continue
        tags.json.setdefault((tag.number, tag.name), set()).add(match[1].decode("utf-8", "replace"))
    tags.type_names = {f"{m[1].decode()}.{m[2].decode()}" for m in _BINARY_TYPE_NAME.finditer(data)}
    return tags


@dataclass
class BinaryReport:
    """What check-binary found; `missing` and `json_mismatched` make it fail, the other lists are information."""

    packages_checked: list[str] = field(default_factory=list)
    packages_skipped: dict[str, str] = field(default_factory=dict)
    messages_checked: int = 0
    messages_unlinked: list[str] = field(default_factory=list)
    fields_checked: int = 0
    missing: list[str] = field(default_factory=list)
    wire_differs: list[str] = field(default_factory=list)
    nameless: list[str] = field(default_factory=list)
    custom_untagged: list[str] = field(default_factory=list)
    json_checked: int = 0
    json_mismatched: list[str] = field(default_factory=list)
    json_unwitnessed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.json_mismatched


def _json_tag_of(row: Sequence[Any]) -> tuple[str, bool, bool]:
    """(name, omitempty, omitzero) that the Go json tag behind a table row must have had."""
    name = "" if "i" in row[5] else row[2]
    return name, "e" in row[5], "z" in row[5]


def _json_witnessed(row: Sequence[Any], tags: set[str]) -> bool:
    """Whether one of the binary's json tags beside this protobuf tag gives the row's name and options."""
    for text in tags:
        name, _, rest = text.partition(",")
        options = set(rest.split(",")) if rest else set()
        if (name, "omitempty" in options, "omitzero" in options) == _json_tag_of(row):
            return True
    return False


def check_binary(table: Mapping[str, Any], data: bytes) -> BinaryReport:
    """Checks the table's fields against the struct tags of a Go binary. A package counts as linked when its import
    path is in the binary's function names, a message when its Go type name is (the linker drops unused types);
    the rest is skipped and named. Tags carry no struct name, so a match means "some linked struct has it"."""
    tags = read_binary(data)
    report = BinaryReport()
    for fq, rows in table["messages"].items():
        package, name = fq.rsplit(".", 1)
        go_path = go_path_of_proto_package(package)
        if package not in report.packages_checked and package not in report.packages_skipped:
            if (go_path + ".").encode() in data:
                report.packages_checked.append(package)
            else:
                report.packages_skipped[package] = f"Go package {go_path} is not among the binary's symbols"
        if package in report.packages_skipped:
            continue
        if f"{go_path.rsplit('/', 1)[-1]}.{name}" not in tags.type_names:
            report.messages_unlinked.append(fq)
            continue
        report.messages_checked += 1
        for row in rows:
            _check_row(report, tags, f"{fq}.{row[1]} = {row[0]}", row, fq in table["custom"])
    return report


def _check_row(report: BinaryReport, tags: BinaryTags, where: str, row: Sequence[Any], custom: bool) -> None:
    """One field: its (number, name) must be a tag, with the proto's wire word or a reported other one; the json
    tag beside it must give the table's JSON name and options (not for custom types, which are hand-coded)."""
    key: TagKey = (row[0], row[1])
    wire = GOGO_WIRE.get(row[4], "bytes")
    wires = tags.wires.get(key)
    if wires is None and "i" in row[5] and (row[0], None) in tags.wires:
        key, wires = (row[0], None), tags.wires[row[0], None]
        report.nameless.append(where)
    if wires is None:
        (report.custom_untagged if custom else report.missing).append(where)
        return
    report.fields_checked += 1
    if wire not in wires:
        report.wire_differs.append(f"{where}: proto {row[4]} ({wire}), Go tag {'/'.join(sorted(wires))}")
    if custom:
        return
    report.json_checked += 1
    if key not in tags.json:
        report.json_unwitnessed.append(where)
    elif not _json_witnessed(row, tags.json[key]):
        report.json_mismatched.append(f"{where}: table {_json_tag_of(row)}, binary {sorted(tags.json[key])}")
