"""Client CPU per grant: aiolimit beside a bare asyncio client sending the same calls.

    python benchmarks/client_floor.py                        # real time, ~1 minute
    python benchmarks/client_floor.py --instructions         # valgrind's count, ~5 minutes

What the client side of a grant costs at least. The bare client sends exactly the calls
aiolimit sends in scenario (b) of run.py (64 tasks taking one permit at a time from 10 000
token-bucket limiters that never refuse): the acquire_many function with the same keys and
request strings, the requests of one limiter merged as aiolimit merges them, at most 32
requests a call and two calls in flight, on two connections of its own. It does only that:
one future per request, the command packed by hand, the reply read as one bulk string, each
caller's line split and read into the same six numbers. No argument checks, circuit breaker,
per-call timeout, cancellation safety (a cancelled caller's grant handed back), rate type
discovery, cluster slots, lost-connection resends or NOSCRIPT handling: what aiolimit's client
side does beyond it is the price of those. The Redis work of a grant is the same for both.

Real time: each client in a fresh process, in alternating rounds, the median of the rounds of
client CPU (``time.process_time``) per grant and calls per second. ``--instructions``: each
client's process under valgrind (callgrind) for two numbers of grants; the difference of the
instructions counted, per grant, does not move with the machine's load. Starts its own
redis-server on a free 127.0.0.1 port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

TASKS = 64
CLIENTS = ("aiolimit", "bare client")
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


class _Count:
    """The grants so far, and when the tasks stop: at ``stop`` grants, or once told."""

    def __init__(self, stop: float = float("inf")) -> None:
        self.grants = 0
        self.stop = stop


async def _one(client: str, url: str, limiters: int, algorithm: str, count: _Count) -> None:
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


async def _timed(
    client: str, url: str, limiters: int, algorithm: str, seconds: float
) -> dict[str, float]:
    count = _Count()
    running = asyncio.ensure_future(_one(client, url, limiters, algorithm, count))
    while count.grants == 0 and not running.done():  # noqa: ASYNC110  (set up, then a warm-up)
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    cpu, wall, grants = time.process_time(), time.perf_counter(), count.grants
    await asyncio.sleep(seconds)
    cpu, wall, grants = time.process_time() - cpu, time.perf_counter() - wall, count.grants - grants
    count.stop = 0
    await running
    return {"client_cpu": cpu / grants * 1e6, "calls": grants / wall}


def _instructions(args: argparse.Namespace, url: str, client: str) -> float:
    """Instructions per grant of ``client``'s process, counted by callgrind: two runs."""
    totals = []
    for grants in (args.grants // 5, args.grants):
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             sys.executable, __file__, "--one", client, url, "--limiters", str(args.limiters),
             "--algorithm", args.algorithm, "--grants", str(grants), "--duration", "0"],
            capture_output=True, text=True, check=True, env=_env(),
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"no count from valgrind:\n{done.stderr[-2000:]}")
        totals.append(int(found.group(1)))
    most: int = args.grants
    return (totals[1] - totals[0]) / (most - most // 5)


def _env() -> dict[str, str]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument(
        "--limiters", type=int, default=None, help="10 000; 2 000 with --instructions"
    )
    parser.add_argument("--algorithm", default="token_bucket")
    parser.add_argument("--instructions", action="store_true", help="count with valgrind")
    parser.add_argument("--grants", type=int, default=10_000, help="with --instructions")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # client, url: in a subprocess
    args = parser.parse_args()
    if args.limiters is None:
        args.limiters = 2_000 if args.instructions else 10_000
    if args.one:
        client, url = args.one
        if args.duration <= 0:  # (under valgrind: a number of grants, not a time)
            asyncio.run(_one(client, url, args.limiters, args.algorithm, _Count(args.grants)))
        else:
            print(
                json.dumps(
                    asyncio.run(_timed(client, url, args.limiters, args.algorithm, args.duration))
                )
            )
        return
    from aiolimit._tools import LocalRedis

    print(f"{TASKS} tasks, one permit each time, {args.limiters:,} {args.algorithm} limiters")
    with LocalRedis() as server:
        if args.instructions:
            counted = {}
            for client in CLIENTS:
                subprocess.run(
                    ["redis-cli", "-u", server.url, "FLUSHALL"], check=True, capture_output=True
                )
                counted[client] = _instructions(args, server.url, client)
            print(f"\nclient instructions per grant (valgrind, {args.grants:,} grants)\n")
            print("| client | instructions / grant | ratio |")
            print("|---|--:|--:|")
            for client in CLIENTS:
                ratio = counted[client] / counted[CLIENTS[1]]
                print(f"| {client} | {counted[client]:,.0f} | {ratio:.2f}x |")
            return
        results: dict[str, list[dict[str, float]]] = {client: [] for client in CLIENTS}
        for _ in range(args.rounds):
            for client in CLIENTS:
                subprocess.run(
                    ["redis-cli", "-u", server.url, "FLUSHALL"], check=True, capture_output=True
                )
                done = subprocess.run(
                    [sys.executable, __file__, "--one", client, server.url,
                     "--limiters", str(args.limiters), "--algorithm", args.algorithm,
                     "--duration", str(args.duration)],
                    capture_output=True, text=True, check=True, env=_env(),
                )  # fmt: skip
                results[client].append(json.loads(done.stdout))
    print(f"\nmedian of {args.rounds} rounds, {args.duration} s each\n")
    print("| client | calls/s | client CPU µs / grant | ratio |")
    print("|---|--:|--:|--:|")
    floor = statistics.median(r["client_cpu"] for r in results[CLIENTS[1]])
    for client in CLIENTS:
        cpu = statistics.median(r["client_cpu"] for r in results[client])
        calls = statistics.median(r["calls"] for r in results[client])
        print(f"| {client} | {calls:,.0f} | {cpu:.1f} | {cpu / floor:.2f}x |")


if __name__ == "__main__":
    main()
