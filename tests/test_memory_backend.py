"""MemoryBackend's storage lifecycle: expired state is freed without being touched again, by a
sweep bounded per operation, and reads never add state.

White-box: these tests look at the backend's internal dict of limiters, which the public API
cannot observe (an expired limiter and a freed one answer alike).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from aiolimit import MemoryBackend, NotConfiguredError, RateLimiterConfig, RateType
from aiolimit.backends.memory import _store as memory

OVERALL = RateType.OVERALL
PER_CLIENT = RateType.PER_CLIENT

# The sweep may pop at most this many heap entries per operation (the backend's own bound is
# lower; this is what "a small constant" means for the tests).
MAX_SWEEP = 16


class FakeClock:
    """Seconds, as the tests set them; the backend reads it on every operation."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def make_backend(start: float = 1_000.0) -> tuple[MemoryBackend, FakeClock]:
    clock = FakeClock(start)
    return MemoryBackend(client_id="a", clock=clock), clock


async def configure_many(backend: MemoryBackend, count: int, **options: Any) -> None:
    """``count`` limiters ``n0``..., each configured (rate 1 per 1 s) and granted once."""
    config = RateLimiterConfig.build(OVERALL, 1, 1, **options)
    for i in range(count):
        assert await backend.set_rate(f"n{i}", config, "set", False)
        assert (await backend.try_acquire(f"n{i}", 1)).granted


async def sweep_by_reads(backend: MemoryBackend, max_ops: int) -> int:
    """Reads an unconfigured name until the store is empty; returns how many reads it took."""
    for ops in range(1, max_ops + 1):
        assert await backend.get_config("never-configured") is None
        if not backend._limiters:
            return ops
    return max_ops + 1


