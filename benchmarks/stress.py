"""Heavy and hostile scenarios on a real redis-server: what each one costs Redis, and whether it
works at all.

    python benchmarks/stress.py              # 1 000 / 20 000 / 5 000 (below): ~30 s
    python benchmarks/stress.py --full       # 5 000 / 200 000 / 100 000: ~1.5 minutes
    python benchmarks/stress.py --redis redis://127.0.0.1:6379 --json
    python benchmarks/stress.py --only queue # or window, clients (repeatable)

Starts its own redis-server on a free 127.0.0.1 port (stopped at the end) unless ``--redis``
is given, runs the scenarios below through aiolimit's public API, one after another, and
prints one table (``--json``: the same figures as JSON). Progress goes to stderr.

Server time comes from the slow log: while a figure is measured ``slowlog-log-slower-than``
is 0 and ``slowlog-max-len`` 1 000 000 (both restored afterwards), and "longest script" is the
longest EVAL/EVALSHA/FCALL logged meanwhile. Redis 7 also logs every command a script runs, which
makes a command-heavy script some 20-30% slower than unobserved; the log is summed up by a
script on the server, since reading 500 000 entries here would take longer than the test.
"Server time of one acquire" is the median of 9 single calls, one at a time.

The limiters run on ``redis.asyncio.Redis.from_url(url)`` as a user would create it, so
redis-py's own defaults apply (in redis-py 8 a socket timeout of 5 s: calls answered by a
script that blocks Redis longer fail, and the table says so). The measuring client and the
PING process have no socket timeout, so a stalled server shows in full.

1. Deep queue: an OVERALL limiter of 100 per 1 s; ``--queue-tasks`` (1 000; ``--full``
   5 000) tasks call ``acquire()`` at once, so all but 100 get reservations (49 s ahead at
   5 000); once every task has its grant (ZCARD of the
   permits zset, or: reservations still ahead + tasks already done) all are cancelled and
   their reservations handed back. Reported: the time to queue them, the longest script
   meanwhile, the latency of a PING sent every 1 ms by another process on its own
   connection, and the server time of one more acquire() behind 10 and behind them all.
2. Big window: 1 000 000 per hour on one budget, filled with ``--window-grants`` (20 000;
   ``--full`` 200 000) single-permit grants (try_acquire from 64 tasks): the server time of
   one acquire at 1 000 and at that many grants in the window, and MEMORY USAGE of the
   permits zset per grant.
3. PER_CLIENT admin at scale: rate 10 per 60 s; ``--clients`` N (5 000; ``--full``
   100 000) take
   a permit each, then expire(3600), clear_expire(), update_rate(20/60), set_rate(10/60,
   keep_state=False) and
   delete() act on all of them (wall time, outcome, longest script). set_rate clears every
   client, so the clients take a permit again before delete(); then the keys left (SCAN).
   Last, update_rate and delete over N clients while another task brings 1 000 new client
   ids per second.

A scenario that fails is reported with its error and the next one runs; one that outlives its
deadline (``--deadline``, 120 s) is reported as timed out. A server left busy by a script gets
SCRIPT KILL, and our own server is restarted when that does not help.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _harness import Table, machine, parser, report, say
from _stress_scenarios import big_window, deep_queue, per_client
from _stress_server import (
    DEADLINE,
    PREFIX,
    SETTLE,
    Scenario,
    _pingers,
    fmt,
    one_line,
)
from redis import Redis
from redis import exceptions as redis_errors

import aiolimit
from tools import LocalRedis

# 1., 2., 3.: (default, --full)
SCALE = {"queue_tasks": (1_000, 5_000), "window_grants": (20_000, 200_000),
         "clients": (5_000, 100_000)}  # fmt: skip

# -- running the scenarios, bounded -------------------------------------------------------------

Body = Callable[[Scenario, str, argparse.Namespace], Awaitable[None]]


async def _bounded(sc: Scenario, body: Body, url: str, args: argparse.Namespace) -> None:
    ticker = asyncio.ensure_future(sc.ticker())
    task = asyncio.ensure_future(body(sc, url, args))
    began = time.monotonic()
    try:
        done, _ = await asyncio.wait({task}, timeout=args.deadline)
        if task in done:
            exc = task.exception()
            sc.status = "ok" if exc is None else f"FAILED while {sc.phase}: {one_line(exc)}"
        else:
            sc.status = f"TIMED OUT after {args.deadline:.0f} s, while {sc.phase}"
            task.cancel()
            await asyncio.wait({task}, timeout=15)
    finally:
        ticker.cancel()
        sc.seconds = time.monotonic() - began
    sc.say(sc.status)


def run(sc: Scenario, body: Body, url: str, args: argparse.Namespace) -> None:
    """Runs one scenario on a loop of its own; whatever is left of it afterwards is cancelled,
    never waited for without bound."""
    sc.began = time.monotonic()
    sc.say(f"{sc.title} (deadline {args.deadline:.0f} s)")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_bounded(sc, body, url, args))
    except BaseException as exc:  # the runner itself: say so and go on
        sc.status = f"FAILED: {one_line(exc)}"
        if not isinstance(exc, Exception):
            raise
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))
        loop.close()
        for pinger in list(_pingers):
            pinger.stop()


def recover(url: str, server: LocalRedis | None, saved: dict[str, str], token: str) -> None:
    """Leaves the server answering, with its slow-log settings and without our keys."""
    client = Redis.from_url(url, socket_timeout=10, decode_responses=True)
    deadline = time.monotonic() + SETTLE
    killed = False
    try:
        while True:
            try:
                client.ping()
                break
            except redis_errors.ResponseError as exc:
                if "BUSY" not in str(exc):
                    raise
                if not killed:
                    killed = True
                    print("  server busy: SCRIPT KILL", file=sys.stderr)
                    with contextlib.suppress(redis_errors.RedisError):
                        client.script_kill()
            except (redis_errors.ConnectionError, redis_errors.TimeoutError):
                pass
            if time.monotonic() > deadline:
                if server is None:
                    print("  server still busy; going on", file=sys.stderr)
                    return
                print("  server still busy: restarting it", file=sys.stderr)
                server.crash_and_restart()
                client = Redis.from_url(url, socket_timeout=10, decode_responses=True)
                deadline = time.monotonic() + SETTLE
            time.sleep(0.1)
        for name, value in saved.items():
            client.config_set(name, value)
        client.slowlog_reset()
        if server is not None:
            client.flushall()
        else:
            batch: list[str] = []
            for key in client.scan_iter(match=f"{PREFIX}{{stress-*-{token}}}*", count=10_000):
                batch.append(key)
                if len(batch) >= 1_000:
                    client.unlink(*batch)
                    batch = []
            if batch:
                client.unlink(*batch)
    except redis_errors.RedisError as exc:
        print(f"  could not tidy the server: {one_line(exc)}", file=sys.stderr)
    finally:
        client.close()


def table(scenarios: list[Scenario]) -> Table:
    out = Table(["scenario", "measure", "result"], left=3)
    for sc in scenarios:
        out.add(sc.title, "status", f"{sc.status} ({sc.seconds:.0f} s)")
        for m in sc.measures:
            out.add("", m.label, m.text if m.text is not None else fmt(m.value, m.unit))
    return out


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument(
        "--full", action="store_true", help="the docs' scale: 5 000 / 200 000 / 100 000"
    )
    cli.add_argument("--queue-tasks", type=int, help="1.: tasks queued at once (1 000)")
    cli.add_argument("--window-grants", type=int, help="2.: grants in the window (20 000)")
    cli.add_argument("--clients", type=int, help="3.: PER_CLIENT clients (5 000)")
    cli.add_argument("--redis", metavar="URL", help="use this server (default: start one)")
    cli.add_argument("--deadline", type=float, default=DEADLINE, help="seconds per scenario")
    cli.add_argument(
        "--only", action="append", choices=["queue", "window", "clients"], help="repeatable"
    )
    args = cli.parse_args()
    for name, (small, full) in SCALE.items():
        if getattr(args, name) is None:
            setattr(args, name, full if args.full else small)
    args.token = secrets.token_hex(3)
    scenarios: list[tuple[Scenario, Body]] = [
        (Scenario("queue", f"1. deep queue ({args.queue_tasks:,} x acquire, 100/s)"), deep_queue),
        (Scenario("window", f"2. big window ({args.window_grants:,} grants, 1M/h)"), big_window),
        (Scenario("clients", f"3. PER_CLIENT admin ({args.clients:,} clients)"), per_client),
    ]
    if args.only:
        scenarios = [(sc, body) for sc, body in scenarios if sc.key in args.only]
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        server: LocalRedis | None = None
        if args.redis:
            url = args.redis
        else:
            server = stack.enter_context(LocalRedis())
            url = server.url
        say(f"stress: aiolimit from {Path(aiolimit.__file__).parent}, redis at {url}")
        try:
            about = machine(url)
        except redis_errors.RedisError as exc:
            say(f"stress: cannot reach {url}: {one_line(exc)}")
            raise SystemExit(2) from None
        saved: dict[str, str] = {}
        with (
            contextlib.suppress(redis_errors.RedisError),
            Redis.from_url(url, socket_timeout=10, decode_responses=True) as redis,
        ):
            got = redis.config_get("slowlog-*")
            saved = {k: got[k] for k in ("slowlog-log-slower-than", "slowlog-max-len") if k in got}
        for sc, body in scenarios:
            run(sc, body, url, args)
            recover(url, server, saved, args.token)
    seconds = time.monotonic() - began
    figures = [
        {"key": sc.key, "title": sc.title, "status": sc.status, "seconds": round(sc.seconds, 1),
         "measures": {m.key: m.value for m in sc.measures}}
        for sc, _ in scenarios
    ]  # fmt: skip
    heading = f"Machine: {about}. Run took {seconds:.0f} s."
    report(args, heading, [table([sc for sc, _ in scenarios])], {"scenarios": figures})


if __name__ == "__main__":
    main()
