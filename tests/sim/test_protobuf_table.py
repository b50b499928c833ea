"""The protobuf wire table of the built-in kinds (gpuops_sim/apiserver/protobuf/k8s_1_37.json): well formed, right on
facts anyone can read in the published IDL and Go tags, and witnessed by the struct tags of the pinned kubectl
binary. The derivation's parsers are also checked to refuse what the generator never writes, so that a format
change upstream stops the derivation instead of producing a wrong table."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuops_sim.apiserver import protobuf
from gpuops_sim.apiserver.protobuf.derive import FORMAT, NOTE
from gpuops_sim.apiserver.protobuf.derive_common import LABELS, SCALARS, DeriveError
from gpuops_sim.apiserver.protobuf.idl_go import GoPackage, build_constraint_holds, go_file_included, parse_go_file
from gpuops_sim.apiserver.protobuf.idl_proto import parse_proto
from gpuops_sim.apiserver.protobuf.kubectl_tags import check_binary
from gpuops_sim.apiserver.protobuf.table_text import render

TABLE_PATH = Path(protobuf.__file__).with_name("k8s_1_37.json")
KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
CORE = "k8s.io.api.core.v1"
META = "k8s.io.apimachinery.pkg.apis.meta.v1"
APIEXT = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1"
FLAGS = re.compile(r"p?e?z?i?v?")


@pytest.fixture(scope="module")
def table() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def kubectl_bytes() -> bytes:
    return KUBECTL.read_bytes()  # `make test` installs it; missing, the test fails rather than skips


def fields(table: dict[str, Any], message: str) -> dict[str, list[Any]]:
    """A message's rows by proto name."""
    return {row[1]: row for row in table["messages"][message]}


# ------------------------------------------------------------------------------------------------- well formed


def test_table_header(table: dict[str, Any]) -> None:
    assert table["format"] == FORMAT and table["note"] == NOTE
    assert table["sources"]["k8s.io/api"].startswith("10b39a39")
    assert {"k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiextensions-apiserver"} <= set(table["sources"])
    assert "1.37" in table["describes"]


def test_table_is_in_the_writers_layout(table: dict[str, Any]) -> None:
    """One message per line, exactly as the script writes it: a hand edit shows up here."""
    assert render(table) == TABLE_PATH.read_text(encoding="utf-8")


def test_every_row_is_well_formed(table: dict[str, Any]) -> None:
    messages, custom = table["messages"], set(table["custom"])
    assert len(messages) > 600
    for name, rows in messages.items():
        numbers = [row[0] for row in rows]
        assert len(set(numbers)) == len(numbers) and all(isinstance(n, int) and n > 0 for n in numbers), name
        for _number, proto_name, json_name, label, kind, flags in rows:
            where = f"{name}.{proto_name}"
            assert label in LABELS, where
            assert kind in SCALARS or kind in messages, f"{where}: type {kind} not in the table"
            assert FLAGS.fullmatch(flags), f"{where}: flags {flags!r}"
            assert "v" not in flags or (label == "o" and kind in messages and "p" not in flags), where
            assert "i" not in flags or (json_name == "" and "v" in flags), where
            if name in custom:
                assert json_name == proto_name and flags == "", where


def test_map_values_and_custom_entries_exist(table: dict[str, Any]) -> None:
    messages = table["messages"]
    map_values = {row[4] for rows in messages.values() for row in rows if row[2] and row[3] == "m"}
    assert map_values <= SCALARS | set(messages)
    assert {"string", "bytes", "k8s.io.apimachinery.pkg.api.resource.Quantity"} <= map_values
    assert set(table["custom"]) <= set(messages) and table["custom"] == sorted(table["custom"])


def test_group_versions_name_packages_with_messages(table: dict[str, Any]) -> None:
    versions = table["groupVersions"]
    packages = {name.rsplit(".", 1)[0] for name in table["messages"]}
    assert set(versions.values()) <= packages
    assert versions["v1"] == CORE and versions["apps/v1"] == "k8s.io.api.apps.v1"
    assert versions["meta.k8s.io/v1"] == META and versions["apiextensions.k8s.io/v1"] == APIEXT
    assert versions["rbac.authorization.k8s.io/v1"] == "k8s.io.api.rbac.v1"
    assert all(re.fullmatch(r"([a-z0-9.-]+/)?v[0-9]+", key) for key in versions)


