"""Power transitions over HTTP webhooks: one POST per transition, retried safely, signed, observable.

k8s-gpu-autoprovision (which gpuops replaces) posts `{}` fire-and-forget and treats a 503 as success. Here a
transition is a POST that only counts as done on a 2xx, and every retry of it (within one `send`, across reconciles,
across an operator restart) carries the same `Idempotency-Key`, so a receiver that deduplicates on it powers a node
on once however often we ask. The controller derives the key (`idempotency_key`) from the transition it persisted in
status *before* calling, which is what makes a restart reuse it.

Request (the same bytes on every attempt of one transition)::

    POST <url>
    Content-Type: application/json
    User-Agent: gpuops/<version>
    Idempotency-Key: <key>
    Authorization: Bearer <token>                 (when the endpoint has a token)
    X-Gpuops-Timestamp: <unix seconds>            (when the endpoint has an HMAC key)
    X-Gpuops-Signature: sha256=<hex>              (idem)

    {"node": "<name>", "action": "scale-up" | "scale-down", "idempotencyKey": "<key>"}

Signature scheme: `hex(HMAC-SHA256(key, f"{timestamp}.".encode() + body))` over the raw body bytes, timestamp
in whole Unix seconds. Binding the timestamp into the MAC lets a receiver reject replays older than a window
(`verify_signature`, 5 min by default) without storing nonces; the idempotency key covers replays inside the
window. Each attempt is signed afresh, so a retry after a long backoff is not stale.

Answers: 2xx is success. Connection errors, timeouts, 408, 425, 429, 500, 502, 503 and 504 are retried with
exponential backoff and full jitter (or the server's Retry-After), within `max_attempts` and never past the
caller's deadline. Any other answer (a 4xx, a redirect, 501...) ends the call at once: retrying cannot fix a
wrong URL, token or payload, so the outcome says it is a configuration problem and is not retryable.
Redirects are not followed (a POST with a bearer token must not wander to another host).

Secrets (bearer token, HMAC key, URL query values) never appear in logs, errors or reprs.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import hmac
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Literal

import aiohttp
import msgspec
import structlog
from prometheus_client import Counter, Histogram
from yarl import URL

from gpuops import __version__

__all__ = [
    "RETRYABLE_STATUS",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WEBHOOK_DURATION",
    "WEBHOOK_REQUESTS",
    "Direction",
    "Endpoint",
    "Outcome",
    "PowerClient",
    "Transition",
    "display_url",
    "idempotency_key",
    "sign",
    "verify_signature",
]

log = structlog.get_logger("gpuops.controllers.autoprovision")

Direction = Literal["up", "down"]
ACTIONS: Mapping[str, str] = MappingProxyType({"up": "scale-up", "down": "scale-down"})

TIMESTAMP_HEADER = "X-Gpuops-Timestamp"
SIGNATURE_HEADER = "X-Gpuops-Signature"
USER_AGENT = f"gpuops/{__version__}"

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
"""Answers that say "not now" rather than "never": worth the same request again."""

# Headers the client owns; an endpoint's static headers may not override them.
_RESERVED = frozenset(h.lower() for h in (
    "Authorization", "Content-Type", "Content-Length", "Host", "Transfer-Encoding", "User-Agent",
    "Idempotency-Key", TIMESTAMP_HEADER, SIGNATURE_HEADER))
_TOKEN_CHARS = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 header name (fullmatch)
_KEY_CHARS = re.compile(r"[\x21-\x7e]{1,255}")  # visible ASCII: keys and tokens travel as header values
_VALUE_CHARS = re.compile(r"[\x20-\x7e\t]*")  # what any HTTP stack accepts in a header value
_SNIPPET_CHARS = 200
_READ_LIMIT = 4096
_REDACTED = "[REDACTED]"

WEBHOOK_REQUESTS = Counter(
    "gpuops_autoprovision_webhook_requests",
    "Power webhook requests by direction (up, down) and code: the HTTP status, error (no answer: DNS or"
    " connection failed), timeout, or unsent (the URL, a header or the Secret it needs is wrong or missing).",
    ["direction", "code"],
)
WEBHOOK_DURATION = Histogram(
    "gpuops_autoprovision_webhook_duration_seconds",
    "Duration of one power webhook HTTP request (one attempt, until its answer's status or failure).",
    ["direction"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)


# ------------------------------------------------------------------------------------ inputs and result


@dataclass(frozen=True, repr=False)
class Endpoint:
    """Where and how to POST one direction of one node group.

    Credentials in the URL (`user:pass@`) are refused: URLs end up in logs and Events; use `token`. The
    repr shows no token, key, header value or query value (any of them may be a credential).
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    token: str | None = None
    hmac_key: bytes | None = None
    timeout: float = 10.0

    def __post_init__(self) -> None:
        try:
            u = URL(self.url)
        except (ValueError, TypeError) as e:
            raise ValueError(f"endpoint url {self.url!r} is not a URL: {e}") from None
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError(f"endpoint url {display_url(self.url)!r} must be http:// or https:// with a host")
        if u.user is not None or u.password is not None:
            raise ValueError(f"endpoint url {display_url(self.url)!r}: credentials in URLs leak into logs;"
                             " use the endpoint's bearer token")
        frozen = MappingProxyType(dict(self.headers))
        for name, value in frozen.items():
            if not isinstance(name, str) or not _TOKEN_CHARS.fullmatch(name):
                raise ValueError(f"endpoint header name {name!r} is not a valid HTTP header name")
            if name.lower() in _RESERVED:
                raise ValueError(f"endpoint header {name!r} is set by the client and cannot be overridden")
            if not isinstance(value, str) or not _VALUE_CHARS.fullmatch(value):
                raise ValueError(f"endpoint header {name!r} must be printable ASCII (no CR, LF or controls)")
        object.__setattr__(self, "headers", frozen)
        if self.token is not None and not _KEY_CHARS.fullmatch(self.token):
            raise ValueError("endpoint token must be 1-255 visible ASCII characters (no spaces or controls)")
        if self.hmac_key is not None and (not isinstance(self.hmac_key, bytes) or not self.hmac_key):
            raise ValueError("endpoint hmac_key must be non-empty bytes")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError("endpoint timeout must be a positive number of seconds")

    def __repr__(self) -> str:
        return (f"Endpoint(url={self.display_url!r}, headers={sorted(self.headers)!r},"
                f" token={'set' if self.token else None}, hmac_key={'set' if self.hmac_key else None},"
                f" timeout={self.timeout!r})")

    @property
    def display_url(self) -> str:
        """The URL as logs and errors show it: query values redacted (webhook URLs often carry tokens)."""
        return display_url(self.url)

    def _secrets(self) -> list[str]:
        out: list[str] = []
        if self.token:
            out.append(self.token)
        if self.hmac_key:
            out.append(self.hmac_key.hex())
            with contextlib.suppress(UnicodeDecodeError):
                out.append(self.hmac_key.decode())
        # query and static header values may be credentials (API keys): scrub long ones from echoed bodies
        # too (short ones like "1" would mangle the text and are no secret worth the name)
        out.extend(v for v in (*URL(self.url).query.values(), *self.headers.values()) if len(v) >= 8)
        return sorted({s for s in out if s}, key=len, reverse=True)


