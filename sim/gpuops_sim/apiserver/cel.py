"""CEL `x-kubernetes-validations` rules of CRD schemas, evaluated with cel-python.

Rules see `self` (and `oldSelf` for transition rules) typed by the schema as the apiserver types them:
`number` fields are doubles, objects with properties expose only their (escaped) properties, the resource
root exposes apiVersion, kind and metadata.name/generateName. Failures become field causes worded as
upstream words them. Beyond cel-python's standard library this adds what Kubernetes CRDs commonly use:
heterogeneous numeric equality, the strings extension (lowerAscii, upperAscii, trim, replace, split, join,
indexOf, lastIndexOf, substring, charAt), the Kubernetes list library (isSorted, sum, min, max, indexOf,
lastIndexOf), regex find/findAll, quantity()/isQuantity() and optionalOldSelf (hasValue/value/orValue).
"""

from __future__ import annotations

import base64
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import msgspec
import re2  # type: ignore[import-untyped]
from celpy import celtypes
from celpy.evaluation import CELEvalError

from . import schema as _schema
from .errors import Cause

__all__ = ["CompiledRule", "compile_rule", "escape_property", "evaluate_rules", "parse_quantity", "to_cel"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class CompiledRule:
    """A parsed rule ready to run; `uses_old_self` marks transition rules (they need an old value)."""

    source: str
    runner: Any
    uses_old_self: bool


# ------------------------------------------------------------------------------------------------------
# Functions added to cel-python's standard library.


def _err(msg: str) -> CELEvalError:
    return CELEvalError(msg)


def _numeric(v: Any) -> bool:
    return isinstance(v, (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)) and not isinstance(
        v, celtypes.BoolType
    )


def _equal(a: Any, b: Any) -> Any:
    """CEL equality with the cross-type numeric comparison cel-go (and so Kubernetes) has."""
    if isinstance(a, CELEvalError):
        return a
    if isinstance(b, CELEvalError):
        return b
    if _numeric(a) and _numeric(b):
        return celtypes.BoolType(Fraction(a) == Fraction(b) if _finite(a) and _finite(b) else a == b)
    if isinstance(a, _Quantity) and isinstance(b, _Quantity):
        return celtypes.BoolType(a.value == b.value)
    if isinstance(a, celtypes.ListType) and isinstance(b, celtypes.ListType):
        if len(a) != len(b):
            return celtypes.BoolType(False)
        for x, y in zip(a, b, strict=True):
            r = _equal(x, y)
            if not isinstance(r, celtypes.BoolType) or not r:
                return r
        return celtypes.BoolType(True)
    if isinstance(a, celtypes.MapType) and isinstance(b, celtypes.MapType):
        if set(a.keys()) != set(b.keys()):
            return celtypes.BoolType(False)
        for k in a:
            r = _equal(a[k], b[k])
            if not isinstance(r, celtypes.BoolType) or not r:
                return r
        return celtypes.BoolType(True)
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        if a is None or b is None:
            return celtypes.BoolType(False)
        if isinstance(a, (_Quantity, _Optional)) or isinstance(b, (_Quantity, _Optional)):
            return celtypes.BoolType(False)
    try:
        return celtypes.BoolType(bool(a == b))
    except TypeError as e:
        return CELEvalError("no such overload", TypeError, e.args)


def _finite(v: Any) -> bool:
    return not isinstance(v, float) or (v == v and v not in (float("inf"), float("-inf")))


def _not_equal(a: Any, b: Any) -> Any:
    r = _equal(a, b)
    return celtypes.BoolType(not r) if isinstance(r, celtypes.BoolType) else r


def _str_index(s: str, sub: str, offset: int = 0) -> Any:
    if offset < 0 or offset > len(s):
        return _err(f"index out of range: {offset}")
    return celtypes.IntType(s.find(sub, int(offset)))


def _index_of(recv: Any, x: Any, offset: Any = 0) -> Any:
    if isinstance(recv, celtypes.ListType):
        for i, v in enumerate(recv):
            r = _equal(v, x)
            if isinstance(r, celtypes.BoolType) and r:
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    if isinstance(recv, str) and isinstance(x, str):
        return _str_index(recv, x, int(offset))
    return _err("no such overload")


def _last_index_of(recv: Any, x: Any, offset: Any = None) -> Any:
    if isinstance(recv, celtypes.ListType):
        for i in range(len(recv) - 1, -1, -1):
            r = _equal(recv[i], x)
            if isinstance(r, celtypes.BoolType) and r:
                return celtypes.IntType(i)
        return celtypes.IntType(-1)
    if isinstance(recv, str) and isinstance(x, str):
        end = len(recv) if offset is None else int(offset)
        if end < 0 or end > len(recv):
            return _err(f"index out of range: {end}")
        return celtypes.IntType(recv.rfind(x, 0, end + len(x)))
    return _err("no such overload")


def _substring(s: str, start: int, end: Any = None) -> Any:
    stop = len(s) if end is None else int(end)
    if start < 0 or start > len(s) or stop < start or stop > len(s):
        return _err(f"index out of range: {start if start < 0 or start > len(s) else stop}")
    return celtypes.StringType(s[int(start) : stop])


def _char_at(s: str, i: int) -> Any:
    if i < 0 or i > len(s):
        return _err(f"index out of range: {i}")
    return celtypes.StringType(s[i : i + 1])


def _replace(s: str, old: str, new: str, n: Any = -1) -> Any:
    return celtypes.StringType(s.replace(old, new, int(n)))


def _split(s: str, sep: str, n: Any = -1) -> Any:
    n = int(n)
    if n == 0:
        return celtypes.ListType([])
    parts = list(s) if sep == "" else s.split(sep, n - 1 if n > 0 else -1)
    if sep == "" and n > 0 and len(parts) > n:
        parts = [*parts[: n - 1], "".join(parts[n - 1 :])]
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(items: Any, sep: str = "") -> Any:
    if not all(isinstance(i, str) for i in items):
        return _err("no such overload")
    return celtypes.StringType(sep.join(items))


def _trim(s: str) -> Any:
    return celtypes.StringType(s.strip())


def _lower_ascii(s: str) -> Any:
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in s))


