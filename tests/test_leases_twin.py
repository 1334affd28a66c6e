"""The memory twin decides as the lease scripts do: one random sequence of lease operations
(waiters queued, given up and cancelled, leases released, renewed and handed over) run on a
MemoryBackend and on a real redis-server, every answer compared. Leases are long, so no
decision depends on when it is made; fences are compared by the order they were given in."""

from __future__ import annotations

import random
from typing import Any

import pytest
from redis.asyncio import Redis

from aiolimit import MemoryBackend, RedisBackend
from aiolimit.backends._lease import LeaseGrant, new_ticket, process_id
from aiolimit.backends.redis._wakeups import woken

LEASE_US = 600_000_000


def permits(ticket: str) -> int:
    return int(ticket.partition(":")[0])


class Trace:
    """One store's run: each answer, the fences named by the order they were first seen."""

    def __init__(self, backend: Any, name: str) -> None:
        self.backend, self.name = backend, name
        self.held: list[str] = []
        self.queued: dict[str, Any] = {}  # ticket -> its waiter
        self.fences: dict[int, int] = {}
        self.said: list[Any] = []

    def lease(self, lease_id: str) -> tuple[int, int]:
        permits, _, fence = lease_id.partition(":")
        return int(permits), self.fences.setdefault(int(fence), len(self.fences))

    async def handed(self) -> None:
        """The leases the last operation handed to waiters, in the queue's order (on Redis,
        the wake-ups pushed to this process's list delivered as its waker would)."""
        if isinstance(self.backend, RedisBackend):
            wake_list = f"{self.backend.keys(self.name).tag}:wake:{process_id()}"
            while (message := await self.backend.redis.rpop(wake_list)) is not None:
                ticket, grant = woken(message)
                self.queued[ticket].hand(grant)
        for ticket, waiter in list(self.queued.items()):
            if waiter.grant is not None:
                self.took(waiter.grant.lease_id)
                self.said.append(("handed", ticket, self.lease(waiter.grant.lease_id)))
                del self.queued[ticket]

    def took(self, lease_id: str) -> None:
        self.held.append(lease_id)

    async def step(self, rng: random.Random, tickets: list[str]) -> None:
        move = rng.choice(["take", "wait", "wait", "wait", "release", "release", "cancel",
                           "again", "give_up", "renew"])  # fmt: skip
        if move in ("take", "wait"):
            await self.take(move, tickets.pop())
        elif move in ("release", "renew") and self.held:
            await self.let_go(move, self.held[rng.randrange(len(self.held))])
        elif move in ("cancel", "again", "give_up") and self.queued:
            await self.leave(move, rng.choice(sorted(self.queued)))
        else:
            self.said.append(("nothing to do", move))
        await self.handed()
        snapshot = await self.backend.leases(self.name, 1000)
        holders = sorted(self.lease(holder.lease_id) for holder in snapshot.holders)
        self.said.append((snapshot.in_flight, holders, snapshot.waiting))

    async def take(self, move: str, ticket: str) -> None:
        """A new ticket: it waits without end ("wait"), or not at all."""
        if move == "wait":
            self.queued[ticket] = self.backend.lease_waiter(self.name, ticket)
        wait = None if move == "wait" else 0
        answer = await self.backend.take_lease(self.name, permits(ticket), ticket, wait)
        self.answered(move, ticket, answer)

    async def let_go(self, move: str, lease_id: str) -> None:
        if move == "release":
            self.held.remove(lease_id)
            answer = await self.backend.release_lease(self.name, lease_id)
        else:
            answer = await self.backend.renew_lease(self.name, lease_id)
        self.said.append((move, self.lease(lease_id), answer))

    async def leave(self, move: str, ticket: str) -> None:
        """A queued ticket cancelled, asking again, or giving up."""
        if move == "cancel":
            self.said.append((move, ticket, await self.backend.cancel_ticket(self.name, ticket)))
        else:
            wait = None if move == "again" else 0
            answer = await self.backend.take_lease(self.name, permits(ticket), ticket, wait)
            self.answered(move, ticket, answer)
        if move != "again" and ticket in self.queued:
            await self.queued.pop(ticket).aclose()

    def answered(self, move: str, ticket: str, answer: Any) -> None:
        if isinstance(answer, LeaseGrant):
            self.took(answer.lease_id)
            self.queued.pop(ticket, None)
            self.said.append((move, ticket, self.lease(answer.lease_id)))
        else:
            self.said.append((move, ticket, answer.free, answer.ahead, answer.retry_in is None))


@pytest.mark.parametrize("seed", range(3))
async def test_the_memory_twin_answers_every_lease_operation_as_the_scripts_do(
    redis_server, name, seed
):
    rng = random.Random(seed)
    tickets = [new_ticket(rng.choice([1, 1, 1, 2, 3])) for _ in range(500)]
    redis = Redis.from_url(redis_server.url)
    try:
        traces = []
        for backend in (MemoryBackend(), RedisBackend(redis)):
            await backend.set_limit(name, 4, LEASE_US, "set")
            trace, steps, unused = Trace(backend, name), random.Random(seed), list(tickets)
            for _ in range(400):
                await trace.step(steps, unused)
            traces.append(trace.said)
        for i, (memory, scripts) in enumerate(zip(*traces, strict=True)):
            assert memory == scripts, f"step {i}"
    finally:
        await redis.aclose()
