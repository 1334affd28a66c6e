"""One acquisition of rate permits and concurrency slots (issue 31): ``acquire_all`` with a
ConcurrencyLimiter beside RateLimiters, on every backend (memory in virtual time, fakeredis,
a real redis-server, Valkey). All or nothing; leaving ``async with`` frees the slot and keeps
the rate permits spent; ``release()`` before the call hands everything back; a cancelled
caller leaves nothing held; a lost lease cancels the body."""

from __future__ import annotations

import asyncio

import pytest
from conformance import cancelled, until

from aiolimit import (
    ConcurrencyLimiter,
    InFlight,
    InvalidArgumentError,
    LeaseLostError,
    Observer,
    RateLimited,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    acquire_all,
    observe,
)

LEASE = 30.0


async def limiters(store, name, rate=1, interval=60, slots=1, lease=LEASE):
    backend = store.backend()
    rpm = RateLimiter(name + "-rpm", backend)
    await rpm.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, interval))
    sem = ConcurrencyLimiter(name + "-sem", backend)
    assert await sem.try_set_limit(slots, lease=lease)
    return rpm, sem


async def in_flight(sem) -> int:
    return (await sem.leases()).in_flight


async def waiting(sem) -> int:
    return (await sem.leases()).waiting


async def test_a_granted_acquisition_holds_the_slot_and_spends_the_rate(store, name):
    rpm, sem = await limiters(store, name)
    acquired = await acquire_all([(rpm, 1), (sem, 1)])
    assert acquired
    assert isinstance(acquired, InFlight)
    assert [lease.permits for lease in acquired.leases] == [1]
    assert await in_flight(sem) == 1
    assert not await rpm.try_acquire()
    await acquired.release()


async def test_a_rate_refusal_frees_the_slot_it_took(store, name):
    rpm, sem = await limiters(store, name)
    assert await rpm.try_acquire()  # the rate is spent
    acquired = await acquire_all([(rpm, 1), (sem, 1)], timeout=0.5)
    assert not acquired
    assert acquired.refused_by is None
    assert acquired.leases == ()
    assert 50 < acquired.retry_after <= 60
    assert await in_flight(sem) == 0
    assert await sem.try_lease() is not None  # the slot is free


async def test_no_slot_within_the_timeout_spends_no_rate_permit(store, name):
    rpm, sem = await limiters(store, name)
    holder = await sem.try_lease()
    assert holder is not None
    acquired = await acquire_all([(rpm, 1), (sem, 1)], timeout=0.3)
    assert not acquired
    assert acquired.refused_by == sem.name
    with pytest.raises(RateLimited) as refused:
        async with acquired:
            pass
    assert refused.value.name == sem.name
    assert await waiting(sem) == 0  # no ticket left behind
    assert await rpm.try_acquire()  # the rate permit was never taken
    assert await in_flight(sem) == 1  # only the holder's


async def test_leaving_async_with_frees_the_slot_and_keeps_the_rate_spent(store, name):
    rpm, sem = await limiters(store, name)
    async with await acquire_all([(rpm, 1), (sem, 1)]) as acquired:
        assert await in_flight(sem) == 1
        assert acquired.granted
    assert await in_flight(sem) == 0
    assert not await rpm.try_acquire()  # the call was made: its permit stays spent
    assert not await acquired.leases[0].release()  # released already


async def test_release_before_the_call_hands_everything_back(store, name):
    rpm, sem = await limiters(store, name)
    acquired = await acquire_all([(rpm, 1), (sem, 1)])
    assert acquired
    await acquired.release()
    assert await in_flight(sem) == 0
    assert await rpm.try_acquire()  # the rate grant went back by its member
    again = await acquire_all([(sem, 1)])
    assert again
    await again.release()


async def test_a_caller_cancelled_while_queued_for_the_slot_leaves_nothing(store, name):
    rpm, sem = await limiters(store, name)
    holder = await sem.try_lease()
    assert holder is not None
    waiter = asyncio.ensure_future(acquire_all([(rpm, 1), (sem, 1)], timeout=None))
    await until(lambda: waiting(sem), lambda n: n == 1, "the waiter queued")
    await cancelled(waiter)
    await until(lambda: waiting(sem), lambda n: n == 0, "the ticket withdrawn")
    assert await holder.release()
    assert await in_flight(sem) == 0
    assert await rpm.try_acquire()


async def test_a_caller_cancelled_while_its_rate_reservation_is_slept_out_leaves_nothing(
    store, name
):
    rpm, sem = await limiters(store, name, rate=1, interval=10)
    assert await rpm.try_acquire()  # the next permit is 10 s away: a reservation
    waiter = asyncio.ensure_future(acquire_all([(rpm, 1), (sem, 1)], timeout=None))
    await until(lambda: in_flight(sem), lambda n: n == 1, "the slot taken")
    await asyncio.sleep(0.05)  # (asleep on the reservation)
    await cancelled(waiter)
    await until(lambda: in_flight(sem), lambda n: n == 0, "the slot released")
    assert await rpm.wait_time(1) <= 10  # the reservation went back: no later than before


async def test_the_rate_waits_only_what_is_left_of_the_timeout(store, name):
    rpm, sem = await limiters(store, name, rate=1, interval=1)
    assert await rpm.try_acquire()  # the next permit in 1 s
    holder = await sem.try_lease()
    assert holder is not None
    releasing = asyncio.get_running_loop().call_later(
        0.6, lambda: asyncio.ensure_future(holder.release())
    )
    # The slot comes after 0.6 s; the rate permit would need 0.4 s more, past 0.8 s.
    acquired = await acquire_all([(rpm, 1), (sem, 1)], timeout=0.8)
    releasing.cancel()
    assert not acquired
    assert acquired.refused_by is None  # the rate refused, with the time left
    assert await in_flight(sem) == 0


