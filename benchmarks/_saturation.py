"""Scenario (d) of throughput.py: saturation. 4 processes x 16 tasks on one limiter at 200
permits/s, each task calling the library's own blocking acquire in a loop.

Reported: utilisation (permits granted / what the rate allows), Redis script calls and all
Redis commands (INFO commandstats, commands run inside scripts included) per grant, and
waiter lateness: for a grant returned at wall time t, when the grant ``rate`` places earlier
left the window (t_k + interval) is the moment a permit was free; a caller that asked before
then waited, and was late by t - that moment. aiolimit is also run through its soak tool
(``python -m tools.soak --json``), whose lateness is measured in limiter time.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Any

from _contenders import Contender, by_name
from _harness import command_counts, percentile

RATE = 200
PROCESSES = 4
TASKS = 16


def _worker(name: str, url: str, shared_begin: Any, seconds: float, ready: Any, out: Any) -> None:
    out.put(asyncio.run(_tasks(name, url, shared_begin, seconds, ready)))


async def _tasks(
    name: str, url: str, shared_begin: Any, seconds: float, ready: Any
) -> list[tuple[float, float]]:
    contender = by_name(name)
    await contender.open(url, ["bench-saturation"], RATE, 1.0)
    ready.put(os.getpid())
    while not shared_begin.value:  # noqa: ASYNC110 (a value shared between processes)
        await asyncio.sleep(0.01)
    begin = shared_begin.value
    end = begin + seconds
    grants: list[tuple[float, float]] = []  # (asked, returned), wall clock

    async def task() -> None:
        while time.time() < end:
            asked = time.time()
            await contender.acquire(0)
            grants.append((asked, time.time()))

    await asyncio.sleep(max(0.0, begin - time.time()))
    tasks = [asyncio.ensure_future(task()) for _ in range(TASKS)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.time()) + 2.0)
    for pending_task in pending:
        pending_task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await contender.close()
    return grants


async def _configure(contender: Contender, url: str) -> None:
    # The limiter's config (aiolimit) is written once, before the processes start.
    await contender.open(url, ["bench-saturation"], RATE, 1.0)
    await contender.close()


def saturation(contender: Contender, url: str, seconds: float) -> dict[str, Any]:
    """(d) for one contender; empty for a contender that cannot wait."""
    if not contender.blocking:
        return {}
    asyncio.run(_configure(contender, url))
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    begin = context.Value("d", 0.0)  # set once every process has opened its client
    processes = [
        context.Process(target=_worker, args=(contender.name, url, begin, seconds, ready, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=60)
    begin.value = time.time() + 0.2
    start, end = begin.value, begin.value + seconds
    scripts_before, total_before = command_counts(url)
    grants = [grant for _ in processes for grant in results.get(timeout=seconds + 60)]
    for process in processes:
        process.join(10)
    scripts_after, total_after = command_counts(url)
    return figures(grants, start, end, scripts_after - scripts_before, total_after - total_before)


def figures(
    grants: list[tuple[float, float]], begin: float, end: float, scripts: int, total: int
) -> dict[str, Any]:
    grants.sort(key=lambda grant: grant[1])
    returned = [grant[1] for grant in grants]
    lateness = []
    for i, (asked, at) in enumerate(grants):
        if i < RATE:
            continue
        free = returned[i - RATE] + 1.0  # that grant left the window: room for one
        if free > asked:  # it had to wait
            lateness.append(max(0.0, at - free) * 1000)
    inside = sum(begin <= at <= end for at in returned)
    lateness.sort()
    return {
        "utilisation": inside / (RATE * math.ceil(end - begin)),
        "scripts_per_grant": scripts / max(1, len(grants)),
        "commands_per_grant": total / max(1, len(grants)),
        "lateness_p50_ms": percentile(lateness, 0.5),
        "lateness_p99_ms": percentile(lateness, 0.99),
        "grants": len(grants),
    }


def soak(url: str, seconds: float) -> dict[str, Any]:
    """aiolimit's own soak tool on the same server: acquire(1) only, 4 x 16 at 200/s."""
    command = [
        sys.executable, "-m", "tools.soak", "--json", "--quiet", "--redis", url,
        "--processes", str(PROCESSES), "--tasks", str(TASKS), "--rate", str(RATE),
        "--duration", str(seconds), "--mix", "1,0,0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"soak tool failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
        return {}
    return {
        "utilisation": report.get("utilisation"),
        "scripts_per_grant": report.get("scripts_per_permit"),
        "commands_per_grant": report.get("commands_per_permit"),
        "lateness_p50_ms": report.get("lateness_p50_ms"),
        "lateness_p99_ms": report.get("lateness_p99_ms"),
    }
