"""Authentication and authorization in front of /metrics, delegated to the API server (what controller-runtime's
`filters.WithAuthenticationAndAuthorization` and kube-rbac-proxy do).

Every request: the bearer token -> a TokenReview (authentication.k8s.io/v1) -> the user; then a
SubjectAccessReview (authorization.k8s.io/v1) for the non-resource URL {path: the request path, verb: the
request's verb, "get" for GET and HEAD}. Answers: 401 without a token or with one the API server does not
accept (anonymous access is off), 403 when the SubjectAccessReview denies, 503 when the API server could not
be asked (unreachable, timed out, 429, 5xx) and 500 when it refused to answer (e.g. the operator lacks
`create` on the review APIs). Errors never let a request through and are never cached.

Caching (per process, bounded, least recently used evicted first):

- token authenticated: 2 min, as kube-rbac-proxy and kube-apiserver's token webhook cache (controller-runtime:
  1 min). A scrape every 15-30 s costs one TokenReview per token per 2 min; a revoked token is honoured for
  at most 2 min more.
- token rejected: 10 s. Long enough to absorb a misconfigured scraper's retries, short enough not to hold back
  a freshly minted token (controller-runtime keeps failures as long as successes).
- access allowed: 2 min (controller-runtime and kube-rbac-proxy: 5 min), so a removed ClusterRoleBinding stops
  working within the same bound as a revoked token.
- access denied: 30 s, as controller-runtime and kube-rbac-proxy: a new binding takes effect quickly.
- API errors: not cached; fail closed now and ask again on the next request.

Tokens are cached by their SHA-256, never in the clear; access answers by (user, uid, groups, extra, path,
verb), the whole subject the review was asked about. Concurrent requests with the same key share one review.
A review retries transient failures (0.5 s, x1.5, jittered) within one overall deadline (10 s, the review
timeout of controller-runtime), so one blip on the API server does not fail a scrape.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgspec
import structlog
from aiohttp import web
from prometheus_client import Counter

from .client import Client
from .errors import ApiError, ServerError, TooManyRequests, TransportError

__all__ = [
    "ALLOW_TTL",
    "DENY_TTL",
    "MAX_ENTRIES",
    "TOKEN_FAILURE_TTL",
    "TOKEN_TTL",
    "MetricsAuth",
    "ReviewError",
    "TTLCache",
    "User",
    "bearer_token",
]

log = structlog.get_logger("gpuops.kube.metricsauth")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

TOKEN_TTL: Final = 120.0
TOKEN_FAILURE_TTL: Final = 10.0
ALLOW_TTL: Final = 120.0
DENY_TTL: Final = 30.0
MAX_ENTRIES: Final = 4096
REVIEW_TIMEOUT: Final = 10.0
RETRY_INITIAL: Final = 0.5
RETRY_FACTOR: Final = 1.5
RETRY_JITTER: Final = 0.2
RETRY_ATTEMPTS: Final = 3

TOKEN_REVIEWS_PATH: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS_PATH: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

AUTH_REQUESTS = Counter(
    "gpuops_metrics_auth_requests",
    "Requests to the secure metrics endpoint by outcome: allowed, unauthenticated (401), forbidden (403), "
    "error (the API server could not review them; 5xx)",
    ["result"],
)
AUTH_REVIEWS = Counter(
    "gpuops_metrics_auth_reviews",
    "TokenReviews and SubjectAccessReviews sent to the API server for the metrics endpoint, by answer "
    "(authenticated, unauthenticated, allowed, denied, error)",
    ["kind", "result"],
)
AUTH_CACHE_HITS = Counter(
    "gpuops_metrics_auth_cache_hits",
    "Metrics endpoint requests answered from the TokenReview or SubjectAccessReview cache",
    ["kind"],
)
for _result in ("allowed", "unauthenticated", "forbidden", "error"):
    AUTH_REQUESTS.labels(_result)


# ---------------------------------------------------------------------------------------------- cache


class TTLCache(Generic[K, V]):
    """A dict whose entries expire, holding at most `max_entries` (the least recently used go first)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        """Keep `value` for `ttl` seconds (not at all when ttl <= 0)."""
        if ttl <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


# ---------------------------------------------------------------------------------------------- wire types


class _UserInfo(msgspec.Struct, gc=False):
    username: str = ""
    uid: str = ""
    groups: list[str] | None = None
    extra: dict[str, list[str]] | None = None


class _TokenReviewStatus(msgspec.Struct, gc=False):
    authenticated: bool = False
    user: _UserInfo | None = None
    audiences: list[str] | None = None
    error: str = ""


