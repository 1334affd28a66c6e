"""What a grant costs: Redis's own CPU and script time, and the client process's CPU time.

Redis is single threaded: the grants per second one node can give a whole fleet is about
1 / (Redis CPU per grant), however many client processes share it. The server's own counters
say what it spent, read before and after a measured stretch:

- ``INFO cpu``: ``used_cpu_user`` + ``used_cpu_sys``, the server process's CPU time (every
  command, the network, the event loop; INFO itself is a few µs per reading);
- ``INFO commandstats``: the ``usec`` of every script command (EVAL, EVALSHA, FCALL and their
  ``_ro`` forms), the time spent running scripts alone.

The client's cost is this process's CPU time (``time.process_time``) over the same stretch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis import Redis

SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


@dataclass(frozen=True)
class Reading:
    """The counters at one moment."""

    server_cpu: float  # seconds
    script_usec: int
    client_cpu: float  # seconds


@dataclass(frozen=True)
class Cost:
    """Per grant, in microseconds."""

    redis_cpu: float
    script: float
    client_cpu: float


def reading(redis: Redis) -> Reading:
    """The server's counters and this process's CPU time, now (a blocking INFO: call it where
    the event loop may stop for a moment)."""
    client = time.process_time()
    cpu = redis.info("cpu")
    stats = redis.info("commandstats")
    script = sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in SCRIPT_COMMANDS)
    return Reading(float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), script, client)


def per_grant(before: Reading, after: Reading, grants: int) -> Cost:
    grants = max(grants, 1)
    return Cost(
        (after.server_cpu - before.server_cpu) * 1e6 / grants,
        (after.script_usec - before.script_usec) / grants,
        (after.client_cpu - before.client_cpu) * 1e6 / grants,
    )
