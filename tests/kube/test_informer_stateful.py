"""Mark-and-sweep relists of the informer store against a dict model (hypothesis stateful).

The model is a server (key -> resourceVersion) with an event history. The store is fed the way the
reflector feeds it: watch events in order while connected; a relist starts an epoch at a snapshot, delivers
the snapshot in pages of any size (possibly abandoned and restarted half-way, as after a failed page), then
sweeps, after which the watch resumes from the snapshot's resourceVersion. Handler notifications are applied
to a mirror that must equal the store at every step, and each notification must be valid for the mirror
(no add of a live key, updates and deletes carry the mirror's current object).
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuops.kube.informer import ADD, DELETE, INDEX_NAMESPACE, UPDATE, Store, by_namespace
from gpuops.kube.objects import ConfigMap, ObjectMeta
from gpuops.kube.resources import CONFIGMAPS

NAMES = [f"{ns}/o{i}" for ns in ("a", "b") for i in range(6)]


def obj(key: str, rv: int) -> ConfigMap:
    ns, name = key.split("/")
    return ConfigMap(metadata=ObjectMeta(name=name, namespace=ns, resource_version=str(rv)))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server: dict[str, int] = {}
        self.rv = 1
        self.history: list[tuple[int, str, str]] = []  # (rv, "PUT"|"DEL", key)
        self.watch_rv = 1  # events up to here are in the store
        self.store: Store[ConfigMap] = Store(CONFIGMAPS.key, lambda o: o.metadata.resource_version, self.on_change)
        self.store.add_index(INDEX_NAMESPACE, by_namespace)
        self.mirror: dict[str, ConfigMap] = {}
        self.relist: list[tuple[str, int]] | None = None  # the snapshot being listed
        self.relist_rv = 0
        self.listed = 0
        self.keys_before: set[str] = set()
        self.sweeps = 0

    # ------------------------------------------------------------------------------------------ notifications

    def on_change(self, kind: int, old: Any, new: Any) -> None:
        key = CONFIGMAPS.key(new)
        if kind == ADD:
            assert old is None and key not in self.mirror, f"add of live key {key}"
            self.mirror[key] = new
        elif kind == UPDATE:
            current = self.mirror.get(key)
            assert current is not None and current is old, f"update of {key} with a stale old"
            assert int(new.metadata.resource_version) > int(current.metadata.resource_version)
            self.mirror[key] = new
        else:
            assert kind == DELETE and self.mirror.get(key) is old, f"delete of {key} not matching the mirror"
            del self.mirror[key]

    # ------------------------------------------------------------------------------------------ server

    @rule(key=st.sampled_from(NAMES))
    def server_put(self, key: str) -> None:
        self.rv += 1
        self.server[key] = self.rv
        self.history.append((self.rv, "PUT", key))

    @rule(key=st.sampled_from(NAMES))
    def server_delete(self, key: str) -> None:
        if key in self.server:
            self.rv += 1
            del self.server[key]
            self.history.append((self.rv, "DEL", key))

    # ------------------------------------------------------------------------------------------ watch

    @precondition(lambda self: self.relist is None)
    @rule(n=st.integers(1, 5))
    def deliver_events(self, n: int) -> None:
        pending = [e for e in self.history if e[0] > self.watch_rv][:n]
        for rv, typ, key in pending:
            if typ == "PUT":
                self.store.upsert(obj(key, rv))
            else:
                self.store.delete(obj(key, rv))
            self.store.advance(str(rv))
            self.watch_rv = rv

    @rule(key=st.sampled_from(NAMES))
    def delete_of_unknown_key_is_ignored(self, key: str) -> None:
        if key not in self.store:
            before = dict(self.mirror)
            self.store.delete(obj(key, self.rv))
            assert self.mirror == before

    # ------------------------------------------------------------------------------------------ relist

    @rule()
    def start_relist(self) -> None:
        """Also models a relist restarted half-way (a page failed, a continue token expired)."""
        if self.relist is None:
            self.keys_before = set(list(self.store.keys()))
        self.relist = sorted(self.server.items())
        self.relist_rv = self.rv
        self.listed = 0
        self.store.begin_relist()

    @precondition(lambda self: self.relist is not None)
    @rule(n=st.integers(1, 6))
    def list_page(self, n: int) -> None:
        assert self.relist is not None
        for key, rv in self.relist[self.listed : self.listed + n]:
            self.store.upsert(obj(key, rv))
            self.keys_before.add(key)
        self.listed = min(len(self.relist), self.listed + n)

    @precondition(lambda self: self.relist is not None and self.listed == len(self.relist))
    @rule()
    def finish_relist(self) -> None:
        assert self.relist is not None
        swept = list(self.store.sweep())
        self.store.advance(str(self.relist_rv))
        snapshot = dict(self.relist)
        assert {k: int(self.store.resource_version(k) or 0) for k in list(self.store.keys())} == snapshot
        assert not set(swept) & set(snapshot)
        self.watch_rv = self.relist_rv
        self.relist = None
        self.sweeps += 1
        assert not self.store.relisting

    # ------------------------------------------------------------------------------------------ invariants

    @invariant()
    def mirror_equals_store(self) -> None:
        assert set(self.mirror) == set(list(self.store.keys()))
        for key, o in self.mirror.items():
            assert self.store.get(key) is o

    @invariant()
    def index_matches_contents(self) -> None:
        for ns in ("a", "b"):
            expected = {k for k in list(self.store.keys()) if k.startswith(ns + "/")}
            assert set(self.store.index_keys(INDEX_NAMESPACE, ns)) == expected
        assert set(self.store.index_values(INDEX_NAMESPACE)) <= {"a", "b"}

    @invariant()
    def nothing_vanishes_before_the_sweep(self) -> None:
        """Readers see a complete store during a relist: keys go only with a delete event or the sweep."""
        if self.relist is not None:
            assert set(list(self.store.keys())) == self.keys_before

    @invariant()
    def caught_up_store_equals_server(self) -> None:
        if self.relist is None and self.watch_rv == self.rv:
            assert {k: int(self.store.resource_version(k) or 0) for k in list(self.store.keys())} == self.server
            if self.rv > 1:
                assert self.store.last_resource_version == str(self.rv)


StoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestStoreMarkAndSweep = StoreMachine.TestCase


def test_structs_decode_without_managed_fields() -> None:
    """The store holds what the model declares: managedFields and unknown fields never reach memory."""
    raw = b'{"metadata":{"name":"x","namespace":"a","resourceVersion":"7","managedFields":[{"manager":"m"}]},"z":1}'
    cm = msgspec.json.decode(raw, type=ConfigMap)
    assert cm.metadata.resource_version == "7" and not hasattr(cm, "z")
