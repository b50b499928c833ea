"""The README's "Try it in ten minutes", run as written: its shell blocks in order, in one bash session from the
checkout, twice in a row, each block's output checked against the text block the README shows after it.

In a shown output, whitespace stands for any run of blanks and `<name>` for any word, so the README can show
ages, ids and pids as a reader sees them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Try it in ten minutes"
KUBECONFIG = ROOT / "tryit.kubeconfig"
MARK = "@@ end of README block"


@dataclass
class Block:
    script: str
    shown: list[str]


def tryit_blocks(readme: str) -> list[Block]:
    """The section's ```sh blocks, each with the lines of the ```text block that follows it (if any)."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    text = readme[start:end if end != -1 else None]
    blocks: list[Block] = []
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```$", text, flags=re.S | re.M):
        if lang == "sh":
            blocks.append(Block(body, []))
        elif lang == "text" and blocks and not blocks[-1].shown:
            blocks[-1].shown = [line for line in body.splitlines() if line.strip()]
    return blocks


def shown_pattern(line: str) -> re.Pattern[str]:
    def word(w: str) -> str:
        return r"\S+".join(re.escape(part) for part in re.split(r"<[^>]*>", w))

    return re.compile(r"\s+".join(word(w) for w in line.split()))


def run_section(blocks: list[Block], timeout: float = 600.0) -> list[str]:
    """Run every block in one bash (exports carry over, the first failing command stops it); the output of each."""
    script = "set -euo pipefail\n" + "".join(f"{b.script}\necho '{MARK}'\n" for b in blocks)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the interpreter running the tests
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    outputs = (done.stdout + done.stderr).split(MARK)
    finished = done.stdout.count(MARK)
    assert done.returncode == 0, (f"README block {finished + 1} failed (exit {done.returncode}):\n"
                                  f"{blocks[min(finished, len(blocks) - 1)].script}\n--- its output:\n"
                                  f"{outputs[min(finished, len(outputs) - 1)][-6000:]}\n--- the cluster:\n"
                                  f"{cluster_state(env)}")
    return [out.strip("\n") for out in done.stdout.split(MARK)[:len(blocks)]]


def cluster_state(env: dict[str, str]) -> str:
    """What a reader would look at when a block fails: the pods, why their containers wait, recent Events."""
    if not KUBECONFIG.exists():
        return "(no cluster: the kubeconfig is gone)"
    kubectl = [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(KUBECONFIG)]
    waiting = "{range .items[*]}{.metadata.name}: {.status.containerStatuses[*].state}{\"\\n\"}{end}"
    out = []
    for args in (["get", "pods", "-A", "-o", "wide"], ["get", "pods", "-A", "-o", f"jsonpath={waiting}"],
                 ["get", "events", "-A", "--sort-by=.lastTimestamp"]):
        got = subprocess.run([*kubectl, *args], env=env, capture_output=True, text=True, timeout=30, check=False)
        out.append(got.stdout[-3000:] + got.stderr[-500:])
    return "\n".join(out)


def check_shown(blocks: list[Block], outputs: list[str]) -> None:
    for i, (block, out) in enumerate(zip(blocks, outputs, strict=True)):
        lines = out.splitlines()
        for want in block.shown:
            pattern = shown_pattern(want)
            assert any(pattern.search(line) for line in lines), (
                f"README block {i + 1} shows {want!r}, but its output has no such line:\n{out[-4000:]}")


def test_shown_lines_match_with_placeholders() -> None:
    pattern = shown_pattern("pod/train-llm-<id>   condition met")
    assert pattern.search("pod/train-llm-85cz2 condition met")
    assert not pattern.search("pod/train-llm- condition met")
    assert shown_pattern("a100-0   Ready   <none>   <age>").search("a100-0   Ready    <none>   3s")
    assert not shown_pattern("a100-0 Ready").search("a100-0 NotReady")


def test_the_section_is_runnable_as_written() -> None:
    blocks = tryit_blocks(README.read_text())
    assert len(blocks) >= 4 and blocks[-1].script.startswith("gpuops sim down")
    assert all(b.shown for b in blocks), "every block shows what the reader will see"


@pytest.mark.timeout(1500)
def test_try_it_in_ten_minutes_twice_in_a_row() -> None:
    blocks = tryit_blocks(README.read_text())
    try:
        for _ in range(2):
            check_shown(blocks, run_section(blocks))
            assert not KUBECONFIG.exists(), "gpuops sim down removes the kubeconfig"
    finally:
        subprocess.run([str(Path(sys.executable).parent / "gpuops"), "sim", "down", "--kubeconfig", str(KUBECONFIG)],
                       capture_output=True, timeout=120, check=False)
