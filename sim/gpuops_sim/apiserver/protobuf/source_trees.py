"""The Go module source trees the table is derived from: which generated.proto files it covers, where an
import path lies on disk, and each proto file and Go package parsed once."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .derive_common import DeriveError
from .idl_go import GoPackage, load_go_package
from .idl_proto import ProtoFile, go_path_of_proto_package, parse_proto

MODULES = {"api": "k8s.io/api", "apimachinery": "k8s.io/apimachinery",
           "apiextensions": "k8s.io/apiextensions-apiserver", "aggregator": "k8s.io/kube-aggregator"}
# packages outside k8s.io/api that the codec needs, per module option; k8s.io/api contributes every GA version dir
FIXED_PACKAGES = {
    "apimachinery": ("pkg/apis/meta/v1", "pkg/runtime", "pkg/api/resource", "pkg/util/intstr"),
    "apiextensions": ("pkg/apis/apiextensions/v1",),
    "aggregator": ("pkg/apis/apiregistration/v1",),
}
GA_VERSION = re.compile(r"v[0-9]+")


@dataclass(frozen=True)
class Module:
    """A Go module's source tree on disk."""

    path: str  # Go module path, e.g. k8s.io/api
    root: Path


class Sources:
    """The module trees: maps import paths to files, and caches parsed proto files and Go packages."""

    def __init__(self, modules: Sequence[Module]) -> None:
        self.modules = sorted(modules, key=lambda m: len(m.path), reverse=True)
        self.protos: dict[str, ProtoFile] = {}
        self.go: dict[str, GoPackage] = {}

    def locate(self, import_path: str) -> Path:
        """The file or directory behind an import path; a path outside the given modules is an error."""
        for module in self.modules:
            if import_path == module.path or import_path.startswith(module.path + "/"):
                return module.root / import_path[len(module.path):].lstrip("/")
        raise DeriveError(f"{import_path} is in none of the given source trees")

    def known(self, import_path: str) -> bool:
        """Whether an import path lies in one of the given trees (else it is, say, the standard library)."""
        return any(import_path == m.path or import_path.startswith(m.path + "/") for m in self.modules)

    def proto(self, import_path: str) -> ProtoFile:
        """The parsed generated.proto behind an import path (parsed once)."""
        if import_path not in self.protos:
            path = self.locate(import_path)
            if not path.is_file():
                raise DeriveError(f"{path}: missing (imported as {import_path})")
            self.protos[import_path] = parse_proto(path.read_text(encoding="utf-8"), import_path)
        return self.protos[import_path]

    def package(self, import_path: str) -> GoPackage:
        """The parsed Go package behind an import path (parsed once)."""
        if import_path not in self.go:
            self.go[import_path] = load_go_package(self.locate(import_path), import_path)
        return self.go[import_path]


def selected_protos(modules: Mapping[str, Module]) -> list[str]:
    """Import paths of the generated.proto files the table covers: every GA version of k8s.io/api plus the fixed
    apimachinery, apiextensions and aggregator packages."""
    selected: list[str] = []
    api = modules["api"]
    for path in sorted(api.root.glob("*/*/generated.proto")):
        if GA_VERSION.fullmatch(path.parent.name):
            selected.append(f"{api.path}/{path.relative_to(api.root).as_posix()}")
    for option, packages in FIXED_PACKAGES.items():
        if option in modules:
            selected.extend(f"{modules[option].path}/{package}/generated.proto" for package in packages)
    return selected


def load_protos(sources: Sources, selected: Sequence[str]) -> list[str]:
    """Parses the selected files and everything they import; returns the import paths of the dependencies."""
    pending, dependencies = list(selected), []
    while pending:
        import_path = pending.pop()
        first_visit = import_path not in sources.protos
        proto = sources.proto(import_path)
        if not first_visit:
            continue
        if import_path not in selected:
            dependencies.append(import_path)
        expected_go = go_path_of_proto_package(proto.package)
        if proto.go_package != expected_go or import_path != f"{expected_go}/generated.proto":
            raise DeriveError(f"{import_path}: package {proto.package} / go_package {proto.go_package} disagree")
        pending.extend(proto.imports)
    return sorted(dependencies)
