"""Every imperative command of the pinned kubectl that needs no container runtime, against the emulator.

kubectl's typed clients send built-in kinds in protobuf and prefer protobuf answers, so each `create`
here goes through the protobuf decoder and each typed read through the encoder, with Go's own codec on the
other side. Each create is checked against an oracle we did not write: the JSON that kubectl itself renders
for the same command (`--dry-run=client -o json`), created through the JSON path in a second namespace;
the two stored objects must be identical but for identity, time and ownership bookkeeping.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from running_server import RunningServer

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"

VOLATILE_META = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace", "generation")


class Kubectl:
    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                           capture_output=True, text=True, timeout=60, cwd=self.workdir)
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr or p.stdout}")
        return p

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    tmp = tmp_path_factory.mktemp("kubectl-imperative")
    rs = RunningServer(tmp / "kubeconfig", tls=True)
    rs.start()
    try:
        k = Kubectl(tmp / "kubeconfig", tmp)
        for ns in ("by-protobuf", "by-json"):
            k.run("create", "namespace", ns)
        yield k
    finally:
        rs.stop()


def _with(args: list[str], *flags: str) -> list[str]:
    """Flags go before a `--`: what follows it is the container's command."""
    if "--" in args:
        i = args.index("--")
        return [*args[:i], *flags, *args[i:]]
    return [*args, *flags]


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in VOLATILE_META}
    out = {**obj, "metadata": meta}
    if isinstance(obj.get("status"), dict):  # a controller may have written it at another second
        conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                      for c in obj["status"].get("conditions") or []]
        out["status"] = {**obj["status"], "conditions": conditions}
    spec = out.get("spec")
    if obj["kind"] == "Service" and isinstance(spec, dict):  # addresses are allocated per Service
        ports = [{k: v for k, v in p.items() if k != "nodePort"} for p in spec.get("ports") or []]
        out["spec"] = {**{k: v for k, v in spec.items() if k not in ("clusterIP", "clusterIPs")}, "ports": ports}
    if obj["kind"] == "Job" and isinstance(spec, dict):  # the uid-derived selector and labels
        out["spec"] = {k: v for k, v in spec.items() if k not in ("selector", "template")}
        meta.pop("labels", None)
    return out


CREATES: list[tuple[str, list[str]]] = [
    ("configmap/cm", ["create", "configmap", "cm", "--from-literal=a=b", "--from-literal=c=d"]),
    ("secret/generic", ["create", "secret", "generic", "generic", "--from-literal=k=v", "--type=example.com/t"]),
    ("secret/registry", ["create", "secret", "docker-registry", "registry", "--docker-server=r.example.com",
                         "--docker-username=u", "--docker-password=p"]),
    ("serviceaccount/robot", ["create", "serviceaccount", "robot"]),
    ("deployment/web", ["create", "deployment", "web", "--image=nginx:1.27", "--replicas=2", "--port=80"]),
    ("job/once", ["create", "job", "once", "--image=busybox", "--", "echo", "hi"]),
    ("cronjob/tick", ["create", "cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *", "--", "date"]),
    ("service/web", ["create", "service", "clusterip", "web", "--tcp=80:8080"]),
    ("service/nodes", ["create", "service", "nodeport", "nodes", "--tcp=80:8080"]),
    ("service/ext", ["create", "service", "externalname", "ext", "--external-name=example.com"]),
    ("role/reader", ["create", "role", "reader", "--verb=get,list", "--resource=pods,configmaps"]),
    ("rolebinding/reader", ["create", "rolebinding", "reader", "--role=reader", "--user=alice",
                            "--serviceaccount=kube-system:default"]),
    ("quota/small", ["create", "quota", "small", "--hard=pods=10,requests.cpu=2"]),
    ("pdb/web", ["create", "pdb", "web", "--selector=app=web", "--min-available=1"]),
    ("ingress/web", ["create", "ingress", "web", "--rule=example.com/api*=web:80", "--class=default"]),
]


@pytest.mark.parametrize(("ref", "args"), CREATES, ids=[r for r, _ in CREATES])
def test_create_by_protobuf_stores_what_the_json_path_stores(cluster: Kubectl, ref: str, args: list[str]) -> None:
    rendered = json.loads(cluster.run(*_with(args, "-n", "by-json", "--dry-run=client", "-o", "json")).stdout)
    cluster.run("create", "-n", "by-json", "-f", "-", stdin=json.dumps(rendered))
    cluster.run(*_with(args, "-n", "by-protobuf"))
    kind = ref.split("/")[0]
    name = rendered["metadata"]["name"]
    by_protobuf = cluster.json("get", kind if kind != "quota" else "resourcequota", name, "-n", "by-protobuf")
    by_json = cluster.json("get", kind if kind != "quota" else "resourcequota", name, "-n", "by-json")
    assert _comparable(by_protobuf) == _comparable(by_json)


