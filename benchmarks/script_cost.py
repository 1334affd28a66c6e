"""Server-side cost of aiolimit's acquire script, and Redis memory per outstanding grant.

    python benchmarks/script_cost.py            # about 30 seconds
    python benchmarks/script_cost.py -n 50000   # quicker

Starts its own redis-server on a free 127.0.0.1 port and stops it at the end.

* Script cost: ``redis-benchmark`` sends EVALSHA of the acquire script (lib.lua + acquire.lua,
  exactly as RedisBackend loads it) on one limiter whose rate never refuses, and INCR for
  comparison; also INFO commandstats' server time per call.
* Memory: a limiter at rate 100 000 per hour is given 100 000 grants through RedisBackend (64
  tasks), then ``MEMORY USAGE`` of its permits ZSET divided by the grants.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

import aiolimit
from aiolimit.backends.redis._keys import Keys
from aiolimit.backends.redis._scripts import ACQUIRE
from tools import LocalRedis


def benchmark(port: int, requests: int, *command: str) -> float:
    """Requests per second redis-benchmark reports for one command, 50 clients."""
    done = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "50", "-q", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.findall(r"([\d.]+) requests per second", done.stdout)
    if not found:
        raise RuntimeError(f"redis-benchmark said: {done.stdout} {done.stderr}")
    return float(found[-1])


def server_usec(redis: Redis, command: str) -> float:
    stats = redis.info("commandstats").get(f"cmdstat_{command}", {})
    return float(stats.get("usec_per_call", 0.0))


def script_cost(url: str, port: int, requests: int) -> list[str]:
    keys = Keys("aiolimit:", "bench-script")
    with Redis.from_url(url) as redis:
        sha = redis.script_load(ACQUIRE.source)
        assert sha == ACQUIRE.sha
        redis.hset(keys.config, mapping={"rate": 10**12, "interval": 1_000_000, "type": "OVERALL"})
        args = [keys.config, keys.value, keys.permits]
        redis.config_resetstat()
        evalsha = benchmark(port, requests, "EVALSHA", sha, "3", *args, "1 - 0 OVERALL")
        evalsha_usec = server_usec(redis, "evalsha")
        redis.config_resetstat()
        incr = benchmark(port, requests, "INCR", "bench-counter")
        incr_usec = server_usec(redis, "incr")
    return [
        f"- `redis-benchmark -p PORT -n {requests} -c 50 EVALSHA {sha} 3 {' '.join(args)} "
        f'"1 - 0 OVERALL"`: **{evalsha:,.0f} requests/s**, '
        f"{evalsha_usec:.1f} µs of server time per call (INFO commandstats)",
        f"- `redis-benchmark -p PORT -n {requests} -c 50 INCR bench-counter`: "
        f"**{incr:,.0f} requests/s**, {incr_usec:.1f} µs per call",
        f"- the acquire script costs {evalsha_usec / max(incr_usec, 0.01):.0f}x an INCR in "
        f"server time and reaches {evalsha / incr:.0%} of INCR's rate from 50 clients",
    ]


async def fill(url: str, grants: int) -> tuple[int, int, int, str]:
    redis = AsyncRedis.from_url(url)
    limiter = aiolimit.RateLimiter("bench-memory", aiolimit.RedisBackend(redis))
    await limiter.set_rate(aiolimit.RateType.OVERALL, grants, 3600)
    left = grants

    async def task() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await limiter.try_acquire()

    await asyncio.gather(*(task() for _ in range(64)))
    keys = Keys("aiolimit:", "bench-memory")
    permits = int(await redis.zcard(keys.permits))
    zset = int(await redis.memory_usage(keys.permits, samples=0))
    other = sum(
        [int(await redis.memory_usage(k, samples=0) or 0) for k in (keys.config, keys.value)]
    )
    member = (await redis.zrange(keys.permits, -1, -1))[0].decode()
    await redis.aclose()
    return permits, zset, other, member


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=200_000, help="redis-benchmark requests (200000)")
    parser.add_argument("--grants", type=int, default=100_000, help="memory: rate and grants")
    args = parser.parse_args()
    with LocalRedis() as server:
        lines = ["Script cost (one limiter, rate never refused):", ""]
        lines += script_cost(server.url, server.port, args.n)
        permits, zset, other, member = asyncio.run(fill(server.url, args.grants))
        lines += [
            "",
            f"Memory at rate {args.grants:,} per hour, {permits:,} outstanding grants:",
            "",
            f"- permits ZSET: `MEMORY USAGE` {zset:,} bytes = **{zset / permits:.1f} bytes "
            f"per grant** (members look like `{member}`)",
            f"- config hash + value key: {other:,} bytes in all, independent of the grants",
        ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
