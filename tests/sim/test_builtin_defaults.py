"""Defaults and server-set fields of built-in kinds, as a create through the API server answers them: each
expectation is what the defaulting functions of Kubernetes' v1 API groups document (and what
`kubectl get -o yaml` shows on a real cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from running_server import RunningServer

TEMPLATE = {"metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                                     "resources": {"limits": {"cpu": "1"}},
                                     "ports": [{"containerPort": 80}],
                                     "readinessProbe": {"httpGet": {"port": 80}}}]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path_factory.mktemp("defaults") / "kubeconfig")
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


def create(server: RunningServer, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(server.url + path, json=obj, timeout=30, headers={"Authorization": f"Bearer {server.token}"})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def test_deployment_defaults_and_a_template_with_spec_defaults_only(server: RunningServer) -> None:
    got = create(server, "/apis/apps/v1/namespaces/default/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": TEMPLATE}})
    spec = got["spec"]
    assert (spec["replicas"], spec["revisionHistoryLimit"], spec["progressDeadlineSeconds"]) == (1, 10, 600)
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    pod = spec["template"]["spec"]
    assert (pod["restartPolicy"], pod["dnsPolicy"], pod["schedulerName"], pod["terminationGracePeriodSeconds"]) == (
        "Always", "ClusterFirst", "default-scheduler", 30)
    assert pod["securityContext"] == {}
    (c,) = pod["containers"]
    assert (c["imagePullPolicy"], c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
        "IfNotPresent", "/dev/termination-log", "File")
    assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert c["readinessProbe"] == {"httpGet": {"path": "/", "port": 80, "scheme": "HTTP"}, "timeoutSeconds": 1,
                                   "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
    # what only a Pod gets: no enableServiceLinks, no requests copied from limits, no admission fields
    assert c["resources"] == {"limits": {"cpu": "1"}}
    assert not {"enableServiceLinks", "priority", "serviceAccountName", "tolerations"} & set(pod)
    assert got["status"] == {}


def test_pod_only_defaults(server: RunningServer) -> None:
    got = create(server, "/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod",
                                                             "metadata": {"name": "p"}, "spec": TEMPLATE["spec"]})
    spec = got["spec"]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    assert (spec["enableServiceLinks"], spec["priority"], spec["preemptionPolicy"]) == (
        True, 0, "PreemptLowerPriority")
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    assert got["status"]["phase"] == "Pending" and got["status"]["qosClass"] == "Burstable"


def test_workload_defaults_and_required_status(server: RunningServer) -> None:
    base = {"selector": {"matchLabels": {"app": "x"}}, "template": TEMPLATE}
    ds = create(server, "/apis/apps/v1/namespaces/default/daemonsets",
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"}, "spec": base})
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["spec"]["revisionHistoryLimit"] == 10
    assert ds["status"] == {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                            "numberReady": 0}
    sts = create(server, "/apis/apps/v1/namespaces/default/statefulsets",
                 {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "sts"}, "spec": base})
    spec = sts["spec"]
    assert (spec["replicas"], spec["podManagementPolicy"], spec["revisionHistoryLimit"]) == (1, "OrderedReady", 10)
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert sts["status"] == {"replicas": 0, "availableReplicas": 0}
    rs = create(server, "/apis/apps/v1/namespaces/default/replicasets",
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"}, "spec": base})
    assert rs["spec"]["replicas"] == 1 and rs["status"] == {"replicas": 0}
    rc = create(server, "/api/v1/namespaces/default/replicationcontrollers",
                {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"},
                 "spec": {"template": TEMPLATE}})
    assert rc["spec"]["selector"] == {"app": "x"} and rc["metadata"]["labels"] == {"app": "x"}
    cj = create(server, "/apis/batch/v1/namespaces/default/cronjobs", {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}})
    assert {k: cj["spec"][k] for k in ("concurrencyPolicy", "suspend", "successfulJobsHistoryLimit",
                                       "failedJobsHistoryLimit")} == {
        "concurrencyPolicy": "Allow", "suspend": False, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1}


def test_service_addresses_and_policy_fields(server: RunningServer) -> None:
    svc = create(server, "/api/v1/namespaces/default/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "np"},
        "spec": {"type": "NodePort", "selector": {"app": "x"}, "ports": [{"port": 80}]}})
    spec = svc["spec"]
    assert spec["clusterIP"].startswith("10.") and spec["clusterIPs"] == [spec["clusterIP"]]
    assert (spec["ipFamilies"], spec["ipFamilyPolicy"], spec["internalTrafficPolicy"],
            spec["externalTrafficPolicy"], spec["sessionAffinity"]) == (["IPv4"], "SingleStack", "Cluster",
                                                                        "Cluster", "None")
    (port,) = spec["ports"]
    assert port["protocol"] == "TCP" and port["targetPort"] == 80 and 30000 <= port["nodePort"] <= 32767
    assert svc["status"] == {"loadBalancer": {}}


def test_other_kinds(server: RunningServer) -> None:
    pv = create(server, "/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1024Mi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/d"}}})
    assert (pv["spec"]["persistentVolumeReclaimPolicy"], pv["spec"]["volumeMode"]) == ("Retain", "Filesystem")
    assert pv["spec"]["capacity"] == {"storage": "1Gi"} and pv["status"] == {"phase": "Pending"}
    netpol = create(server, "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "n"},
        "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]}})
    assert netpol["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert netpol["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 53}]
    rb = create(server, "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb"},
        "roleRef": {"kind": "Role", "name": "r"}, "subjects": [{"kind": "User", "name": "alice"}]})
    assert rb["roleRef"]["apiGroup"] == rb["subjects"][0]["apiGroup"] == "rbac.authorization.k8s.io"
    lr = create(server, "/api/v1/namespaces/default/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "64Mi"}}]}})
    (item,) = lr["spec"]["limits"]
    assert item["default"] == {"cpu": "2"} and item["defaultRequest"] == {"cpu": "2", "memory": "64Mi"}
    hook = create(server, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "m"}, "webhooks": [{
            "name": "m.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "default", "name": "s"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}]})
    (w,) = hook["webhooks"]
    assert (w["failurePolicy"], w["matchPolicy"], w["timeoutSeconds"], w["reinvocationPolicy"]) == (
        "Fail", "Equivalent", 10, "Never")
    assert w["namespaceSelector"] == w["objectSelector"] == {}
    assert w["rules"][0]["scope"] == "*" and w["clientConfig"]["service"]["port"] == 443
    node = create(server, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                                            "status": {"capacity": {"cpu": "4"}}})
    assert node["status"]["allocatable"] == {"cpu": "4"}
    pc = create(server, "/apis/scheduling.k8s.io/v1/priorityclasses", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "pc"}, "value": 5})
    assert pc["preemptionPolicy"] == "PreemptLowerPriority"
    pdb = create(server, "/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "none"}}}})
    assert {k: pdb["status"][k] for k in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")} \
        == {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}
