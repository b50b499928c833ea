"""Built-in updates decode only the top-level parts they change, and "unchanged" means the same JSON: a value
Python finds equal but Go decodes differently (0 for false, 1.0 for 1) is a change, and is decoded (a 400 on a
PUT, a 422 on a patch), never stored in place of the typed value."""

from __future__ import annotations

import http.client
import json
from typing import Any

NS = "default"
CMS = f"/api/v1/namespaces/{NS}/configmaps"


def _call(rs: Any, method: str, path: str, body: Any, ctype: str = "application/json") -> tuple[int, Any]:
    host, port = rs.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Authorization": f"Bearer {rs.token}", "Content-Type": ctype}
        conn.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def test_a_part_equal_in_python_but_not_in_json_is_decoded(apiserver: Any) -> None:
    status, _ = _call(apiserver, "POST", CMS, {"metadata": {"name": "c"}, "data": {"a": "b"}, "immutable": False})
    assert status == 201
    status, got = _call(apiserver, "GET", f"{CMS}/c", None)
    assert status == 200
    put = dict(got, immutable=0)
    status, body = _call(apiserver, "PUT", f"{CMS}/c", put)
    assert status == 400, body
    assert "cannot unmarshal number into Go struct field ConfigMap.immutable of type bool" in body["message"]
    status, body = _call(apiserver, "PATCH", f"{CMS}/c", {"immutable": 0}, "application/merge-patch+json")
    assert status == 422, body
    status, body = _call(apiserver, "PATCH", f"{CMS}/c", {"data": {"c": "d"}}, "application/merge-patch+json")
    assert status == 200, body
    assert body["immutable"] is False and body["data"] == {"a": "b", "c": "d"}
    status, got = _call(apiserver, "GET", f"{CMS}/c", None)
    assert got["immutable"] is False and got["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
