"""Deployments and ReplicaSets in the emulated cluster, driven the way a user drives them: through kubectl over
TLS. Create -> ReplicaSet -> pods -> Available; scale; rolling updates that keep inside maxSurge/maxUnavailable
(checked at every store change, not sampled); Recreate; rollout status/history/undo/pause/resume; history
pruning; minReadySeconds; the progress deadline; proportional scaling mid-rollout; pod-template-hash
collisions; bare ReplicaSets; garbage collection of the whole tree."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import until_holds

from gpuops_sim.apiserver.store import WatchEvent
from gpuops_sim.cluster.access import DEPLOYMENTS, PODS, REPLICASETS
from gpuops_sim.cluster.cluster import SimCluster
from gpuops_sim.cluster.rollout import (
    DESIRED_REPLICAS,
    HASH_LABEL,
    MAX_REPLICAS,
    REVISION,
    REVISION_HISTORY,
    Plan,
    canonical_template,
    compute_hash,
    go_round,
    proportion,
)
from gpuops_sim.scenario import parse

KUBECTL = str(Path(sys.executable).parent / "kubectl")
NS = "default"
SCENARIO = {
    "name": "deployments",
    "kubelet": {"startLatencySeconds": 0.05, "leaseSeconds": 0.5, "nodeStatusSeconds": 5, "events": True},
    "nodeGroups": [{"name": "cpu", "count": 2, "bootSeconds": 0.05, "devicePluginSeconds": 0}],
}

Obj = dict[str, Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Cluster:
    """A running SimCluster, kubectl pointed at it over TLS, and readers for what the tests look at."""

    def __init__(self, sim: SimCluster, kubeconfig: Path) -> None:
        self.sim = sim
        self.kubeconfig = kubeconfig

    async def kubectl(self, *args: str, stdin: str | None = None, ok: bool = True) -> tuple[int, str, str]:
        cache = str(self.kubeconfig.parent / "kubectl-cache")
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", cache, "-n", NS, *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
        rc = proc.returncode if proc.returncode is not None else -1
        if ok:
            assert rc == 0, f"kubectl {' '.join(args)}: {err.decode()}"
        return rc, out.decode(), err.decode()

    async def apply(self, obj: Obj) -> None:
        await self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))

    def deployment(self, name: str) -> Obj:
        got = self.sim.access.get(DEPLOYMENTS, NS, name)
        assert got is not None
        return got

    def replicasets(self, app: str) -> list[Obj]:
        out = [rs for rs in self.sim.access.iter(REPLICASETS, NS) if labels(rs).get("app") == app]
        return sorted(out, key=lambda rs: rs["metadata"]["creationTimestamp"] + rs["metadata"]["name"])

    def pods(self, app: str, *, live: bool = True) -> list[Obj]:
        out = [p for p in self.sim.access.iter(PODS, NS) if labels(p).get("app") == app]
        return [p for p in out if active(p)] if live else out

    async def until(self, what: str, probe: Callable[[], Any], within: float = 10.0) -> Any:
        return await until_holds(what, probe, within)

    async def rolled_out(self, name: str) -> str:
        _, out, _ = await self.kubectl("rollout", "status", f"deployment/{name}", "--timeout=20s")
        return out


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with SimCluster(parse(SCENARIO), workload=False, tls=True) as sim:
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        assert await sim.wait_ready(10)
        yield Cluster(sim, tmp_path / "kubeconfig")
        assert sim.deployments.errors == 0 and sim.replicasets.errors == 0


def labels(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def notes(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("annotations") or {}


def active(pod: Obj) -> bool:
    return pod["status"].get("phase") not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or ())


def conditions(obj: Obj) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in (obj.get("status") or {}).get("conditions") or ()}


def available(cluster: Cluster, name: str, replicas: int) -> bool:
    dep = cluster.deployment(name)
    st = dep.get("status") or {}
    return (st.get("observedGeneration") == dep["metadata"]["generation"] and st.get("updatedReplicas") == replicas
            and st.get("availableReplicas") == replicas and st.get("replicas") == replicas
            and conditions(dep).get("Available") == ("True", "MinimumReplicasAvailable"))


def split(rss: list[Obj], first: Obj) -> tuple[Obj, Obj]:
    """The first ReplicaSet and the other one (creation stamps have one-second resolution: no ordering)."""
    [old] = [rs for rs in rss if rs["metadata"]["uid"] == first["metadata"]["uid"]]
    [new] = [rs for rs in rss if rs["metadata"]["uid"] != first["metadata"]["uid"]]
    return old, new


def manifest(name: str, replicas: int, image: str = "nginx:1.0", *, pod_annotations: Obj | None = None,
             **spec: Any) -> Obj:
    tmeta: Obj = {"labels": {"app": name}}
    if pod_annotations:
        tmeta["annotations"] = pod_annotations
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": tmeta, "spec": {"containers": [{"name": "app", "image": image}]}},
                     **spec}}


class Invariant:
    """Checks a rolling update's bounds at every store change of the app's pods (a synchronous listener sees
    every intermediate state): pods not being deleted <= replicas+maxSurge, Ready ones among them >=
    replicas-maxUnavailable, and the ReplicaSets' spec.replicas never add up past replicas+maxSurge."""

    def __init__(self, cluster: Cluster, app: str, replicas: int, surge: int, unavailable: int) -> None:
        self.cluster, self.app = cluster, app
        self.ceiling, self.floor = replicas + surge, replicas - unavailable
        self.violations: list[str] = []
        self.peak = 0
        cluster.sim.server.store.add_listener(self._check)

    def _check(self, ev: WatchEvent) -> None:
        if ev.gr not in (PODS, REPLICASETS):
            return
        if ev.gr == REPLICASETS:
            wanted = sum(int(rs["spec"].get("replicas", 1)) for rs in self.cluster.replicasets(self.app))
            if wanted > self.ceiling:
                self.violations.append(f"ReplicaSets want {wanted} pods at rv {ev.rv}")
            return
        pods = self.cluster.pods(self.app)
        self.peak = max(self.peak, len(pods))
        up = sum(1 for p in pods if ready(p))
        if len(pods) > self.ceiling or up < self.floor:
            self.violations.append(f"{len(pods)} pods, {up} ready at rv {ev.rv}")


