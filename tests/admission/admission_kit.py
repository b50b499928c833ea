"""Helpers of the admission tables: create as a user would (dry run), and variants of a valid object."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from typing import Any

from running_server import RunningServer

from gpuops.controllers.crds import CRDS


class Admission:
    """Creates objects as a user would (a dry-run POST, so nothing is left behind) and returns the answer."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server

    def _send(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.server.token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def create(self, obj: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return self.write(obj, status=False)

    def write(self, obj: dict[str, Any], *, status: bool) -> tuple[int, dict[str, Any]]:
        """A dry-run create, or for `status`, a dry-run update of the /status subresource (which is where the
        writers of status send it: a create ignores status) of the object created once for real."""
        kind = obj["kind"]
        resource = next(r.resource for r in CRDS if r.resource.kind == kind)
        ns = obj["metadata"].get("namespace") if resource.namespaced else None
        query = "?dryRun=All&fieldValidation=Strict"
        if not status:
            return self._send("POST", resource.path(ns) + query, obj)
        name = obj["metadata"]["name"]
        code, current = self._send("GET", resource.path(ns, name), None)
        if code == 404:
            code, current = self._send("POST", resource.path(ns), {**obj, "status": {}})
        assert code in (200, 201), current
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        return self._send("PUT", resource.path(ns, name, "status") + query, body)


def variant(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`base` with the field at dotted `path` set to `value` (or removed when `value` is DELETE)."""
    obj = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return obj


DELETE = object()
