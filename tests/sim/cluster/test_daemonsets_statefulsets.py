"""The DaemonSet and StatefulSet controllers in a whole emulated cluster, driven through real clients:
kubectl over TLS, kubernetes-asyncio (typed APIs and a watch) and the official `kubernetes` client.

Invariants that only hold between events (at most maxUnavailable nodes without a ready daemon pod, pod i not
created before pod i-1 is Ready) are checked on every change: by a store listener, which sees each write as
it lands, or by a pod watch, which sees them in resourceVersion order.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from kubernetes_asyncio import watch as awatch
from waiting import until_holds

from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import CONTROLLER_REVISIONS, DAEMONSETS, NODES, PODS, PVCS, STATEFULSETS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.daemonsets import DEFAULT_TOLERATIONS, daemon_tolerations, should_run, target_node
from gpuops_sim.cluster.revisions import fnv32, fnv32a, go_json, safe_encode, template_hash
from gpuops_sim.cluster.statefulsets import parent_and_ordinal
from gpuops_sim.scenario import parse

KUBECTL = str(Path(sys.executable).parent / "kubectl")
NS = "default"
FAST = {"bootSeconds": 0.05, "devicePluginSeconds": 0.02, "shutdownSeconds": 0.02}
SCENARIO = {
    "name": "workloads",
    "kubelet": {"startLatencySeconds": 0.03, "leaseSeconds": 0.5, "nodeStatusSeconds": 5, "events": True},
    "nodeGroups": [
        {"name": "cpu", "count": 3, **FAST},
        {"name": "gpu", "count": 1, **FAST,
         "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    ],
}
CPU_NODES = {"cpu-0", "cpu-1", "cpu-2"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Env:
    """A running cluster, a TLS kubeconfig, kubernetes-asyncio APIs and helpers to read and wait."""

    def __init__(self, cluster: SimCluster, kubeconfig: Path, api: aclient.ApiClient) -> None:
        self.c = cluster
        self.kubeconfig = kubeconfig
        self.apps = aclient.AppsV1Api(api)
        self.core = aclient.CoreV1Api(api)

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        cache = str(self.kubeconfig.parent / "kubectl-cache")
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", cache, *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    async def apply(self, obj: dict[str, Any]) -> None:
        await self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))

    async def official(self, fn: Callable[[Any], Any]) -> Any:
        """Call the official (blocking) client in a thread, so the emulator keeps answering."""
        def call() -> Any:
            api = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
            try:
                return fn(api)
            finally:
                api.close()

        return await asyncio.to_thread(call)

    def pods(self, app: str, *, live: bool = True) -> list[dict[str, Any]]:
        out = [p for p in self.c.access.iter(PODS, NS) if (p["metadata"].get("labels") or {}).get("app") == app]
        if live:
            out = [p for p in out if not p["metadata"].get("deletionTimestamp")]
        return sorted(out, key=lambda p: p["metadata"]["name"])

    def status(self, gr: tuple[str, str], name: str) -> dict[str, Any]:
        obj = self.c.access.get(gr, NS, name)
        return dict((obj or {}).get("status") or {})

    async def until(self, pred: Callable[[], Any], what: str, within: float = 10.0) -> Any:
        return await until_holds(what, pred, within)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    cluster = SimCluster(parse(SCENARIO), workload=False, tls=True)
    async with cluster:
        kubeconfig = tmp_path / "kubeconfig"
        cluster.write_kubeconfig(kubeconfig)
        assert await cluster.wait_ready(10)
        cfg = aclient.Configuration()
        await aconfig.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        async with aclient.ApiClient(cfg) as api:
            yield Env(cluster, kubeconfig, api)
        assert cluster.daemonsets.errors == 0 and cluster.statefulsets.errors == 0


def ready(pod: dict[str, Any] | None) -> bool:
    """Ready and not being deleted."""
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_image(env: Env, name: str) -> str:
    """The image of the named pod once it is Ready, else ""."""
    pod = env.c.access.get(PODS, NS, name)
    return str(pod["spec"]["containers"][0]["image"]) if pod is not None and ready(pod) else ""


def daemonset(name: str, image: str = "agent:1", **spec: Any) -> dict[str, Any]:
    pod_spec = {"containers": [{"name": "agent", "image": image}], **spec.pop("pod", {})}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec}, **spec}}


def statefulset(name: str, replicas: int = 3, image: str = "db:1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "db", "image": image}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                     **spec}}


class ReadyNodes:
    """On every pod change, how many nodes have a Ready daemon pod of `app` (the minimum and maximum seen)."""

    def __init__(self, env: Env, app: str) -> None:
        self.env = env
        self.app = app
        self.low = 10**6
        self.most_pods = 0
        env.c.server.store.add_listener(self)

    def __call__(self, ev: WatchEvent) -> None:
        if ev.gr != PODS or (ev.new.obj["metadata"].get("labels") or {}).get("app") != self.app:
            return
        pods = self.env.pods(self.app)
        self.low = min(self.low, len({p["spec"].get("nodeName") for p in pods if ready(p)}))
        self.most_pods = max(self.most_pods, len(pods))


# ------------------------------------------------------------------------------------------ pure helpers


def test_hashes_and_go_json_follow_upstream_encodings() -> None:
    assert go_json({"b": 1, "a": ["<x>", "é&"]}) == b'{"a":["\\u003cx\\u003e","\xc3\xa9\\u0026"],"b":1}'
    assert fnv32(b"") == fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C and fnv32(b"a") == 0x050C5D7E  # published FNV test vectors
    assert safe_encode("0123456789") == "456789bcdf"
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert template_hash(template, None) == template_hash(json.loads(json.dumps(template)), None)
    assert template_hash(template, None) != template_hash(template, 1)
    assert parent_and_ordinal("web-12") == ("web", 12) and parent_and_ordinal("web") == ("", -1)


def test_daemon_tolerations_and_eligibility() -> None:
    spec = {"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}]}
    tols = daemon_tolerations(spec)
    assert {(t["key"], t["effect"]) for t in tols} == set(DEFAULT_TOLERATIONS)
    assert all("tolerationSeconds" not in t for t in tols)  # the daemon's own is unbounded
    assert any(t["key"] == "node.kubernetes.io/network-unavailable" for t in daemon_tolerations({"hostNetwork": True}))
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable",
                                                        "effect": "NoSchedule"}]}}
    assert should_run(node, {"tolerations": tols}) == (True, True)  # cordoned nodes keep their daemons
    assert should_run(node, {"tolerations": tols, "nodeSelector": {"zone": "b"}}) == (False, False)
    node["spec"]["taints"].append({"key": "dedicated", "value": "x", "effect": "NoSchedule"})
    assert should_run(node, {"tolerations": tols}) == (False, True)  # NoSchedule: no new pod, the old one stays
    node["spec"]["taints"].append({"key": "dedicated", "value": "x", "effect": "NoExecute"})
    assert should_run(node, {"tolerations": tols}) == (False, False)
    pinned = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}
    assert target_node(pinned) == "n1" and target_node({"spec": {"nodeName": "n2"}}) == "n2"


# ------------------------------------------------------------------------------------------ DaemonSet


@pytest.mark.anyio
async def test_daemonset_runs_one_pinned_pod_per_eligible_node_and_reports_status(env: Env) -> None:
    await env.apply(daemonset("agent"))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberAvailable") == 3, "three available")
    pods = (await env.core.list_namespaced_pod(NS, label_selector="app=agent")).items
    assert sorted(p.spec.node_name for p in pods) == sorted(CPU_NODES)  # the tainted GPU node gets none
    revisions = (await env.apps.list_namespaced_controller_revision(NS)).items
    assert [(r.revision, r.metadata.owner_references[0].kind) for r in revisions] == [(1, "DaemonSet")]
    hash_ = revisions[0].metadata.labels["controller-revision-hash"]
    assert revisions[0].metadata.name == f"agent-{hash_}"
    for p in pods:
        assert p.metadata.labels["controller-revision-hash"] == hash_
        assert p.metadata.labels["pod-template-generation"] == "1"
        assert p.metadata.generate_name == "agent-"
        assert p.metadata.owner_references[0].kind == "DaemonSet" and p.metadata.owner_references[0].controller
        term = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        assert [(f.key, f.operator, f.values) for f in term[0].match_fields] == [
            ("metadata.name", "In", [p.spec.node_name])]
        assert {(t.key, t.effect) for t in p.spec.tolerations} >= set(DEFAULT_TOLERATIONS)
    st = await env.official(lambda api: kubernetes.client.AppsV1Api(api).read_namespaced_daemon_set_status(
        "agent", NS).status)
    assert (st.desired_number_scheduled, st.current_number_scheduled, st.number_ready, st.number_available,
            st.updated_number_scheduled, st.number_misscheduled, st.observed_generation) == (3, 3, 3, 3, 3, 0, 1)
    assert st.number_unavailable is None  # zero is omitted, as Go writes it
    row = (await env.kubectl("get", "ds", "agent", "--no-headers")).split()
    assert row[:6] == ["agent", "3", "3", "3", "3", "3"]


@pytest.mark.anyio
async def test_daemonset_follows_node_selectors_taints_labels_and_cordons(env: Env) -> None:
    await env.kubectl("cordon", "cpu-0")
    await env.apply(daemonset("gpu-agent", pod={
        "nodeSelector": {"gpuops.io/node-group": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}))
    await env.apply(daemonset("everywhere", pod={"tolerations": [{"operator": "Exists"}]}))
    await env.apply(daemonset("edge", pod={"nodeSelector": {"role": "edge"}}))
    await env.until(lambda: env.status(DAEMONSETS, "everywhere").get("numberReady") == 4, "four ready")
    await env.until(lambda: env.status(DAEMONSETS, "gpu-agent").get("numberReady") == 1, "one gpu daemon")
    assert [p["spec"]["nodeName"] for p in env.pods("gpu-agent")] == ["gpu-0"]
    assert "cpu-0" in {p["spec"]["nodeName"] for p in env.pods("everywhere") if ready(p)}  # cordoned, still served
    # nothing matches yet: the required counters are written as zeros (the official client refuses them absent)
    await env.until(lambda: env.status(DAEMONSETS, "edge").get("observedGeneration") == 1, "edge observed")
    st = await env.official(lambda api: kubernetes.client.AppsV1Api(api).read_namespaced_daemon_set("edge", NS).status)
    assert (st.desired_number_scheduled, st.current_number_scheduled, st.number_ready, st.number_misscheduled) == (
        0, 0, 0, 0)
    await env.kubectl("label", "node", "cpu-1", "role=edge")
    await env.until(lambda: [p["spec"].get("nodeName") for p in env.pods("edge") if ready(p)] == ["cpu-1"],
                    "edge daemon on the labelled node")
    await env.kubectl("label", "node", "cpu-1", "role-")
    await env.until(lambda: not env.pods("edge", live=False), "edge daemon removed with the label")
    await env.apply(daemonset("plain"))
    await env.until(lambda: env.status(DAEMONSETS, "plain").get("numberReady") == 3, "plain on three nodes")
    await env.kubectl("taint", "node", "cpu-2", "dedicated=db:NoSchedule")
    await env.until(lambda: env.status(DAEMONSETS, "plain").get("numberMisscheduled") == 1, "misscheduled")
    assert any(p["spec"]["nodeName"] == "cpu-2" for p in env.pods("plain"))  # NoSchedule: it may stay
    await env.kubectl("taint", "node", "cpu-2", "dedicated=db:NoExecute")
    await env.until(lambda: all(p["spec"]["nodeName"] != "cpu-2" for p in env.pods("plain", live=False)),
                    "NoExecute removes it")
    assert len([p for p in env.pods("everywhere") if p["spec"]["nodeName"] == "cpu-2"]) == 1  # tolerates all


@pytest.mark.anyio
async def test_daemonset_replaces_a_deleted_pod_on_the_same_node(env: Env) -> None:
    await env.apply(daemonset("agent"))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberReady") == 3, "three ready")
    victim = env.pods("agent")[0]
    await env.core.delete_namespaced_pod(victim["metadata"]["name"], NS)
    node = victim["spec"]["nodeName"]

    def replaced() -> bool:
        on_node = [p for p in env.pods("agent") if p["spec"].get("nodeName") == node and ready(p)]
        return bool(on_node) and on_node[0]["metadata"]["name"] != victim["metadata"]["name"]

    await env.until(replaced, "a new pod on the same node")
    events = (await env.core.list_namespaced_event(NS, field_selector="involvedObject.name=agent")).items
    assert {"SuccessfulCreate"} <= {e.reason for e in events}
    assert all(e.source.component == "daemonset-controller" for e in events)


@pytest.mark.anyio
@pytest.mark.parametrize("max_unavailable", [1, 2])
async def test_daemonset_rolls_an_image_change_within_max_unavailable(env: Env, max_unavailable: int) -> None:
    await env.apply(daemonset("agent", updateStrategy={"type": "RollingUpdate",
                                                       "rollingUpdate": {"maxUnavailable": max_unavailable}}))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberAvailable") == 3, "three available")
    watch = ReadyNodes(env, "agent")
    await env.kubectl("set", "image", "ds/agent", "agent=agent:2")

    def rolled() -> bool:
        st = env.status(DAEMONSETS, "agent")
        return (st.get("observedGeneration") == 2 and st.get("updatedNumberScheduled") == 3
                and st.get("numberAvailable") == 3 and len(env.pods("agent", live=False)) == 3)

    await env.until(rolled, "rolled out", within=15)
    assert watch.low >= 3 - max_unavailable
    assert {p["spec"]["containers"][0]["image"] for p in env.pods("agent")} == {"agent:2"}
    assert {p["metadata"]["labels"]["pod-template-generation"] for p in env.pods("agent")} == {"2"}
    out = await env.kubectl("rollout", "status", "ds/agent", "--timeout=10s")
    assert "successfully rolled out" in out
    revisions = sorted(r["revision"] for r in env.c.access.iter(CONTROLLER_REVISIONS, NS))
    assert revisions == [1, 2]


@pytest.mark.anyio
async def test_daemonset_surge_keeps_every_node_served(env: Env) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    await env.apply(daemonset("agent", updateStrategy=strategy))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberAvailable") == 3, "three available")
    watch = ReadyNodes(env, "agent")
    await env.kubectl("set", "image", "ds/agent", "agent=agent:2")
    await env.until(lambda: {p["spec"]["containers"][0]["image"] for p in env.pods("agent", live=False)} == {
        "agent:2"} and len(env.pods("agent", live=False)) == 3 and env.status(DAEMONSETS, "agent").get(
        "numberAvailable") == 3, "surged through", within=15)
    assert watch.low == 3  # a node's old pod goes only once its new one is ready
    assert watch.most_pods == 4  # one extra pod at a time


@pytest.mark.anyio
async def test_daemonset_on_delete_replaces_only_deleted_pods_and_rollback_renumbers(env: Env) -> None:
    await env.apply(daemonset("agent", updateStrategy={"type": "OnDelete"}))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberReady") == 3, "three ready")
    await env.kubectl("set", "image", "ds/agent", "agent=agent:2")
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("observedGeneration") == 2, "observed")
    assert "updatedNumberScheduled" not in env.status(DAEMONSETS, "agent")
    assert {p["spec"]["containers"][0]["image"] for p in env.pods("agent")} == {"agent:1"}
    await env.kubectl("delete", "pod", env.pods("agent")[0]["metadata"]["name"])
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("updatedNumberScheduled") == 1, "one updated")
    images = sorted(p["spec"]["containers"][0]["image"] for p in env.pods("agent"))
    assert images == ["agent:1", "agent:1", "agent:2"]
    await env.kubectl("rollout", "undo", "ds/agent")  # kubectl restores revision 1's template
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("updatedNumberScheduled") == 2, "old template back")
    numbers = {r["metadata"]["labels"]["controller-revision-hash"]: r["revision"]
               for r in env.c.access.iter(CONTROLLER_REVISIONS, NS)}
    assert sorted(numbers.values()) == [2, 3]  # the restored template's revision became the newest


# ------------------------------------------------------------------------------------------ StatefulSet


class PodLog:
    """Pod events of one app as a kubernetes-asyncio watch delivers them, in resourceVersion order."""

    def __init__(self, env: Env, app: str) -> None:
        self.events: list[tuple[str, str, bool]] = []
        self.started = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(env, app))

    async def _run(self, env: Env, app: str) -> None:
        """Watch from the resourceVersion of a list taken first: no event after `started` can be missed, however
        late the watch request reaches the server."""
        listed = await env.core.list_namespaced_pod(NS, label_selector=f"app={app}")
        w = awatch.Watch()
        self.started.set()
        async for ev in w.stream(env.core.list_namespaced_pod, NS, label_selector=f"app={app}", timeout_seconds=60,
                                 resource_version=listed.metadata.resource_version):
            pod = ev["object"]
            is_ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
            self.events.append((ev["type"], pod.metadata.name, is_ready and not pod.metadata.deletion_timestamp))

    async def stop(self) -> None:
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task

    def first(self, kind: str, name: str) -> int:
        return next(i for i, (t, n, _) in enumerate(self.events) if t == kind and n == name)

    def first_ready(self, name: str) -> int:
        return next(i for i, (_, n, r) in enumerate(self.events) if n == name and r)


@pytest.mark.anyio
async def test_statefulset_creates_in_order_with_identity_claims_and_status(env: Env) -> None:
    log = PodLog(env, "web")
    await log.started.wait()
    await env.apply(statefulset("web"))
    await env.until(lambda: env.status(STATEFULSETS, "web").get("availableReplicas") == 3, "three available")
    await env.until(lambda: len([e for e in log.events if e[2]]) >= 3, "watch saw three ready")
    await log.stop()
    for i in (1, 2):  # pod i is created only after pod i-1 was seen Ready
        assert log.first_ready(f"web-{i - 1}") < log.first("ADDED", f"web-{i}")
    st = await env.official(lambda api: kubernetes.client.AppsV1Api(api).read_namespaced_stateful_set_status(
        "web", NS).status)
    assert (st.replicas, st.ready_replicas, st.current_replicas, st.updated_replicas, st.available_replicas,
            st.collision_count, st.observed_generation) == (3, 3, 3, 3, 3, 0, 1)
    assert st.current_revision == st.update_revision and st.update_revision.startswith("web-")
    for i, pod in enumerate((await env.core.list_namespaced_pod(NS, label_selector="app=web")).items):
        labels = pod.metadata.labels
        assert (pod.metadata.name, pod.spec.hostname, pod.spec.subdomain) == (f"web-{i}", f"web-{i}", "web")
        assert labels["statefulset.kubernetes.io/pod-name"] == f"web-{i}"
        assert labels["apps.kubernetes.io/pod-index"] == str(i)
        assert labels["controller-revision-hash"] == st.update_revision
        assert [(v.name, v.persistent_volume_claim.claim_name) for v in pod.spec.volumes or []
                if v.persistent_volume_claim] == [("data", f"data-web-{i}")]
    claims = (await env.core.list_namespaced_persistent_volume_claim(NS)).items
    assert sorted(c.metadata.name for c in claims) == ["data-web-0", "data-web-1", "data-web-2"]
    assert all(c.metadata.labels == {"app": "web"} and not c.metadata.owner_references for c in claims)
    revisions = (await env.apps.list_namespaced_controller_revision(NS)).items
    assert [(r.metadata.name, r.revision) for r in revisions] == [(st.update_revision, 1)]
    assert "controller.kubernetes.io/hash" in revisions[0].metadata.labels
    row = (await env.kubectl("get", "sts", "web", "--no-headers")).split()
    assert row[:2] == ["web", "3/3"]


@pytest.mark.anyio
async def test_statefulset_scales_down_in_reverse_and_keeps_claims(env: Env) -> None:
    await env.apply(statefulset("web"))
    await env.until(lambda: env.status(STATEFULSETS, "web").get("readyReplicas") == 3, "three ready")
    claim_uids = {c["metadata"]["name"]: c["metadata"]["uid"] for c in env.c.access.iter(PVCS, NS)}
    order: list[tuple[str, str]] = []

    def track(ev: WatchEvent) -> None:
        meta = ev.new.obj["metadata"]
        if ev.gr != PODS or not meta["name"].startswith("web-"):
            return
        was_terminating = ev.prev is not None and ev.prev.obj["metadata"].get("deletionTimestamp")
        if ev.type == "DELETED":
            order.append(("gone", meta["name"]))
        elif meta.get("deletionTimestamp") and not was_terminating:
            order.append(("terminating", meta["name"]))

    env.c.server.store.add_listener(track)
    await env.kubectl("scale", "sts", "web", "--replicas=1")
    await env.until(lambda: env.status(STATEFULSETS, "web").get("replicas") == 1 and len(env.pods("web", live=False))
                    == 1, "scaled to one")
    assert order == [("terminating", "web-2"), ("gone", "web-2"), ("terminating", "web-1"), ("gone", "web-1")]
    await env.kubectl("scale", "sts", "web", "--replicas=2")
    await env.until(lambda: env.status(STATEFULSETS, "web").get("readyReplicas") == 2, "back to two")
    assert {c["metadata"]["name"]: c["metadata"]["uid"] for c in env.c.access.iter(PVCS, NS)} == claim_uids


@pytest.mark.anyio
async def test_statefulset_rolls_from_the_top_down_to_the_partition(env: Env) -> None:
    await env.apply(statefulset("web"))
    await env.until(lambda: env.status(STATEFULSETS, "web").get("readyReplicas") == 3, "three ready")
    first = env.status(STATEFULSETS, "web")["currentRevision"]
    unavailable = [0]

    def track(ev: WatchEvent) -> None:
        if ev.gr == PODS:
            pods = [env.c.access.get(PODS, NS, f"web-{i}") for i in range(3)]
            unavailable[0] = max(unavailable[0], sum(not ready(p) for p in pods))

    env.c.server.store.add_listener(track)
    patch = {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}},
                      "template": {"spec": {"containers": [{"name": "db", "image": "db:2"}]}}}}
    await env.kubectl("patch", "sts", "web", "--type=strategic", "-p", json.dumps(patch))

    def image(i: int) -> str:
        return ready_image(env, f"web-{i}")

    await env.until(lambda: image(2) == "db:2" and env.status(STATEFULSETS, "web").get("updatedReplicas") == 1,
                    "web-2 updated")
    st = env.status(STATEFULSETS, "web")
    assert st["currentRevision"] == first != st["updateRevision"] and st["currentReplicas"] == 2
    # status says the controller finished this revision's pass with web-2 alone updated
    assert (image(0), image(1)) == ("db:1", "db:1")  # below the partition
    await env.kubectl("patch", "sts", "web", "-p", json.dumps({"spec": {"updateStrategy": {
        "rollingUpdate": {"partition": 0}}}}))
    await env.until(lambda: env.status(STATEFULSETS, "web").get("currentRevision") == st["updateRevision"]
                    and env.status(STATEFULSETS, "web").get("readyReplicas") == 3, "rollout complete")
    assert [image(i) for i in range(3)] == ["db:2", "db:2", "db:2"]
    assert unavailable[0] == 1  # one replica at a time
    assert sorted(r["revision"] for r in env.c.access.iter(CONTROLLER_REVISIONS, NS)) == [1, 2]
    out = await env.kubectl("rollout", "status", "sts/web", "--timeout=10s")
    assert "roll out complete" in out or "rolling update complete" in out


@pytest.mark.anyio
async def test_statefulset_parallel_creates_all_pods_at_once(env: Env) -> None:
    seen: list[tuple[str, bool]] = []

    def track(ev: WatchEvent) -> None:
        if ev.gr == PODS and ev.new.obj["metadata"]["name"].startswith("par-"):
            seen.append((ev.type, ready(ev.new.obj)))

    env.c.server.store.add_listener(track)
    await env.apply(statefulset("par", podManagementPolicy="Parallel"))
    await env.until(lambda: env.status(STATEFULSETS, "par").get("readyReplicas") == 3, "three ready")
    first_ready = next(i for i, (_, r) in enumerate(seen) if r)
    assert [t for t, _ in seen[:first_ready]].count("ADDED") == 3


@pytest.mark.anyio
async def test_statefulset_on_delete_and_claim_retention(env: Env) -> None:
    policy = {"whenScaled": "Delete", "whenDeleted": "Delete"}
    await env.apply(statefulset("db", updateStrategy={"type": "OnDelete"},
                                persistentVolumeClaimRetentionPolicy=policy))
    await env.until(lambda: env.status(STATEFULSETS, "db").get("readyReplicas") == 3, "three ready")
    owners = {c["metadata"]["name"]: [r["kind"] for r in c["metadata"].get("ownerReferences") or []]
              for c in env.c.access.iter(PVCS, NS)}
    assert owners == {f"data-db-{i}": ["StatefulSet"] for i in range(3)}
    await env.kubectl("set", "image", "sts/db", "db=db:2")  # a strategic merge patch of the template
    # observedGeneration 2 is the controller's proof that it saw the new template and (OnDelete) left the pods
    await env.until(lambda: env.status(STATEFULSETS, "db").get("observedGeneration") == 2, "observed")
    assert {p["spec"]["containers"][0]["image"] for p in env.pods("db")} == {"db:1"}
    await env.kubectl("delete", "pod", "db-1")
    await env.until(lambda: ready_image(env, "db-1") == "db:2", "db-1 recreated at the new revision")
    await env.kubectl("scale", "sts", "db", "--replicas=2")
    await env.until(lambda: env.c.access.get(PVCS, NS, "data-db-2") is None, "scaled-down claim deleted")
    await env.kubectl("delete", "sts", "db", "--wait=false")
    await env.until(lambda: not list(env.c.access.iter(PVCS, NS)) and not env.pods("db", live=False),
                    "claims and pods collected with the set")
    assert env.c.access.get(NODES, "", "cpu-0") is not None


@pytest.mark.anyio
async def test_orphaned_pods_are_adopted_and_relabelled_pods_released(env: Env) -> None:
    await env.apply(statefulset("web", replicas=2))
    await env.until(lambda: env.status(STATEFULSETS, "web").get("readyReplicas") == 2, "two ready")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods("web")}
    await env.kubectl("delete", "sts", "web", "--cascade=orphan")
    await env.until(lambda: all(not p["metadata"].get("ownerReferences") for p in env.pods("web")), "orphaned")
    await env.apply(statefulset("web", replicas=2))
    new_uid = await env.until(lambda: (env.c.access.get(STATEFULSETS, NS, "web") or {}).get("metadata", {}).get("uid"),
                              "recreated")
    await env.until(lambda: all([r["uid"] for r in p["metadata"].get("ownerReferences") or []] == [new_uid]
                                for p in env.pods("web")), "adopted")
    await env.until(lambda: env.status(STATEFULSETS, "web").get("readyReplicas") == 2, "two ready again")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods("web")} == uids  # kept, not recreated
    await env.apply(daemonset("agent"))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberReady") == 3, "three ready")
    pulled = env.pods("agent")[0]
    await env.kubectl("label", "pod", pulled["metadata"]["name"], "app=debug", "--overwrite")
    await env.until(lambda: not (env.c.access.get(PODS, NS, pulled["metadata"]["name"]) or {}).get(
        "metadata", {}).get("ownerReferences"), "released")
    await env.until(lambda: len([p for p in env.pods("agent") if ready(p)]) == 3, "replaced on its node")
    assert pulled["spec"]["nodeName"] in {p["spec"]["nodeName"] for p in env.pods("agent")}


@pytest.mark.anyio
async def test_daemonset_replaces_a_failed_pod(env: Env) -> None:
    await env.apply(daemonset("agent"))
    await env.until(lambda: env.status(DAEMONSETS, "agent").get("numberReady") == 3, "three ready")
    failed = env.pods("agent")[0]
    name, node = failed["metadata"]["name"], failed["spec"]["nodeName"]
    api: Any = env.core  # a kubelet that rejected the pod would write this; the stubs lack _content_type
    await api.patch_namespaced_pod_status(name, NS, {"status": {"phase": "Failed", "reason": "OutOfcpu"}},
                                          _content_type="application/merge-patch+json")

    def replaced() -> bool:
        return any(p["spec"].get("nodeName") == node and p["metadata"]["name"] != name and ready(p)
                   for p in env.pods("agent"))

    await env.until(replaced, "a new pod on the failed pod's node")
    events = (await env.core.list_namespaced_event(NS, field_selector="involvedObject.name=agent")).items
    assert any(e.reason == "FailedDaemonPod" and name in e.message and e.type == "Warning" for e in events)