# ------------------------------------------------------------------------------------------ pure helpers


def test_pod_template_hash_is_stable_label_safe_and_follows_the_template() -> None:
    t1 = manifest("web", 1)["spec"]["template"]
    t2 = manifest("web", 1, "nginx:2.0")["spec"]["template"]
    h = compute_hash(t1, None)
    assert h == compute_hash(json.loads(json.dumps(t1)), None)  # a copy hashes the same
    assert h != compute_hash(t2, None) and h != compute_hash(t1, 1) and compute_hash(t1, 1) != compute_hash(t1, 2)
    assert 1 <= len(h) <= 10 and set(h) <= set("bcdfghjklmnpqrstvwxz2456789")
    # What kubectl sends back on `rollout undo` (a typed round trip) is the same template.
    echoed = {"metadata": {"creationTimestamp": None, "labels": {"app": "web", HASH_LABEL: h}},
              "spec": {"containers": [{"name": "app", "image": "nginx:1.0", "resources": {}}]}}
    assert canonical_template(echoed) == canonical_template(t1) and compute_hash(echoed, None) == h


def test_fenceposts_resolve_like_upstream() -> None:
    def plan(replicas: int, **ru: Any) -> Plan:
        strategy = {"type": "RollingUpdate", "rollingUpdate": ru} if ru else {}
        return Plan.of({"spec": {"replicas": replicas, "strategy": strategy}})

    assert (plan(4).max_surge, plan(4).max_unavailable) == (1, 1)  # 25%/25% by default
    assert (plan(1).max_surge, plan(1).max_unavailable) == (1, 0)  # surge rounds up, unavailable down
    assert plan(3, maxSurge=0, maxUnavailable="10%").max_unavailable == 1  # both zero: one may go
    assert plan(2, maxSurge=1, maxUnavailable=5).max_unavailable == 2  # never more than replicas
    recreate = Plan.of({"spec": {"strategy": {"type": "Recreate"}}})
    assert (recreate.replicas, recreate.rolling, recreate.max_surge, recreate.max_unavailable) == (1, False, 0, 0)
    assert Plan.of({"spec": {}}).history_limit == 10 and Plan.of({"spec": {}}).deadline == 600
    assert go_round(2.5) == 3 and go_round(-2.5) == -3 and go_round(0.4) == 0
    # Scaling 10 -> 15 (maxSurge 0) mid-rollout: a ReplicaSet sized 6 for max-replicas 10 gets 3 more.
    rs = {"metadata": {"annotations": {MAX_REPLICAS: "10"}}, "spec": {"replicas": 6}}
    assert proportion(rs, plan(15, maxSurge=0, maxUnavailable=1), 10, 5, 0) == 3


