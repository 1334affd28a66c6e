"""How a waiter learns that a release in another process handed it a slot, on redis-server
and Valkey: a message on its process's wake channel (pub/sub), no BLPOP; promptly; and when
a message is lost (the subscriber reconnecting, a message dropped) the lease still comes, at
once after the reconnection, else at the waiter's next look."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conformance import until
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from aiolimit import ConcurrencyLimiter, Lease, RedisBackend
from aiolimit.backends._lease import process_id
from aiolimit.backends.redis import _wakeups
from aiolimit.backends.redis._functions import function_name
from aiolimit.backends.redis._leases import lease_keys
from tools import LocalRedis

ELSEWHERE = "elsewhere"  # (another process's name in a release: its waiters are not ours)


@pytest.fixture(params=["redis_server", "valkey_server"])
def server(request: pytest.FixtureRequest) -> LocalRedis:
    return request.getfixturevalue(request.param)


@pytest.fixture
async def redis(server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    await client.flushall()
    yield client
    await client.aclose()


async def release_elsewhere(backend: RedisBackend, name: str, lease: Lease) -> Any:
    """Releases ``lease`` as a process other than this one would: the waiters it hands the
    slot to are woken through their wake channel, not in the reply."""
    keys = lease_keys(backend.keys(name))
    function = function_name("lease_release")
    return await backend.redis.fcall(function, len(keys), *keys, lease.id, ELSEWHERE)


async def subscribers(redis: Redis, backend: RedisBackend, name: str) -> int:
    channel = f"{backend.keys(name).tag}:wake:{process_id()}"
    return dict(await redis.pubsub_numsub(channel)).get(channel.encode(), 0)


async def queued_waiter(
    redis: Redis, name: str, lease_s: float = 30.0
) -> tuple[RedisBackend, ConcurrencyLimiter, Lease, asyncio.Task[Lease | None]]:
    """A limit of 1 held; a waiter queued behind it, its process subscribed to its wake
    channel."""
    backend = RedisBackend(redis)
    sem = ConcurrencyLimiter(name, backend)
    await sem.try_set_limit(1, lease=lease_s)
    holder = await sem.try_lease()
    assert holder is not None
    waiter = asyncio.create_task(sem.try_lease(timeout=20))

    async def waiting() -> int:
        snapshot = await sem.leases()
        return 0 if snapshot is None else snapshot.waiting

    await until(waiting, lambda n: n == 1, "the waiter queued")
    await until(lambda: subscribers(redis, backend, name), lambda n: n == 1, "subscribed")
    return backend, sem, holder, waiter


async def test_a_slot_handed_to_another_process_wakes_it_by_pub_sub_without_a_blpop(redis, name):
    backend, _, holder, waiter = await queued_waiter(redis, name)
    await redis.config_resetstat()
    loop = asyncio.get_running_loop()
    freed = loop.time()
    await release_elsewhere(backend, name, holder)
    lease = await asyncio.wait_for(waiter, 5)
    took = loop.time() - freed
    stats = await redis.info("commandstats")
    calls = {command.removeprefix("cmdstat_"): int(row["calls"]) for command, row in stats.items()}
    assert calls.get("blpop", 0) == 0 and calls.get("lpush", 0) == 0, calls
    assert calls.get("publish", 0) == 1, calls
    assert calls.get("fcall", 0) == 1, calls  # (the release: the waiter did not ask again)
    assert took < 0.5, f"woken after {took:.3f} s"
    assert lease is not None and lease.fence > holder.fence
    await lease.renew()  # (the lease the message carried is the one held)
    await lease.release()


async def test_a_wake_up_heard_resumes_its_waiter_on_the_loops_next_turn(redis, name, monkeypatch):
    # From the message read off the wake channel to the waiter holding its lease: the next
    # turn of the event loop, no round trip (the message carries the lease and its fence).
    loop = asyncio.get_running_loop()
    waiters: list[asyncio.Task[Lease | None]] = []
    turns: asyncio.Future[int] = loop.create_future()
    wake = _wakeups._wake

    def noted(message: Any) -> None:
        wake(message)
        count = 0

        def turn() -> None:  # (once a turn, from the one after the message on)
            nonlocal count
            count += 1
            if waiters[0].done():
                turns.set_result(count)
            else:
                loop.call_soon(turn)

        loop.call_soon(turn)

    monkeypatch.setattr(_wakeups, "_wake", noted)
    backend, _, holder, waiter = await queued_waiter(redis, name)
    waiters.append(waiter)
    await release_elsewhere(backend, name, holder)
    assert await asyncio.wait_for(turns, 5) == 1
    lease = waiter.result()
    assert lease is not None and lease.fence > holder.fence
    await lease.renew()
    await lease.release()


async def test_a_slot_released_here_runs_its_waiter_here_before_the_releaser_resumes(redis, name):
    # The release's reply hands the lease to the waiter of this process as soon as it is
    # read, before the releasing task is resumed: the next holder runs first (its slot is
    # idle meanwhile), the releaser's own next steps after it.
    _, _, holder, waiter = await queued_waiter(redis, name)
    assert await holder.release()
    assert waiter.done()  # (no turn of the loop since the release returned)
    lease = waiter.result()
    assert lease is not None and lease.fence > holder.fence
    await lease.release()


async def test_a_release_whose_caller_was_cancelled_still_hands_its_slot_to_a_waiter_here(
    redis, name
):
    # The release ran; its caller is gone, but the reply that names this process's waiter
    # still wakes it (else the lease sat granted until the waiter's next look: 10 s here).
    _, _, holder, waiter = await queued_waiter(redis, name)
    releasing = asyncio.create_task(holder.release())
    await asyncio.sleep(0)  # (its request made)
    releasing.cancel()
    lease = await asyncio.wait_for(waiter, 2)
    assert lease is not None and lease.fence > holder.fence
    await lease.release()


async def test_the_wake_channel_is_read_again_only_once_the_waiter_it_woke_has_run(
    redis, name, monkeypatch
):
    # The reader hands the lease over and lets the waiter run before it sets up its next
    # read (redis-py's, a few dozen µs of Python): the slot's next holder first.
    waiters: list[asyncio.Task[Lease | None]] = []
    woke: list[bool] = []
    seen: list[bool] = []  # (whether the waiter had run when the channel was read again)
    wake, get_message = _wakeups._wake, PubSub.get_message

    def noted(message: Any) -> None:
        wake(message)
        woke.append(True)

    async def reading(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        if woke and not seen:
            seen.append(waiters[0].done())
        return await get_message(self, *args, **kwargs)

    monkeypatch.setattr(_wakeups, "_wake", noted)
    monkeypatch.setattr(PubSub, "get_message", reading)
    backend, _, holder, waiter = await queued_waiter(redis, name)
    waiters.append(waiter)
    await release_elsewhere(backend, name, holder)
    lease = await asyncio.wait_for(waiter, 5)
    await until(lambda: asyncio.sleep(0, len(seen)), lambda n: n == 1, "read again")
    assert seen == [True]
    assert lease is not None
    await lease.release()


async def test_wake_ups_that_arrive_together_resume_their_waiters_on_one_turn(redis, name):
    # Two slots freed by one round trip elsewhere: both messages come in one read, and both
    # waiters run on the same turn (their holds end together, and their releases go as one
    # call), not one turn apart.
    backend = RedisBackend(redis)
    sem = ConcurrencyLimiter(name, backend)
    await sem.try_set_limit(2, lease=30)
    holders = [await sem.try_lease(), await sem.try_lease()]
    waiters = [asyncio.create_task(sem.try_lease(timeout=20)) for _ in range(2)]

    async def waiting() -> int:
        snapshot = await sem.leases()
        return 0 if snapshot is None else snapshot.waiting

    await until(waiting, lambda n: n == 2, "both queued")
    await until(lambda: subscribers(redis, backend, name), lambda n: n == 1, "subscribed")
    loop = asyncio.get_running_loop()
    ticks, finished = 0, []

    def tick() -> None:  # (counts the loop's turns)
        nonlocal ticks
        ticks += 1
        if len(finished) < 2:
            loop.call_soon(tick)

    for waiter in waiters:
        waiter.add_done_callback(lambda _: finished.append(ticks))
    keys = lease_keys(backend.keys(name))
    function = function_name("lease_release")
    pipe = redis.pipeline(transaction=False)
    for holder in holders:
        assert holder is not None
        pipe.fcall(function, len(keys), *keys, holder.id, ELSEWHERE)
    loop.call_soon(tick)
    await pipe.execute()
    leases = await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert len(finished) == 2 and finished[0] == finished[1], finished
    for lease in leases:
        assert lease is not None
        await lease.release()


async def test_a_wake_up_sent_while_the_subscriber_reconnects_is_not_lost(redis, name):
    # The message is published to nobody while the subscriber's connection is down; once
    # it is subscribed again, the waiters of its channels ask (and collect the grant), long
    # before their next look (a third of the 30 s lease).
    backend, sem, holder, waiter = await queued_waiter(redis, name)
    await redis.client_kill_filter(_type="pubsub")
    await until(lambda: subscribers(redis, backend, name), lambda n: n == 0, "cut off")
    loop = asyncio.get_running_loop()
    freed = loop.time()
    await release_elsewhere(backend, name, holder)
    lease = await asyncio.wait_for(waiter, 8)
    took = loop.time() - freed
    assert lease is not None and lease.fence > holder.fence
    await lease.renew()
    assert took < 3.0, f"woken after {took:.3f} s"
    assert (await sem.leases()).waiting == 0
    await lease.release()


async def test_a_wake_up_heard_but_lost_with_the_connection_is_asked_for_once_reconnected(
    redis, name, monkeypatch
):
    # The server counted the subscriber as hearing it, but the message went with the
    # connection (dropped here): subscribed again, the waiter asks and collects its lease,
    # long before its next look.
    drop = monkeypatch.setattr
    drop(_wakeups, "woken", lambda message: ("not-a-ticket", None))
    backend, _, holder, waiter = await queued_waiter(redis, name)
    loop = asyncio.get_running_loop()
    freed = loop.time()
    await release_elsewhere(backend, name, holder)
    await asyncio.sleep(0.1)  # (heard, and dropped)
    monkeypatch.undo()
    assert not waiter.done()
    await redis.client_kill_filter(_type="pubsub")
    lease = await asyncio.wait_for(waiter, 8)
    took = loop.time() - freed
    assert lease is not None and lease.fence > holder.fence
    await lease.renew()
    assert took < 3.0, f"woken after {took:.3f} s"
    await lease.release()


async def test_a_lost_wake_up_is_made_good_by_the_waiters_next_look(redis, name, monkeypatch):
    # A message that never arrives (dropped here): the waiter asks again at its next look
    # (a third of the lease), and collects the lease granted to it meanwhile.
    monkeypatch.setattr(_wakeups, "woken", lambda message: ("not-a-ticket", None))
    lease_s = 1.5
    backend, _, holder, waiter = await queued_waiter(redis, name, lease_s)
    loop = asyncio.get_running_loop()
    freed = loop.time()
    await release_elsewhere(backend, name, holder)
    lease = await asyncio.wait_for(waiter, 5)
    took = loop.time() - freed
    assert lease is not None and lease.fence > holder.fence
    assert took < lease_s / 3 + 0.3, f"woken after {took:.3f} s"
    await lease.release()


async def test_a_process_with_no_waiters_left_is_not_subscribed(redis, name):
    backend, _, holder, waiter = await queued_waiter(redis, name)
    await holder.release()  # (handed in the reply: this process's waiter)
    lease = await asyncio.wait_for(waiter, 5)
    assert lease is not None
    await until(lambda: subscribers(redis, backend, name), lambda n: n == 0, "unsubscribed")
    await lease.release()
    await backend.aclose()


async def test_waiters_that_come_and_go_one_after_another_subscribe_once(redis, name):
    # Each waiter is the process's only one: the subscriber stays subscribed past the last
    # waiter (a while), so the next finds the channel heard, no new connection made.
    backend, sem, holder, waiter = await queued_waiter(redis, name)
    await redis.config_resetstat()
    for _ in range(5):
        await release_elsewhere(backend, name, holder)
        lease = await asyncio.wait_for(waiter, 5)
        assert lease is not None
        holder, waiter = lease, asyncio.create_task(sem.try_lease(timeout=20))
        await until(
            sem.leases, lambda snapshot: snapshot is not None and snapshot.waiting == 1, "queued"
        )
    await release_elsewhere(backend, name, holder)
    lease = await asyncio.wait_for(waiter, 5)
    assert lease is not None
    stats = await redis.info("commandstats")
    calls = {command.removeprefix("cmdstat_"): int(row["calls"]) for command, row in stats.items()}
    assert calls.get("subscribe", 0) == 0 and calls.get("hello", 0) == 0, calls
    assert calls.get("lpush", 0) == 0 and calls.get("publish", 0) == 6, calls
    await lease.release()
    await backend.aclose()


async def test_a_user_the_acl_denies_the_channels_is_woken_through_its_wake_list(server, name):
    # An ACL line from before the wake channels: the refused subscription wakes the waiter
    # to ask, and from then on the process's waiters are woken through their wake list.
    from aiolimit.backends.redis._acl import acl_rules

    admin = Redis.from_url(server.url)
    version = (await admin.info("server"))["redis_version"].split(".")
    rules = acl_rules(password="pw", server=(int(version[0]), int(version[1])))
    older = [rule for rule in rules if not rule.startswith("&")]
    newer = {"+subscribe", "+unsubscribe", "+publish", "+lpop"}
    await admin.execute_command("ACL", "SETUSER", "older", *(r for r in older if r not in newer))
    user = Redis(port=server.port, username="older", password="pw")
    try:
        backend = RedisBackend(user)
        sem = ConcurrencyLimiter(name, backend)
        await sem.try_set_limit(1, lease=30)
        holder = await sem.try_lease()
        first = await sem.try_lease(timeout=0.5)  # (subscribing is refused meanwhile)
        assert first is None
        assert backend.make_ticket(1).endswith(":h")
        waiter = asyncio.create_task(sem.try_lease(timeout=20))
        await until(lambda: sem.leases(), lambda snapshot: snapshot.waiting == 1, "queued")
        loop = asyncio.get_running_loop()
        freed = loop.time()
        await release_elsewhere(backend, name, holder)
        lease = await asyncio.wait_for(waiter, 5)
        assert lease is not None and loop.time() - freed < 0.5
        await lease.release()
    finally:
        await user.aclose()
        await admin.execute_command("ACL", "DELUSER", "older")
        await admin.aclose()
