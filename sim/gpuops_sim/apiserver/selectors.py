"""Label and field selectors with the apiserver's grammar, matching rules and error messages.

The label grammar follows apimachinery's `labels.Parse` (tokens, whitespace, `in`/`notin` as values,
validation of keys and values, and the exact error text, including the `<nil>` path it prints for a bad
key). Field selectors follow `fields.ParseSelector` plus each kind's field-label conversion, which decides
both the accepted fields and the error text:

* kinds with a registered conversion (Pod, Node, Event, Namespace, Secret, Service, Job, ReplicaSet,
  ReplicationController) and all custom resources answer ``field label not supported: <field>``;
* every other built-in kind falls back to the default conversion, which answers
  ``"<field>" is not a known field selector: only "metadata.name", "metadata.namespace"``.

(Custom resources get the first message, not the default conversion's second one: upstream's CR
converter answers like the registered conversions, and that is what real clusters print.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .gostrings import go_quote
from .resources import ResourceInfo

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "field_value",
    "go_quote",
    "label_selector_from_object",
    "match_none",
    "matches_all",
    "parse_field_selector",
    "parse_label_selector",
    "supported_fields",
]

# ------------------------------------------------------------------------------------------------------------
# Go-style formatting used inside upstream error messages




def _go_string_slice(values: Sequence[str]) -> str:
    """`%#v` of a []string, as field errors print a bad value list."""
    return "[]string{" + ", ".join(go_quote(v) for v in values) + "}"


def _field_invalid(path: str, shown_value: str, detail: str) -> str:
    return f"{path}: Invalid value: {shown_value}: {detail}"


def _aggregate(msgs: list[str]) -> str:
    """utilerrors.Aggregate: one message alone, several deduplicated in brackets."""
    seen: list[str] = []
    for m in msgs:
        if m not in seen:
            seen.append(m)
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


# ------------------------------------------------------------------------------------------------------------
# Label key/value validation (apimachinery validate/content)

_LABEL_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_NAME_RE = re.compile(_LABEL_NAME_FMT)
_LABEL_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_VALUE_FMT = "(" + _LABEL_NAME_FMT + ")?"
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len_error(n: int) -> str:
    return f"must be no more than {n} bytes"


def _blen(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def label_key_errors(key: str) -> list[str]:
    """Why `key` is not a label key (an optional DNS-subdomain prefix, '/', a name of at most 63 bytes)."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if _blen(prefix) > 253:
                errs.append("prefix part " + _max_len_error(253))
            if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
                why = _regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com")
                errs.append("prefix part " + why)
    else:
        return [
            "a valid label key "
            + _regex_error(_LABEL_NAME_MSG, _LABEL_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif _blen(name) > 63:
        errs.append("name part " + _max_len_error(63))
    if not _LABEL_NAME_RE.fullmatch(name):
        errs.append(
            "name part " + _regex_error(_LABEL_NAME_MSG, _LABEL_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def label_value_errors(value: str) -> list[str]:
    errs: list[str] = []
    if _blen(value) > 63:
        errs.append(_max_len_error(63))
    if value and not _LABEL_NAME_RE.fullmatch(value):
        errs.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


_INT64_RE = re.compile(r"[+-]?[0-9]+")


def _parse_int64(s: str) -> int | None:
    """strconv.ParseInt(s, 10, 64); Python's int() would also take '1_0' and ' 1'."""
    if not _INT64_RE.fullmatch(s):
        return None
    n = int(s)
    return n if -(2**63) <= n < 2**63 else None


# ------------------------------------------------------------------------------------------------------------
# Label selectors

# Operators, spelled as apimachinery's selection.Operator values.
IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS = "in", "notin", "=", "==", "!="
EXISTS, DOES_NOT_EXIST, GREATER_THAN, LESS_THAN = "exists", "!", "gt", "lt"
_BINARY_OPERATORS = (IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN)


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector. Built only through `_new_requirement`, which validates it."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op in (IN, EQUALS, DOUBLE_EQUALS):
            return self.key in labels and labels[self.key] in self.values
        if op in (NOT_IN, NOT_EQUALS):
            # Objects lacking the key match: "not equal to any of these" holds vacuously.
            return self.key not in labels or labels[self.key] not in self.values
        if op == EXISTS:
            return self.key in labels
        if op == DOES_NOT_EXIST:
            return self.key not in labels
        if op in (GREATER_THAN, LESS_THAN):
            if self.key not in labels or len(self.values) != 1:
                return False
            have, want = _parse_int64(labels[self.key]), _parse_int64(self.values[0])
            if have is None or want is None:
                return False
            return have > want if op == GREATER_THAN else have < want
        return False

    def __str__(self) -> str:
        op = self.operator
        if op == EXISTS:
            return self.key
        if op == DOES_NOT_EXIST:
            return "!" + self.key
        vals = self.values[0] if len(self.values) == 1 else ",".join(sorted(self.values))
        if op in (IN, NOT_IN):
            return f"{self.key} {op} ({vals})"
        sym = {GREATER_THAN: ">", LESS_THAN: "<"}.get(op, op)
        return f"{self.key}{sym}{vals}"


def _values_count_error(op: str, values: Sequence[str]) -> str | None:
    """How many values the operator takes, as upstream words the mistake (None: the count is right)."""
    if op in (IN, NOT_IN) and not values:
        return "for 'in', 'notin' operators, values set can't be empty"
    if op in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS) and len(values) != 1:
        return "exact-match compatibility requires one single value"
    if op in (EXISTS, DOES_NOT_EXIST) and values:
        return "values set must be empty for exists and does not exist"
    if op in (GREATER_THAN, LESS_THAN) and len(values) != 1:
        return "for 'Gt', 'Lt' operators, exactly one value is required"
    return None


def _operator_errors(op: str, values: Sequence[str], path: str | None, values_path: str) -> list[str]:
    """An unsupported operator, or values the operator cannot take (Gt and Lt compare integers)."""
    if op not in (*_BINARY_OPERATORS, EXISTS, DOES_NOT_EXIST):
        supported = ", ".join(go_quote(o) for o in (*_BINARY_OPERATORS, EXISTS, DOES_NOT_EXIST))
        return [
            f"{path + '.' if path else ''}operator: Unsupported value: {go_quote(op)}: "
            f"supported values: {supported}"
        ]
    errs: list[str] = []
    if (detail := _values_count_error(op, values)) is not None:
        errs.append(_field_invalid(values_path, _go_string_slice(values), detail))
    if op in (GREATER_THAN, LESS_THAN):
        for i, v in enumerate(values):
            if _parse_int64(v) is None:
                errs.append(
                    _field_invalid(
                        f"{values_path}[{i}]",
                        go_quote(v),
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    )
                )
    return errs


def _new_requirement(key: str, op: str, values: Sequence[str], path: str | None) -> Requirement:
    """labels.NewRequirement: validate and build, or raise ValueError with upstream's message.

    `path` None prints the way a nil field.Path does; children of it still print as `key`/`values`.
    """
    errs: list[str] = []
    key_path = f"{path}.key" if path else "key"
    values_path = f"{path}.values" if path else "values"
    if msgs := label_key_errors(key):
        errs.append(_field_invalid(key_path, go_quote(key), "; ".join(msgs)))
    errs.extend(_operator_errors(op, values, path, values_path))
    for i, v in enumerate(values):
        if msgs := label_value_errors(v):
            errs.append(_field_invalid(f"{values_path}[{i}][{key}]", go_quote(v), "; ".join(msgs)))
    if errs:
        raise ValueError(_aggregate(errs))
    return Requirement(key, op, tuple(values))


class LabelSelector:
    """A parsed label selector: the AND of its requirements, or the selector that matches nothing."""

    __slots__ = ("_nothing", "requirements")

    def __init__(self, requirements: Sequence[Requirement] = (), *, nothing: bool = False) -> None:
        # Upstream keeps requirements sorted by key, which fixes String() and RequiresExactMatch().
        self.requirements: tuple[Requirement, ...] = tuple(sorted(requirements, key=lambda r: r.key))
        self._nothing = nothing

    @classmethod
    def everything(cls) -> LabelSelector:
        return cls()

    @classmethod
    def match_none(cls) -> LabelSelector:
        return cls(nothing=True)

    @property
    def empty(self) -> bool:
        """True when the selector does not restrict anything (the match-nothing selector is not empty)."""
        return not self._nothing and not self.requirements

    @property
    def matches_nothing(self) -> bool:
        return self._nothing

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self._nothing:
            return False
        have = labels or {}
        return all(r.matches(have) for r in self.requirements)

    def exact(self, key: str) -> str | None:
        """The value `key` must equal (labels.RequiresExactMatch), for index lookups; else None."""
        for r in self.requirements:
            if r.key == key:
                if r.operator in (EQUALS, DOUBLE_EQUALS, IN) and len(r.values) == 1:
                    return r.values[0]
                return None
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return "LabelSelector(<nothing>)" if self._nothing else f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSelector):
            return NotImplemented
        return self._nothing == other._nothing and self.requirements == other.requirements

    def __hash__(self) -> int:
        return hash((self._nothing, self.requirements))


def match_none() -> LabelSelector:
    return LabelSelector.match_none()


# --- the query-string grammar -------------------------------------------------------------------------------

(
    _T_ERROR,
    _T_EOS,
    _T_CLOSE,
    _T_COMMA,
    _T_NOT,
    _T_DEQ,
    _T_EQ,
    _T_GT,
    _T_IDENT,
    _T_IN,
    _T_LT,
    _T_NEQ,
    _T_NOTIN,
    _T_OPEN,
) = range(14)
_SYMBOL_TOKENS = {
    ")": _T_CLOSE,
    ",": _T_COMMA,
    "!": _T_NOT,
    "==": _T_DEQ,
    "=": _T_EQ,
    ">": _T_GT,
    "<": _T_LT,
    "!=": _T_NEQ,
    "(": _T_OPEN,
}
_KEYWORDS = {"in": _T_IN, "notin": _T_NOTIN}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")


def _lex(text: str) -> list[tuple[int, str]]:
    """Tokens up to and including end-of-string. Go's lexer reads a NUL byte as the end of input."""
    cut = text.find("\x00")
    s = text if cut < 0 else text[:cut]
    out: list[tuple[int, str]] = []
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in _WHITESPACE:
            i += 1
        if i >= n:
            out.append((_T_EOS, ""))
            return out
        if s[i] in _SPECIAL:
            # Longest run of special characters that still spells a token ("!=" but "!" then "(").
            best: tuple[int, str] | None = None
            j = i
            while j < n and s[j] in _SPECIAL:
                tok = _SYMBOL_TOKENS.get(s[i : j + 1])
                if tok is not None:
                    best = (tok, s[i : j + 1])
                elif best is not None:
                    break
                j += 1
            if best is None:  # unreachable: every single special character is a token
                out.append((_T_ERROR, f"error expected: keyword found '{s[i:j]}'"))
                i = j
            else:
                out.append(best)
                i += len(best[1])
        else:
            j = i
            while j < n and s[j] not in _SPECIAL and s[j] not in _WHITESPACE:
                j += 1
            word = s[i:j]
            out.append((_KEYWORDS.get(word, _T_IDENT), word))
            i = j


class _LabelParser:
    """Recursive descent over the token list, mirroring labels.Parser's states and messages."""

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.pos = 0

    # "Values" context: in/notin are ordinary identifiers there.
    def _look(self, values: bool = True) -> tuple[int, str]:
        tok, lit = self.items[self.pos]
        if values and tok in (_T_IN, _T_NOTIN):
            tok = _T_IDENT
        return tok, lit

    def _take(self, values: bool = True) -> tuple[int, str]:
        out = self._look(values)
        self.pos += 1
        return out

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            tok, lit = self._look()
            if tok in (_T_IDENT, _T_NOT):
                try:
                    reqs.append(self._requirement())
                except ValueError as e:
                    raise ValueError(f"unable to parse requirement: {e}") from None
                t, lit2 = self._take()
                if t == _T_EOS:
                    return reqs
                if t == _T_COMMA:
                    t2, l2 = self._look()
                    if t2 not in (_T_IDENT, _T_NOT):
                        raise ValueError(f"found '{l2}', expected: identifier after ','")
                else:
                    raise ValueError(f"found '{lit2}', expected: ',' or 'end of string'")
            elif tok == _T_EOS:
                return reqs
            else:
                raise ValueError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def _requirement(self) -> Requirement:
        op: str | None = None
        tok, lit = self._take()
        if tok == _T_NOT:
            op = DOES_NOT_EXIST
            tok, lit = self._take()
        if tok != _T_IDENT:
            raise ValueError(f"found '{lit}', expected: identifier")
        key = lit
        if msgs := label_key_errors(key):
            raise ValueError(_field_invalid("<nil>", go_quote(key), "; ".join(msgs)))
        nxt, _ = self._look()
        if nxt in (_T_EOS, _T_COMMA) and op is None:
            op = EXISTS
        if op in (EXISTS, DOES_NOT_EXIST):
            return _new_requirement(key, op, [], None)
        op = self._operator()
        values = self._value_set() if op in (IN, NOT_IN) else self._exact_value()
        return _new_requirement(key, op, sorted(values), None)

    def _operator(self) -> str:
        tok, lit = self._take(values=False)
        ops = {
            _T_IN: IN,
            _T_EQ: EQUALS,
            _T_DEQ: DOUBLE_EQUALS,
            _T_GT: GREATER_THAN,
            _T_LT: LESS_THAN,
            _T_NOTIN: NOT_IN,
            _T_NEQ: NOT_EQUALS,
        }
        if tok not in ops:
            raise ValueError(f"found '{lit}', expected: {', '.join(_BINARY_OPERATORS)}")
        return ops[tok]

    def _value_set(self) -> set[str]:
        tok, lit = self._take()
        if tok != _T_OPEN:
            raise ValueError(f"found '{lit}' expected: '('")
        tok, lit = self._look()
        if tok in (_T_IDENT, _T_COMMA):
            values = self._identifiers()
            if self._take()[0] != _T_CLOSE:  # pragma: no cover - _identifiers only returns before ')'
                raise ValueError(f"found '{lit}', expected: ')'")
            return values
        if tok == _T_CLOSE:  # "()" is the set holding the empty string
            self._take()
            return {""}
        raise ValueError(f"found '{lit}', expected: ',', ')' or identifier")

    def _identifiers(self) -> set[str]:
        out: set[str] = set()
        while True:
            tok, lit = self._take()
            if tok == _T_IDENT:
                out.add(lit)
                t2, l2 = self._look()
                if t2 == _T_COMMA:
                    continue
                if t2 == _T_CLOSE:
                    return out
                raise ValueError(f"found '{l2}', expected: ',' or ')'")
            if tok == _T_COMMA:
                # Empty members: "(,a)", "(a,)" and "(a,,b)" all include "".
                if not out:
                    out.add("")
                t2, _ = self._look()
                if t2 == _T_CLOSE:
                    out.add("")
                    return out
                if t2 == _T_COMMA:
                    self._take()
                    out.add("")
                continue
            raise ValueError(f"found '{lit}', expected: ',', or identifier")

    def _exact_value(self) -> set[str]:
        tok, _ = self._look()
        if tok in (_T_EOS, _T_COMMA):  # "k=" means the empty value
            return {""}
        tok, lit = self._take()
        if tok == _T_IDENT:
            return {lit}
        raise ValueError(f"found '{lit}', expected: identifier")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a `labelSelector` query value; a malformed one is a 400 BadRequest like upstream's."""
    try:
        return LabelSelector(_LabelParser(text).parse())
    except ValueError as e:
        raise bad_request(str(e)) from None


_OBJECT_OPS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


def label_selector_from_object(sel: Mapping[str, Any] | None) -> LabelSelector:
    """metav1.LabelSelectorAsSelector: None selects nothing, {} (no terms) selects everything.

    That is the rule for PDBs, Deployments/ReplicaSets and webhook selectors' stored form; callers
    whose API says "nil means everything" (e.g. a defaulted webhook namespaceSelector) pass {}.
    Invalid input raises ValueError with upstream's message.
    """
    if sel is None:
        return LabelSelector.match_none()
    if not isinstance(sel, Mapping):
        raise ValueError(f"label selector must be an object, not {type(sel).__name__}")
    match_labels = sel.get("matchLabels") or {}
    exprs = sel.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping):
        raise ValueError("matchLabels must be an object of string values")
    if not isinstance(exprs, list):
        raise ValueError("matchExpressions must be a list")
    reqs: list[Requirement] = []
    for k, v in match_labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"matchLabels must map strings to strings, got {k!r}: {v!r}")
        reqs.append(_new_requirement(k, EQUALS, [v], None))
    for expr in exprs:
        if not isinstance(expr, Mapping):
            raise ValueError("matchExpressions items must be objects")
        op_name = expr.get("operator", "")
        key = expr.get("key", "")
        values = expr.get("values") or []
        if not isinstance(op_name, str) or op_name not in _OBJECT_OPS:
            shown = go_quote(op_name) if isinstance(op_name, str) else repr(op_name)
            raise ValueError(f"{shown} is not a valid label selector operator")
        strings = isinstance(values, list) and all(isinstance(x, str) for x in values)
        if not isinstance(key, str) or not strings:
            raise ValueError("matchExpressions items need a string key and a list of string values")
        reqs.append(_new_requirement(key, _OBJECT_OPS[op_name], values, None))
    return LabelSelector(reqs)