class PopCounter:
    """Counts the sweep's heap pops (wraps the heappop the memory backend uses)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real: Callable[..., Any] = memory.heappop

        def counting(heap: list[Any]) -> Any:
            self.count += 1
            return real(heap)

        monkeypatch.setattr(memory, "heappop", counting)


# -- (1) expired state is freed without being touched again ---------------------------------------


@pytest.mark.slow
async def test_expired_limiters_are_freed_without_being_touched_again() -> None:
    count = 100_000
    backend, clock = make_backend()
    gc.collect()
    base = sys.getallocatedblocks()
    await configure_many(backend, count, keep_alive=1)
    held = sys.getallocatedblocks() - base
    assert len(backend._limiters) == count

    clock.now += 2.5  # every grant, budget and config has expired
    ops = await sweep_by_reads(backend, count)
    assert not backend._limiters, f"{len(backend._limiters)} expired limiters still held"
    # Bounded per operation, so it takes many operations; but not many more than needed.
    assert count // MAX_SWEEP <= ops <= count // 4, ops
    gc.collect()
    left = sys.getallocatedblocks() - base
    assert held > 5 * count
    assert left < held // 100, f"{left} of {held} memory blocks still held"


@pytest.mark.slow
async def test_the_memory_of_expired_limiters_is_returned() -> None:
    count = 100_000
    gc.collect()
    tracemalloc.start()
    try:
        backend, clock = make_backend()
        base = tracemalloc.get_traced_memory()[0]
        await configure_many(backend, count, keep_alive=1)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        clock.now += 2.5
        await sweep_by_reads(backend, count)
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held > 20_000_000, f"100 000 limiters took only {held} bytes?"
    assert left < held // 100, f"{left} of {held} bytes still held after everything expired"
    print(f"\n100 000 limiters: {held / 1e6:.1f} MB held, {left / 1e6:.3f} MB after expiry")


async def test_expired_limiters_of_every_view_are_freed_by_any_view() -> None:
    # with_client views share the store, so one view's operations sweep the others' state.
    backend, clock = make_backend()
    other = backend.with_client("b")
    config = RateLimiterConfig.build(PER_CLIENT, 2, 1, keep_alive=1)
    for i in range(1_000):
        assert await backend.set_rate(f"n{i}", config, "set", False)
        assert (await backend.try_acquire(f"n{i}", 1)).granted
        assert (await other.try_acquire(f"n{i}", 1)).granted
    clock.now += 5
    view = backend.with_client("c")
    for _ in range(1_000):
        assert await view.get_config("never-configured") is None
    assert not backend._limiters
    assert not other._limiters


async def test_a_limiter_kept_alive_by_its_grants_is_not_freed() -> None:
    backend, clock = make_backend()
    config = RateLimiterConfig.build(OVERALL, 1_000_000, 1, keep_alive=2)
    assert await backend.set_rate("busy", config, "set", False)
    for _ in range(10_000):
        clock.now += 0.01
        assert (await backend.try_acquire("busy", 1)).granted
        assert await backend.get_config("never-configured") is None
    assert await backend.get_config("busy") == config


# -- (2) reads never add state --------------------------------------------------------------------


async def test_reads_on_unconfigured_names_leave_nothing_behind() -> None:
    backend, _ = make_backend()
    config = RateLimiterConfig.build(OVERALL, 1, 1)
    for i in range(10_000):
        name = f"n{i}"
        assert await backend.get_config(name) is None
        for call in (
            backend.available_permits(name),
            backend.try_acquire(name, 1),
            backend.release(name, 1),
        ):
            with pytest.raises(NotConfiguredError):
                await call
        assert not await backend.delete(name)
        assert not await backend.expire(name, 1_000_000)
        assert not await backend.clear_expire(name)
        assert not await backend.set_rate(name, config, "update", True)
    assert not backend._limiters


async def test_reads_on_expired_limiters_free_them() -> None:
    backend, clock = make_backend()
    await configure_many(backend, 100, keep_alive=1)
    clock.now += 3
    for i in range(100):
        assert await backend.get_config(f"n{i}") is None
    assert not backend._limiters


# -- (3) a config without TTL lives forever; its budgets do not -----------------------------------


async def test_a_config_without_ttl_stays_but_its_budgets_are_freed() -> None:
    backend, clock = make_backend()
    other = backend.with_client("b")
    overall = RateLimiterConfig.build(OVERALL, 5, 1)
    per_client = RateLimiterConfig.build(PER_CLIENT, 5, 1)
    assert await backend.set_rate("overall", overall, "set", False)
    assert await backend.set_rate("per-client", per_client, "set", False)
    for _ in range(3):
        assert (await backend.try_acquire("overall", 1)).granted
        assert (await backend.try_acquire("per-client", 1)).granted
        assert (await other.try_acquire("per-client", 1)).granted
        clock.now += 0.1
    assert backend._limiters["overall"].budgets
    assert len(backend._limiters["per-client"].budgets) == 2
    assert backend._limiters["per-client"].registry

    clock.now += 10_000  # budgets (1 s) and the clients registry (2 s) have long expired
    for _ in range(10):  # untouched: only operations on another name sweep them
        assert await backend.get_config("never-configured") is None
    for name in ("overall", "per-client"):
        limiter = backend._limiters[name]
        assert limiter.config is not None
        assert not limiter.budgets, name
        assert not limiter.registry, name
    assert await backend.get_config("overall") == overall
    assert await backend.get_config("per-client") == per_client
    assert await backend.available_permits("overall") == 5
    assert set(backend._limiters) == {"overall", "per-client"}

    # Once nothing is left (the config given a TTL), the limiter itself goes.
    assert await backend.expire("overall", 1_000_000)
    clock.now += 2
    for _ in range(10):
        assert await backend.get_config("never-configured") is None
    assert set(backend._limiters) == {"per-client"}


async def test_state_left_by_an_expired_config_is_freed_when_it_expires() -> None:
    # expire() then a grant: the budget may outlive the config by a moment; both go.
    backend, clock = make_backend()
    assert await backend.set_rate("n", RateLimiterConfig.build(OVERALL, 5, 10), "set", False)
    assert (await backend.try_acquire("n", 1)).granted
    assert await backend.expire("n", 500_000)
    assert (await backend.try_acquire("n", 1)).granted
    clock.now += 0.75
    for _ in range(10):
        assert await backend.get_config("never-configured") is None
    assert not backend._limiters


# -- (4) the sweep is bounded per operation -------------------------------------------------------


@pytest.mark.slow
async def test_each_operation_sweeps_a_bounded_number_of_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = 100_000
    backend, clock = make_backend()
    await configure_many(backend, count, keep_alive=1)
    clock.now += 3
    pops = PopCounter(monkeypatch)
    for ops in range(1, count + 1):
        before, pops.count = len(backend._limiters), 0
        assert await backend.get_config("never-configured") is None
        assert pops.count <= MAX_SWEEP, f"operation {ops} popped {pops.count} entries"
        assert before - len(backend._limiters) <= MAX_SWEEP
        if not backend._limiters:
            break
    assert not backend._limiters
    assert ops >= count // MAX_SWEEP


@pytest.mark.slow
async def test_the_sweep_heap_stays_small_under_a_stream_of_grants() -> None:
    # keep_alive slides forward with every grant: that must not push a heap entry per grant.
    backend, clock = make_backend()
    config = RateLimiterConfig.build(OVERALL, 1_000_000, 1, keep_alive=2)
    for name in ("a", "b", "c"):
        assert await backend.set_rate(name, config, "set", False)
    for _ in range(10_000):
        clock.now += 0.001
        for name in ("a", "b", "c"):
            assert (await backend.try_acquire(name, 1)).granted
        assert len(backend._shared.heap) <= 6
    clock.now += 10
    for _ in range(10):
        assert await backend.get_config("never-configured") is None
    assert not backend._limiters
    assert not backend._shared.heap


async def test_the_sweep_heap_stays_bounded_when_expiries_keep_moving_earlier() -> None:
    # Every expire() brings the limiter's expiry earlier, which needs an earlier heap entry;
    # the superseded ones must not pile up.
    backend, clock = make_backend()
    assert await backend.set_rate("n", RateLimiterConfig.build(OVERALL, 5, 1), "set", False)
    for i in range(10_000):
        assert await backend.expire("n", 10**12 - i * 1_000)
        assert len(backend._shared.heap) <= 200
    clock.now += 10**6 + 1
    for _ in range(100):
        assert await backend.get_config("never-configured") is None
    assert not backend._limiters


async def test_the_sweep_heap_stays_bounded_when_a_limiter_is_deleted_and_recreated() -> None:
    backend, clock = make_backend()
    config = RateLimiterConfig.build(OVERALL, 5, 1, keep_alive=3600)
    for _ in range(10_000):
        clock.now += 0.001
        assert await backend.set_rate("n", config, "set", False)
        assert (await backend.try_acquire("n", 1)).granted
        assert await backend.delete("n")
        assert len(backend._shared.heap) <= 200
    assert await backend.get_config("never-configured") is None
    assert not backend._limiters


async def test_deleting_limiters_leaves_no_schedule_behind() -> None:
    backend, _ = make_backend()
    await configure_many(backend, 1_000, keep_alive=3600)
    assert await backend.get_config("never-configured") is None
    assert len(backend._shared.heap) == len(backend._shared.due) == 1_000
    for i in range(1_000):
        assert await backend.delete(f"n{i}")
    assert not backend._limiters
    assert not backend._shared.due
    assert not backend._shared.heap


# -- (5) a PER_CLIENT grant's cost does not grow with the number of clients ----------------------


class CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts the entries read by walking it (iteration, keys, values, items)."""

    walked = 0

    def __iter__(self) -> Any:
        for key in super().__iter__():
            CountingDict.walked += 1
            yield key

    def keys(self) -> Any:
        return list(iter(self))

    def values(self) -> Any:
        return [self[key] for key in iter(self)]

    def items(self) -> Any:
        return [(key, self[key]) for key in iter(self)]


