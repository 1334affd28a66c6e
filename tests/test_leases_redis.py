"""The concurrency limiter against a real redis-server, adversarially: a holder
killed with SIGKILL, a holder whose event loop freezes past its lease, FLUSHALL mid-lease,
client clocks an hour off, and 8 processes audited from the holders' own stamps."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conformance import until
from redis.asyncio import Redis

from aiolimit import ConcurrencyLimiter, LeaseLostError, RedisBackend
from aiolimit.backends._lease import new_ticket
from aiolimit.backends.redis._leases import lease_keys
from tools import LocalRedis
from tools.leases import HolderStamp, most_in_flight, out_of_order

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def redis(redis_server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


async def said(process: asyncio.subprocess.Process, within: float = 20.0) -> dict[str, Any]:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), within)
    assert line, "the holder ended without a word"
    return json.loads(line)


async def start(mode: str, url: str, name: str, *args: Any) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.leases", mode, url, name, *map(str, args),
        stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip


async def test_a_killed_holders_slot_comes_back_within_the_lease_and_not_before(
    redis_server, redis, name
):
    lease_s = 1.0
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(1, lease=lease_s)
    process = await start("hold", redis_server.url, name)
    held = await said(process)
    os.kill(process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    await process.wait()
    lease = await sem.try_lease(timeout=10)
    granted_at = time.monotonic()
    assert lease is not None and lease.fence > held["fence"]
    # Not before: the lease ran at least lease_s from its grant (before "held"); within:
    # its last renewal was before the kill.
    assert granted_at >= held["at"] + lease_s - 0.05
    assert granted_at <= killed_at + lease_s + 0.5


async def test_a_frozen_holder_loses_its_lease_and_its_body_is_cancelled(redis_server, redis, name):
    lease_s = 0.6
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(1, lease=lease_s)
    process = await start("freeze", redis_server.url, name, lease_s, 2.0)
    held = await said(process)
    lease = await sem.try_lease(timeout=10)  # while the holder's loop is frozen
    assert lease is not None and lease.fence > held["fence"]
    assert time.monotonic() < held["at"] + 2.0
    async with lease:  # renewed while the frozen holder wakes up
        ended = await said(process)
        assert ended["event"] == "lost"
        await process.wait()
        await lease.renew()  # the new holder's lease is untouched
    assert not lease.lost


async def test_flushall_mid_lease_raises_lease_lost_and_later_fences_are_higher(redis, name):
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(1, lease=0.6)
    reached = []
    with pytest.raises(LeaseLostError):
        async with sem.lease() as lost:
            await redis.flushall()
            await asyncio.sleep(3)
            reached.append("end of body")
    assert reached == [] and lost.lost
    await sem.try_set_limit(1, lease=0.6)
    later = await sem.try_lease()
    assert later is not None and later.fence > lost.fence


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
async def test_a_client_clock_an_hour_off_changes_nothing(redis, name, monkeypatch, skew):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    skewed = RedisBackend(redis, clock=lambda: real() + skew)
    other = RedisBackend(redis, clock=lambda: real() - skew)
    sem, peer = ConcurrencyLimiter(name, skewed), ConcurrencyLimiter(name, other)
    await sem.try_set_limit(1, lease=0.5)
    first = await sem.try_lease()
    started = time.monotonic()
    assert await peer.try_lease() is None
    second = await peer.try_lease(timeout=5)  # the first is not renewed: it ends in 0.5 s
    assert 0.4 <= time.monotonic() - started <= 1.5
    assert second.fence > first.fence
    with pytest.raises(LeaseLostError):
        await first.renew()
    await second.renew()
    snapshot = await sem.leases()
    assert 0.3e6 <= snapshot.holders[0].expires_in <= 0.5e6


@pytest.mark.slow
async def test_eight_processes_never_exceed_the_limit_and_keep_fifo_order(
    redis_server, redis, name
):
    most, rounds, tasks = 3, 6, 2
    processes = [
        await start("audit", redis_server.url, name, most, 5.0, rounds, tasks) for _ in range(8)
    ]
    stamps = []
    for process in processes:
        assert process.stdout is not None
        for line in (await asyncio.wait_for(process.stdout.read(), 120)).splitlines():
            fields = json.loads(line)
            del fields["event"]
            stamps.append(HolderStamp(**fields))
        assert await process.wait() == 0
    assert len(stamps) == 8 * rounds * tasks
    assert most_in_flight(stamps) == most  # the limit, reached and never passed
    assert len({s.fence for s in stamps}) == len(stamps)
    assert sum(s.queued is not None for s in stamps) > len(stamps) // 2  # most waited
    assert out_of_order(stamps) == []


async def test_a_free_slot_is_leased_at_once_with_a_timeout(redis, name):
    # The first try_lease(timeout>0) of a process, a slot free: it closed its waiter by
    # waiting for the waker's BLPOP to end, which the client library lets go of only when
    # its block is up: about a second for a slot that was free all along.
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(2)
    loop = asyncio.get_running_loop()
    began = loop.time()
    lease = await sem.try_lease(timeout=5)
    took = loop.time() - began
    assert lease is not None
    await lease.release()
    assert took < 0.5, f"a free slot took {took:.3f} s"


def _wait_for_a_slot(url: str, name: str, granted_at: Any) -> None:
    """A forked worker: waits for one slot of ``name`` and says when it got it (monotonic)."""

    async def wait() -> None:
        redis = Redis.from_url(url)
        lease = await ConcurrencyLimiter(name, RedisBackend(redis)).try_lease(timeout=30)
        granted_at.put(time.monotonic())
        assert lease is not None
        await lease.release()
        await redis.aclose()

    asyncio.run(wait())


async def test_workers_forked_after_the_import_are_each_woken_when_their_slot_frees(
    redis_server, redis, name
):
    # gunicorn --preload, a multiprocessing fork pool: workers forked after aiolimit was
    # imported shared the id their wake-ups are addressed by, so each popped the others'
    # off one list (a list served last in, first out: all 4 here) and a worker whose slot
    # came woke only at its own next look, up to a third of the lease later.
    fork = multiprocessing.get_context("fork")
    granted_at = fork.Queue()
    workers = 4
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(workers, lease=6)
    processes = []

    async def waiting() -> int:
        snapshot = await sem.leases()
        return 0 if snapshot is None else snapshot.waiting

    async with sem.lease(workers):
        for count in range(1, workers + 1):  # (queued in this order)
            process = fork.Process(
                target=_wait_for_a_slot, args=(redis_server.url, name, granted_at)
            )
            process.start()
            processes.append(process)
            await until(waiting, lambda n, count=count: n >= count, f"{count} queued", 20)
        freed_at = time.monotonic()
    took = [await asyncio.to_thread(granted_at.get, True, 20) - freed_at for _ in processes]
    for process in processes:
        await asyncio.to_thread(process.join, 20)
        assert process.exitcode == 0
    assert max(took) < 0.4, [f"{t:.3f} s" for t in took]


def _say_wake_id(said: Any) -> None:
    said.put(new_ticket(1).split(":")[1])


def test_a_forked_process_draws_its_own_wake_up_id():
    fork = multiprocessing.get_context("fork")
    said = fork.Queue()
    processes = [fork.Process(target=_say_wake_id, args=(said,)) for _ in range(3)]
    for process in processes:
        process.start()
    ids = {said.get(timeout=20) for _ in processes}
    for process in processes:
        process.join(20)
    assert len(ids | {new_ticket(1).split(":")[1]}) == 4


async def test_a_contended_lease_costs_at_most_two_script_calls_and_no_wake_up_in_one_process(
    redis, name
):
    # A waiter is queued by its one attempt; the release that frees its slot grants it the
    # lease and, the waiter being in the releasing process, answers it in its own reply: no
    # attempt to collect it, no wake-up through the list.
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    await sem.try_set_limit(2, lease=30)
    tasks, rounds = 8, 5

    async def worker() -> None:
        for _ in range(rounds):
            lease = await sem.try_lease(timeout=None)
            assert lease is not None
            await asyncio.sleep(0.002)
            assert await lease.release()

    await redis.config_resetstat()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    stats = await redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
    scripts = sum(calls.get(command, 0) for command in ("fcall", "evalsha", "eval"))
    assert scripts <= 2 * tasks * rounds, calls
    assert calls.get("lpush", 0) == 0, calls


async def test_a_lease_handed_over_in_the_queue_costs_at_most_12_redis_commands_in_its_scripts(
    redis, name
):
    # A contended limiter's turns: a waiter queued by one attempt, granted by the holder's
    # release (in its reply), and so on: two script calls a lease, the commands they run
    # counted (TIME, the state read and written once each; no separate key for grants to
    # keep and drop; a waiter's first attempt writes its ticket once, to the queue, with no
    # stamp to write then and drop at the grant).
    backend = RedisBackend(redis)
    sem = ConcurrencyLimiter(name, backend)
    await sem.try_set_limit(1, lease=30)
    holder = await sem.try_lease()
    assert holder is not None

    async def turn(held: str) -> str:
        ticket = backend.make_ticket(1)
        waiter = backend.lease_waiter(name, ticket)
        assert not (await backend.take_lease(name, 1, ticket, None)).granted
        assert await backend.release_lease(name, held)
        grant = waiter.grant  # (handed in the release's reply: nothing to wait for)
        assert grant is not None
        await waiter.aclose()
        return grant.lease_id

    held = await turn(holder.id)  # (what may have ended read once: the bounds kept)
    await redis.config_resetstat()
    for _ in range(4):
        held = await turn(held)
    stats = await redis.info("commandstats")
    calls = {command.removeprefix("cmdstat_"): int(row["calls"]) for command, row in stats.items()}
    scripts = sum(calls.pop(command, 0) for command in ("fcall", "evalsha", "eval"))
    inside = sum(
        n for command, n in calls.items() if command not in ("info", "config|resetstat", "hello")
    )
    assert scripts == 2 * 4 and inside <= 12 * 4, (inside, sorted(calls.items()))
    assert await backend.release_lease(name, held)


async def test_a_queued_attempt_reads_neither_holders_nor_tickets_while_none_can_have_ended(
    redis, name
):
    # Every holder's lease and every ticket ends at least a lease time on: the scripts keep
    # when the first may (hdue, tdue) and read T:holders or T:tickets only from then on.
    backend = RedisBackend(redis)
    sem = ConcurrencyLimiter(name, backend)
    await sem.try_set_limit(1, lease=30)
    assert await sem.try_lease() is not None
    tickets = [backend.make_ticket(1) for _ in range(3)]
    assert not (await backend.take_lease(name, 1, tickets[0], None)).granted  # (bounds kept)
    await redis.config_resetstat()
    for ticket in tickets[1:]:
        refusal = await backend.take_lease(name, 1, ticket, None)
        assert not refusal.granted and 29e6 < refusal.retry_in <= 30e6
    stats = await redis.info("commandstats")
    calls = {command.removeprefix("cmdstat_"): int(row["calls"]) for command, row in stats.items()}
    assert calls.get("zrange", 0) == 0 and calls.get("zrangebyscore", 0) == 0, calls
    for ticket in tickets:
        await backend.cancel_ticket(name, ticket)


async def test_a_holder_an_older_version_granted_is_reclaimed_when_its_lease_ends(redis, name):
    # An older version's scripts grant without lowering the bound (hdue): the fence they
    # move tells the bound is stale, and the holders are read again.
    backend = RedisBackend(redis)
    sem = ConcurrencyLimiter(name, backend)
    await sem.try_set_limit(2, lease=30)
    assert await sem.try_lease() is not None  # (hdue: 30 s on)
    sem_key, holders = lease_keys(backend.keys(name))[:2]
    now_us = int(time.time() * 1e6)
    fence = int(await redis.hget(sem_key, "fence")) + 1
    await redis.zadd(holders, {f"1:{fence}": now_us + 300_000})  # (a lease of 0.3 s)
    await redis.hset(sem_key, mapping={"fence": fence, "used": 2})
    started = time.monotonic()
    lease = await sem.try_lease(timeout=5)
    assert lease is not None and lease.fence > fence
    assert time.monotonic() - started < 2.0
