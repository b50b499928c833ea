"""Typed settings that are also command-line flags.

A component declares its settings once, as a msgspec Struct whose field defaults are the defaults. A field
annotated with `flag(...)` metadata is also a flag of the command that runs the component: its name, help,
metavar, bounds and (optionally) an environment variable come from the annotation, and the parsed value is
checked against the same bounds msgspec checks when the Struct is decoded. Nothing else repeats a default or
a flag name, so adding a setting touches one line.

    class Settings(msgspec.Struct, frozen=True, kw_only=True):
        min_warm_gpus: Annotated[int, flag("GPUs kept warm", metavar="N", ge=0)] = 0

    add_flags(parser, Settings, prefix="autoprovision")      # --autoprovision-min-warm-gpus N
    settings = from_args(args, Settings, prefix="autoprovision")

A flag declared `shared=True` has no prefix (`--secret-namespaces`); several Structs may declare the same
shared flag (same name and type) and all get its value.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import msgspec

__all__ = ["FlagField", "add_flags", "flag", "flag_fields", "from_args"]

_FLAG = "gpuops.flag"


def flag(help: str, *, metavar: str | None = None, name: str | None = None, shared: bool = False,
         env: str | None = None, ge: float | None = None, gt: float | None = None, le: float | None = None,
         pattern: str | None = None, hint: str | None = None,
         check: Callable[[Any], object] | None = None) -> msgspec.Meta:
    """Metadata making a Struct field a flag. `name` overrides the field's name in the flag (without prefix);
    `env` names an environment variable whose value, when set, replaces the default; `check` is called with
    the parsed value and raises ValueError for one the bounds cannot express; `hint` follows any refusal."""
    extra = {_FLAG: {"metavar": metavar, "name": name, "shared": shared, "env": env, "hint": hint, "check": check}}
    bounds: dict[str, Any] = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "pattern": pattern}.items()
                              if v is not None}
    return msgspec.Meta(description=help, extra=extra, **bounds)


@dataclass(frozen=True)
class FlagField:
    """One flag of a Struct: where its value goes and how it is parsed."""

    field: str
    option: str
    dest: str
    annotation: Any
    base: type
    help: str
    metavar: str | None
    env: str | None
    default: Any
    hint: str | None = None
    check: Callable[[Any], object] | None = None

    def parse(self, text: str) -> Any:
        """The flag's value from its text, checked against the field's bounds; ArgumentTypeError names them."""
        try:
            value = msgspec.convert(_parse_text(self.base, text), self.annotation)
            if self.check is not None:
                self.check(value)
            return value
        except (ValueError, msgspec.ValidationError) as e:
            hint = f" ({self.hint})" if self.hint else ""
            raise argparse.ArgumentTypeError(f"{text!r}: {_reason(e)}{hint}") from None


def _reason(e: Exception) -> str:
    text = str(e)
    return text[0].lower() + text[1:] if text else "invalid value"


def _parse_text(base: type, text: str) -> Any:
    if base is bool:
        raise ValueError("a switch takes no value")
    if base is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected a whole number") from None
    if base is float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("expected a number (e.g. 60 or 0.5)") from None
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        return value
    if base is tuple:
        return tuple(dict.fromkeys(part for part in text.replace(",", " ").split()))
    return text


def _unwrap(annotation: Any) -> tuple[Any, dict[str, Any] | None]:
    """(the annotation without our metadata, our flag metadata or None)."""
    if get_origin(annotation) is not Annotated:
        return annotation, None
    _inner, *metas = get_args(annotation)
    found = next((m.extra[_FLAG] for m in metas if isinstance(m, msgspec.Meta) and m.extra and _FLAG in m.extra), None)
    return annotation, found


def _base_type(annotation: Any) -> type:
    """int, float, bool, str or tuple: what the flag's text is parsed as (Optional[X] parses as X)."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is tuple:
        return tuple
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:  # X | None
        return _base_type(args[0])
    if annotation in (int, float, bool, str):
        return annotation  # type: ignore[no-any-return]
    raise TypeError(f"a flag cannot be of type {annotation!r}")


def flag_fields(struct: type[msgspec.Struct], prefix: str) -> Iterator[FlagField]:
    """The fields of `struct` that are flags, in declaration order."""
    hints = get_type_hints(struct, include_extras=True)
    for info in msgspec.structs.fields(struct):
        annotation, meta = _unwrap(hints[info.name])
        if meta is None:
            continue
        name = (meta["name"] or info.name).replace("_", "-")
        option = f"--{name}" if meta["shared"] or not prefix else f"--{prefix}-{name}"
        default = info.default_factory() if info.default is msgspec.NODEFAULT else info.default
        yield FlagField(info.name, option, option[2:].replace("-", "_"), annotation, _base_type(annotation),
                        _description(annotation), meta["metavar"], meta["env"], default, meta["hint"], meta["check"])


def _description(annotation: Any) -> str:
    for m in get_args(annotation)[1:]:
        if isinstance(m, msgspec.Meta) and m.description:
            return m.description
    return ""


def _help(f: FlagField) -> str:
    """The field's description with its default: "... (default: 60.0)", or "...; default: 60.0)" when the
    description already ends in a parenthesis."""
    if f.env:
        default = f"${f.env}, else {_shown(f.default)}" if _shown(f.default) else f"${f.env} if set"
    else:
        default = _shown(f.default) if f.base is not bool else ""
    text = f.help
    if default:
        text = f"{text[:-1]}; default: {default})" if text.endswith(")") else f"{text} (default: {default})"
    return text.replace("%", "%%")


def _shown(value: Any) -> str:
    if value is None or value == () or value == "":
        return ""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def add_flags(parser: argparse.ArgumentParser, struct: type[msgspec.Struct], prefix: str) -> None:
    """Add the flags of `struct` to `parser`; a shared flag another Struct already added is left as it is."""
    taken = {o for action in parser._actions for o in action.option_strings}
    for f in flag_fields(struct, prefix):
        if f.option in taken:
            continue
        default = f.default
        if f.env and os.environ.get(f.env):
            default = os.environ[f.env]  # argparse parses a string default with `type`, reporting errors as usual
        if f.base is bool:
            parser.add_argument(f.option, dest=f.dest, action="store_true", default=default, help=_help(f))
        else:
            parser.add_argument(f.option, dest=f.dest, type=_typed(f), default=default, metavar=f.metavar,
                                help=_help(f))


def _typed(f: FlagField) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return f.parse(text)

    parse.__name__ = f.option  # argparse names the type in its error message
    return parse


def from_args(args: argparse.Namespace, struct: type[msgspec.Struct], prefix: str, **others: Any) -> Any:
    """An instance of `struct` from parsed flags; fields that are not flags keep their defaults unless given."""
    values = {f.field: getattr(args, f.dest) for f in flag_fields(struct, prefix) if hasattr(args, f.dest)}
    return struct(**values, **others)
