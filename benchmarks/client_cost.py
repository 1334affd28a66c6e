"""Client CPU of a batch of acquire requests in the Redis backend, without a server, for
checkouts side by side.

    git archive main aiolimit | tar -x -C /tmp/aiolimit-main
    python benchmarks/client_cost.py /tmp/aiolimit-main .

What the coalescer and the acquire script's Python side do for 32 requests on 32 limiters
that share a round trip: the request made and queued, the acquire_many call built, the round
trip packed as Redis protocol (redis-py's ``pack_commands`` where the checkout has no packer of
its own), a canned reply split, each caller's future settled and its reply decoded. The
limiter's own checks and the event loop's task switches are not in it. µs per request, the
best of 7 repeats, each checkout in a fresh process, in alternating rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import timeit
from pathlib import Path
from typing import Any

REQUESTS = 32


def measure() -> float:
    import aiolimit
    from aiolimit.backends.redis import _scripts
    from aiolimit.backends.redis._coalescer import Coalescer, Request
    from aiolimit.backends.redis._keys import Keys

    try:
        from aiolimit.backends.redis._wire import _packed
    except ImportError:  # a checkout that pipelines through redis-py
        from redis.asyncio.connection import Connection

        _packed = Connection().pack_commands

    overall = aiolimit.RateType.OVERALL
    keys = [Keys("aiolimit:", f"bench-{i}").budget(overall, "", True) for i in range(REQUESTS)]
    line = b"0 999999 0 1700000000123456 0 1:1700000000123456:1"
    reply = b"\n".join([line] * REQUESTS)

    async def run() -> float:
        pipe: Any = Coalescer(object())
        loop = asyncio.get_running_loop()

        def batch() -> None:
            for i in range(REQUESTS):
                request = _scripts.acquire_request(1, "", 0, overall, "")
                future = loop.create_future()
                pipe._queue.append(Request(_scripts.ACQUIRE, keys[i], [request], future, None))
            requests, pipe._queue = pipe._queue, []
            calls = pipe._calls(requests)
            _packed([call.command() for call in calls])
            for call in calls:
                call.settle(reply)
            for request in requests:
                _scripts.ACQUIRE.decode(request.future.result())

        best = min(timeit.repeat(batch, number=300, repeat=7))
        return best / 300 / REQUESTS * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", default=["."])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(measure())
        return
    results: dict[str, list[float]] = {c: [] for c in args.checkouts}
    for _ in range(args.rounds):
        for checkout in args.checkouts:
            env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
            done = subprocess.run(
                [sys.executable, __file__, "--measure"],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            results[checkout].append(float(done.stdout))
    for checkout, values in results.items():
        values.sort()
        print(f"{checkout}: best {values[0]:.2f}, median {values[len(values) // 2]:.2f} µs/request")


if __name__ == "__main__":
    main()
