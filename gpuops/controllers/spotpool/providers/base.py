"""The one interface every spot provider implements, and what they share: instance and launch types, the error
kinds the reconciler acts on, ownership tags, rate-limited and timed calls, and running a synchronous SDK off
the event loop.

A provider knows one cloud API and nothing of Kubernetes. The reconciler owns every decision; a provider only
describes, launches (with the client token it is given) and terminates.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, Protocol, TypeVar

import anyio
import anyio.to_thread
import msgspec
import structlog

from gpuops.accounting.pool import API_BATCH_LIMIT, InstanceState
from gpuops.kube.redact import SECRET_VALUES

from ..metrics import PROVIDER_CALL_SECONDS, PROVIDER_CALLS
from .ratelimit import TokenBucket

__all__ = [
    "API_BATCH_LIMIT",
    "LAUNCH_ID_TAG",
    "MANAGED_BY",
    "MANAGED_BY_TAG",
    "POOL_TAG",
    "CallGate",
    "CapacityType",
    "CloudInstance",
    "ErrorKind",
    "Guarded",
    "InstanceState",
    "LaunchSpec",
    "NodeTaint",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "batches",
    "owned",
    "run_blocking",
]

POOL_TAG = "gpuops.io/pool"
"""Tag key naming the SpotPool that owns an instance (its name: pools are cluster-scoped)."""
MANAGED_BY_TAG = "gpuops.io/managed-by"
MANAGED_BY = "gpuops"
LAUNCH_ID_TAG = "gpuops.io/launch-id"
"""Tag key holding the client token of the launch that bought the instance, so a launch is found after a crash."""

CapacityType = Literal["spot", "on-demand"]
T = TypeVar("T")
log = structlog.get_logger("gpuops.controllers.spotpool.providers")


class NodeTaint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    effect: str
    value: str = ""


class CloudInstance(msgspec.Struct, frozen=True, kw_only=True):
    """One instance as the cloud reports it, states in Tencent CVM names (providers map theirs).

    Terminated instances are not reported at all: they are neither capacity nor anything left to clean up.
    `launched_at` and `interruption_at` are microseconds since the epoch.
    """

    id: str
    state: InstanceState
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    zone: str = ""
    instance_type: str = ""
    capacity_type: CapacityType = "spot"
    private_ip: str | None = None
    public_ip: str | None = None
    launched_at: int | None = None
    node_name: str | None = None
    """The node name the provider knows the instance will register as (sim: nodeName, EC2: private DNS name)."""
    provider_id: str | None = None
    """The node's `spec.providerID` when the provider knows it (`aws:///<zone>/<id>`, `sim:///<zone>/<id>`)."""
    interruption_at: int | None = None
    """The cloud's spot reclaim notice: when the instance will be taken (None: no notice)."""
    state_reason: str | None = None

    @property
    def launch_id(self) -> str | None:
        return self.tags.get(LAUNCH_ID_TAG)


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One launch call. The same `client_token` must always come with the same fields: the cloud answers a
    repeat with the instances of the first call, or with an idempotency mismatch error."""

    client_token: str
    count: int
    instance_type: str
    zone: str | None = None
    capacity_type: CapacityType = "spot"
    image: str | None = None
    subnet: str | None = None
    vpc: str | None = None
    security_groups: tuple[str, ...] = ()
    max_price: str | None = None
    user_data: str | None = None
    """As the user wrote it (plain text); each provider encodes it the way its API wants (base64 for both)."""
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    node_labels: dict[str, str] = msgspec.field(default_factory=dict)
    node_taints: tuple[NodeTaint, ...] = ()
    name_prefix: str | None = None


class ProviderConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach one cloud account. `credentials` are the decoded keys of the pool's Secret (never the spec);
    `endpoint` overrides the public endpoint (private regions, VPC endpoints, and our emulators in tests)."""

    region: str
    endpoint: str | None = None
    credentials: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_seconds: float = 15.0

    def __post_init__(self) -> None:
        SECRET_VALUES.add(*self.credentials.values())  # whoever built the config, its keys never leave

    def credential(self, key: str, provider: str, *, optional: bool = False) -> str | None:
        value = self.credentials.get(key)
        if value is None or not value.strip():
            if optional:
                return None
            raise ProviderError(ErrorKind.CREDENTIALS, "MissingCredentials",
                                f"the credentials Secret has no {key!r} key, which the {provider} provider needs; "
                                f"add it to the Secret named by spec.credentialsSecretRef")
        return value.strip()


class ErrorKind(enum.StrEnum):
    """What the reconciler does about a failed call."""

    CAPACITY = "capacity"  # no stock for this (zone, type): back off that pair, try the next, maybe on-demand
    QUOTA = "quota"  # account limit: stop launching, condition QuotaExceeded
    CREDENTIALS = "credentials"  # bad or missing keys, or not allowed: condition CredentialsInvalid, no hot loop
    THROTTLED = "throttled"  # rate limited: retry later (same client token)
    TRANSIENT = "transient"  # network, timeout, 5xx: retry with backoff (same client token)
    INVALID = "invalid"  # the request is wrong (image, subnet, type): a spec problem, retried rarely
    MISMATCH = "mismatch"  # the client token was used with other parameters: the launch intent must be renewed


