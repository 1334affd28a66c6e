"""Heavy and hostile scenarios on a real redis-server: what each one costs Redis, and whether it
works at all.

    python benchmarks/stress.py              # 100 000 PER_CLIENT clients; about 1.5 minutes
    python benchmarks/stress.py --quick      # 20 000 PER_CLIENT clients; under a minute
    python benchmarks/stress.py --redis redis://127.0.0.1:6379 --json
    python benchmarks/stress.py --only queue # or window, clients (repeatable)

Starts its own redis-server on a free 127.0.0.1 port (stopped at the end) unless ``--redis``
is given, runs the scenarios below through aiolimit's public API, one after another, and
prints one table (``--json``: the same figures as JSON). Progress goes to stderr.

Server time comes from the slow log: while a figure is measured ``slowlog-log-slower-than``
is 0 and ``slowlog-max-len`` 1 000 000 (both restored afterwards), and "longest script" is the
longest EVAL/EVALSHA logged meanwhile. Redis 7 also logs every command a script runs, which
makes a command-heavy script some 20-30% slower than unobserved; the log is summed up by a
script on the server, since reading 500 000 entries here would take longer than the test.
"Server time of one acquire" is the median of 9 single calls, one at a time.

The limiters run on ``redis.asyncio.Redis.from_url(url)`` as a user would create it, so
redis-py's own defaults apply (in redis-py 8 a socket timeout of 5 s: calls answered by a
script that blocks Redis longer fail, and the table says so). The measuring client and the
PING process have no socket timeout, so a stalled server shows in full.

1. Deep queue: an OVERALL limiter of 100 per 1 s; 5 000 tasks call ``acquire()`` at once, so
   all but 100 get reservations up to 49 s ahead; once every task has its grant (ZCARD of the
   permits zset, or: reservations still ahead + tasks already done) all are cancelled and
   their reservations handed back. Reported: the time to queue them, the longest script
   meanwhile, the latency of a PING sent every 1 ms by another process on its own
   connection, and the server time of one more acquire() behind 10 and behind the 5 000.
2. Big window: 1 000 000 per hour on one budget, filled with 200 000 single-permit grants
   (try_acquire from 64 tasks): the server time of one acquire at 1 000 and at 200 000 grants
   in the window, and MEMORY USAGE of the permits zset per grant.
3. PER_CLIENT admin at scale: rate 10 per 60 s; N clients (100 000, ``--quick`` 20 000) take
   a permit each, then expire(3600), clear_expire(), update_rate(20/60), set_rate(10/60) and
   delete() act on all of them (wall time, outcome, longest script). set_rate clears every
   client, so the clients take a permit again before delete(); then the keys left (SCAN).
   Last, update_rate and delete over N clients while another task brings 1 000 new client
   ids per second.

A scenario that fails is reported with its error and the next one runs; one that outlives its
deadline (``--deadline``, 120 s) is reported as timed out. A server left busy by a script gets
SCRIPT KILL, and our own server is restarted when that does not help.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import multiprocessing
import os
import platform
import secrets
import sys
import time
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis as AsyncRedis

import aiolimit
from aiolimit import LimiterError, NotConfiguredError, RateLimiter, RateType, RedisBackend
from tools import LocalRedis, cpu_model

PREFIX = "aiolimit:"
DEADLINE = 120.0  # seconds per scenario
OP_TIMEOUT = 60.0  # seconds per admin call in scenario 3
SETTLE = 30.0  # seconds to wait for a state to be reached (all queued, all handed back, ...)
QUEUE_RATE, QUEUE_TASKS, QUEUE_SHALLOW = 100, 5_000, 10
WINDOW_RATE, WINDOW_GRANTS, WINDOW_SMALL, WINDOW_TASKS = 1_000_000, 200_000, 1_000, 64
CLIENT_RATE, CLIENT_RATE_UPDATED, CLIENT_INTERVAL = 10, 20, 60
CLIENTS, QUICK_CLIENTS, CHUNK = 100_000, 20_000, 1_000
CHURN_PER_SECOND = 1_000
SLOWLOG_LEN = 1_000_000
PROBES = 9  # single calls timed for "server time of one acquire": the median is reported


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0] if text else ''}".strip()
    return message if len(message) <= 160 else message[:157] + "..."


def backend_for(redis: Any) -> RedisBackend:
    """RedisBackend(redis), with a generous timeout where the backend takes one."""
    extra: dict[str, Any] = {}
    if "timeout" in inspect.signature(RedisBackend).parameters:
        extra["timeout"] = 30.0
    return RedisBackend(redis, **extra)


def permits_key(name: str) -> str:
    return f"{PREFIX}{{{name}}}:permits"


# -- results ------------------------------------------------------------------------------------


@dataclass
class Measure:
    key: str
    label: str
    value: Any
    unit: str = ""
    text: str | None = None  # the table's wording, when the value alone does not say it


@dataclass
class Scenario:
    key: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    phase: str = "starting"
    status_line: Callable[[], str] | None = None
    measures: list[Measure] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    _said: tuple[str, float] = ("", 0.0)

    def put(
        self, key: str, label: str, value: Any, unit: str = "", text: str | None = None
    ) -> None:
        self.measures.append(Measure(key, label, value, unit, text))

    # progress on stderr
    def enter(self, phase: str, status: Callable[[], str] | None = None) -> None:
        self.phase, self.status_line = phase, status
        self.say(phase)

    def say(self, text: str) -> None:
        now = time.monotonic()
        self._said = (text, now)
        print(f"  [{self.key}] {now - self.began:6.1f} s  {text}", file=sys.stderr, flush=True)

    async def ticker(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            text = self.phase
            if self.status_line is not None:
                with contextlib.suppress(Exception):
                    text = f"{self.phase}: {self.status_line()}"
            last, when = self._said
            if text != last or time.monotonic() - when >= 5.0:
                self.say(text)


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        text = str(value)
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
        text = f"{value:,.{digits}f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


# -- the server's view: slow log, keys, idleness -------------------------------------------------


@dataclass
class Scripts:
    calls: int = 0
    longest_ms: float | None = None
    total_ms: float = 0.0


# Sums up the slow log on the server: Redis 7 also logs every command a script runs, so the
# log of one call over 100 000 clients holds 500 000 entries, too many to read and parse
# here in time. This script's own EVAL (its source starts with MARK) is left out.
MARK = "-- stress.py slowlog"
SUMMARY = f"""{MARK}
local n, longest, total = 0, 0, 0
for _, e in ipairs(redis.call('SLOWLOG', 'GET', ARGV[1])) do
  local args = e[4]
  local name = string.upper(tostring(args[1]))
  local ours = string.find(tostring(args[2] or ''), '{MARK}', 1, true) == 1
  if (name == 'EVAL' or name == 'EVALSHA') and not ours then
    n = n + 1
    total = total + e[3]
    longest = math.max(longest, e[3])
  end
