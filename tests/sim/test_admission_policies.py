"""ValidatingAdmissionPolicy on the emulated API server, over HTTP as clients see it: denials worded and coded as
kube-apiserver words them, Warn as a warning header, matchConditions, variables, params (found, missing with
Allow or Deny, several by selector), the failure policy on evaluation errors, a binding's matchResources, the
objects refused at creation, and bound tokens that name their node (what node-confinement policies key on)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clients import Admin
from running_server import RunningServer

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
NS = "default"
CM = f"/api/v1/namespaces/{NS}/configmaps"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "kubeconfig")
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


def admin(rs: RunningServer) -> Admin:
    return Admin(rs.url, rs.token)


def configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels or {}},
            "data": data}


def policy(name: str, validations: list[dict[str, Any]], operations: tuple[str, ...] = ("CREATE", "UPDATE"),
           **spec: Any) -> dict[str, Any]:
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": ["configmaps"]}]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"matchConstraints": {"resourceRules": rules}, "validations": validations, **spec}}


def binding(name: str, policy_name: str, actions: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": policy_name, "validationActions": actions, **spec}}


def install(a: Admin, *objects: dict[str, Any]) -> None:
    for obj in objects:
        path = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        code, out = a.request("POST", path, obj)
        assert code == 201, out


ONLY_OK = [{"expression": "object.data.x == 'ok'", "message": "x must be ok", "reason": "Forbidden"}]


def test_a_denial_reads_as_kube_apiserver_words_it(server: RunningServer) -> None:
    a = admin(server)
    install(a, policy("only-ok", ONLY_OK, ("CREATE", "UPDATE", "DELETE")), binding("only-ok-b", "only-ok", ["Deny"]),
            policy("plain", [{"expression": "!has(object.data.y)"}]), binding("plain-b", "plain", ["Deny"]))
    code, out = a.request("POST", CM, configmap("bad", {"x": "no"}))
    message = "ValidatingAdmissionPolicy 'only-ok' with binding 'only-ok-b' denied request: x must be ok"
    assert (code, out["reason"], out["message"]) == (403, "Forbidden", f'configmaps "bad" is forbidden: {message}')
    assert out["details"] == {"name": "bad", "kind": "configmaps", "causes": [{"message": message}]}
    # no reason: Invalid (422); no message: the expression itself
    code, out = a.request("POST", CM, configmap("y", {"x": "ok", "y": "1"}))
    assert (code, out["reason"]) == (422, "Invalid")
    assert out["message"].endswith("ValidatingAdmissionPolicy 'plain' with binding 'plain-b' denied request: "
                                   "failed expression: !has(object.data.y)")
    assert a.request("POST", CM, configmap("good", {"x": "ok"}))[0] == 201
    # an update is judged on the new object; a DELETE has only oldObject (`object` is null: reading it errs,
    # which failurePolicy Fail turns into a denial)
    assert a.request("PATCH", f"{CM}/good", {"data": {"x": "no"}}, "application/merge-patch+json")[0] == 403
    code, out = a.request("DELETE", f"{CM}/good")
    assert code == 422 and "expression 'object.data.x == 'ok'' resulted in error" in out["message"], out


@pytest.mark.apiserver_warnings("Validation failed for ValidatingAdmissionPolicy 'only-ok' with binding 'warn'")
def test_warn_admits_and_kubectl_shows_the_warning(server: RunningServer, tmp_path: Path) -> None:
    install(admin(server), policy("only-ok", ONLY_OK), binding("warn", "only-ok", ["Warn", "Audit"]))
    out = subprocess.run([str(KUBECTL), "--kubeconfig", str(server.kubeconfig), "apply", "-f", "-"],
                         input=json.dumps(configmap("w", {"x": "no"})), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'only-ok' with binding 'warn': x must be ok"
            in out.stderr), out.stderr
    assert "configmap/w created" in out.stdout, out.stdout


def test_match_conditions_variables_and_message_expressions(server: RunningServer) -> None:
    a = admin(server)
    install(a, policy(
        "sized", [{"expression": "variables.size <= variables.limit",
                   "messageExpression": "'size ' + string(variables.size) + ' is over ' + string(variables.limit)"}],
        matchConditions=[{"name": "labelled",
                         "expression": "has(object.metadata.labels) && 'checked' in object.metadata.labels"}],
        variables=[{"name": "limit", "expression": "2"},
                   {"name": "size", "expression": "size(object.data) + variables.limit - 2"}]),
        binding("sized-b", "sized", ["Deny"]))
    assert a.request("POST", CM, configmap("unchecked", {"a": "1", "b": "2", "c": "3"}))[0] == 201
    code, out = a.request("POST", CM, configmap("big", {"a": "1", "b": "2", "c": "3"}, {"checked": "y"}))
    assert code == 422 and out["message"].endswith("denied request: size 3 is over 2"), out
    assert a.request("POST", CM, configmap("small", {"a": "1"}, {"checked": "y"}))[0] == 201


def test_params_found_missing_and_selected(server: RunningServer) -> None:
    a = admin(server)
    assert a.request("POST", CM, configmap("limits", {"max": "2"}))[0] == 201
    check = [{"expression": "size(object.data) <= int(params.data.max)",
              "messageExpression": "'at most ' + params.data.max + ' keys (' + params.metadata.name + ')'"}]
    install(a, policy("limited", check, paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
                      matchConditions=[{"name": "not-a-param", "expression": "!has(object.data.max)"}]),
            binding("by-name", "limited", ["Deny"],
                    paramRef={"name": "limits", "namespace": NS, "parameterNotFoundAction": "Deny"}))
    code, out = a.request("POST", CM, configmap("three", {"a": "1", "b": "2", "c": "3"}))
    assert code == 422 and out["message"].endswith("at most 2 keys (limits)"), out
    assert a.request("POST", CM, configmap("two", {"a": "1", "b": "2"}))[0] == 201
    # the param gone: Deny refuses every request the binding covers
    assert a.request("DELETE", f"{CM}/limits")[0] == 200
    code, out = a.request("POST", CM, configmap("one", {"a": "1"}))
    assert code == 422 and out["message"].endswith(
        "denied request: failed to configure binding: no params found for policy binding with `Deny` "
        "parameterNotFoundAction"), out
    # Allow admits; a selector evaluates the policy once per param, each may deny
    code, out = a.request("PUT", f"{BINDINGS}/by-name", {**binding("by-name", "limited", ["Deny"], paramRef={
        "selector": {"matchLabels": {"kind": "limit"}}, "namespace": NS, "parameterNotFoundAction": "Allow"}),
        "metadata": {"name": "by-name", "resourceVersion": a.request("GET", f"{BINDINGS}/by-name")[1]
                     ["metadata"]["resourceVersion"]}})
    assert code == 200, out
    assert a.request("POST", CM, configmap("many", {"a": "1", "b": "2", "c": "3", "d": "4"}))[0] == 201
    for name, top in (("loose", "9"), ("tight", "1")):
        assert a.request("POST", CM, configmap(name, {"max": top}, {"kind": "limit"}))[0] == 201
    code, out = a.request("POST", CM, configmap("pair", {"a": "1", "b": "2"}))
    assert code == 422 and out["message"].endswith("at most 1 keys (tight)"), out


def test_failure_policy_decides_what_an_evaluation_error_means(server: RunningServer) -> None:
    a = admin(server)
    erring = [{"expression": "object.data.missing == 'x'"}]
    install(a, policy("fails", erring, failurePolicy="Fail"), binding("fails-b", "fails", ["Deny"]))
    code, out = a.request("POST", CM, configmap("c1", {"a": "1"}))
    assert code == 422 and "expression 'object.data.missing == 'x'' resulted in error: no such key" in out[
        "message"], out
    assert a.request("DELETE", f"{POLICIES}/fails")[0] == 200
    install(a, policy("ignores", erring, failurePolicy="Ignore"), binding("ignores-b", "ignores", ["Deny"]))
    assert a.request("POST", CM, configmap("c2", {"a": "1"}))[0] == 201


def test_a_binding_narrows_the_policy_to_its_match_resources(server: RunningServer) -> None:
    a = admin(server)
    assert a.request("POST", "/api/v1/namespaces", {"metadata": {"name": "strict", "labels": {"env": "prod"}}})[
        0] == 201
    install(a, policy("only-ok", ONLY_OK), binding("prod-only", "only-ok", ["Deny"], matchResources={
        "namespaceSelector": {"matchLabels": {"env": "prod"}}}))
    assert a.request("POST", CM, configmap("lax", {"x": "no"}))[0] == 201
    assert a.request("POST", "/api/v1/namespaces/strict/configmaps", configmap("no", {"x": "no"}))[0] == 403
    # a policy with no binding does nothing
    install(a, policy("unbound", [{"expression": "false"}]))
    assert a.request("POST", CM, configmap("free", {"x": "no"}))[0] == 201


def test_policies_and_bindings_that_cannot_work_are_refused(server: RunningServer) -> None:
    a = admin(server)
    code, out = a.request("POST", POLICIES, policy("broken", [{"expression": "object.data.x =="}]))
    assert code == 422 and "spec.validations[0].expression" in out["message"], out
    code, out = a.request("POST", POLICIES, policy("unknown", [{"expression": "nosuch.x == 1"}]))
    assert code == 422 and "undeclared reference to 'nosuch'" in out["message"], out
    no_rules = policy("no-rules", ONLY_OK)
    no_rules["spec"]["matchConstraints"] = {}
    code, out = a.request("POST", POLICIES, no_rules)
    assert code == 422 and "spec.matchConstraints.resourceRules" in out["message"], out
    code, out = a.request("POST", BINDINGS, binding("none", "p", []))
    assert code == 422 and "spec.validationActions" in out["message"], out
    code, out = a.request("POST", BINDINGS, binding("both", "p", ["Deny", "Warn"]))
    assert code == 422 and "must not contain both Deny and Warn" in out["message"], out
    code, out = a.request("POST", POLICIES, policy("ok", ONLY_OK))
    assert code == 201 and out["spec"]["failurePolicy"] == "Fail", out  # defaulted as upstream


def test_bound_tokens_name_the_node_a_policy_can_confine_to(server: RunningServer) -> None:
    """A token bound to a Node, or to a pod scheduled on one, carries authentication.kubernetes.io/node-name."""
    a = admin(server)
    for body in ({"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}):
        assert a.request("POST", "/api/v1/nodes", body)[0] == 201
    assert a.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "agent"}})[0] == 201
    pod = {"metadata": {"name": "agent-n2"}, "spec": {"nodeName": "n2", "serviceAccountName": "agent",
                                                       "containers": [{"name": "c", "image": "x"}]}}
    assert a.request("POST", f"/api/v1/namespaces/{NS}/pods", pod)[0] == 201
    install(a, policy("own-node", [{
        "expression": "object.metadata.name.startsWith(request.userInfo.extra['authentication.kubernetes.io/"
                      "node-name'][0] + '-')", "reason": "Forbidden"}],
        matchConditions=[{"name": "agent", "expression": "request.userInfo.username.endsWith(':agent')"}]),
        binding("own-node-b", "own-node", ["Deny"]))

    def token(kind: str, name: str) -> str:
        code, out = a.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/agent/token", {
            "spec": {"boundObjectRef": {"kind": kind, "apiVersion": "v1", "name": name}}})
        assert code == 201, out
        return str(out["status"]["token"])

    by_node, by_pod = Admin(server.url, token("Node", "n1")), Admin(server.url, token("Pod", "agent-n2"))
    assert by_node.request("POST", CM, configmap("n1-state", {}))[0] == 201
    assert by_node.request("POST", CM, configmap("n2-state", {}))[0] == 403
    assert by_pod.request("POST", CM, configmap("n2-state", {}))[0] == 201
    code, review = a.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                             {"spec": {"token": token("Pod", "agent-n2")}})
    assert code == 201, review
    extra = review["status"]["user"]["extra"]
    assert extra["authentication.kubernetes.io/node-name"] == ["n2"], review
    assert extra["authentication.kubernetes.io/pod-name"] == ["agent-n2"], review
    assert a.request("POST", CM, configmap("admin-anything", {}))[0] == 201  # the condition leaves others out
