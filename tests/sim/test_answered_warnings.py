"""The suite's rule "a warning the API server answers fails the test unless the test names it" works: a write
with an unknown field is reported with the warning's text, an unnamed warning fails the test that caused it, and a
named one does not (checked by running the suite's own conftest.py on two small tests in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuops_sim.apiserver import answered_warnings

TESTS = Path(__file__).resolve().parents[1]

INNER = '''
import json, urllib.request
import pytest

def _post(apiserver):
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "bogus": 1}).encode()
    req = urllib.request.Request(apiserver.url + "/api/v1/namespaces/default/configmaps", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + apiserver.token})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 201

def test_unnamed(apiserver):
    _post(apiserver)

@pytest.mark.apiserver_warnings('unknown field "bogus"')
def test_named(apiserver):
    _post(apiserver)
'''


def test_an_unnamed_warning_fails_its_test_and_a_named_one_does_not(tmp_path: Path) -> None:
    for helper in ("conftest.py", "running_server.py"):
        (tmp_path / helper).write_text((TESTS / helper).read_text())
    (tmp_path / "test_inner.py").write_text(INNER)
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\nmarkers =\n    apiserver_warnings(*texts): expected warnings\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini),
                          "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert "2 passed, 1 error" in out, out  # test_unnamed's body passes; its teardown is the error
    summary = out.split("short test summary")[-1]
    assert "test_unnamed" in summary and "test_named" not in summary, out
    assert 'the API server answered 1 unexpected warning(s):\n  POST /api/v1/namespaces/default/configmaps -> 201: ' \
           'unknown field "bogus"' in out, out


def test_a_reported_warning_is_logged_with_its_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "w.jsonl"
    monkeypatch.setenv(answered_warnings.LOG_ENV, str(log))
    answered_warnings.report("PUT", "/x", 200, ['299 - "unknown field \\"spec.a\\""', "plain text"])
    assert [w.text for w in answered_warnings.read_log(str(log))] == ['unknown field "spec.a"', "plain text"]
