"""How the emulated container runtime reads a pod spec: the environment Kubernetes documents (envFrom, then env
in order, `$(VAR)` expansion with `$$` escapes, field/ConfigMap/Secret references, optional ones), the command
line, and paths under volume mounts."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops_sim.cluster.podspec import (
    ContainerConfigError,
    command_line,
    container_env,
    expand,
    mount_dirs,
    rewrite_paths,
)

POD: dict[str, Any] = {
    "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "node-a", "serviceAccountName": "web",
             "volumes": [{"name": "certs", "emptyDir": {}}, {"name": "dp", "hostPath": {"path": "/var/lib/dp"}},
                         {"name": "token", "projected": {"sources": []}}]},
    "status": {"podIP": "10.244.0.7", "hostIP": "172.16.0.1"},
}
OBJECTS: dict[tuple[str, str, str], Mapping[str, Any]] = {
    ("ConfigMap", "shop", "settings"): {"data": {"mode": "fast", "level": "3"}},
    ("Secret", "shop", "keys"): {"data": {"token": base64.b64encode(b"s3cret").decode()}},
}


def lookup(kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    return OBJECTS.get((kind, namespace, name))


def test_expansion_follows_the_documented_rules() -> None:
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)", env) == "x-y"
    assert expand("$(MISSING)", env) == "$(MISSING)"  # an undefined reference stays as written
    assert expand("$$(A)", env) == "$(A)"  # $$ escapes
    assert expand("$$$(A)", env) == "$x"
    assert expand("$(A", env) == "$(A"
    assert expand("cost: $5", env) == "cost: $5"


@given(st.text(alphabet="ab$()AB ", max_size=30), st.dictionaries(st.sampled_from(["a", "A", "B"]), st.text()))
def test_escaped_text_expands_to_itself(text: str, env: dict[str, str]) -> None:
    assert expand(text.replace("$", "$$"), env) == text


@given(st.text(alphabet="ab()AB ", max_size=30), st.dictionaries(st.sampled_from(["a", "A", "B"]), st.text()))
def test_text_without_references_is_unchanged(text: str, env: dict[str, str]) -> None:
    assert expand(text, env) == text


def test_env_from_fields_configmaps_and_secrets_in_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "token"}}},
                {"name": "WHERE", "value": "$(NODE)/$(POD_IP)"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "LATER", "value": "$(POD_IP)"},
                {"name": "OPTIONAL", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k",
                                                                      "optional": True}}}],
    }
    env = container_env(POD, container, lookup)
    assert env == {"CFG_mode": "fast", "CFG_level": "3", "NODE": "node-a", "APP": "web", "TOKEN": "s3cret",
                   "WHERE": "node-a/$(POD_IP)", "POD_IP": "10.244.0.7", "LATER": "10.244.0.7"}


@pytest.mark.parametrize(("var", "needle"), [
    ({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}, 'configmap "absent" not found'),
    ({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope"}}}, "couldn't find key nope"),
    ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.priority"}}}, "not supported"),
])
def test_a_reference_that_cannot_resolve_is_a_config_error(var: dict[str, Any], needle: str) -> None:
    with pytest.raises(ContainerConfigError, match=needle):
        container_env(POD, {"env": [var]}, lookup)


def test_mounts_and_paths(tmp_path: Path) -> None:
    container = {"volumeMounts": [{"name": "certs", "mountPath": "/var/run/certs"},
                                  {"name": "dp", "mountPath": "/var/lib/kubelet/device-plugins"},
                                  {"name": "token", "mountPath": "/var/run/secrets/token"}]}

    def place(volume: Mapping[str, Any]) -> Path | None:
        return None if "projected" in volume else tmp_path / str(volume["name"])

    mounts = mount_dirs(POD, container, place)
    assert mounts == {"/var/run/certs": tmp_path / "certs", "/var/lib/kubelet/device-plugins": tmp_path / "dp"}
    assert rewrite_paths("--cert-dir=/var/run/certs", mounts) == f"--cert-dir={tmp_path}/certs"
    assert rewrite_paths("/var/run/certs/tls.crt", mounts) == f"{tmp_path}/certs/tls.crt"
    assert rewrite_paths("/var/run/certsX", mounts) == "/var/run/certsX"  # not under the mount
    assert rewrite_paths("/opt/var/run/certs", mounts) == "/opt/var/run/certs"


def test_command_line_runs_the_image_entrypoint() -> None:
    entry = ["/venv/bin/gpuops"]
    env = {"NODE": "n1"}
    assert command_line({"args": ["agent", "--node-name=$(NODE)"]}, env, entry, ("gpuops",)) == \
        ["/venv/bin/gpuops", "agent", "--node-name=n1"]
    assert command_line({"command": ["/usr/local/bin/gpuops", "run"], "args": ["--x"]}, env, entry, ("gpuops",)) == \
        ["/venv/bin/gpuops", "run", "--x"]
    with pytest.raises(ContainerConfigError, match="only the image's own entrypoint"):
        command_line({"command": ["sh", "-c", "echo"]}, env, entry, ("gpuops",))
