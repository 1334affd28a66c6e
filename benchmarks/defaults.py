"""What a user writes first: processes x tasks at a partner's exact quota, at the defaults.

    python benchmarks/defaults.py                       # ~4 min: 3 partners x 3 clients x 2
    python benchmarks/defaults.py --duration 6 --partner sliding --client httpx
    python benchmarks/defaults.py --busy 2              # beside 2 processes that spin

Cold, as a fleet starts: fresh processes for each run, no warm-up, one redis-server on a
free 127.0.0.1 port. ``--processes`` x ``--tasks`` callers take permits from a limiter of
the partner's exact quota (``tools/partner.py``: a strict sliding window, fixed windows, a
token bucket, each counting arrivals) through ``RateLimitedTransport`` (httpx),
``RateLimitedClientMiddleware`` (aiohttp) or ``await limiter.acquire()`` before a plain
request on the caller's own ``httpx.AsyncClient``, and send as fast as they are let. Each
pair runs twice: with ``margin=0`` (the exact rate: the default before the measured margin)
and at the defaults (the fleet's measured margin). For each: the 429s of the whole run (the
first burst included), the share of the quota delivered over the steady windows, the
lateness spread a margin has to cover, and the margin the fleet settled on (the store's,
after the run); "limiter's 429s" are those among requests whose lateness stayed within that
margin of one another's (``tools.partner.unexcused``: the others landed later than any
margin covers, a process the machine did not run); "stall" the longest any caller's event
loop did not run.

The partner runs in a thread of this process, raised to nice -10 where allowed (root, or
``CAP_SYS_NICE``; the heading says which): a real partner is remote, and its clock stamps
arrivals whatever the callers' machine does, while one that shares a busy machine with its
callers and is not run for a while stamps a backlog "at once", late, and refuses requests
for a burst no caller sent. ``--busy N`` adds N processes that spin meanwhile.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from _harness import Table, local_redis, machine, parser, report, say

from tools.partner import CLIENTS, KINDS, Seen, Trial, partner_priority, trial

MODES: tuple[tuple[str, float | None], ...] = (("margin=0 (before)", 0.0), ("defaults", None))


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` processes that spin meanwhile: a machine kept busy by other work."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    spinners = [context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(processes)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(5)


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--processes", type=int, default=5)
    arguments.add_argument("--tasks", type=int, default=4, help="per process")
    arguments.add_argument("--rate", type=int, default=10, help="the partner's quota")
    arguments.add_argument("--windows-of", type=float, default=1.0, dest="interval")
    arguments.add_argument("--duration", type=float, default=12.0, help="seconds per run")
    arguments.add_argument("--partner", choices=KINDS, action="append")
    arguments.add_argument("--client", choices=CLIENTS, action="append")
    arguments.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    arguments.add_argument("--only-defaults", action="store_true", help="skip margin=0")
    args = arguments.parse_args()
    kinds, clients = args.partner or KINDS, args.client or CLIENTS
    modes = MODES[1:] if args.only_defaults else MODES
    table = Table(
        [
            "mode",
            "partner",
            "client",
            "429s",
            "limiter's 429s",
            "calls",
            "quota delivered",
            "spread ms",
            "stall ms",
            "settled margin ms",
        ],
        left=3,
    )
    rows = []
    with local_redis() as url, busy(args.busy):
        heading = machine(url)
        for label, margin in modes:
            for kind in kinds:
                for client in clients:
                    say(f"{label}: {kind} through {client}, {args.duration:g} s")
                    prefix = f"defaults-{time.time_ns()}"
                    spec = Trial(
                        url,
                        processes=args.processes,
                        tasks=args.tasks,
                        rate=args.rate,
                        interval=args.interval,
                        duration=args.duration,
                        margin=margin,
                        partners=((kind, client),),
                        prefix=prefix,
                    )
                    (result,) = trial(spec)
                    rows.append(_row(table, label, result))
    table.title = (
        f"{args.processes} processes x {args.tasks} tasks, cold, at a partner's exact quota "
        f"{args.rate} per {args.interval:g} s, {args.duration:g} s per run"
        + (f", beside {args.busy} spinning processes" if args.busy else "")
        + f"; {partner_priority()}"
    )
    report(args, heading, [table], {"runs": rows})


def _row(table: Table, label: str, result: Seen) -> dict[str, Any]:
    def ms(seconds: float | None) -> str:
        return "n/a" if seconds is None else f"{seconds * 1000:.1f}"

    table.add(
        label,
        result.kind,
        result.client,
        result.refused,
        "-" if result.settled is None else result.unexcused,  # (judged by the settled margin)
        result.served + result.refused,
        f"{result.share:.1%}",
        ms(result.spread),
        ms(result.stall),
        ms(result.settled) if result.settled is not None else "-",
    )
    return {"mode": label, **result.__dict__}


if __name__ == "__main__":
    main()