end
return {{n, longest, total}}
"""


def _is_script(entry: dict[str, Any]) -> bool:
    command = entry.get("command", b"")
    if isinstance(command, str):
        command = command.encode()
    name = command.split(b" ", 1)[0].upper()
    return name in (b"EVAL", b"EVALSHA") and not command.startswith(b"EVAL " + MARK.encode())


class ServerLog:
    """The slow log around one measured window: every command logged, scripts picked out."""

    def __init__(self, admin: AsyncRedis) -> None:
        self.admin = admin
        self.on = False
        self.saved: dict[str, str] = {}
        self.result: Scripts | None = None

    async def __aenter__(self) -> ServerLog:
        try:
            got = await self.admin.config_get("slowlog-*")
            self.saved = {k: str(got[k]) for k in ("slowlog-log-slower-than", "slowlog-max-len")}
            await self.admin.config_set("slowlog-max-len", SLOWLOG_LEN)
            await self.admin.config_set("slowlog-log-slower-than", 0)
            await self.admin.slowlog_reset()
            self.on = True
        except redis_errors.RedisError as exc:
            print(f"  slow log unavailable: {one_line(exc)}", file=sys.stderr)
        return self

    async def scripts(self, count: int = SLOWLOG_LEN) -> Scripts:
        if not self.on:
            return Scripts()
        await wait_idle(self.admin)
        try:
            calls, longest, total = await self.admin.eval(SUMMARY, 0, count)
        except redis_errors.ResponseError:  # SLOWLOG refused in scripts: read it here
            durations = [
                int(e["duration"]) for e in await self.admin.slowlog_get(count) if _is_script(e)
            ]
            calls, longest, total = len(durations), max(durations, default=0), sum(durations)
        return Scripts(int(calls), int(longest) / 1000 if calls else None, int(total) / 1000)

    async def stop(self) -> Scripts:
        if self.result is None:
            self.result = await self.scripts()
            await self._restore()
        return self.result

    async def _restore(self) -> None:
        if self.on:
            self.on = False
            for name, value in self.saved.items():
                await self.admin.config_set(name, value)
            await self.admin.slowlog_reset()

    async def __aexit__(self, *exc: object) -> None:
        if self.result is None:
            with contextlib.suppress(redis_errors.RedisError):
                await asyncio.wait_for(self._restore(), 10)


async def wait_idle(admin: AsyncRedis, timeout: float = SETTLE) -> None:
    """Waits while the server answers BUSY (a script is running past busy-reply-threshold)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await admin.ping()
            return
        except redis_errors.ResponseError as exc:
            if "BUSY" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = SETTLE) -> None:
    """Polls ``check`` until it holds; a server answering BUSY (a long script) is "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except redis_errors.ResponseError as exc:
            if "BUSY" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout:.0f} s")
        await asyncio.sleep(0.005)


async def count_keys(admin: AsyncRedis, name: str) -> int:
    return sum([1 async for _ in admin.scan_iter(match=f"{PREFIX}{{{name}}}*", count=10_000)])


async def future_grants(admin: AsyncRedis, key: str) -> tuple[int, int]:
    """(grants in the log, grants scored after the server's now: reservations still ahead)."""
    async with admin.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.zcard(key)
        (seconds, micros), log = await pipe.execute()
    ahead = await admin.zcount(key, f"({seconds * 1_000_000 + micros}", "+inf")
    return int(log), int(ahead)


async def settle(
    admin: AsyncRedis, key: str, done: Callable[[int, int], bool], timeout: float = SETTLE
) -> tuple[float, int, int]:
    """Waits for hand-backs: until ``done(log, ahead)``, or until the log has not changed for a
    second (a reservation whose caller's call failed has no one to hand it back). Returns the
    seconds until it was done (or last changed), the grants in the log, the reservations ahead.
    """
    began = time.monotonic()
    last, changed = -1, began
    while True:
        try:
            log, ahead = await future_grants(admin, key)
        except redis_errors.ResponseError as exc:
            if "BUSY" not in str(exc):
                raise
        else:
            now = time.monotonic()
            if log != last:
                last, changed = log, now
            if done(log, ahead):
                return now - began, log, ahead
            if now - changed >= 1.0:
                return changed - began, log, ahead
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"hand-backs on {key}: not settled in {timeout:.0f} s")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def clients(url: str) -> AsyncIterator[tuple[AsyncRedis, AsyncRedis]]:
    """The limiters' Redis client, and an admin client of its own for measuring."""
    redis = AsyncRedis.from_url(url)
    # No socket timeout: a measurement waits out a long script instead of failing.
    admin = AsyncRedis.from_url(url, decode_responses=True, socket_timeout=None)
    try:
        yield redis, admin
    finally:
        for client in (redis, admin):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), 5)