def _upper_ascii(s: str) -> Any:
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in s))


def _ordered(items: Any) -> list[Any]:
    return [Fraction(i) if _numeric(i) else i for i in items]


def _is_sorted(items: Any) -> Any:
    try:
        vals = _ordered(items)
        return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(vals)))
    except TypeError:
        return _err("no such overload")


def _sum(items: Any) -> Any:
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for i in items[1:]:
        total = total + i
    return total


def _extreme(pick: Callable[..., Any]) -> Callable[[Any], Any]:
    def f(items: Any) -> Any:
        if not isinstance(items, celtypes.ListType):
            return _err("no such overload")
        if not items:
            return _err(f"{pick.__name__}(list) argument must not be empty")
        try:
            return pick(items, key=lambda v: Fraction(v) if _numeric(v) else v)
        except TypeError:
            return _err("no such overload")

    return f


def _find(s: str, pattern: str) -> Any:
    try:
        m = re2.search(pattern, s)
    except Exception as e:
        return _err(f"invalid regex: {e}")
    return celtypes.StringType(m.group(0) if m else "")


def _find_all(s: str, pattern: str, n: Any = -1) -> Any:
    try:
        found = [m.group(0) for m in re2.finditer(pattern, s)]
    except Exception as e:
        return _err(f"invalid regex: {e}")
    if int(n) >= 0:
        found = found[: int(n)]
    return celtypes.ListType([celtypes.StringType(f) for f in found])


# Kubernetes quantities: <sign><digits>[.<digits>]<suffix>, suffix binary (Ki..Ei), decimal (n..E) or e<exp>.
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(s: str) -> Fraction | None:
    """The exact value of a Kubernetes quantity string, None if it is not one."""
    m = _QUANTITY.match(s)
    if not m:
        return None
    num, suffix = Fraction(m[1]), m[2] or ""
    if suffix in _BINARY:
        return num * (1 << _BINARY[suffix])
    exp = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    return num * Fraction(10**exp) if exp >= 0 else num / (10**-exp)


class _Quantity:
    __slots__ = ("source", "value")

    def __init__(self, source: str, value: Fraction) -> None:
        self.source = source
        self.value = value

    def __repr__(self) -> str:
        return f"quantity({self.source!r})"


def _quantity(s: Any) -> Any:
    v = parse_quantity(str(s)) if isinstance(s, str) else None
    if v is None:
        return _err(f"quantities must match the regular expression '{_QUANTITY.pattern}'")
    return _Quantity(str(s), v)


def _qv(x: Any) -> Fraction | None:
    if isinstance(x, _Quantity):
        return x.value
    if _numeric(x) and not isinstance(x, celtypes.DoubleType):
        return Fraction(int(x))
    return None


