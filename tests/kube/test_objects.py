"""gpuops.kube.objects models and gpuops.kube.resources descriptors: decoding real API shapes, what is kept and
what is dropped, interning, and the memory a cached pod takes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from typing import Any

import msgspec
import pytest

from gpuops.kube import objects as o
from gpuops.kube.resources import CONFIGMAPS, EVENTS, JOBS, LEASES, NAMESPACES, NODES, PDBS, PODS, ResourceType

JOB_UID = "3f1c2a9e-8d7b-4c6a-9e2f-1b2c3d4e5f60"


def _stamp(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1735787045 + seconds))


def realistic_pod(i: int, job: str = "train-llama-7b") -> dict[str, Any]:
    """A Running pod of an indexed GPU Job as kube-apiserver serves it (managedFields, volumes and all).

    Every pod gets its own creation second (no sharing of timestamps between pods, which flatters interning);
    within a pod the times repeat as the kubelet writes them: scheduled and initialized at creation, sandbox
    ready 2 s later, container started at 9 s, ready at 10 s.
    """
    t0 = i * 13
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{i}-x7k2p",
            "generateName": f"{job}-{i}-",
            "namespace": "ml-team-a",
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(1234567 + i),
            "creationTimestamp": _stamp(t0),
            "labels": {
                "batch.kubernetes.io/controller-uid": JOB_UID,
                "batch.kubernetes.io/job-name": job,
                "controller-uid": JOB_UID,
                "job-name": job,
                "app.kubernetes.io/name": "trainer",
                "batch.kubernetes.io/job-completion-index": str(i),
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": JOB_UID, "controller": True,
                 "blockOwnerDeletion": True}
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": _stamp(t0), "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:job-name": {}}}}}
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["python", "train.py"],
                    "env": [{"name": "RANK", "value": str(i)}],
                    "resources": {
                        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"},
                        "limits": {"memory": "64Gi", "nvidia.com/gpu": "8"},
                    },
                    "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets", "readOnly": True}],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": f"gpu-node-{i % 64:03d}",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "enableServiceLinks": True,
            "volumes": [
                {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": _stamp(t0 + dt)}
                for t, dt in [
                    ("PodReadyToStartContainers", 2), ("Initialized", 0), ("Ready", 10), ("ContainersReady", 10),
                    ("PodScheduled", 0),
                ]
            ],
            "hostIP": f"10.0.{i // 250}.{i % 250}",
            "podIP": f"10.244.{i // 250}.{i % 250}",
            "startTime": _stamp(t0),
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"running": {"startedAt": _stamp(t0 + 9)}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "imageID": "nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }


def deployment_pod(i: int) -> dict[str, Any]:
    """A plainer pod: a Deployment replica with two labels, one container, no annotations or finalizers."""
    pod = realistic_pod(i)
    meta = pod["metadata"]
    meta["labels"] = {"app": "inference", "pod-template-hash": "7d9f8b6c5"}
    meta["generateName"] = "inference-7d9f8b6c5-"
    meta["ownerReferences"][0].update(kind="ReplicaSet", apiVersion="apps/v1", name="inference-7d9f8b6c5")
    del meta["annotations"], meta["finalizers"]
    pod["spec"]["restartPolicy"] = "Always"
    return pod


def measure_pod_bytes(make: Any = realistic_pod, n: int = 2000) -> tuple[float, float]:
    """(bytes one more decoded pod keeps alive, bytes of its JSON), measured with tracemalloc.

    Another n pods are decoded and kept first, so the figure is the steady-state cost in a warm cache
    (interned strings and shared values exist already; table growth is amortized) rather than a first load.
    """
    raws = [msgspec.json.encode(make(i)) for i in range(2 * n)]
    decoder = msgspec.json.Decoder(o.Pod)
    warm = [decoder.decode(r) for r in raws[:n]]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pods = [decoder.decode(r) for r in raws[n:]]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(warm) == len(pods)
    return (after - before - sys.getsizeof(pods)) / n, sum(map(len, raws)) / (2 * n)


def report_pod_memory() -> str:
    return "\n".join(
        f"{label}: {per_pod:.0f} bytes kept per decoded pod (JSON {json_size:.0f} bytes; target 1536)"
        for label, make in (("GPU Job pod", realistic_pod), ("Deployment pod", deployment_pod))
        for per_pod, json_size in [measure_pod_bytes(make)]
    )


def test_memory_per_cached_pod_is_reported() -> None:
    """Printed, not asserted (run with -s). Measured in a fresh interpreter: in a long-lived one the figure
    jumps whenever CPython's table of interned strings happens to resize inside the measured window."""
    out = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    print("\n" + out)
    assert "bytes kept per decoded pod" in out


