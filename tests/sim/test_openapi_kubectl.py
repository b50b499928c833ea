"""Real kubectl against discovery and OpenAPI documents from our modules: strict apply, re-apply, explain.

A tiny aiohttp server serves /api, /apis, the group-version lists and /openapi/v3 straight from
discovery.py and openapi.py, plus just enough object handling (404 GET, echoing POST, PATCH) for
`kubectl apply` with its default strict validation to complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuops_sim.apiserver import discovery, openapi
from gpuops_sim.apiserver.errors import StatusError, not_found
from gpuops_sim.apiserver.resources import ResourceInfo, builtin_resources

KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"
if not KUBECTL.exists():
    KUBECTL = Path(shutil.which("kubectl") or "/nonexistent/kubectl")



def gwb() -> ResourceInfo:
    return ResourceInfo(
        group="gpuops.io",
        version="v1alpha1",
        resource="gpuworkloadbudgets",
        kind="GPUWorkloadBudget",
        singular="gpuworkloadbudget",
        namespaced=True,
        short_names=("gwb",),
        categories=("all",),
        subresources={"status": ("GPUWorkloadBudget", ("get", "patch", "update"))},
        has_generation=True,
        status_subresource=True,
        crd_name="gpuworkloadbudgets.gpuops.io",
        schema={
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {"type": "object", "properties": {"gpuHours": {"type": "integer", "minimum": 0}}},
                "status": {"type": "object", "properties": {"used": {"type": "number"}}},
            },
        },
    )


class Probe:
    """Serves discovery/OpenAPI from our modules and records every request."""

    def __init__(self, aggregated: bool, *, strip_field_validation: bool = False) -> None:
        self.infos = [*builtin_resources(), gwb()]
        self.aggregated = aggregated
        self.strip_field_validation = strip_field_validation
        self.log: list[dict[str, str]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.thread.start()

    def stop(self) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def handle(self, req: web.Request) -> web.StreamResponse:
        body = await req.read()
        self.log.append(
            {
                "method": req.method,
                "path": req.path,
                "query": req.query_string,
                "accept": req.headers.get("Accept", ""),
                "content_type": req.headers.get("Content-Type", ""),
                "body": body.decode(),
            }
        )
        try:
            return self.route(req, body)
        except StatusError as e:
            return web.json_response(e.to_status(), status=e.code)

    def route(self, req: web.Request, body: bytes) -> web.StreamResponse:
        path = req.path.rstrip("/")
        if path == "/version":
            return web.json_response(discovery.version_info())
        if path in ("/api", "/apis"):
            mode, ctype = discovery.negotiate_discovery(req.headers.get("Accept"))
            if not self.aggregated:
                mode, ctype = "legacy", "application/json"
            if mode == "legacy":
                doc = discovery.api_versions() if path == "/api" else discovery.api_group_list(self.infos)
            else:
                doc = discovery.aggregated_discovery(self.infos, core=path == "/api", version=mode)
            return web.Response(body=json.dumps(doc), headers={"Content-Type": ctype})
        if path == "/openapi/v3":
            return web.json_response(openapi.openapi_v3_index(self.infos))
        if path.startswith("/openapi/v3/"):
            gv = path.removeprefix("/openapi/v3/").removeprefix("api/").removeprefix("apis/")
            gv_doc = openapi.openapi_v3_group_version(self.infos, gv)
            if gv_doc is None:
                raise StatusError(404, "NotFound", "the server could not find the requested resource")
            if self.strip_field_validation:
                for item in gv_doc["paths"].values():
                    for op in item.values():
                        if isinstance(op, dict):
                            op["parameters"] = [
                                p for p in op.get("parameters", []) if p["name"] != "fieldValidation"
                            ]
            return web.json_response(gv_doc)
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            gv, rest = parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            listing = discovery.api_resource_list(self.infos, gv)
            if listing is None:
                raise StatusError(404, "NotFound", "the server could not find the requested resource")
            return web.json_response(listing)
        namespace = ""
        if rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        resource, name = rest[0], (rest[1] if len(rest) > 1 else "")
        info = next(i for i in self.infos if i.group_version == gv and i.resource == resource)
        key = f"{gv}/{resource}/{namespace}/{name}"
        if req.method == "GET":
            discovery.negotiate_object(req.headers.get("Accept"))
            if not name:
                items = [o for k, o in self.objects.items() if k.startswith(f"{gv}/{resource}/")]
                meta = {"resourceVersion": str(self.rv)}
                return web.json_response(
                    {"kind": info.list_kind, "apiVersion": info.api_version, "metadata": meta, "items": items}
                )
            if key not in self.objects:
                raise not_found(resource, info.group, name)
            return web.json_response(self.objects[key])
        if req.method == "POST":
            obj = json.loads(body)
            self.rv += 1
            meta = obj.setdefault("metadata", {})
            meta.update(
                uid=str(uuid.uuid4()), resourceVersion=str(self.rv), creationTimestamp="2025-01-01T00:00:00Z"
            )
            if namespace:
                meta["namespace"] = namespace
            self.objects[f"{gv}/{resource}/{namespace}/{meta['name']}"] = obj
            return web.json_response(obj, status=201)
        if req.method == "PATCH" and key in self.objects:
            self.rv += 1
            self.objects[key]["metadata"]["resourceVersion"] = str(self.rv)
            return web.json_response(self.objects[key])
        raise StatusError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )

    def requests(self, since: int) -> list[tuple[str, str]]:
        return [(e["method"], e["path"]) for e in self.log[since:]]


class Kubectl:
    def __init__(self, probe: Probe, home: Path) -> None:
        self.probe = probe
        self.home = home
        (home / "kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: sim, cluster: {{server: 'http://127.0.0.1:{probe.port}'}}}}]\n"
            "users: [{name: u, user: {token: test-token}}]\n"
            "contexts: [{name: sim, context: {cluster: sim, user: u, namespace: default}}]\n"
            "current-context: sim\n"
        )

    def __call__(self, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
        since = len(self.probe.log)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.home),
            "KUBECONFIG": str(self.home / "kubeconfig"),
        }
        proc = subprocess.run(
            [str(KUBECTL), "--cache-dir", str(self.home / "cache"), *args],
            env=env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return proc, self.probe.log[since:]


@contextlib.contextmanager
def running(tmp_path: Path, probe: Probe) -> Iterator[Kubectl]:
    probe.start()
    (tmp_path / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1, namespace: default}\ndata: {a: '1'}\n"
    )
    (tmp_path / "cm2.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1, namespace: default, labels: {team: a}}\n"
        "data: {a: '2', b: '3'}\n"
    )
    (tmp_path / "cr.yaml").write_text(
        "apiVersion: gpuops.io/v1alpha1\nkind: GPUWorkloadBudget\n"
        "metadata: {name: team-a, namespace: default}\nspec: {gpuHours: 10}\n"
    )
    try:
        yield Kubectl(probe, tmp_path)
    finally:
        probe.stop()


@pytest.fixture(params=["aggregated", "legacy"])
def kubectl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kubectl]:
    with running(tmp_path, Probe(aggregated=request.param == "aggregated")) as k:
        yield k


def _posts(log: list[dict[str, str]]) -> list[dict[str, str]]:
    return [e for e in log if e["method"] == "POST"]


def test_strict_apply_of_builtin_and_custom_resource(kubectl: Kubectl) -> None:
    """Default `kubectl apply` validates server-side: fieldValidation=Strict, no /openapi/v2 fallback."""
    proc, log = kubectl("apply", "-f", "cm.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "configmap/c1 created" in proc.stdout
    (post,) = _posts(log)
    assert post["path"] == "/api/v1/namespaces/default/configmaps"
    assert (
        "fieldValidation=Strict" in post["query"]
        and "fieldManager=kubectl-client-side-apply" in post["query"]
    )
    paths = [e["path"] for e in log]
    assert "/openapi/v3" in paths and "/openapi/v3/api/v1" in paths
    assert "/openapi/v2" not in paths
    assert "/apis/apiextensions.k8s.io/v1/customresourcedefinitions" not in paths

    proc, log = kubectl("apply", "-f", "cr.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "gpuworkloadbudget.gpuops.io/team-a created" in proc.stdout
    (post,) = _posts(log)
    assert post["path"] == "/apis/gpuops.io/v1alpha1/namespaces/default/gpuworkloadbudgets"
    assert "fieldValidation=Strict" in post["query"]
    assert "/openapi/v3/apis/gpuops.io/v1alpha1" in [e["path"] for e in log]
    assert "/openapi/v2" not in [e["path"] for e in log]


def test_control_without_field_validation_parameter(tmp_path: Path) -> None:
    """Control: strip the parameter and kubectl falls back to /openapi/v2 and gives up."""
    with running(tmp_path, Probe(aggregated=True, strip_field_validation=True)) as kubectl:
        proc, log = kubectl("apply", "-f", "cm.yaml")
    assert proc.returncode != 0 and "--validate=false" in proc.stderr
    assert "/openapi/v2" in [e["path"] for e in log] and not _posts(log)


def test_reapply_builtin_uses_v3_patch_metadata(kubectl: Kubectl) -> None:
    """Re-apply computes the strategic merge patch from our v3 component schema (no v2, no warning)."""
    assert kubectl("apply", "-f", "cm.yaml")[0].returncode == 0
    proc, log = kubectl("apply", "-f", "cm2.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "configmap/c1 configured" in proc.stdout
    assert "openapi" not in proc.stderr
    (patch,) = [e for e in log if e["method"] == "PATCH"]
    assert patch["content_type"] == "application/strategic-merge-patch+json"
    assert "fieldValidation=Strict" in patch["query"]
    assert json.loads(patch["body"])["data"] == {"a": "2", "b": "3"}
    assert "/openapi/v2" not in [e["path"] for e in log]

    proc, log = kubectl("apply", "--server-side", "-f", "cm2.yaml")
    assert proc.returncode == 0, proc.stderr
    ssa = next(e for e in log if e["method"] == "PATCH")
    assert ssa["content_type"] == "application/apply-patch+yaml"
    assert "fieldManager=kubectl" in ssa["query"] and "fieldValidation=Strict" in ssa["query"]


def test_api_resources_and_short_names(kubectl: Kubectl) -> None:
    proc, log = kubectl("api-resources")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("gpuworkloadbudgets "))
    assert line.split()[:3] == ["gpuworkloadbudgets", "gwb", "gpuops.io/v1alpha1"]
    assert any(ln.split()[:2] == ["pods", "po"] for ln in proc.stdout.splitlines())
    per_gv = {e["path"] for e in log} & {"/api/v1", "/apis/gpuops.io/v1alpha1"}
    if kubectl.probe.aggregated:
        assert per_gv == set()  # aggregated discovery needs no per-group-version GETs
        accept = next(e["accept"] for e in log if e["path"] == "/api")
        assert "as=APIGroupDiscoveryList" in accept
    else:
        assert per_gv == {"/api/v1", "/apis/gpuops.io/v1alpha1"}

    proc, log = kubectl("get", "gwb")
    assert proc.returncode == 0, proc.stderr
    listing = next(e for e in log if e["path"].endswith("/gpuworkloadbudgets"))
    assert listing["accept"].startswith("application/json;as=Table;v=v1;g=meta.k8s.io")


def test_explain_walks_our_schemas(kubectl: Kubectl) -> None:
    proc, _ = kubectl("explain", "configmap.data")
    assert proc.returncode == 0, proc.stderr
    assert "map[string]string" in proc.stdout
    proc, _ = kubectl("explain", "gwb.spec")
    assert proc.returncode == 0, proc.stderr
    assert "gpuHours" in proc.stdout
