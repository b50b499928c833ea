"""A fifth controller by the checklist in CONTRIBUTING.md: the example ConfigMap replicator
(tests/kube/example_controller.py) declares its settings Struct and definition, is added to the product's list
of controllers, and then runs through the real `gpuops run` code path in its own process against the emulated
API server: selected with `--controllers`, configured by its own flag, converging, and stopping cleanly on
SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from running_server import RunningServer
from waiting import wait_until

HERE = Path(__file__).resolve().parent
EXAMPLE_DIR = HERE.parent / "kube"

# `gpuops run` with the example appended to the product's list: what an embedding program's main would do
RUN_WITH_EXAMPLE = """
import sys
from example_controller import CONTROLLER
from gpuops import cli
from gpuops.controllers.registry import CONTROLLERS
from gpuops.kube.registry import ControllerRegistry
sys.exit(cli.main(sys.argv[1:], controllers=ControllerRegistry([*CONTROLLERS, CONTROLLER])))
"""


def test_the_example_controller_runs_under_gpuops_run(apiserver: RunningServer, tmp_path: Path) -> None:
    api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(apiserver.kubeconfig)))
    api.create_namespaced_config_map("default", k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name="settings", labels={"copy": "yes"}), data={"a": "1"}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE_DIR), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "run.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_WITH_EXAMPLE, "run", "--kubeconfig", str(apiserver.kubeconfig),
         "--controllers", "replicator", "--replicator-max-concurrent-reconciles", "3",
         "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--log-format", "json"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def copied() -> dict[str, str] | None:
            try:
                return api.read_namespaced_config_map("settings-copy", "default").data  # type: ignore[no-any-return]
            except ApiException as e:
                if e.status != 404:
                    raise
                assert proc.poll() is None, f"gpuops run exited early: {_read(log)}"
                return None

        assert wait_until("the replicator's copy of ConfigMap settings", copied, 30.0) == {"a": "1"}
        started = _read(log)
        assert '"controllers": ["replicator"]' in started, started
        assert '"controller": "replicator", "workers": 3' in started, started  # its own flag reached it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, _read(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _read(log: object) -> str:
    assert hasattr(log, "seek") and hasattr(log, "read")
    log.seek(0)
    return str(log.read())
