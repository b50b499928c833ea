"""Secret values never leave the process: the values read from Secrets are registered here, and every exit
(write bodies to the API server, so status, conditions and Events; log lines of every level, ours and the
libraries'; the /metrics page) replaces them before they go out.

Individual paths avoid copying secrets in the first place (error bodies are cut and scrubbed, URLs lose their
query values); this is the net under them, for the path nobody thought of: an endpoint that echoes the
Authorization header in a 500, an SDK that puts a key ID into an exception. A value is also caught in the
forms it commonly travels in (base64, URL-quoted, JSON-escaped). Values shorter than `MIN_LENGTH` are not
registered: scrubbing them would mangle ordinary text, and they are no secret anyway.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse
from typing import Any, Final

__all__ = ["MIN_LENGTH", "REDACTED", "SECRET_VALUES", "SecretValues"]

REDACTED: Final = "[redacted]"
MIN_LENGTH: Final = 6


class SecretValues:
    """A process-wide set of values to scrub, bounded (the oldest go first) and safe across threads."""

    def __init__(self, limit: int = 4096) -> None:
        self._values: dict[str, None] = {}  # insertion-ordered: the oldest are dropped first
        self._limit = limit
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._values)

    def add(self, *values: str | bytes) -> None:
        """Register values (and their usual encodings); idempotent and cheap for a value seen before."""
        forms: list[str] = []
        for value in values:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            raw = value if isinstance(value, bytes) else value.encode()
            if len(text.strip()) < MIN_LENGTH:
                continue
            forms += [text, text.strip(), base64.b64encode(raw).decode(), urllib.parse.quote(text, safe=""),
                      json.dumps(text)[1:-1]]
        new = [f for f in dict.fromkeys(forms) if len(f) >= MIN_LENGTH and f not in self._values]
        if not new:
            return
        with self._lock:
            for f in new:
                self._values[f] = None
            while len(self._values) > self._limit:
                del self._values[next(iter(self._values))]
            longest_first = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, longest_first)))

    def scrub(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(REDACTED, text)

    def clip(self, text: str, limit: int, tail: str = "") -> str:
        """At most `limit` characters of `text` (then `tail`), scrubbed before it is cut: a secret cut in two at
        the limit would no longer match, and its first part would go out."""
        text = self.scrub(text)
        return text if len(text) <= limit else text[:limit] + tail

    def scrub_any(self, value: Any) -> Any:
        """Strings anywhere in a JSON-like value (dict keys included), as a new value; others as they are."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub_any(k): self.scrub_any(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub_any(v) for v in value)
        return value

    def scrub_bytes(self, data: bytes) -> bytes:
        if self._pattern is None:
            return data
        text = data.decode("utf-8", "replace")
        scrubbed = self.scrub(text)
        return data if scrubbed == text else scrubbed.encode()


SECRET_VALUES: Final = SecretValues()
"""The values this process read from Secrets."""
