"""`gpuops sim up --detach` and `gpuops sim down`: the emulated cluster in the background, for scripts and
READMEs that run kubectl commands one after another.

`up --detach` starts the same command without --detach as a child in its own session, writes its pid next to
the kubeconfig (`<kubeconfig>.pid`, its output in `<kubeconfig>.log`) and returns once the child has written
the kubeconfig, which it does only when the cluster answers. A kubeconfig left by an earlier run is removed
first, so "the file exists" always means "this cluster is up". `down` stops the child (SIGTERM, then waits)
and removes the three files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def _files(kubeconfig: str) -> tuple[Path, Path, Path]:
    kc = Path(kubeconfig)
    return kc, kc.with_name(kc.name + ".pid"), kc.with_name(kc.name + ".log")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_pid(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def up_detached(argv: Sequence[str], kubeconfig: str, *, timeout: float = 180.0) -> int:
    """Start `gpuops <argv>` (argv without --detach) in the background; 0 once its kubeconfig is written."""
    kc, pidfile, logfile = _files(kubeconfig)
    pid = _running_pid(pidfile)
    if pid is not None:
        print(f"gpuops sim up: a cluster started with this kubeconfig still runs (pid {pid}); stop it first: "
              f"gpuops sim down --kubeconfig {kubeconfig}", file=sys.stderr)
        return 1
    kc.unlink(missing_ok=True)
    exe = Path(sys.executable).parent / "gpuops"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuops"]
    with open(logfile, "wb") as log:
        proc = subprocess.Popen([*command, *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    pidfile.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while not kc.exists():
        if proc.poll() is not None:
            print(f"gpuops sim up: the cluster exited with code {proc.returncode} before it was up; its output:\n"
                  + logfile.read_text(errors="replace")[-4000:], file=sys.stderr)
            pidfile.unlink(missing_ok=True)
            return 1
        if time.monotonic() > deadline:
            print(f"gpuops sim up: not up within {timeout:.0f} s (see {logfile}); stopping it", file=sys.stderr)
            proc.terminate()
            return 1
        time.sleep(0.1)
    time.sleep(0.2)  # the banner follows the kubeconfig at once
    banner = [line for line in logfile.read_text(errors="replace").splitlines() if not line.startswith("{")]
    print("\n".join(banner))
    print(f"gpuops sim up: running in the background (pid {proc.pid}, output in {logfile}); "
          f"stop it with: gpuops sim down --kubeconfig {kubeconfig}", flush=True)
    return 0


def down(kubeconfig: str, *, timeout: float = 60.0) -> int:
    """Stop the cluster `up --detach` started with this kubeconfig; 0 also when none runs."""
    kc, pidfile, _ = _files(kubeconfig)
    pid = _running_pid(pidfile)
    if pid is None:
        print(f"gpuops sim down: no cluster runs for {kubeconfig}")
    else:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
            print(f"gpuops sim down: pid {pid} did not stop within {timeout:.0f} s; killed it", file=sys.stderr)
        else:
            print(f"gpuops sim down: stopped (pid {pid})")
    for f in (kc, pidfile):
        f.unlink(missing_ok=True)
    return 0


__all__ = ["down", "up_detached"]
