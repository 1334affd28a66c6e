"""The contract of concurrency limiters' stores (leases), shared by every backend: what one
attempt returns, and the operations a store fills in (:class:`LeaseStore`, a base of
:class:`~aiolimit.backends.Backend`). The semantics are lease_lib.lua's, and the memory twin's
(``memory/_leases.py``): server time only, FIFO tickets, fences that only grow."""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from typing import Literal, NamedTuple, Protocol

from ..errors import BackendError

__all__ = [
    "ConcurrencyConfig",
    "LeaseGrant",
    "LeaseHolder",
    "LeaseMode",
    "LeaseRefusal",
    "LeaseSnapshot",
    "LeaseStore",
    "LeaseWaiter",
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
    """Microseconds until the earliest holder's lease ends (None: nobody holds one)."""
    free: int
    """Slots free now (negative after the limit was lowered below what is held)."""
    ahead: int | None
    """Permits of the tickets ahead of the caller's (None: too many to count)."""
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


def new_ticket(permits: int) -> str:
    """A waiter's ticket: ``"<permits>:<process>:<id>"``."""
    return f"{permits}:{process_id()}:{secrets.token_hex(6)}"


class LeaseWaiter(Protocol):
    """Where one waiter is woken: when the store says its ticket now fits."""

    async def wait(self, timeout: float) -> bool:
        """Waits at most ``timeout`` seconds for a wake-up (consumed); whether one came."""
        ...

    async def aclose(self) -> None:
        """The waiter stops waiting (whatever it holds to be woken is let go)."""
        ...


class LeaseStore:
    """The lease operations of a backend. A store that has no concurrency limiters keeps these
    defaults, which raise :class:`~aiolimit.BackendError`. Durations are integer us."""

    __slots__ = ()

    def _no_leases(self) -> BackendError:
        return BackendError(f"{type(self).__name__} has no concurrency limiters", outage=False)

    async def set_limit(
        self, name: str, max_in_flight: int, lease_us: int, mode: LeaseMode
    ) -> bool:
        """Writes the limit as ``mode`` says (``"try"``, ``"set"``, ``"update"``); whether it
        did. Holders, queue and fence stay."""
        raise self._no_leases()

    async def get_limit(self, name: str) -> ConcurrencyConfig | None:
        raise self._no_leases()

    async def take_lease(
        self, name: str, permits: int, ticket: str, max_wait_us: int | None
    ) -> LeaseGrant | LeaseRefusal:
        """One attempt, in FIFO order of tickets: granted when ``ticket`` and every ticket
        ahead of it fit together. Refused with a wait (``max_wait_us`` > 0, None: no end), the
        ticket stays queued for at most one lease time (each attempt stamps it again); with
        0 it leaves the queue. ``NotConfiguredError`` without a limit, ``InvalidArgumentError``
        for more permits than it."""
        raise self._no_leases()

    async def renew_lease(self, name: str, lease_id: str) -> int | None:
        """The lease runs one lease time from now: that time (us); None when it is lost
        (ended, released, flushed). A lost lease is never taken again."""
        raise self._no_leases()

    async def release_lease(self, name: str, lease_id: str) -> bool:
        """Hands the lease back: True when it was held until now. Idempotent; frees only it."""
        raise self._no_leases()

    async def cancel_ticket(self, name: str, ticket: str) -> bool:
        """Takes a waiter's ticket out of the queue; whether it was there."""
        raise self._no_leases()

    def lease_waiter(self, name: str, ticket: str) -> LeaseWaiter:
        """Where the waiter of ``ticket`` is woken: made before its first attempt, so that no
        wake-up is missed; closed when it stops waiting."""
        raise self._no_leases()

    async def leases(self, name: str, most: int = 100) -> LeaseSnapshot | None:
        """The limit, the holders (at most ``most``, earliest expiry first) and the queue."""
        raise self._no_leases()

    async def delete_limit(self, name: str) -> bool:
        raise self._no_leases()

    async def expire_limit(self, name: str, ttl_us: int) -> bool:
        raise self._no_leases()

    async def clear_expire_limit(self, name: str) -> bool:
        raise self._no_leases()