async def test_a_lost_lease_cancels_the_body_with_lease_lost_error(store, name):
    rpm, sem = await limiters(store, name, lease=0.3)
    reached = []
    with pytest.raises(LeaseLostError):
        async with await acquire_all([(rpm, 1), (sem, 1)]):
            await sem.delete()  # the store forgets the lease
            await asyncio.sleep(5)
            reached.append("end of body")
    assert reached == []
    assert not await rpm.try_acquire()  # the call began: its permit stays spent


async def test_slots_alone_and_several_concurrency_limiters(store, name):
    backend = store.backend()
    first = ConcurrencyLimiter(name + "-b", backend)
    second = ConcurrencyLimiter(name + "-a", backend)
    assert await first.try_set_limit(1)
    assert await second.try_set_limit(2)
    acquired = await acquire_all([(first, 1), (second, 2)])
    assert acquired
    assert sorted(lease.permits for lease in acquired.leases) == [1, 2]
    refused = await acquire_all([(second, 1), (first, 1)])
    assert not refused  # second has a slot, first has none: nothing taken
    assert await in_flight(second) == 2
    await acquired.release()
    assert await in_flight(first) == await in_flight(second) == 0


async def test_a_concurrency_limiter_twice_or_a_stranger_is_refused(store, name):
    rpm, sem = await limiters(store, name)
    with pytest.raises(InvalidArgumentError):
        await acquire_all([(rpm, 1), (sem, 1), (ConcurrencyLimiter(sem.name, sem.backend), 1)])
    with pytest.raises(InvalidArgumentError):
        await acquire_all([(rpm, 1), (object(), 1)])
    with pytest.raises(InvalidArgumentError):
        await acquire_all([(sem, 0)])
    assert await in_flight(sem) == 0


async def test_the_observer_sees_the_grant_and_the_lease(store, name):
    rpm, sem = await limiters(store, name)
    seen: list[tuple[str, str]] = []

    class Seen(Observer):
        def granted(self, name, permits, waited):
            seen.append(("granted", name))

        def leased(self, name, permits, waited):
            seen.append(("leased", name))

    previous = observe(Seen())
    try:
        acquired = await acquire_all([(rpm, 1), (sem, 1)])
    finally:
        observe(previous)
    assert seen == [("leased", sem.name), ("granted", rpm.name)]
    await acquired.release()


# -- a slot held while the rate permit is slept out (issue 35, item 3) ------------------------

SHORT_LEASE = 0.3  # shorter than the rate's wait: renewed, or lost, meanwhile


async def test_a_slot_held_while_the_rate_is_slept_out_is_renewed_and_never_shared(store, name):
    rpm, sem = await limiters(store, name, rate=1, interval=1, lease=SHORT_LEASE)
    assert await rpm.try_acquire()  # the next permit in 1 s: three lease times away
    first = asyncio.ensure_future(acquire_all([(rpm, 1), (sem, 1)], timeout=None))
    await until(lambda: in_flight(sem), lambda n: n == 1, "the slot taken")
    second = asyncio.ensure_future(sem.try_lease(timeout=None))
    acquired = await first
    assert acquired
    assert not second.done()  # the slot never changed hands while the first slept
    lease = acquired.leases[0]
    assert lease.expires_in > 0
    await lease.renew()  # still held in the store: not lost, not another's
    async with acquired:
        assert await in_flight(sem) == 1
        assert not second.done()
    taken = await asyncio.wait_for(second, 5)
    assert taken is not None
    await taken.release()


async def test_two_slots_the_first_renewed_while_waiting_for_the_second(store, name):
    backend = store.backend()
    first = ConcurrencyLimiter(name + "-a", backend)
    second = ConcurrencyLimiter(name + "-b", backend)
    assert await first.try_set_limit(1, lease=SHORT_LEASE)
    assert await second.try_set_limit(1, lease=LEASE)
    holder = await second.try_lease()
    assert holder is not None
    asyncio.get_running_loop().call_later(1, lambda: asyncio.ensure_future(holder.release()))
    acquiring = asyncio.ensure_future(acquire_all([(first, 1), (second, 1)], timeout=None))
    await until(lambda: in_flight(first), lambda n: n == 1, "the first slot taken")
    rival = asyncio.ensure_future(first.try_lease(timeout=None))
    acquired = await acquiring
    assert acquired
    assert not rival.done()  # the first slot was kept while the second was awaited
    for lease in acquired.leases:
        await lease.renew()
    await acquired.release()
    taken = await asyncio.wait_for(rival, 5)
    assert taken is not None
    await taken.release()


async def test_a_slot_lost_while_the_rate_is_slept_out_raises_and_hands_the_rate_back(store, name):
    rpm, sem = await limiters(store, name, rate=1, interval=10, lease=SHORT_LEASE)
    assert await rpm.try_acquire()  # the next permit in 10 s: a reservation
    acquiring = asyncio.ensure_future(acquire_all([(rpm, 1), (sem, 1)], timeout=None))
    await until(lambda: in_flight(sem), lambda n: n == 1, "the slot taken")
    await sem.delete()  # the store forgets the lease: its next renewal finds it lost
    assert await sem.try_set_limit(1, lease=SHORT_LEASE)
    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(acquiring, 5)
    assert await rpm.wait_time(1) <= 10  # the reservation went back: no later than before
    assert await in_flight(sem) == 0
    lease = await sem.try_lease(timeout=0)
    assert lease is not None
    await lease.release()
