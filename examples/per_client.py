"""PER_CLIENT: push-notification workers that never spam one user.

Each user may get at most 3 pushes per second (think "per hour" in production), however many
workers or processes send them: one PER_CLIENT limiter, with the user id as the client id.
A push over the user's budget is not sent but folded into a digest, and a chatty group chat
for one user leaves every other user's budget untouched.

    python examples/per_client.py                                  # in-memory backend
    python examples/per_client.py --redis redis://localhost:6379   # shared through Redis
    AIOLIMIT_REDIS_URL=redis://localhost:6379 python examples/per_client.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import defaultdict

from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, RateLimiter, RateLimiterConfig, RateType, RedisBackend

RATE = 3
INTERVAL = 1.0
WORKERS = 3

# (seconds after the start, user, text). Alice is in a busy group chat.
EVENTS = [
    (0.00, "alice", "Ana: lunch?"),
    (0.05, "bob", "Your parcel has shipped"),
    (0.10, "alice", "Ben: yes!"),
    (0.15, "alice", "Cy: where?"),
    (0.20, "carol", "Dan liked your photo"),
    (0.25, "alice", "Ana: the usual place"),
    (0.30, "alice", "Ben: 12:30?"),
    (0.35, "carol", "Eve liked your photo"),
    (0.40, "alice", "Cy: see you there"),
    (1.30, "alice", "Ana: on my way"),
    (1.35, "bob", "Your parcel was delivered"),
    (1.40, "alice", "Ben: me too"),
]


class Phones:
    """Stands in for the push service: records when each user's phone buzzed."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.buzzes: dict[str, list[float]] = defaultdict(list)

    async def push(self, user: str, text: str) -> None:
        now = time.monotonic() - self.start
        self.buzzes[user].append(now)
        print(f"{now:5.2f}s  push    {user:<6} {text}", flush=True)
        await asyncio.sleep(0.01)

    def most_in_any_window(self, user: str, window: float) -> int:
        times = self.buzzes[user]
        return max((sum(t <= u < t + window for u in times) for t in times), default=0)


async def main(redis_url: str | None) -> int:
    redis = Redis.from_url(redis_url) if redis_url else None
    backend: Backend = RedisBackend(redis) if redis else MemoryBackend()
    config = RateLimiterConfig.build(RateType.PER_CLIENT, RATE, INTERVAL)
    per_user = RateLimiter("push-per-user", backend, rate=config)

    # One view per user, made once and reused: it is the user's own budget (client id =
    # user id) and the views of one user share that user's queue of waiting tasks.
    limiters: dict[str, RateLimiter] = {}

    def limiter_for(user: str) -> RateLimiter:
        if user not in limiters:
            limiters[user] = per_user.for_client(user)
        return limiters[user]

    start = time.monotonic()
    phones = Phones(start)
    digests: dict[str, list[str]] = defaultdict(list)
    queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()

    async def produce() -> None:
        for at, user, text in EVENTS:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await queue.put((user, text))
        for _ in range(WORKERS):
            await queue.put(None)

    async def work() -> None:
        while (event := await queue.get()) is not None:
            user, text = event
            if await limiter_for(user).try_acquire():  # one attempt, no waiting
                await phones.push(user, text)
            else:
                digests[user].append(text)
                print(f"{time.monotonic() - start:5.2f}s  digest  {user:<6} {text}", flush=True)

    try:
        await asyncio.gather(produce(), *(work() for _ in range(WORKERS)))
    finally:
        await per_user.delete()  # every user's state, so that a rerun starts afresh
        if redis is not None:
            await redis.aclose()

    print()
    worst = 0
    for user in sorted({user for _, user, _ in EVENTS}):
        most = phones.most_in_any_window(user, INTERVAL - 0.02)  # 20 ms for timing jitter
        worst = max(worst, most)
        print(
            f"{user:<6} {len(phones.buzzes[user])} pushed, {len(digests[user])} in the digest, "
            f"at most {most} in any {INTERVAL:g}s (limit {RATE})"
        )
    if worst > RATE:
        print(f"FAIL: a user got {worst} pushes within {INTERVAL:g}s")
        return 1
    print(f"OK: no user got more than {RATE} pushes in any {INTERVAL:g}s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("AIOLIMIT_REDIS_URL"),
        help="Redis server to share the limiter through (default: $AIOLIMIT_REDIS_URL, "
        "else the in-memory backend)",
    )
    raise SystemExit(asyncio.run(main(parser.parse_args().redis)))
