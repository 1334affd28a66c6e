"""The lease store: the contract of concurrency limiters' stores, apart from the rate store's
(:class:`~aiolimit.backends.Backend`): what one attempt returns, and the operations a store
fills in (:class:`LeaseStore`). The semantics are lease_lib.lua's, and the memory twin's
(``memory/_leases.py``): server time only, FIFO tickets, fences that only grow."""

from __future__ import annotations

import abc
import asyncio
import os
import secrets
from datetime import timedelta
from typing import Literal, NamedTuple, Protocol

from ._context import Store

__all__ = [
    "ConcurrencyConfig",
    "LeaseGrant",
    "LeaseHolder",
    "LeaseMode",
    "LeaseRefusal",
    "LeaseSnapshot",
    "LeaseStore",
    "LeaseWaiter",
    "Woken",
    "new_ticket",
    "parse_lease",
    "process_id",
]

LeaseMode = Literal["try", "set", "update"]

_process = secrets.token_hex(6)


def process_id() -> str:
    """This process's name in tickets: where the store sends a ticket's wake-up. Drawn
    again in a child after a fork (gunicorn ``--preload``, a ``fork`` pool), which would
    otherwise pop its parent's and its siblings' wake-ups off one list."""
    return _process


def _draw_again() -> None:
    global _process
    _process = secrets.token_hex(6)


os.register_at_fork(after_in_child=_draw_again)


class ConcurrencyConfig(NamedTuple):
    """A concurrency limiter's config: at most ``max_in_flight`` permits held at once, each
    lease ending ``lease`` after it was taken or last renewed."""

    max_in_flight: int
    lease: timedelta


class LeaseGrant(NamedTuple):
    """A lease taken. ``lease_id`` names it for the limiter's life: ``"<permits>:<fence>"``."""

    lease_id: str
    lease_us: int
    """How long it runs from when the store granted it, unless renewed."""

    @property
    def granted(self) -> Literal[True]:
        return True

    @property
    def permits(self) -> int:
        return parse_lease(self.lease_id)[0]

    @property
    def fence(self) -> int:
        return parse_lease(self.lease_id)[1]


class LeaseRefusal(NamedTuple):
    """No lease now. With a wait, the caller's ticket stays queued (in FIFO order)."""

    retry_in: int | None
    """Microseconds until the earliest holder's lease may end, at most (None: nobody holds
    one). A store may answer sooner than it ends (Redis: the least lease end it knows of
    without reading its holders): the waiter looks again then."""
    free: int
    """Slots free now (negative after the limit was lowered below what is held)."""
    ahead: int | None
    """Permits of the tickets ahead of the caller's: all the permits queued for a ticket new
    to the queue; None for one queued already with more than 100 tickets ahead (too many to
    count)."""
    lease_us: int
    """The limiter's lease time: a queued ticket is dropped unless its waiter calls again
    within it."""

    @property
    def granted(self) -> Literal[False]:
        return False


class LeaseHolder(NamedTuple):
    lease_id: str
    permits: int
    fence: int
    expires_in: int
    """Microseconds until the lease ends unless renewed."""


class LeaseSnapshot(NamedTuple):
    """A concurrency limiter as ``aiolimit inspect`` shows it."""

    config: ConcurrencyConfig
    in_flight: int
    holders: list[LeaseHolder]
    waiting: int
    """Tickets queued."""


def parse_lease(lease_id: str) -> tuple[int, int]:
    """``(permits, fence)`` of a lease id."""
    permits, _, fence = lease_id.partition(":")
    return int(permits), int(fence)


def new_ticket(permits: int, wake: Literal["h", "p"] = "h") -> str:
    """A waiter's ticket: ``"<permits>:<process>:<id>:<wake>"``, its wake-up handing it its
    lease: ``p`` published on its process's wake channel, ``h`` pushed on its wake list (an
    older client's tickets lack the suffix, and their wake-ups name the ticket only)."""
    return f"{permits}:{process_id()}:{secrets.token_hex(6)}:{wake}"


class LeaseWaiter(Protocol):
    """Where one waiter is woken: when the store has granted its ticket a lease (the script
    that freed the slot did, in FIFO order)."""

    async def wait(self, timeout: float) -> LeaseGrant | None:
        """Waits at most ``timeout`` seconds for a wake-up (consumed): the lease granted to
        the ticket, which the waiter now holds; None when the time ran out, or when the
        wake-up did not carry the lease (the waiter asks for it: ``take_lease`` collects
        it)."""
        ...

    async def aclose(self) -> None:
        """The waiter stops waiting (whatever it holds to be woken is let go)."""
        ...


