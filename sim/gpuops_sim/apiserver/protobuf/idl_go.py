"""A reader of Go source, just enough for the derivation: type declarations, struct fields with their tags, JSON
methods, imports and group names of one package, as the target build (linux/amd64) would compile it. Go's struct
tags are the JSON half of the table's facts (names, omitempty, inlining, pointers), which the IDL lacks."""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .derive_common import DeriveError

# build constraints are evaluated for the platform kubectl ships most (linux/amd64) and a current Go toolchain
GO_TARGET_TAGS = frozenset({"linux", "amd64", "unix", "gc"})  # release kubectl: static, no cgo
GOOS = frozenset({"aix", "android", "darwin", "dragonfly", "freebsd", "hurd", "illumos", "ios", "js", "linux",
                  "nacl", "netbsd", "openbsd", "plan9", "solaris", "wasip1", "windows", "zos"})
GOARCH = frozenset({"386", "amd64", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le", "ppc64",
                    "ppc64le", "riscv64", "s390x", "wasm"})


@dataclass
class GoField:
    """A struct field as declared: for an embedded field, name is the type's name and type the full text."""

    name: str
    type: str
    embedded: bool
    tags: dict[str, str]
    where: str


@dataclass
class GoPackage:
    """What the derivation needs of one Go package: its type declarations and the facts around them."""

    import_path: str
    name: str = ""
    structs: dict[str, list[GoField]] = field(default_factory=dict)
    others: dict[str, str] = field(default_factory=dict)  # named types that are not structs: name -> type text
    json_methods: set[str] = field(default_factory=set)  # types with their own MarshalJSON or UnmarshalJSON
    imports: dict[str, dict[str, str]] = field(default_factory=dict)  # file -> local name -> import path
    type_files: dict[str, str] = field(default_factory=dict)  # type name -> file declaring it
    group_marker: str | None = None  # from `+groupName=`
    group_const: str | None = None  # from `GroupName = "..."`


