"""Concurrency limiters in memory: lease_lib.lua and the lease_*.lua scripts, step for step,
in Python (one method per script), on the memory backend's clock."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from ...errors import NotConfiguredError
from .._lease import (
    ConcurrencyConfig,
    LeaseGrant,
    LeaseHolder,
    LeaseMode,
    LeaseRefusal,
    LeaseSnapshot,
    LeaseStore,
    Woken,
    parse_lease,
)
from .._protocol import over_rate_error


class HoldsLeases(Protocol):
    """Where a store keeps its concurrency limiters (``_store.Store``)."""

    leases: LeaseTable


__all__ = ["LeaseTable", "MemoryLeases"]

SCAN = 100  # tickets read ahead of a caller (lease_lib.lua's LEASE.SCAN)


@dataclass(eq=False)
class Semaphore:
    """One concurrency limiter (the keys T:sem, T:holders, T:queue and T:tickets)."""

    max: int
    lease_us: int
    used: int = 0
    expires_at: int | None = None
    holders: dict[str, int] = field(default_factory=dict)  # lease id -> expiry
    # ticket -> when it is dropped; in queue order (a ticket that leaves and comes back is
    # put at the end, as a new place in T:queue)
    queue: dict[str, int] = field(default_factory=dict)
    # ticket -> fence of a lease granted to it in the queue, while that lease is held and its
    # waiter has not asked for it (T:queue's members scored below 0, by minus the fence); and
    # the same by fence (a dropped holder's, T:queue's ZREMRANGEBYSCORE)
    granted: dict[str, int] = field(default_factory=dict)
    granted_by_fence: dict[int, str] = field(default_factory=dict)

    def collect(self, ticket: str) -> int | None:
        """The fence granted to ``ticket``, no longer kept; None if none is."""
        fence = self.granted.pop(ticket, None)
        if fence is not None:
            del self.granted_by_fence[fence]
        return fence


@dataclass(eq=False)
class _Waiter:
    table: LeaseTable
    ticket: str
    woken: Woken = field(default_factory=Woken)

    @property
    def grant(self) -> LeaseGrant | None:
        """The lease handed over and not waited for yet."""
        return self.woken.grant

    async def wait(self, timeout: float) -> LeaseGrant | None:
        return await self.woken.wait(timeout)

    def hand(self, grant: LeaseGrant) -> None:
        self.woken.hand(grant)

    async def aclose(self) -> None:
        if self.table.waiters.get(self.ticket) is self:
            del self.table.waiters[self.ticket]


@dataclass(eq=False)
class LeaseTable:
    """A memory store's concurrency limiters, the last fence of every name (it outlives a
    deleted limiter: fences only grow) and the waiters of this process by ticket."""

    semaphores: dict[str, Semaphore] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)
    waiters: dict[str, _Waiter] = field(default_factory=dict)

    def live(self, name: str, now: int) -> Semaphore | None:
        sem = self.semaphores.get(name)
        if sem is not None and sem.expires_at is not None and sem.expires_at <= now:
            del self.semaphores[name]
            return None
        return sem

    def tidy(self, name: str, sem: Semaphore, now: int) -> None:
        """Drops ended holders and tickets; grants the queue's head."""
        for lease in [lease for lease, expiry in sem.holders.items() if expiry <= now]:
            self.drop(sem, lease)
        self.drop_tickets(sem, now)
        self.promote(name, sem, now)

    @staticmethod
    def drop_tickets(sem: Semaphore, now: int) -> None:
        """Drops the tickets whose waiter stopped calling."""
        for ticket in [ticket for ticket, deadline in sem.queue.items() if deadline <= now]:
            del sem.queue[ticket]

    def drop(self, sem: Semaphore, lease_id: str) -> bool:
        """Drops a holder, and its grant in the queue if it had one."""
        if sem.holders.pop(lease_id, None) is None:
            return False
        permits, fence = parse_lease(lease_id)
        ticket = sem.granted_by_fence.pop(fence, None)
        if ticket is not None:
            del sem.granted[ticket]
        sem.used = max(0, sem.used - permits)
        return True

    def grant(self, name: str, sem: Semaphore, permits: int, now: int) -> int:
        fence = self.fences[name] = max(self.fences.get(name, 0) + 1, now)
        sem.holders[f"{permits}:{fence}"] = now + sem.lease_us
        sem.used += permits
        return fence

    def promote(self, name: str, sem: Semaphore, now: int) -> None:
        """Grants the tickets at the head of the queue while they fit (a dead waiter's
        dropped first); hands each waiter its lease."""
        free = sem.max - sem.used
        if free <= 0 or not sem.queue:
            return
        self.drop_tickets(sem, now)
        for ticket in list(itertools.islice(sem.queue, min(free, SCAN))):
            permits = _permits(ticket)
            if permits > free:
                return
            free -= permits
            del sem.queue[ticket]
            fence = self.grant(name, sem, permits, now)
            sem.granted[ticket], sem.granted_by_fence[fence] = fence, ticket
            waiter = self.waiters.get(ticket)
            if waiter is not None:
                waiter.hand(LeaseGrant(f"{permits}:{fence}", sem.lease_us))

    def ahead(self, sem: Semaphore, ticket: str) -> int | None:
        permits = 0
        for i, queued in enumerate(sem.queue):
            if queued == ticket:
                return permits
            if i >= SCAN:
                return None
            permits += _permits(queued)
        return None


def _permits(ticket: str) -> int:
    return int(ticket.partition(":")[0])


