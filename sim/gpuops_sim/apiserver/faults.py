"""Fault injection for chaos runs: error rates per verb/resource, latency, and the switches the server acts on."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import StatusError

_REASONS = {
    409: ("Conflict", "Operation cannot be fulfilled: the object has been modified (injected fault)"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "Internal error occurred: injected fault"),
    502: ("InternalError", "bad gateway (injected fault)"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


@dataclass
class ErrorRule:
    code: int
    rate: float = 1.0
    verbs: list[str] = field(default_factory=list)  # empty: all verbs
    resources: list[str] = field(default_factory=list)  # plural names; empty: all resources
    retry_after: int | None = None
    count: int | None = None  # stop after this many injections

    def applies(self, verb: str, resource: str) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        return (not self.verbs or verb in self.verbs) and (not self.resources or resource in self.resources)


class Faults:
    """What the server should get wrong right now. Mutated from tests or over POST /sim/faults."""

    def __init__(self, seed: int | None = None) -> None:
        self.rules: list[ErrorRule] = []
        self.latency: float = 0.0
        self.injected: int = 0
        self._rng = random.Random(seed)

    def add_error(
        self,
        code: int,
        rate: float = 1.0,
        *,
        verbs: list[str] | None = None,
        resources: list[str] | None = None,
        retry_after: int | None = None,
        count: int | None = None,
    ) -> ErrorRule:
        if code not in _REASONS:
            raise ValueError(f"code: unsupported fault code {code}; use one of {sorted(_REASONS)}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate: must be between 0 and 1")
        if code == 429 and retry_after is None:
            retry_after = 1
        rule = ErrorRule(code, rate, list(verbs or []), list(resources or []), retry_after, count)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()
        self.latency = 0.0

    def check(self, verb: str, resource: str) -> None:
        """Raise the injected failure for this request, if one fires."""
        for rule in self.rules:
            if rule.applies(verb, resource) and self._rng.random() < rule.rate:
                if rule.count is not None:
                    rule.count -= 1
                self.injected += 1
                reason, message = _REASONS[rule.code]
                raise StatusError(rule.code, reason, message, retry_after=rule.retry_after)

    def describe(self) -> dict[str, Any]:
        return {"rules": [asdict(r) for r in self.rules], "latency": self.latency, "injected": self.injected}