_GO_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/|`[^`]*`|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'", re.S)
_GO_SCAN = re.compile(r"`[^`]*`|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|[(){}\[\]\n;]")
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_GO_METHOD = re.compile(r"^func\s*\(\s*(?:\w+\s+)?\*?\s*(\w+)\s*\)\s*(?:Marshal|Unmarshal)JSON\s*\(", re.M)
GO_EMBEDDED = re.compile(r"\*?(?:([A-Za-z_]\w*)\.)?([A-Za-z_]\w*)")
_GO_NAMED = re.compile(r"([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+(\S.*)", re.S)
_GO_TAG_PAIR = re.compile(r'([^\s:"]+):"((?:[^"\\]|\\.)*)"')


def strip_go_comments(text: str) -> str:
    """Blanks comments, keeping string literals and line breaks, so scanning for braces cannot be fooled."""

    def blank(match: re.Match[str]) -> str:
        token = match.group()
        return re.sub(r"[^\n]", " ", token) if token.startswith("/") else token

    return _GO_COMMENTS.sub(blank, text)


def _statement_end(text: str, pos: int, limit: int) -> int:
    """Where the statement starting at pos ends: a newline or ';' outside brackets, or an unmatched closer."""
    depth = 0
    for match in _GO_SCAN.finditer(text, pos, limit):
        token = match.group()
        if token in _OPENERS:
            depth += 1
        elif token in ")]}":
            depth -= 1
            if depth < 0:
                return match.start()
        elif token in "\n;" and depth == 0:
            return match.start()
    return limit


def _statements(text: str, start: int, end: int) -> Iterator[tuple[int, str]]:
    """The non-empty statements between start and end, with their offsets."""
    pos = start
    while pos < end:
        stop = _statement_end(text, pos, end)
        chunk = text[pos:stop]
        if chunk.strip():
            yield pos + len(chunk) - len(chunk.lstrip()), chunk.strip()
        pos = stop + 1


def _closing(text: str, opener: int) -> int:
    """Offset of the bracket matching the one at `opener`."""
    stop = _statement_end(text, opener + 1, len(text))
    while stop < len(text) and text[stop] in "\n;":
        stop = _statement_end(text, stop + 1, len(text))
    if stop >= len(text) or text[stop] != _OPENERS[text[opener]]:
        raise DeriveError(f"unbalanced {text[opener]!r} at offset {opener}")
    return stop


def build_constraint_holds(expr: str) -> bool:
    """Evaluates a `//go:build` expression for GO_TARGET_TAGS; every go1.N release tag counts as satisfied."""
    tokens = re.findall(r"&&|\|\||[()!]|[\w.]+|\S", expr)
    pos = 0

    def atom() -> bool:
        nonlocal pos
        token = tokens[pos] if pos < len(tokens) else ""
        pos += 1
        if token == "!":
            return not atom()
        if token == "(":
            value = disjunction()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise DeriveError(f"bad build constraint {expr!r}")
            pos += 1
            return value
        if not re.fullmatch(r"[\w.]+", token):
            raise DeriveError(f"bad build constraint {expr!r}")
        return token in GO_TARGET_TAGS or re.fullmatch(r"go1\.[0-9]+", token) is not None

    def conjunction() -> bool:
        nonlocal pos
        values = [atom()]
        while pos < len(tokens) and tokens[pos] == "&&":
            pos += 1
            values.append(atom())
        return all(values)

    def disjunction() -> bool:
        nonlocal pos
        values = [conjunction()]
        while pos < len(tokens) and tokens[pos] == "||":
            pos += 1
            values.append(conjunction())
        return any(values)

    value = disjunction()
    if pos != len(tokens):
        raise DeriveError(f"bad build constraint {expr!r}")
    return value


def go_file_included(path: Path, text: str) -> bool:
    """Whether the Go build would compile this non-test file on the target: file-name suffixes and `//go:build`."""
    parts = path.stem.split("_")
    if path.stem.endswith("_test") or path.name.startswith(("_", ".")):
        return False
    if len(parts) > 2 and parts[-2] in GOOS and parts[-1] in GOARCH:
        return parts[-2] in GO_TARGET_TAGS and parts[-1] in GO_TARGET_TAGS
    if len(parts) > 1 and (parts[-1] in GOOS or parts[-1] in GOARCH):
        return parts[-1] in GO_TARGET_TAGS
    header = text.split("\npackage ", 1)[0]
    match = re.search(r"^//go:build (.+)$", header, re.M)
    return match is None or build_constraint_holds(match[1])


def parse_go_tags(raw: str, where: str) -> dict[str, str]:
    """A struct tag as reflect.StructTag reads it: space-separated key:"value" pairs; anything else fails."""
    body = raw[1:-1] if raw.startswith("`") else json.loads(raw)
    tags: dict[str, str] = {}
    pos = 0
    while pos < len(body):
        if body[pos] == " ":
            pos += 1
            continue
        match = _GO_TAG_PAIR.match(body, pos)
        if match is None or match[1] in tags:
            raise DeriveError(f"{where}: malformed struct tag {raw}")
        tags[match[1]] = json.loads(f'"{match[2]}"')
        pos = match.end()
    return tags


def _parse_go_field(statement: str, where: str) -> list[GoField]:
    """One struct field statement: `Name, Other Type "tag"` or an embedded `pkg.Type "tag"`."""
    tag_match = re.search(r"(`[^`]*`|\"(?:[^\"\\]|\\.)*\")\s*$", statement)
    tags = parse_go_tags(tag_match[1], where) if tag_match else {}
    head = statement[: tag_match.start()].strip() if tag_match else statement
    embedded = GO_EMBEDDED.fullmatch(head)
    if embedded:
        return [GoField(embedded[2], head, True, tags, where)]
    named = _GO_NAMED.fullmatch(head)
    if named is None:
        raise DeriveError(f"{where}: cannot read struct field {statement!r}")
    names = [name.strip() for name in named[1].split(",")]
    return [GoField(name, named[2].strip(), False, tags, where) for name in names]


class _LineIndex:
    """Offset -> line number, for error messages that name file:line."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


def _parse_type_spec(pkg: GoPackage, text: str, start: int, spec: str, where: Callable[[int], str]) -> None:
    """One `Name Type` spec of a type declaration: structs get their fields read, other types their text."""
    match = re.match(r"([A-Za-z_]\w*)\s*(=\s*)?", spec)
    if match is None:
        raise DeriveError(f"{where(start)}: cannot read type declaration {spec[:60]!r}")
    name, rest = match[1], spec[match.end():]
    if name in pkg.structs or name in pkg.others:
        raise DeriveError(f"{where(start)}: type {name} declared twice in {pkg.import_path}")
    if match[2] or not re.match(r"struct\s*\{", rest):
        pkg.others[name] = ("= " if match[2] else "") + " ".join(rest.split())  # an alias keeps its '='
        return
    opener = text.index("{", start + match.end())
    closer = _closing(text, opener)
    fields: list[GoField] = []
    for offset, statement in _statements(text, opener + 1, closer):
        fields.extend(_parse_go_field(statement, where(offset)))
    pkg.structs[name] = fields


def _parse_go_imports(text: str) -> dict[str, str]:
    """Local package name -> import path for one file (the last path element names an unaliased import)."""
    specs: list[str] = []
    for match in re.finditer(r"^import\s*(\((.*?)\)|[^\n]*)", text, re.M | re.S):
        specs.extend((match[2] or match[1]).splitlines())
    imports: dict[str, str] = {}
    for spec in specs:
        found = re.fullmatch(r'\s*([\w.]+\s+)?"([^"]+)"\s*;?\s*', spec)
        if found:
            alias = (found[1] or "").strip() or found[2].rsplit("/", 1)[-1]
            imports[alias] = found[2]
    return imports


def parse_go_file(pkg: GoPackage, path: Path, raw: str) -> None:
    """Adds a file's type declarations, JSON methods, imports and group-name facts to its package."""
    marker = re.search(r"^// ?\+groupName=(\S*)\s*$", raw, re.M)
    if marker:
        if pkg.group_marker is not None and pkg.group_marker != marker[1]:
            raise DeriveError(f"{path}: +groupName={marker[1]}, another file says {pkg.group_marker}")
        pkg.group_marker = marker[1]
    text = strip_go_comments(raw)
    package = re.search(r"^package\s+(\w+)", text, re.M)
    if package is None or (pkg.name and pkg.name != package[1]):
        raise DeriveError(f"{path}: missing or inconsistent package clause")
    pkg.name = package[1]
    const = re.search(r"\bGroupName\s*=\s*\"([^\"]*)\"", text)
    if const:
        pkg.group_const = const[1]
    pkg.json_methods.update(m[1] for m in _GO_METHOD.finditer(text))
    pkg.imports[path.name] = _parse_go_imports(text)
    lines = _LineIndex(text)

    def where(offset: int) -> str:
        return f"{path}:{lines.line(offset)}"

    for match in re.finditer(r"^type\b[ \t]*", text, re.M):
        before = set(pkg.structs) | set(pkg.others)
        if text[match.end()] == "(":
            closer = _closing(text, match.end())
            for offset, spec in _statements(text, match.end() + 1, closer):
                _parse_type_spec(pkg, text, offset, spec, where)
        else:
            stop = _statement_end(text, match.end(), len(text))
            _parse_type_spec(pkg, text, match.end(), text[match.end():stop], where)
        for name in (set(pkg.structs) | set(pkg.others)) - before:
            pkg.type_files[name] = path.name


def load_go_package(directory: Path, import_path: str) -> GoPackage:
    """Parses every non-test .go file the target build compiles in one directory."""
    pkg = GoPackage(import_path)
    files = sorted(directory.glob("*.go"))
    if not files:
        raise DeriveError(f"{directory}: no Go files")
    for path in files:
        raw = path.read_text(encoding="utf-8")
        if go_file_included(path, raw):
            parse_go_file(pkg, path, raw)
    return pkg


@dataclass(frozen=True)
class GoProtoTag:
    """A parsed gogo protobuf struct tag."""

    wire: str
    number: int
    label: str  # opt, rep, req or ""
    name: str | None  # None when the tag leaves the name to the generator


def parse_protobuf_tag(value: str, where: str) -> GoProtoTag:
    """Reads a gogo `protobuf:"wire,number,label,name=...,..."` tag."""
    parts = value.split(",")
    if len(parts) < 2 or not parts[1].isdigit() or not re.fullmatch(r"[a-z0-9]+", parts[0]):
        raise DeriveError(f"{where}: malformed protobuf tag {value!r}")
    names = [part[len("name="):] for part in parts[2:] if part.startswith("name=")]
    labels = [part for part in parts[2:] if part in ("opt", "rep", "req")]
    if len(names) > 1 or len(labels) > 1:
        raise DeriveError(f"{where}: malformed protobuf tag {value!r}")
    return GoProtoTag(parts[0], int(parts[1]), labels[0] if labels else "", names[0] if names else None)
