"""The concurrency limiter against a real redis-server, adversarially: a holder
killed with SIGKILL, a holder whose event loop freezes past its lease, FLUSHALL mid-lease,
client clocks an hour off, and 8 processes audited from the holders' own stamps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from aiolimit import ConcurrencyLimiter, LeaseLostError, RedisBackend
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