# ------------------------------------------------------------------------------------------------------------
# Field selectors

_CORE = ""
_META = ("metadata.name", "metadata.namespace")
# Kinds with a registered field-label conversion: the accepted labels, and aliases they rewrite.
_CONVERSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    (_CORE, "Pod"): (
        *_META,
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ),
    (_CORE, "Node"): ("metadata.name", "spec.unschedulable"),
    (_CORE, "ReplicationController"): (*_META, "status.replicas"),
    (_CORE, "Event"): (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
        *_META,
    ),
    (_CORE, "Namespace"): ("status.phase", "metadata.name"),
    (_CORE, "Secret"): ("type", *_META),
    (_CORE, "Service"): (*_META, "spec.clusterIP", "spec.type"),
    ("batch", "Job"): (*_META, "status.successful"),
    ("apps", "ReplicaSet"): (*_META, "status.replicas"),
    ("certificates.k8s.io", "CertificateSigningRequest"): ("metadata.name", "spec.signerName"),
}
_ALIASES: dict[tuple[str, str], dict[str, str]] = {(_CORE, "Pod"): {"spec.host": "spec.nodeName"}}


def supported_fields(info: ResourceInfo) -> tuple[str, ...]:
    """The field labels a list/watch of this resource accepts."""
    if info.is_custom:
        fields = ["metadata.name"] if not info.namespaced else list(_META)
        fields += [f.lstrip(".") for f in info.selectable_fields]
        return tuple(dict.fromkeys(fields))
    return _CONVERSIONS.get((info.group, info.kind), _META)


