"""Client CPU per grant: aiolimit beside a bare asyncio client sending the same calls.

    python benchmarks/client_cpu.py                                  # real time, ~20 s
    python benchmarks/client_cpu.py --measure instructions           # valgrind, ~5 minutes
    python benchmarks/client_cpu.py --measure backend                # no server, ~10 s
    python benchmarks/client_cpu.py --measure httpx                  # valgrind, ~1 minute
    python benchmarks/client_cpu.py --checkout /tmp/aiolimit-main --checkout . --rounds 5
    python benchmarks/client_cpu.py --options protocol=2             # clients in RESP2

``--measure grant`` (the default): 64 tasks take one permit at a time from ``--limiters``
token-bucket limiters that never refuse, through aiolimit and through the bare client of
benchmarks/_bare_client.py (the least a client sending the same calls can do); each client
in a fresh process, in alternating rounds; medians of the client's CPU time
(``time.process_time``) per grant, and calls per second.

``--measure instructions``: each client's process under valgrind (callgrind) for
``--grants`` / 5 and ``--grants`` grants; the difference of the instructions counted, per
grant, does not move with the machine's load (needs valgrind).

``--measure backend``: what the coalescer and the acquire script's Python side do for 32
requests on 32 limiters that share a round trip, with no server: the request made and queued,
the acquire_many call built, the round trip packed, a canned reply split, each caller's
future settled and its reply decoded. µs per request, the best of 7 repeats of 300 batches.

``--measure httpx``: instructions per call (callgrind, as above) of 64 tasks sending
``GET /`` through an httpx client, with aiolimit's ``RateLimitedTransport`` on a memory
limiter that never refuses, beside the bare client (the same ``MockTransport``, answering
200 at once, no limiter): what the HTTP client's flow adds to a call, with its grant.

Every measure takes ``--checkout PATH`` (repeatable) for aiolimit's rows. The clients are
redis-py's ``Redis.from_url`` with its defaults (redis-py 8: RESP3, a 5 s socket timeout),
or with ``--options`` (a URL query: ``protocol=2&socket_timeout=1``). Starts its own
redis-server on a free 127.0.0.1 port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import timeit
from typing import Any

from _harness import (
    ROOT,
    Table,
    Variant,
    alternate,
    checkouts,
    child_main,
    flush,
    local_redis,
    machine,
    medians,
    number,
    parser,
    report,
    say,
)

BATCH = 32  # requests of one round trip in --measure backend


def backend_cost() -> dict[str, float]:
    """µs per request of the backend's part of a round trip of 32 requests (no server)."""
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
    keys = [Keys("aiolimit:", f"bench-{i}").budget(overall, "", True) for i in range(BATCH)]
    line = b"0 999999 0 1700000000123456 0 1:1700000000123456:1"
    reply = b"\n".join([line] * BATCH)

    async def run() -> float:
        pipe: Any = Coalescer(object())
        loop = asyncio.get_running_loop()

        def batch() -> None:
            for i in range(BATCH):
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
        return best / 300 / BATCH * 1e6

    return {"backend_us": asyncio.run(run())}


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    """In a child: one client, measured once."""
    if args.measure == "backend":
        return backend_cost()
    from _bare_client import Count, http_run, run, timed

    if args.grants_only:  # under valgrind: a number of grants, not a time
        counted = Count(args.grants_only)
        if args.measure == "httpx":
            asyncio.run(http_run(args.client, counted))
        else:
            asyncio.run(run(args.client, args.url, args.limiters, args.algorithm, counted))
        return {}
    return asyncio.run(timed(args.client, args.url, args.limiters, args.algorithm, args.duration))


def variants(args: argparse.Namespace) -> list[Variant]:
    mine = [Variant(v.label, v.path, ("--client", "aiolimit")) for v in checkouts(args)]
    if args.measure == "backend":
        return mine
    return [*mine, Variant("bare client", ROOT, ("--client", "bare"))]


