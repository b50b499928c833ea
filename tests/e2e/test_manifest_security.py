"""What the rendered manifests promise about security, checked on `kubectl kustomize` output. The emulated API
server has no PodSecurity admission, so the "restricted" profile is checked here field by field (the rules of
the Pod Security Standards' restricted level that apply to our pods), together with the Dockerfile's user."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def rendered(folder: str) -> list[dict[str, Any]]:
    out = subprocess.run([KUBECTL, "kustomize", str(ROOT / folder)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def image_user() -> int:
    users = re.findall(r"^USER\s+(\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert users, "the Dockerfile must end with a numeric USER"
    return int(users[-1])


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security Standards' restricted checks that can apply to a pod spec like ours."""
    bad: list[str] = []
    psc = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            bad.append(f"spec.{flag}")
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            bad.append(f"volume {v['name']} is a hostPath")
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        where = f"container {c['name']}"
        if sc.get("privileged"):
            bad.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if caps.get("drop") != ["ALL"]:
            bad.append(f"{where}: capabilities.drop must be [ALL]")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{where}: adds capabilities {caps['add']}")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            bad.append(f"{where}: runAsNonRoot")
        if 0 in (sc.get("runAsUser"), psc.get("runAsUser")):
            bad.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        if not sc.get("readOnlyRootFilesystem"):  # not a PSS rule, but what we promise
            bad.append(f"{where}: readOnlyRootFilesystem")
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in c:
                bad.append(f"{where}: no {probe}")
        res = c.get("resources") or {}
        if not (res.get("requests") and res.get("limits", {}).get("memory")):
            bad.append(f"{where}: requests and a memory limit")
    return bad


def test_the_operator_meets_the_restricted_profile_and_runs_as_the_images_user() -> None:
    objs = rendered("manifests")
    ns = one(objs, "Namespace", "gpuops-system")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deploy = one(objs, "Deployment", "gpuops-controller-manager")
    pod = deploy["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsUser"] == image_user() != 0
    assert deploy["spec"]["replicas"] == 2 and "--leader-elect" in pod["containers"][0]["args"]
    probes = {c["livenessProbe"]["httpGet"]["path"] for c in pod["containers"]}
    probes |= {c["readinessProbe"]["httpGet"]["path"] for c in pod["containers"]}
    assert probes == {"/healthz", "/readyz"}
    pdb = one(objs, "PodDisruptionBudget", "gpuops-controller-manager")
    assert pdb["spec"]["minAvailable"] == 1


def test_the_check_catches_a_weakened_pod() -> None:
    pod = one(rendered("manifests"), "Deployment", "gpuops-controller-manager")["spec"]["template"]["spec"]
    weak = yaml.safe_load(yaml.safe_dump(pod))
    weak["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    weak["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    weak["securityContext"]["runAsUser"] = 0
    assert len(restricted_violations(weak)) == 3


@pytest.mark.parametrize(("folder", "name"), [("manifests", "gpuops-mig-agent"),
                                               ("manifests/emulated", "gpuops-mig-agent-emulated")])
def test_the_mig_agent_has_only_what_nvml_needs(folder: str, name: str) -> None:
    objs = rendered(folder)
    ds = one(objs, "DaemonSet", name)
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert not sc.get("privileged") and not any(pod.get(f) for f in ("hostNetwork", "hostPID", "hostIPC"))
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"].get("add", []) == (["SYS_ADMIN"] if folder == "manifests" else [])
    assert sc["runAsUser"] == 0  # the kubelet's device-plugin directory and /dev/nvidia-caps are root's
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/device-plugins" in host_paths
    assert host_paths <= {"/var/lib/kubelet/device-plugins", "/run/gpuops"}  # the emulated driver's state
    assert {"livenessProbe", "readinessProbe"} <= set(agent)
    assert any(t.get("operator") == "Exists" and "key" not in t for t in pod["tolerations"])
    if folder == "manifests":
        assert pod["nodeSelector"] == {"nvidia.com/mig.capable": "true"}
    ns = one(objs, "Namespace", "gpuops-node")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
