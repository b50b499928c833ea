"""Secret data as kube-apiserver takes it: base64 wrapped over several lines (the TLS Secret example of the
Kubernetes docs) is accepted and stored without the line breaks; anything else that is not base64 is refused
naming the key."""

from __future__ import annotations

import base64
import subprocess
import textwrap
from pathlib import Path

from clients import Admin
from running_server import RunningServer

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
SECRETS = "/api/v1/namespaces/default/secrets"


def test_wrapped_base64_is_stored_unwrapped(apiserver: RunningServer) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\n" + bytes(range(256)) * 2 + b"\n-----END CERTIFICATE-----\n"
    wrapped = "\n".join(textwrap.wrap(base64.b64encode(pem).decode(), 76)) + "\n"
    manifest = ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: tls\ntype: kubernetes.io/tls\ndata:\n"
                "  tls.crt: |\n" + textwrap.indent(wrapped, "    ") + "  tls.key: " + base64.b64encode(b"k3y").decode()
                + "\n")
    out = subprocess.run([str(KUBECTL), "--kubeconfig", str(apiserver.kubeconfig), "apply", "-f", "-"],
                         input=manifest, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stored = Admin(apiserver.url, apiserver.token).request("GET", f"{SECRETS}/tls")[1]
    assert stored["data"]["tls.crt"] == base64.b64encode(pem).decode()  # one line, the same bytes
    assert base64.b64decode(stored["data"]["tls.key"]) == b"k3y"


def test_data_that_is_not_base64_is_refused_naming_the_key(apiserver: RunningServer) -> None:
    code, out = Admin(apiserver.url, apiserver.token).request("POST", SECRETS, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"}, "data": {"token": "not base64!\n"}})
    assert code == 422 and "data[token]: Invalid value: illegal base64 data" in out["message"], out
