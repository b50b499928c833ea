"""The closest thing to running our image on a machine without a container engine.

Reads the Dockerfile's own install line (extras, constraints) and USER, installs exactly that into a fresh
virtualenv (not editable, as the image does), then, as that numeric user with no writable home and the working
directory `/` (the Deployment's read-only root filesystem leaves nothing else writable):
  - `gpuops --help`, `gpuops run --help`, `gpuops agent --help` (the entrypoints of the operator and agent);
  - no emulator code is installed, and `gpuops sim`, `gpuops demo` and `gpuops agent --emulated` exit 2 naming
    the distribution that brings them;
  - `gpuops run` with the Deployment's flags (leader election, --metrics-secure, the MIG webhook) against an
    emulated API server with our CRDs, until /readyz answers 200 and /metrics serves our series over HTTPS to a
    bearer token, then SIGTERM and a clean exit with no error logged.
Fails (exit 1) with the step that broke. Needs root (to switch user); `.ci/run` calls it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_BIN = ROOT / ".venv" / "bin"


def dockerfile() -> tuple[list[str], str]:
    """(the extras the image installs, the USER it runs as)."""
    text = (ROOT / "Dockerfile").read_text()
    extras = re.search(r'pip install [^\n]*"/src\[([a-z,]+)\]"', text)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    if not extras or not user:
        sys.exit("Dockerfile: no `pip install ... \"/src[extras]\"` line or no USER")
    return extras.group(1).split(","), user[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, within: float, proc: subprocess.Popen[bytes], token: str | None = None) -> str:
    """GET `url` until it answers 200 (HTTPS without verification: the metrics certificate is self-signed)."""
    deadline = time.monotonic() + within
    last = ""
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gpuops run exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(request, timeout=2, context=unverified) as r:
                return str(r.read().decode())
        except OSError as e:
            last = str(e)
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {within} s: {last}")


def check_no_emulator(venv: Path, gpuops: list[str], env: dict[str, str]) -> None:
    """The image holds no emulator code, and the emulator's commands and NVML backend say how to get them."""
    found = [str(p) for p in venv.rglob("*") if p.name in ("gpuops_sim", "fakenvml.py") or "gpuops_sim" in p.name]
    if found:
        raise SystemExit(f"the image contains emulator code: {found[:5]}")
    expected = {("sim", "up"): "pip install gpuops-sim", ("demo",): "pip install gpuops-sim",
                ("agent", "--emulated", "--node-name", "n1"): "pip install gpuops-sim"}
    for args, hint in expected.items():
        r = subprocess.run([*gpuops, *args], cwd="/", env=env, capture_output=True, text=True, timeout=60)
        if r.returncode != 2 or hint not in r.stderr or "Traceback" in r.stderr:
            raise SystemExit(f"gpuops {' '.join(args)} without the emulator: exit {r.returncode}, "
                             f"stderr {r.stderr[-400:]!r}; expected exit 2 and {hint!r}")
    print("image check: no emulator code; sim, demo and agent --emulated name the gpuops-sim distribution",
          flush=True)


def main() -> int:
    if os.geteuid() != 0:
        print("image check: needs root to run as the image's user; skipped")
        return 0
    extras, user = dockerfile()
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or uid == "0":
        print(f"image check: the image must run as a numeric non-root USER (runAsNonRoot checks it), not {user!r}")
        return 1
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups"]
    work = Path(tempfile.mkdtemp(prefix="gpuops-image-"))
    work.chmod(0o755)
    try:
        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        print(f"image check: pip install -c constraints.txt .[{','.join(extras)}] (not editable)", flush=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                        "-c", str(ROOT / "constraints.txt"), f"{ROOT}[{','.join(extras)}]"], check=True)
        env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"}
        for args in (["--help"], ["run", "--help"], ["agent", "--help"]):
            subprocess.run([*as_user, str(venv / "bin" / "gpuops"), *args], check=True, cwd="/", env=env,
                           stdout=subprocess.DEVNULL)
        print(f"image check: gpuops --help, run --help, agent --help as {uid}: ok", flush=True)
        check_no_emulator(venv, [*as_user, str(venv / "bin" / "gpuops")], env)

        kubeconfig = work / "kubeconfig"
        api = subprocess.Popen([str(MAIN_BIN / "gpuops"), "sim", "apiserver", "--port", "0",
                                "--kubeconfig", str(kubeconfig)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not kubeconfig.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            kubeconfig.chmod(0o644)
            subprocess.run([str(MAIN_BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "apply", "-f",
                            str(ROOT / "manifests" / "crds")], check=True, stdout=subprocess.DEVNULL)
            metrics, probes, webhook = free_port(), free_port(), free_port()
            # the Deployment's arguments (manifests/manager/deployment.yaml), on loopback ports
            op = subprocess.Popen([*as_user, str(venv / "bin" / "gpuops"), "run", "--kubeconfig", str(kubeconfig),
                                   "--leader-elect", "--leader-elect-namespace", "default", "--log-format", "json",
                                   "--metrics-bind-address", f"127.0.0.1:{metrics}", "--metrics-secure",
                                   "--health-probe-bind-address", f"127.0.0.1:{probes}",
                                   "--mig-webhook-host", "127.0.0.1", "--mig-webhook-port", str(webhook)],
                                  cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                wait_http(f"http://127.0.0.1:{probes}/readyz", 60, op)
                token = next(line.split(":", 1)[1].strip() for line in kubeconfig.read_text().splitlines()
                             if line.strip().startswith("token:"))
                text = wait_http(f"https://127.0.0.1:{metrics}/metrics", 10, op, token=token)
                if "gpuops_informer_synced" not in text:
                    raise SystemExit("/metrics lacks gpuops_informer_synced")
                op.send_signal(signal.SIGTERM)
                out, _ = op.communicate(timeout=40)
                if op.returncode != 0:
                    raise SystemExit(f"gpuops run exited {op.returncode} after SIGTERM:\n{out.decode()[-3000:]}")
                errors = [line for line in out.decode().splitlines()
                          if line.startswith("{") and json.loads(line).get("level") in ("error", "critical")]
                if errors:
                    raise SystemExit("gpuops run logged errors:\n" + "\n".join(errors[:5]))
            finally:
                if op.poll() is None:
                    op.kill()
            print(f"image check: gpuops run as {uid} with the Deployment's flags (cwd /, no home): ready, "
                  "/metrics over HTTPS with a token, clean SIGTERM: ok")
        finally:
            api.terminate()
            api.wait(15)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
