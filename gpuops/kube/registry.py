"""The controllers a process can run, by name, each with its typed settings.

A `ControllerDefinition` is everything `gpuops run` needs to know of a controller: its name, its settings
Struct (whose `flag(...)` fields become the controller's own command-line flags, see `settings.py`), and its
setup function, given as "module:function" so that a controller nobody selected is never imported (`--help`
stays fast, an unused controller's dependencies need not be installed). `setup(manager, settings)` creates
the controller's informers and controllers and adds them to the manager.

`--controllers` selects among them with kube-controller-manager's syntax ("a,b", "*", "-a").
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from .settings import add_flags, from_args

if TYPE_CHECKING:
    from .manager import Manager

__all__ = ["ControllerDefinition", "ControllerRegistry", "Setup", "UnknownControllers"]

Setup = Callable[["Manager", Any], "Awaitable[None] | None"]


@dataclass(frozen=True)
class ControllerDefinition:
    """A controller as the command line knows it. `flag_prefix` defaults to `name`; `crds` are "module:attr"
    references to the controller's `CustomResource`s, in the order they are installed."""

    name: str
    settings: type[msgspec.Struct]
    setup: str | Setup
    flag_prefix: str = ""
    crds: tuple[str, ...] = ()

    @property
    def prefix(self) -> str:
        return self.flag_prefix or self.name

    def resolve(self) -> Setup:
        if not isinstance(self.setup, str):
            return self.setup
        resolved: Setup = _load(self.setup)
        return resolved

    def custom_resources(self) -> list[Any]:
        """The controller's CustomResources (imported now: its API types)."""
        return [_load(ref) for ref in self.crds]


def _load(reference: str) -> Any:
    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module), attr)


class UnknownControllers(ValueError):
    """`--controllers` named a controller nobody registered."""

    def __init__(self, unknown: list[str], known: list[str]) -> None:
        self.unknown = unknown
        self.known = known
        names = ", ".join(known) if known else "(none: no controller is registered yet)"
        super().__init__(f"unknown controller(s) {', '.join(repr(n) for n in unknown)}; known controllers: {names}")


class ControllerRegistry:
    """Named controller definitions, in the order they run and are listed."""

    def __init__(self, definitions: Iterable[ControllerDefinition] = ()) -> None:
        self._definitions: dict[str, ControllerDefinition] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: ControllerDefinition) -> None:
        name = definition.name
        if not name or "," in name or name.startswith("-") or name == "*":
            raise ValueError(f"controller name {name!r}: must be non-empty, without ',' and not '*' or '-...'")
        if name in self._definitions:
            raise ValueError(f"controller {name!r} is already registered")
        self._definitions[name] = definition

    def names(self) -> list[str]:
        return list(self._definitions)

    def definition(self, name: str) -> ControllerDefinition:
        return self._definitions[name]

    def select(self, spec: str | None) -> list[str]:
        """kube-controller-manager's syntax: "a,b" selects, "*" is every registered controller, "-a" removes
        one; None or "" means "*". Unknown names raise `UnknownControllers`."""
        items = [s.strip() for s in (spec or "*").split(",") if s.strip()]
        unknown = [i.lstrip("-") for i in items if i != "*" and i.lstrip("-") not in self._definitions]
        if unknown:
            raise UnknownControllers(unknown, self.names())
        chosen: dict[str, None] = {}
        for item in items:
            if item == "*":
                chosen.update(dict.fromkeys(self._definitions))
        for item in items:
            if item.startswith("-"):
                chosen.pop(item[1:], None)
            elif item != "*":
                chosen[item] = None
        return [n for n in self._definitions if n in chosen]

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Every registered controller's own flags (`--<prefix>-<setting>`), and their shared ones once."""
        for definition in self._definitions.values():
            add_flags(parser, definition.settings, definition.prefix)

    def settings_from_args(self, args: argparse.Namespace) -> dict[str, msgspec.Struct]:
        """Each controller's settings from parsed flags (defaults for a controller whose flags were not added)."""
        return {name: from_args(args, d.settings, d.prefix) for name, d in self._definitions.items()}

    async def setup(self, manager: Manager, names: Iterable[str],
                    settings: Mapping[str, msgspec.Struct] | None = None) -> None:
        """Run the named controllers' setups, each with its settings (its Struct's defaults if not given)."""
        for name in names:
            definition = self._definitions[name]
            given = (settings or {}).get(name)
            result = definition.resolve()(manager, given if given is not None else definition.settings())
            if inspect.isawaitable(result):
                await result
