"""Server-side Tables for the built-ins beyond pods and nodes: the columns and cells kube-apiserver's printers give.

Expected cells follow the upstream printers' behaviour (their own table tests are the oracle for the edge
cases: `<none>`, `<pending>`, `<unset>`, `+ N more...`, the Ingress host rule, the CSR condition order). The
end-to-end test checks what the pinned kubectl prints for them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from running_server import RunningServer

from gpuops_sim.apiserver.resources import builtin_resources
from gpuops_sim.apiserver.tables import column_definitions, render_table

RES = {r.kind: r for r in builtin_resources()}
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"


def ts(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(name: str, ago: timedelta = timedelta(hours=3), **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "default", "creationTimestamp": ts(ago), **extra}


def table(kind: str, *objs: dict[str, Any]) -> dict[str, Any]:
    return render_table(RES[kind], list(objs), resource_version="1", now=NOW)


def row(kind: str, obj: dict[str, Any]) -> list[Any]:
    return list(table(kind, obj)["rows"][0]["cells"])


def header(kind: str) -> list[tuple[str, str, int]]:
    return [(c["name"], c["type"], c["priority"]) for c in column_definitions(RES[kind])]


WIDE_TEMPLATE = [("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)]


# ---------------------------------------------------------------------------------------------------------
# Services and endpoints


def _svc(spec: dict[str, Any], status: dict[str, Any] | None = None, name: str = "web") -> dict[str, Any]:
    return {"metadata": meta(name), "spec": spec, "status": status or {"loadBalancer": {}}}


def test_service_columns_and_cluster_ip_row() -> None:
    assert header("Service") == [
        ("Name", "string", 0),
        ("Type", "string", 0),
        ("Cluster-IP", "string", 0),
        ("External-IP", "string", 0),
        ("Port(s)", "string", 0),
        ("Age", "string", 0),
        ("Selector", "string", 1),
    ]
    svc = _svc(
        {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "selector": {"tier": "fe", "app": "web"},
            "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
        }
    )
    assert row("Service", svc) == ["web", "ClusterIP", "10.96.0.10", "<none>", "80/TCP,53/UDP", "3h", "app=web,tier=fe"]


def test_service_node_ports_external_ips_and_defaults() -> None:
    node_port = _svc(
        {
            "type": "NodePort",
            "clusterIPs": ["10.96.1.1", "fd00::1"],
            "externalIPs": ["192.0.2.1", "192.0.2.2"],
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 7777, "protocol": "SCTP"}],
        }
    )
    assert row("Service", node_port)[1:5] == ["NodePort", "10.96.1.1", "192.0.2.1,192.0.2.2", "80:30080/TCP,7777/SCTP"]
    # Fields kube-apiserver defaults on write: type ClusterIP, protocol TCP, clusterIPs mirrored from clusterIP.
    bare = _svc({"clusterIP": "None", "ports": [{"port": 5432}]})
    assert row("Service", bare)[1:] == ["ClusterIP", "None", "<none>", "5432/TCP", "3h", "<none>"]
    assert row("Service", _svc({"type": "ClusterIP"}))[2:5] == ["<none>", "<none>", "<none>"]


def test_service_load_balancer_and_external_name() -> None:
    ports = [{"port": 80, "protocol": "TCP"}, {"port": 8090, "protocol": "UDP"}, {"port": 8000, "protocol": "TCP"}]
    pending = _svc({"type": "LoadBalancer", "clusterIPs": ["1.3.4.5"], "ports": ports})
    assert row("Service", pending)[1:5] == ["LoadBalancer", "1.3.4.5", "<pending>", "80/TCP,8090/UDP,8000/TCP"]
    # Sorted, deduplicated, IP before hostname, and never clipped: the apiserver renders Tables wide.
    ingress = [
        {"ip": "5.6.7.8", "hostname": "host5678"},
        {"ip": "2.3.4.5"},
        {"hostname": "lb.example"},
        {"ip": "2.3.4.5"},
    ]
    served = _svc(
        {"type": "LoadBalancer", "clusterIPs": ["1.5.6.7"], "ports": ports, "selector": {"foo": "bar"}},
        {"loadBalancer": {"ingress": ingress}},
    )
    assert row("Service", served)[3] == "2.3.4.5,5.6.7.8,lb.example"
    assert row("Service", served)[6] == "foo=bar"
    both = _svc(
        {"type": "LoadBalancer", "externalIPs": ["9.9.9.9"]}, {"loadBalancer": {"ingress": [{"ip": "2.3.4.5"}]}}
    )
    assert row("Service", both)[3] == "2.3.4.5,9.9.9.9"
    assert row("Service", _svc({"type": "LoadBalancer", "externalIPs": ["9.9.9.9"]}))[3] == "9.9.9.9"
    external = _svc({"type": "ExternalName", "externalName": "db.example.com"})
    assert row("Service", external)[1:5] == ["ExternalName", "<none>", "db.example.com", "<none>"]
    assert row("Service", _svc({"type": "Weird"}))[3] == "<unknown>"


def test_endpoints_list_three_then_count_the_rest() -> None:
    assert header("Endpoints") == [("Name", "string", 0), ("Endpoints", "string", 0), ("Age", "string", 0)]
    assert row("Endpoints", {"metadata": meta("none")})[1] == "<none>"
    two = {
        "metadata": meta("web"),
        "subsets": [
            {
                "addresses": [{"ip": "10.1.0.1"}, {"ip": "10.1.0.2"}],
                "ports": [{"port": 8080, "protocol": "TCP"}, {"port": 9090, "protocol": "TCP"}],
            },
            {"addresses": [{"ip": "fd00::5"}], "ports": [{"port": 53}]},
        ],
    }
    assert row("Endpoints", two) == ["web", "10.1.0.1:8080,10.1.0.2:8080,10.1.0.1:9090 + 2 more...", "3h"]
    ipv6 = {"metadata": meta("v6"), "subsets": [{"addresses": [{"ip": "fd00::5"}], "ports": [{"port": 53}]}]}
    assert row("Endpoints", ipv6)[1] == "[fd00::5]:53"
    headless = {"metadata": meta("h"), "subsets": [{"addresses": [{"ip": "10.1.0.9"}, {"ip": "10.1.0.8"}]}]}
    assert row("Endpoints", headless)[1] == "10.1.0.9,10.1.0.8"
    assert row("Endpoints", {"metadata": meta("empty"), "subsets": [{"ports": [{"port": 1}]}]})[1] == ""


def test_endpoint_slice_ports_and_addresses() -> None:
    assert [c[0] for c in header("EndpointSlice")] == ["Name", "AddressType", "Ports", "Endpoints", "Age"]
    slice_ = {
        "metadata": meta("web-abc12"),
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80}, {"name": "metrics"}, {}, {"port": 443}],
        "endpoints": [
            {"addresses": ["10.1.0.1", "10.1.0.2"]},
            {"addresses": ["10.1.0.3"]},
            {"addresses": ["10.1.0.4"]},
        ],
    }
    assert row("EndpointSlice", slice_) == [
        "web-abc12",
        "IPv4",
        "80,metrics,* + 1 more...",
        "10.1.0.1,10.1.0.2,10.1.0.3 + 1 more...",
        "3h",
    ]
    empty = {"metadata": meta("e"), "addressType": "IPv6"}
    assert row("EndpointSlice", empty)[1:4] == ["IPv6", "<unset>", "<unset>"]


# ---------------------------------------------------------------------------------------------------------
# Workloads


def _pod_template(*containers: tuple[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels or {"app": "web"}},
        "spec": {"containers": [{"name": n, "image": i} for n, i in containers]},
    }


def test_pod_template_has_no_age() -> None:
    assert header("PodTemplate") == [
        ("Name", "string", 0),
        ("Containers", "string", 0),
        ("Images", "string", 0),
        ("Pod Labels", "string", 0),
    ]
    obj = {"metadata": meta("tmpl"), "template": _pod_template(("app", "nginx"), ("sidecar", "envoy"))}
    assert row("PodTemplate", obj) == ["tmpl", "app,sidecar", "nginx,envoy", "app=web"]
    assert row("PodTemplate", {"metadata": meta("bare")}) == ["bare", "", "", "<none>"]


def test_replica_set_and_replication_controller() -> None:
    counts = [("Desired", "integer", 0), ("Current", "integer", 0), ("Ready", "integer", 0), ("Age", "string", 0)]
    assert header("ReplicaSet") == [("Name", "string", 0), *counts, *WIDE_TEMPLATE]
    assert header("ReplicationController") == header("ReplicaSet")
    rs = {
        "metadata": meta("web-5d8f"),
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "env", "operator": "Exists"}]},
            "template": _pod_template(("nginx", "nginx:1.27")),
        },
        "status": {"replicas": 3, "readyReplicas": 2},
    }
    assert row("ReplicaSet", rs) == ["web-5d8f", 3, 3, 2, "3h", "nginx", "nginx:1.27", "app=web,env"]
    # spec.replicas defaults to 1 on write; a selector without terms is `<none>`, a malformed one `<error>`.
    bare = {"metadata": meta("bare"), "spec": {"selector": {}}}
    assert row("ReplicaSet", bare) == ["bare", 1, 0, 0, "3h", "", "", "<none>"]
    bad = {"metadata": meta("bad"), "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Nope"}]}}}
    assert row("ReplicaSet", bad)[7] == "<error>"

    rc = {
        "metadata": meta("legacy"),
        "spec": {"replicas": 2, "template": _pod_template(("app", "busybox"), labels={"b": "2", "a": "1"})},
        "status": {"replicas": 2, "readyReplicas": 2},
    }
    # An RC's selector defaults to its template's labels.
    assert row("ReplicationController", rc) == ["legacy", 2, 2, 2, "3h", "app", "busybox", "a=1,b=2"]
    rc["spec"]["selector"] = {"a": "1"}
    assert row("ReplicationController", rc)[7] == "a=1"


def test_stateful_set_ready_over_desired() -> None:
    assert header("StatefulSet") == [
        ("Name", "string", 0),
        ("Ready", "string", 0),
        ("Age", "string", 0),
        ("Containers", "string", 1),
        ("Images", "string", 1),
    ]
    sts = {
        "metadata": meta("db", timedelta(days=2, hours=5)),
        "spec": {"replicas": 3, "template": _pod_template(("pg", "postgres:16"))},
        "status": {"readyReplicas": 1},
    }
    assert row("StatefulSet", sts) == ["db", "1/3", "2d5h", "pg", "postgres:16"]
    assert row("StatefulSet", {"metadata": meta("new")})[1] == "0/1"


def test_daemon_set_counts_and_node_selector() -> None:
    assert [c[0] for c in header("DaemonSet")] == [
        "Name",
        "Desired",
        "Current",
        "Ready",
        "Up-to-date",
        "Available",
        "Node Selector",
        "Age",
        "Containers",
        "Images",
        "Selector",
    ]
    template = _pod_template(("agent", "gpuops/agent:1"))
    template["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}
    ds = {
        "metadata": meta("agent"),
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template},
        "status": {
            "desiredNumberScheduled": 4,
            "currentNumberScheduled": 4,
            "numberReady": 3,
            "updatedNumberScheduled": 2,
            "numberAvailable": 3,
        },
    }
    assert row("DaemonSet", ds) == [
        "agent",
        4,
        4,
        3,
        2,
        3,
        "kubernetes.io/os=linux,nvidia.com/gpu.present=true",
        "3h",
        "agent",
        "gpuops/agent:1",
        "app=agent",
    ]
    assert row("DaemonSet", {"metadata": meta("bare")})[6] == "<none>"


def test_cron_job_schedule_timezone_suspend_active_last_schedule() -> None:
    assert [(n, t) for n, t, _ in header("CronJob")[:7]] == [
        ("Name", "string"),
        ("Schedule", "string"),
        ("Timezone", "string"),
        ("Suspend", "boolean"),
        ("Active", "integer"),
        ("Last Schedule", "string"),
        ("Age", "string"),
    ]
    assert header("CronJob")[7:] == WIDE_TEMPLATE
    job_template = {"spec": {"template": {"spec": {"containers": [{"name": "report", "image": "busybox:1.36"}]}}}}
    cj = {
        "metadata": meta("nightly", timedelta(days=10)),
        "spec": {"schedule": "0 3 * * *", "timeZone": "Europe/Paris", "suspend": True, "jobTemplate": job_template},
        "status": {
            "active": [{"name": "nightly-1"}, {"name": "nightly-2"}],
            "lastScheduleTime": ts(timedelta(hours=9)),
        },
    }
    assert row("CronJob", cj) == [
        "nightly",
        "0 3 * * *",
        "Europe/Paris",
        "True",
        2,
        "9h",
        "10d",
        "report",
        "busybox:1.36",
        "<none>",
    ]
    # suspend defaults to false on write; no time zone and no run yet print `<none>`.
    fresh = {"metadata": meta("fresh"), "spec": {"schedule": "*/5 * * * *", "jobTemplate": job_template}}
    assert row("CronJob", fresh)[1:6] == ["*/5 * * * *", "<none>", "False", 0, "<none>"]


def test_job_and_deployment_selectors_keep_their_own_forms() -> None:
    """Jobs print a formatted selector (`<none>` for none); Deployments print the bare selector string."""
    job = {"metadata": meta("j"), "spec": {"completions": 1, "template": _pod_template(("c", "i"))}}
    assert row("Job", job)[-1] == "<none>"
    deploy = {"metadata": meta("d"), "spec": {"template": _pod_template(("c", "i"))}}
    assert row("Deployment", deploy)[-1] == ""


def test_controller_revision_names_its_controller() -> None:
    assert [c[0] for c in header("ControllerRevision")] == ["Name", "Controller", "Revision", "Age"]
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u", "controller": True}
    rev = {"metadata": meta("db-7c9f", ownerReferences=[owner]), "revision": 4}
    assert row("ControllerRevision", rev) == ["db-7c9f", "statefulset.apps/db", 4, "3h"]
    core = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}
    assert row("ControllerRevision", {"metadata": meta("x", ownerReferences=[core]), "revision": 1})[1] == "pod/p"
    not_controller = {**owner, "controller": False}
    assert row("ControllerRevision", {"metadata": meta("y", ownerReferences=[not_controller])})[1:3] == ["<none>", 0]


# ---------------------------------------------------------------------------------------------------------
# Networking


def test_ingress_class_hosts_address_ports() -> None:
    assert [c[0] for c in header("Ingress")] == ["Name", "Class", "Hosts", "Address", "Ports", "Age"]
    ing = {
        "metadata": meta("web"),
        "spec": {
            "ingressClassName": "nginx",
            "rules": [{"host": "a.example"}, {}, {"host": "b.example"}, {"host": "c.example"}, {"host": "d.example"}],
            "tls": [{"hosts": ["a.example"]}],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example"}]}},
    }
    # Rules without a host are skipped but counted: three hosts shown, then every rule past the third.
    assert row("Ingress", ing) == [
        "web",
        "nginx",
        "a.example,b.example,c.example + 2 more...",
        "203.0.113.9,lb.example",
        "80, 443",
        "3h",
    ]
    exact = {"metadata": meta("three"), "spec": {"rules": [{"host": "a"}, {"host": "b"}, {"host": "c"}]}}
    assert row("Ingress", exact)[1:5] == ["<none>", "a,b,c", "", "80"]
    assert row("Ingress", {"metadata": meta("default"), "spec": {"rules": [{}]}})[2] == "*"


def test_ingress_class_parameters() -> None:
    assert [c[0] for c in header("IngressClass")] == ["Name", "Controller", "Parameters", "Age"]
    params = {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}
    cls = {"metadata": meta("external"), "spec": {"controller": "example.com/ingress", "parameters": params}}
    assert row("IngressClass", cls) == [
        "external",
        "example.com/ingress",
        "IngressParameters.k8s.example.com/external-lb",
        "3h",
    ]
    core = {"metadata": meta("core"), "spec": {"controller": "c", "parameters": {"kind": "ConfigMap", "name": "cfg"}}}
    assert row("IngressClass", core)[2] == "ConfigMap/cfg"
    assert row("IngressClass", {"metadata": meta("plain"), "spec": {"controller": "c"}})[2] == "<none>"


def test_network_policy_pod_selector() -> None:
    assert [c[0] for c in header("NetworkPolicy")] == ["Name", "Pod-Selector", "Age"]
    sel = {"matchLabels": {"role": "db"}, "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}
    assert row("NetworkPolicy", {"metadata": meta("db"), "spec": {"podSelector": sel}})[1] == "env notin (dev),role=db"
    assert row("NetworkPolicy", {"metadata": meta("all"), "spec": {"podSelector": {}}})[1] == "<none>"


# ---------------------------------------------------------------------------------------------------------
# Storage


def test_persistent_volume() -> None:
    assert header("PersistentVolume") == [
        ("Name", "string", 0),
        ("Capacity", "string", 0),
        ("Access Modes", "string", 0),
        ("Reclaim Policy", "string", 0),
        ("Status", "string", 0),
        ("Claim", "string", 0),
        ("StorageClass", "string", 0),
        ("VolumeAttributesClass", "string", 0),
        ("Reason", "string", 0),
        ("Age", "string", 0),
        ("VolumeMode", "string", 1),
    ]
    pv = {
        "metadata": meta("pv-1"),
        "spec": {
            "capacity": {"storage": "10240Mi"},
            "accessModes": ["ReadWriteOncePod", "ReadOnlyMany", "ReadWriteOnce", "ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"namespace": "default", "name": "data"},
            "storageClassName": "fast",
            "volumeAttributesClassName": "gold",
            "volumeMode": "Block",
        },
        "status": {"phase": "Failed", "reason": "VolumeFailedRecycle"},
    }
    assert row("PersistentVolume", pv) == [
        "pv-1",
        "10Gi",
        "RWO,ROX,RWOP",
        "Delete",
        "Failed",
        "default/data",
        "fast",
        "gold",
        "VolumeFailedRecycle",
        "3h",
        "Block",
    ]
    # Phase Pending, reclaim policy Retain and mode Filesystem are kube-apiserver's defaults; the beta
    # storage-class annotation wins over the field; deletion shows Terminating.
    bare = {
        "metadata": meta("pv-2", annotations={"volume.beta.kubernetes.io/storage-class": "legacy"}),
        "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteMany"]},
    }
    assert row("PersistentVolume", bare)[1:] == [
        "0",
        "RWX",
        "Retain",
        "Pending",
        "",
        "legacy",
        "<unset>",
        "",
        "3h",
        "Filesystem",
    ]
    bare["metadata"]["deletionTimestamp"] = ts(timedelta(seconds=5))
    assert row("PersistentVolume", bare)[4] == "Terminating"


def test_persistent_volume_claim() -> None:
    assert [c[0] for c in header("PersistentVolumeClaim")] == [
        "Name",
        "Status",
        "Volume",
        "Capacity",
        "Access Modes",
        "StorageClass",
        "VolumeAttributesClass",
        "Age",
        "VolumeMode",
    ]
    bound = {
        "metadata": meta("data"),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "fast",
            "volumeName": "pv-1",
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1024Mi"}},
    }
    assert row("PersistentVolumeClaim", bound) == [
        "data",
        "Bound",
        "pv-1",
        "1Gi",
        "RWO",
        "fast",
        "<unset>",
        "3h",
        "Filesystem",
    ]
    # Capacity and access modes stay blank until a volume is named; the phase defaults to Pending.
    pending = {"metadata": meta("new"), "spec": {"accessModes": ["ReadWriteOnce"], "volumeAttributesClassName": "g"}}
    assert row("PersistentVolumeClaim", pending)[1:8] == ["Pending", "", "", "", "", "g", "3h"]


def test_storage_class_default_marker_and_defaults() -> None:
    assert [c[0] for c in header("StorageClass")] == [
        "Name",
        "Provisioner",
        "ReclaimPolicy",
        "VolumeBindingMode",
        "AllowVolumeExpansion",
        "Age",
    ]
    default = {
        "metadata": meta("standard", annotations={"storageclass.kubernetes.io/is-default-class": "true"}),
        "provisioner": "rancher.io/local-path",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
    }
    assert row("StorageClass", default) == [
        "standard (default)",
        "rancher.io/local-path",
        "Retain",
        "WaitForFirstConsumer",
        True,
        "3h",
    ]
    beta = {"metadata": meta("old", annotations={"storageclass.beta.kubernetes.io/is-default-class": "true"})}
    assert row("StorageClass", beta)[0] == "old (default)"
    plain = {"metadata": meta("slow", annotations={"storageclass.kubernetes.io/is-default-class": "false"})}
    assert row("StorageClass", {**plain, "provisioner": "p"})[:5] == ["slow", "p", "Delete", "Immediate", False]


def test_resource_quota_request_and_limit_columns() -> None:
    assert [c[0] for c in header("ResourceQuota")] == ["Name", "Request", "Limit", "Age"]
    quota = {
        "metadata": meta("compute"),
        "spec": {"hard": {"pods": "10"}},
        "status": {
            "hard": {
                "pods": "10",
                "requests.cpu": "4",
                "limits.memory": "8192Mi",
                "limits.cpu": "8",
                "memory": "1.5Gi",
            },
            "used": {"pods": "1", "requests.cpu": "500m", "limits.cpu": "1000m"},
        },
    }
    assert row("ResourceQuota", quota) == [
        "compute",
        "memory: 0/1536Mi, pods: 1/10, requests.cpu: 500m/4",
        "limits.cpu: 1/8, limits.memory: 0/8Gi",
        "3h",
    ]
    # Before the quota controller has written status there is nothing to show.
    assert row("ResourceQuota", {"metadata": meta("new"), "spec": {"hard": {"pods": "10"}}})[1:3] == ["", ""]


# ---------------------------------------------------------------------------------------------------------
# Scheduling, certificates, aggregation, RBAC, admission


def test_priority_class() -> None:
    assert header("PriorityClass") == [
        ("Name", "string", 0),
        ("Value", "integer", 0),
        ("Global-Default", "boolean", 0),
        ("Age", "string", 0),
        ("PreemptionPolicy", "string", 0),
    ]
    pc = {"metadata": meta("high"), "value": 1000000, "globalDefault": True, "preemptionPolicy": "Never"}
    assert row("PriorityClass", pc) == ["high", 1000000, True, "3h", "Never"]
    assert row("PriorityClass", {"metadata": meta("low"), "value": -5}) == [
        "low",
        -5,
        False,
        "3h",
        "PreemptLowerPriority",
    ]


def test_certificate_signing_request_condition_and_duration() -> None:
    assert [c[0] for c in header("CertificateSigningRequest")] == [
        "Name",
        "Age",
        "SignerName",
        "Requestor",
        "RequestedDuration",
        "Condition",
    ]
    csr = {
        "metadata": meta("csr-1", timedelta(minutes=5)),
        "spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "alice", "expirationSeconds": 7200},
        "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0tLS1CRUdJTg=="},
    }
    assert row("CertificateSigningRequest", csr) == [
        "csr-1",
        "5m",
        "kubernetes.io/kube-apiserver-client",
        "alice",
        "120m",
        "Approved,Issued",
    ]
    denied = {
        "metadata": meta("csr-2"),
        "spec": {"username": "bob"},
        "status": {"conditions": [{"type": "Approved"}, {"type": "Failed"}, {"type": "Denied"}]},
    }
    assert row("CertificateSigningRequest", denied)[2:] == ["<none>", "bob", "<none>", "Denied,Failed"]
    assert row("CertificateSigningRequest", {"metadata": meta("csr-3")})[5] == "Pending"
    week = {"metadata": meta("csr-4"), "spec": {"expirationSeconds": 7 * 24 * 3600}}
    assert row("CertificateSigningRequest", week)[4] == "7d"


def test_api_service_service_and_availability() -> None:
    assert [c[0] for c in header("APIService")] == ["Name", "Service", "Available", "Age"]
    local = {"metadata": meta("v1.apps"), "status": {"conditions": [{"type": "Available", "status": "True"}]}}
    assert row("APIService", local) == ["v1.apps", "Local", "True", "3h"]
    remote = {
        "metadata": meta("v1beta1.metrics.k8s.io"),
        "spec": {"service": {"namespace": "kube-system", "name": "metrics-server"}},
        "status": {"conditions": [{"type": "Available", "status": "False", "reason": "MissingEndpoints"}]},
    }
    assert row("APIService", remote)[1:3] == ["kube-system/metrics-server", "False (MissingEndpoints)"]
    assert row("APIService", {"metadata": meta("new")})[2] == "Unknown"


def test_role_bindings_list_subjects_by_kind() -> None:
    wide = [("Users", "string", 1), ("Groups", "string", 1), ("ServiceAccounts", "string", 1)]
    assert header("RoleBinding") == [("Name", "string", 0), ("Role", "string", 0), ("Age", "string", 0), *wide]
    assert [c[0] for c in header("ClusterRoleBinding")] == [c[0] for c in header("RoleBinding")]
    binding = {
        "metadata": meta("readers"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [
            {"kind": "User", "name": "alice"},
            {"kind": "ServiceAccount", "name": "builder", "namespace": "ci"},
            {"kind": "Group", "name": "devs"},
            {"kind": "User", "name": "bob"},
        ],
    }
    expected = ["readers", "ClusterRole/view", "3h", "alice, bob", "devs", "ci/builder"]
    assert row("RoleBinding", binding) == expected
    assert row("ClusterRoleBinding", binding) == expected


def test_webhook_configurations_and_admission_policies() -> None:
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert header(kind) == [("Name", "string", 0), ("Webhooks", "integer", 0), ("Age", "string", 0)]
        assert row(kind, {"metadata": meta("hooks"), "webhooks": [{"name": "a.x"}, {"name": "b.x"}]}) == [
            "hooks",
            2,
            "3h",
        ]
    assert header("ValidatingAdmissionPolicy") == [
        ("Name", "string", 0),
        ("Validations", "integer", 0),
        ("ParamKind", "string", 0),
        ("Age", "string", 0),
    ]
    policy = {
        "metadata": meta("replicas"),
        "spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}, "validations": [{"expression": "true"}]},
    }
    assert row("ValidatingAdmissionPolicy", policy) == ["replicas", 1, "v1/ConfigMap", "3h"]
    assert row("ValidatingAdmissionPolicy", {"metadata": meta("p"), "spec": {}})[1:3] == [0, "<unset>"]


def test_admission_policy_binding_param_ref() -> None:
    assert [c[0] for c in header("ValidatingAdmissionPolicyBinding")] == ["Name", "PolicyName", "ParamRef", "Age"]

    def param(ref: dict[str, Any] | None) -> Any:
        spec: dict[str, Any] = {"policyName": "replicas"}
        if ref is not None:
            spec["paramRef"] = ref
        return row("ValidatingAdmissionPolicyBinding", {"metadata": meta("b"), "spec": spec})[1:3]

    assert param(None) == ["replicas", "<unset>"]
    assert param({"name": "limits", "namespace": "team-a"}) == ["replicas", "team-a/limits"]
    assert param({"name": "limits"}) == ["replicas", "*/limits"]
    selector = {
        "matchLabels": {"tier": "gold", "env": "prod"},
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}],
    }
    assert param({"selector": selector}) == [
        "replicas",
        "&LabelSelector{MatchLabels:map[string]string{env: prod,tier: gold,},"
        "MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:zone,Operator:In,Values:[a b],},},}",
    ]
    assert param({"selector": {}})[1] == (
        "&LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{},}"
    )


def test_kinds_without_an_upstream_printer_keep_the_default_table() -> None:
    for kind in ("LimitRange", "Role", "ClusterRole", "CustomResourceDefinition"):
        assert [c["name"] for c in column_definitions(RES[kind])] == ["Name", "Created At"]


# ---------------------------------------------------------------------------------------------------------
# Every printer, whatever it is handed


FIELDS = [
    "name", "ip", "port", "kind", "type", "status", "host", "hostname", "addresses", "ports", "protocol",
    "nodePort", "accessModes", "capacity", "storage", "hard", "used", "conditions", "selector", "matchLabels",
    "matchExpressions", "key", "operator", "values", "template", "spec", "metadata", "labels", "containers",
    "replicas", "readyReplicas", "active", "lastScheduleTime", "claimRef", "parameters", "apiGroup", "paramRef",
    "paramKind", "loadBalancer", "ingress", "rules", "tls", "clusterIPs", "externalIPs", "jobTemplate",
]  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "True", "ReadWriteOnce", "1Gi", "x:y"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4),
    max_leaves=12,
)
BUILTIN_KINDS = sorted(k for k, r in RES.items() if not r.create_only)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(BUILTIN_KINDS), spec=json_values, status=json_values, extra=json_values)
def test_every_printer_fills_every_column_of_any_object(kind: str, spec: Any, status: Any, extra: Any) -> None:
    """A printer must not fail a list, whatever a stored object holds: one cell per column, always."""
    top = dict.fromkeys(("subsets", "ports", "endpoints", "webhooks", "subjects", "roleRef", "template"), extra)
    obj = {"metadata": meta("x", ownerReferences=extra), **top, "spec": spec, "status": status}
    t = table(kind, obj)
    assert len(t["rows"][0]["cells"]) == len(t["columnDefinitions"])
    json.dumps(t)


# ---------------------------------------------------------------------------------------------------------
# What kubectl prints


@pytest.fixture
def tls_apiserver(tmp_path: Path) -> Iterator[RunningServer]:
    rs = RunningServer(tmp_path / "admin.kubeconfig", tls=True)
    rs.start()
    try:
        yield rs
    finally:
        rs.stop()


def kubectl(rs: RunningServer, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(rs.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


MANIFESTS = [
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {
            "type": "NodePort",
            "clusterIP": "10.96.0.10",
            "selector": {"app": "web", "tier": "fe"},
            "ports": [
                {"port": 80, "targetPort": 8080, "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
            ],
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]},
    },
    {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-rs"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]},
            },
        },
    },
    {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {
            "schedule": "0 3 * * *",
            "timeZone": "Etc/UTC",
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "OnFailure",
                            "containers": [{"name": "report", "image": "busybox:1.36"}],
                        }
                    }
                }
            },
        },
    },
    {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "rancher.io/local-path",
        "volumeBindingMode": "WaitForFirstConsumer",
    },
]


def test_real_kubectl_prints_services_replica_sets_cron_jobs(tls_apiserver: RunningServer) -> None:
    kubectl(tls_apiserver, "apply", "-f", "-", stdin="\n---\n".join(json.dumps(m) for m in MANIFESTS))
    blocks = [b.splitlines() for b in kubectl(tls_apiserver, "get", "svc,rs,cj", "-o", "wide").strip().split("\n\n")]
    services, replica_sets, cron_jobs = ([line.split() for line in block] for block in blocks)
    assert services[0] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
    ours = {s[0]: s[:5] + s[6:] for s in services[1:] if s[0] in ("service/db", "service/web")}
    assert ours == {
        "service/db": ["service/db", "ClusterIP", "None", "<none>", "5432/TCP", "app=db"],
        "service/web": [
            "service/web",
            "NodePort",
            "10.96.0.10",
            "<none>",
            "80:30080/TCP,53:30053/UDP",
            "app=web,tier=fe",
        ],
    }
    assert replica_sets[0] == ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    rs = replica_sets[1]  # CURRENT and READY are whatever controllers have made of it by now
    assert rs[:2] == ["replicaset.apps/web-rs", "3"] and rs[2].isdigit() and rs[3].isdigit()
    assert rs[5:] == ["nginx", "nginx:1.27", "app=web"]
    assert cron_jobs[0] == [
        "NAME",
        "SCHEDULE",
        "TIMEZONE",
        "SUSPEND",
        "ACTIVE",
        "LAST",
        "SCHEDULE",
        "AGE",
        "CONTAINERS",
        "IMAGES",
        "SELECTOR",
    ]
    cj = cron_jobs[1]
    assert cj[:10] == ["cronjob.batch/nightly", "0", "3", "*", "*", "*", "Etc/UTC", "False", "0", "<none>"]
    assert cj[11:] == ["report", "busybox:1.36", "<none>"]

    narrow = kubectl(tls_apiserver, "get", "svc").splitlines()
    assert narrow[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    classes = kubectl(tls_apiserver, "get", "storageclass").splitlines()
    assert classes[0].split() == [
        "NAME",
        "PROVISIONER",
        "RECLAIMPOLICY",
        "VOLUMEBINDINGMODE",
        "ALLOWVOLUMEEXPANSION",
        "AGE",
    ]
    assert classes[1].split()[:6] == [
        "standard",
        "(default)",
        "rancher.io/local-path",
        "Delete",
        "WaitForFirstConsumer",
        "false",
    ]