# ------------------------------------------------------------------------------------------------- spot facts


def test_configmap_and_secret(table: dict[str, Any]) -> None:
    configmap = fields(table, f"{CORE}.ConfigMap")
    assert configmap["metadata"] == [1, "metadata", "metadata", "o", f"{META}.ObjectMeta", "ev"]
    assert configmap["data"] == [2, "data", "data", "m", "string", "e"]
    assert configmap["binaryData"] == [3, "binaryData", "binaryData", "m", "bytes", "e"]
    assert configmap["immutable"][0] == 4 and configmap["immutable"][3:] == ["o", "bool", "pe"]
    secret = fields(table, f"{CORE}.Secret")
    assert secret["data"][0] == 2 and secret["data"][3:5] == ["m", "bytes"]


def test_object_meta_and_owner_reference(table: dict[str, Any]) -> None:
    meta = fields(table, f"{META}.ObjectMeta")
    assert (meta["name"][0], meta["namespace"][0], meta["labels"][0]) == (1, 3, 11)
    assert meta["labels"][3:5] == ["m", "string"]
    assert meta["creationTimestamp"][4] == f"{META}.Time" and "v" in meta["creationTimestamp"][5]
    owner = table["messages"][f"{META}.OwnerReference"]
    assert owner[0][:3] == [5, "apiVersion", "apiVersion"]  # Go (and JSON) order, not number order
    assert f"{META}.Time" in table["custom"]


def test_inline_embeddings_with_a_proto_field(table: dict[str, Any]) -> None:
    volume = table["messages"][f"{CORE}.Volume"]
    inline = [row for row in volume if "i" in row[5]]
    assert [row[0] for row in inline] == [2] and inline[0][2] == "" and inline[0][4] == f"{CORE}.VolumeSource"
    assert fields(table, f"{CORE}.SecretKeySelector")["localObjectReference"][2] == ""
    assert "TypeMeta" not in str(table["messages"][f"{CORE}.Pod"])  # TypeMeta travels in the envelope


def test_json_names_that_differ_from_proto_names(table: dict[str, Any]) -> None:
    schema = fields(table, f"{APIEXT}.JSONSchemaProps")
    assert schema["ref"][2] == "$ref" and schema["schema"][2] == "$schema"
    assert schema["xKubernetesPreserveUnknownFields"][2] == "x-kubernetes-preserve-unknown-fields"
    assert schema["xKubernetesEmbeddedResource"][4] == "bool"  # the Go tag says bytes; the proto wins
    assert fields(table, "k8s.io.api.authentication.v1.BoundObjectReference")["uID"][2] == "uid"


def test_custom_types_are_listed(table: dict[str, Any]) -> None:
    expected = {"k8s.io.apimachinery.pkg.api.resource.Quantity", "k8s.io.apimachinery.pkg.util.intstr.IntOrString",
                f"{META}.Time", f"{META}.MicroTime", f"{META}.Duration", f"{META}.FieldsV1", f"{META}.Verbs",
                "k8s.io.apimachinery.pkg.runtime.RawExtension", "k8s.io.apimachinery.pkg.runtime.Unknown",
                f"{APIEXT}.JSON", f"{APIEXT}.JSONSchemaPropsOrBool", f"{APIEXT}.JSONSchemaPropsOrArray",
                f"{APIEXT}.JSONSchemaPropsOrStringArray", "k8s.io.api.authentication.v1.ExtraValue",
                "k8s.io.api.authorization.v1.ExtraValue"}
    assert expected <= set(table["custom"])
    assert f"{CORE}.List" not in table["custom"]  # `type List metav1.List`: a struct, without metav1.List's methods


# ---------------------------------------------------------------------------------------------- kubectl witness


def test_kubectl_binary_carries_every_linked_field(table: dict[str, Any], kubectl_bytes: bytes) -> None:
    report = check_binary(table, kubectl_bytes)
    assert report.missing == [] and report.json_mismatched == [] and report.json_unwitnessed == []
    assert report.ok and report.fields_checked > 2000 and report.json_checked > 2000
    assert set(report.packages_skipped) == {APIEXT, "k8s.io.kube_aggregator.pkg.apis.apiregistration.v1"}
    assert f"{CORE}.PodSpec" not in report.messages_unlinked


