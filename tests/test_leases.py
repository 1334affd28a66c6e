"""The concurrency limiter on every backend: memory (virtual time), fakeredis, a
real redis-server and Valkey. Leases, FIFO waiting, wake-ups, release, renewal and loss."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from conformance import now, tolerance, until

from aiolimit import (
    ConcurrencyConfig,
    ConcurrencyLimiter,
    InvalidArgumentError,
    LeaseLostError,
    NotConfiguredError,
    RateLimited,
)

LEASE = 30.0  # long: a waiter served within a fraction of it was woken, not timed out


async def limiter(store, name, max_in_flight=2, lease=LEASE):
    sem = ConcurrencyLimiter(name, store.backend())
    assert await sem.try_set_limit(max_in_flight, lease=lease)
    return sem


async def waiting(sem) -> int:
    snapshot = await sem.leases()
    return snapshot.waiting


# -- the limit --------------------------------------------------------------------------------


async def test_the_limit_is_set_read_updated_and_deleted(store, name):
    sem = ConcurrencyLimiter(name, store.backend())
    assert await sem.get_config() is None
    assert not await sem.update_limit(3)
    assert await sem.try_set_limit(3, lease=timedelta(seconds=5))
    assert not await sem.try_set_limit(4)
    assert await sem.get_config() == ConcurrencyConfig(3, timedelta(seconds=5))
    assert await sem.update_limit(4, lease=10)
    assert await sem.get_config() == ConcurrencyConfig(4, timedelta(seconds=10))
    assert await sem.delete()
    assert not await sem.delete()
    assert await sem.get_config() is None
    with pytest.raises(NotConfiguredError):
        await sem.try_lease()


async def test_an_expired_limiter_is_gone_and_clear_expire_keeps_it(store, name):
    sem = await limiter(store, name)
    assert await sem.expire(0.2)
    assert await sem.try_lease() is not None
    await asyncio.sleep(0.3)
    assert await sem.get_config() is None
    other = await limiter(store, name + "-kept")
    assert await other.expire(0.2)
    assert await other.clear_expire()
    await asyncio.sleep(0.3)
    assert await other.get_config() is not None


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, 2**31 + 1])
async def test_a_limit_out_of_range_is_refused(store, name, bad):
    with pytest.raises(InvalidArgumentError):
        await ConcurrencyLimiter(name, store.backend()).try_set_limit(bad)


async def test_more_permits_than_the_limit_are_refused(store, name):
    sem = await limiter(store, name, 2)
    with pytest.raises(InvalidArgumentError):
        await sem.try_lease(3)


# -- taking and giving back -------------------------------------------------------------------


async def test_at_most_the_limit_is_held_and_a_release_frees_a_slot(store, name):
    sem = await limiter(store, name, 2)
    first, second = await sem.try_lease(), await sem.try_lease()
    assert first is not None and second is not None
    assert await sem.try_lease() is None
    assert await first.release()
    third = await sem.try_lease()
    assert third is not None
    assert (await sem.leases()).in_flight == 2


async def test_a_second_release_frees_nothing_more(store, name):
    sem = await limiter(store, name, 2)
    first, second = await sem.try_lease(), await sem.try_lease()
    assert await first.release()
    assert not await first.release()
    assert not await store.backend().release_lease(name, first.id)  # by id, from anywhere
    assert (await sem.leases()).in_flight == 1  # the second still holds its slot
    assert await sem.try_lease() is not None
    assert await sem.try_lease() is None
    assert second is not None


async def test_a_release_after_expiry_reports_it_and_frees_no_one_elses_slot(store, name):
    sem = await limiter(store, name, 1, lease=0.2)
    stale = await sem.try_lease()
    await asyncio.sleep(0.3)
    fresh = await sem.try_lease()  # the expired slot came back
    assert fresh is not None
    assert not await stale.release()
    assert await sem.try_lease() is None  # the fresh holder still has it
    assert await fresh.release()


async def test_releasing_an_ended_lease_reports_false_before_anyone_reclaimed_it(store, name):
    sem = await limiter(store, name, 1, lease=0.2)
    stale = await sem.try_lease()
    await asyncio.sleep(0.3)
    assert not await stale.release()
    assert await sem.try_lease() is not None


async def test_a_lease_id_never_names_a_later_lease(store, name):
    sem = await limiter(store, name, 1)
    fences = []
    for _ in range(5):
        lease = await sem.try_lease()
        fences.append(lease.fence)
        assert await lease.release()
    assert fences == sorted(set(fences))
    assert not await store.backend().release_lease(name, f"1:{fences[-1] + 1}")


async def test_fences_grow_across_delete_and_a_new_limit(store, name):
    sem = await limiter(store, name, 1)
    before = await sem.try_lease()
    await sem.delete()
    await sem.try_set_limit(1)
    after = await sem.try_lease()
    assert after.fence > before.fence


async def test_a_lower_limit_admits_no_one_until_holders_are_under_it(store, name):
    sem = await limiter(store, name, 3)
    held = [await sem.try_lease() for _ in range(3)]
    await sem.set_limit(1)
    assert await sem.try_lease() is None
    assert await held[0].release() and await held[1].release()
    assert await sem.try_lease() is None  # 1 in flight, limit 1
    assert await held[2].release()
    for lease in held:
        assert not await lease.release()  # never below zero
    snapshot = await sem.leases()
    assert snapshot.in_flight == 0
    assert await sem.try_lease() is not None
    assert await sem.try_lease() is None


# -- waiting -----------------------------------------------------------------------------------


async def test_a_waiter_wakes_when_a_slot_is_freed(store, name):
    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.try_lease(timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    released_at = now()
    await held.release()
    lease = await waiter
    assert lease is not None
    assert now() - released_at < 1.0  # woken, not timed out (lease/3 = 10 s)


async def test_a_waiter_wakes_at_the_earliest_lease_expiry(store, name):
    sem = await limiter(store, name, 1, lease=0.5)
    held = await sem.try_lease()
    started = now()
    lease = await sem.try_lease(timeout=5)
    assert lease is not None and lease.fence > held.fence
    assert 0.3 <= now() - started < 2.0


async def test_a_lease_renewed_after_the_lease_time_was_lowered_ends_at_the_new_time(store, name):
    # The scripts skip reading the holders while no lease can have ended: a renewal under a
    # lowered lease time makes a lease end sooner than any they knew of.
    sem = await limiter(store, name, 1, lease=LEASE)
    held = await sem.try_lease()
    await sem.set_limit(1, lease=0.5)
    await held.renew()  # (then never again: its holder stopped)
    started = now()
    lease = await sem.try_lease(timeout=5)
    assert lease is not None and lease.fence > held.fence
    assert 0.3 <= now() - started < 2.0


async def test_a_two_permit_waiter_is_not_passed_by_one_permit_arrivals(store, name):
    sem = await limiter(store, name, 2)
    held = await sem.try_lease()
    big = asyncio.ensure_future(sem.try_lease(2, timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "the 2-permit waiter queued")
    assert await sem.try_lease() is None  # a slot is free, but the head needs 2
    small = asyncio.ensure_future(sem.try_lease(1, timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 2, "the 1-permit waiter queued")
    assert await sem.try_lease() is None  # (an attempt grants the queue's head if it fits)
    snapshot = await sem.leases()
    assert (snapshot.in_flight, snapshot.waiting) == (1, 2)  # the free slot stays free
    await held.release()
    big_lease = await big
    assert big_lease is not None and big_lease.permits == 2
    assert not small.done()
    await big_lease.release()
    small_lease = await small
    assert small_lease.fence > big_lease.fence


async def test_waiters_are_served_in_the_order_they_came(store, name):
    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiters = []
    for i in range(5):
        waiters.append(asyncio.ensure_future(sem.try_lease(timeout=LEASE)))
        await until(lambda: waiting(sem), lambda n, i=i: n == i + 1, "queued")
    await held.release()
    fences = []
    for waiter in waiters:
        lease = await waiter
        fences.append(lease.fence)
        await lease.release()
    assert fences == sorted(fences)


async def test_a_waiter_that_times_out_gets_none_and_leaves_no_ticket(store, name):
    sem = await limiter(store, name, 1)
    await sem.try_lease()
    assert await sem.try_lease(timeout=0.2) is None
    assert await waiting(sem) == 0


async def test_a_cancelled_waiter_leaves_no_ticket(store, name):
    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.try_lease(timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await until(lambda: waiting(sem), lambda n: n == 0, "the ticket gone")
    await held.release()
    assert await sem.try_lease() is not None  # nobody ahead


@pytest.mark.parametrize("store", ["memory", "redis"], indirect=True)  # (a lease in real time)
async def test_a_ticket_is_dropped_a_lease_time_after_its_waiters_last_call(store, name):
    # A waiter that stops calling (its process killed) leaves the queue a lease time after
    # its last call, be it its first, or its wait after it when shorter; one that calls
    # again keeps its place past that (the scripts keep no stamp of a first call).
    from aiolimit.backends._lease import new_ticket

    late = tolerance(store).late
    lease = 0.3 + 4 * late
    sem = await limiter(store, name, 1, lease=lease)
    backend = store.backend()
    held = await sem.try_lease()
    gone, kept, short = new_ticket(1), new_ticket(1), new_ticket(1)
    start = now()
    await backend.take_lease(name, 1, gone, None)  # (called once, waiting without end)
    await backend.take_lease(name, 1, kept, None)
    await backend.take_lease(name, 1, short, int(late * 1e6))  # (called once)

    async def at(offset: float) -> tuple[int | None, int]:
        await asyncio.sleep(start + offset - now())
        await held.renew()
        refusal = await backend.take_lease(name, 1, kept, None)
        return refusal.ahead, await waiting(sem)

    assert await at(2 * late) == (1, 2)  # short has gone, gone waits
    assert await at(lease - 2 * late) == (1, 2)  # gone still waits
    assert await at(lease + 2 * late) == (0, 1)  # gone has gone; kept called again
    await held.release()
    assert (await backend.take_lease(name, 1, kept, None)).granted


async def test_lease_raises_rate_limited_when_no_slot_comes_in_time(store, name):
    sem = await limiter(store, name, 1)
    await sem.try_lease()
    with pytest.raises(RateLimited):
        async with sem.lease(timeout=0.1):
            pass


# -- holding, renewing, losing ---------------------------------------------------------------


async def test_async_with_renews_the_lease_past_its_time_and_releases_it(store, name):
    sem = await limiter(store, name, 1, lease=0.3)
    async with sem.lease(timeout=0) as lease:
        await asyncio.sleep(1.0)
        assert await sem.try_lease() is None
    assert not lease.lost
    assert await sem.try_lease() is not None


async def test_renewing_a_lost_lease_raises_and_never_takes_it_again(store, name):
    sem = await limiter(store, name, 1, lease=0.2)
    lease = await sem.try_lease()
    await asyncio.sleep(0.3)
    with pytest.raises(LeaseLostError):
        await lease.renew()
    with pytest.raises(LeaseLostError):
        await lease.renew()
    assert lease.lost
    assert (await sem.leases()).in_flight == 0


async def test_a_lost_lease_cancels_the_body_with_lease_lost_error(store, name):
    sem = await limiter(store, name, 1, lease=0.3)
    reached = []
    with pytest.raises(LeaseLostError):
        async with sem.lease():
            await sem.delete()  # the store forgets the lease
            await asyncio.sleep(5)
            reached.append("end of body")
    assert reached == []


async def test_renewing_keeps_a_lease_held_past_its_time_for_async_with_after(store, name):
    sem = await limiter(store, name, 1, lease=0.3)
    lease = await sem.try_lease()
    assert lease is not None
    async with lease.renewing():  # a wait before the call: three lease times
        await asyncio.sleep(1.0)
        assert await sem.try_lease() is None
    assert not lease.lost and lease.expires_in > 0
    async with lease:  # the call: renewed again, released after
        await asyncio.sleep(1.0)
        assert await sem.try_lease() is None
    assert (await sem.leases()).in_flight == 0


async def test_a_lease_lost_while_renewing_cancels_the_block_with_lease_lost_error(store, name):
    sem = await limiter(store, name, 1, lease=0.3)
    lease = await sem.try_lease()
    assert lease is not None
    reached = []
    with pytest.raises(LeaseLostError):
        async with lease.renewing():
            await sem.delete()
            await asyncio.sleep(5)
            reached.append("end of block")
    assert reached == [] and lease.lost


# -- what a hand-over costs --------------------------------------------------------------------


@pytest.fixture
def attempts(store, monkeypatch) -> list[str]:
    """The tickets of every attempt the store's backend is sent (``take_lease``)."""
    sent: list[str] = []
    backend_type = type(store.backend())
    take = backend_type.take_lease

    async def counted(self, name, permits, ticket, max_wait_us):
        sent.append(ticket)
        return await take(self, name, permits, ticket, max_wait_us)

    monkeypatch.setattr(backend_type, "take_lease", counted)
    return sent