# ------------------------------------------------------------------------------------------ in the cluster


@pytest.mark.anyio
async def test_create_scale_and_delete_a_deployment(cluster: Cluster) -> None:
    await cluster.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=2")
    await cluster.until("web available", lambda: available(cluster, "web", 2))
    assert "successfully rolled out" in await cluster.rolled_out("web")
    dep = cluster.deployment("web")
    [rs] = cluster.replicasets("web")
    pod_hash = labels(rs)[HASH_LABEL]
    assert rs["metadata"]["name"] == f"web-{pod_hash}"
    assert rs["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                                  "uid": dep["metadata"]["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]
    assert rs["spec"]["selector"] == {"matchLabels": {"app": "web", HASH_LABEL: pod_hash}}
    assert labels(rs["spec"]["template"]) == {"app": "web", HASH_LABEL: pod_hash}
    assert {k: notes(rs)[k] for k in (REVISION, DESIRED_REPLICAS, MAX_REPLICAS)} == {
        REVISION: "1", DESIRED_REPLICAS: "2", MAX_REPLICAS: "3"}
    assert notes(dep)[REVISION] == "1"
    assert rs["status"] == {"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 2, "availableReplicas": 2,
                            "terminatingReplicas": 0, "observedGeneration": 1}
    for pod in cluster.pods("web"):
        assert pod["metadata"]["generateName"] == f"{rs['metadata']['name']}-"
        assert len(pod["metadata"]["name"]) == len(rs["metadata"]["name"]) + 6
        assert pod["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"]
        assert labels(pod) == {"app": "web", HASH_LABEL: pod_hash} and ready(pod)
    assert conditions(dep) == {"Available": ("True", "MinimumReplicasAvailable"),
                               "Progressing": ("True", "NewReplicaSetAvailable")}

    await cluster.kubectl("scale", "deployment", "web", "--replicas=4")
    await cluster.until("scaled to 4", lambda: available(cluster, "web", 4) and len(cluster.pods("web")) == 4)
    await cluster.kubectl("scale", "deployment", "web", "--replicas=1")
    await cluster.until("scaled to 1", lambda: available(cluster, "web", 1) and len(cluster.pods("web")) == 1)
    [rs] = cluster.replicasets("web")
    assert (rs["spec"]["replicas"], notes(rs)[DESIRED_REPLICAS], notes(rs)[MAX_REPLICAS]) == (1, "1", "2")
    _, events, _ = await cluster.kubectl("get", "events", "--field-selector", "involvedObject.kind=Deployment")
    assert f"Scaled up replica set web-{pod_hash} to 4 from 2" in events
    assert f"Scaled down replica set web-{pod_hash} to 1 from 4" in events

    await cluster.kubectl("delete", "deployment", "web")
    await cluster.until("ReplicaSets and pods collected",
                        lambda: not cluster.replicasets("web") and not cluster.pods("web", live=False))