def _convert_label(info: ResourceInfo, label: str) -> str:
    """The scheme's ConvertFieldLabel for this kind: the canonical label, or a 400 with upstream's text."""
    if info.is_custom:
        if label in supported_fields(info):
            return label
        raise bad_request(f"field label not supported: {label}")
    key = (info.group, info.kind)
    if key not in _CONVERSIONS:
        if label in _META:
            return label
        raise bad_request(
            f'{go_quote(label)} is not a known field selector: only "metadata.name", "metadata.namespace"'
        )
    alias = _ALIASES.get(key, {}).get(label)
    if alias is not None:
        return alias
    if label in _CONVERSIONS[key]:
        return label
    raise bad_request(f"field label not supported: {label}")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not backslash-escaped; escapes stay in the terms."""
    if not text:
        return []
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    """The first operator wins; '!=' and '==' are tried before '=' at each position."""
    for i in range(len(term)):
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    return None


def _unescape_value(value: str) -> str:
    if not any(c in value for c in "\\,="):
        return value
    out: list[str] = []
    escaped = False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            # Go prints the rune with %v, i.e. as its code point number.
            raise bad_request(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise bad_request("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


class FieldSelector:
    """A parsed field selector: the AND of `(field, "=" | "!=", value)` terms over one resource's fields."""

    __slots__ = ("info", "requirements")

    def __init__(
        self, requirements: Sequence[tuple[str, str, str]] = (), info: ResourceInfo | None = None
    ) -> None:
        self.requirements: list[tuple[str, str, str]] = list(requirements)
        self.info = info

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for fld, op, want in self.requirements:
            have = field_value(obj, self.info, fld)
            if (have == want) != (op == "="):
                return False
        return True

    def exact(self, field: str) -> str | None:
        """The value `field` must equal (fields.RequiresExactMatch), e.g. spec.nodeName for an index."""
        for fld, op, value in self.requirements:
            if fld == field and op == "=":
                return value
        return None

    def __str__(self) -> str:
        def esc(v: str) -> str:
            return v.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")

        return ",".join(f"{f}{op}{esc(v)}" for f, op, v in self.requirements)

    def __repr__(self) -> str:
        return f"FieldSelector({str(self)!r})"


