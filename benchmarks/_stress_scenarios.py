"""stress.py's three scenarios: a deep queue, a big window, PER_CLIENT admin at scale."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from _stress_server import (
    CHUNK,
    CHURN_PER_SECOND,
    CLIENT_INTERVAL,
    CLIENT_RATE,
    CLIENT_RATE_UPDATED,
    OP_TIMEOUT,
    PREFIX,
    PROBES,
    QUEUE_RATE,
    QUEUE_SHALLOW,
    WINDOW_RATE,
    WINDOW_SMALL,
    WINDOW_TASKS,
    Pinger,
    Scenario,
    ServerLog,
    backend_for,
    clients,
    count_keys,
    fmt,
    future_grants,
    median,
    one_line,
    permits_key,
    probe,
    settle,
    stop_tasks,
    until,
)
from redis.asyncio import Redis as AsyncRedis

from aiolimit import (
    LimiterError,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)


async def deep_queue(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    async with clients(url) as (redis, admin):
        backend = backend_for(redis)
        tasks: list[asyncio.Task[Any]] = []
        try:
            # One acquire behind a short queue: 100 granted now, 10 reserved.
            sc.enter(f"one acquire behind {QUEUE_SHALLOW} queued reservations")
            shallow = RateLimiter(f"stress-queue-short-{args.token}", backend)
            await shallow.set_rate(RateLimiterConfig.build(RateType.OVERALL, QUEUE_RATE, 1))
            tasks = [
                asyncio.ensure_future(shallow.acquire()) for _ in range(QUEUE_RATE + QUEUE_SHALLOW)
            ]
            key = permits_key(shallow.name)

            async def short_queued() -> bool:
                return int(await admin.zcard(key)) >= QUEUE_RATE + QUEUE_SHALLOW

            await until(short_queued, "the short queue")
            short_ms, short_log, short_ahead = await probe(admin, shallow)
            await stop_tasks(tasks)
            await settle(admin, key, lambda _, ahead: ahead == 0)
            sc.put(
                "acquire_depth_10_ms",
                f"server time of one acquire() behind {short_ahead:,} queued "
                f"({short_log:,} grants in the log)",
                short_ms,
                "ms",
            )

            # 5 000 at once.
            limiter = RateLimiter(f"stress-queue-{args.token}", backend)
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, QUEUE_RATE, 1))
            key = permits_key(limiter.name)
            seen = {"log": 0, "ahead": 0, "done": 0}
            sc.enter(
                "starting the PING process (every 1 ms, own connection)",
            )
            pinger = Pinger(url)
            await asyncio.to_thread(pinger.start)
            try:
                sc.enter(
                    f"{args.queue_tasks:,} tasks call acquire() at once",
                    lambda: (
                        f"{seen['log']:,} grants in the log, {seen['ahead']:,} reservations "
                        f"ahead, {seen['done']:,} tasks done"
                    ),
                )
                async with ServerLog(admin) as server:
                    began = time.monotonic()
                    tasks = [
                        asyncio.ensure_future(limiter.acquire()) for _ in range(args.queue_tasks)
                    ]

                    async def all_queued() -> bool:
                        # Done first: a task done by now is not among the reservations ahead
                        # read next, so none is counted twice.
                        seen["done"] = sum(t.done() for t in tasks)
                        seen["log"], seen["ahead"] = await future_grants(admin, key)
                        return (
                            seen["log"] >= args.queue_tasks
                            or seen["ahead"] + seen["done"] >= args.queue_tasks
                        )

                    await until(all_queued, f"{args.queue_tasks:,} grants", args.deadline)
                    queued_s = time.monotonic() - began
                    scripts = await server.stop()
                failed = [
                    exc
                    for t in tasks
                    if t.done() and not t.cancelled() and (exc := t.exception()) is not None
                ]
                sc.put(
                    "queue_ms",
                    f"time to queue {args.queue_tasks:,} acquire()",
                    queued_s * 1000,
                    "ms",
                )
                sc.put(
                    "queue_longest_script_ms",
                    "longest script while queueing",
                    scripts.longest_ms,
                    "ms",
                    f"{fmt(scripts.longest_ms, 'ms')} ({scripts.calls:,} script calls, "
                    f"{fmt(scripts.total_ms, 'ms')} in all)",
                )
                if failed:
                    sc.put(
                        "queue_errors",
                        "acquire() calls that raised",
                        len(failed),
                        text=f"{len(failed):,}, e.g. {one_line(failed[0])}",
                    )

                sc.enter(f"one acquire behind the {args.queue_tasks:,}")
                deep_ms, deep_log, deep_ahead = await probe(admin, limiter)
                sc.put(
                    "acquire_depth_5000_ms",
                    f"server time of one acquire() behind {deep_ahead:,} queued "
                    f"({deep_log:,} grants in the log)",
                    deep_ms,
                    "ms",
                )
                if deep_ms is not None and short_ms:
                    sc.put("acquire_depth_ratio", "ratio deep / short", deep_ms / short_ms, "x")

                sc.enter("cancelling every task; waiting for the hand-backs")
                before, ahead = await future_grants(admin, key)
                await stop_tasks(tasks)
                # The hand-backs are the only scripts now.
                seconds, log, left = await settle(
                    admin, key, lambda _, ahead: ahead == 0, args.deadline
                )
                sc.put(
                    "hand_back",
                    f"cancel all ({ahead:,} reservations ahead): hand-backs",
                    {"ms": seconds * 1000, "removed": before - log, "never_handed_back": left},
                    text=f"{before - log:,} grants removed in {fmt(seconds * 1000, 'ms')}"
                    + (
                        f"; {left:,} reservations never handed back (no caller left)"
                        if left
                        else ""
                    ),
                )
            finally:
                ping = await asyncio.to_thread(pinger.stop)
                sc.put(
                    "ping",
                    "PING every 1 ms from another connection: p50 / p99 / max",
                    ping,
                    text=f"{fmt(ping['p50_ms'])} / {fmt(ping['p99_ms'])} / "
                    f"{fmt(ping.get('max_ms'))} ms ({ping['pings']:,} pings, "
                    f"{ping['errors']:,} errors, {ping['busy']:,} of them BUSY)",
                )
        finally:
            await stop_tasks(tasks)


# -- 2. big window ------------------------------------------------------------------------------


async def big_window(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    async with clients(url) as (redis, admin):
        limiter = RateLimiter(f"stress-window-{args.token}", backend_for(redis))
        key = permits_key(limiter.name)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, WINDOW_RATE, 3600))
        counts = {"asked": 0, "granted": 0}

        async def fill(total: int) -> None:
            async def worker() -> None:
                while counts["asked"] < total:
                    counts["asked"] += 1
                    granted = await limiter.try_acquire()
                    counts["granted"] += granted

            await asyncio.gather(*(worker() for _ in range(WINDOW_TASKS)))

        async def one() -> tuple[float | None, int]:
            """The median server time of PROBES single try_acquire() calls, one at a time."""
            log = int(await admin.zcard(key))
            samples: list[float] = []
            for _ in range(PROBES):
                async with ServerLog(admin) as server:
                    if not server.on:
                        break
                    await limiter.try_acquire()
                    longest = (await server.stop()).longest_ms
                if longest is not None:
                    samples.append(longest)
            return median(samples), log

        def status() -> str:
            return f"{counts['granted']:,} granted of {counts['asked']:,} asked"

        sc.enter(f"filling to {WINDOW_SMALL:,} grants", status)
        await fill(WINDOW_SMALL)
        small_ms, small_log = await one()
        sc.put(
            "acquire_1k_ms",
            f"server time of one acquire, {small_log:,} grants in the window",
            small_ms,
            "ms",
        )
        sc.enter(f"filling to {args.window_grants:,} grants ({WINDOW_TASKS} tasks)", status)
        began = time.monotonic()
        await fill(args.window_grants)
        seconds = time.monotonic() - began
        sc.put(
            "fill_grants_per_s",
            f"filling: try_acquire() from {WINDOW_TASKS} tasks",
            (args.window_grants - WINDOW_SMALL) / seconds,
            "grants/s",
        )
        big_ms, big_log = await one()
        sc.put(
            "acquire_200k_ms",
            f"server time of one acquire, {big_log:,} grants in the window",
            big_ms,
            "ms",
        )
        if small_ms and big_ms is not None:
            sc.put(
                "acquire_ratio", f"ratio {args.window_grants // 1000}k / 1k", big_ms / small_ms, "x"
            )
        grants = int(await admin.zcard(key))
        size = int(await admin.memory_usage(key, samples=0) or 0)
        sc.put(
            "bytes_per_grant",
            "MEMORY USAGE of the permits zset per grant",
            size / max(grants, 1),
            "bytes",
            f"{size / max(grants, 1):.1f} bytes ({size:,} bytes / {grants:,} grants)",
        )
        refused = counts["asked"] - counts["granted"]
        if refused:
            sc.put("refused", "try_acquire() refused (should be none)", refused)


# -- 3. PER_CLIENT admin at scale ---------------------------------------------------------------


async def per_client(sc: Scenario, url: str, args: argparse.Namespace) -> None:
    n = args.clients
    async with clients(url) as (redis, admin):
        backend = backend_for(redis)
        name = f"stress-clients-{args.token}"
        limiter = RateLimiter(name, backend)

        async def take(count: int) -> int:
            """Clients user-0 .. user-<count - 1> take a permit each, 1 000 at a time."""
            done = {"taken": 0, "granted": 0}
            sc.enter(
                f"{count:,} clients take a permit",
                lambda: f"{done['taken']:,} / {count:,} ({done['granted']:,} granted)",
            )
            for start in range(0, count, CHUNK):
                granted = await asyncio.gather(
                    *(
                        RateLimiter(name, backend.with_client(f"user-{i}")).try_acquire()
                        for i in range(start, min(start + CHUNK, count))
                    )
                )
                done["taken"] += len(granted)
                done["granted"] += sum(granted)
            return done["granted"]

        async def admin_call(
            key: str,
            label: str,
            call: Callable[[], Awaitable[Any]],
            after: Callable[[], None] | None = None,
        ) -> bool:
            """Times one call over every client: wall time, outcome, longest script."""
            sc.enter(label)
            async with ServerLog(admin) as server:
                began = time.monotonic()
                try:
                    result = await asyncio.wait_for(call(), OP_TIMEOUT)
                    ok, outcome = True, f"ok (returned {result})"
                except (asyncio.TimeoutError, TimeoutError):
                    ok, outcome = False, f"timed out after {OP_TIMEOUT:.0f} s"
                except Exception as exc:
                    ok, outcome = False, f"FAILED: {one_line(exc)}"
                wall_ms = (time.monotonic() - began) * 1000
                if after is not None:
                    after()
                scripts = await server.stop()
            sc.put(
                key,
                label,
                {
                    "ok": ok,
                    "outcome": outcome,
                    "wall_ms": wall_ms,
                    "longest_script_ms": scripts.longest_ms,
                },
                text=f"{outcome}; {fmt(wall_ms, 'ms')} wall, longest script "
                f"{fmt(scripts.longest_ms, 'ms')}",
            )
            sc.say(f"{label}: {outcome}")
            return ok

        await limiter.set_rate(
            RateLimiterConfig.build(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL)
        )
        granted = await take(n)
        sc.put("clients", "clients with a permit", granted)
        await admin_call("expire", f"expire(3600) over {n:,} clients", lambda: limiter.expire(3600))
        await admin_call("clear_expire", "clear_expire()", limiter.clear_expire)
        await admin_call(
            "update_rate",
            f"update_rate(PER_CLIENT, {CLIENT_RATE_UPDATED}, {CLIENT_INTERVAL})",
            lambda: limiter.update_rate(
                RateLimiterConfig.build(RateType.PER_CLIENT, CLIENT_RATE_UPDATED, CLIENT_INTERVAL)
            ),
        )
        await admin_call(
            "set_rate",
            f"set_rate(PER_CLIENT, {CLIENT_RATE}, {CLIENT_INTERVAL}, keep_state=False)",
            lambda: limiter.set_rate(
                RateLimiterConfig.build(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL),
                keep_state=False,
            ),
        )
        registered = int(await admin.zcard(f"{PREFIX}{{{name}}}:clients"))
        if registered < n:  # set_rate cleared them: give delete() its N clients back
            await take(n)
            registered = int(await admin.zcard(f"{PREFIX}{{{name}}}:clients"))
        await admin_call("delete", f"delete() over {registered:,} clients", limiter.delete)
        sc.enter("counting the keys left (SCAN)")
        left = await count_keys(admin, name)
        sc.put("keys_left", "keys with the limiter's prefix left after delete()", left)

        # update_rate and delete while 1 000 new client ids arrive per second.
        sc.enter("clearing the keys left")
        await purge(admin, name)
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.PER_CLIENT, CLIENT_RATE, CLIENT_INTERVAL)
        )
        await take(n)
        stop = asyncio.Event()
        churned = {"new": 0, "granted": 0, "deleted": 0, "errors": 0, "ms": 0}
        errors: Counter[str] = Counter()
        churn = asyncio.ensure_future(newcomers(name, backend, stop, churned, errors))
        try:
            sc.enter(f"{CHURN_PER_SECOND:,} new clients/s for 1 s first")
            await asyncio.sleep(1.0)
            ok_update = await admin_call(
                "churn_update_rate",
                f"update_rate over {n:,} clients, {CHURN_PER_SECOND:,} new clients/s",
                lambda: limiter.update_rate(
                    RateLimiterConfig.build(
                        RateType.PER_CLIENT, CLIENT_RATE_UPDATED, CLIENT_INTERVAL
                    )
                ),
            )
            ok_delete = await admin_call(
                "churn_delete",
                f"delete over {n:,}+ clients, {CHURN_PER_SECOND:,} new clients/s",
                limiter.delete,
                after=stop.set,  # no newcomers once the limiter is gone
            )
        finally:
            stop.set()
            await asyncio.wait([churn], timeout=10)
            churn.cancel()
        seconds = max(churned["ms"] / 1000, 1e-3)
        sc.put(
            "churn",
            "new clients meanwhile (1 s before update_rate, until delete returned)",
            {**churned, "errors_by_message": dict(errors)},
            text=f"{churned['new']:,} in {seconds:.1f} s ({churned['new'] / seconds:,.0f}/s): "
            f"{churned['granted']:,} granted, {churned['deleted']:,} found the limiter deleted, "
            f"{churned['errors']:,} other errors"
            + "".join(f"; {count:,} x {message}" for message, count in errors.most_common(2)),
        )
        sc.put(
            "churn_both_ok",
            "update_rate and delete both succeed under churn",
            ok_update and ok_delete,
        )


async def newcomers(
    name: str,
    backend: RedisBackend,
    stop: asyncio.Event,
    counts: dict[str, int],
    errors: Counter[str],
) -> None:
    """A new client id takes a permit every 1 ms (1 000 per second), until ``stop``."""
    pending: set[asyncio.Task[bool]] = set()

    async def one(client: str) -> bool:
        try:
            granted = await RateLimiter(name, backend.with_client(client)).try_acquire()
        except NotConfiguredError:  # asked while (or after) delete() ran
            counts["deleted"] += 1
            return False
        except LimiterError as exc:
            counts["errors"] += 1
            errors[one_line(exc)] += 1
            return False
        counts["granted"] += granted
        return granted

    began = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - began) * CHURN_PER_SECOND)
        while counts["new"] < due:
            task = asyncio.ensure_future(one(f"new-{counts['new']}"))
            pending.add(task)
            task.add_done_callback(pending.discard)
            counts["new"] += 1
        await asyncio.sleep(0.005)
    counts["ms"] = round((time.monotonic() - began) * 1000)
    if pending:
        await asyncio.wait(pending, timeout=5)


async def purge(admin: AsyncRedis, name: str) -> None:
    batch: list[str] = []
    async for key in admin.scan_iter(match=f"{PREFIX}{{{name}}}*", count=10_000):
        batch.append(key)
        if len(batch) >= 1_000:
            await admin.unlink(*batch)
            batch = []
    if batch:
        await admin.unlink(*batch)