@pytest.mark.anyio
async def test_rolling_update_stays_within_surge_and_unavailability(cluster: Cluster) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 1}}
    await cluster.apply(manifest("api", 5, strategy=strategy))
    await cluster.until("api available", lambda: available(cluster, "api", 5))
    [first] = cluster.replicasets("api")
    bounds = Invariant(cluster, "api", 5, 2, 1)
    await cluster.kubectl("set", "image", "deployment/api", "app=nginx:2.0")
    assert "successfully rolled out" in await cluster.rolled_out("api")
    await cluster.until("api updated", lambda: available(cluster, "api", 5))
    assert not bounds.violations, bounds.violations[:5]
    assert bounds.peak > 5  # the surge was used
    old, new = split(cluster.replicasets("api"), first)
    assert (old["spec"]["replicas"], notes(old)[REVISION]) == (0, "1")
    assert (new["spec"]["replicas"], notes(new)[REVISION]) == (5, "2")
    assert notes(cluster.deployment("api"))[REVISION] == "2"
    assert {p["spec"]["containers"][0]["image"] for p in cluster.pods("api")} == {"nginx:2.0"}
    _, history, _ = await cluster.kubectl("rollout", "history", "deployment/api")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2"]

    # Undo (kubectl copies the old ReplicaSet's template back): the old ReplicaSet returns as revision 3.
    await cluster.kubectl("rollout", "undo", "deployment/api")
    assert "successfully rolled out" in await cluster.rolled_out("api")
    await cluster.until("api rolled back", lambda: available(cluster, "api", 5))
    assert not bounds.violations, bounds.violations[:5]
    old, new = split(cluster.replicasets("api"), first)
    assert (old["spec"]["replicas"], notes(old)[REVISION], notes(old)[REVISION_HISTORY]) == (5, "3", "1")
    assert new["spec"]["replicas"] == 0 and len(cluster.replicasets("api")) == 2
    assert {p["spec"]["containers"][0]["image"] for p in cluster.pods("api")} == {"nginx:1.0"}
    _, history, _ = await cluster.kubectl("rollout", "history", "deployment/api")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["2", "3"]


@pytest.mark.anyio
async def test_recreate_stops_every_old_pod_before_starting_new_ones(cluster: Cluster) -> None:
    slow_stop = {"sim.gpuops.io/termination-seconds": "0.3"}
    await cluster.apply(manifest("batch", 3, pod_annotations=slow_stop, strategy={"type": "Recreate"}))
    await cluster.until("batch available", lambda: available(cluster, "batch", 3))
    [first] = cluster.replicasets("batch")
    overlaps: list[str] = []

    def check(ev: WatchEvent) -> None:
        if ev.gr != PODS:
            return
        pods = cluster.pods("batch", live=False)
        old_running = [p for p in pods if labels(p)[HASH_LABEL] == labels(first)[HASH_LABEL]
                       and p["status"].get("phase") not in ("Succeeded", "Failed")]
        new = [p for p in pods if labels(p)[HASH_LABEL] != labels(first)[HASH_LABEL]]
        if old_running and new:
            overlaps.append(f"{len(old_running)} old pods still running beside {len(new)} new at rv {ev.rv}")

    cluster.sim.server.store.add_listener(check)
    await cluster.kubectl("set", "image", "deployment/batch", "app=nginx:2.0")
    assert "successfully rolled out" in await cluster.rolled_out("batch")
    await cluster.until("batch updated", lambda: available(cluster, "batch", 3))
    assert not overlaps, overlaps[:3]
    _, events, _ = await cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=batch")
    assert f"Scaled down replica set {first['metadata']['name']} to 0 from 3" in events