@dataclass(frozen=True)
class Transition:
    """One power transition of one node, as the controller persisted it before calling.

    `idempotency_key` must be identical for every retry of the transition; `first_attempt` is the number of
    this call's first request in the transition's lifetime (persisted attempts + 1), for logs and errors.
    """

    node: str
    direction: Direction
    idempotency_key: str
    first_attempt: int = 1

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("transition node must be non-empty")
        if self.direction not in ACTIONS:
            raise ValueError(f"transition direction must be 'up' or 'down', not {self.direction!r}")
        if not _KEY_CHARS.fullmatch(self.idempotency_key):
            raise ValueError("idempotency key must be 1-255 visible ASCII characters")
        if self.first_attempt < 1:
            raise ValueError("first_attempt must be >= 1")

    @property
    def action(self) -> str:
        return ACTIONS[self.direction]

    def body(self) -> bytes:
        return msgspec.json.encode({"node": self.node, "action": self.action, "idempotencyKey": self.idempotency_key})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one `send` achieved.

    `attempts` counts the requests this call made (0: the deadline had passed before the first one); add it
    to the persisted counter. `retryable` tells the controller whether trying the transition again later can
    help (False: a 4xx or other configuration problem; surface it, do not hammer). `retry_after` is the
    server's last Retry-After in seconds, uncapped, as a hint for the requeue. `error` is "" on success.
    """

    ok: bool
    status: int | None
    attempts: int
    error: str
    retryable: bool
    finished_at: float
    retry_after: float | None = None


# ------------------------------------------------------------------------------------ keys and signatures


def idempotency_key(node: str, direction: str, generation_or_seq: int, since: str) -> str:
    """A short key that is a pure function of the persisted transition: same inputs, same key, any process.

    The fields are encoded as a JSON array (unambiguous, unlike joining with a separator a name may
    contain) and hashed; 128 bits of SHA-256 keep distinct transitions apart across clusters.
    """
    if direction not in ACTIONS:
        raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
    raw = msgspec.json.encode([node, direction, generation_or_seq, since])
    return f"gpuops-{direction}-{hashlib.sha256(raw).hexdigest()[:32]}"


def sign(key: bytes, timestamp: int, body: bytes) -> str:
    """The `X-Gpuops-Signature` value for this body sent at `timestamp` (Unix seconds)."""
    mac = hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


def verify_signature(key: bytes, timestamp: str, body: bytes, header: str, *, now: float,
                     tolerance: float = 300) -> bool:
    """For receivers: True when `header` signs `body` at `timestamp` with `key` and `timestamp` is within
    `tolerance` seconds of `now` (either side: a clock ahead of ours is as suspicious as an old message).

    `timestamp` and `header` are the raw `X-Gpuops-Timestamp` / `X-Gpuops-Signature` values; `body` the raw
    request bytes (before any JSON parsing). The MAC comparison is constant-time.
    """
    ts = timestamp.strip()
    if not ts.isascii() or not ts.isdigit() or len(ts) > 12:
        return False
    if abs(now - int(ts)) > tolerance:
        return False
    scheme, sep, got = header.strip().partition("=")
    if not sep or scheme.lower() != "sha256":
        return False
    want = sign(key, int(ts), body).partition("=")[2]
    return hmac.compare_digest(want.encode(), got.strip().lower().encode())


# ------------------------------------------------------------------------------------ the client

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Try:
    """One request's result, before the retry decision."""

    status: int | None
    code: str  # metric label
    problem: str  # what went wrong, redacted; "" on success
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRYABLE_STATUS


