"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): CEL admission checks run inside the API server.

Node agents are confined to their own node the way Kubernetes confines kubelets: a policy compares the node
name a bound service account token carries (`authentication.kubernetes.io/node-name` in the user's extra)
with the object written. Clients must see what kube-apiserver answers: the same matching (matchConstraints,
a binding's matchResources, matchConditions), the same CEL variables (`object`, `oldObject`, `request`,
`params`, `namespaceObject`, `variables`), the failure policy applied to evaluation and configuration errors,
validationActions (Deny refuses, Warn answers a warning header, Audit has no audit log here), and the same
denial: `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>' with binding '<b>' denied request:
<message>`, with the code of the validation's `reason` (Invalid, 422, when unset). Policies run before the
validating webhooks. Not emulated: the `authorizer` variable, auditAnnotations and `status.typeChecking`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .admission import AdmissionRequest, admission_review, rule_matches, webhook_matches
from .auth import label_selector_matches
from .errors import Cause, StatusError, qualified

__all__ = ["BINDINGS", "POLICIES", "ParamFinder", "check_binding", "check_policy", "enforce", "selector_matches"]

POLICIES = ("admissionregistration.k8s.io", "validatingadmissionpolicies")
BINDINGS = ("admissionregistration.k8s.io", "validatingadmissionpolicybindings")

# (apiVersion, kind, namespace, name, selector) -> the matching objects; None when no such kind is served.
ParamFinder = Callable[[str, str, str, str, Mapping[str, Any] | None], list[dict[str, Any]] | None]

_VARIABLES = frozenset({"object", "oldObject", "request", "params", "namespaceObject", "variables"})
_ACTIONS = ("Deny", "Warn", "Audit")
_CODES = {"Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413, "Unauthorized": 401}


@dataclass(frozen=True)
class _Denial:
    policy: str
    binding: str
    message: str
    reason: str = ""


class _Failed(Exception):
    """A configuration or evaluation error; the policy's failurePolicy decides what it means."""


class _Misconfigured(_Failed):
    """The binding cannot be evaluated (its params are missing or of an unknown kind)."""


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


# ------------------------------------------------------------------------------------------------ matching


def _resource_names_match(rule: Mapping[str, Any], req: AdmissionRequest) -> bool:
    names = rule.get("resourceNames") or ()
    return not names or req.name in names


def _rules_match(rules: Iterable[Mapping[str, Any]], req: AdmissionRequest) -> bool:
    return any(rule_matches(r, req) and _resource_names_match(r, req) for r in rules)


def _resources_match(
    match: Mapping[str, Any] | None, req: AdmissionRequest, ns_labels: Mapping[str, str] | None, *, binding: bool
) -> bool:
    """MatchResources: a policy's must list resourceRules; a binding's narrows the policy's (absent: all)."""
    if match is None:
        return binding
    rules = match.get("resourceRules") or []
    if not rules and not binding:
        return False
    selectors = {"namespaceSelector": match.get("namespaceSelector") or {},
                 "objectSelector": match.get("objectSelector") or {},
                 "rules": rules or [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"],
                                     "resources": ["*/*"], "scope": "*"}]}
    if not webhook_matches(selectors, req, ns_labels):
        return False
    if rules and not _rules_match(rules, req):
        return False
    return not _rules_match(match.get("excludeResourceRules") or [], req)


# ------------------------------------------------------------------------------------------------ CEL


def _compile(expr: str) -> Any:
    from . import cel

    try:
        return cel.compile_expression(expr, _VARIABLES)
    except ValueError as e:
        raise _Failed(f"compilation failed: {e}") from None


def _evaluate(expr: str, activation: Mapping[str, Any]) -> Any:
    from celpy.evaluation import CELEvalError

    runner = _compile(expr)
    try:
        result = runner.evaluate(dict(activation))
    except CELEvalError as e:
        result = e
    except RecursionError:
        raise _Failed(f"expression '{expr}' resulted in error: expression too deeply nested") from None
    except Exception as e:  # a crash inside cel-python is an evaluation error, never the server's
        raise _Failed(f"expression '{expr}' resulted in error: {type(e).__name__}: {e}") from None
    if isinstance(result, Exception):
        from .cel import _error_text

        raise _Failed(f"expression '{expr}' resulted in error: {_error_text(result)}")
    return result


def _activation(req: AdmissionRequest, param: Mapping[str, Any] | None,
                namespace: Mapping[str, Any] | None) -> dict[str, Any]:
    from celpy import celtypes

    from . import cel

    review = admission_review(req, req.uid or "")["request"]
    return {
        "object": cel.to_cel(req.obj, None), "oldObject": cel.to_cel(req.old_obj, None),
        "request": cel.to_cel(review, None), "params": cel.to_cel(param, None),
        "namespaceObject": cel.to_cel(namespace, None), "variables": celtypes.MapType({}),
    }


def _with_variables(activation: dict[str, Any], variables: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Variables in order (each may use the ones before it). Upstream evaluates them lazily, so an error only
    matters to an expression that uses the variable: it is kept as an error value, which CEL propagates."""
    from celpy import celtypes
    from celpy.evaluation import CELEvalError

    values: dict[Any, Any] = {}
    out = dict(activation)
    for v in variables:
        try:
            value = _evaluate(str(v.get("expression", "")), out)
        except _Failed as e:
            value = CELEvalError(str(e))
        values[celtypes.StringType(str(v.get("name", "")))] = value
        out["variables"] = celtypes.MapType(values)
    return out


def _truth(value: Any) -> bool | None:
    """A CEL bool as Python's (None: not a bool)."""
    from celpy import celtypes

    return bool(value) if isinstance(value, bool | celtypes.BoolType) else None


def _holds(conditions: Sequence[Mapping[str, Any]], activation: Mapping[str, Any]) -> bool:
    for c in conditions:
        result = _truth(_evaluate(str(c.get("expression", "")), activation))
        if result is None:
            raise _Failed(f"match condition {c.get('name', '')!r} did not return a bool")
        if not result:
            return False
    return True


def _message(validation: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
    expr = validation.get("messageExpression")
    if expr:
        try:
            text = _evaluate(str(expr), activation)
        except _Failed:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text:
            return str(text).strip()
    if validation.get("message"):
        return str(validation["message"])
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def _failures(spec: Mapping[str, Any], activation: Mapping[str, Any], fail_closed: bool) -> list[tuple[str, str]]:
    """(message, reason) of each validation that is false, or errs under failurePolicy Fail."""
    out: list[tuple[str, str]] = []
    for v in spec.get("validations") or ():
        try:
            ok = _evaluate(str(v.get("expression", "")), activation)
        except _Failed as e:
            if fail_closed:
                out.append((str(e), ""))
            continue
        truth = _truth(ok)
        if truth is None:
            if fail_closed:
                out.append((f"expression '{v.get('expression', '')}' did not return a bool", ""))
        elif not truth:
            out.append((_message(v, activation), str(v.get("reason") or "")))
    return out


# ------------------------------------------------------------------------------------------------ params


def _params(policy: Mapping[str, Any], binding: Mapping[str, Any], req: AdmissionRequest,
            find: ParamFinder) -> list[dict[str, Any] | None]:
    """The param objects a binding evaluates its policy with ([None]: no paramKind); [] means admit."""
    kind = (policy.get("spec") or {}).get("paramKind")
    if not kind:
        return [None]
    ref = (binding.get("spec") or {}).get("paramRef")
    if not ref:
        raise _Misconfigured(f"paramRef is required when the policy has paramKind {kind.get('kind', '')}")
    namespace = str(ref.get("namespace") or req.effective_namespace or "")
    found = find(str(kind.get("apiVersion", "")), str(kind.get("kind", "")), namespace, str(ref.get("name") or ""),
                 ref.get("selector"))
    if found is None:
        raise _Misconfigured(f"paramKind kind `{kind.get('apiVersion', '')}, Kind={kind.get('kind', '')}` not known")
    if found:
        return list(found)
    if ref.get("parameterNotFoundAction") == "Deny":
        raise _Misconfigured("no params found for policy binding with `Deny` parameterNotFoundAction")
    return []


# ------------------------------------------------------------------------------------------------ enforcing


def _bindings_of(policy: str, bindings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((b for b in bindings if (b.get("spec") or {}).get("policyName") == policy), key=_name)


def _run_binding(policy: Mapping[str, Any], binding: Mapping[str, Any], req: AdmissionRequest,
                 find: ParamFinder, namespace: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    spec = policy.get("spec") or {}
    fail_closed = spec.get("failurePolicy", "Fail") != "Ignore"
    out: list[tuple[str, str]] = []
    for param in _params(policy, binding, req, find):
        activation = _activation(req, param, namespace)
        if not _holds(spec.get("matchConditions") or (), activation):
            continue
        out.extend(_failures(spec, _with_variables(activation, spec.get("variables") or ()), fail_closed))
    return out


def enforce(
    policies: Sequence[Mapping[str, Any]],
    bindings: Sequence[Mapping[str, Any]],
    req: AdmissionRequest,
    ns_labels: Mapping[str, str] | None,
    *,
    namespace_object: Mapping[str, Any] | None,
    find_params: ParamFinder,
) -> list[str]:
    """Run every policy that matches `req` with each of its bindings: warnings to answer, or the first denial
    raised as the StatusError kube-apiserver answers."""
    warnings: list[str] = []
    denials: list[_Denial] = []
    for policy in sorted(policies, key=_name):
        spec = policy.get("spec") or {}
        if not _resources_match(spec.get("matchConstraints"), req, ns_labels, binding=False):
            continue
        fail_closed = spec.get("failurePolicy", "Fail") != "Ignore"
        for binding in _bindings_of(_name(policy), bindings):
            if not _resources_match((binding.get("spec") or {}).get("matchResources"), req, ns_labels,
                                    binding=True):
                continue
            try:
                failures = _run_binding(policy, binding, req, find_params, namespace_object)
            except _Misconfigured as e:
                failures = [(f"failed to configure binding: {e}", "")] if fail_closed else []
            except _Failed as e:
                failures = [(str(e), "")] if fail_closed else []
            actions = (binding.get("spec") or {}).get("validationActions") or ()
            for message, reason in failures:
                if "Deny" in actions:
                    denials.append(_Denial(_name(policy), _name(binding), message, reason))
                if "Warn" in actions:
                    warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{_name(policy)}' with "
                                    f"binding '{_name(binding)}': {message}")
    if denials:
        raise _denied(denials[0], req)
    return warnings


def _denied(d: _Denial, req: AdmissionRequest) -> StatusError:
    message = f"ValidatingAdmissionPolicy '{d.policy}' with binding '{d.binding}' denied request: {d.message}"
    reason = d.reason or "Invalid"
    name = req.name or str(((req.obj or {}).get("metadata") or {}).get("name", ""))
    return StatusError(_CODES.get(reason, 422), reason,
                       f'{qualified(req.resource, req.group)} "{name}" is forbidden: {message}',
                       name=name, group=req.group, kind=req.resource, causes=[Cause("", message, "")])


# ------------------------------------------------------------------------------------------------ validation


def _compile_cause(expr: Any, path: str) -> list[Cause]:
    if not isinstance(expr, str) or not expr.strip():
        return [Cause("FieldValueRequired", "Required value", path)]
    try:
        _compile(expr)
    except _Failed as e:
        return [Cause("FieldValueInvalid", f"Invalid value: {expr!r}: {e}", path)]
    return []


def check_policy(obj: Mapping[str, Any]) -> list[Cause]:
    """What kube-apiserver refuses in a ValidatingAdmissionPolicy: no constraints, expressions that do not
    compile, unknown failure policies or reasons."""
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    constraints = spec.get("matchConstraints")
    if not isinstance(constraints, Mapping) or not constraints.get("resourceRules"):
        causes.append(Cause("FieldValueRequired", "Required value", "spec.matchConstraints.resourceRules"))
    if spec.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
        causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{spec.get("failurePolicy")}": '
                            'supported values: "Fail", "Ignore"', "spec.failurePolicy"))
    validations = spec.get("validations") or []
    if not validations and not spec.get("auditAnnotations"):
        causes.append(Cause("FieldValueRequired", "Required value: validations or auditAnnotations must contain "
                            "at least one item", "spec.validations"))
    for i, v in enumerate(validations):
        causes += _compile_cause(v.get("expression"), f"spec.validations[{i}].expression")
        reason = v.get("reason")
        if reason and reason not in _CODES:
            causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{reason}": supported values: '
                                + ", ".join(f'"{r}"' for r in _CODES), f"spec.validations[{i}].reason"))
    for i, c in enumerate(spec.get("matchConditions") or []):
        causes += _compile_cause(c.get("expression"), f"spec.matchConditions[{i}].expression")
    for i, v in enumerate(spec.get("variables") or []):
        causes += _compile_cause(v.get("expression"), f"spec.variables[{i}].expression")
    return causes


