"""managedFields edited in place: the FieldsV1 edits an update makes must give exactly (bytes and key order) what
decoding every manager's set and encoding it back gives."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops_sim.apiserver import apply, fieldsv1
from gpuops_sim.apiserver.apply import update_managed_fields
from gpuops_sim.apiserver.fieldsv1 import Path, fields_to_set, set_to_fields

_ELEMENTS = [
    ("f", "spec"), ("f", "status"), ("f", "a"), ("f", "b"), ("f", "zz"),
    ("k", (("name", '"x"'),)), ("k", (("name", '"y"'),)), ("k", (("name", '"x"'), ("port", "80"))),
    ("k", (("ip", '"10.0.0.2"'),)), ("k", (("ip", '"10.0.0.10"'),)),
    ("v", '"b"'), ("v", "2"), ("v", "true"), ("i", 0), ("i", 3),
]
paths = st.lists(st.sampled_from(_ELEMENTS), min_size=1, max_size=4).map(tuple)
path_sets = st.sets(paths, max_size=25)


def _enc(v: Any) -> bytes:
    return msgspec.json.encode(v)


@settings(max_examples=300, deadline=None)
@given(path_sets, path_sets)
def test_without_is_set_difference(s: set[Path], r: set[Path]) -> None:
    stored = set_to_fields(s)
    before = _enc(stored)
    edited = fieldsv1.without(stored, fieldsv1.trie(r))
    assert _enc(edited) == _enc(set_to_fields(s - r))
    assert _enc(stored) == before  # copy on write: the stored object is left alone
    assert fields_to_set(edited) == s - r


@settings(max_examples=300, deadline=None)
@given(path_sets, path_sets)
def test_with_paths_is_set_union(s: set[Path], a: set[Path]) -> None:
    stored = set_to_fields(s)
    before = _enc(stored)
    edited = fieldsv1.with_paths(stored, fieldsv1.trie(a))
    assert _enc(edited) == _enc(set_to_fields(s | a))
    assert _enc(stored) == before
    assert fields_to_set(edited) == s | a


def test_untouched_parts_are_shared() -> None:
    stored = set_to_fields({(("f", "spec"), ("f", "a")), (("f", "status"), ("f", "b"))})
    edited = fieldsv1.without(stored, fieldsv1.trie({(("f", "status"), ("f", "b"))}))
    assert edited["f:spec"] is stored["f:spec"]
    assert fieldsv1.without(stored, fieldsv1.trie({(("f", "zz"),)})) is stored


# ------------------------------------------------------------------------------------ whole updates

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["", "a", "b"]))
_STATUS = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from(["Pending", "Running", "Succeeded"]),
        "podIP": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
        "podIPs": st.lists(st.fixed_dictionaries({"ip": st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1"])}),
                           max_size=2),
        "conditions": st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["Ready", "PodScheduled", "Initialized"]),
             "status": st.sampled_from(["True", "False"])},
            optional={"reason": st.sampled_from(["A", "B"]), "lastProbeTime": st.none()}), max_size=3),
        "containerStatuses": st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["main", "side"]), "ready": st.booleans(), "restartCount": st.integers(0, 2)},
            optional={"state": st.sampled_from([{"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                                                {"terminated": {"exitCode": 0, "reason": "Completed"}}])}),
            max_size=2),
    },
)
_LABELS = st.dictionaries(st.sampled_from(["app", "team", "tier"]), st.sampled_from(["a", "b"]), max_size=3)


def _pod(labels: dict[str, str], status: dict[str, Any], extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "cuda", "ports": [{"containerPort": 80}]}],
                 "nodeName": "n1"},
        "status": status,
    }
    if extra is not None:
        pod["metadata"]["annotations"] = {"x": str(extra)}
    return pod


writes = st.lists(
    st.tuples(st.sampled_from(["kubelet", "scheduler", "client", "gpuops"]), st.sampled_from(["", "status"]),
              _LABELS, _STATUS, _VALUES),
    min_size=1, max_size=6,
)


def _write(old: dict[str, Any] | None, new: dict[str, Any], manager: str, sub: str, t: int) -> dict[str, Any]:
    return update_managed_fields(old, new, manager=manager, operation="Update", api_version="v1",
                                 now=f"2026-01-01T00:00:0{t}Z", subresource=sub)


@settings(max_examples=200, deadline=None)
@given(writes)
def test_edited_updates_match_recomputed_ones(seq: list[tuple[str, str, dict[str, str], dict[str, Any], Any]]) -> None:
    """A sequence of creates, updates and status writes by several managers: the stored FieldsV1 edited, or every
    manager decoded and encoded again, give the same objects."""
    fast: dict[str, Any] | None = None
    slow: dict[str, Any] | None = None
    for t, (manager, sub, labels, status, extra) in enumerate(seq):
        body = _pod(labels, status, extra)
        if fast is not None and slow is not None:
            body_fast = dict(body, metadata=dict(body["metadata"], managedFields=fast["metadata"].get("managedFields")))
            body_slow = copy.deepcopy(dict(body, metadata=dict(body["metadata"],
                                                               managedFields=slow["metadata"].get("managedFields"))))
        else:
            body_fast, body_slow, sub = body, copy.deepcopy(body), ""
        fast = _write(fast, body_fast, manager, sub, t)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(apply, "_stored_managers", lambda *_: None)
            slow = _write(slow, body_slow, manager, sub, t)
        assert _enc(fast) == _enc(slow)