def _q_binary(op: Callable[[Fraction, Fraction], Any]) -> Callable[[Any, Any], Any]:
    def f(a: Any, b: Any) -> Any:
        x, y = _qv(a), _qv(b)
        if x is None or y is None:
            return _err("no such overload")
        return op(x, y)

    return f


def _q_result(v: Fraction) -> _Quantity:
    return _Quantity(str(v), v)


def _as_integer(q: Any) -> Any:
    v = _qv(q)
    if v is None:
        return _err("no such overload")
    if v.denominator != 1 or not _INT64_MIN <= v <= _INT64_MAX:
        return _err("cannot convert value to integer")
    return celtypes.IntType(int(v))


class _Optional:
    """optional(T) for `optionalOldSelf` rules: none when there is no old value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _opt_value(o: Any) -> Any:
    if not isinstance(o, _Optional):
        return _err("no such overload")
    return o.value if o.value is not None else _err("optional.none() dereference")


_FUNCTIONS: dict[str, Any] = {
    "_==_": _equal,
    "_!=_": _not_equal,
    "lowerAscii": _lower_ascii,
    "upperAscii": _upper_ascii,
    "trim": _trim,
    "replace": _replace,
    "split": _split,
    "join": _join,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _substring,
    "charAt": _char_at,
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _extreme(min),
    "max": _extreme(max),
    "find": _find,
    "findAll": _find_all,
    "quantity": _quantity,
    "isQuantity": lambda s: celtypes.BoolType(isinstance(s, str) and parse_quantity(str(s)) is not None),
    "isInteger": lambda q: celtypes.BoolType((v := _qv(q)) is not None and v.denominator == 1),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: (
        celtypes.DoubleType(float(v)) if (v := _qv(q)) is not None else _err("no such overload")
    ),
    "sign": lambda q: (
        celtypes.IntType((v > 0) - (v < 0)) if (v := _qv(q)) is not None else _err("no such overload")
    ),
    "add": _q_binary(lambda x, y: _q_result(x + y)),
    "sub": _q_binary(lambda x, y: _q_result(x - y)),
    "isGreaterThan": _q_binary(lambda x, y: celtypes.BoolType(x > y)),
    "isLessThan": _q_binary(lambda x, y: celtypes.BoolType(x < y)),
    "compareTo": _q_binary(lambda x, y: celtypes.IntType((x > y) - (x < y))),
    "hasValue": lambda o: (
        celtypes.BoolType(o.value is not None) if isinstance(o, _Optional) else _err("no such overload")
    ),
    "value": _opt_value,
    "orValue": lambda o, d: (
        (o.value if o.value is not None else d) if isinstance(o, _Optional) else _err("no such overload")
    ),
}

# ------------------------------------------------------------------------------------------------------
# Compilation.

# Built at import (~0.1 s): cel-python raises the recursion limit when it builds its parser, which test
# frameworks that watch the limit (hypothesis) would otherwise see change in the middle of a test.
_ENV = celpy.Environment()
_CACHE: dict[str, CompiledRule] = {}


def _env() -> Any:
    return _ENV


_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_KNOWN_IDENTS = frozenset(
    {
        "self",
        "oldSelf",
        "int",
        "uint",
        "double",
        "bool",
        "string",
        "bytes",
        "list",
        "map",
        "null_type",
        "type",
    }
)


def _syntax_error(rule: str, e: Exception) -> str:
    line = getattr(e, "line", None) or 1
    col = getattr(e, "column", None) or 1
    src = rule.splitlines()[line - 1] if rule.splitlines() else ""
    return f"ERROR: <input>:{line}:{col}: Syntax error: unexpected input\n | {src}\n | {'.' * (col - 1)}^"


def _undeclared(ast: Any, declared: frozenset[str] = frozenset()) -> tuple[str, int, int] | None:
    """The first identifier that is neither self/oldSelf (or `declared`), a type name nor a macro variable."""
    bound: set[str] = set()
    for st in ast.iter_subtrees():
        if st.data == "member_dot_arg" and len(st.children) >= 3 and str(st.children[1]) in _MACROS:
            args = list(getattr(st.children[2], "children", []))
            for arg in args[:-1]:  # the iteration variables (one, or two for two-variable comprehensions)
                idents = list(arg.scan_values(lambda t: getattr(t, "type", None) == "IDENT"))
                if len(idents) == 1:
                    bound.add(str(idents[0]))
    for st in ast.iter_subtrees_topdown():
        if st.data == "ident" and st.children:
            tok = st.children[0]
            name = str(tok)
            if name not in _KNOWN_IDENTS and name not in bound and name not in declared:
                return name, getattr(tok, "line", 1) or 1, getattr(tok, "column", 1) or 1
    return None


def compile_expression(expr: str, variables: frozenset[str]) -> Any:
    """A CEL expression over the given top-level variables (admission matchConditions: object, oldObject,
    request), with the Kubernetes library functions; the runner's `evaluate(activation)` runs it. Raises
    ValueError with a cel-go-like message if it does not compile or names an undeclared variable."""
    key = f"{sorted(variables)}\x00{expr}"
    cached = _EXPR_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        ast = _env().compile(expr)
    except Exception as e:
        raise ValueError(_syntax_error(expr, e)) from e
    bad = _undeclared(ast, variables)
    if bad is not None:
        name, line, col = bad
        raise ValueError(f"ERROR: <input>:{line}:{col}: undeclared reference to '{name}' (in container '')")
    runner = _env().program(ast, functions=_FUNCTIONS)
    if len(_EXPR_CACHE) > 1024:
        _EXPR_CACHE.clear()
    _EXPR_CACHE[key] = runner
    return runner


_EXPR_CACHE: dict[str, Any] = {}


def compile_rule(rule: str) -> CompiledRule:
    """Parse a rule once (cached). Raises ValueError with a cel-go-like message if it does not compile."""
    cached = _CACHE.get(rule)
    if cached is not None:
        return cached
    try:
        ast = _env().compile(rule)
    except Exception as e:  # CELParseError and lark errors
        raise ValueError(_syntax_error(rule, e)) from e
    bad = _undeclared(ast)
    if bad is not None:
        name, line, col = bad
        raise ValueError(f"ERROR: <input>:{line}:{col}: undeclared reference to '{name}' (in container '')")
    uses_old = any(
        st.data == "ident" and str(st.children[0]) == "oldSelf" for st in ast.iter_subtrees() if st.children
    )
    compiled = CompiledRule(rule, _env().program(ast, functions=_FUNCTIONS), uses_old)
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[rule] = compiled
    return compiled


# ------------------------------------------------------------------------------------------------------
# JSON -> CEL values, typed by the schema.

_RESERVED = frozenset(
    {
        "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
        "import", "let", "loop", "package", "namespace", "return", "var",
    }
)  # fmt: skip
_ESCAPABLE = re.compile(r"^[a-zA-Z_.\-/][a-zA-Z0-9_.\-/]*$")
_ESCAPES = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}


def escape_property(name: str) -> str | None:
    """How a property is named in CEL (`foo-bar` -> `foo__dash__bar`); None if CEL cannot reach it."""
    if name in _RESERVED:
        return f"__{name}__"
    if not _ESCAPABLE.match(name):
        return None
    return re.sub(r"__|[.\-/]", lambda m: _ESCAPES[m.group(0)], name)


def _string_value(x: str, fmt: Any) -> Any:
    try:
        if fmt == "byte":
            return celtypes.BytesType(base64.b64decode(x, validate=True))
        if fmt in ("date-time", "datetime"):
            return celtypes.TimestampType(x)
        if fmt == "date":
            return celtypes.TimestampType(x + "T00:00:00Z")
        if fmt == "duration":
            return celtypes.DurationType(x)
    except Exception:
        pass
    return celtypes.StringType(x)


def to_cel(x: Any, s: Mapping[str, Any] | None, *, resource_root: bool = False) -> Any:
    """A JSON value as the CEL value a rule on a node with schema `s` sees."""
    if x is None:
        return None
    if isinstance(x, bool):
        return celtypes.BoolType(x)
    t = s.get("type") if s is not None else None
    if isinstance(x, int):
        if t == "number" or not _INT64_MIN <= x <= _INT64_MAX:
            return celtypes.DoubleType(float(x))
        return celtypes.IntType(x)
    if isinstance(x, float):
        if t == "integer" and x.is_integer() and _INT64_MIN <= x <= _INT64_MAX:
            return celtypes.IntType(int(x))
        return celtypes.DoubleType(x)
    if isinstance(x, str):
        return _string_value(x, s.get("format") if s is not None and t == "string" else None)
    if isinstance(x, list):
        items = s.get("items") if s is not None else None
        return celtypes.ListType([to_cel(v, items if isinstance(items, Mapping) else None) for v in x])
    if isinstance(x, Mapping):
        return _map_value(
            x, s, resource_root or (s is not None and s.get("x-kubernetes-embedded-resource") is True)
        )
    return celtypes.StringType(str(x))


def _map_value(x: Mapping[str, Any], s: Mapping[str, Any] | None, resource: bool) -> Any:
    props = s.get("properties") if s is not None else None
    addl = s.get("additionalProperties") if s is not None else None
    out: dict[Any, Any] = {}
    if isinstance(props, Mapping) or resource:
        props = props if isinstance(props, Mapping) else {}
        preserve = s is not None and s.get("x-kubernetes-preserve-unknown-fields") is True and not props
        for k, v in x.items():
            if resource and k in ("apiVersion", "kind") and isinstance(v, str):
                out[celtypes.StringType(k)] = celtypes.StringType(v)
            elif resource and k == "metadata" and isinstance(v, Mapping):
                meta = {m: v[m] for m in ("name", "generateName") if isinstance(v.get(m), str)}
                out[celtypes.StringType(k)] = to_cel(meta, None)
            elif k in props or preserve:
                name = escape_property(k)
                sub = props.get(k)
                if name is not None:
                    out[celtypes.StringType(name)] = to_cel(v, sub if isinstance(sub, Mapping) else None)
        return celtypes.MapType(out)
    sub = addl if isinstance(addl, Mapping) else None
    for k, v in x.items():
        out[celtypes.StringType(k)] = to_cel(v, sub)
    return celtypes.MapType(out)


# ------------------------------------------------------------------------------------------------------
# Evaluation.


def _error_text(e: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(e, "args", ()))
    msg = str(args[0]) if args else str(e)
    kind = args[1] if len(args) > 1 else None
    if msg.startswith("no such member in mapping: "):
        return "no such key: " + msg.removeprefix("no such member in mapping: ").strip("'")
    if kind is ZeroDivisionError or "divide by zero" in msg:
        return "division by zero"
    if kind is IndexError or "index out of range" in str(args):
        return "index out of bounds"
    if msg.startswith("undeclared reference to "):
        return msg.split(" (in activation", 1)[0]
    if "no matching overload" in msg or msg.startswith("no such overload"):
        return "no such overload"
    return msg


def _run(compiled: CompiledRule, activation: dict[str, Any]) -> Any:
    try:
        result = compiled.runner.evaluate(activation)
    except CELEvalError as e:
        return e
    except RecursionError:
        return CELEvalError("expression too deeply nested")
    except Exception as e:  # a crash inside cel-python is an evaluation error, never the server's
        return CELEvalError(f"{type(e).__name__}: {e}")
    return result


def _rule_field_path(field_path: str, s: Mapping[str, Any]) -> str:
    """A rule's `fieldPath` (".spec.x", "['a.b']") as a field path suffix ("spec.x", "a.b" or "[key]")."""
    parts: list[str] = []
    node: Mapping[str, Any] | None = s
    for m in re.finditer(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]", field_path):
        name = m.group(1) if m.group(1) is not None else re.sub(r"\\(.)", r"\1", m.group(2))
        props = node.get("properties") if node is not None else None
        if isinstance(props, Mapping):
            parts.append(("." if parts else "") + name)
            node = props.get(name)
        else:
            parts.append(f"[{name}]")
            addl = node.get("additionalProperties") if node is not None else None
            node = addl if isinstance(addl, Mapping) else None
    return "".join(parts)


