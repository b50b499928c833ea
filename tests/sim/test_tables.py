"""Server-side Table printing for `kubectl get`."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.apiserver.resources import ResourceInfo, builtin_resources
from gpuops_sim.apiserver.tables import (
    JSONPathError,
    column_definitions,
    human_duration,
    jsonpath_find,
    render_table,
    render_table_row_event,
)

RES = {r.kind: r for r in builtin_resources()}
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


def ts(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def crd_info(columns: list[dict[str, Any]] | None = None) -> ResourceInfo:
    return ResourceInfo(
        group="gpuops.io",
        version="v1alpha1",
        resource="gpuworkloadbudgets",
        kind="GPUWorkloadBudget",
        singular="gpuworkloadbudget",
        namespaced=True,
        short_names=("gwb",),
        crd_name="gpuworkloadbudgets.gpuops.io",
        printer_columns=columns or [],
    )


def names(table: dict[str, Any]) -> list[str]:
    return [c["name"] for c in table["columnDefinitions"]]


def cells(table: dict[str, Any], row: int = 0) -> list[Any]:
    return list(table["rows"][row]["cells"])


# ---------------------------------------------------------------------------------------------------------
# Table envelope


def test_table_envelope_and_partial_object_metadata() -> None:
    cm = {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "resourceVersion": "7",
            "uid": "u",
            "creationTimestamp": ts(timedelta(minutes=5)),
            "labels": {"a": "b"},
        },
        "data": {"x": "1", "y": "2"},
        "binaryData": {"z": "AA=="},
    }
    before = copy.deepcopy(cm)
    t = render_table(
        RES["ConfigMap"], [cm], resource_version="42", continue_token="tok", remaining=3, now=NOW
    )
    assert t["kind"] == "Table" and t["apiVersion"] == "meta.k8s.io/v1"
    assert t["metadata"] == {"resourceVersion": "42", "continue": "tok", "remainingItemCount": 3}
    assert names(t) == ["Name", "Data", "Age"]
    assert t["columnDefinitions"][0] == {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": t["columnDefinitions"][0]["description"],
        "priority": 0,
    }
    assert cells(t) == ["c", 3, "5m"]
    assert t["rows"][0]["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": cm["metadata"],
    }
    assert t["rows"][0]["object"]["metadata"] is not cm["metadata"]
    assert cm == before


def test_empty_list_and_minimal_metadata() -> None:
    t = render_table(RES["Pod"], [], resource_version="5")
    assert t["metadata"] == {"resourceVersion": "5"} and t["rows"] == []
    assert len(t["columnDefinitions"]) == 9


def test_include_object_modes() -> None:
    cm = {"metadata": {"name": "c", "namespace": "ns"}, "data": {}}
    none = render_table(RES["ConfigMap"], [cm], resource_version="1", include_object="None")
    assert none["rows"][0]["object"] is None
    full = render_table(RES["ConfigMap"], [cm], resource_version="1", include_object="Object")
    assert full["rows"][0]["object"] == {"kind": "ConfigMap", "apiVersion": "v1", **cm}
    assert (
        render_table(RES["ConfigMap"], [cm], resource_version="1", include_object="")["rows"][0]["object"][
            "kind"
        ]
        == "PartialObjectMetadata"
    )
    with pytest.raises(StatusError) as ei:
        render_table(RES["ConfigMap"], [cm], resource_version="1", include_object="Everything")
    assert ei.value.code == 400 and ei.value.message == (
        'Unable to convert to Table as requested: includeObject: Invalid value: "Everything": '
        "must be 'Metadata', 'Object', 'None', or empty"
    )


def test_watch_event_table() -> None:
    cm = {"metadata": {"name": "c", "namespace": "ns", "resourceVersion": "9"}, "data": {"a": "b"}}
    first = render_table_row_event(RES["ConfigMap"], cm, now=NOW)
    assert first["metadata"] == {"resourceVersion": "9"} and len(first["rows"]) == 1
    assert names(first) == ["Name", "Data", "Age"]
    later = render_table_row_event(RES["ConfigMap"], cm, include_headers=False, now=NOW)
    assert later["columnDefinitions"] is None and later["rows"] == first["rows"]


def test_default_convertor_name_and_created_at() -> None:
    role = {"metadata": {"name": "r", "creationTimestamp": "2024-03-04T05:06:07.123456+02:00"}}
    t = render_table(RES["Role"], [role, {"metadata": {"name": "bare"}}], resource_version="1", now=NOW)
    assert names(t) == ["Name", "Created At"]
    assert t["columnDefinitions"][1]["type"] == "date"
    assert cells(t, 0) == ["r", "2024-03-04T03:06:07Z"]
    assert cells(t, 1) == ["bare", "0001-01-01T00:00:00Z"]


# ---------------------------------------------------------------------------------------------------------
# Custom resources


def test_crd_without_columns_gets_age() -> None:
    obj = {"metadata": {"name": "team-a", "namespace": "ns", "creationTimestamp": ts(timedelta(hours=3))}}
    t = render_table(crd_info(), [obj], resource_version="3", now=NOW)
    assert names(t) == ["Name", "Age"]
    assert t["columnDefinitions"][1]["type"] == "date"
    assert cells(t) == ["team-a", "3h"]


def test_crd_printer_columns_typed_cells() -> None:
    columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Pods", "type": "integer", "jsonPath": ".status.pods", "priority": 1},
        {"name": "Ratio", "type": "number", "jsonPath": ".status.ratio", "format": "float"},
        {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
        {"name": "Types", "type": "string", "jsonPath": ".status.conditions[*].type"},
        {"name": "Selector", "type": "string", "jsonPath": ".spec.selector"},
        {"name": "Zone", "type": "string", "jsonPath": ".metadata.labels['topology.kubernetes.io/zone']"},
        {"name": "Missing", "type": "string", "jsonPath": ".status.nothing"},
        {"name": "Seen", "type": "date", "jsonPath": ".status.lastSeen", "description": "when"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    obj = {
        "metadata": {
            "name": "b",
            "namespace": "ns",
            "creationTimestamp": ts(timedelta(days=3, hours=4)),
            "labels": {"topology.kubernetes.io/zone": "z1"},
        },
        "spec": {"paused": False, "selector": {"matchLabels": {"app": "x", "<": "&"}}},
        "status": {
            "conditions": [{"type": "Progressing", "status": "False"}, {"type": "Ready", "status": "True"}],
            "pods": 4.0,
            "ratio": 1,
            "lastSeen": ts(timedelta(seconds=90)),
        },
    }
    t = render_table(crd_info(columns), [obj], resource_version="3", now=NOW)
    defs = t["columnDefinitions"]
    assert names(t) == ["Name"] + [c["name"] for c in columns]
    assert defs[2]["priority"] == 1 and defs[3]["format"] == "float" and defs[9]["description"] == "when"
    assert defs[1]["description"] == (
        "Custom resource definition column (in JSONPath format): "
        '.status.conditions[?(@.type=="Ready")].status'
    )
    assert cells(t) == [
        "b",
        "True",
        4,
        1.0,
        False,
        "Progressing",  # only the first result is shown
        '{"matchLabels":{"\\u003c":"\\u0026","app":"x"}}',
        "z1",
        None,
        "90s",
        "3d4h",
    ]


def test_crd_cells_of_wrong_type_are_null() -> None:
    columns = [
        {"name": "N", "type": "integer", "jsonPath": ".spec.n"},
        {"name": "B", "type": "boolean", "jsonPath": ".spec.n"},
        {"name": "D", "type": "date", "jsonPath": ".spec.when"},
        {"name": "S", "type": "string", "jsonPath": ".spec.nothing"},
        {"name": "Z", "type": "string", "jsonPath": ".spec.null"},
        {"name": "F", "type": "string", "jsonPath": ".spec.f"},
        {"name": "Bad", "type": "string", "jsonPath": ".spec[?("},
    ]
    obj = {"metadata": {"name": "x"}, "spec": {"n": "seven", "when": "yesterday", "null": None, "f": 2e6}}
    assert cells(render_table(crd_info(columns), [obj], resource_version="1", now=NOW)) == [
        "x",
        None,
        None,
        "<invalid>",
        None,
        "<no value>",
        "2e+06",
        None,
    ]


# ---------------------------------------------------------------------------------------------------------
# Pods


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": ts(timedelta(minutes=30))},
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.1.2.3"}], **status},
    }


def _running(name: str, ready: bool = True, restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ready": ready, "restartCount": restarts, "state": {"running": {}}, **extra}


def test_pod_running_ready() -> None:
    pod = _pod(
        containerStatuses=[_running("a"), _running("b", ready=False)],
        conditions=[{"type": "Ready", "status": "False"}],
    )
    t = render_table(RES["Pod"], [pod], resource_version="1", now=NOW)
    assert names(t) == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]
    assert [c["priority"] for c in t["columnDefinitions"]] == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert cells(t) == ["p", "1/2", "Running", "0", "30m", "10.1.2.3", "n1", "<none>", "<none>"]
    assert "conditions" not in t["rows"][0]


def test_pod_waiting_reason_and_restarts_age() -> None:
    crashing = {
        "name": "a",
        "ready": False,
        "restartCount": 5,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": ts(timedelta(minutes=4))}},
    }
    pod = _pod(containerStatuses=[crashing, _running("b")])
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW))[1:4] == [
        "1/2",
        "CrashLoopBackOff",
        "5 (4m ago)",
    ]


def test_pod_pending_unscheduled() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
        },
    }
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW)) == [
        "p",
        "0/1",
        "SchedulingGated",
        "0",
        "<unknown>",
        "<none>",
        "<none>",
        "<none>",
        "<none>",
    ]


def test_pod_terminating_and_terminal() -> None:
    pod = _pod(containerStatuses=[_running("a"), _running("b")])
    pod["metadata"]["deletionTimestamp"] = ts(timedelta(seconds=1))
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW))[2] == "Terminating"
    done = _pod(
        phase="Succeeded",
        containerStatuses=[
            {"name": "a", "ready": False, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ],
    )
    done["metadata"]["deletionTimestamp"] = ts(timedelta(seconds=1))
    row = render_table(RES["Pod"], [done], resource_version="1", now=NOW)["rows"][0]
    assert row["cells"][2] == "Completed"
    assert row["conditions"] == [
        {
            "type": "Completed",
            "status": "True",
            "reason": "Succeeded",
            "message": "The pod has completed successfully.",
        }
    ]
    lost = _pod(reason="NodeLost")
    lost["metadata"]["deletionTimestamp"] = ts(timedelta(seconds=1))
    assert cells(render_table(RES["Pod"], [lost], resource_version="1", now=NOW))[2] == "Unknown"
    failed = _pod(
        phase="Failed",
        containerStatuses=[{"name": "a", "state": {"terminated": {"exitCode": 137, "signal": 9}}}],
    )
    row = render_table(RES["Pod"], [failed], resource_version="1", now=NOW)["rows"][0]
    assert row["cells"][2] == "Signal:9" and row["conditions"][0]["reason"] == "Failed"


def test_pod_init_containers_and_sidecars() -> None:
    pod = _pod(
        phase="Pending",
        initContainerStatuses=[{"name": "init", "state": {"waiting": {"reason": "PodInitializing"}}}],
    )
    pod["spec"]["initContainers"] = [{"name": "init"}, {"name": "other"}]
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW))[1:3] == ["0/2", "Init:0/2"]
    pod["status"]["initContainerStatuses"][0] = {"name": "init", "state": {"terminated": {"exitCode": 2}}}
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW))[2] == "Init:ExitCode:2"
    side = _pod(
        initContainerStatuses=[
            {"name": "proxy", "started": True, "ready": True, "restartCount": 1, "state": {"running": {}}}
        ],
        containerStatuses=[_running("a"), _running("b")],
    )
    side["spec"]["initContainers"] = [{"name": "proxy", "restartPolicy": "Always"}]
    assert cells(render_table(RES["Pod"], [side], resource_version="1", now=NOW))[1:4] == [
        "3/3",
        "Running",
        "1",
    ]


def test_pod_readiness_gates_and_nominated_node() -> None:
    pod = _pod(nominatedNodeName="n9", conditions=[{"type": "example.com/lb", "status": "True"}])
    pod["spec"]["readinessGates"] = [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/x"}]
    assert cells(render_table(RES["Pod"], [pod], resource_version="1", now=NOW))[7:] == ["n9", "1/2"]


# ---------------------------------------------------------------------------------------------------------
# Other built-in printers


def test_node_status_roles_version() -> None:
    node = {
        "metadata": {
            "name": "n1",
            "creationTimestamp": ts(timedelta(days=10)),
            "labels": {
                "node-role.kubernetes.io/control-plane": "",
                "node-role.kubernetes.io/gpu": "",
                "node-role.kubernetes.io/": "x",
            },
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ],
            "nodeInfo": {"kubeletVersion": "v1.33.1", "osImage": "Ubuntu"},
            "addresses": [{"type": "InternalIP", "address": "192.168.0.5"}],
        },
    }
    t = render_table(RES["Node"], [node], resource_version="1", now=NOW)
    assert names(t)[:5] == ["Name", "Status", "Roles", "Age", "Version"]
    assert cells(t) == [
        "n1",
        "Ready,SchedulingDisabled",
        "control-plane,gpu",
        "10d",
        "v1.33.1",
        "192.168.0.5",
        "<none>",
        "Ubuntu",
        "<unknown>",
        "<unknown>",
    ]
    bare = {
        "metadata": {"name": "n2", "labels": {"kubernetes.io/role": "worker"}},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }
    assert cells(render_table(RES["Node"], [bare], resource_version="1", now=NOW))[1:3] == [
        "NotReady",
        "worker",
    ]
    assert cells(render_table(RES["Node"], [{"metadata": {"name": "n3"}}], resource_version="1", now=NOW))[
        1:3
    ] == ["Unknown", "<none>"]


def test_namespace_secret_lease_pdb_deployment() -> None:
    age = ts(timedelta(hours=30))
    ns = {"metadata": {"name": "team-a", "creationTimestamp": age}, "status": {"phase": "Terminating"}}
    assert cells(render_table(RES["Namespace"], [ns], resource_version="1", now=NOW)) == [
        "team-a",
        "Terminating",
        "30h",
    ]
    sec = {"metadata": {"name": "s", "creationTimestamp": age}, "type": "Opaque", "data": {"a": "", "b": ""}}
    assert cells(render_table(RES["Secret"], [sec], resource_version="1", now=NOW)) == [
        "s",
        "Opaque",
        2,
        "30h",
    ]
    lease = {"metadata": {"name": "l", "creationTimestamp": age}, "spec": {"holderIdentity": "pod-1"}}
    assert cells(render_table(RES["Lease"], [lease], resource_version="1", now=NOW)) == ["l", "pod-1", "30h"]
    pdb = {
        "metadata": {"name": "pdb", "creationTimestamp": age},
        "spec": {"minAvailable": "50%"},
        "status": {"disruptionsAllowed": 1},
    }
    assert cells(render_table(RES["PodDisruptionBudget"], [pdb], resource_version="1", now=NOW)) == [
        "pdb",
        "50%",
        "N/A",
        1,
        "30h",
    ]
    dep = {
        "metadata": {"name": "d", "creationTimestamp": age},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "spec": {"containers": [{"name": "c", "image": "i:1"}, {"name": "e", "image": "j"}]}
            },
        },
        "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert cells(render_table(RES["Deployment"], [dep], resource_version="1", now=NOW)) == [
        "d",
        "2/3",
        3,
        2,
        "30h",
        "c,e",
        "i:1,j",
        "app=d",
    ]


def test_event_columns() -> None:
    ev = {
        "metadata": {"name": "p.123"},
        "type": "Warning",
        "reason": "Evicted",
        "message": " gone \n",
        "involvedObject": {"kind": "Pod", "name": "p", "fieldPath": "spec.containers{a}"},
        "source": {"component": "gpuops-budget"},
        "reportingInstance": "ctl-0",
        "firstTimestamp": ts(timedelta(minutes=20)),
        "lastTimestamp": ts(timedelta(minutes=2)),
        "count": 4,
    }
    t = render_table(RES["Event"], [ev], resource_version="1", now=NOW)
    assert names(t)[0] == "Last Seen" and names(t)[-1] == "Name"
    assert cells(t) == [
        "2m",
        "Warning",
        "Evicted",
        "pod/p",
        "spec.containers{a}",
        "gpuops-budget, ctl-0",
        "gone",
        "20m",
        4,
        "p.123",
    ]
    series = {
        "metadata": {"name": "e"},
        "eventTime": ts(timedelta(minutes=9)),
        "involvedObject": {"kind": "Node"},
        "series": {"count": 7, "lastObservedTime": "2025-06-01T11:59:00.000000Z"},
    }
    assert cells(render_table(RES["Event"], [series], resource_version="1", now=NOW))[0:4] == [
        "60s",
        "",
        "",
        "node",
    ]


def test_column_definitions_are_fresh_copies() -> None:
    cols = column_definitions(RES["Pod"])
    cols[0]["name"] = "changed"
    assert column_definitions(RES["Pod"])[0]["name"] == "Name"


# ---------------------------------------------------------------------------------------------------------
# Ages and JSONPath


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=-5), "<invalid>"),
        (timedelta(seconds=-1), "0s"),
        (timedelta(0), "0s"),
        (timedelta(seconds=119), "119s"),
        (timedelta(minutes=2), "2m"),
        (timedelta(minutes=2, seconds=5), "2m5s"),
        (timedelta(minutes=10, seconds=5), "10m"),
        (timedelta(minutes=179), "179m"),
        (timedelta(hours=3), "3h"),
        (timedelta(hours=7, minutes=59), "7h59m"),
        (timedelta(hours=47), "47h"),
        (timedelta(days=2), "2d"),
        (timedelta(days=7, hours=23), "7d23h"),
        (timedelta(days=8), "8d"),
        (timedelta(days=729), "729d"),
        (timedelta(days=365 * 3 + 5), "3y5d"),
        (timedelta(days=365 * 9), "9y"),
    ],
)
def test_human_duration(delta: timedelta, text: str) -> None:
    assert human_duration(delta) == text


def test_jsonpath_subset() -> None:
    obj = {"a": {"b.c": [{"k": 1, "v": "x"}, {"k": 2, "v": "y"}]}, "l": [3, 4, 5]}
    assert jsonpath_find(".a['b.c'][1].v", obj) == ["y"]
    assert jsonpath_find(".a['b.c'][*].k", obj) == [1, 2]
    assert jsonpath_find(".a['b.c'][?(@.k==2)].v", obj) == ["y"]
    assert jsonpath_find(".a['b.c'][?(@.v!='x')].k", obj) == [2]
    assert jsonpath_find(".l[-1]", obj) == [5]
    assert jsonpath_find(".l[0:2]", obj) == [3, 4]
    assert jsonpath_find("{.l[1]}", obj) == [4]
    assert jsonpath_find("..v", obj) == ["x", "y"]
    assert jsonpath_find(".missing.deeper", obj) == []
    with pytest.raises(JSONPathError):
        jsonpath_find(".l[9]", obj)
    with pytest.raises(JSONPathError):
        jsonpath_find(".a[?(@.k ~ 2)]", obj)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(".[]()?@='\"*:,-0123abk\\ $")), max_size=25))
def test_jsonpath_property_never_crashes(path: str) -> None:
    obj = {"a": {"b": [{"k": 1}, {"k": "2"}]}, "k": [1, None, True]}
    with contextlib.suppress(JSONPathError):
        jsonpath_find(path, obj)
    info = crd_info([{"name": "X", "type": "string", "jsonPath": path}])
    render_table(info, [obj], resource_version="1", now=NOW)


# ---------------------------------------------------------------------------------------------------------
# Real kubectl prints our tables. Skipped when the binary or aiohttp is unavailable.

KUBECTL = shutil.which("kubectl", path=str(Path(os.__file__).parents[3] / "bin")) or shutil.which("kubectl")


@pytest.fixture
def fake_apiserver() -> Iterator[str]:
    web = pytest.importorskip("aiohttp.web")
    gwb = crd_info(
        [
            {"name": "Pods", "type": "integer", "jsonPath": ".status.pods"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
    )
    pod = _pod(containerStatuses=[_running("a"), _running("b")])
    pod["metadata"]["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    budget = {
        "metadata": {
            "name": "team-a",
            "namespace": "default",
            "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "status": {},
    }

    def resources(info: ResourceInfo) -> dict[str, Any]:
        return {
            "name": info.resource,
            "singularName": info.singular,
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": ["get", "list"],
            "shortNames": list(info.short_names),
        }

    routes = {
        "/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.0", "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/apis": {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": "gpuops.io",
                    "versions": [{"groupVersion": "gpuops.io/v1alpha1", "version": "v1alpha1"}],
                    "preferredVersion": {"groupVersion": "gpuops.io/v1alpha1", "version": "v1alpha1"},
                }
            ],
        },
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [resources(RES["Pod"])]},
        "/apis/gpuops.io/v1alpha1": {
            "kind": "APIResourceList",
            "groupVersion": "gpuops.io/v1alpha1",
            "resources": [resources(gwb)],
        },
        "/api/v1/namespaces/default/pods": render_table(RES["Pod"], [pod], resource_version="10"),
        "/apis/gpuops.io/v1alpha1/namespaces/default/gpuworkloadbudgets": render_table(
            gwb, [budget], resource_version="11"
        ),
    }

    async def handle(request: Any) -> Any:
        body = routes.get(request.path)
        if body is None:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                    "message": "not found",
                },
                status=404,
            )
        return web.json_response(body)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_real_kubectl_prints_tables(fake_apiserver: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{fake_apiserver}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]\n"
    )
    base = [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache")]

    def run(*args: str) -> str:
        proc = subprocess.run([*base, *args], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    lines = run("get", "pods").splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:4] == ["p", "2/2", "Running", "0"]
    wide = run("get", "pods", "-o", "wide").splitlines()
    assert wide[0].split()[5:7] == ["IP", "NODE"]
    assert "10.1.2.3" in wide[1] and "n1" in wide[1]
    gwb = run("get", "gwb").splitlines()
    assert gwb[0].split() == ["NAME", "PODS", "AGE"]
    assert gwb[1].split() == ["team-a", "0s"]  # a null cell prints blank