class Woken:
    """One waiter's wake-ups, as a store's :class:`LeaseWaiter` keeps them: :meth:`hand`
    by whatever heard the store (a release's reply, a wake channel), :meth:`wait` by the
    waiter. A wake-up resumes the waiter on the event loop's next turn: the slot is idle
    until it runs (an ``asyncio.Event`` under ``wait_for`` takes three turns and a task)."""

    __slots__ = ("_future", "_grant", "_loop", "_woken")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] | None = None
        self._woken = False  # (handed while the waiter was not waiting: kept for its wait)
        self._grant: LeaseGrant | None = None

    @property
    def grant(self) -> LeaseGrant | None:
        """The lease handed over and not waited for yet."""
        return self._grant

    async def wait(self, timeout: float) -> LeaseGrant | None:
        """As :meth:`LeaseWaiter.wait`: the lease handed over, or None (no wake-up within
        ``timeout`` seconds, or one without its lease)."""
        if not self._woken:
            future = self._future = self._loop.create_future()
            timer = self._loop.call_later(max(timeout, 0.0), _time_up, future)
            try:
                await future
            finally:
                timer.cancel()
                self._future = None
            if not self._woken:
                return None
        self._woken = False
        grant, self._grant = self._grant, None
        return grant

    def hand(self, grant: LeaseGrant | None) -> None:
        """Wakes the waiter, ``grant`` the lease its ticket was granted (None: it asks for
        it). On the waiter's event loop."""
        if grant is not None:
            self._grant = grant
        self._woken = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def hand_threadsafe(self, grant: LeaseGrant | None) -> None:
        """:meth:`hand` from any thread (a release in another event loop of the process)."""
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self.hand(grant)
        else:
            self._loop.call_soon_threadsafe(self.hand, grant)


def _time_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LeaseStore(Store):
    """Where concurrency limiters live: the lease store, the contract a store fills in to
    serve :class:`~aiolimit.ConcurrencyLimiter` (which refuses, when made, a store that is
    not one). A store that keeps rates too subclasses :class:`~aiolimit.backends.Backend`
    as well (``class MyStore(MyLeases, Backend)``, as ``MemoryBackend`` and ``RedisBackend``
    do); its ``with_client`` views are the same lease store. Durations are integer µs.

    Background work (a cancelled waiter's lease handed back) runs in the store's
    ``context.tasks``, which :meth:`aclose` waits for; a wake-up mechanism's tasks too.
    """

    __slots__ = ()

    @abc.abstractmethod
    async def set_limit(
        self, name: str, max_in_flight: int, lease_us: int, mode: LeaseMode
    ) -> bool:
        """Writes the limit as ``mode`` says (``"try"``, ``"set"``, ``"update"``); whether it
        did. Holders, queue and fence stay."""

    @abc.abstractmethod
    async def get_limit(self, name: str) -> ConcurrencyConfig | None:
        """The limit and lease time; None when none is set."""

    @abc.abstractmethod
    async def take_lease(
        self, name: str, permits: int, ticket: str, max_wait_us: int | None
    ) -> LeaseGrant | LeaseRefusal:
        """One attempt, in FIFO order of tickets: granted when ``ticket`` and every ticket
        ahead of it fit together. Refused with a wait (``max_wait_us`` > 0, None: no end), the
        ticket stays queued for at most one lease time (each attempt stamps it again); with
        0 it leaves the queue. ``NotConfiguredError`` without a limit, ``InvalidArgumentError``
        for more permits than it."""

    @abc.abstractmethod
    async def renew_lease(self, name: str, lease_id: str) -> int | None:
        """The lease runs one lease time from now: that time (us); None when it is lost
        (ended, released, flushed). A lost lease is never taken again."""

    @abc.abstractmethod
    async def release_lease(self, name: str, lease_id: str) -> bool:
        """Hands the lease back: True when it was held until now. Idempotent; frees only it.
        The waiters that now fit are granted their leases and woken, the leases handed to
        them (:meth:`LeaseWaiter.wait`)."""

    @abc.abstractmethod
    async def cancel_ticket(self, name: str, ticket: str) -> bool:
        """Takes a waiter's ticket out of the queue; whether it was there."""

    def make_ticket(self, permits: int) -> str:
        """A new waiter's ticket (:func:`new_ticket`), in the form the store wakes it by."""
        return new_ticket(permits)

    @abc.abstractmethod
    def lease_waiter(self, name: str, ticket: str) -> LeaseWaiter:
        """Where the waiter of ``ticket`` is woken: made before its first attempt, so that no
        wake-up is missed; closed when it stops waiting."""

    @abc.abstractmethod
    async def leases(self, name: str, most: int = 100) -> LeaseSnapshot | None:
        """The limit, the holders (at most ``most``, earliest expiry first) and the queue."""

    @abc.abstractmethod
    async def delete_limit(self, name: str) -> bool:
        """Removes the limit, its holders and its queue; whether anything existed."""

    @abc.abstractmethod
    async def expire_limit(self, name: str, ttl_us: int) -> bool:
        """The whole limiter disappears after ``ttl_us``; False when it has no limit."""

    @abc.abstractmethod
    async def clear_expire_limit(self, name: str) -> bool:
        """Removes a TTL :meth:`expire_limit` set; returns whether there was one."""