@pytest.mark.anyio
async def test_pause_resume_history_limit_and_min_ready_seconds(cluster: Cluster) -> None:
    await cluster.apply(manifest("svc", 1, revisionHistoryLimit=1, minReadySeconds=2))
    seen_ready_unavailable = False

    def not_yet_available() -> bool:
        nonlocal seen_ready_unavailable
        st = cluster.deployment("svc").get("status") or {}
        seen_ready_unavailable |= st.get("readyReplicas") == 1 and not st.get("availableReplicas")
        return available(cluster, "svc", 1)

    await cluster.until("svc available after minReadySeconds", not_yet_available, 15)
    assert seen_ready_unavailable  # Ready is not yet Available for two seconds
    await cluster.kubectl("patch", "deployment", "svc", "-p", '{"spec": {"minReadySeconds": 0}}')
    await cluster.until("minReadySeconds carried to the ReplicaSet", lambda: [
        rs["spec"].get("minReadySeconds", 0) for rs in cluster.replicasets("svc")] == [0])

    await cluster.kubectl("rollout", "pause", "deployment/svc")
    await cluster.kubectl("set", "image", "deployment/svc", "app=nginx:2.0")
    paused = cluster.deployment("svc")
    await cluster.until("pause observed", lambda: conditions(cluster.deployment("svc")).get("Progressing") == (
        "Unknown", "DeploymentPaused") and cluster.deployment("svc")["status"].get("observedGeneration") ==
        paused["metadata"]["generation"])
    assert len(cluster.replicasets("svc")) == 1  # no rollout while paused
    await cluster.kubectl("rollout", "resume", "deployment/svc")
    assert "successfully rolled out" in await cluster.rolled_out("svc")

    for image in ("nginx:3.0", "nginx:4.0"):
        await cluster.kubectl("set", "image", "deployment/svc", f"app={image}")
        assert "successfully rolled out" in await cluster.rolled_out("svc")
    await cluster.until("old revisions pruned to one", lambda: len(cluster.replicasets("svc")) == 2)
    assert sorted(notes(rs)[REVISION] for rs in cluster.replicasets("svc")) == ["3", "4"]
    _, history, _ = await cluster.kubectl("rollout", "history", "deployment/svc")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["3", "4"]


@pytest.mark.anyio
async def test_progress_deadline_exceeded_fails_rollout_status(cluster: Cluster) -> None:
    dep = manifest("huge", 1, progressDeadlineSeconds=1)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}  # never fits
    await cluster.apply(dep)
    await cluster.until("deadline exceeded", lambda: conditions(cluster.deployment("huge")).get("Progressing") == (
        "False", "ProgressDeadlineExceeded"), 10)
    assert conditions(cluster.deployment("huge"))["Available"] == ("False", "MinimumReplicasUnavailable")
    assert cluster.deployment("huge")["status"]["unavailableReplicas"] == 1
    rc, _, err = await cluster.kubectl("rollout", "status", "deployment/huge", "--timeout=10s", ok=False)
    assert rc != 0 and 'deployment "huge" exceeded its progress deadline' in err


