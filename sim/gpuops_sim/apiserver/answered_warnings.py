"""Every `Warning` header the emulated API server answers, made visible to whoever runs it.

A warning is how kube-apiserver says a write was not taken as sent (an unknown field pruned, a duplicate
field, a deprecated API, a finalizer name it does not know): the request succeeds, so a client that does not
read warnings never learns that part of what it wrote is gone. The test suite fails on any warning it did not
expect by name: when `GPUOPS_SIM_WARNINGS_LOG` names a file, every server (in this process or a subprocess that
inherited the variable) appends each warning it answers to that file as one JSON line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = ["LOG_ENV", "AnsweredWarning", "read_log", "report"]

LOG_ENV: Final = "GPUOPS_SIM_WARNINGS_LOG"


@dataclass(frozen=True, slots=True)
class AnsweredWarning:
    method: str
    path: str
    code: int
    text: str

    def __str__(self) -> str:
        return f"{self.method} {self.path} -> {self.code}: {self.text}"


_ENCODER = msgspec.json.Encoder()


def _text(header: str) -> str:
    """The text of a `299 - "text"` header value (what client-go prints)."""
    code, _, rest = header.partition(" ")
    _agent, _, quoted = rest.partition(" ")
    if code.isdigit() and len(quoted) >= 2 and quoted[0] == quoted[-1] == '"':
        return quoted[1:-1].replace('\\"', '"')
    return header


def report(method: str, path: str, code: int, headers: list[str]) -> None:
    """Append the warnings of one answer to the log file, if one is named."""
    target = os.environ.get(LOG_ENV)
    if not target:
        return
    lines = [_ENCODER.encode({"method": method, "path": path, "code": code, "text": _text(h)}) + b"\n"
             for h in headers]
    with open(target, "ab") as f:  # one write per answer: lines from concurrent servers never interleave
        f.write(b"".join(lines))


def read_log(path: str) -> list[AnsweredWarning]:
    """The warnings a subprocess emulator wrote to `path` (none if it wrote nothing)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        d = msgspec.json.decode(line)
        out.append(AnsweredWarning(d["method"], d["path"], d["code"], d["text"]))
    return out
