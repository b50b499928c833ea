"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's safety rules.

Use it as a context manager that holds the lease for the duration of its body:

    elector = LeaderElector(client, name="gpuops-controller", namespace="gpuops-system")
    async with elector.leading() as lost:       # waits until this process holds the lease
        async with asyncio.TaskGroup() as tg:   # start the controllers here
            ...
    # leaving the body (normally, by error or by cancellation) releases the lease when release_on_cancel

Why a context manager: the one rule that matters is that controllers never keep running without the lease.
When leadership is lost (no successful renewal within `renew_deadline`, or another holder seen), `lost` is
set and the task running the body is cancelled, exactly as `asyncio.timeout` cancels its body; once the
body has unwound, the `async with` raises `LeaderElectionLost`. A manager therefore only has to let that
exception propagate and exit. Code that prefers polling can watch `lost` (or `is_leader`) instead.

How validity is judged (as client-go does): a lease is free when its holderIdentity is empty, or when this
process has not seen its record change for leaseDurationSeconds by its own monotonic clock. Timestamps
inside the Lease are written (MicroTime, for humans and other tools) but never trusted, so clock skew
between machines does not matter; only a difference in clock *rate* would.

Differences from client-go, each on the safe side:
* leaseDurationSeconds is `ceil(lease_duration)` instead of a truncation, so others never wait less than
  configured;
* the renew deadline runs from the start of the last successful renewal (client-go starts it one retry
  period later), and a renewal that finds another holder in the lease steps down at once;
* `on_stopped_leading` of `run` is called only if leadership was held;
* a standby polls a lease held by another every retry period without jitter, and tries again at the instant
  the lease expires by its clock instead of at its next poll (`_next_wait`);
