"""Leases: calls/s and Redis CPU per lease of aiolimit's ConcurrencyLimiter against two
baselines written here from their public algorithms.

    python benchmarks/leases.py                      # ~20 s
    python benchmarks/leases.py --tasks 64 --limit 8 --seconds 5
    git archive main aiolimit | tar -x -C /tmp/aiolimit-main
    python benchmarks/leases.py --checkout /tmp/aiolimit-main --checkout . --rounds 5

Each contender runs ``--tasks`` tasks in one process (or spread over ``--processes``), on
one redis-server (a free 127.0.0.1 port, flushed before each), for ``--seconds``: take a
lease of 1 slot of ``--limit`` (waiting as long as it takes), hold it ``--hold`` ms, release
it, again. Reported: leases per second, Redis CPU per lease (INFO cpu, user + sys, before
and after) and beside it the ratio to the ZSET semaphore's, the clients' CPU per lease (every
process's, user + sys, while the tasks ran), script calls and commands per
lease (INFO commandstats, those run inside scripts included), and the most leases held at
once as the holders saw it. Every contender runs in a fresh process; with ``--rounds`` the
figures are medians.

- ``redis-semaphore``: the ZSET semaphore of swarmion/redis-semaphore: one script drops
  entries older than the lock timeout (client time) and adds the caller's if fewer than the
  limit are in; a refused caller polls again every 10 ms (its default ``retryInterval``);
  release is ZREM.
- ``Redisson``: RPermitExpirableSemaphore's scripts: a counter of free permits and a ZSET of
  permit ids by expiry (client time); an acquire reclaims expired permits, takes one if free,
  else answers the time until the earliest expiry; release removes the id, adds the permit
  back and PUBLISHes; waiters subscribe to the channel (one connection per process here) and
  all try again on each message, or at the earliest expiry.
- ``aiolimit``: ``ConcurrencyLimiter.try_lease(timeout=None)`` (FIFO tickets, server time;
  the release grants the head of the queue and hands it its lease: in the release's reply
  to a waiter of the same process, else as a message on its process's wake channel).

``--checkout PATH`` (repeatable) runs aiolimit once per checkout, each in a fresh process
importing ``aiolimit`` from PATH, alternating with the baselines round after round:
versions side by side. ``--contender`` picks who runs (repeatable; all by default).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from _handover import STAGES, Monitor, instrument, stages
from _harness import (
    ROOT,
    Table,
    Variant,
    alternate,
    checkouts,
    child_main,
    command_counts,
    flush,
    local_redis,
    machine,
    medians,
    number,
    parser,
    per_grant,
    report,
)
from _harness import reading as server_reading
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from aiolimit import ConcurrencyLimiter, RedisBackend

LEASE_MS = 30_000

SEMAPHORE_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3] - ARGV[4])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return 0
"""