def _message(rule: Mapping[str, Any]) -> str:
    msg = rule.get("message")
    return msg.strip() if isinstance(msg, str) and msg else ""


def _rule_text(rule: Mapping[str, Any]) -> str:
    return _message(rule) or str(rule.get("rule", "")).strip()


def _message_expression(rule: Mapping[str, Any], activation: dict[str, Any]) -> str | None:
    expr = rule.get("messageExpression")
    if not isinstance(expr, str) or not expr:
        return None
    try:
        compiled = compile_rule(expr)
    except ValueError:
        return None
    result = _run(compiled, activation)
    if not isinstance(result, str):
        return None
    text = result.strip()
    if not text or "\n" in text or len(text) > 5 * 1024:
        return None
    return text


def evaluate_rules(
    schema: Mapping[str, Any], value: Any, old: Any, path: str, *, is_resource_root: bool = False
) -> list[Cause]:
    """Run the node's x-kubernetes-validations on `value`; `old` None means there is no old value."""
    rules = schema.get("x-kubernetes-validations")
    if value is None or not isinstance(rules, list) or not rules:
        return []
    passed = _passed_values(schema, rules)
    key = _value_key(value, is_resource_root) if passed is not None else None
    if key is not None and passed is not None and key in passed:
        return []
    causes = _evaluate(schema, rules, value, old, path, is_resource_root)
    if not causes and key is not None and passed is not None:
        passed.add(key)
    return causes


