"""Tokens per minute: reserve, then settle, against a provider that charges the way LLM
providers document it.

    python benchmarks/tokens.py                   # ~4 min: 4 processes x 32 tasks, 20 windows
    python benchmarks/tokens.py --windows 5 --only settle

The provider (``tools/llm_provider.py``) keeps ``--tpm`` tokens and ``--rpm`` requests per
``--window`` s, each in its own sliding window by arrival; a request's prompt + ``max_tokens``
is charged when it arrives and adjusted to its ``usage`` when it completes; past a quota it
answers 429 with ``Retry-After`` and ``x-ratelimit-*`` headers. ``usage`` is skewed: a call
completes ``max_tokens * r**3`` tokens (a quarter of ``max_tokens`` on average) and takes
the matching share of 10..100 ms. The window stands for a minute: 200,000 tokens and 400
requests per 2 s are 6,000,000 TPM and 12,000 RPM with calls of 0.3..3 s.

``--processes`` x ``--tasks`` callers (one redis-server on a free 127.0.0.1 port) send calls
of a uniform 100..900-token prompt and ``max_tokens`` 1024, one way after the other
(``tools/token_trial.py`` says exactly what each does): (a) ``settle``: reserve prompt +
``max_tokens`` with the request, settle to ``usage.total_tokens``; (b) ``worst-case``: the
same reservation, never settled; (c) ``after``: one request before the call, its usage
taken after it; (d) ``limits``: limits' moving window charging the worst case (its
``hit(cost=...)`` cannot be handed back), "n/a (not installed)" without the package. The
aiolimit limiters get the provider's quotas with ``--margin`` s added to their interval. For
each: the tokens used per window as a share of the tokens quota (mean, and the lowest
window), the requests per window as a share of the requests quota, the 429s, how late
requests arrived after their grant's start (p99, the aiolimit callers that reserve; the
margin has to cover it), the longest any caller's event loop ran late (a busy machine:
a stall past the margin lets a request land later than the limiter promised), and, per call
the provider served, Redis's CPU (INFO cpu) and the commands it ran (INFO commandstats,
those inside scripts included) over the whole run: one Redis serves the whole fleet.
"""

from __future__ import annotations

from typing import Any

from _harness import (
    Table,
    command_counts,
    local_redis,
    machine,
    parser,
    per_grant,
    reading,
    report,
    say,
)
from redis import Redis

from tools.token_trial import STRATEGIES, TokenTrial, available, run

LABELS = {
    "transport": "(a) RateLimitedTransport: reserve prompt + max_tokens, settle to usage",
    "reserve": "(a) by hand: tokens.reserve(prompt + max_tokens), then settle",
    "settle": "(a) by hand with a queue and a 10 ms horizon: acquire_all, then settle",
    "worst-case": "(b) reserve prompt + max_tokens, never settle",
    "after": "(c) charge usage after the call",
    "limits": "(d) limits moving window, hit(cost=prompt + max_tokens)",
}


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--processes", type=int, default=4)
    arguments.add_argument("--tasks", type=int, default=32, help="per process")
    arguments.add_argument("--tpm", type=int, default=200_000, help="tokens per window")
    arguments.add_argument("--rpm", type=int, default=400, help="requests per window")
    arguments.add_argument("--window", type=float, default=2.0, help="seconds (2)")
    arguments.add_argument("--windows", type=int, default=20, help="steady windows per run")
    arguments.add_argument("--margin", type=float, default=0.05, help="seconds (0.05)")
    arguments.add_argument("--only", choices=STRATEGIES, action="append", help="repeatable")
    args = arguments.parse_args()
    columns = ["caller", "tokens per window", "lowest window", "requests per window", "429s"]
    table = Table(
        [
            *columns,
            "late p99",
            "stall",
            "Redis CPU per call",
            "scripts per call",
            "commands per call",
        ]
    )
    rows: list[dict[str, Any]] = []
    with local_redis() as url:
        heading = machine(url)
        for strategy in args.only or STRATEGIES:
            if not available(strategy):
                say(f"{strategy}: not installed, left out (pip install -e '.[bench]')")
                table.add(LABELS[strategy], "n/a (not installed)", *[""] * 8)
                continue
            say(f"{strategy}: {(args.windows + 1) * args.window:g} s")
            spec = TokenTrial(
                url,
                strategy=strategy,
                processes=args.processes,
                tasks=args.tasks,
                tpm=args.tpm,
                rpm=args.rpm,
                window=args.window,
                windows=args.windows,
                margin=args.margin,
                prefix=f"bench-tokens-{strategy}",
            )
            with Redis.from_url(url) as redis:
                before, calls_before = reading(redis), command_counts(url)
                result = run(spec)
                after, calls_after = reading(redis), command_counts(url)
            cost = per_grant(before, after, result.served)
            scripts, commands = (a - b for a, b in zip(calls_after, calls_before, strict=True))
            table.add(
                LABELS[strategy],
                f"{result.token_share:.1%}",
                f"{result.lowest_token_share:.1%}",
                f"{result.request_share:.1%}",
                result.refused,
                "n/a" if result.late_p99 is None else f"{result.late_p99 * 1000:.0f} ms",
                f"{result.stall * 1000:.0f} ms",
                f"{cost.redis_cpu:.0f} µs",
                f"{scripts / max(result.served, 1):.1f}",
                f"{commands / max(result.served, 1):.1f}",
            )
            figures = {"redis_cpu_us": cost.redis_cpu, "scripts": scripts, "commands": commands}
            rows.append({"strategy": strategy, **result.__dict__, **figures})
    table.title = (
        f"{args.processes} processes x {args.tasks} tasks, {args.tpm:,} tokens and {args.rpm:,} "
        f"requests per {args.window:g} s window, {args.windows} windows per caller, "
        f"margin {args.margin * 1000:g} ms"
    )
    report(args, heading, [table], {"runs": rows})


if __name__ == "__main__":
    main()