async def test_a_waiter_is_handed_its_lease_by_the_release_without_asking_again(
    store, name, attempts
):
    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.try_lease(timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    await held.release()
    lease = await waiter
    assert lease is not None and lease.fence > held.fence
    assert attempts[1:] == [attempts[1]], "the waiter asked again after it was woken"
    assert await lease.release()
    assert (await sem.leases()).in_flight == 0


async def test_a_waiter_in_another_process_is_handed_its_lease_through_its_wake_up(
    store, name, attempts, monkeypatch
):
    from aiolimit.backends import _lease

    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.try_lease(timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    monkeypatch.setattr(_lease, "_process", "another")  # the holder: another process
    released_at = now()
    await held.release()
    lease = await waiter
    assert lease is not None and lease.fence > held.fence
    assert now() - released_at < 1.0  # woken, not timed out (lease/3 = 10 s)
    assert attempts[1:] == [attempts[1]], "the waiter asked again after it was woken"
    assert await lease.release()
    assert (await sem.leases()).in_flight == 0


async def test_a_handed_over_lease_resumes_its_waiter_on_the_loops_next_turn(store, name):
    # The slot is idle until its waiter runs: a busy process takes a while over each turn of
    # its event loop, so the lease handed over wakes the waiter on the next one (not an
    # Event under wait_for, whose task and callbacks take three). On Redis it runs before
    # the releaser resumes (handed as the reply is read: test_lease_wakeups).
    sem = await limiter(store, name, 1)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.try_lease(timeout=LEASE))
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    await held.release()  # (handed over in its reply: this process's waiter)
    turns = 0
    while not waiter.done():
        await asyncio.sleep(0)
        turns += 1
    assert turns <= 1
    lease = waiter.result()
    assert lease is not None and lease.fence > held.fence
    await lease.release()


async def test_a_handed_over_lease_is_renewed_and_released_as_any_other(store, name):
    sem = await limiter(store, name, 1, lease=0.3)
    held = await sem.try_lease()
    waiter = asyncio.ensure_future(sem.lease(timeout=LEASE).__aenter__())
    await until(lambda: waiting(sem), lambda n: n == 1, "queued")
    await held.release()
    lease = await waiter
    await asyncio.sleep(1.0)  # three lease times, renewed in the background
    assert await sem.try_lease() is None
    await lease.__aexit__(None, None, None)
    assert not lease.lost
    snapshot = await sem.leases()
    assert (snapshot.in_flight, snapshot.waiting) == (0, 0)
    assert await sem.try_lease() is not None


async def test_a_refusal_counts_the_permits_queued_ahead_through_grants_and_departures(store, name):
    from aiolimit.backends._lease import new_ticket

    sem = await limiter(store, name, 3)
    backend = store.backend()
    held = await sem.try_lease(3)
    tickets = [new_ticket(p) for p in (1, 2, 1, 3)]
    for i, ticket in enumerate(tickets):  # queued, waiting without end
        refusal = await backend.take_lease(name, int(ticket[0]), ticket, None)
        assert refusal.ahead == [0, 1, 3, 4][i]
    assert await backend.cancel_ticket(name, tickets[1])  # 2 permits leave
    await backend.take_lease(name, 1, tickets[2], 0)  # gives up: 1 more
    await held.release()  # the head (1 permit) is granted; the 3-permit ticket does not fit
    late = new_ticket(1)
    refusal = await backend.take_lease(name, 1, late, None)
    assert refusal.ahead == 3  # the 3-permit ticket still waits
    again = await backend.take_lease(name, 1, late, None)  # stamped again: counted
    assert again.ahead == 3


async def test_many_tasks_at_once_never_hold_more_than_the_limit_and_each_lease_is_its_own(
    store, name
):
    # Attempts and releases made at the same time share round trips (one lease_many call).
    sem = await limiter(store, name, 2)
    held, most, fences = 0, 0, []

    async def worker() -> None:
        nonlocal held, most
        for _ in range(4):
            lease = await sem.try_lease(timeout=LEASE)
            assert lease is not None
            held += 1
            most = max(most, held)
            fences.append(lease.fence)
            await asyncio.sleep(0.002)
            held -= 1
            assert await lease.release()

    await asyncio.gather(*(worker() for _ in range(12)))
    assert most == 2
    assert len(set(fences)) == len(fences) == 48
    snapshot = await sem.leases()
    assert (snapshot.in_flight, snapshot.waiting) == (0, 0)