def instructions(args: argparse.Namespace, url: str, variant: Variant) -> float:
    """Instructions per grant of one client's process, counted by callgrind: two runs."""
    totals = []
    for grants in (args.grants // 5, args.grants):
        flush(url)
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             sys.executable, __file__, "--child", *child_args(args, url), *variant.extra,
             "--grants-only", str(grants)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(variant.path)},
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or found is None:
            raise SystemExit(f"no count from valgrind:\n{done.stderr[-2000:]}")
        totals.append(int(found.group(1)))
        say(f"{variant.label}: {grants:,} grants counted")
    return (totals[1] - totals[0]) / (args.grants - args.grants // 5)


def child_args(args: argparse.Namespace, url: str) -> list[str]:
    if args.options:  # redis-py reads them off the URL
        url += f"/0?{args.options}"
    return [
        "--measure", args.measure, "--url", url, "--limiters", str(args.limiters),
        "--algorithm", args.algorithm, "--duration", str(args.duration),
    ]  # fmt: skip


def main() -> None:
    cli = parser(__doc__, checkouts=True)
    cli.add_argument(
        "--measure", choices=["grant", "instructions", "backend", "httpx"], default="grant"
    )
    cli.add_argument("--duration", type=float, default=2.0, help="seconds measured per run (2)")
    cli.add_argument("--limiters", type=int, default=10_000, help="(10000)")
    cli.add_argument("--algorithm", default="token_bucket", help="(token_bucket)")
    cli.add_argument("--grants", type=int, default=10_000, help="with instructions (10000)")
    cli.add_argument(
        "--options", default="", help="the clients' redis-py options as a URL query (protocol=2)"
    )
    cli.add_argument("--client", choices=["aiolimit", "bare"], help=argparse.SUPPRESS)
    cli.add_argument("--url", help=argparse.SUPPRESS)
    cli.add_argument("--grants-only", type=int, help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.child:
        child_main(lambda: one_round(args))
        return
    with local_redis() as url:
        about = machine(url)
        if args.measure in ("instructions", "httpx"):
            counted = {
                v.label: {"instructions": instructions(args, url, v)} for v in variants(args)
            }
            figures = {label: [value] for label, value in counted.items()}
        else:
            figures = alternate(__file__, variants(args), args.rounds, child_args(args, url))
    results = {label: medians(rounds) for label, rounds in figures.items()}
    report(args, heading(args, about), [table(args, results)], {"medians": results})


def heading(args: argparse.Namespace, about: str) -> str:
    if args.measure == "backend":
        return f"Machine: {about}. {BATCH} requests a round trip, no server; best of 7 repeats."
    what = f"{args.limiters:,} {args.algorithm} limiters, 64 tasks, one permit each time"
    if args.options:
        what += f", clients with {args.options}"
    if args.measure == "httpx":
        return f"Machine: {about}. 64 tasks, GET / through httpx; valgrind, {args.grants:,} calls."
    if args.measure == "instructions":
        return f"Machine: {about}. {what}; valgrind, {args.grants:,} grants."
    return f"Machine: {about}. {what}; medians of {args.rounds} rounds of {args.duration:g} s."


def table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> Table:
    if args.measure == "backend":
        out = Table(["checkout", "backend µs / request"])
        for label, figures in results.items():
            out.add(label, number(figures["backend_us"], 2))
        return out
    key = "instructions" if args.measure in ("instructions", "httpx") else "client_cpu"
    floor = results["bare client"][key]
    unit = "instructions / grant" if key == "instructions" else "client CPU µs / grant"
    if args.measure == "httpx":
        unit = "instructions / call"
    out = Table(["client", "calls/s", unit, "vs bare client"])
    for label, figures in results.items():
        out.add(
            label,
            number(figures.get("calls")),
            number(figures[key], 0 if key == "instructions" else 1),
            f"{figures[key] / floor:.2f}x",
        )
    return out


if __name__ == "__main__":
    main()