* a standby also watches the Lease (`_watch_lease`), so it notes each renewal as it is written rather than at
  its next poll: a kill -9 is taken over one lease duration after the last renewal (plus the watch's delivery),
  not up to a retry period later, nor 2 x 2.2 retry periods later as with client-go's jittered polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import msgspec
import structlog

from . import metrics, objects
from .client import Client
from .errors import AlreadyExists, ApiError, Conflict, NotFound
from .objects import Lease, LeaseSpec
from .resources import LEASES
from .workqueue import Clock, MonotonicClock

__all__ = ["JITTER_FACTOR", "LeaderElectionLost", "LeaderElector", "default_identity", "micro_time"]

log = structlog.get_logger("gpuops.kube.leaderelection")

JITTER_FACTOR = 1.2
"""client-go's JitterFactor: acquire attempts wait RetryPeriod * (1 + U[0, 1.2))."""

R = TypeVar("R")

_EXPIRY_MARGIN = 0.001
"""A held lease counts as expired strictly after observed + duration: the attempt at expiry comes this late."""

_ERRORS = (ApiError, msgspec.DecodeError)
"""What one attempt survives: API failures and bodies that are not Leases (a proxy's error page)."""


class _WatchEnded(Exception):
    """The Lease watch stopped with an ERROR event or a deletion: watch again from a fresh read."""


class _WatchEvent(msgspec.Struct, kw_only=True):
    type: str
    object: msgspec.Raw = msgspec.Raw(b"null")


class LeaderElectionLost(Exception):
    """Raised by `leading()` / `run()` after the lease was lost while leading; the process should exit."""


def default_identity() -> str:
    """hostname_uuid (controller-runtime's identity): unique per process even with a fixed pod name."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(when: datetime | None = None) -> str:
    """metav1.MicroTime: RFC 3339 with exactly six fraction digits in UTC, as Lease acquireTime/renewTime carry."""
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires and renews one Lease; one `leading()` at a time per elector."""

    def __init__(
        self,
        client: Client,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = True,
        clock: Clock | None = None,
    ) -> None:
        if not name:
            raise ValueError("name: the Lease needs a name")
        if not namespace:
            raise ValueError("namespace: the Lease needs a namespace")
        if identity is not None and not identity:
            raise ValueError("identity: must not be empty")
        if retry_period <= 0:
            raise ValueError(f"retry_period: must be positive, got {retry_period}")
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError(
                f"renew_deadline: must be greater than {JITTER_FACTOR} x retry_period "
                f"({JITTER_FACTOR * retry_period:g}), got {renew_deadline:g}"
            )
        if lease_duration <= renew_deadline:
            raise ValueError(
                f"lease_duration: must be greater than renew_deadline ({renew_deadline:g}), got {lease_duration:g}"
            )
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity if identity is not None else default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self.request_timeout = max(1.0, renew_deadline / 2)
        """One hung request must not cost the lease (controller-runtime's client timeout)."""
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._lease_seconds = max(1, math.ceil(lease_duration))
        self._path = LEASES.path(namespace, name)
        self._lease: Lease | None = None  # the last object seen: its resourceVersion guards the next update
        self._observed: LeaseSpec | None = None
        self._observed_time = 0.0  # local monotonic time the record was last seen to change
        self._leading = False
        self._active = False
        self._last_renew = 0.0  # start of the last successful acquire or renewal

    # ------------------------------------------------------------------------------------ state

    @property
    def is_leader(self) -> bool:
        """True between acquisition and loss or exit of `leading()`."""
        return self._leading

    @property
    def leader(self) -> str:
        """The holder identity last seen in the Lease ("" when free or not read yet)."""
        return (self._observed.holder_identity or "") if self._observed is not None else ""

    def healthy(self, tolerance: float = 20.0) -> bool:
        """client-go's HealthzAdaptor: a leader whose renewals stalled beyond the lease is unhealthy.

        Standbys are always healthy. With our own step-down this only trips when the renew task itself is
        stuck (a blocked event loop), which is what a liveness probe should catch.
        """
        if not self._leading:
            return True
        return self._clock.now() - self._last_renew <= self.lease_duration + tolerance

    # ------------------------------------------------------------------------------------ public API

    @contextlib.asynccontextmanager
    async def leading(self) -> AsyncIterator[asyncio.Event]:
        """Wait until the lease is ours, then hold it while the body runs; yields the `lost` event.

        On loss the body's task is cancelled and `LeaderElectionLost` is raised once it has unwound. Leaving
        the body releases the lease when `release_on_cancel` (holder emptied, leaseDurationSeconds=1) so a
        standby takes over at its next retry instead of after the lease duration.
        """
        if self._active:
            raise RuntimeError(f"lease {self.namespace}/{self.name}: leading() is already active")
        host = asyncio.current_task()
        if host is None:
            raise RuntimeError("leading() must run inside an asyncio task")
        self._active = True
        lost = asyncio.Event()
        renewer: asyncio.Task[None] | None = None
        cancelled_by_us = [False]
        try:
            await self._acquire()
            self._set_leading(True)
            log.info("acquired lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)
            renewer = asyncio.create_task(self._renew_loop(lost, host, cancelled_by_us))
            try:
                yield lost
            except asyncio.CancelledError:
                if cancelled_by_us[0] and host.uncancel() == 0:
                    raise LeaderElectionLost(f"lease {self.namespace}/{self.name} lost") from None
                raise
            except BaseException:
                if cancelled_by_us[0]:
                    host.uncancel()
                raise
            if cancelled_by_us[0]:  # the body swallowed our cancellation
                host.uncancel()
            if lost.is_set():
                raise LeaderElectionLost(f"lease {self.namespace}/{self.name} lost")
        finally:
            try:
                if renewer is not None:
                    await _shielded(self._stop_leading(renewer))
                elif self.release_on_cancel and self.leader == self.identity:
                    await _shielded(self._release())  # cancelled just as an acquiring write went through
            finally:
                self._active = False

    async def run(
        self,
        on_started_leading: Callable[[], Awaitable[None]] | None,
        on_stopped_leading: Callable[[], None] | None = None,
    ) -> None:
        """client-go's Run: acquire, await `on_started_leading` and keep leading until cancelled.

        Raises `LeaderElectionLost` on loss, after `on_stopped_leading` (called whenever leadership ends).
        """
        led = False
        try:
            async with self.leading() as lost:
                led = True
                if on_started_leading is not None:
                    await on_started_leading()
                await lost.wait()
        finally:
            if led and on_stopped_leading is not None:
                on_stopped_leading()

    async def _stop_leading(self, renewer: asyncio.Task[None]) -> None:
        renewer.cancel()
        await asyncio.wait([renewer])
        self._set_leading(False)
        if self.release_on_cancel:
            await self._release()

    # ------------------------------------------------------------------------------------ loops

    async def _acquire(self) -> None:
        """JitterUntil(RetryPeriod, 1.2), sliding: the wait starts when an attempt ends; but see `_next_wait`.

        While waiting, a watch on the Lease (`_watch_lease`) notes each change of the record the moment it is
        written, so the expiry instant is counted from the holder's last renewal, not from this standby's next
        poll (up to a retry period later). The polls go on as before: the watch only brings the expiry forward,
        and a broken watch costs nothing but that.
        """
        changed = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        try:
            while True:
                start = self._clock.now()
                if await self._attempt():
                    self._last_renew = start
                    return
                if watcher is None:  # from the version the failed attempt has just read
                    watcher = asyncio.create_task(self._watch_lease(changed))
                now = self._clock.now()
                poll_at = now + self._next_wait(now, poll_only=True)
                while True:
                    changed.clear()
                    now = self._clock.now()
                    at = min(poll_at, now + self._next_wait(now))
                    if await self._sleep_or_change(at, changed):
                        break
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.wait([watcher])

    async def _sleep_or_change(self, at: float, changed: asyncio.Event) -> bool:
        """Sleep until `at` (True) unless the watch sees the record change first (False: recompute)."""
        sleeper = asyncio.ensure_future(self._clock.sleep_until(at))
        waiter = asyncio.ensure_future(changed.wait())
        try:
            await asyncio.wait([sleeper, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (sleeper, waiter):
                f.cancel()
            await asyncio.wait([sleeper, waiter])
        return sleeper.done() and not sleeper.cancelled()

    def _next_wait(self, now: float, *, poll_only: bool = False) -> float:
        """While another holder's lease is valid: the plain retry period, or less to try at the very instant it
        expires (unless `poll_only`). Else client-go's jittered wait.

        Why: after a kill -9 nothing releases the lease, so a standby's takeover is lease duration after it last
        saw the record change, plus its lag in seeing that change, plus the wait to its next attempt. Jitter
        spreads candidates racing for a *free* lease; polling a held one is a read and races nobody, so it need
        not stretch the lag to 2.2 retry periods, and the attempt at expiry need not wait for the grid. Only
        timing changes: `_attempt` still takes the lease only once expired by this process's own clock.
        """
        observed = self._observed
        if observed is not None and observed.holder_identity not in (None, "", self.identity):
            expires = self._observed_time + (observed.lease_duration_seconds or 0) + _EXPIRY_MARGIN
            if expires > now:
                return self.retry_period if poll_only else min(self.retry_period, expires - now)
        return self.retry_period * (1 + random.random() * JITTER_FACTOR)

    async def _watch_lease(self, changed: asyncio.Event) -> None:
        """Watch the Lease from the last version read, noting each change of its record as it happens.

        Safe for the same reason polling is: the standby still counts the lease duration from the moment *it*
        saw the record change, by its own clock; a watch event is only seen sooner than the next poll's read.
        Any failure (a 410 after compaction, a dropped stream, an outage) waits a retry period and watches again
        from the newest version the polls have read meanwhile.
        """
        server_timeout = max(60, math.ceil(10 * self.lease_duration))
        query = {"watch": "true", "fieldSelector": f"metadata.name={self.name}", "allowWatchBookmarks": "false",
                 "timeoutSeconds": str(server_timeout)}
        path = LEASES.path(self.namespace)
        where = f"{self.namespace}/{self.name}"
        while True:
            rv = self._lease.metadata.resource_version if self._lease is not None else None
            if rv:
                try:
                    async with self.client.stream_lines(path, {**query, "resourceVersion": rv},
                                                        timeout=server_timeout + 30.0) as lines:
                        async for line in lines:
                            self._observe_event(msgspec.json.decode(line, type=_WatchEvent), changed)
                except (*_ERRORS, _WatchEnded) as e:
                    log.debug("lease watch ended", lease=where, error=str(e))
                except Exception:  # best effort: the polls still run; never let the watcher die silently
                    log.exception("lease watch failed", lease=where)
            await asyncio.sleep(self.retry_period * (1 + random.random() * JITTER_FACTOR))

    def _observe_event(self, event: _WatchEvent, changed: asyncio.Event) -> None:
        if event.type == "ERROR":  # e.g. 410 Gone after a compaction: the object is a Status
            raise _WatchEnded(f"watch error event: {bytes(event.object)[:200]!r}")
        if event.type == "DELETED":
            self._lease = None
            raise _WatchEnded("the lease was deleted")
        lease = objects.decode(bytes(event.object), Lease)
        self._lease = lease
        if lease.spec != self._observed:
            self._observed = lease.spec
            self._observed_time = self._clock.now()
            changed.set()

    async def _renew_loop(self, lost: asyncio.Event, host: asyncio.Task[Any], cancelled_by_us: list[bool]) -> None:
        try:
            reason = await self._renew_until_failure()
        except asyncio.CancelledError:
            raise
        except Exception:  # never lead on with a dead renew loop
            log.exception("lease renew loop failed", lease=f"{self.namespace}/{self.name}")
            reason = "renew loop failed"
        self._set_leading(False)
        log.warning("lost lease", lease=f"{self.namespace}/{self.name}", identity=self.identity, reason=reason)
        lost.set()
        if not host.done():
            cancelled_by_us[0] = True
            host.cancel()

    async def _renew_until_failure(self) -> str:
        """Renew every RetryPeriod; return why leadership ended (deadline missed, another holder)."""
        next_try = self._clock.now() + self.retry_period
        while True:
            deadline = self._last_renew + self.renew_deadline
            await self._clock.sleep_until(min(next_try, deadline))
            start = self._clock.now()
            remaining = deadline - start
            if remaining <= 0:
                return f"no successful renewal within renew_deadline ({self.renew_deadline:g}s)"
            try:
                async with asyncio.timeout(remaining):
                    ok = await self._attempt()
            except TimeoutError:
                ok = False
            if ok:
                self._last_renew = start
            elif self._observed is not None and self._observed.holder_identity not in ("", self.identity):
                return f"the lease is held by {self._observed.holder_identity!r}"
            next_try = self._clock.now() + self.retry_period

    # ------------------------------------------------------------------------------------ one attempt

    async def _attempt(self) -> bool:
        """client-go's tryAcquireOrRenew: fast path with the cached record, else GET and update/create."""
        now = self._clock.now()
        stamp = micro_time()
        desired = LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self._lease_seconds,
            acquire_time=stamp,
            renew_time=stamp,
        )
        observed, cached = self._observed, self._lease
        if (
            cached is not None
            and observed is not None
            and observed.holder_identity == self.identity
            and self._observed_time + (observed.lease_duration_seconds or 0) > now
        ):
            spec = _carry(desired, observed, transitions=observed.lease_transitions or 0)
            try:
                await self._update(cached, spec)
                return True
            except _ERRORS as e:
                log.debug("optimistic lease update failed, taking the slow path", error=str(e))

        try:
            current = await self._get()
        except NotFound:
            desired.lease_transitions = 0
            try:
                await self._create(desired)
            except _ERRORS as e:
                self._log_failure("creating", e, expected=isinstance(e, AlreadyExists))
                return False
            return True
        except _ERRORS as e:
            self._log_failure("reading", e)
            return False

        record = current.spec
        if self._observed is None or record != self._observed:
            self._observed = record
            self._observed_time = self._clock.now()
        holder = record.holder_identity or ""
        expired = self._observed_time + (record.lease_duration_seconds or 0) < self._clock.now()
        if holder and holder != self.identity and not expired:
            return False
        if holder == self.identity:
            spec = _carry(desired, record, transitions=record.lease_transitions or 0)
            metrics.LEADER_ELECTION_SLOWPATH.labels(self.name).inc()
        else:  # a takeover: new acquireTime, one more transition
            spec = _carry(desired, record, transitions=(record.lease_transitions or 0) + 1, renewal=False)
        try:
            await self._update(current, spec)
        except _ERRORS as e:
            self._log_failure("updating", e, expected=isinstance(e, Conflict))
            return False
        return True

    def _log_failure(self, action: str, error: Exception, *, expected: bool = False) -> None:
        """Races (409) are routine between candidates; anything else (RBAC, outages) deserves a warning."""
        emit = log.debug if expected else log.warning
        emit(f"{action} the lease failed", lease=f"{self.namespace}/{self.name}", error=str(error))

    # ------------------------------------------------------------------------------------ requests

    async def _get(self) -> Lease:
        data = await self.client.request("GET", self._path, timeout=self.request_timeout)
        lease = objects.decode(data, Lease)
        self._lease = lease
        return lease

    async def _create(self, spec: LeaseSpec) -> None:
        body = _body(Lease(metadata=objects.ObjectMeta(name=self.name, namespace=self.namespace), spec=spec))
        data = await self.client.request("POST", LEASES.path(self.namespace), body=body, timeout=self.request_timeout)
        self._observe_write(objects.decode(data, Lease))

    async def _update(self, base: Lease, spec: LeaseSpec) -> None:
        """PUT guarded by `base`'s resourceVersion: a race with another writer is a Conflict, never a loss."""
        body = _body(msgspec.structs.replace(base, spec=spec))
        data = await self.client.request("PUT", self._path, body=body, timeout=self.request_timeout)
        self._observe_write(objects.decode(data, Lease))

    def _observe_write(self, lease: Lease) -> None:
        self._lease = lease
        self._observed = lease.spec
        self._observed_time = self._clock.now()

    async def _release(self) -> bool:
        """Empty the holder so standbys need not wait; only if the Lease still names us."""
        try:
            async with asyncio.timeout(self.renew_deadline):
                current = await self._get()
                if current.spec.holder_identity != self.identity:
                    return True
                stamp = micro_time()
                spec = msgspec.structs.replace(
                    current.spec,
                    holder_identity="",
                    lease_duration_seconds=1,
                    acquire_time=stamp,
                    renew_time=stamp,
                    lease_transitions=current.spec.lease_transitions or 0,
                )
                await self._update(current, spec)
        except Exception as e:  # cleanup must not replace the exception that ended leadership
            log.warning("releasing the lease failed", lease=f"{self.namespace}/{self.name}", error=str(e))
            return False
        log.info("released lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        return True

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        metrics.LEADER_ELECTION_MASTER_STATUS.labels(self.name).set(1 if leading else 0)


# ---------------------------------------------------------------------------------------------- helpers


def _carry(desired: LeaseSpec, old: LeaseSpec, *, transitions: int, renewal: bool = True) -> LeaseSpec:
    """`desired` keeping the old acquireTime on a renewal, and the fields we do not manage."""
    return msgspec.structs.replace(
        desired,
        acquire_time=(old.acquire_time or desired.acquire_time) if renewal else desired.acquire_time,
        lease_transitions=transitions,
        strategy=old.strategy,
        preferred_holder=old.preferred_holder,
    )


def _body(lease: Lease) -> bytes:
    body = objects.to_builtins(lease)
    body["apiVersion"] = LEASES.api_version
    body["kind"] = LEASES.kind
    return objects.encode(body)


async def _shielded(aw: Coroutine[Any, Any, R] | asyncio.Future[R]) -> R:
    """Await to completion through cancellation: cleanup (a release) must finish, bounded by its own timeout.

    anyio's shield stops its level-triggered cancellation from spinning this loop; asyncio.shield absorbs
    native `Task.cancel()`s, which are re-raised once the work is done.
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done() and task.cancelled():
                    break
                cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