class PowerClient:
    """Performs power transitions for a controller; one instance (and one HTTP connection pool) per process.

    `deadline` and the backoff use `clock` (default `time.monotonic`), signatures, Retry-After dates and
    `Outcome.finished_at` use `wall` (default `time.time`). `rng() -> [0, 1)` and `sleep` are injectable so
    tests neither wait nor guess the jitter.
    """

    def __init__(self, *, max_attempts: int = 4, backoff_base: float = 0.5, backoff_cap: float = 8.0,
                 retry_after_cap: float = 30.0, rng: Callable[[], float] = random.random,
                 sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if backoff_base < 0 or backoff_cap < 0 or retry_after_cap < 0:
            raise ValueError("backoff_base, backoff_cap and retry_after_cap must be >= 0")
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.retry_after_cap = retry_after_cap
        self._rng = rng
        self._sleep = sleep
        self._clock = clock
        self._wall = wall
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> PowerClient:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        # created on first use: a session belongs to the running loop; no proxy variables from the
        # environment (a BMC on the machine network must not be reached through a corporate proxy)
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    def backoff(self, retry: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(retry-1))) before the `retry`-th retry."""
        ceiling = min(self.backoff_cap, self.backoff_base * 2.0 ** min(retry - 1, 62))
        return self._rng() * ceiling

    async def send(self, endpoint: Endpoint, transition: Transition, *, deadline: float | None = None) -> Outcome:
        """POST the transition until a 2xx, a non-retryable answer, `max_attempts`, or `deadline` (in `clock`
        time: no request starts, and no wait ends, after it; a request in flight is cut off at it)."""
        if self._closed:
            raise RuntimeError("PowerClient is closed")
        body = transition.body()
        url = endpoint.display_url
        secrets = endpoint._secrets()
        fields = {"node": transition.node, "direction": transition.direction, "url": url,
                  "idempotency_key": transition.idempotency_key}
        attempts = 0
        last: _Try | None = None
        retry_after: float | None = None

        def done(ok: bool, retryable: bool, error: str) -> Outcome:
            return Outcome(ok=ok, status=None if last is None else last.status, attempts=attempts,
                           error=_scrub(error, secrets), retryable=retryable, finished_at=self._wall(),
                           retry_after=retry_after)

        while True:
            timeout = endpoint.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - self._clock())
                if timeout <= 0:
                    why = "the deadline passed before the first attempt" if last is None else \
                        f"{_tries(attempts, transition)}; last: {last.problem}; the deadline passed"
                    log.warning("power webhook not sent: deadline", attempt=transition.first_attempt + attempts,
                                status=None if last is None else last.status, **fields)
                    return done(False, True, f"POST {url}: {why}")
            attempts += 1
            number = transition.first_attempt + attempts - 1
            last = await self._attempt(endpoint, transition, body, timeout, secrets, timed_by_deadline=(
                deadline is not None and timeout < endpoint.timeout))
            retry_after = last.retry_after
            if last.ok:
                log.info("power webhook accepted", attempt=number, status=last.status, **fields)
                return done(True, False, "")
            stop = self._stop(last, attempts, transition, url, fields)
            if stop is not None:
                retryable, error = stop
                return done(False, retryable, error)
            delay = last.retry_after if last.retry_after is not None else self.backoff(attempts)
            if deadline is not None and self._clock() + delay >= deadline:
                log.warning("power webhook failed: no time left", attempt=number, status=last.status,
                            error=last.problem, **fields)
                return done(False, True, f"POST {url}: {_headline(last)} after {_tries(attempts, transition)};"
                                         f" the deadline leaves no time for another attempt{_detail(last)}")
            log.info("power webhook retry", attempt=number, status=last.status, error=last.problem,
                     delay=round(delay, 3), **fields)
            await self._sleep(delay)

    def _stop(self, last: _Try, attempts: int, transition: Transition, url: str,
              fields: Mapping[str, object]) -> tuple[bool, str] | None:
        """Whether a failed attempt ends the call, without looking at the deadline: (retryable later, error)
        for a non-retryable answer, the last allowed attempt or a Retry-After beyond the cap; None to retry."""
        number = transition.first_attempt + attempts - 1
        if not last.retryable:
            log.warning("power webhook refused", attempt=number, status=last.status, error=last.problem,
                        **fields)
            return False, f"POST {url}: {_headline(last)} ({_why_final(last.status)}){_detail(last)}"
        if attempts >= self.max_attempts:
            log.warning("power webhook failed", attempt=number, status=last.status, error=last.problem,
                        **fields)
            return True, f"POST {url}: {_headline(last)} after {_tries(attempts, transition)}{_detail(last)}"
        if last.retry_after is not None and last.retry_after > self.retry_after_cap:
            log.warning("power webhook deferred by Retry-After", attempt=number, status=last.status,
                        retry_after=last.retry_after, **fields)
            return True, (f"POST {url}: {_headline(last)} after {_tries(attempts, transition)};"
                          f" the server asks to retry after {last.retry_after:g} s, longer than"
                          f" {self.retry_after_cap:g} s{_detail(last)}")
        return None

    async def _attempt(self, endpoint: Endpoint, transition: Transition, body: bytes, limit: float,
                       secrets: list[str], *, timed_by_deadline: bool) -> _Try:
        headers = dict(endpoint.headers)
        headers.update({"Content-Type": "application/json", "User-Agent": USER_AGENT,
                        "Idempotency-Key": transition.idempotency_key})
        if endpoint.token is not None:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        if endpoint.hmac_key is not None:
            ts = int(self._wall())
            headers[TIMESTAMP_HEADER] = str(ts)
            headers[SIGNATURE_HEADER] = sign(endpoint.hmac_key, ts, body)
        started = self._clock()
        result: _Try
        try:
            async with self._http().post(endpoint.url, data=body, headers=headers, allow_redirects=False,
                                         timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                status = resp.status
                if 200 <= status < 300:
                    result = _Try(status, str(status), "")
                else:
                    snippet = await _snippet(resp, secrets)
                    result = _Try(status, str(status), f"HTTP {status}" + (f": {snippet}" if snippet else ""),
                                  _retry_after(resp.headers.get("Retry-After"), self._wall()))
        except TimeoutError:
            within = "the deadline" if timed_by_deadline else f"{endpoint.timeout:g} s"
            result = _Try(None, "timeout", f"timeout (no answer within {within})")
        except aiohttp.ClientError as e:
            result = _Try(None, "error", _scrub(f"connection failed: {type(e).__name__}: {e}", secrets))
        WEBHOOK_REQUESTS.labels(transition.direction, result.code).inc()
        WEBHOOK_DURATION.labels(transition.direction).observe(max(0.0, self._clock() - started))
        return result


# ------------------------------------------------------------------------------------ helpers


def display_url(url: str) -> str:
    try:
        u = URL(url)
    except (ValueError, TypeError):
        return "<invalid url>"
    shown = str(u.with_user(None).with_query(None).with_fragment(None))
    if u.query:
        shown += "?" + "&".join(f"{k}={_REDACTED}" for k in u.query)
    return shown


def _scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, _REDACTED)
    return text


async def _snippet(resp: aiohttp.ClientResponse, secrets: list[str]) -> str:
    """The start of an error body on one line, secrets removed (receivers do echo requests back)."""
    try:
        raw = await resp.content.read(_READ_LIMIT)
    except (aiohttp.ClientError, TimeoutError):
        return ""
    text = " ".join(raw.decode("utf-8", "replace").split())
    if len(raw) >= _READ_LIMIT and secrets:
        text = text[:max(0, len(text) - max(map(len, secrets)))]  # a secret cut at the limit would not match
    text = _scrub(text, secrets)
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "…"


def _retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP-date; None when absent or unparsable."""
    if value is None:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        secs = when.timestamp() - now
    if not math.isfinite(secs):
        return None
    return max(0.0, secs)


def _tries(attempts: int, t: Transition) -> str:
    s = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if t.first_attempt > 1:
        s += f" ({t.first_attempt + attempts - 1} in total)"
    return s


def _headline(t: _Try) -> str:
    return f"HTTP {t.status}" if t.status is not None else t.problem


def _detail(t: _Try) -> str:
    if t.status is None:
        return ""
    _, _, snippet = t.problem.partition(": ")
    return f": {snippet}" if snippet else ""


def _why_final(status: int | None) -> str:
    if status in (401, 403):
        return "not retried: check the endpoint's bearer token / HMAC key"
    if status is not None and 300 <= status < 400:
        return "not retried: redirects are not followed, configure the final URL"
    if status is not None and 400 <= status < 500:
        return "not retried: a 4xx answer means the URL, credentials or payload are wrong (configuration error)"
    return "not retried: the webhook does not support this request"
