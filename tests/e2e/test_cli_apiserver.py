"""`gpuops sim apiserver` as a user runs it: a subprocess, a kubeconfig, the real kubectl."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
KUBECTL = str(BIN / "kubectl")
GPUOPS = str(BIN / "gpuops")

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gpuquotas.example.gpuops.io
spec:
  group: example.gpuops.io
  scope: Namespaced
  names: {plural: gpuquotas, singular: gpuquota, kind: GPUQuota, shortNames: [gq]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: GPUs, type: integer, jsonPath: .spec.gpus}
    - {name: Action, type: string, jsonPath: .spec.action}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [gpus]
            x-kubernetes-validations:
            - rule: "self.gpus <= 64"
              message: "gpus must be at most 64"
            properties:
              gpus: {type: integer, minimum: 1}
              action: {type: string, enum: [Evict, Pause, AlertOnly], default: AlertOnly}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"""

CR = """
apiVersion: example.gpuops.io/v1
kind: GPUQuota
metadata: {name: team-a}
spec: {gpus: 8}
"""


def _start(args: list[str], kubeconfig: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([GPUOPS, "sim", "apiserver", "--port", "0", "--kubeconfig", str(kubeconfig), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m.group(1))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("gpuops sim apiserver did not report its port")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    out = subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr}")
    return out


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    kc = tmp_path / "k.yaml"
    proc, port = _start([], kc)
    try:
        yield kc, port
    finally:
        _stop(proc)


def test_apply_crd_and_cr_with_default_validation(served: tuple[Path, int]) -> None:
    kc, port = served
    assert f"127.0.0.1:{port}" in kc.read_text()
    assert "created" in kubectl(kc, "apply", "-f", "-", stdin=CRD).stdout
    assert "created" in kubectl(kc, "apply", "-f", "-", stdin=CR).stdout
    table = kubectl(kc, "get", "gq").stdout.splitlines()
    assert table[0].split() == ["NAME", "GPUS", "ACTION"]
    assert table[1].split() == ["team-a", "8", "AlertOnly"]  # the schema default was applied
    obj = json.loads(kubectl(kc, "get", "gpuquota", "team-a", "-o", "json").stdout)
    assert obj["metadata"]["generation"] == 1 and obj["spec"]["action"] == "AlertOnly"


def test_invalid_custom_resources_are_refused_with_field_causes(served: tuple[Path, int]) -> None:
    kc, _ = served
    kubectl(kc, "apply", "-f", "-", stdin=CRD)
    bad = kubectl(kc, "apply", "-f", "-", stdin=CR.replace("gpus: 8", "gpus: 0, action: Drain"), check=False)
    assert bad.returncode != 0
    assert 'spec.action: Unsupported value: "Drain"' in bad.stderr
    assert "spec.gpus" in bad.stderr
    cel = kubectl(kc, "apply", "-f", "-", stdin=CR.replace("gpus: 8", "gpus: 65"), check=False)
    assert "gpus must be at most 64" in cel.stderr
    unknown = kubectl(kc, "apply", "-f", "-", stdin=CR.replace("gpus: 8", "gpus: 8, colour: red"), check=False)
    assert 'strict decoding error: unknown field "spec.colour"' in unknown.stderr


def test_state_survives_save_and_restore(tmp_path: Path) -> None:
    kc = tmp_path / "k.yaml"
    snap = tmp_path / "state.json"
    proc, _ = _start(["--save-on-exit", str(snap)], kc)
    try:
        kubectl(kc, "apply", "-f", "-", stdin=CRD)
        kubectl(kc, "apply", "-f", "-", stdin=CR)
    finally:
        _stop(proc)
    assert snap.exists()
    proc, _ = _start(["--restore", str(snap)], kc)
    try:
        assert kubectl(kc, "get", "gq", "team-a", "-o", "jsonpath={.spec.gpus}").stdout == "8"
    finally:
        _stop(proc)


def test_help_lists_the_commands_that_exist() -> None:
    out = subprocess.run([GPUOPS, "--help"], capture_output=True, text=True, check=True).stdout
    assert "sim" in out and "demo" in out
    sim = subprocess.run([GPUOPS, "sim", "--help"], capture_output=True, text=True, check=True).stdout
    assert "apiserver" in sim


def test_tls_serving_lets_kubectl_authenticate_with_a_token(tmp_path: Path) -> None:
    """kubectl sends bearer tokens only over TLS (client-go); --tls serves HTTPS with a CA in the kubeconfig."""
    kc = tmp_path / "k.yaml"
    proc = subprocess.Popen([GPUOPS, "sim", "apiserver", "--port", "0", "--tls", "--authorization", "RBAC",
                             "--kubeconfig", str(kc)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = proc.stdout.readline()
        assert "listening on https://127.0.0.1:" in line
        assert "certificate-authority-data" in kc.read_text()
        who = json.loads(kubectl(kc, "create", "--raw", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                 "-f", "-", stdin=json.dumps({
                                     "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                     "spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}})).stdout)
        assert who["status"]["allowed"] is True  # the admin token reached the server: RBAC allowed it
        assert "created" in kubectl(kc, "apply", "-f", "-", stdin=CRD).stdout
    finally:
        _stop(proc)
