"""The lease operations of :class:`~aiolimit.RedisBackend` (``_lease_scripts``), and the
waker: how a waiter in this process is handed the lease granted to its ticket, without
polling (in the reply of a release made in this process, else through its wake list)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ..._values import millis_up
from ...errors import NotConfiguredError
from .._context import Background, StoreContext
from .._lease import (
    ConcurrencyConfig,
    LeaseGrant,
    LeaseMode,
    LeaseRefusal,
    LeaseSnapshot,
    LeaseStore,
    process_id,
)
from .._protocol import over_rate_error
from . import _lease_scripts as scripts
from ._compat import ANY
from ._keys import Keys
from ._script import ReadCommand, Script

__all__ = ["RedisLeases", "lease_keys"]

log = logging.getLogger("aiolimit")
R = TypeVar("R")

WAKE_BLOCK_S = 1
"""How long one BLPOP of the waker blocks before it is sent again."""


def lease_keys(keys: Keys) -> tuple[str, str, str, str, str]:
    """T:sem, T:holders, T:queue, T:tickets, T:granted: every lease script's KEYS, in this
    order (lease_lib.lua)."""
    tag = keys.tag
    return f"{tag}:sem", f"{tag}:holders", f"{tag}:queue", f"{tag}:tickets", f"{tag}:granted"


class _Runs(Protocol):
    @property
    def redis(self) -> Any: ...

    @property
    def context(self) -> StoreContext: ...

    def keys(self, name: str) -> Keys: ...

    async def _run(
        self, script: Script[R] | ReadCommand[R], keys: Sequence[Any], args: Sequence[Any]
    ) -> R: ...


class _Waiter:
    __slots__ = ("_loop", "_tasks", "_waker", "grant", "ticket", "woken")

    def __init__(self, waker: _Waker, ticket: str, tasks: Background) -> None:
        self._waker, self.ticket, self.woken = waker, ticket, asyncio.Event()
        self._tasks = tasks  # (its store's: aclose() waits for the BLPOP's end)
        self._loop = asyncio.get_running_loop()
        self.grant: LeaseGrant | None = None

    async def wait(self, timeout: float) -> LeaseGrant | None:
        self._waker.listen()
        try:
            await asyncio.wait_for(self.woken.wait(), max(timeout, 0))
        except asyncio.TimeoutError:
            return None
        self.woken.clear()
        grant, self.grant = self.grant, None
        return grant

    def hand(self, grant: LeaseGrant | None) -> None:
        """Wakes the waiter, ``grant`` the lease its ticket was granted (None: it asks for
        it). From any thread: a release in another event loop of the process hands it too."""
        if grant is not None:
            self.grant = grant
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self.woken.set()
        else:
            self._loop.call_soon_threadsafe(self.woken.set)

    async def aclose(self) -> None:
        ending = self._waker.remove(self)
        if ending is not None:
            # Its BLPOP ends in the background: the client library lets go of a BLPOP
            # cancelled while it connects only when its block is up (a second), which a
            # caller granted at once must not wait for.
            self._tasks.spawn(ending, "a lease waker's end")


class _Waker:
    """The wake list of one limiter for this process (``T:wake:<process>``): one task, one
    connection blocked in BLPOP, while the process has waiters on the limiter; each ticket
    popped wakes its waiter."""

    __slots__ = ("_key", "_redis", "_task", "waiters")

    def __init__(self, redis: Any, key: str) -> None:
        self._redis, self._key = redis, key
        self.waiters: dict[str, _Waiter] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, ticket: str, tasks: Background) -> _Waiter:
        waiter = self.waiters[ticket] = _waiting[ticket] = _Waiter(self, ticket, tasks)
        return waiter

    def listen(self) -> None:
        """Its BLPOP runs from the first wait on (a caller granted at once sends none: a
        wake-up pushed before waits in the list)."""
        if self._task is None and self.waiters:
            self._task = asyncio.create_task(self._run())

    def remove(self, waiter: _Waiter) -> asyncio.Task[None] | None:
        """Forgets the waiter; the task it ends when it was the last (to be awaited)."""
        if self.waiters.get(waiter.ticket) is waiter:
            del self.waiters[waiter.ticket]
        if _waiting.get(waiter.ticket) is waiter:
            del _waiting[waiter.ticket]
        task = self._task
        if self.waiters or task is None:
            return None
        # No one left to wake: the BLPOP ends now, its connection with it (a wake-up pushed
        # meanwhile waits in the list for the next waiter's BLPOP, which skips it).
        task.cancel()
        self._task = None
        return task

    async def _run(self) -> None:
        redis = self._redis
        try:
            while self.waiters:
                try:
                    popped = await redis.blpop([self._key], timeout=WAKE_BLOCK_S)
                except ANY as exc:  # the waiters' own timers still wake them
                    log.debug("waker of %s: %s", self._key, exc)
                    await asyncio.sleep(0.1)
                    continue
                if popped:
                    ticket, grant = scripts.woken(popped[1])
                    waiter = self.waiters.get(ticket)
                    if waiter is not None:
                        waiter.hand(grant)
        finally:
            if self._task is asyncio.current_task():
                self._task = None


_wakers: weakref.WeakKeyDictionary[Any, dict[str, _Waker]] = weakref.WeakKeyDictionary()
_waiting: dict[str, _Waiter] = {}  # this process's waiters, by ticket: a release hands to them


def _hand_over(handed: list[tuple[str, LeaseGrant]]) -> None:
    """The leases a release granted to waiters of this process, handed to them. A waiter
    gone meanwhile has handed its grant back, or will (``cancel_ticket``)."""
    for ticket, grant in handed:
        waiter = _waiting.get(ticket)
        if waiter is not None:
            waiter.hand(grant)


class RedisLeases(LeaseStore):
    """Concurrency limiters in Redis: every operation one script (``lua/lease_*.lua``)."""

    __slots__ = ()

    async def set_limit(
        self: _Runs, name: str, max_in_flight: int, lease_us: int, mode: LeaseMode
    ) -> bool:
        return await self._run(
            scripts.SET, lease_keys(self.keys(name)), (mode, max_in_flight, lease_us)
        )

    async def get_limit(self: _Runs, name: str) -> ConcurrencyConfig | None:
        sem = lease_keys(self.keys(name))[0]
        return await self._run(scripts.CONFIG, (sem,), ("max", "lease"))

    async def take_lease(
        self: _Runs, name: str, permits: int, ticket: str, max_wait_us: int | None
    ) -> LeaseGrant | LeaseRefusal:
        wait = -1 if max_wait_us is None else max_wait_us
        reply = await self._run(scripts.TAKE, lease_keys(self.keys(name)), (permits, ticket, wait))
        if isinstance(reply, scripts.OverLimit):
            raise over_rate_error(permits, int(reply))
        if isinstance(reply, scripts.Unset):
            raise NotConfiguredError(name)
        return reply

    async def renew_lease(self: _Runs, name: str, lease_id: str) -> int | None:
        return await self._run(scripts.RENEW, lease_keys(self.keys(name)), (lease_id,))

    async def release_lease(self: _Runs, name: str, lease_id: str) -> bool:
        keys = lease_keys(self.keys(name))
        released = await self._run(scripts.RELEASE, keys, (lease_id, process_id()))
        _hand_over(released.handed)
        return released.held

    async def cancel_ticket(self: _Runs, name: str, ticket: str) -> bool:
        return await self._run(scripts.CANCEL, lease_keys(self.keys(name)), (ticket,))

    def lease_waiter(self: _Runs, name: str, ticket: str) -> _Waiter:
        key = f"{self.keys(name).tag}:wake:{process_id()}"
        by_key = _wakers.setdefault(self.redis, {})
        waker = by_key.get(key)
        if waker is None:
            waker = by_key[key] = _Waker(self.redis, key)
        return waker.add(ticket, self.context.tasks)

    async def leases(self: _Runs, name: str, most: int = 100) -> LeaseSnapshot | None:
        return await self._run(scripts.READ, lease_keys(self.keys(name)), (most,))

    async def delete_limit(self: _Runs, name: str) -> bool:
        return await self._run(scripts.LIFETIME, lease_keys(self.keys(name)), ("delete", 0))

    async def expire_limit(self: _Runs, name: str, ttl_us: int) -> bool:
        ttl_ms = max(1, millis_up(ttl_us))
        return await self._run(scripts.LIFETIME, lease_keys(self.keys(name)), ("expire", ttl_ms))

    async def clear_expire_limit(self: _Runs, name: str) -> bool:
        return await self._run(scripts.LIFETIME, lease_keys(self.keys(name)), ("persist", 0))