class MemoryLeases(LeaseStore):
    """The lease operations of :class:`~aiolimit.MemoryBackend`."""

    __slots__ = ()

    _shared: HoldsLeases  # (MemoryBackend's store)

    def _now(self) -> int:
        raise NotImplementedError  # (MemoryBackend's clock)

    @property
    def _leases(self) -> LeaseTable:
        return self._shared.leases

    def _sem(self, name: str, now: int) -> Semaphore:
        sem = self._leases.live(name, now)
        if sem is None:
            raise NotConfiguredError(name)
        return sem

    async def set_limit(
        self, name: str, max_in_flight: int, lease_us: int, mode: LeaseMode
    ) -> bool:
        now, table = self._now(), self._leases
        sem = table.live(name, now)
        if (mode == "try" and sem is not None) or (mode == "update" and sem is None):
            return False
        if sem is None:
            sem = table.semaphores[name] = Semaphore(max_in_flight, lease_us)
        sem.max, sem.lease_us = max_in_flight, lease_us
        table.tidy(name, sem, now)
        return True

    async def get_limit(self, name: str) -> ConcurrencyConfig | None:
        sem = self._leases.live(name, self._now())
        if sem is None:
            return None
        return ConcurrencyConfig(sem.max, timedelta(microseconds=sem.lease_us))

    async def take_lease(
        self, name: str, permits: int, ticket: str, max_wait_us: int | None
    ) -> LeaseGrant | LeaseRefusal:
        now, table = self._now(), self._leases
        sem = self._sem(name, now)
        if permits > sem.max:
            raise over_rate_error(permits, sem.max)
        table.tidy(name, sem, now)
        fence = sem.collect(ticket)
        if fence is not None and f"{permits}:{fence}" in sem.holders:
            sem.holders[f"{permits}:{fence}"] = now + sem.lease_us  # collected: renewed
            return LeaseGrant(f"{permits}:{fence}", sem.lease_us)
        queued = ticket in sem.queue
        free = sem.max - sem.used
        if not queued and permits <= free and not sem.queue:
            return LeaseGrant(f"{permits}:{table.grant(name, sem, permits, now)}", sem.lease_us)
        ahead = None
        if max_wait_us == 0:
            if sem.queue.pop(ticket, None) is not None:
                table.promote(name, sem, now)
        else:
            # A new ticket goes to the end: every ticket queued is ahead (lease_take.lua keeps
            # their permits counted); one queued already is counted up to SCAN.
            ahead = table.ahead(sem, ticket) if queued else sum(map(_permits, sem.queue))
            keep = sem.lease_us if not max_wait_us else min(max_wait_us, sem.lease_us)
            sem.queue[ticket] = now + keep
        expiries = sem.holders.values()
        retry = max(0, min(expiries) - now) if expiries else None
        return LeaseRefusal(retry, free, ahead, sem.lease_us)

    async def renew_lease(self, name: str, lease_id: str) -> int | None:
        now, table = self._now(), self._leases
        sem = table.live(name, now)
        expiry = None if sem is None else sem.holders.get(lease_id)
        if sem is None or expiry is None:
            return None
        if expiry <= now:
            table.drop(sem, lease_id)
            table.promote(name, sem, now)
            return None
        sem.holders[lease_id] = now + sem.lease_us
        return sem.lease_us

    async def release_lease(self, name: str, lease_id: str) -> bool:
        now, table = self._now(), self._leases
        sem = table.live(name, now)
        expiry = None if sem is None else sem.holders.get(lease_id)
        if sem is None or expiry is None:
            return False
        table.drop(sem, lease_id)
        table.promote(name, sem, now)
        return expiry > now

    async def cancel_ticket(self, name: str, ticket: str) -> bool:
        now, table = self._now(), self._leases
        sem = table.live(name, now)
        if sem is None:
            return False
        removed = sem.queue.pop(ticket, None) is not None
        fence = sem.collect(ticket)
        if fence is not None:
            table.drop(sem, f"{_permits(ticket)}:{fence}")
            removed = True
        if removed:
            table.promote(name, sem, now)
        return removed

    def lease_waiter(self, name: str, ticket: str) -> _Waiter:
        table = self._leases
        waiter = table.waiters[ticket] = _Waiter(table, ticket)
        return waiter

    async def leases(self, name: str, most: int = 100) -> LeaseSnapshot | None:
        now = self._now()
        sem = self._leases.live(name, now)
        if sem is None:
            return None
        ordered = sorted(sem.holders.items(), key=lambda item: item[1])[:most]
        holders = [
            LeaseHolder(lease, *parse_lease(lease), max(0, expiry - now))
            for lease, expiry in ordered
        ]
        config = ConcurrencyConfig(sem.max, timedelta(microseconds=sem.lease_us))
        in_flight = sum(h.permits for h in holders if h.expires_in > 0)
        return LeaseSnapshot(config, in_flight, holders, len(sem.queue))

    async def delete_limit(self, name: str) -> bool:
        return self._leases.semaphores.pop(name, None) is not None

    async def expire_limit(self, name: str, ttl_us: int) -> bool:
        now = self._now()
        sem = self._leases.live(name, now)
        if sem is None:
            return False
        sem.expires_at = now + ttl_us
        return True

    async def clear_expire_limit(self, name: str) -> bool:
        sem = self._leases.live(name, self._now())
        if sem is None or sem.expires_at is None:
            return False
        sem.expires_at = None
        return True