# ---------------------------------------------------------------------------------------------- pods


def test_pod_keeps_what_controllers_read() -> None:
    pod = o.decode(msgspec.json.encode(realistic_pod(3)), o.Pod)
    assert pod.metadata.name == "train-llama-7b-3-x7k2p" and pod.metadata.namespace == "ml-team-a"
    assert pod.metadata.owner_references is not None and pod.metadata.owner_references[0].controller is True
    assert pod.metadata.finalizers == ("batch.kubernetes.io/job-tracking",)
    assert pod.spec.node_name == "gpu-node-003" and pod.spec.priority == 0
    assert pod.spec.containers is not None
    res = pod.spec.containers[0].resources
    assert res is not None and res.requests == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert res.limits == {"memory": "64Gi", "nvidia.com/gpu": "8"}
    assert pod.spec.tolerations is not None and pod.spec.tolerations[0].toleration_seconds == 300
    assert pod.status.phase == "Running" and pod.status.start_time == _stamp(39)
    assert pod.status.conditions is not None and [c.type for c in pod.status.conditions][2] == "Ready"
    assert pod.status.container_statuses is not None
    cs = pod.status.container_statuses[0]
    assert cs.ready and cs.state is not None and cs.state.running is not None
    assert cs.state.running.started_at == _stamp(48)
    assert cs.last_state is None  # "lastState": {} carries nothing


def test_sidecars_overhead_gates_and_terminated_state() -> None:
    raw = {
        "spec": {
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "setup"},
            ],
            "containers": [{"name": "main"}],
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "schedulingGates": [{"name": "gpuops.io/budget"}],
            "priorityClassName": "high",
            "priority": 1000,
        },
        "status": {
            "phase": "Failed",
            "reason": "Evicted",
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": 2,
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "startedAt": "2025-01-02T03:00:00Z",
                            "finishedAt": "2025-01-02T03:30:00Z",
                        }
                    },
                    "lastState": {"waiting": {"reason": "CrashLoopBackOff"}},
                }
            ],
        },
    }
    pod = o.decode(msgspec.json.encode(raw), o.Pod)
    assert pod.spec.init_containers is not None
    assert [(c.name, c.restart_policy) for c in pod.spec.init_containers] == [("proxy", "Always"), ("setup", "")]
    assert pod.spec.overhead == {"cpu": "250m", "memory": "120Mi"}
    assert pod.spec.scheduling_gates == (o.PodSchedulingGate(name="gpuops.io/budget"),)
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": "H100"}
    assert (pod.spec.priority, pod.spec.priority_class_name) == (1000, "high")
    assert pod.status.container_statuses is not None
    cs = pod.status.container_statuses[0]
    assert cs.state is not None and cs.state.terminated is not None
    t = cs.state.terminated
    assert (t.exit_code, t.reason, t.started_at, t.finished_at) == (
        137, "OOMKilled", "2025-01-02T03:00:00Z", "2025-01-02T03:30:00Z"
    )
    assert cs.last_state is not None and cs.last_state.waiting is not None
    assert cs.last_state.waiting.reason == "CrashLoopBackOff"


def test_unknown_fields_such_as_managed_fields_are_never_kept() -> None:
    pod = o.decode(msgspec.json.encode(realistic_pod(1)), o.Pod)
    encoded = msgspec.json.decode(o.encode(pod))
    assert "managedFields" not in encoded["metadata"]
    assert "volumes" not in encoded["spec"] and "image" not in encoded["spec"]["containers"][0]
    assert not hasattr(pod.metadata, "managed_fields")


@pytest.mark.parametrize(
    "model",
    [o.Pod, o.Node, o.Event, o.Lease, o.PodDisruptionBudget, o.Job, o.Namespace, o.ConfigMap,
     o.PartialObjectMetadata, o.ObjectList, o.ListMeta, o.Condition],
)
def test_every_model_decodes_an_empty_object(model: type[Any]) -> None:
    decoded = o.decode(b"{}", model)
    assert o.encode(decoded) in (b"{}", b'{"metadata":{}}', b'{"metadata":{},"spec":{}}',
                                 b'{"metadata":{},"spec":{},"status":{}}', b'{"metadata":{},"involvedObject":{}}')


