"""The partner's view: processes x tasks at exactly a partner's quota, and the 429s it answers.

    python benchmarks/partner.py                          # ~45 s: the three partners, margins
    python benchmarks/partner.py --margin 0 --margin 0.02 --duration 12 --windows-of 1

A partner counts requests as they *arrive*, in its own window (``tools/partner.py``: a strict
sliding window, fixed windows aligned to its clock, a token bucket of the quota's size) and
answers 429 with ``Retry-After`` past the quota; every 429 pauses every caller of the limiter
for that long. ``--processes`` x ``--tasks`` callers per partner (separate processes, one
redis-server on a free 127.0.0.1 port) take permits from a limiter of the partner's quota
with ``--margin`` seconds added to its interval, through ``RateLimitedTransport`` (httpx),
``RateLimitedClientMiddleware`` (aiohttp), or ``await limiter.acquire()`` before a plain
request, and send as fast as they are let. For each partner and margin: the 429s (and of them, those
the limiter's schedule is to blame for: its request and the ones the partner counted with it
arrived within the margin of one another's lateness), the share
of the quota delivered over the steady windows (from the first arrival), and how late
requests arrived after their grant's start (p50, p99, and the spread p99 - p1 that a margin
has to cover).
"""

from __future__ import annotations

from typing import Any

from _harness import Table, local_redis, machine, parser, report, say

from tools.partner import CLIENTS, KINDS, Seen, Trial, trial

PAIRS = tuple(zip(KINDS, CLIENTS, strict=True))  # each partner with another client


def _row(table: Table, margin: float, result: Seen) -> dict[str, Any]:
    def ms(seconds: float | None) -> str:
        return "n/a" if seconds is None else f"{seconds * 1000:.1f}"

    table.add(
        result.kind,
        result.client,
        f"{margin * 1000:g}",
        result.refused,
        result.unexcused,
        f"{result.share:.1%}",
        result.windows,
        f"{ms(result.late_p50)} / {ms(result.late_p99)}",
        ms(result.spread),
        result.most_in_a_window,
    )
    return {"margin": margin, **result.__dict__}


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--processes", type=int, default=5)
    arguments.add_argument("--tasks", type=int, default=4, help="per process and partner")
    arguments.add_argument("--rate", type=int, default=10, help="the partner's quota")
    arguments.add_argument("--windows-of", type=float, default=1.0, dest="interval")
    arguments.add_argument("--duration", type=float, default=12.0, help="seconds per run")
    arguments.add_argument(
        "--margin", type=float, action="append", help="seconds (repeatable; 0 and 0.02)"
    )
    arguments.add_argument(
        "--partner", choices=KINDS, action="append", help="only these partners (repeatable)"
    )
    args = arguments.parse_args()
    pairs = tuple((kind, client) for kind, client in PAIRS if kind in (args.partner or KINDS))
    margins = args.margin or [0.0, 0.02]
    table = Table(
        [
            "partner",
            "client",
            "margin ms",
            "429s",
            "limiter's 429s",
            "quota delivered",
            "windows",
            "late p50 / p99 ms",
            "spread ms",
            "most in a window",
        ],
        left=2,
    )
    rows = []
    with local_redis() as url:
        heading = machine(url)
        for margin in margins:
            say(f"margin {margin * 1000:g} ms: {args.duration:g} s")
            spec = Trial(
                url,
                processes=args.processes,
                tasks=args.tasks,
                rate=args.rate,
                interval=args.interval,
                duration=args.duration,
                margin=margin,
                partners=pairs,
                prefix=f"bench-{margin}",
            )
            for result in trial(spec):
                rows.append(_row(table, margin, result))
    table.title = (
        f"{args.processes} processes x {args.tasks} tasks per partner, the partner's quota "
        f"{args.rate} per {args.interval:g} s, {args.duration:g} s per run"
    )
    report(args, heading, [table], {"runs": rows})


if __name__ == "__main__":
    main()
