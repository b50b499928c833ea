"""One emulated API server with every gpuops CRD installed, shared by the admission tables of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from admission_kit import Admission
from running_server import RunningServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def admission(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admission]:
    server = RunningServer(tmp_path_factory.mktemp("admission") / "kubeconfig")
    server.start()
    try:
        adm = Admission(server)
        for path in sorted((ROOT / "manifests" / "crds").glob("*.yaml")):
            code, out = adm._send("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                  yaml.safe_load(path.read_text()))
            assert code == 201, out
        yield adm
    finally:
        server.stop()