class _TokenReview(msgspec.Struct, gc=False):
    status: _TokenReviewStatus | None = None


class _AccessReviewStatus(msgspec.Struct, rename="camel", gc=False):
    allowed: bool = False
    denied: bool = False
    reason: str = ""
    evaluation_error: str = ""


class _AccessReview(msgspec.Struct, gc=False):
    status: _AccessReviewStatus | None = None


_token_review = msgspec.json.Decoder(_TokenReview)
_access_review = msgspec.json.Decoder(_AccessReview)


@dataclass(frozen=True, slots=True)
class User:
    """Who a token belongs to, as the TokenReview said (hashable: it is part of the access cache key)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_review(cls, info: _UserInfo) -> User:
        extra = tuple(sorted((k, tuple(v)) for k, v in (info.extra or {}).items()))
        return cls(info.username, info.uid, tuple(info.groups or ()), extra)


class ReviewError(Exception):
    """The API server could not be asked, or refused to answer; `status` is what the scraper gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _verb(method: str) -> str:
    """The non-resource verb of an HTTP method, as kube-apiserver names them (HEAD is a get)."""
    return "get" if method in ("GET", "HEAD") else method.lower()


def _text(body: str, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff", **(headers or {})})


# ---------------------------------------------------------------------------------------------- the filter


class MetricsAuth:
    """Delegated authentication and authorization for the metrics server: `check` is the guard of
    `health.metrics_app`."""

    def __init__(
        self,
        client: Client,
        *,
        audiences: Sequence[str] = (),
        token_ttl: float = TOKEN_TTL,
        token_failure_ttl: float = TOKEN_FAILURE_TTL,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
        max_entries: int = MAX_ENTRIES,
        timeout: float = REVIEW_TIMEOUT,
        retry_initial: float = RETRY_INITIAL,
        retry_attempts: int = RETRY_ATTEMPTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.audiences = tuple(audiences)
        self.token_ttl = token_ttl
        self.token_failure_ttl = token_failure_ttl
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self.timeout = timeout
        self.retry_initial = retry_initial
        self.retry_attempts = max(1, retry_attempts)
        self.tokens: TTLCache[bytes, User | bool] = TTLCache(max_entries, clock)
        """sha256(token) -> the user, or False for a token the API server rejected."""
        self.access: TTLCache[tuple[User, str, str], bool] = TTLCache(max_entries, clock)
        """(user, path, verb) -> allowed."""
        self._inflight_tokens: dict[bytes, asyncio.Task[User | bool]] = {}
        self._inflight_access: dict[tuple[User, str, str], asyncio.Task[bool]] = {}

    # ------------------------------------------------------------------------------------------ HTTP

    async def check(self, request: web.Request) -> web.Response | None:
        """None when the request may proceed, else the 401/403/5xx answer to send."""
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            AUTH_REQUESTS.labels("unauthenticated").inc()
            return _text("Unauthorized: a bearer token is required\n", 401, {"WWW-Authenticate": "Bearer"})
        verb, path = _verb(request.method), request.path
        try:
            user = await self.authenticate(token)
            if user is None:
                AUTH_REQUESTS.labels("unauthenticated").inc()
                return _text("Unauthorized\n", 401, {"WWW-Authenticate": 'Bearer error="invalid_token"'})
            allowed = await self.authorize(user, path, verb)
        except ReviewError as e:
            AUTH_REQUESTS.labels("error").inc()
            log.warning("metrics request not reviewed; refusing it", path=path, error=str(e))
            return _text(f"{e}\n", e.status)
        if not allowed:
            AUTH_REQUESTS.labels("forbidden").inc()
            log.debug("metrics request forbidden", user=user.username, path=path, verb=verb)
            return _text(f'Forbidden: user "{user.username}" may not {verb} path "{path}"\n', 403)
        AUTH_REQUESTS.labels("allowed").inc()
        return None

    # ------------------------------------------------------------------------------------------ reviews

    async def authenticate(self, token: str) -> User | None:
        """The user behind `token`, or None when the API server does not accept it; `ReviewError` if it could
        not say."""
        key = hashlib.sha256(token.encode()).digest()
        cached = self.tokens.get(key)
        if cached is not None:
            AUTH_CACHE_HITS.labels("TokenReview").inc()
        else:
            cached = await _shared(self._inflight_tokens, key, lambda: self._review_token(key, token))
        return cached if isinstance(cached, User) else None

    async def authorize(self, user: User, path: str, verb: str = "get") -> bool:
        """Whether `user` may `verb` the non-resource URL `path`; `ReviewError` if the API server could not say."""
        key = (user, path, verb)
        cached = self.access.get(key)
        if cached is not None:
            AUTH_CACHE_HITS.labels("SubjectAccessReview").inc()
            return cached
        return await _shared(self._inflight_access, key, lambda: self._review_access(key))

    async def _review_token(self, key: bytes, token: str) -> User | bool:
        spec: dict[str, object] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        data = await self._post("TokenReview", TOKEN_REVIEWS_PATH, body)
        try:
            status = _token_review.decode(data).status
        except msgspec.DecodeError as e:
            AUTH_REVIEWS.labels("TokenReview", "error").inc()
            raise ReviewError(500, f"TokenReview: unreadable answer: {e}") from None
        user: User | bool = False
        # An audience-bound review must come back with one of ours, as upstream's token authenticator checks.
        if (status is not None and status.authenticated and status.user is not None and status.user.username
                and (not self.audiences or set(self.audiences) & set(status.audiences or ()))):
            user = User.from_review(status.user)
        if isinstance(user, User):
            AUTH_REVIEWS.labels("TokenReview", "authenticated").inc()
            self.tokens.put(key, user, self.token_ttl)
        else:
            AUTH_REVIEWS.labels("TokenReview", "unauthenticated").inc()
            log.debug("metrics bearer token rejected", error=status.error if status is not None else "")
            self.tokens.put(key, False, self.token_failure_ttl)
        return user

    async def _review_access(self, key: tuple[User, str, str]) -> bool:
        user, path, verb = key
        spec: dict[str, object] = {"nonResourceAttributes": {"path": path, "verb": verb}, "user": user.username}
        if user.uid:
            spec["uid"] = user.uid
        if user.groups:
            spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        data = await self._post("SubjectAccessReview", ACCESS_REVIEWS_PATH, body)
        try:
            status = _access_review.decode(data).status
        except msgspec.DecodeError as e:
            AUTH_REVIEWS.labels("SubjectAccessReview", "error").inc()
            raise ReviewError(500, f"SubjectAccessReview: unreadable answer: {e}") from None
        allowed = status is not None and status.allowed and not status.denied
        AUTH_REVIEWS.labels("SubjectAccessReview", "allowed" if allowed else "denied").inc()
        if not allowed and status is not None and status.evaluation_error:
            log.info("SubjectAccessReview reported an evaluation error", user=user.username, path=path,
                     error=status.evaluation_error)
        self.access.put(key, allowed, self.allow_ttl if allowed else self.deny_ttl)
        return allowed

    async def _post(self, kind: str, path: str, body: Mapping[str, object]) -> bytes:
        """POST a review, retrying transient failures until the overall deadline; `ReviewError` otherwise."""
        payload = msgspec.json.encode(body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        delay = self.retry_initial
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                return await self.client.request("POST", path, body=payload, content_type="application/json",
                                                 timeout=remaining)
            except (TransportError, TooManyRequests, ServerError, TimeoutError) as e:
                # TransportError includes the client's own timeout (RequestTimeout)
                reason = str(e) or "no answer before the deadline"
                wait = delay * (1 + random.uniform(-RETRY_JITTER, RETRY_JITTER))
                if isinstance(e, TooManyRequests) and e.retry_after is not None:
                    wait = max(wait, e.retry_after)
                if attempt >= self.retry_attempts or loop.time() + wait >= deadline:
                    AUTH_REVIEWS.labels(kind, "error").inc()
                    raise ReviewError(503, f"Service Unavailable: {kind} failed: {reason}") from None
                log.debug("review failed, retrying", kind=kind, attempt=attempt, error=reason)
                await asyncio.sleep(wait)
                delay *= RETRY_FACTOR
            except ApiError as e:  # e.g. 403: the operator may not create reviews (see metrics-auth-role.yaml)
                AUTH_REVIEWS.labels(kind, "error").inc()
                raise ReviewError(500, f"Internal Server Error: {kind} failed: {e}") from None


async def _shared(inflight: dict[K, asyncio.Task[V]], key: K, review: Callable[[], Coroutine[Any, Any, V]]) -> V:
    """One review per key at a time: later askers wait for the one already under way. The review runs as its
    own task, so a scraper hanging up does not cancel it for the others."""
    task = inflight.get(key)
    if task is None:
        task = asyncio.get_running_loop().create_task(review())
        inflight[key] = task

        def done(t: asyncio.Task[V]) -> None:
            if inflight.get(key) is t:
                del inflight[key]
            if not t.cancelled():
                t.exception()  # retrieved: every asker may have gone

        task.add_done_callback(done)
    return await asyncio.shield(task)