def parse_field_selector(text: str, info: ResourceInfo) -> FieldSelector:
    """Parse a `fieldSelector` query value for `info`; 400 BadRequest for bad syntax or an unknown field."""
    parts = sorted(_split_terms(text))
    terms: list[tuple[str, str, str]] = []
    for part in parts:
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        lhs, op, rhs = split
        terms.append((lhs, "!=" if op == "!=" else "=", _unescape_value(rhs)))
    return FieldSelector([(_convert_label(info, f), op, v) for f, op, v in terms], info)


# --- what each field reads ----------------------------------------------------------------------------------


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _go_bool(value: Any) -> str:
    return "true" if value is True else "false"


def _pod_ip(obj: Mapping[str, Any]) -> str:
    ips = _get(obj, "status", "podIPs")
    if isinstance(ips, list) and ips:
        return _s(_get(ips[0], "ip"))
    # v1 → internal conversion fills podIPs from a lone podIP.
    return _s(_get(obj, "status", "podIP"))


def _event_source(obj: Mapping[str, Any]) -> str:
    return _s(_get(obj, "source", "component")) or _s(obj.get("reportingComponent"))


def _reader(*path: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda o: _s(_get(o, *path))


def _int_str(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "0"


_FIELD_READERS: dict[tuple[str, str], dict[str, Callable[[Mapping[str, Any]], str]]] = {
    (_CORE, "Pod"): {
        "spec.nodeName": lambda o: _s(_get(o, "spec", "nodeName")),
        "spec.restartPolicy": lambda o: _s(_get(o, "spec", "restartPolicy")),
        "spec.schedulerName": lambda o: _s(_get(o, "spec", "schedulerName")),
        "spec.serviceAccountName": lambda o: _s(_get(o, "spec", "serviceAccountName")),
        "spec.hostNetwork": lambda o: _go_bool(_get(o, "spec", "hostNetwork")),
        "status.phase": lambda o: _s(_get(o, "status", "phase")),
        "status.podIP": _pod_ip,
        "status.nominatedNodeName": lambda o: _s(_get(o, "status", "nominatedNodeName")),
        # status.podIPs is an accepted label but upstream never puts it in the pod's field set,
        # so it always reads as "" (k/k#94756 proposed otherwise and was not merged).
    },
    (_CORE, "Node"): {"spec.unschedulable": lambda o: _go_bool(_get(o, "spec", "unschedulable"))},
    (_CORE, "Namespace"): {"status.phase": lambda o: _s(_get(o, "status", "phase"))},
    (_CORE, "Secret"): {"type": lambda o: _s(o.get("type"))},
    (_CORE, "Service"): {
        "spec.clusterIP": lambda o: _s(_get(o, "spec", "clusterIP")),
        "spec.type": lambda o: _s(_get(o, "spec", "type")),
    },
    (_CORE, "ReplicationController"): {"status.replicas": lambda o: _int_str(_get(o, "status", "replicas"))},
    ("apps", "ReplicaSet"): {"status.replicas": lambda o: _int_str(_get(o, "status", "replicas"))},
    ("batch", "Job"): {"status.successful": lambda o: _int_str(_get(o, "status", "succeeded"))},
    ("certificates.k8s.io", "CertificateSigningRequest"): {
        "spec.signerName": lambda o: _s(_get(o, "spec", "signerName"))
    },
    (_CORE, "Event"): {
        **{
            f"involvedObject.{k}": _reader("involvedObject", k)
            for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": lambda o: _s(o.get("reason")),
        "reportingComponent": lambda o: _s(o.get("reportingComponent")),
        "source": _event_source,
        "type": lambda o: _s(o.get("type")),
    },
}


def _selectable_value(value: Any) -> str:
    """How a CRD's selectable field renders: strings as-is, integers in decimal, booleans as Go does."""
    if isinstance(value, bool):
        return _go_bool(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    return ""


def field_value(obj: Mapping[str, Any], info: ResourceInfo | None, field: str) -> str:
    """The string a field selector compares for `field`; absent fields read as "" (upstream's field sets)."""
    if field == "metadata.name":
        return _s(_get(obj, "metadata", "name"))
    if field == "metadata.namespace":
        if info is not None and not info.namespaced:
            return ""
        return _s(_get(obj, "metadata", "namespace"))
    if info is None:
        return ""
    if info.is_custom:
        if field in (f.lstrip(".") for f in info.selectable_fields):
            return _selectable_value(_get(obj, *field.split(".")))
        return ""
    reader = _FIELD_READERS.get((info.group, info.kind), {}).get(field)
    return reader(obj) if reader is not None else ""


def matches_all(obj: Mapping[str, Any] | None, labels: LabelSelector, fields: FieldSelector) -> bool:
    """Whether a possibly absent object passes both selectors; watch filtering asks it of old and new."""
    if obj is None:
        return False
    return labels.matches(_get(obj, "metadata", "labels")) and fields.matches(obj)