def test_kubectl_check_notices_a_wrong_number_or_json_fact(table: dict[str, Any], kubectl_bytes: bytes) -> None:
    broken = copy.deepcopy(table)
    meta = broken["messages"][f"{META}.ObjectMeta"]
    meta[1] = [99, *meta[1][1:]]  # generateName
    meta[2] = [*meta[2][:5], ""]  # namespace without omitempty
    report = check_binary(broken, kubectl_bytes)
    assert f"{META}.ObjectMeta.generateName = 99" in report.missing
    assert any(item.startswith(f"{META}.ObjectMeta.namespace = 3") for item in report.json_mismatched)
    assert not report.ok


# ----------------------------------------------------------------------------------------------- parser guards

PROTO_HEAD = 'syntax = "proto2";\n\npackage k8s.io.api.demo.v1;\n\noption go_package = "k8s.io/api/demo/v1";\n\n'


@pytest.mark.parametrize("body", [
    "message A {\n  message B {\n  }\n}\n",
    "enum E {\n  X = 0;\n}\n",
    "message A {\n  oneof choice {\n  }\n}\n",
    "message A {\n  optional string a = 1 [deprecated = true];\n}\n",
    "message A {\n  repeated int32 a = 1 [packed = true];\n}\n",
    "message A {\n  map<int32, string> a = 1;\n}\n",
    "message A {\n  optional string a = 1;\n  optional string b = 1;\n}\n",
    "message A {\n  optional string a = 1;\n",
])
def test_proto_parser_refuses_what_the_generator_never_writes(body: str) -> None:
    with pytest.raises(DeriveError, match=r"demo\.proto"):
        parse_proto(PROTO_HEAD + body, "demo.proto")


def test_proto_parser_reads_fields_in_file_order() -> None:
    parsed = parse_proto(PROTO_HEAD + "/*\nheader\n*/\nmessage A {\n  // doc\n  optional string b = 2;\n\n"
                         "  repeated .k8s.io.x.B a = 1;\n  map<string, bytes> m = 3;\n}\n", "demo.proto")
    rows = [(f.number, f.name, f.label, f.type) for f in parsed.messages["A"].fields]
    assert rows == [(2, "b", "o", "string"), (1, "a", "r", ".k8s.io.x.B"), (3, "m", "m", "bytes")]
    assert (parsed.package, parsed.go_package) == ("k8s.io.api.demo.v1", "k8s.io/api/demo/v1")


GO_SOURCE = '''package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Thing's comment holds a brace { and a backtick ` that must not confuse the scanner.
type Thing struct {
	metav1.TypeMeta `json:",inline"`
	Source `json:",inline" protobuf:"bytes,2,opt,name=source"`
	/* a block comment } */
	Count *int32 `json:"count,omitempty" protobuf:"varint,3,opt,name=count"`
	Items []Item `json:"items" protobuf:"bytes,4,rep,name=items"`
	A, B string
}

type (
	Names []string
	Source struct{ Path string `json:"path"` }
)

func (t Thing) MarshalJSON() ([]byte, error) { return nil, nil }
'''


def test_go_parser_reads_struct_fields_and_types() -> None:
    pkg = GoPackage("k8s.io/api/demo/v1")
    parse_go_file(pkg, Path("types.go"), GO_SOURCE)
    thing = pkg.structs["Thing"]
    assert [(f.name, f.type, f.embedded) for f in thing] == [
        ("TypeMeta", "metav1.TypeMeta", True), ("Source", "Source", True), ("Count", "*int32", False),
        ("Items", "[]Item", False), ("A", "string", False), ("B", "string", False)]
    assert thing[2].tags == {"json": "count,omitempty", "protobuf": "varint,3,opt,name=count"}
    assert pkg.others == {"Names": "[]string"} and [f.name for f in pkg.structs["Source"]] == ["Path"]
    assert pkg.json_methods == {"Thing"}
    assert pkg.imports["types.go"] == {"metav1": "k8s.io/apimachinery/pkg/apis/meta/v1"}


def test_build_constraints_follow_the_release_target() -> None:
    assert build_constraint_holds("!fieldsv1string") and not build_constraint_holds("fieldsv1string")
    assert build_constraint_holds("linux && (amd64 || arm64)") and build_constraint_holds("go1.24")
    assert not build_constraint_holds("windows || cgo")
    assert not go_file_included(Path("x_windows.go"), "package v1\n")
