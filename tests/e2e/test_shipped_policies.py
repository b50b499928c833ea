"""The admission policies `kubectl apply -k manifests/emulated` installs, exercised with the pinned kubectl:

- gpuops-secret-references: a GPUNodeGroup or SpotPool may name Secrets only in the operator's namespace and the
  namespaces ConfigMap gpuops-secret-namespaces lists; an update that keeps an object's references is never
  refused (the operator's finalizer writes), and without the ConfigMap the check stands aside (the operator and
  its namespaced RBAC still refuse).
- gpuops-mig-agent-own-node: the MIG agent's token, bound to node A, may write MigNode A and the status of
  claims placed on A, and is refused (403, the policy's words) for node B's MigNode and claims; a token bound
  to no node is refused outright; nobody else is affected.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from running_server import RunningServer

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"
UUID = "GPU-5b1c7d2e-0f4a-4e8b-9c3d-2a1b0c9d8e7f"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path_factory.mktemp("policies") / "admin.kubeconfig", tls=True)
    rs.start()
    try:
        run(rs, "apply", "-k", str(ROOT / "manifests" / "emulated"))
        for node in ("node-a", "node-b"):
            run(rs, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                         "metadata": {"name": node}}))
        yield rs
    finally:
        rs.stop()


def kubectl(rs: RunningServer, *args: str, stdin: str | None = None, token: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    auth = ["--token", token] if token else []
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(rs.kubeconfig), *auth, *args], input=stdin,
                          capture_output=True, text=True, timeout=60)


def run(rs: RunningServer, *args: str, stdin: str | None = None, token: str | None = None) -> str:
    out = kubectl(rs, *args, stdin=stdin, token=token)
    assert out.returncode == 0, out.stderr
    return out.stdout


def refused(rs: RunningServer, *args: str, stdin: str | None = None, token: str | None = None) -> str:
    out = kubectl(rs, *args, stdin=stdin, token=token)
    assert out.returncode != 0, out.stdout
    return out.stderr


def group(name: str, secret_namespace: str) -> str:
    return json.dumps({
        "apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup", "metadata": {"name": name},
        "spec": {"nodeName": name, "gpuCount": 1,
                 "scaleUp": {"url": "https://bmc.example/on",
                             "secretRef": {"name": "bmc", "namespace": "gpuops-system"}},
                 "scaleDown": {"url": "https://bmc.example/off",
                               "secretRef": {"name": "bmc", "namespace": secret_namespace}}}})


def pool(name: str, secret_namespace: str) -> str:
    return json.dumps({
        "apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool", "metadata": {"name": name},
        "spec": {"provider": "aws", "minimum": 0, "maximum": 1,
                 "credentialsSecretRef": {"name": "keys", "namespace": secret_namespace},
                 "template": {"region": "us-east-1", "instanceTypes": ["g4dn.xlarge"]}}})


DENIED = ("is forbidden: ValidatingAdmissionPolicy 'gpuops-secret-references' with binding "
          "'gpuops-secret-references' denied request: may name a Secret only in gpuops-system")


def test_secret_references_stay_in_the_allowed_namespaces(cluster: RunningServer) -> None:
    err = refused(cluster, "apply", "-f", "-", stdin=group("g-kube", "kube-system"))
    assert f'gpunodegroups.gpuops.io "g-kube" {DENIED}' in err and "not in kube-system" in err, err
    err = refused(cluster, "apply", "-f", "-", stdin=pool("p-kube", "kube-system"))
    assert f'spotpools.gpuops.io "p-kube" {DENIED}' in err and "ConfigMap gpuops-system/gpuops-secret-namespaces" \
        in err, err
    run(cluster, "apply", "-f", "-", stdin=group("g-home", "gpuops-system"))
    run(cluster, "apply", "-f", "-", stdin=pool("p-home", "gpuops-system"))

    # the list widened: team-a is allowed too
    run(cluster, "patch", "configmap", "gpuops-secret-namespaces", "-n", "gpuops-system", "--type", "merge",
        "-p", json.dumps({"data": {"namespaces": " team-a ,, cloud-keys"}}))
    run(cluster, "apply", "-f", "-", stdin=pool("p-team", "team-a"))
    assert "not in kube-system" in refused(cluster, "apply", "-f", "-", stdin=pool("p-team", "kube-system"))

    # narrowed again: p-team keeps working (its references unchanged), but cannot move to another namespace
    run(cluster, "patch", "configmap", "gpuops-secret-namespaces", "-n", "gpuops-system", "--type", "merge",
        "-p", json.dumps({"data": {"namespaces": ""}}))
    run(cluster, "label", "spotpool", "p-team", "owner=team-a")
    run(cluster, "patch", "spotpool", "p-team", "--type", "merge", "-p",
        json.dumps({"metadata": {"finalizers": ["gpuops.io/spotpool-instances"]}}))
    assert "not in cloud-keys" in refused(cluster, "apply", "-f", "-", stdin=pool("p-team", "cloud-keys"))

    # without the ConfigMap the policy stands aside (parameterNotFoundAction Allow): nothing can get stuck
    run(cluster, "delete", "configmap", "gpuops-secret-namespaces", "-n", "gpuops-system")
    run(cluster, "patch", "spotpool", "p-team", "--type", "merge", "-p", json.dumps({"metadata": {"finalizers": []}}))
    run(cluster, "apply", "-f", "-", stdin=group("g-anywhere", "kube-system"))


def agent_token(rs: RunningServer, node: str | None) -> str:
    bound = ["--bound-object-kind", "Node", "--bound-object-name", node] if node else []
    return run(rs, "create", "token", "gpuops-mig-agent", "-n", "gpuops-node", *bound).strip()


def mig_node(name: str) -> str:
    return json.dumps({"apiVersion": "gpuops.io/v1alpha1", "kind": "MigNode", "metadata": {"name": name},
                       "spec": {"nodeName": name}})


def claim(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"podName": name, "podUID": f"{name}-uid", "nodeName": node, "gpuUUID": UUID,
                     "profile": "3g.40gb", "start": 4, "size": 4}}


def test_a_mig_agent_writes_only_its_own_node(cluster: RunningServer) -> None:
    a, unbound = agent_token(cluster, "node-a"), agent_token(cluster, None)
    run(cluster, "create", "-f", "-", stdin=mig_node("node-a"), token=a)
    err = refused(cluster, "create", "-f", "-", stdin=mig_node("node-b"), token=a)
    assert ('mignodes.gpuops.io "node-b" is forbidden: ValidatingAdmissionPolicy \'gpuops-mig-agent-own-node\' '
            "with binding 'gpuops-mig-agent-own-node' denied request: the MIG agent of node node-a may write only "
            "MigNode node-a, not node-b") in err, err
    run(cluster, "create", "-f", "-", stdin=mig_node("node-b"))  # the admin may
    status = json.dumps({"status": {"backend": "emulated"}})
    run(cluster, "patch", "mignode", "node-a", "--subresource", "status", "--type", "merge", "-p", status, token=a)
    assert "may write only MigNode node-a, not node-b" in refused(
        cluster, "patch", "mignode", "node-b", "--subresource", "status", "--type", "merge", "-p", status, token=a)

    for c in (claim("on-a", "node-a"), claim("on-b", "node-b")):
        run(cluster, "create", "-f", "-", stdin=json.dumps(c))
    failed = json.dumps({"status": {"phase": "Failed", "message": "forged"}})
    created = json.dumps({"status": {"phase": "Created", "deviceUUID": "MIG-0f4a4e8b-9c3d-2a1b-0c9d-8e7f5b1c7d2e"}})
    run(cluster, "patch", "allocationclaim", "on-a", "--subresource", "status", "--type", "merge", "-p", created,
        token=a)
    err = refused(cluster, "patch", "allocationclaim", "on-b", "--subresource", "status", "--type", "merge",
                  "-p", failed, token=a)
    assert ("is forbidden: ValidatingAdmissionPolicy 'gpuops-mig-agent-own-node' with binding "
            "'gpuops-mig-agent-own-node' denied request: the MIG agent of node node-a may write only claims placed "
            "on that node, not default/on-b") in err, err
    phase = run(cluster, "get", "allocationclaim", "on-b", "-o", "jsonpath={.status.phase}")
    assert phase in ("", "Pending"), phase  # untouched

    err = refused(cluster, "patch", "mignode", "node-a", "--subresource", "status", "--type", "merge", "-p", status,
                  token=unbound)
    assert "the MIG agent's token is bound to no node" in err, err
