"""reserve() by hand beside the transport: how much of a tokens quota each fills, at the defaults.

    python benchmarks/reserve.py                        # ~1 min: 4 processes x 24 tasks
    python benchmarks/reserve.py --margin 0 --margin 0.05
    git archive main aiolimit | tar -x -C /tmp/aiolimit-main
    python benchmarks/reserve.py --checkout /tmp/aiolimit-main --checkout .

The provider (``tools/llm_provider.py``) keeps ``--tpm`` tokens per ``--window`` s in a
sliding window by arrival: a request's prompt + ``max_tokens`` (1024) is charged when it
arrives and adjusted to its usage when it completes, 50..250 ms later (longer answers take
longer); past the quota it answers 429. Its requests quota is set out of reach.

``--processes`` x ``--tasks`` callers, fresh processes started together (no warm-up but
their connections), one redis-server, each way after the other in one run
(``tools/token_trial.py``):

- ``reserve``: ``acquired = await tokens.reserve(prompt + max_tokens, timeout=30)``, the
  call, ``await acquired.settle(usage.total_tokens)``: what a user writes first;
- ``transport``: ``RateLimitedTransport(requests, tokens=tokens, estimate=...)``.

Both limiters keep the provider's quota at the defaults (no margin given: the fleet's
measured one), or with a fixed ``--margin`` s added to their interval (repeatable: a row
each; 0 is the default). Reported for each:
the ceiling (the share of the quota that the calls in flight leave: the provider counts
each from arrival to completion at its worst case, ``tools.llm_provider.ceiling``), the
tokens used per window as a share of the quota (mean of the steady windows, the first one
left out) and how many points that is below the ceiling, the lowest window, the 429s of
the whole run, per call the provider served the script calls and the commands Redis ran
(INFO commandstats, those inside scripts included), and the margin the fleet went at when
the run ended (the limiters' interval is longer by it: a share of the quota not used).
With ``--checkout PATH`` (repeatable), each checkout runs in a fresh process importing
``aiolimit`` from PATH.
"""

from __future__ import annotations

import itertools
from typing import Any

from _harness import (
    Table,
    Variant,
    alternate,
    checkouts,
    child_main,
    command_counts,
    local_redis,
    machine,
    medians,
    parser,
    report,
    say,
)

from tools.token_trial import TokenTrial, run

WAYS = {
    "reserve": "tokens.reserve(prompt + max_tokens), then settle",
    "transport": "RateLimitedTransport(requests, tokens=...)",
}


def measure(args: Any) -> dict[str, Any]:
    """Each way once per margin against a fresh provider, on one redis-server: their
    figures, by way and margin."""
    out: dict[str, Any] = {}
    with local_redis() as url:
        for way, margin in itertools.product(WAYS, args.margin or [0.0]):
            say(f"{way}: {(args.windows + 1) * args.window:g} s")
            spec = TokenTrial(
                url,
                strategy=way,
                processes=args.processes,
                tasks=args.tasks,
                tpm=args.tpm,
                rpm=1_000_000,
                window=args.window,
                windows=args.windows,
                latency=(0.05, 0.25),
                margin=margin,
                prefix=f"bench-reserve-{way}-{margin}",
            )
            scripts_before, commands_before = command_counts(url)
            seen = run(spec)
            scripts_after, commands_after = command_counts(url)
            settled = margin_of(url, f"{spec.prefix}-{way}-tokens")
            served = max(seen.served, 1)
            out[f"{way} {margin:g}"] = {
                "ceiling": seen.ceiling,
                "share": seen.token_share,
                "lowest": seen.lowest_token_share,
                "refused": seen.refused,
                "scripts": (scripts_after - scripts_before) / served,
                "commands": (commands_after - commands_before) / served,
                "stall": seen.stall,
                "margin": settled,
            }
    return out


def margin_of(url: str, name: str) -> float:
    """The margin (s) the fleet's limiter ``name`` went at when the run ended."""
    from redis import Redis

    with Redis.from_url(url) as redis:
        margin = redis.hget(f"aiolimit:{{{name}}}:config", "margin")
    return int(margin or 0) / 1e6


def main() -> None:
    arguments = parser(__doc__, checkouts=True)
    arguments.add_argument("--processes", type=int, default=4)
    arguments.add_argument("--tasks", type=int, default=24, help="per process (24)")
    arguments.add_argument("--tpm", type=int, default=20_000, help="tokens per window")
    arguments.add_argument("--window", type=float, default=2.0, help="seconds (2)")
    arguments.add_argument("--windows", type=int, default=10, help="steady windows (10)")
    arguments.add_argument(
        "--margin", type=float, action="append", help="s (0: the default; repeatable)"
    )
    args = arguments.parse_args()
    margins: list[float] = args.margin or [0.0]
    if args.child:
        child_main(lambda: measure(args))
        return
    child_args = [
        *("--processes", str(args.processes), "--tasks", str(args.tasks)),
        *("--tpm", str(args.tpm), "--window", str(args.window), "--windows", str(args.windows)),
        *(part for margin in margins for part in ("--margin", str(margin))),
    ]
    variants: list[Variant] = checkouts(args)
    results = alternate(__file__, variants, args.rounds, child_args)
    table = Table(
        [
            "checkout",
            "caller",
            "margin",
            "ceiling",
            "tokens per window",
            "below the ceiling",
            "lowest window",
            "429s",
            "scripts per call",
            "commands per call",
            "stall",
            "margin at the end",
        ],
        left=3,
    )
    for variant in variants:
        figures = medians(results[variant.label])
        for (way, label), margin in itertools.product(WAYS.items(), margins):
            row = figures[f"{way} {margin:g}"]
            table.add(
                variant.label,
                label,
                f"{margin * 1000:g} ms" if margin else "default",
                f"{row['ceiling']:.1%}",
                f"{row['share']:.1%}",
                f"{(row['ceiling'] - row['share']) * 100:.1f} points",
                f"{row['lowest']:.1%}",
                f"{row['refused']:g}",
                f"{row['scripts']:.1f}",
                f"{row['commands']:.1f}",
                f"{row['stall'] * 1000:.0f} ms",
                f"{row.get('margin', 0) * 1000:.1f} ms",
            )
    table.title = (
        f"{args.processes} processes x {args.tasks} tasks, {args.tpm:,} tokens per "
        f"{args.window:g} s window, {args.windows} steady windows"
    )
    report(args, machine(), [table], {"runs": results})


if __name__ == "__main__":
    main()
