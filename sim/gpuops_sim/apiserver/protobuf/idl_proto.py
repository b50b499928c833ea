"""A strict reader of the `generated.proto` files go-to-protobuf writes: the wire half of the table's facts (field
numbers, labels and types). It accepts only what the generator writes, so that a format change upstream stops the
derivation instead of yielding a wrong table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .derive_common import DeriveError


@dataclass(frozen=True)
class ProtoField:
    """One field line of a message, type still as written (resolved later against the imports)."""

    number: int
    name: str
    label: str  # o, r or m
    type: str  # as written; for a map the value type
    where: str


@dataclass
class ProtoMessage:
    """A top-level message with its fields in file order."""

    name: str
    fields: list[ProtoField]
    where: str


@dataclass
class ProtoFile:
    """One generated.proto, keyed by the path other files import it by."""

    import_path: str
    package: str
    go_package: str
    imports: list[str]
    messages: dict[str, ProtoMessage]


_PROTO_LINES: dict[str, re.Pattern[str]] = {
    "syntax": re.compile(r'syntax = "proto2";'),
    "package": re.compile(r"package ([A-Za-z_][\w.]*);"),
    "import": re.compile(r'import "([^"]+)";'),
    "go_package": re.compile(r'option go_package = "([^"]+)";'),
    "message": re.compile(r"message ([A-Za-z_]\w*) \{"),
    "field": re.compile(r"(optional|repeated) (\.?[A-Za-z_][\w.]*) ([A-Za-z_]\w*) = ([0-9]+);"),
    "map": re.compile(r"map<([\w.]+), ?(\.?[A-Za-z_][\w.]*)> ([A-Za-z_]\w*) = ([0-9]+);"),
    "end": re.compile(r"\}"),
}


def _proto_statements(text: str, where: str) -> Iterator[tuple[str, re.Match[str], str]]:
    """Yields (kind, match, file:line) for each meaningful line; comments and blank lines are skipped, anything the
    generator does not write (nested types, enums, oneofs, field options, trailing comments) is an error."""
    in_block = False
    for number, raw in enumerate(text.splitlines(), 1):
        line, here = raw.strip(), f"{where}:{number}"
        if in_block:
            in_block = not line.endswith("*/")
            continue
        if not line or line.startswith("//"):
            continue
        if line.startswith("/*"):
            in_block = not line.endswith("*/") or line == "/*"
            continue
        for kind, pattern in _PROTO_LINES.items():
            match = pattern.fullmatch(line)
            if match:
                yield kind, match, here
                break
        else:
            raise DeriveError(f"{here}: unexpected line in generated.proto: {line!r}")
    if in_block:
        raise DeriveError(f"{where}: unterminated block comment")


def parse_proto(text: str, import_path: str) -> ProtoFile:
    """Parses one machine-written generated.proto strictly (see `_proto_statements`)."""
    result = ProtoFile(import_path, "", "", [], {})
    current: ProtoMessage | None = None
    seen_syntax = False
    for kind, match, here in _proto_statements(text, import_path):
        if kind == "message":
            if current is not None:
                raise DeriveError(f"{here}: nested message {match[1]}")
            if match[1] in result.messages:
                raise DeriveError(f"{here}: message {match[1]} declared twice")
            current = result.messages[match[1]] = ProtoMessage(match[1], [], here)
        elif kind == "end":
            if current is None:
                raise DeriveError(f"{here}: '}}' outside a message")
            current = None
        elif kind in ("field", "map"):
            if current is None:
                raise DeriveError(f"{here}: field outside a message")
            _add_proto_field(current, kind, match, here)
        elif current is not None:
            raise DeriveError(f"{here}: {kind} statement inside message {current.name}")
        elif kind == "syntax":
            seen_syntax = True
        else:
            _set_proto_header(result, kind, match[1], here)
    if current is not None or not seen_syntax or not result.package or not result.go_package:
        raise DeriveError(f"{import_path}: unterminated message, or syntax/package/go_package missing")
    return result


def _set_proto_header(result: ProtoFile, kind: str, value: str, here: str) -> None:
    """Records package, go_package or an import; a second package or go_package is an error."""
    if kind == "import":
        result.imports.append(value)
    elif kind == "package" and not result.package:
        result.package = value
    elif kind == "go_package" and not result.go_package:
        result.go_package = value
    else:
        raise DeriveError(f"{here}: repeated {kind} statement")


def _add_proto_field(message: ProtoMessage, kind: str, match: re.Match[str], here: str) -> None:
    """Appends a field; duplicate numbers or names, and map keys other than string, fail."""
    if kind == "map":
        if match[1] != "string":
            raise DeriveError(f"{here}: map key type {match[1]} (only string keys are supported)")
        item = ProtoField(int(match[4]), match[3], "m", match[2], here)
    else:
        item = ProtoField(int(match[4]), match[3], "o" if match[1] == "optional" else "r", match[2], here)
    if item.number < 1 or any(f.number == item.number or f.name == item.name for f in message.fields):
        raise DeriveError(f"{here}: field number {item.number} or name {item.name} is invalid or repeated")
    message.fields.append(item)


def go_path_of_proto_package(package: str) -> str:
    """The Go import path go-to-protobuf derives a proto package from (k8s.io.api.core.v1 -> k8s.io/api/core/v1);
    the derivation checks it against go_package so that check-binary may rely on it."""
    if not package.startswith("k8s.io."):
        raise DeriveError(f"proto package {package} is not under k8s.io")
    return "k8s.io/" + package[len("k8s.io."):].replace(".", "/").replace("_", "-")
