"""Injected misbehaviour of the cloud APIs: errors, latency and hangs, per API and operation.

A rule may fire `after` the operation took effect: the client then sees an error or no answer for a call
that did happen, which is the case client tokens and idempotency keys exist for.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .errors import NAMED_STATUS, STATUS_CODE, CloudError

Api = Literal["power", "spot", "cvm", "ec2"]
OPS: dict[str, tuple[str, ...]] = {
    "power": ("start", "stop", "get", "list"),
    "spot": ("run", "describe", "terminate"),
    # the Tencent CVM and AWS EC2 front ends (`cvm.py`, `ec2.py`) over the same instances, by their action names
    "cvm": ("RunInstances", "DescribeInstances", "TerminateInstances"),
    "ec2": ("RunInstances", "DescribeInstances", "TerminateInstances"),
}


@dataclass
class FaultRule:
    id: int
    api: str | None = None  # None: both APIs
    op: str | None = None  # None: every operation of the API
    status: int | None = None  # HTTP status of the injected error
    error: str | None = None  # API error code of the injected error
    message: str | None = None
    retry_after: float | None = None  # Retry-After seconds (429 defaults to 1)
    rate: float = 1.0  # probability per matching call
    count: int | None = None  # injections left; None: unlimited
    delay: float = 0.0  # seconds added before answering
    hang: bool = False  # never answer (until hang_seconds, or the server stops)
    hang_seconds: float | None = None
    after: bool = False  # fire after the operation took effect

    def matches(self, api: str, op: str, after: bool) -> bool:
        if self.after != after or (self.count is not None and self.count <= 0):
            return False
        return (self.api is None or self.api == api) and (self.op is None or self.op == op)

    @property
    def fails(self) -> bool:
        return self.hang or self.status is not None or self.error is not None

    def to_error(self) -> CloudError:
        status = self.status if self.status is not None else NAMED_STATUS.get(self.error or "", 500)
        code = self.error or STATUS_CODE.get(status, "InternalError")
        return CloudError(status, code, self.message or f"injected fault ({code})", retry_after=self.retry_after)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {_camel(k): v for k, v in d.items()}


@dataclass
class Outcome:
    """What to do to one call: wait `delay`, then hang or raise `error` (or neither)."""

    delay: float = 0.0
    rule: FaultRule | None = None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


_FIELDS = {_camel(k): k for k in FaultRule.__dataclass_fields__ if k != "id"}


class CloudFaults:
    """The fault rules; changed from Python (`add`) or over `POST /sim/cloud/faults` (`add_json`)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rules: list[FaultRule] = []
        self.injected: Counter[tuple[str, str, str]] = Counter()  # (api, op, error code | "hang" | "delay")
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)

    def add(self, *, api: str | None = None, op: str | None = None, status: int | None = None,
            error: str | None = None, message: str | None = None, retry_after: float | None = None,
            rate: float = 1.0, count: int | None = None, delay: float = 0.0, hang: bool = False,
            hang_seconds: float | None = None, after: bool = False) -> FaultRule:
        if api is not None and api not in OPS:
            raise ValueError(f"api: must be one of {sorted(OPS)}")
        if op is not None and op not in (OPS[api] if api else {o for ops in OPS.values() for o in ops}):
            raise ValueError(f"op: unknown operation {op!r} for api {api!r}")
        if status is not None and not 400 <= status <= 599:
            raise ValueError("status: must be an HTTP error status (400-599)")
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate: must be between 0 and 1")
        if count is not None and count < 0:
            raise ValueError("count: must be >= 0")
        if delay < 0 or (hang_seconds is not None and hang_seconds < 0):
            raise ValueError("delay, hangSeconds: must be >= 0")
        if not (hang or status is not None or error is not None or delay > 0):
            raise ValueError("a fault needs status, error, delay or hang")
        if retry_after is None and (status == 429 or (status is None and error == "RequestLimitExceeded")):
            retry_after = 1.0
        rule = FaultRule(next(self._ids), api, op, status, error, message, retry_after, rate, count, delay, hang,
                         hang_seconds, after)
        self.rules.append(rule)
        return rule

    def add_json(self, body: Any) -> FaultRule:
        if not isinstance(body, dict):
            raise ValueError("body: must be a JSON object")
        unknown = set(body) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: {sorted(_FIELDS)}")
        kwargs = {_FIELDS[k]: v for k, v in body.items()}
        try:
            return self.add(**kwargs)
        except TypeError as e:
            raise ValueError(str(e)) from None

    def remove(self, rule_id: int) -> bool:
        before = len(self.rules)
        self.rules = [r for r in self.rules if r.id != rule_id]
        return len(self.rules) != before

    def clear(self) -> None:
        self.rules.clear()

    def roll(self, api: str, op: str, *, after: bool) -> Outcome:
        """Fire the matching rules: their delays add up, the first failing rule decides the answer."""
        out = Outcome()
        for rule in self.rules:
            if not rule.matches(api, op, after) or self._rng.random() >= rule.rate:
                continue
            if rule.fails and out.rule is not None:
                continue  # one failure per call; leave later rules' counts alone
            if rule.count is not None:
                rule.count -= 1
            out.delay += rule.delay
            if rule.fails:
                out.rule = rule
                self.injected[(api, op, "hang" if rule.hang else rule.to_error().code)] += 1
            else:
                self.injected[(api, op, "delay")] += 1
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "rules": [r.to_json() for r in self.rules],
            "injected": [{"api": a, "op": o, "fault": f, "count": n} for (a, o, f), n in sorted(self.injected.items())],
        }
