"""Typed settings as flags (gpuops/kube/settings.py) and the controller registry: every controller's defaults
live in its settings Struct only, every flag parses back to the value it shows, bounds refuse with the flag's
name, and a shared flag reaches every controller that declares it."""

from __future__ import annotations

import argparse
from typing import Annotated, Any

import msgspec
import pytest
from example_controller import CONTROLLER as EXAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops import cli
from gpuops.controllers.registry import CONTROLLERS
from gpuops.kube.manager import ManagerOptions
from gpuops.kube.registry import ControllerRegistry
from gpuops.kube.settings import FlagField, add_flags, flag, flag_fields, from_args


def _parser(registry: ControllerRegistry) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, ManagerOptions, prefix="")
    registry.add_flags(parser)
    return parser


def test_no_flags_give_every_struct_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUOPS_SECRET_NAMESPACES", raising=False)
    registry = ControllerRegistry(CONTROLLERS)
    args = _parser(registry).parse_args([])
    for name, got in registry.settings_from_args(args).items():
        assert got == registry.definition(name).settings(), name
    assert from_args(args, ManagerOptions, prefix="") == ManagerOptions()


def test_the_operator_flags_are_the_documented_ones() -> None:
    """The Deployment (manifests/manager) and the README name these; a renamed field must not rename a flag."""
    options = {f.option for d in CONTROLLERS for f in flag_fields(d.settings, d.prefix)}
    options |= {f.option for f in flag_fields(ManagerOptions, "")}
    assert options == {
        "--namespace", "--leader-elect", "--leader-elect-lease-name", "--leader-elect-namespace",
        "--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period",
        "--metrics-bind-address", "--metrics-secure", "--metrics-cert-dir", "--health-probe-bind-address",
        "--graceful-shutdown-timeout", "--budget-status-refresh", "--budget-max-concurrent-reconciles",
        "--autoprovision-min-warm-gpus", "--autoprovision-max-concurrent-power-offs", "--secret-namespaces",
        "--spotpool-resync", "--spotpool-call-timeout", "--mig-advertise-timeout", "--mig-webhook-port",
        "--mig-webhook-host", "--mig-webhook-service", "--mig-webhook-namespace", "--mig-webhook-cert-dir",
        "--budget-webhook-port", "--budget-webhook-host", "--budget-webhook-service", "--budget-webhook-namespace",
        "--budget-webhook-cert-dir",
    }


def _all_flags() -> list[FlagField]:
    fields = {f.option: f for d in CONTROLLERS for f in flag_fields(d.settings, d.prefix)}
    fields.update({f.option: f for f in flag_fields(ManagerOptions, "")})
    return [f for _, f in sorted(fields.items())]


def _value_for(f: FlagField) -> st.SearchStrategy[Any]:
    """Values the field's annotation admits (bounds included), from msgspec's own JSON schema of it."""
    schema = msgspec.json.schema(f.annotation)
    schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"), schema)
    if f.base is bool:
        return st.just(True)
    if f.base is int:
        return st.integers(min_value=int(schema.get("minimum", -10**6)), max_value=int(schema.get("maximum", 10**6)))
    if f.base is float:
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1e6))
        return st.floats(min_value=low, max_value=1e9, exclude_min="exclusiveMinimum" in schema,
                         allow_nan=False, allow_infinity=False)
    if f.base is tuple:
        return st.lists(st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True), max_size=4, unique=True).map(tuple)
    if f.option.endswith("-bind-address"):
        return st.sampled_from(["0", ":8080", "127.0.0.1:0", "[::1]:9000"])
    return st.from_regex(r"[a-z][-a-z0-9]{0,20}", fullmatch=True)


def _text(value: Any) -> list[str]:
    return [] if value is True else [",".join(value) if isinstance(value, tuple) else repr(value)
                                     if isinstance(value, float) else str(value)]


_PARSER = _parser(ControllerRegistry(CONTROLLERS))


@settings(max_examples=50)
@given(st.data())
def test_every_flag_parses_back_to_the_value_it_was_given(data: st.DataObject) -> None:
    argv, expected = [], {}
    for f in _all_flags():
        value = data.draw(_value_for(f), label=f.option)
        argv += [f.option, *_text(value)]
        expected[f.dest] = value
    args = _PARSER.parse_args(argv)
    assert {dest: getattr(args, dest) for dest in expected} == expected


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget-max-concurrent-reconciles", "0"], "expected `int` >= 1"),
    (["--budget-status-refresh", "-1"], "expected `float` >= 0"),
    (["--spotpool-call-timeout", "0"], "expected `float` > 0"),
    (["--mig-webhook-port", "70000"], "expected `int` <= 65535"),
    (["--autoprovision-min-warm-gpus", "two"], "expected a whole number"),
    (["--mig-advertise-timeout", "inf"], "expected a finite number"),
    (["--metrics-bind-address", "8080"], "expected [host]:port"),
    (["--secret-namespaces", "Team_A"], "namespace names: lowercase letters, digits and '-'"),
])
def test_a_refused_value_names_the_flag_and_the_bound(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError) as err:
        _parser(ControllerRegistry(CONTROLLERS)).parse_args(argv)
    assert argv[0] in str(err.value) and message in str(err.value)


def test_a_shared_flag_is_added_once_and_reaches_every_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_SECRET_NAMESPACES", "team-a, team-b")
    registry = ControllerRegistry(CONTROLLERS)
    parser = _parser(registry)
    assert sum("--secret-namespaces" in a.option_strings for a in parser._actions) == 1
    settings = registry.settings_from_args(parser.parse_args([]))
    assert settings["autoprovision"].secret_namespaces == settings["spotpool"].secret_namespaces == ("team-a", "team-b")
    settings = registry.settings_from_args(parser.parse_args(["--secret-namespaces", "ml"]))
    assert settings["spotpool"].secret_namespaces == ("ml",)


def test_a_flag_of_an_unsupported_type_is_refused_when_declared() -> None:
    class Bad(msgspec.Struct):
        mapping: Annotated[dict[str, int], flag("no", metavar="X")] = msgspec.field(default_factory=dict)

    with pytest.raises(TypeError, match="cannot be of type"):
        list(flag_fields(Bad, "bad"))


def test_a_fifth_controller_needs_only_its_definition(capsys: pytest.CaptureFixture[str]) -> None:
    """The example controller (tests/kube/example_controller.py) added to the product's list: `gpuops run`
    lists it, offers its flags, and its settings come from them."""
    registry = ControllerRegistry([*CONTROLLERS, EXAMPLE])
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"], controllers=registry)
    out = capsys.readouterr().out
    assert "--replicator-max-concurrent-reconciles N" in out and "replicator" in out
    args = cli.build_parser(registry).parse_args(["run", "--controllers", "replicator",
                                                  "--replicator-max-concurrent-reconciles", "3"])
    assert args.controllers == ["replicator"]
    assert registry.settings_from_args(args)["replicator"] == EXAMPLE.settings(max_concurrent_reconciles=3)
