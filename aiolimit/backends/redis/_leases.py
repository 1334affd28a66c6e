"""The lease operations of :class:`~aiolimit.RedisBackend` (``_lease_scripts``), and where
each waiter of this process is woken (``_wakeups``): in the reply of a release made in this
process, else on its process's wake channel (pub/sub), or its wake list for a cluster client."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from ..._values import millis_up
from ...errors import NotConfiguredError
from .._context import StoreContext
from .._lease import (
    ConcurrencyConfig,
    LeaseGrant,
    LeaseMode,
    LeaseRefusal,
    LeaseSnapshot,
    LeaseStore,
    new_ticket,
    process_id,
)
from .._protocol import over_rate_error
from . import _lease_scripts as scripts
from ._compat import is_cluster
from ._keys import Keys
from ._script import ReadCommand, Script
from ._wakeups import Subscriber, Waiter, Waker

__all__ = ["RedisLeases", "end_wake_ups", "lease_keys", "subscriber_of"]

R = TypeVar("R")


def lease_keys(keys: Keys) -> tuple[str, str, str, str]:
    """T:sem, T:holders, T:queue, T:tickets: every lease script's KEYS, in this
    order (lease_lib.lua)."""
    tag = keys.tag
    return f"{tag}:sem", f"{tag}:holders", f"{tag}:queue", f"{tag}:tickets"


class _Runs(Protocol):
    @property
    def redis(self) -> Any: ...

    @property
    def context(self) -> StoreContext: ...

    def keys(self, name: str) -> Keys: ...

    async def _run(
        self, script: Script[R] | ReadCommand[R], keys: Sequence[Any], args: Sequence[Any]
    ) -> R: ...


_wakers: weakref.WeakKeyDictionary[Any, dict[str, Waker]] = weakref.WeakKeyDictionary()
_subscribers: weakref.WeakKeyDictionary[Any, Subscriber] = weakref.WeakKeyDictionary()


async def end_wake_ups(redis: Any) -> None:
    """The client's wake channel reader ended now if no waiter is left (it lingers a while
    after the last): the client is closing."""
    subscriber = _subscribers.get(redis)
    ending = None if subscriber is None else subscriber.end()
    if ending is not None:
        await asyncio.gather(ending, return_exceptions=True)


def _subscriber(redis: Any) -> Subscriber:
    subscriber = _subscribers.get(redis)
    if subscriber is None:
        subscriber = _subscribers[redis] = Subscriber(redis)
    return subscriber


subscriber_of = _subscriber  # (a client's one subscriber: its refund channels too, _refunds)


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
        # (the leases it grants to waiters of this process are handed to them as soon as its
        # reply is read: RELEASE's `heard`)
        keys = lease_keys(self.keys(name))
        released = await self._run(scripts.RELEASE, keys, (lease_id, process_id()))
        return released.held

    async def cancel_ticket(self: _Runs, name: str, ticket: str) -> bool:
        return await self._run(scripts.CANCEL, lease_keys(self.keys(name)), (ticket,))

    def make_ticket(self: _Runs, permits: int) -> str:
        """A ticket woken on its process's wake channel; on its wake list for a cluster
        client (a channel is not a key: its slot is not the limiter's), or once the server
        refused this client a subscription."""
        redis = self.redis
        list_only = is_cluster(redis) or _subscriber(redis).refused
        return new_ticket(permits, "h" if list_only else "p")

    def lease_waiter(self: _Runs, name: str, ticket: str) -> Waiter:
        wake = f"{self.keys(name).tag}:wake:{process_id()}"
        if ticket.endswith(":p"):
            return _subscriber(self.redis).add(wake, ticket, self.context.tasks)
        by_key = _wakers.setdefault(self.redis, {})
        waker = by_key.get(wake)
        if waker is None:
            waker = by_key[wake] = Waker(self.redis, wake)
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