REDISSON_ACQUIRE = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], 0, ARGV[4], 'LIMIT', 0, ARGV[1])
if #expired > 0 then
  redis.call('ZREM', KEYS[2], unpack(expired))
  local value = redis.call('INCRBY', KEYS[1], #expired)
  if tonumber(value) > 0 then redis.call('PUBLISH', KEYS[3], value) end
end
local value = redis.call('GET', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  return ARGV[3]
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] ~= nil then return ':' .. (tonumber(first[2]) - tonumber(ARGV[4])) end
return ':-1'
"""

REDISSON_RELEASE = """
local expire = redis.call('ZSCORE', KEYS[2], ARGV[1])
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if tonumber(removed) ~= 1 then return 0 end
local value = redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('PUBLISH', KEYS[3], value)
if expire == false or tonumber(expire) <= tonumber(ARGV[3]) then return 0 end
return 1
"""

_listeners: set[asyncio.Future[None]] = set()  # Redisson's subscriptions, kept referenced
Take = Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[Any]]]]]
"""Takes a lease (waiting); returns what names it and what releases it."""


def _ms() -> int:
    return int(time.time() * 1000)


async def _semaphore(redis: Redis, limit: int) -> Take:
    acquire = redis.register_script(SEMAPHORE_ACQUIRE)

    async def take() -> tuple[str, Callable[[], Awaitable[Any]]]:
        token = secrets.token_hex(8)
        while not await acquire(keys=["sem"], args=[limit, token, _ms(), LEASE_MS]):  # noqa: ASYNC110
            await asyncio.sleep(0.010)  # (the polling being measured)
        return token, lambda: redis.zrem("sem", token)

    return take


async def _redisson(redis: Redis, limit: int) -> Take:
    acquire = redis.register_script(REDISSON_ACQUIRE)
    release = redis.register_script(REDISSON_RELEASE)
    keys = ["permits", "timeouts", "channel"]
    await redis.set("permits", limit, nx=True)  # (once, by the first of the processes)
    released = asyncio.Event()
    pubsub = redis.pubsub()
    await pubsub.subscribe("channel")

    async def listen() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message":
                released.set()
                released.clear()  # (everyone waiting now wakes: Redisson's listeners)

    listener = asyncio.ensure_future(listen())

    async def take_lease() -> tuple[str, Callable[[], Awaitable[Any]]]:
        permit = secrets.token_hex(8)
        while True:
            now = _ms()
            answer = await acquire(keys=keys, args=[1, now + LEASE_MS, permit, now])
            text = answer.decode() if isinstance(answer, bytes) else str(answer)
            if not text.startswith(":"):
                return permit, lambda: release(keys=keys, args=[permit, 1, _ms()])
            wait = int(text[1:])
            waiter = asyncio.ensure_future(released.wait())
            await asyncio.wait([waiter], timeout=None if wait < 0 else wait / 1000)
            waiter.cancel()

    _listeners.add(listener)
    return take_lease


async def _aiolimit(redis: Redis, limit: int) -> Take:
    sem = ConcurrencyLimiter("bench", RedisBackend(redis))
    await sem.set_limit(limit, lease=LEASE_MS / 1000)

    async def take() -> tuple[str, Callable[[], Awaitable[Any]]]:
        lease = await sem.try_lease(timeout=None)
        assert lease is not None
        return lease.id, lease.release

    return take


CONTENDERS: dict[str, tuple[str, Callable[[Redis, int], Awaitable[Take]]]] = {
    "semaphore": ("redis-semaphore (ZSET, polling)", _semaphore),
    "redisson": ("Redisson (permits, pub/sub)", _redisson),
    "aiolimit": ("aiolimit ConcurrencyLimiter", _aiolimit),
}
BASELINES = ("semaphore", "redisson")


@dataclass(frozen=True)
class Load:
    """What one process of a contender runs: ``tasks`` tasks taking leases of ``limit``."""

    url: str
    contender: str
    limit: int
    tasks: int
    hold_s: float
    seconds: float
    timeline: bool = False


async def _work(load: Load, started: Callable[[], Awaitable[None]]) -> tuple[Any, ...]:
    """The load's tasks, from when ``started`` returns, for its seconds: (leases, the most
    held at once in this process, the CPU seconds this process used meanwhile, its stamps
    with ``--timeline``)."""
    stamps = instrument(load.contender) if load.timeline else None
    redis = Redis.from_url(load.url)
    take = await CONTENDERS[load.contender][1](redis, load.limit)
    await started()
    cpu = time.process_time()
    leases = held = most = 0
    end = time.monotonic() + load.seconds

    async def worker() -> None:
        nonlocal leases, held, most
        while time.monotonic() < end:
            key, release = await take()
            if stamps is not None:
                stamps.start(key)
            held += 1
            most = max(most, held)
            await asyncio.sleep(load.hold_s)
            if stamps is not None:
                stamps.end(key)
            held -= 1
            await release()
            leases += 1

    await asyncio.gather(*(worker() for _ in range(load.tasks)))
    cpu = time.process_time() - cpu
    await redis.aclose()
    return leases, most, cpu, stamps


def _process(load: Load, ready: Any, go: Any, out: Any) -> None:
    """A process of its own (``--processes``): says it is ready, starts on ``go``."""

    async def started() -> None:
        ready.put(None)
        await asyncio.to_thread(go.wait)

    out.put(asyncio.run(_work(load, started)))


def _run(url: str, contender: str, args: Any) -> dict[str, float]:
    """One contender over ``--processes`` processes (this one and others, spawned), the
    server's counters read once every process is ready and again when all are done."""
    shares = [args.tasks // args.processes + (i < args.tasks % args.processes)
              for i in range(args.processes)]  # fmt: skip
    loads = [Load(url, contender, args.limit, n, args.hold / 1000, args.seconds, args.timeline)
             for n in shares]  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    ready, go, out = spawn.Queue(), spawn.Event(), spawn.Queue()
    others = [spawn.Process(target=_process, args=(load, ready, go, out)) for load in loads[1:]]
    for process in others:
        process.start()
    with SyncRedis.from_url(url) as sync:
        readings: list[Any] = []
        monitor: list[Monitor] = []

        async def started() -> None:
            for _ in others:
                await asyncio.to_thread(ready.get)
            if args.timeline:
                monitor.append(Monitor(url))
            readings.append((server_reading(sync), command_counts(url), time.monotonic()))
            go.set()

        results = [asyncio.run(_work(loads[0], started))]
        results += [out.get() for _ in others]
        elapsed = time.monotonic() - readings[0][2]
        after, (scripts_after, commands_after) = server_reading(sync), command_counts(url)
    for process in others:
        process.join()
    before, (scripts_before, commands_before), _ = readings[0]
    leases = sum(result[0] for result in results)
    timeline = {}
    if monitor:
        timeline = {"stages": stages([r[3] for r in results], monitor[0].lines(), contender)}
    return {
        **timeline,
        "leases_per_s": leases / elapsed,
        "redis_cpu_us": per_grant(before, after, leases).redis_cpu,
        "scripts": (scripts_after - scripts_before) / max(leases, 1),
        "commands": (commands_after - commands_before) / max(leases, 1),
        "client_cpu_us": sum(result[2] for result in results) * 1e6 / max(leases, 1),
        "most_held": max(result[1] for result in results),
    }


