"""What stress.py's scenarios share: their results, the server's view of them (the slow log,
keys, idleness, hand-backs settling) and a process that PINGs the server every 1 ms."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import multiprocessing
import sys
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis as AsyncRedis

from aiolimit import RateLimiter, RedisBackend

PREFIX = "aiolimit:"
DEADLINE = 120.0  # seconds per scenario
OP_TIMEOUT = 60.0  # seconds per admin call in scenario 3
SETTLE = 30.0  # seconds to wait for a state to be reached (all queued, all handed back, ...)
QUEUE_RATE, QUEUE_SHALLOW = 100, 10
WINDOW_RATE, WINDOW_SMALL, WINDOW_TASKS = 1_000_000, 1_000, 64
CLIENT_RATE, CLIENT_RATE_UPDATED, CLIENT_INTERVAL = 10, 20, 60
CHUNK = 1_000
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
  if (name == 'EVAL' or name == 'EVALSHA' or name == 'FCALL') and not ours then
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
    ours = command.startswith(b"EVAL " + MARK.encode())
    return name in (b"EVAL", b"EVALSHA", b"FCALL") and not ours


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