_PASSED_MAX = 20_000
_passed_cache: dict[int, tuple[Any, set[bytes] | None]] = {}


def _passed_values(schema: Mapping[str, Any], rules: list[Any]) -> set[bytes] | None:
    """Values (encoded) that passed every rule of this node. Rules without oldSelf are pure functions of
    self, so a status write that leaves the spec as it was does not run the spec's rules again (the emulator
    interprets CEL in Python, thousands of times slower than the apiserver's compiled programs). None when a
    rule reads oldSelf or does not compile: those always run."""
    hit = _passed_cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        if hit[1] is not None and len(hit[1]) >= _PASSED_MAX:
            hit[1].clear()
        return hit[1]
    pure = True
    for rule in rules:
        source = rule.get("rule") if isinstance(rule, Mapping) else None
        if not isinstance(source, str) or not source.strip():
            continue
        try:
            pure = pure and not compile_rule(source).uses_old_self
        except ValueError:
            pure = False
    if len(_passed_cache) > 10_000:
        _passed_cache.clear()
    passed: set[bytes] | None = set() if pure else None
    _passed_cache[id(schema)] = (schema, passed)
    return passed


def _value_key(value: Any, is_resource_root: bool) -> bytes | None:
    try:
        return (b"R" if is_resource_root else b"-") + msgspec.json.encode(value)
    except (OverflowError, TypeError, ValueError):
        return None