def one_round(args: Any) -> dict[str, dict[str, float]]:
    """In a child: each contender asked for, once, on the server at ``--url``."""
    figures = {}
    for name in args.contender:
        flush(args.url)
        figures[CONTENDERS[name][0]] = _run(args.url, name, args)
    return figures


def variants(args: Any) -> list[Variant]:
    """The baselines asked for (this checkout's process), then aiolimit once per checkout."""
    out = []
    baselines = [name for name in args.contender if name in BASELINES]
    if baselines:
        extra = tuple(arg for name in baselines for arg in ("--contender", name))
        out.append(Variant("baselines", ROOT, extra))
    if "aiolimit" in args.contender:
        out += [Variant(v.label, v.path, ("--contender", "aiolimit")) for v in checkouts(args)]
    return out


def rows(args: Any, results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """One row per contender: aiolimit's named by its checkout when there are several."""
    out = {}
    for variant, figures in results.items():
        for label, row in figures.items():
            named = variant != "baselines" and len(args.checkout or []) > 1
            out[f"{label} ({variant})" if named else label] = row
    return out


def main() -> None:
    cli = parser(__doc__, checkouts=True)
    cli.add_argument("--tasks", type=int, default=32)
    cli.add_argument("--limit", type=int, default=4)
    cli.add_argument("--hold", type=float, default=2.0, help="ms each lease is held (2)")
    cli.add_argument("--seconds", type=float, default=4.0)
    cli.add_argument("--processes", type=int, default=1, help="the tasks spread over (1)")
    cli.add_argument("--contender", action="append", choices=list(CONTENDERS))
    cli.add_argument(
        "--timeline", action="store_true", help="where each hand-over's time goes (MONITOR on)"
    )
    cli.add_argument("--url", help=argparse.SUPPRESS)
    args = cli.parse_args()
    args.contender = args.contender or list(CONTENDERS)
    if args.child:
        child_main(lambda: one_round(args))
        return
    with local_redis() as url:
        heading = machine(url)
        child_args = [
            "--url", url, "--tasks", str(args.tasks), "--limit", str(args.limit),
            "--hold", str(args.hold), "--seconds", str(args.seconds),
            "--processes", str(args.processes), *(["--timeline"] if args.timeline else []),
        ]  # fmt: skip
        results = alternate(__file__, variants(args), args.rounds, child_args)
    figures = rows(args, {label: medians(rounds) for label, rounds in results.items()})
    tables = [table(args, figures)]
    if args.timeline:
        tables.append(timeline(figures))
    report(args, heading, tables, figures)


def table(args: Any, figures: dict[str, dict[str, float]]) -> Table:
    rounds = f", medians of {args.rounds} rounds" if args.rounds > 1 else ""
    spread = f" in {args.processes} processes" if args.processes > 1 else ""
    most = "most held (in one process)" if args.processes > 1 else "most held"
    out = Table(
        ["contender", "leases/s", "Redis CPU µs/lease", "vs semaphore", "client CPU µs/lease",
         "script calls/lease", "commands/lease", most],
        title=f"{args.tasks} tasks{spread}, limit {args.limit}, each lease held {args.hold} ms, "
        f"{args.seconds} s each{rounds}",
    )  # fmt: skip
    semaphore = figures.get(CONTENDERS["semaphore"][0], {}).get("redis_cpu_us")
    for label, row in figures.items():
        cpu = row["redis_cpu_us"]
        out.add(
            label,
            number(row["leases_per_s"]),
            number(cpu, 1),
            f"{cpu / semaphore:.2f}x" if semaphore else "n/a",
            number(row.get("client_cpu_us"), 1),
            number(row["scripts"], 1),
            number(row["commands"], 1),
            number(row["most_held"]),
        )
    return out


SHARES = ("within a process", "to the releasing task")


def timeline(figures: dict[str, dict[str, Any]]) -> Table:
    """The median of each stage of a hand-over (``_handover``), in ms."""
    out = Table(
        ["contender", *STAGES, "hold ended -> next hold", "(mean)", "hand-overs", *SHARES],
        title="A slot's hand-over, stage by stage (ms after the stage before, medians; MONITOR on)",
    )
    for label, row in figures.items():
        every = row["stages"]
        for part, got in (("", every), (", within a process", every["same"]),
                          (", to another process", every["other"])):  # fmt: skip
            cells = [number(None if got[s] is None else got[s] / 1000, 2) for s in (*STAGES, "gap")]
            share = f"{every['same_process']:.0%}" if not part else ""
            itself = f"{got['itself']:.0%}"
            mean = got["gap_mean"]
            mean_ms = number(None if mean is None else mean / 1000, 2)
            out.add(label + part, *cells, mean_ms, number(got["hand_overs"]), share, itself)
    return out


if __name__ == "__main__":
    main()
