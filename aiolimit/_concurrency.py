"""The concurrency limiter: at most N permits held at once, across every process on the store,
as leases served in FIFO order (docs/concurrency.md)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable
from datetime import timedelta
from types import TracebackType
from typing import Any

from . import _observe
from ._awaiting import awaited
from ._code_config import CodeConfig, asked_again
from ._lease import Lease
from ._values import Duration, check_name, micros_up, seconds, to_micros
from .backends import LeaseStore
from .backends._lease import ConcurrencyConfig, LeaseGrant, LeaseRefusal, LeaseSnapshot
from .errors import InvalidArgumentError, NotConfiguredError, RateLimited

__all__ = ["ConcurrencyLimiter"]

MAX_IN_FLIGHT = 2**31
DEFAULT_LEASE = timedelta(seconds=30)
log = logging.getLogger("aiolimit")


class ConcurrencyLimiter:
    """At most ``max_in_flight`` permits in flight at once, for every process on the store.

    >>> sem = ConcurrencyLimiter("model-server", backend, limit=8)   # lease=30 s
    >>> async with sem.lease(timeout=10) as lease:   # RateLimited if no slot within 10 s
    ...     await call_model(fence=lease.fence)

    Waiters are served in the order they came, across processes; a waiter for 2 permits is not
    passed by later waiters for 1. A waiter wakes when a slot is freed (the store tells its
    process), or when the earliest lease ends. Every time is the store's (Redis ``TIME``):
    client clocks play no part. Its keys are under the name's hash tag (docs/redis-layout.md).

    ``limit`` (with ``lease``, default 30 s) is checked here and made the stored limit by the
    first ``try_lease`` (or ``lease``, :func:`~aiolimit.acquire_all`), once per object: the
    code's limit replaces a stored one that differs. When a call finds the store without a
    limit (a restart, ``FLUSHALL``, :meth:`delete`), it is written again (one write for all
    the process's callers) and the call goes on. Without it, the limiter uses the stored limit
    (``try_set_limit``, ``set_limit``; :meth:`ensure_limit` makes a limit the code's as
    ``limit=`` does), and ``try_lease`` raises ``NotConfiguredError``
    while there is none.
    """

    __slots__ = ("_backend", "_limit_in_code", "_name")

    def __init__(
        self,
        name: str,
        backend: LeaseStore,
        *,
        limit: int | None = None,
        lease: Duration | None = None,
    ) -> None:
        self._name = check_name(name)
        if not isinstance(backend, LeaseStore):
            raise InvalidArgumentError(
                f"a ConcurrencyLimiter needs a store that keeps leases: {type(backend).__name__}"
                " keeps no leases (it is no aiolimit.backends.LeaseStore; MemoryBackend and "
                "RedisBackend are)"
            )
        self._backend = backend
        given = _limit_given(limit, lease)
        self._limit_in_code: CodeConfig[ConcurrencyConfig] = CodeConfig(given, self._write_limit)

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend(self) -> LeaseStore:
        return self._backend

    # -- the limit --------------------------------------------------------------------------

    async def try_set_limit(
        self, max_in_flight: int, *, lease: Duration = timedelta(seconds=30)
    ) -> bool:
        """Sets the limit where none is set; returns whether it did."""
        return await self._set("try", max_in_flight, lease)

    async def set_limit(
        self, max_in_flight: int, *, lease: Duration = timedelta(seconds=30)
    ) -> None:
        """Sets the limit, replacing any. Leases held stay: a lower limit admits no one
        until the holders are under it; a higher one lets waiters in at once."""
        await self._set("set", max_in_flight, lease)

    async def update_limit(
        self, max_in_flight: int, *, lease: Duration = timedelta(seconds=30)
    ) -> bool:
        """Sets the limit where one is set already; returns whether it did."""
        return await self._set("update", max_in_flight, lease)

    async def ensure_limit(
        self, max_in_flight: int, *, lease: Duration = timedelta(seconds=30)
    ) -> bool:
        """Makes sure the stored limit is this one: sets it where none is set, and sets it
        again where the stored one differs (leases held stay, as :meth:`set_limit` says);
        returns whether it wrote. For code that owns its limit: an unchanged one costs two
        reads, no write. The limit is the code's from then on, as a ``limit=`` given at
        construction is: when a call finds the store without a limit, it is written again."""
        limit, lease_us = _checked(max_in_flight, lease)
        given = ConcurrencyConfig(limit, timedelta(microseconds=lease_us))
        wrote = await self._ensure(given)
        self._limit_in_code.given(given)
        return wrote

    async def _set(self, mode: Any, max_in_flight: int, lease: Duration) -> bool:
        config = _checked(max_in_flight, lease)
        return await self._backend.set_limit(self._name, *config, mode)

    async def _ensure(self, config: ConcurrencyConfig) -> bool:
        limit, lease_us = config.max_in_flight, to_micros(config.lease, "lease")
        if await self._backend.set_limit(self._name, limit, lease_us, "try"):
            return True
        if await self.get_config() == config:
            return False
        await self._backend.set_limit(self._name, limit, lease_us, "set")
        return True

    async def _write_limit(self, config: ConcurrencyConfig, replace: bool) -> None:
        """The limit in code written (:class:`CodeConfig`'s write): at first use as
        :meth:`ensure_limit` writes it, after a loss only where none is."""
        if replace:
            await self._ensure(config)
        else:
            limit, lease_us = config.max_in_flight, to_micros(config.lease, "lease")
            await self._backend.set_limit(self._name, limit, lease_us, "try")

    async def get_config(self) -> ConcurrencyConfig | None:
        """The limit and lease time; None when no limit is set."""
        return await self._backend.get_limit(self._name)

    async def leases(self, most: int = 100) -> LeaseSnapshot | None:
        """The holders (at most ``most``, earliest expiry first), in flight and waiting."""
        return await self._backend.leases(self._name, most)

    async def delete(self) -> bool:
        """Removes the limit, its holders and its queue (holders find their leases lost)."""
        return await self._backend.delete_limit(self._name)

    async def expire(self, ttl: Duration) -> bool:
        """The whole limiter disappears after ``ttl``; False when no limit is set."""
        ttl_us = to_micros(ttl, "ttl")
        if ttl_us <= 0:
            raise InvalidArgumentError(f"ttl must be positive, not {ttl!r}")
        return await self._backend.expire_limit(self._name, ttl_us)

    async def clear_expire(self) -> bool:
        """Removes a TTL :meth:`expire` set; returns whether there was one."""
        return await self._backend.clear_expire_limit(self._name)

    # -- leases -----------------------------------------------------------------------------

    def lease(self, permits: int = 1, *, timeout: Duration | None = None) -> _Leasing:
        """``async with sem.lease(permits, timeout=...) as lease:`` holds ``permits`` slots
        while the body runs, renewed in the background; :class:`~aiolimit.RateLimited`
        when none is free within ``timeout`` (None: waits as long as it takes);
        :class:`~aiolimit.LeaseLostError` when the lease is lost (the body is cancelled)."""
        return _Leasing(self, permits, timeout)

    @awaited
    async def try_lease(self, permits: int = 1, *, timeout: Duration | None = 0) -> Lease | None:
        """A lease of ``permits`` slots, waiting for them at most ``timeout`` (None: as long as
        it takes) in FIFO order; None when none was free in time. The holder renews it
        (:meth:`Lease.renew`, or ``async with lease:``) and releases it."""
        _check_permits(permits)
        wait_s = _timeout_s(timeout)
        limit_in_code = self._limit_in_code
        if not limit_in_code.stored:
            await limit_in_code.store()
        loop = asyncio.get_running_loop()
        start = loop.time()
        ticket = self._backend.make_ticket(permits)
        waiter = None if wait_s == 0 else self._backend.lease_waiter(self._name, ticket)
        queued = False
        granted: LeaseGrant | None = None
        try:
            while True:
                remaining = start + wait_s - loop.time()
                wait_us = 0 if remaining <= 0 else None if wait_s == math.inf else _us(remaining)
                sent = loop.time()
                try:
                    answer = await self._attempt(permits, ticket, wait_us)
                except NotConfiguredError as lost:  # the store lost the limit: the code's again
                    attempt = functools.partial(self._attempt, permits, ticket, wait_us)
                    answer = await asked_again(lost, [(self._name, limit_in_code)], attempt)
                if isinstance(answer, LeaseGrant):
                    granted = answer
                    return self._leased(
                        answer, permits, loop.time() - start if queued else 0.0, sent
                    )
                if wait_us == 0 or waiter is None:
                    if (observer := _observe.current) is not None:
                        observer.refused(self._name, permits)
                    return None
                if not queued:
                    queued = True
                    _queued(self._name, 1)
                handed = await waiter.wait(_next_look(answer, remaining))
                # Handed over: granted after the refused attempt reached the store, so it
                # ends a lease after `sent` at the earliest. One that may have ended by now
                # (the process stalled) is asked for instead: collected if still held.
                if handed is not None and loop.time() < sent + seconds(handed.lease_us):
                    granted = handed
                    return self._leased(handed, permits, loop.time() - start, sent)
        except BaseException:
            if queued:  # (a failed or cancelled waiter leaves no ticket)
                self._background(
                    self._backend.cancel_ticket(self._name, ticket), "a cancelled waiter's ticket"
                )
            raise
        finally:
            if queued:
                _queued(self._name, -1)
            if waiter is not None:
                try:
                    await waiter.aclose()
                except BaseException:  # cancelled after the grant: it goes back
                    if granted is not None:
                        released = self._backend.release_lease(self._name, granted.lease_id)
                        self._background(released, "a cancelled caller's lease")
                    raise

    def _leased(self, grant: LeaseGrant, permits: int, waited: float, sent: float) -> Lease:
        """The lease of ``grant``, reported; ``sent``: when the request that led to it left."""
        if (observer := _observe.current) is not None:
            observer.leased(self._name, permits, waited)
        return Lease(self, grant, sent)

    async def _attempt(
        self, permits: int, ticket: str, wait_us: int | None
    ) -> LeaseGrant | LeaseRefusal:
        """One attempt; if its caller is cancelled meanwhile, what it got goes back."""
        attempt = asyncio.ensure_future(
            self._backend.take_lease(self._name, permits, ticket, wait_us)
        )
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            self._background(
                self._orphaned(attempt, ticket), "a cancelled caller's lease or ticket"
            )
            raise

    async def _orphaned(
        self, attempt: asyncio.Future[LeaseGrant | LeaseRefusal], ticket: str
    ) -> None:
        """What the attempt of a caller that has gone got goes back: its lease, or its ticket."""
        answer = await attempt
        if isinstance(answer, LeaseGrant):
            await self._backend.release_lease(self._name, answer.lease_id)
        else:
            await self._backend.cancel_ticket(self._name, ticket)

    def _background(self, work: Awaitable[object], what: str) -> None:
        """``work`` in the store's background (its ``aclose()`` waits for it)."""

        def failed(error: BaseException) -> None:  # (a lease ends by itself in time)
            log.debug("limiter %r: %s not handed back: %s", self._name, what, error)

        self._backend.context.tasks.spawn(work, what, failed)


class _Leasing:
    """``sem.lease(...)``: takes a lease on entry and holds it as :class:`Lease` does."""

    __slots__ = ("_lease", "_limiter", "_permits", "_timeout")

    def __init__(self, limiter: ConcurrencyLimiter, permits: int, timeout: Duration | None) -> None:
        _check_permits(permits)
        _timeout_s(timeout)
        self._limiter, self._permits, self._timeout = limiter, permits, timeout
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        lease = await self._limiter.try_lease(self._permits, timeout=self._timeout)
        if lease is None:
            raise RateLimited(self._limiter.name, 0.0)
        self._lease = lease
        return await lease.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


def _next_look(refusal: LeaseRefusal, remaining: float) -> float:
    """How long a waiter sleeps unless woken: until the earliest lease ends, or its timeout,
    and at most a third of the lease time (each attempt keeps its ticket queued)."""
    look = min(remaining, refusal.lease_us / 3e6)
    if refusal.retry_in is not None:
        look = min(look, seconds(refusal.retry_in))
    return look


def _queued(name: str, change: int) -> None:
    if (observer := _observe.current) is not None:
        observer.lease_queued(name, change)


def _us(wait_s: float) -> int:
    return max(1, micros_up(wait_s))


def _checked(max_in_flight: int, lease: Duration) -> tuple[int, int]:
    """A limit and its lease time, checked: the limit, the lease in µs."""
    if (
        isinstance(max_in_flight, bool)
        or not isinstance(max_in_flight, int)
        or not 1 <= max_in_flight <= MAX_IN_FLIGHT
    ):
        raise InvalidArgumentError(
            f"max_in_flight must be an int from 1 to 2**31, not {max_in_flight!r}"
        )
    lease_us = to_micros(lease, "lease")
    if lease_us < 1000:
        raise InvalidArgumentError(f"lease must be at least 1 ms, not {lease!r}")
    return max_in_flight, lease_us


def _limit_given(limit: int | None, lease: Duration | None) -> ConcurrencyConfig | None:
    """The constructor's ``limit`` and ``lease``, checked, as the config they make; None
    without a ``limit``."""
    if limit is None:
        if lease is not None:
            raise InvalidArgumentError("lease goes with limit=, which is missing")
        return None
    limit, lease_us = _checked(limit, DEFAULT_LEASE if lease is None else lease)
    return ConcurrencyConfig(limit, timedelta(microseconds=lease_us))


def _check_permits(permits: int) -> None:
    if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
        raise InvalidArgumentError(f"permits must be an int >= 1, not {permits!r}")


def _timeout_s(timeout: Duration | None) -> float:
    if timeout is None:
        return math.inf
    wait_s = seconds(to_micros(timeout, "timeout"))
    if wait_s < 0:
        raise InvalidArgumentError(f"timeout must be >= 0 or None, not {timeout!r}")
    return wait_s