def test_quantities_may_be_numbers() -> None:
    res = o.decode(b'{"requests": {"cpu": 0.5, "nvidia.com/gpu": 1}}', o.ResourceRequirements)
    assert res.requests == {"cpu": 0.5, "nvidia.com/gpu": 1}


def test_repeated_strings_are_shared_between_pods() -> None:
    a = o.decode(msgspec.json.encode(realistic_pod(1)), o.Pod)
    b = o.decode(msgspec.json.encode(realistic_pod(65)), o.Pod)
    assert a.status.phase is b.status.phase
    assert a.spec.containers is b.spec.containers  # equal containers of replicas: one tuple
    assert a.spec.tolerations is b.spec.tolerations
    assert a.metadata.owner_references is b.metadata.owner_references
    assert a.status.conditions is not None and b.status.conditions is not None
    assert a.spec.node_name is b.spec.node_name  # gpu-node-001 for both
    assert a.metadata.namespace is b.metadata.namespace
    assert a.spec.tolerations is not None and b.spec.tolerations is not None
    assert a.spec.tolerations[0].key is b.spec.tolerations[0].key
    assert a.metadata.labels is not None and b.metadata.labels is not None
    ka = next(k for k in a.metadata.labels if k.endswith("controller-uid") and k.startswith("batch"))
    kb = next(k for k in b.metadata.labels if k.endswith("controller-uid") and k.startswith("batch"))
    assert ka is kb  # a 34-character key: longer than msgspec's own key cache
    assert a.metadata.labels[ka] is b.metadata.labels[kb]
    assert a.metadata.owner_references is not None and b.metadata.owner_references is not None
    assert a.metadata.owner_references[0].uid is b.metadata.owner_references[0].uid


def test_shared_values_are_immutable_and_unequal_ones_are_not_merged() -> None:
    a = o.decode(msgspec.json.encode(realistic_pod(1)), o.Pod)
    other = realistic_pod(2)
    other["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"
    b = o.decode(msgspec.json.encode(other), o.Pod)
    assert a.spec.containers is not b.spec.containers
    assert a.spec.containers is not None and b.spec.containers is not None
    ra, rb = a.spec.containers[0].resources, b.spec.containers[0].resources
    assert ra is not None and rb is not None and ra.requests is not None and rb.requests is not None
    assert (ra.requests["nvidia.com/gpu"], rb.requests["nvidia.com/gpu"]) == ("8", "4")
    with pytest.raises(AttributeError):
        a.spec.containers[0].name = "renamed"  # type: ignore[misc]
    assert a.spec.tolerations is not None
    with pytest.raises(AttributeError):
        a.spec.tolerations[0].key = "x"  # type: ignore[misc]


def test_equal_conditions_and_container_statuses_are_shared_unequal_ones_are_not() -> None:
    a = o.decode(msgspec.json.encode(realistic_pod(1)), o.Pod)
    b = o.decode(msgspec.json.encode(realistic_pod(1)), o.Pod)  # same timestamps
    c = o.decode(msgspec.json.encode(realistic_pod(2)), o.Pod)  # other timestamps
    assert a.status.conditions is b.status.conditions and a.status.conditions is not c.status.conditions
    assert a.status.container_statuses is b.status.container_statuses
    assert a.status.container_statuses is not c.status.container_statuses
    assert a.status.conditions is not None and c.status.conditions is not None
    times = [[x.last_transition_time for x in p.status.conditions or ()] for p in (a, c)]
    assert times[0] != times[1]
    # strings of unshared values are still interned
    assert a.status.conditions[2].type is c.status.conditions[2].type
    assert a.status.conditions[0].status is c.status.conditions[0].status
    for pod in (a, b, c):
        assert pod.status.container_statuses is not None
        assert pod.status.container_statuses[0].last_state is None  # "lastState": {} on the shared path too
    with pytest.raises(AttributeError):
        a.status.conditions[0].status = "False"  # type: ignore[misc]


def test_pod_status_built_in_python_is_compacted_like_a_decoded_one() -> None:
    cond = o.PodCondition(type="Ready", status="True", last_transition_time="2026-01-01T00:00:00Z")
    cs = o.ContainerStatus(name="c", ready=True, last_state=o.ContainerState())
    st = o.PodStatus(phase="Running", conditions=(cond,), container_statuses=(cs,))
    assert st.conditions == (cond,) and st.container_statuses is not None
    assert st.container_statuses[0].last_state is None
    decoded = o.decode(o.encode(st), o.PodStatus)
    assert decoded == st and decoded.conditions is st.conditions


def test_long_annotation_values_are_left_alone() -> None:
    blob = "x" * 1000
    meta = o.decode(msgspec.json.encode({"annotations": {"big": blob, "small": "v"}}), o.ObjectMeta)
    assert meta.annotations == {"big": blob, "small": "v"}


# ---------------------------------------------------------------------------------------------- other kinds


def test_node_fields_and_go_style_names() -> None:
    raw = {
        "metadata": {"name": "gpu-1", "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
        "spec": {
            "providerID": "aws:///us-east-1a/i-0123",
            "podCIDR": "10.244.1.0/24",
            "unschedulable": True,
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule",
                        "timeAdded": "2025-01-01T00:00:00Z"}],
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8", "cpu": "192"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "191500m"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-01-01T00:00:10Z",
                            "lastTransitionTime": "2025-01-01T00:00:00Z", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0"},
        },
    }
    node = o.decode(msgspec.json.encode(raw), o.Node)
    assert node.spec.provider_id == "aws:///us-east-1a/i-0123" and node.spec.pod_cidr == "10.244.1.0/24"
    assert node.spec.unschedulable and node.spec.taints is not None
    assert node.spec.taints[0].time_added == "2025-01-01T00:00:00Z"
    assert node.status.allocatable == {"nvidia.com/gpu": "8", "cpu": "191500m"}
    assert node.status.conditions is not None and node.status.conditions[0].last_heartbeat_time
    assert node.status.addresses == (o.NodeAddress(type="InternalIP", address="10.0.0.5"),)
    out = msgspec.json.decode(o.encode(node))
    assert out["spec"]["providerID"] == "aws:///us-east-1a/i-0123" and out["spec"]["podCIDR"]