class ProviderError(Exception):
    """A failed provider call. `ambiguous`: the request may have taken effect (a timeout after sending), so a
    launch must be retried with the same client token, never a new one."""

    def __init__(self, kind: ErrorKind, code: str, message: str, *, retry_after: float | None = None,
                 ambiguous: bool = False) -> None:
        code, message = SECRET_VALUES.scrub(code), SECRET_VALUES.scrub(message)  # clouds echo what they were sent
        super().__init__(f"{code}: {message}")
        self.kind = kind
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.ambiguous = ambiguous


class Provider(Protocol):
    """What the reconciler needs from a cloud. Every method may raise `ProviderError`."""

    name: str

    async def describe(self, owner: Mapping[str, str]) -> list[CloudInstance]:
        """Every non-terminated instance carrying all `owner` tags, across all pages; never an untagged one."""
        ...

    async def launch(self, spec: LaunchSpec) -> list[str]:
        """Launch `spec.count` instances (the cloud may grant fewer) and return their ids; a repeat of the same
        client token returns the first call's ids and buys nothing."""
        ...

    async def terminate(self, ids: Sequence[str]) -> None:
        """Terminate these instances, in calls of at most 100 ids. Unknown or already terminating ids are
        success: the goal is that they are gone."""
        ...

    async def close(self) -> None: ...


class Guarded:
    """A provider whose every failure is a ProviderError: an answer no code path expected (a field missing, a
    type the SDK did not foresee) becomes a TRANSIENT error the pool shows in its status, never an exception
    that ends the reconcile. The message names the exception type only: its text may quote the raw answer, and
    a raw answer may echo our credentials (the log gets the traceback, with secret values scrubbed)."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name

    def _unexpected(self, operation: str, e: Exception, *, ambiguous: bool = False) -> ProviderError:
        log.exception("unexpected provider failure", provider=self.name, operation=operation)
        return ProviderError(ErrorKind.TRANSIENT, "UnexpectedAnswer",
                             f"{operation}: the {self.name} provider could not read the cloud's answer "
                             f"({type(e).__name__}); see the operator log", ambiguous=ambiguous)

    async def describe(self, owner: Mapping[str, str]) -> list[CloudInstance]:
        try:
            return await self.inner.describe(owner)
        except ProviderError:
            raise
        except Exception as e:
            raise self._unexpected("DescribeInstances", e) from None

    async def launch(self, spec: LaunchSpec) -> list[str]:
        try:
            return await self.inner.launch(spec)
        except ProviderError:
            raise
        except Exception as e:  # the launch may have happened: retried with the same client token
            raise self._unexpected("RunInstances", e, ambiguous=True) from None

    async def terminate(self, ids: Sequence[str]) -> None:
        try:
            await self.inner.terminate(ids)
        except ProviderError:
            raise
        except Exception as e:
            raise self._unexpected("TerminateInstances", e) from None

    async def close(self) -> None:
        try:
            await self.inner.close()
        except Exception:
            log.exception("closing a provider failed", provider=self.name)

    def __getattr__(self, name: str) -> object:  # provider-specific extras (call counters in tests, ...)
        return getattr(self.inner, name)


def owned(instance_tags: Mapping[str, str], owner: Mapping[str, str]) -> bool:
    """True when the instance carries every ownership tag: a provider filters on one tag server-side and
    checks all of them here, so an instance someone else tagged half-way is never touched."""
    return all(instance_tags.get(k) == v for k, v in owner.items())


def batches(ids: Sequence[str], size: int = API_BATCH_LIMIT) -> list[list[str]]:
    unique = list(dict.fromkeys(ids))
    return [unique[i:i + size] for i in range(0, len(unique), size)]


async def run_blocking(fn: Callable[[], T], *, seconds: float, limiter: anyio.CapacityLimiter | None = None) -> T:
    """Run a synchronous SDK call in a worker thread; the caller gets an ambiguous TRANSIENT
    error at once (past `seconds`; the thread is abandoned and ends on the SDK's own socket timeout)."""
    try:
        with anyio.fail_after(seconds):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)
    except TimeoutError:
        raise ProviderError(ErrorKind.TRANSIENT, "Timeout", f"no answer within {seconds:g}s",
                            ambiguous=True) from None


class CallGate:
    """Rate limits and bookkeeping around each cloud call: waits for the operation's token bucket, times the
    call, counts it by result, and slows the bucket down when the cloud throttles."""

    def __init__(self, provider: str, buckets: Mapping[str, TokenBucket]) -> None:
        self.provider = provider
        self.buckets = dict(buckets)
        self.calls = 0

    async def around(self, operation: str, bucket: str, run: Callable[[], Awaitable[T]]) -> T:
        """`await gate.around("RunInstances", "mutate", lambda: run_blocking(...))`."""
        b = self.buckets.get(bucket)
        if b is not None:
            await b.acquire()
        start = time.perf_counter()
        self.calls += 1
        try:
            out = await run()
        except ProviderError as e:
            PROVIDER_CALLS.labels(self.provider, operation, e.kind.value).inc()
            if e.kind is ErrorKind.THROTTLED and b is not None:
                b.penalize(e.retry_after or 1.0)
            raise
        except BaseException:
            PROVIDER_CALLS.labels(self.provider, operation, "error").inc()
            raise
        finally:
            PROVIDER_CALL_SECONDS.labels(self.provider, operation).observe(time.perf_counter() - start)
        PROVIDER_CALLS.labels(self.provider, operation, "ok").inc()
        return out