def check_binding(obj: Mapping[str, Any]) -> list[Cause]:
    """A binding names its policy and at least one validation action; Deny and Warn together are refused."""
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    if not spec.get("policyName"):
        causes.append(Cause("FieldValueRequired", "Required value", "spec.policyName"))
    actions = spec.get("validationActions") or []
    if not actions:
        causes.append(Cause("FieldValueRequired", "Required value: at least one validation action is required",
                            "spec.validationActions"))
    for i, a in enumerate(actions):
        if a not in _ACTIONS:
            causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{a}": supported values: "Audit", '
                                '"Deny", "Warn"', f"spec.validationActions[{i}]"))
        elif a in actions[:i]:
            causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{a}"', f"spec.validationActions[{i}]"))
    if "Deny" in actions and "Warn" in actions:
        causes.append(Cause("FieldValueInvalid", "Invalid value: " + repr(list(actions)) + ": must not contain "
                            "both Deny and Warn (repeating the same validation failure information in the API "
                            "response and headers serves no purpose)", "spec.validationActions"))
    ref = spec.get("paramRef")
    if ref and ref.get("parameterNotFoundAction") not in ("Allow", "Deny"):
        causes.append(Cause("FieldValueRequired", "Required value", "spec.paramRef.parameterNotFoundAction"))
    return causes


def selector_matches(selector: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> bool:
    """A paramRef selector over an object's labels (empty selector: every object)."""
    return label_selector_matches(selector or {}, (obj.get("metadata") or {}).get("labels") or {})