async def stop_tasks(tasks: list[asyncio.Task[Any]], timeout: float = 10.0) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


# -- PING every 1 ms, from another process on its own connection ---------------------------------


def _ping_loop(url: str, stop: Any, ready: Any, pending: Any, out: Any) -> None:
    client = Redis.from_url(url, socket_timeout=None)  # a stalled server shows in full
    client.ping()
    ready.set()
    samples, errors, busy = array("d"), 0, 0
    next_at = time.monotonic()
    while not stop.is_set():
        began = time.monotonic()
        pending.value = began
        try:
            client.ping()
        except redis_errors.RedisError as exc:
            errors += 1
            busy += "BUSY" in str(exc)  # a script running past busy-reply-threshold
        pending.value = 0.0
        now = time.monotonic()
        samples.append((now - began) * 1000)
        next_at = max(next_at + 0.001, now)
        time.sleep(max(0.0, next_at - now))
    out.send((samples.tobytes(), errors, busy))


_pingers: set[Pinger] = set()


class Pinger:
    """A process that sends PING every 1 ms (after the previous reply) and times the replies."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop, self._ready = context.Event(), context.Event()
        self._pending = context.Value("d", 0.0)
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_ping_loop,
            args=(url, self._stop, self._ready, self._pending, send),
            daemon=True,
        )

    def start(self) -> None:
        _pingers.add(self)
        self._process.start()
        if not self._ready.wait(30):
            self.stop()
            raise RuntimeError("the PING process did not start")

    def stop(self) -> dict[str, Any]:
        """Latency in ms: p50, p99, max (a PING still unanswered counts with its age)."""
        _pingers.discard(self)
        self._stop.set()
        samples, errors, busy = array("d"), 0, 0
        if self._process.pid is not None and self._receive.poll(10):
            raw, errors, busy = self._receive.recv()
            samples.frombytes(raw)
        stuck = self._pending.value
        if stuck:
            samples.append((time.monotonic() - stuck) * 1000)
        self._process.join(2)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(2)
        ordered = sorted(samples)
        if not ordered:
            return {"pings": 0, "errors": errors, "busy": busy, "p50_ms": None, "p99_ms": None}
        return {
            "pings": len(ordered),
            "errors": errors,
            "busy": busy,
            "p50_ms": ordered[len(ordered) // 2],
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max_ms": ordered[-1],
        }


# -- 1. deep queue ------------------------------------------------------------------------------


def median(samples: list[float]) -> float | None:
    return sorted(samples)[len(samples) // 2] if samples else None


async def probe(admin: AsyncRedis, limiter: RateLimiter) -> tuple[float | None, int, int]:
    """Server time (ms) of one acquire() behind everything in the log, which is then cancelled
    (its reservation handed back): the median of PROBES such single calls. Also returns the
    grants in the log and the reservations ahead when the probing began."""
    key = permits_key(limiter.name)
    log, ahead = await future_grants(admin, key)
    samples: list[float] = []
    for _ in range(PROBES):
        async with ServerLog(admin) as server:
            if not server.on:
                break
            task = asyncio.ensure_future(limiter.acquire())
            try:

                async def logged(
                    task: asyncio.Task[None] = task, server: ServerLog = server
                ) -> bool:
                    return task.done() or (await server.scripts(20)).calls > 0

                await until(logged, "the probe's acquire")
                longest = (await server.stop()).longest_ms
                if longest is not None:
                    samples.append(longest)
                before = int(await admin.zcard(key))
            finally:
                await stop_tasks([task])

        def handed_back(log: int, _: int, before: int = before) -> bool:
            # The hand-back removes the probe's grant (and reclaims expired ones, if any).
            return log < before

        await settle(admin, key, handed_back)
    return median(samples), log, ahead


async def deep_queue(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    async with clients(url) as (redis, admin):
        backend = backend_for(redis)
        tasks: list[asyncio.Task[Any]] = []
        try:
            # One acquire behind a short queue: 100 granted now, 10 reserved.
            sc.enter(f"one acquire behind {QUEUE_SHALLOW} queued reservations")
            shallow = RateLimiter(f"stress-queue-short-{args.token}", backend)
            await shallow.set_rate(RateType.OVERALL, QUEUE_RATE, 1)
            tasks = [
                asyncio.ensure_future(shallow.acquire()) for _ in range(QUEUE_RATE + QUEUE_SHALLOW)
            ]
            key = permits_key(shallow.name)

            async def short_queued() -> bool:
                return int(await admin.zcard(key)) >= QUEUE_RATE + QUEUE_SHALLOW

            await until(short_queued, "the short queue")
            short_ms, short_log, short_ahead = await probe(admin, shallow)
            await stop_tasks(tasks)
            await settle(admin, key, lambda _, ahead: ahead == 0)
            sc.put(
                "acquire_depth_10_ms",
                f"server time of one acquire() behind {short_ahead:,} queued "
                f"({short_log:,} grants in the log)",
                short_ms,
                "ms",
            )

            # 5 000 at once.
            limiter = RateLimiter(f"stress-queue-{args.token}", backend)
            await limiter.set_rate(RateType.OVERALL, QUEUE_RATE, 1)
            key = permits_key(limiter.name)
            seen = {"log": 0, "ahead": 0, "done": 0}
            sc.enter(
                "starting the PING process (every 1 ms, own connection)",
            )
            pinger = Pinger(url)
            await asyncio.to_thread(pinger.start)
            try:
                sc.enter(
                    f"{QUEUE_TASKS:,} tasks call acquire() at once",
                    lambda: (
                        f"{seen['log']:,} grants in the log, {seen['ahead']:,} reservations "
                        f"ahead, {seen['done']:,} tasks done"
                    ),
                )
                async with ServerLog(admin) as server:
                    began = time.monotonic()
                    tasks = [asyncio.ensure_future(limiter.acquire()) for _ in range(QUEUE_TASKS)]

                    async def all_queued() -> bool:
                        # Done first: a task done by now is not among the reservations ahead
                        # read next, so none is counted twice.
                        seen["done"] = sum(t.done() for t in tasks)
                        seen["log"], seen["ahead"] = await future_grants(admin, key)
                        return (
                            seen["log"] >= QUEUE_TASKS
                            or seen["ahead"] + seen["done"] >= QUEUE_TASKS
                        )

                    await until(all_queued, f"{QUEUE_TASKS:,} grants", args.deadline)
                    queued_s = time.monotonic() - began
                    scripts = await server.stop()
                failed = [
                    exc
                    for t in tasks
                    if t.done() and not t.cancelled() and (exc := t.exception()) is not None
                ]
                sc.put(
                    "queue_ms", f"time to queue {QUEUE_TASKS:,} acquire()", queued_s * 1000, "ms"
                )
                sc.put(
                    "queue_longest_script_ms",
                    "longest script while queueing",
                    scripts.longest_ms,
                    "ms",
                    f"{fmt(scripts.longest_ms, 'ms')} ({scripts.calls:,} script calls, "
                    f"{fmt(scripts.total_ms, 'ms')} in all)",
                )
                if failed:
                    sc.put(
                        "queue_errors",
                        "acquire() calls that raised",
                        len(failed),
                        text=f"{len(failed):,}, e.g. {one_line(failed[0])}",
                    )

                sc.enter(f"one acquire behind the {QUEUE_TASKS:,}")
                deep_ms, deep_log, deep_ahead = await probe(admin, limiter)
                sc.put(
                    "acquire_depth_5000_ms",
                    f"server time of one acquire() behind {deep_ahead:,} queued "
                    f"({deep_log:,} grants in the log)",
                    deep_ms,
                    "ms",
                )
                if deep_ms is not None and short_ms:
                    sc.put("acquire_depth_ratio", "ratio deep / short", deep_ms / short_ms, "x")

                sc.enter("cancelling every task; waiting for the hand-backs")
                before, ahead = await future_grants(admin, key)
                await stop_tasks(tasks)
                # The hand-backs are the only scripts now.
                seconds, log, left = await settle(
                    admin, key, lambda _, ahead: ahead == 0, args.deadline
                )
                sc.put(
                    "hand_back",
                    f"cancel all ({ahead:,} reservations ahead): hand-backs",
                    {"ms": seconds * 1000, "removed": before - log, "never_handed_back": left},
                    text=f"{before - log:,} grants removed in {fmt(seconds * 1000, 'ms')}"
                    + (
                        f"; {left:,} reservations never handed back (no caller left)"
                        if left
                        else ""
                    ),
                )
            finally:
                ping = await asyncio.to_thread(pinger.stop)
                sc.put(
                    "ping",
                    "PING every 1 ms from another connection: p50 / p99 / max",
                    ping,
                    text=f"{fmt(ping['p50_ms'])} / {fmt(ping['p99_ms'])} / "
                    f"{fmt(ping.get('max_ms'))} ms ({ping['pings']:,} pings, "
                    f"{ping['errors']:,} errors, {ping['busy']:,} of them BUSY)",
                )
        finally:
            await stop_tasks(tasks)


# -- 2. big window ------------------------------------------------------------------------------


async def big_window(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    async with clients(url) as (redis, admin):
        limiter = RateLimiter(f"stress-window-{args.token}", backend_for(redis))
        key = permits_key(limiter.name)
        await limiter.set_rate(RateType.OVERALL, WINDOW_RATE, 3600)
        counts = {"asked": 0, "granted": 0}

        async def fill(total: int) -> None:
            async def worker() -> None:
                while counts["asked"] < total:
                    counts["asked"] += 1
                    granted = await limiter.try_acquire()
                    counts["granted"] += granted

            await asyncio.gather(*(worker() for _ in range(WINDOW_TASKS)))

        async def one() -> tuple[float | None, int]:
            """The median server time of PROBES single try_acquire() calls, one at a time."""
            log = int(await admin.zcard(key))
            samples: list[float] = []
            for _ in range(PROBES):
                async with ServerLog(admin) as server:
                    if not server.on:
                        break
                    await limiter.try_acquire()
                    longest = (await server.stop()).longest_ms
                if longest is not None:
                    samples.append(longest)
            return median(samples), log

        def status() -> str:
            return f"{counts['granted']:,} granted of {counts['asked']:,} asked"

        sc.enter(f"filling to {WINDOW_SMALL:,} grants", status)
        await fill(WINDOW_SMALL)
        small_ms, small_log = await one()
        sc.put(
            "acquire_1k_ms",
            f"server time of one acquire, {small_log:,} grants in the window",
            small_ms,
            "ms",
        )
        sc.enter(f"filling to {WINDOW_GRANTS:,} grants ({WINDOW_TASKS} tasks)", status)
        began = time.monotonic()
        await fill(WINDOW_GRANTS)
        seconds = time.monotonic() - began
        sc.put(
            "fill_grants_per_s",
            f"filling: try_acquire() from {WINDOW_TASKS} tasks",
            (WINDOW_GRANTS - WINDOW_SMALL) / seconds,
            "grants/s",
        )
        big_ms, big_log = await one()
        sc.put(
            "acquire_200k_ms",
            f"server time of one acquire, {big_log:,} grants in the window",
            big_ms,
            "ms",
        )
        if small_ms and big_ms is not None:
            sc.put("acquire_ratio", "ratio 200k / 1k", big_ms / small_ms, "x")
        grants = int(await admin.zcard(key))
        size = int(await admin.memory_usage(key, samples=0) or 0)
        sc.put(
            "bytes_per_grant",
            "MEMORY USAGE of the permits zset per grant",
            size / max(grants, 1),
            "bytes",
            f"{size / max(grants, 1):.1f} bytes ({size:,} bytes / {grants:,} grants)",
        )
        refused = counts["asked"] - counts["granted"]
        if refused:
            sc.put("refused", "try_acquire() refused (should be none)", refused)


# -- 3. PER_CLIENT admin at scale ---------------------------------------------------------------


async def per_client(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    n = args.clients
    async with clients(url) as (redis, admin):
        backend = backend_for(redis)
        name = f"stress-clients-{args.token}"
        limiter = RateLimiter(name, backend)

        async def take(count: int) -> int:
            """Clients user-0 .. user-<count - 1> take a permit each, 1 000 at a time."""
            done = {"taken": 0, "granted": 0}
            sc.enter(
                f"{count:,} clients take a permit",
                lambda: f"{done['taken']:,} / {count:,} ({done['granted']:,} granted)",
            )
            for start in range(0, count, CHUNK):
                granted = await asyncio.gather(
                    *(
                        RateLimiter(name, backend.with_client(f"user-{i}")).try_acquire()
                        for i in range(start, min(start + CHUNK, count))
                    )
                )
                done["taken"] += len(granted)
                done["granted"] += sum(granted)
            return done["granted"]

        async def admin_call(
            key: str,
            label: str,
            call: Callable[[], Awaitable[Any]],
            after: Callable[[], None] | None = None,
        ) -> bool:
            """Times one call over every client: wall time, outcome, longest script."""
            sc.enter(label)
            async with ServerLog(admin) as server:
                began = time.monotonic()
                try:
                    result = await asyncio.wait_for(call(), OP_TIMEOUT)
                    ok, outcome = True, f"ok (returned {result})"
                except (asyncio.TimeoutError, TimeoutError):
                    ok, outcome = False, f"timed out after {OP_TIMEOUT:.0f} s"
                except Exception as exc:
                    ok, outcome = False, f"FAILED: {one_line(exc)}"
                wall_ms = (time.monotonic() - began) * 1000
                if after is not None:
                    after()
                scripts = await server.stop()
            sc.put(
                key,
                label,
                {
                    "ok": ok,
                    "outcome": outcome,
                    "wall_ms": wall_ms,
                    "longest_script_ms": scripts.longest_ms,
                },
                text=f"{outcome}; {fmt(wall_ms, 'ms')} wall, longest script "
                f"{fmt(scripts.longest_ms, 'ms')}",
            )
            sc.say(f"{label}: {outcome}")
            return ok

        await limiter.set_rate(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL)
        granted = await take(n)
        sc.put("clients", "clients with a permit", granted)
        await admin_call("expire", f"expire(3600) over {n:,} clients", lambda: limiter.expire(3600))
        await admin_call("clear_expire", "clear_expire()", limiter.clear_expire)
        await admin_call(
            "update_rate",
            f"update_rate(PER_CLIENT, {CLIENT_RATE_UPDATED}, {CLIENT_INTERVAL})",
            lambda: limiter.update_rate(RateType.PER_CLIENT, CLIENT_RATE_UPDATED, CLIENT_INTERVAL),
        )
        await admin_call(
            "set_rate",
            f"set_rate(PER_CLIENT, {CLIENT_RATE}, {CLIENT_INTERVAL})",
            lambda: limiter.set_rate(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL),
        )
        registered = int(await admin.zcard(f"{PREFIX}{{{name}}}:clients"))
        if registered < n:  # set_rate cleared them: give delete() its N clients back
            await take(n)
            registered = int(await admin.zcard(f"{PREFIX}{{{name}}}:clients"))
        await admin_call("delete", f"delete() over {registered:,} clients", limiter.delete)
        sc.enter("counting the keys left (SCAN)")
        left = await count_keys(admin, name)
        sc.put("keys_left", "keys with the limiter's prefix left after delete()", left)

        # update_rate and delete while 1 000 new client ids arrive per second.
        sc.enter("clearing the keys left")
        await purge(admin, name)
        await limiter.set_rate(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL)
        await take(n)
        stop = asyncio.Event()
        churned = {"new": 0, "granted": 0, "deleted": 0, "errors": 0, "ms": 0}
        errors: Counter[str] = Counter()
        churn = asyncio.ensure_future(newcomers(name, backend, stop, churned, errors))
        try:
            sc.enter(f"{CHURN_PER_SECOND:,} new clients/s for 1 s first")
            await asyncio.sleep(1.0)
            ok_update = await admin_call(
                "churn_update_rate",
                f"update_rate over {n:,} clients, {CHURN_PER_SECOND:,} new clients/s",
                lambda: limiter.update_rate(
                    RateType.PER_CLIENT, CLIENT_RATE_UPDATED, CLIENT_INTERVAL
                ),
            )
            ok_delete = await admin_call(
                "churn_delete",
                f"delete over {n:,}+ clients, {CHURN_PER_SECOND:,} new clients/s",
                limiter.delete,
                after=stop.set,  # no newcomers once the limiter is gone
            )
        finally:
            stop.set()
            await asyncio.wait([churn], timeout=10)
            churn.cancel()
        seconds = max(churned["ms"] / 1000, 1e-3)
        sc.put(
            "churn",
            "new clients meanwhile (1 s before update_rate, until delete returned)",
            {**churned, "errors_by_message": dict(errors)},
            text=f"{churned['new']:,} in {seconds:.1f} s ({churned['new'] / seconds:,.0f}/s): "
            f"{churned['granted']:,} granted, {churned['deleted']:,} found the limiter deleted, "
            f"{churned['errors']:,} other errors"
            + "".join(f"; {count:,} x {message}" for message, count in errors.most_common(2)),
        )
        sc.put(
            "churn_both_ok",
            "update_rate and delete both succeed under churn",
            ok_update and ok_delete,
        )


async def newcomers(
    name: str,
    backend: RedisBackend,
    stop: asyncio.Event,
    counts: dict[str, int],
    errors: Counter[str],
) -> None:
    """A new client id takes a permit every 1 ms (1 000 per second), until ``stop``."""
    pending: set[asyncio.Task[bool]] = set()

    async def one(client: str) -> bool:
        try:
            granted = await RateLimiter(name, backend.with_client(client)).try_acquire()
        except NotConfiguredError:  # asked while (or after) delete() ran
            counts["deleted"] += 1
            return False
        except LimiterError as exc:
            counts["errors"] += 1
            errors[one_line(exc)] += 1
            return False
        counts["granted"] += granted
        return granted

    began = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - began) * CHURN_PER_SECOND)
        while counts["new"] < due:
            task = asyncio.ensure_future(one(f"new-{counts['new']}"))
            pending.add(task)
            task.add_done_callback(pending.discard)
            counts["new"] += 1
        await asyncio.sleep(0.005)
    counts["ms"] = round((time.monotonic() - began) * 1000)
    if pending:
        await asyncio.wait(pending, timeout=5)


async def purge(admin: AsyncRedis, name: str) -> None:
    batch: list[str] = []
    async for key in admin.scan_iter(match=f"{PREFIX}{{{name}}}*", count=10_000):
        batch.append(key)
        if len(batch) >= 1_000:
            await admin.unlink(*batch)
            batch = []
    if batch:
        await admin.unlink(*batch)


# -- running the scenarios, bounded -------------------------------------------------------------

Body = Callable[[Scenario, str, argparse.Namespace], Awaitable[None]]


async def _bounded(sc: Scenario, body: Body, url: str, args: argparse.Namespace) -> None:
    ticker = asyncio.ensure_future(sc.ticker())
    task = asyncio.ensure_future(body(sc, url, args))
    began = time.monotonic()
    try:
        done, _ = await asyncio.wait({task}, timeout=args.deadline)
        if task in done:
            exc = task.exception()
            sc.status = "ok" if exc is None else f"FAILED while {sc.phase}: {one_line(exc)}"
        else:
            sc.status = f"TIMED OUT after {args.deadline:.0f} s, while {sc.phase}"
            task.cancel()
            await asyncio.wait({task}, timeout=15)
    finally:
        ticker.cancel()
        sc.seconds = time.monotonic() - began
    sc.say(sc.status)


def run(sc: Scenario, body: Body, url: str, args: argparse.Namespace) -> None:
    """Runs one scenario on a loop of its own; whatever is left of it afterwards is cancelled,
    never waited for without bound."""
    sc.began = time.monotonic()
    sc.say(f"{sc.title} (deadline {args.deadline:.0f} s)")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_bounded(sc, body, url, args))
    except BaseException as exc:  # the runner itself: say so and go on
        sc.status = f"FAILED: {one_line(exc)}"
        if not isinstance(exc, Exception):
            raise
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))
        loop.close()
        for pinger in list(_pingers):
            pinger.stop()


def recover(url: str, server: LocalRedis | None, saved: dict[str, str], token: str) -> None:
    """Leaves the server answering, with its slow-log settings and without our keys."""
    client = Redis.from_url(url, socket_timeout=10, decode_responses=True)
    deadline = time.monotonic() + SETTLE
    killed = False
    try:
        while True:
            try:
                client.ping()
                break
            except redis_errors.ResponseError as exc:
                if "BUSY" not in str(exc):
                    raise
                if not killed:
                    killed = True
                    print("  server busy: SCRIPT KILL", file=sys.stderr)
                    with contextlib.suppress(redis_errors.RedisError):
                        client.script_kill()
            except (redis_errors.ConnectionError, redis_errors.TimeoutError):
                pass
            if time.monotonic() > deadline:
                if server is None:
                    print("  server still busy; going on", file=sys.stderr)
                    return
                print("  server still busy: restarting it", file=sys.stderr)
                server.crash_and_restart()
                client = Redis.from_url(url, socket_timeout=10, decode_responses=True)
                deadline = time.monotonic() + SETTLE
            time.sleep(0.1)
        for name, value in saved.items():
            client.config_set(name, value)
        client.slowlog_reset()
        if server is not None:
            client.flushall()
        else:
            batch: list[str] = []
            for key in client.scan_iter(match=f"{PREFIX}{{stress-*-{token}}}*", count=10_000):
                batch.append(key)
                if len(batch) >= 1_000:
                    client.unlink(*batch)
                    batch = []
            if batch:
                client.unlink(*batch)
    except redis_errors.RedisError as exc:
        print(f"  could not tidy the server: {one_line(exc)}", file=sys.stderr)
    finally:
        client.close()


def machine(url: str) -> str:
    with Redis.from_url(url, socket_timeout=10) as redis:
        version = redis.info("server")["redis_version"]
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
        f"redis-server {version}"
    )


def table(scenarios: list[Scenario]) -> str:
    rows = [("scenario", "measure", "result")]
    for sc in scenarios:
        rows.append((sc.title, "status", f"{sc.status} ({sc.seconds:.0f} s)"))
        for m in sc.measures:
            rows.append(("", m.label, m.text if m.text is not None else fmt(m.value, m.unit)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_CLIENTS:,} clients in 3.")
    parser.add_argument("--redis", metavar="URL", help="use this server (default: start one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--deadline", type=float, default=DEADLINE, help="seconds per scenario")
    parser.add_argument("--clients", type=int, help="PER_CLIENT clients in 3. (overrides)")
    parser.add_argument(
        "--only", action="append", choices=["queue", "window", "clients"], help="repeatable"
    )
    args = parser.parse_args()
    args.clients = args.clients or (QUICK_CLIENTS if args.quick else CLIENTS)
    args.token = secrets.token_hex(3)
    scenarios: list[tuple[Scenario, Body]] = [
        (Scenario("queue", f"1. deep queue ({QUEUE_TASKS:,} x acquire, 100/s)"), deep_queue),
        (Scenario("window", f"2. big window ({WINDOW_GRANTS:,} grants, 1M/h)"), big_window),
        (Scenario("clients", f"3. PER_CLIENT admin ({args.clients:,} clients)"), per_client),
    ]
    if args.only:
        scenarios = [(sc, body) for sc, body in scenarios if sc.key in args.only]
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        server: LocalRedis | None = None
        if args.redis:
            url = args.redis
        else:
            server = stack.enter_context(LocalRedis())
            url = server.url
        print(
            f"stress: aiolimit from {Path(aiolimit.__file__).parent}, redis at {url}",
            file=sys.stderr,
        )
        try:
            about = machine(url)
        except redis_errors.RedisError as exc:
            print(f"stress: cannot reach {url}: {one_line(exc)}", file=sys.stderr)
            raise SystemExit(2) from None
        saved: dict[str, str] = {}
        with (
            contextlib.suppress(redis_errors.RedisError),
            Redis.from_url(url, socket_timeout=10, decode_responses=True) as redis,
        ):
            got = redis.config_get("slowlog-*")
            saved = {k: got[k] for k in ("slowlog-log-slower-than", "slowlog-max-len") if k in got}
        for sc, body in scenarios:
            run(sc, body, url, args)
            recover(url, server, saved, args.token)
    seconds = time.monotonic() - began
    command = " ".join(["python benchmarks/stress.py", *sys.argv[1:]])
    if args.json:
        report = {
            "command": command,
            "machine": about,
            "seconds": round(seconds, 1),
            "scenarios": [
                {
                    "key": sc.key,
                    "title": sc.title,
                    "status": sc.status,
                    "seconds": round(sc.seconds, 1),
                    "measures": {m.key: m.value for m in sc.measures},
                }
                for sc in (s for s, _ in scenarios)
            ],
        }
        print(json.dumps(report, indent=2))
    else:
        print(f"Command: `{command}`. Machine: {about}. Run took {seconds:.0f} s.\n")
        print(table([s for s, _ in scenarios]))


if __name__ == "__main__":
    main()