CLUSTER_CREATES: list[tuple[str, list[str]]] = [
    ("clusterrole/node-reader", ["create", "clusterrole", "node-reader", "--verb=get", "--resource=nodes"]),
    ("clusterrolebinding/node-reader", ["create", "clusterrolebinding", "node-reader",
                                        "--clusterrole=node-reader", "--group=ops"]),
    ("priorityclass/high", ["create", "priorityclass", "high", "--value=1000", "--description=important"]),
    ("namespace/team-a", ["create", "namespace", "team-a"]),
]


@pytest.mark.parametrize(("ref", "args"), CLUSTER_CREATES, ids=[r for r, _ in CLUSTER_CREATES])
def test_cluster_scoped_creates_match_their_json_rendering(cluster: Kubectl, ref: str, args: list[str]) -> None:
    rendered = json.loads(cluster.run(*args, "--dry-run=client", "-o", "json").stdout)
    cluster.run(*args)
    stored = cluster.json("get", ref)
    kept = {k: stored[k] for k in rendered}
    # What the server adds (defaults, namespace status and labels) comes on top of what kubectl sent.
    for key, value in rendered.items():
        if isinstance(value, dict) and key != "metadata":
            assert {k: kept[key].get(k) for k in value} == value, key
    assert stored["metadata"]["name"] == rendered["metadata"]["name"]


def test_secret_tls_from_files(cluster: Kubectl, tmp_path: Path) -> None:
    from gpuops_sim.apiserver.tls import make_serving_cert

    cert = make_serving_cert(["example.com"])
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    cluster.run("create", "secret", "tls", "site", "-n", "by-protobuf", f"--cert={tmp_path / 'tls.crt'}",
                f"--key={tmp_path / 'tls.key'}")
    secret = cluster.json("get", "secret", "site", "-n", "by-protobuf")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key"}
    assert "kubernetes.io/tls" in cluster.run("describe", "secret", "site", "-n", "by-protobuf").stdout


def test_create_token_for_the_default_service_account(cluster: Kubectl) -> None:
    token = cluster.run("create", "token", "default", "-n", "by-protobuf", "--duration=10m").stdout.strip()
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    out = json.loads(cluster.run("create", "--raw", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", "-",
                                 stdin=json.dumps(review)).stdout)
    assert out["status"]["user"]["username"] == "system:serviceaccount:by-protobuf:default"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "anchor", "namespace": "by-protobuf"}}
    cluster.run("create", "-f", "-", stdin=json.dumps(secret))
    uid = cluster.json("get", "secret", "anchor", "-n", "by-protobuf")["metadata"]["uid"]
    bound = cluster.run("create", "token", "default", "-n", "by-protobuf", "--bound-object-kind=Secret",
                        "--bound-object-name=anchor", f"--bound-object-uid={uid}").stdout.strip()
    review["spec"]["token"] = bound
    out = json.loads(cluster.run("create", "--raw", "/apis/authentication.k8s.io/v1/tokenreviews", "-f", "-",
                                 stdin=json.dumps(review)).stdout)
    assert out["status"]["authenticated"] is True


def test_default_service_account_and_root_ca_in_every_namespace(cluster: Kubectl) -> None:
    cluster.run("create", "namespace", "fresh")
    assert cluster.json("get", "serviceaccount", "default", "-n", "fresh")["metadata"]["name"] == "default"
    ca = cluster.json("get", "configmap", "kube-root-ca.crt", "-n", "fresh")["data"]["ca.crt"]
    assert ca.startswith("-----BEGIN CERTIFICATE-----")
    service = cluster.json("get", "service", "kubernetes", "-n", "default")
    assert service["spec"]["clusterIP"] == "10.96.0.1"


def test_scale_label_annotate_set_image_and_rollout_restart(cluster: Kubectl) -> None:
    ns = ["-n", "by-protobuf"]
    cluster.run("create", "deployment", "api", "--image=nginx:1.27", *ns)
    cluster.run("scale", "deployment", "api", "--replicas=3", *ns)
    scale = json.loads(cluster.run("get", "--raw", "/apis/apps/v1/namespaces/by-protobuf/deployments/api/scale").stdout)
    assert scale["spec"] == {"replicas": 3} and scale["status"]["selector"] == "app=api"
    cluster.run("label", "deployment", "api", "tier=web", *ns)
    cluster.run("annotate", "deployment", "api", "owner=team-a", *ns)
    cluster.run("set", "image", "deployment/api", "nginx=nginx:1.28", *ns)
    cluster.run("rollout", "restart", "deployment/api", *ns)
    got = cluster.json("get", "deployment", "api", *ns)
    assert got["metadata"]["labels"]["tier"] == "web" and got["metadata"]["annotations"]["owner"] == "team-a"
    template = got["spec"]["template"]
    assert template["spec"]["containers"][0]["image"] == "nginx:1.28"
    assert "kubectl.kubernetes.io/restartedAt" in template["metadata"]["annotations"]
    assert got["spec"]["replicas"] == 3 and got["spec"]["strategy"]["type"] == "RollingUpdate"