def _evaluate(
    schema: Mapping[str, Any], rules: list[Any], value: Any, old: Any, path: str, is_resource_root: bool
) -> list[Cause]:
    sts_type = schema.get("type") if isinstance(schema.get("type"), str) else ""
    field = path or "<nil>"
    self_val = to_cel(value, schema, resource_root=is_resource_root)
    old_val = to_cel(old, schema, resource_root=is_resource_root) if old is not None else None
    causes: list[Cause] = []
    for rule in rules:
        if not isinstance(rule, Mapping):
            continue
        source = rule.get("rule")
        if not isinstance(source, str) or not source.strip():
            continue
        try:
            compiled = compile_rule(source)
        except ValueError as e:
            causes.append(
                _schema.field_invalid(field, sts_type, f"rule compile error: compilation failed: {e}")
            )
            continue
        optional = rule.get("optionalOldSelf") is True
        if compiled.uses_old_self and old is None and not optional:
            continue  # transition rules need a comparable old value
        activation: dict[str, Any] = {"self": self_val}
        if compiled.uses_old_self:
            activation["oldSelf"] = _Optional(old_val) if optional else old_val
        result = _run(compiled, activation)
        if isinstance(result, CELEvalError):
            text = _error_text(result)
            if text == "no such overload":
                detail = (
                    "'no such overload': call arguments did not match a supported operator, function or "
                    f"macro signature for rule: {_rule_text(rule)}"
                )
            else:
                detail = f"{text} evaluating rule: {_rule_text(rule)}"
            causes.append(_schema.field_invalid(field, sts_type, detail))
            continue
        if isinstance(result, celtypes.BoolType) and bool(result):
            continue
        fp = rule.get("fieldPath")
        where = field
        if isinstance(fp, str) and fp:
            suffix = _rule_field_path(fp, schema)
            if suffix:
                where = (
                    suffix if not path else (path + suffix if suffix.startswith("[") else f"{path}.{suffix}")
                )
        detail = _message_expression(rule, activation) or _message(rule) or f"failed rule: {_rule_text(rule)}"
        shown = _schema.OMIT if sts_type in ("object", "array") else value
        causes.append(_reason_error(rule.get("reason"), where, shown, detail))
    return causes


def _reason_error(reason: Any, field: str, value: Any, detail: str) -> Cause:
    if reason == "FieldValueForbidden":
        return _schema.field_forbidden(field, detail)
    if reason == "FieldValueRequired":
        return _schema.field_required(field, detail)
    if reason == "FieldValueDuplicate":
        return _schema.field_duplicate(field, value)
    return _schema.field_invalid(field, value, detail)
