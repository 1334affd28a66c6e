"""Running a soak: the server (``--redis``, or one of its own), the worker processes started
together, the faults injected while they run, and their grants handed to the audit.

Exit status: 0 when no bound is exceeded, 1 on any over-admission, except that
``--allow-loss`` reports (without failing) a restart of a server without persistence, which
loses the limiter's state and so can admit up to one more rate's worth of permits; 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import queue as queues
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis as sync_redis
from redis.asyncio import Redis

from aiolimit import RateLimiter, RateLimiterConfig, RedisBackend

from ..server import LocalRedis
from .arguments import add_arguments, check
from .faults import Commands, Injector
from .limits import Limits
from .progress import Progress
from .report import format_table, summarise
from .worker import WorkerConfig, WorkerResult, run_worker

__all__ = ["main", "run", "soak"]


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        print(f"soak: {problem}", file=sys.stderr)
        return 2
    server = None if args.redis else LocalRedis(persistence=args.persistence).start()
    try:
        results = soak(args, server.url if server else args.redis, server)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        print(format_table(results))
    return int(results["exit_code"])


@dataclass
class _Workers:
    """The worker processes and what they share with this one."""

    processes: list[Any]
    counts: Any
    ready: Any
    results: Any
    start: Any
    window: Any


def soak(args: argparse.Namespace, url: str, server: LocalRedis | None) -> dict[str, Any]:
    """One soak on the server at ``url`` (``server``: the tool's own, which ``--fault
    restart`` crashes): the results the table and ``--json`` show."""
    run_id = uuid.uuid4().hex[:8]
    name = f"soak-{run_id}"
    client_prefix = f"aiolimit-soak-{run_id}-"
    rate_type = "PER_CLIENT" if args.rate_type == "per-client" else "OVERALL"
    limits = Limits.of(args)
    control = sync_redis.Redis.from_url(url, decode_responses=True)
    asyncio.run(_set_rate(url, name, rate_type, limits))
    workers = _start(args, url, name, rate_type, limits, client_prefix)
    commands = Commands()
    periodic = [f for f in args.fault if f != "clock-skew"]
    injector = Injector(control, server, periodic, args.fault_every, client_prefix, commands)
    try:
        results, run = _run(args, workers, commands, injector, control, limits.shortest)
    finally:
        for worker in workers.processes:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        control.close()
    return summarise(args, results, commands, injector, run)


def _start(
    args: argparse.Namespace, url: str, name: str, rate_type: str, limits: Limits, prefix: str
) -> _Workers:
    """Starts the worker processes (spawned); they wait for the start signal."""
    context = multiprocessing.get_context("spawn")
    workers = _Workers(
        [],
        context.Array("q", args.processes),
        context.Queue(),
        context.Queue(),
        context.Event(),
        context.Array("d", 2),
    )
    interval = limits.shortest
    mix = tuple(int(part) for part in args.mix.split(","))
    for process in range(args.processes):
        skewed = "clock-skew" in args.fault and process == 0 and args.clock == "client"
        config = WorkerConfig(
            url=url,
            name=name,
            rate_type=rate_type,
            rate=limits.max_permits,
            interval=interval,
            rates=limits.text,
            algorithm=limits.algorithm.value,
            min_spacing=limits.min_spacing,
            tasks=args.tasks,
            mix=(mix[0], mix[1], mix[2]),
            max_multi=args.max_multi,
            try_timeout=args.try_timeout if args.try_timeout is not None else interval / 2,
            clock=args.clock,
            skew=args.skew if skewed else 0.0,
            big=args.big,
            big_timeout=5 * interval,
            client_name=f"{prefix}{process}",
            client_retries=args.client_retries,
            seed=args.seed,
        )
        shared = (workers.counts, workers.ready, workers.start, workers.window, workers.results)
        worker = context.Process(target=run_worker, args=(config, process, *shared), daemon=True)
        worker.start()
        workers.processes.append(worker)
    return workers


def _run(
    args: argparse.Namespace,
    workers: _Workers,
    commands: Commands,
    injector: Injector,
    control: Any,
    interval: float,
) -> tuple[list[WorkerResult], tuple[float, float]]:
    """Starts the workers together, injects the faults and shows progress until every
    worker has reported; returns their results and the run's (begin, end) wall clock."""
    results: list[WorkerResult] = []
    for _ in workers.processes:
        workers.ready.get(timeout=60)
    commands.begin(control)
    begin = time.time() + 0.2
    end = begin + args.duration
    workers.window[0], workers.window[1] = begin, end
    workers.start.set()
    injector.start(begin)
    progress = Progress(args, begin, end, workers.counts)
    while len(results) < len(workers.processes):
        now = time.time()
        if begin <= now <= end:
            injector.tick(now, end)
        progress.show(now, injector.done)
        results += _drain(workers.results, timeout=0.1)
        if now > end + 10 * interval + 60:
            raise RuntimeError("workers did not report back")
    progress.finish()
    commands.end(control)
    return results, (begin, end)


def _drain(queue: Any, timeout: float) -> Iterator[WorkerResult]:
    try:
        yield queue.get(timeout=timeout)
    except queues.Empty:
        return


async def _set_rate(url: str, name: str, rate_type: str, limits: Limits) -> None:
    redis = Redis.from_url(url)
    try:
        config = RateLimiterConfig.build(
            rate_type,
            limits.rates,
            algorithm=limits.algorithm,
            min_spacing=limits.min_spacing or None,
        )
        # A run starts from full budgets, whatever an earlier one left.
        await RateLimiter(name, RedisBackend(redis)).set_rate(config, keep_state=False)
    finally:
        await redis.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.soak``: the soak command (from a checkout of the repository)."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description="Soak test: K worker processes x T tasks on one limiter on a real Redis, "
        "with faults and an audit.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