def test_describe_reads_through_protobuf(cluster: Kubectl) -> None:
    cluster.run("create", "configmap", "described", "--from-literal=k=v", "-n", "by-protobuf")
    out = cluster.run("describe", "configmap", "described", "-n", "by-protobuf").stdout
    assert "Name:         described" in out and "k:" in out


def test_cordon_uncordon_and_delete(cluster: Kubectl) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-1"}}
    cluster.run("create", "-f", "-", stdin=json.dumps(node))
    cluster.run("cordon", "worker-1")
    assert cluster.json("get", "node", "worker-1")["spec"]["unschedulable"] is True
    cluster.run("uncordon", "worker-1")
    assert not cluster.json("get", "node", "worker-1")["spec"].get("unschedulable")
    cluster.run("delete", "node", "worker-1")
    assert cluster.run("get", "node", "worker-1", check=False).returncode != 0


def test_exec_and_attach_are_refused_with_the_reason_and_logs_tell_the_lifecycle(cluster: Kubectl) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "by-protobuf"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    cluster.run("create", "-f", "-", stdin=json.dumps(pod))
    waiting = cluster.run("logs", "p", "-n", "by-protobuf", check=False)
    assert waiting.returncode != 0 and 'container "c" in pod "p" is waiting to start' in waiting.stderr
    for args in (["exec", "p", "--", "true"], ["attach", "p"]):
        p = cluster.run(*_with(args, "-n", "by-protobuf"), check=False)
        assert p.returncode != 0 and "is not available in the emulated cluster" in p.stderr, p.stderr
    status = {"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": "c", "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-01-01T00:00:00Z",
                                 "finishedAt": "2026-01-01T00:01:00Z"}}}]}}
    cluster.run("patch", "pod", "p", "-n", "by-protobuf", "--subresource=status", "--type=merge",
                "-p", json.dumps(status))
    lines = cluster.run("logs", "p", "-n", "by-protobuf", "--timestamps").stdout.splitlines()
    assert lines == ["2026-01-01T00:00:00Z container c started (image busybox)",
                     "2026-01-01T00:01:00Z container c exited with code 0 (Completed)"]
    tail = cluster.run("logs", "p", "-n", "by-protobuf", "--tail=1").stdout
    assert tail == "container c exited with code 0 (Completed)\n"


@pytest.mark.parametrize("mode", ["evict", "delete"])
def test_drain_evicts_or_deletes_the_pods_of_a_node(cluster: Kubectl, mode: str) -> None:
    node = f"drain-{mode}"
    cluster.run("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"on-{node}", "namespace": "by-protobuf"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}
    cluster.run("create", "-f", "-", stdin=json.dumps(pod))
    # --disable-eviction deletes through the typed client, which sends DeleteOptions in protobuf
    extra = ["--disable-eviction"] if mode == "delete" else []
    out = cluster.run("drain", node, "--force", "--grace-period=0", "--timeout=30s", *extra).stdout
    assert f"node/{node} drained" in out
    assert cluster.run("get", "pod", f"on-{node}", "-n", "by-protobuf", check=False).returncode != 0
    assert cluster.json("get", "node", node)["spec"]["unschedulable"] is True


def test_serviceaccount_admission(cluster: Kubectl) -> None:
    def pod(name: str, **spec: Any) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "by-protobuf"},
                           "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}})

    missing = cluster.run("create", "-f", "-", stdin=pod("nobody", serviceAccountName="ghost"), check=False)
    assert missing.returncode != 0
    assert 'error looking up service account by-protobuf/ghost: serviceaccount "ghost" not found' in missing.stderr
    cluster.run("create", "-f", "-", stdin=pod("mounted"))
    spec = cluster.json("get", "pod", "mounted", "-n", "by-protobuf")["spec"]
    (volume,) = spec["volumes"]
    assert volume["name"].startswith("kube-api-access-") and volume["projected"]["defaultMode"] == 420
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": volume["name"], "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    cluster.run("create", "-f", "-", stdin=pod("opted-out", automountServiceAccountToken=False))
    assert "volumes" not in cluster.json("get", "pod", "opted-out", "-n", "by-protobuf")["spec"]