def test_event_round_trips_every_core_v1_field() -> None:
    raw = {
        "metadata": {"name": "p.17f3", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p", "uid": "u1", "apiVersion": "v1",
                           "resourceVersion": "42", "fieldPath": "spec.containers{main}"},
        "reason": "BudgetExceeded",
        "message": "GPU budget exhausted",
        "source": {"component": "gpuops-budget", "host": "node-1"},
        "firstTimestamp": "2025-01-02T03:04:05Z",
        "lastTimestamp": "2025-01-02T03:05:05Z",
        "count": 3,
        "type": "Warning",
        "eventTime": "2025-01-02T03:04:05.123456Z",
        "series": {"count": 2, "lastObservedTime": "2025-01-02T03:05:05.000001Z"},
        "action": "Evict",
        "related": {"kind": "Node", "name": "node-1", "apiVersion": "v1"},
        "reportingComponent": "gpuops.io/budget",
        "reportingInstance": "gpuops-budget-7f9c-1",
    }
    event = o.decode(msgspec.json.encode(raw), o.Event)
    assert event.series == o.EventSeries(count=2, last_observed_time="2025-01-02T03:05:05.000001Z")
    assert event.related is not None and event.related.kind == "Node"
    assert event.involved_object.field_path == "spec.containers{main}"
    assert msgspec.json.decode(o.encode(event)) == raw


def test_event_with_null_timestamps_decodes() -> None:
    raw = b'{"metadata":{"name":"e","creationTimestamp":null},"firstTimestamp":null,"lastTimestamp":null,' \
          b'"eventTime":"2025-01-02T03:04:05.000000Z","involvedObject":{"kind":"Pod","name":"p"}}'
    event = o.decode(raw, o.Event)
    assert event.first_timestamp is None and event.metadata.creation_timestamp is None
    assert event.event_time == "2025-01-02T03:04:05.000000Z"


def test_lease_keeps_microtime_strings_and_explicit_zero_values() -> None:
    spec = o.LeaseSpec(holder_identity="", lease_duration_seconds=15, lease_transitions=0,
                       renew_time="2025-01-02T03:04:05.123456Z")
    out = msgspec.json.decode(o.encode(o.Lease(spec=spec)))["spec"]
    assert out == {"holderIdentity": "", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                   "renewTime": "2025-01-02T03:04:05.123456Z"}
    back = o.decode(o.encode(o.Lease(spec=spec)), o.Lease)
    assert back.spec == spec