@pytest.mark.parametrize("algorithm", ["SLIDING_WINDOW", "TOKEN_BUCKET", "FIXED_WINDOW"])
async def test_a_per_client_grant_walks_no_other_clients_state(algorithm: str) -> None:
    # A grant that scanned every budget and the whole registry would cost 276 us a call at
    # 5 000 live clients, 2.9 ms at 80 000: a client rotating addresses would stall the loop.
    backend, clock = make_backend()
    config = RateLimiterConfig.build(PER_CLIENT, "5/10s; 50/minute", algorithm=algorithm)
    other = RateLimiterConfig.build(OVERALL, 1000, 1)
    assert await backend.set_rate("api", config, "set", False)
    assert await backend.set_rate("other", other, "set", False)
    for i in range(5_000):
        clock.now += 0.002  # 10 s in all: the first clients' state expires meanwhile
        assert (await backend.with_client(f"c{i}").try_acquire("api", 1)).granted
    limiter = backend._limiters["api"]
    limiter.budgets = CountingDict(limiter.budgets)
    limiter.extra = CountingDict(limiter.extra)
    limiter.registry = CountingDict(limiter.registry)
    CountingDict.walked = 0
    for i in range(2_000):
        clock.now += 0.01  # 20 s: every client's state of the first round expires
        client = backend.with_client(f"new{i}" if i % 2 else f"c{i}")
        await client.try_acquire("api", 1)
        await backend.try_acquire("other", 1)  # another limiter in between: its schedule
        await client.available_permits("api")
        await client.release("api", 1)
    assert CountingDict.walked <= 2_000, f"{CountingDict.walked} entries of other clients read"
    # Clients leave the registry two longest intervals after their latest grant, a bounded
    # number per grant.
    assert len(limiter.registry) == 6_000
    clock.now += 121
    for i in range(200):
        await backend.with_client(f"late{i}").try_acquire("api", 1)
    assert set(limiter.registry) == {f"late{i}" for i in range(200)}
