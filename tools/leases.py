"""The concurrency limiter's lab: a holder process (``python -m tools.leases``) and the audit
of what the holders recorded.

Each holder stamps its own times with ``time.monotonic()`` (one clock for every process of a
Linux host): when it asked (``asked``), when its first attempt came back queued (``queued``,
None if it was granted at once), when its body started and ended (``enter``, ``exit``), and the
lease's ``fence``. :func:`most_in_flight` reads the highest count of bodies running at once;
:func:`out_of_order` finds pairs served against FIFO order.

Modes (one JSON line per event on stdout):
  hold URL NAME LEASE            take a lease, say so ("held"), then hold it until killed
  freeze URL NAME LEASE SECONDS  take a lease, stall the event loop SECONDS inside it, then
                                 say how the body ended ("lost" or "survived")
  audit URL NAME MAX LEASE ROUNDS TASKS  ROUNDS leases in each of TASKS tasks, stamped
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["HolderStamp", "most_in_flight", "out_of_order"]


@dataclass(frozen=True)
class HolderStamp:
    asked: float
    queued: float | None
    enter: float
    exit: float
    fence: int
    permits: int = 1


def most_in_flight(stamps: Iterable[HolderStamp]) -> int:
    """The most permits held at one instant, from the holders' enter and exit stamps (an exit
    and an enter at the same instant: the exit first)."""
    events = []
    for stamp in stamps:
        events += [(stamp.enter, 1, stamp.permits), (stamp.exit, 0, -stamp.permits)]
    held = most = 0
    for _, _, change in sorted(events):
        held += change
        most = max(most, held)
    return most


def out_of_order(stamps: list[HolderStamp]) -> list[tuple[HolderStamp, HolderStamp]]:
    """Pairs (a, b) of equal permits where a's ticket was queued before b first asked, yet b
    was granted first (a lower fence): FIFO broken."""
    queued = sorted((s for s in stamps if s.queued is not None), key=lambda s: s.queued or 0)
    wrong = []
    for a in queued:
        assert a.queued is not None
        for b in stamps:
            if b.permits == a.permits and b.asked > a.queued and b.fence < a.fence:
                wrong.append((a, b))
    return wrong


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def _main(mode: str, url: str, name: str, *args: str) -> None:
    from redis.asyncio import Redis

    import aiolimit
    from aiolimit import ConcurrencyLimiter, LeaseLostError, RedisBackend

    redis = Redis.from_url(url)
    sem = ConcurrencyLimiter(name, RedisBackend(redis))
    if mode == "hold":
        async with sem.lease(timeout=None) as lease:
            _say(event="held", fence=lease.fence, at=time.monotonic())
            await asyncio.sleep(3600)
    elif mode == "freeze":
        try:
            async with sem.lease(timeout=None) as lease:
                _say(event="held", fence=lease.fence, at=time.monotonic())
                time.sleep(float(args[1]))  # noqa: ASYNC251  (the whole event loop stalls)
                await asyncio.sleep(float(args[0]) * 3)
            _say(event="survived")
        except LeaseLostError:
            _say(event="lost", at=time.monotonic())
    else:
        most, lease_s, rounds, tasks = int(args[0]), float(args[1]), int(args[2]), int(args[3])
        await sem.try_set_limit(most, lease=lease_s)
        queued: dict[asyncio.Task[Any] | None, float] = {}

        class Stamps(aiolimit.Observer):
            def lease_queued(self, name: str, change: int) -> None:
                if change > 0:
                    queued[asyncio.current_task()] = time.monotonic()

        aiolimit.observe(Stamps())

        async def holder() -> None:
            for _ in range(rounds):
                queued.pop(asyncio.current_task(), None)
                asked = time.monotonic()
                async with sem.lease(timeout=None) as lease:
                    enter = time.monotonic()
                    await asyncio.sleep(random.uniform(0.005, 0.03))
                    left = time.monotonic()
                _say(event="stamp", asked=asked, queued=queued.get(asyncio.current_task()),
                     enter=enter, exit=left, fence=lease.fence)  # fmt: skip

        await asyncio.gather(*(holder() for _ in range(tasks)))
    await redis.aclose()


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:]))