def test_pdb_int_or_string_and_selector() -> None:
    raw = {"spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "x"},
           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}},
           "status": {"disruptionsAllowed": 1, "currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 4,
                      "conditions": [{"type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods",
                                      "lastTransitionTime": "2025-01-02T03:04:05Z", "observedGeneration": 1}]}}
    pdb = o.decode(msgspec.json.encode(raw), o.PodDisruptionBudget)
    assert pdb.spec.min_available == "50%" and pdb.spec.max_unavailable is None
    assert pdb.spec.selector is not None and pdb.spec.selector.match_expressions is not None
    assert pdb.status.disruptions_allowed == 1
    assert pdb.status.conditions is not None and pdb.status.conditions[0].observed_generation == 1
    assert o.decode(b'{"spec":{"maxUnavailable":1}}', o.PodDisruptionBudget).spec.max_unavailable == 1


def test_job_template_and_status() -> None:
    raw = {"spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed", "backoffLimit": 0,
                    "suspend": True, "template": {"spec": {"containers": [{"name": "t",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
           "status": {"active": 2, "ready": 2, "startTime": "2025-01-02T03:04:05Z",
                      "conditions": [{"type": "Suspended", "status": "True"}]}}
    job = o.decode(msgspec.json.encode(raw), o.Job)
    assert job.spec.template is not None and job.spec.template.spec.containers is not None
    assert job.spec.suspend is True and job.spec.completion_mode == "Indexed"
    assert (job.status.active, job.status.ready, job.status.succeeded) == (2, 2, 0)


def test_list_meta_continue_and_raw_items() -> None:
    raw = b'{"kind":"PodList","metadata":{"resourceVersion":"9","continue":"tok","remainingItemCount":5},' \
          b'"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}'
    lst = o.decode(raw, o.ObjectList)
    assert lst.metadata == o.ListMeta(resource_version="9", continue_="tok", remaining_item_count=5)
    assert lst.items is not None
    assert [o.decode(bytes(i), o.PartialObjectMetadata).metadata.name for i in lst.items] == ["a", "b"]


def test_to_builtins_omits_defaults() -> None:
    cm = o.ConfigMap(metadata=o.ObjectMeta(name="a", namespace="n"), data={"k": "v"})
    assert o.to_builtins(cm) == {"metadata": {"name": "a", "namespace": "n"}, "data": {"k": "v"}}


# ---------------------------------------------------------------------------------------------- resources


def test_paths() -> None:
    assert PODS.path() == "/api/v1/pods"
    assert PODS.path("ns") == "/api/v1/namespaces/ns/pods"
    assert PODS.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert NODES.path(None, "n1") == "/api/v1/nodes/n1"
    assert NODES.path("ignored", "n1") == "/api/v1/nodes/n1"
    assert NAMESPACES.path(None, "default", "finalize") == "/api/v1/namespaces/default/finalize"
    assert LEASES.path("kube-system", "gpuops") == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/gpuops"
    assert PDBS.path("a") == "/apis/policy/v1/namespaces/a/poddisruptionbudgets"
    assert JOBS.path("a", "j") == "/apis/batch/v1/namespaces/a/jobs/j"
    assert EVENTS.path("a") == "/api/v1/namespaces/a/events"
    assert CONFIGMAPS.path("a", "x/y") == "/api/v1/namespaces/a/configmaps/x%2Fy"
    with pytest.raises(ValueError, match="namespace"):
        PODS.path(None, "p")
    with pytest.raises(ValueError, match="subresource"):
        PODS.path("ns", None, "status")


def test_api_version_key_and_typed() -> None:
    assert PODS.api_version == "v1" and LEASES.api_version == "coordination.k8s.io/v1"
    assert JOBS.list_kind == "JobList"
    pod = o.Pod(metadata=o.ObjectMeta(name="p", namespace="ns"))
    assert PODS.key(pod) == "ns/p"
    assert NODES.key(o.Node(metadata=o.ObjectMeta(name="n"))) == "n"
    assert PODS.key({"metadata": {"name": "p", "namespace": "ns"}}) == "ns/p"
    meta_only: ResourceType[o.PartialObjectMetadata] = PODS.typed(o.PartialObjectMetadata)
    assert meta_only.struct is o.PartialObjectMetadata and meta_only.path("a") == PODS.path("a")


if __name__ == "__main__":
    print(report_pod_memory())
