"""The clients client_cpu.py measures: aiolimit, and a bare asyncio client sending the same
calls, so what the client side of a grant costs at least.

The bare client sends exactly the calls aiolimit sends in scenario (b) of throughput.py (64
tasks taking one permit at a time from many token-bucket limiters that never refuse): the
acquire_many function with the same keys and request strings, the requests of one limiter
merged as aiolimit merges them, at most 32 requests a call and two calls in flight, on two
connections of its own. It does only that: one future per request, the command packed by
hand, the reply read as one bulk string, each caller's line split and read into the same six
numbers. No argument checks, circuit breaker, per-call timeout, cancellation safety (a
cancelled caller's grant handed back), rate type discovery, cluster slots, lost-connection
resends or NOSCRIPT handling: what aiolimit's client side does beyond it is the price of
those. The Redis work of a grant is the same for both.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

TASKS = 64
_MOST = 32  # requests a call carries (aiolimit's _ROUND_TRIP_MOST while more wait)


async def _limiters(url: str, count: int, algorithm: str) -> tuple[Any, list[Any]]:
    from redis.asyncio import Redis

    import aiolimit

    redis = Redis.from_url(url)
    backend = aiolimit.RedisBackend(redis)
    limiters = [aiolimit.RateLimiter(f"floor-{i}", backend) for i in range(count)]
    kind = aiolimit.Algorithm(algorithm.upper())
    for start in range(0, count, 500):
        part = limiters[start : start + 500]
        # The loose arguments (deprecated): every checkout compared, older ones too, takes them.
        await asyncio.gather(
            *(lim.set_rate(aiolimit.RateType.OVERALL, 10**12, 1, algorithm=kind) for lim in part)
        )
        await asyncio.gather(*(lim.try_acquire() for lim in part))  # (the library loaded too)
    return redis, limiters


async def _bare_hit(port: int, backend: Any, names: list[str]) -> Callable[[int], Any]:
    """The bare client's call: a grant's reply line read into its six numbers."""
    from aiolimit import RateType
    from aiolimit.backends.redis import _scripts

    overall = RateType.OVERALL
    function = _scripts.ACQUIRE_MANY.function
    assert function is not None
    head = b"$5\r\nFCALL\r\n$%d\r\n%s\r\n" % (len(function), function.encode())
    request = _scripts.acquire_request(1, "", 0, overall, "")
    # Each limiter's keys, packed once.
    packed = [
        b"".join(b"$%d\r\n%s\r\n" % (len(k), k) for k in backend.keys(n).budget(overall, "", True))
        for n in names
    ]
    loop = asyncio.get_running_loop()
    queue: list[tuple[int, asyncio.Future[bytes]]] = []
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    pumps: set[asyncio.Task[None]] = set()

    async def pump() -> None:
        reader, writer = idle.pop()
        try:
            while queue:
                batch = queue[:_MOST]
                del queue[:_MOST]
                starts: dict[int, int] = {}
                keys: list[bytes] = []
                args: list[bytes] = []
                for index, _ in batch:
                    start = starts.get(index)
                    if start is None:
                        start = starts[index] = 3 * len(starts) + 1
                        keys.append(packed[index])
                    arg = b"%d %s" % (start, request)
                    args.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
                count = b"%d" % (3 * len(starts))
                writer.write(
                    b"*%d\r\n%s$%d\r\n%s\r\n"
                    % (3 + 3 * len(starts) + len(args), head, len(count), count)
                    + b"".join(keys)
                    + b"".join(args)
                )
                size = await reader.readuntil(b"\r\n")
                if size[:1] != b"$":
                    raise RuntimeError(f"unexpected reply: {size!r}")
                body = await reader.readexactly(int(size[1:-2]) + 2)
                for (_, future), line in zip(batch, body[:-2].split(b"\n"), strict=True):
                    future.set_result(line)
        finally:
            idle.append((reader, writer))
            pumps.discard(asyncio.current_task())

    def start_pump() -> None:
        pumps.add(loop.create_task(pump()))

    async def hit(index: int) -> tuple[Any, ...]:
        future = loop.create_future()
        queue.append((index, future))
        # A call goes at once when none is in flight; a second once half a call waits.
        if not pumps or (len(pumps) < 2 and len(queue) >= _MOST // 2):
            start_pump()
        line = await future
        if line[:1] == b"=":  # a grant as the one before it (SAME_FORMAT): rare over many limiters
            return ()
        fields = line.split(b" ")
        if fields[0] != b"0":
            raise RuntimeError(f"not granted: {fields!r}")
        _, left, binding, start, delay, member = fields
        return int(delay), int(start), int(left), member.decode(), None, int(binding)

    return hit


class Count:
    """The grants so far, and when the tasks stop: at ``stop`` grants, or once told."""

    def __init__(self, stop: float = float("inf")) -> None:
        self.grants = 0
        self.stop = stop


async def run(client: str, url: str, limiters: int, algorithm: str, count: Count) -> None:
    """Runs TASKS tasks taking one permit at a time on ``client`` until ``count`` says stop."""
    redis, lims = await _limiters(url, limiters, algorithm)
    hit: Callable[[int], Coroutine[Any, Any, Any]]
    if client == "aiolimit":

        async def hit(index: int) -> bool:
            granted: bool = await lims[index].try_acquire()
            return granted

    else:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        hit = await _bare_hit(port, lims[0].backend, [lim.name for lim in lims])

    async def task(seed: int) -> None:
        pick = random.Random(seed).randrange
        while count.grants < count.stop:
            count.grants += 1
            await hit(pick(limiters))

    await asyncio.gather(*(task(seed) for seed in range(TASKS)))
    await redis.aclose()


async def timed(
    client: str, url: str, limiters: int, algorithm: str, seconds: float
) -> dict[str, float]:
    count = Count()
    running = asyncio.ensure_future(run(client, url, limiters, algorithm, count))
    while count.grants == 0 and not running.done():  # noqa: ASYNC110  (set up, then a warm-up)
        await asyncio.sleep(0.05)
    await asyncio.sleep(min(1.0, seconds))
    cpu, wall, grants = time.process_time(), time.perf_counter(), count.grants
    await asyncio.sleep(seconds)
    cpu, wall, grants = time.process_time() - cpu, time.perf_counter() - wall, count.grants - grants
    count.stop = 0
    await running
    return {"client_cpu": cpu / grants * 1e6, "calls": grants / wall}


async def http_run(client: str, count: Count) -> None:
    """TASKS tasks sending ``GET /`` through an httpx client until ``count`` says stop: with
    ``client="aiolimit"`` through ``RateLimitedTransport`` (a memory limiter that never
    refuses), else straight to the same ``httpx.MockTransport`` (answers 200 at once)."""
    import httpx

    transport: httpx.AsyncBaseTransport = httpx.MockTransport(lambda _: httpx.Response(200))
    if client == "aiolimit":
        from aiolimit import MemoryBackend, RateLimiter
        from aiolimit.httpx import RateLimitedTransport

        limiter = RateLimiter("http", MemoryBackend(), rate="1000000000/second")
        transport = RateLimitedTransport(limiter, transport)
    async with httpx.AsyncClient(transport=transport, base_url="http://partner.test") as http:

        async def task() -> None:
            while count.grants < count.stop:
                count.grants += 1
                await http.get("/")

        await asyncio.gather(*(task() for _ in range(TASKS)))