@pytest.mark.anyio
async def test_bare_replicaset_replaces_lost_pods_and_releases_relabelled_ones(cluster: Cluster) -> None:
    rs_manifest = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "cache"},
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "cache"}},
                            "template": {"metadata": {"labels": {"app": "cache"}},
                                         "spec": {"containers": [{"name": "redis", "image": "redis"}]}}}}
    await cluster.apply(rs_manifest)

    def rs_status() -> Obj:
        got = cluster.sim.access.get(REPLICASETS, NS, "cache")
        return dict((got or {}).get("status") or {})

    await cluster.until("two cache pods available", lambda: rs_status().get("availableReplicas") == 2)
    first = {p["metadata"]["name"] for p in cluster.pods("cache")}
    assert all(name.startswith("cache-") and len(name) == len("cache-") + 5 for name in first)
    victim = sorted(first)[0]
    await cluster.kubectl("delete", "pod", victim)
    await cluster.until("a replacement", lambda: len(cluster.pods("cache")) == 2 and victim not in {
        p["metadata"]["name"] for p in cluster.pods("cache")} and rs_status().get("availableReplicas") == 2)

    stray = cluster.pods("cache")[0]["metadata"]["name"]
    await cluster.kubectl("label", "pod", stray, "app=debug", "--overwrite")
    await cluster.until("relabelled pod released and replaced", lambda: not (
        cluster.sim.access.get(PODS, NS, stray) or {"metadata": {"ownerReferences": [1]}})["metadata"].get(
        "ownerReferences") and len(cluster.pods("cache")) == 2 and rs_status().get("availableReplicas") == 2)
    assert rs_status()["fullyLabeledReplicas"] == 2 and rs_status()["observedGeneration"] == 1
    _, events, _ = await cluster.kubectl("get", "events", "--field-selector", "involvedObject.name=cache")
    assert "SuccessfulCreate" in events and "Created pod: cache-" in events


@pytest.mark.anyio
async def test_hash_collision_bumps_collision_count_and_picks_another_name(cluster: Cluster) -> None:
    await cluster.apply(manifest("web", 1, paused=True))  # paused: no ReplicaSet yet, the template is stored
    await cluster.until("paused observed", lambda: conditions(cluster.deployment("web")).get("Progressing") == (
        "Unknown", "DeploymentPaused"))
    assert not cluster.replicasets("web")
    taken = compute_hash(cluster.deployment("web")["spec"]["template"], None)
    squatter = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": f"web-{taken}"},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "squatter"}},
                         "template": {"metadata": {"labels": {"app": "squatter"}},
                                      "spec": {"containers": [{"name": "app", "image": "busybox"}]}}}}
    await cluster.apply(squatter)
    await cluster.kubectl("rollout", "resume", "deployment/web")
    await cluster.until("web available", lambda: available(cluster, "web", 1))
    assert cluster.deployment("web")["status"]["collisionCount"] == 1
    [rs] = cluster.replicasets("web")
    assert rs["metadata"]["name"] == f"web-{compute_hash(cluster.deployment('web')['spec']['template'], 1)}"
    assert labels(rs)[HASH_LABEL] != taken


@pytest.mark.anyio
async def test_scaling_mid_rollout_spreads_replicas_proportionally(cluster: Cluster) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}
    await cluster.apply(manifest("web", 4, strategy=strategy))
    await cluster.until("web available", lambda: available(cluster, "web", 4))
    [first] = cluster.replicasets("web")
    stuck = manifest("web", 4, "nginx:2.0", strategy=strategy)
    stuck["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}  # never fits
    await cluster.apply(stuck)
    await cluster.until("one surge pod, stuck", lambda: sorted(
        rs["spec"]["replicas"] for rs in cluster.replicasets("web")) == [1, 4])
    await cluster.kubectl("scale", "deployment", "web", "--replicas=8")
    # 8 replicas + 25% surge = 10 pods, shared 4:1 as before: the old ReplicaSet 8, the new one 2.
    await cluster.until("scaled proportionally", lambda: [
        rs["spec"]["replicas"] for rs in split(cluster.replicasets("web"), first)] == [8, 2])
    old, new = split(cluster.replicasets("web"), first)
    assert notes(old)[DESIRED_REPLICAS] == notes(new)[DESIRED_REPLICAS] == "8"
    assert notes(old)[MAX_REPLICAS] == notes(new)[MAX_REPLICAS] == "10"
    await cluster.until("8 available, 2 unavailable", lambda: (cluster.deployment("web")["status"].get(
        "availableReplicas"), cluster.deployment("web")["status"].get("unavailableReplicas")) == (8, 2))
    assert conditions(cluster.deployment("web"))["Available"] == ("True", "MinimumReplicasAvailable")
