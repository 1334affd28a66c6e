"""Learning a partner's hidden, changing limit: 429s, the share delivered, convergence.

    python benchmarks/learn.py                                  # ~3 min: every caller
    python benchmarks/learn.py --only learn --seconds 10        # one caller, shorter phases
    python benchmarks/learn.py --only learn --max-hold 4        # probe a failed rate sooner

A partner keeps a strict 1 s sliding window whose limit is hidden and changes (``--phases``,
12/s then 6/s then 12/s by default, ``--seconds`` each); ``--processes`` x ``--tasks``
callers send as fast as they are let, one caller kind after the other
(``tools/learn_trial.py``): the httpx transport with a limiter fixed at a guess
(``--guess``, 20/s); a per-process AIMD pacer (``tools/aimd.py``: what teams write);
``learn=True`` with the guess as its ceiling; and ``learn=True`` against a partner that
states its limit (``RateLimit-Policy``). Each phase is judged after its first ``--settle``
seconds: the 429s among the calls that arrived (and their share), the hidden limit
delivered, and when the callers converged (three seconds in a row at 85 % of the limit or
more, without a 429; seconds after the change).
"""

from __future__ import annotations

from typing import Any

from _harness import Table, local_redis, machine, parser, report, say

from tools.learn_trial import CALLERS, LearnTrial, Result, trial


def _row(table: Table, result: Result) -> dict[str, Any]:
    calls = sum(p.calls for p in result.phases)
    refused = sum(p.refused for p in result.phases)
    share = refused / calls if calls else 0.0
    table.add(
        result.caller,
        f"{refused} of {calls} ({share:.1%})",
        " / ".join(f"{p.delivered:.0%}" for p in result.phases),
        " / ".join("-" if p.converged is None else f"{p.converged:g}" for p in result.phases),
        f"{result.stall * 1000:.0f}",
    )
    return {
        "caller": result.caller,
        "stall": result.stall,
        "phases": [phase.__dict__ for phase in result.phases],
        "timeline": result.timeline,  # (seconds from the start, permits in force)
    }


def main() -> None:
    arguments = parser(__doc__)
    arguments.add_argument("--phases", type=int, nargs="+", default=[12, 6, 12])
    arguments.add_argument("--seconds", type=float, default=15.0, help="per phase")
    arguments.add_argument("--settle", type=float, default=5.0, help="not judged, per phase")
    arguments.add_argument("--guess", type=int, default=20, help="the fixed rate, the ceiling")
    arguments.add_argument(
        "--margin", type=float, default=0.05, help="seconds added to the limiter's interval"
    )
    arguments.add_argument(
        "--max-hold", type=float, help="the learner's max_hold, seconds (default: its own)"
    )
    arguments.add_argument("--processes", type=int, default=5)
    arguments.add_argument("--tasks", type=int, default=4, help="per process")
    arguments.add_argument("--only", choices=CALLERS, action="append", help="(repeatable)")
    args = arguments.parse_args()
    phases = " -> ".join(f"{limit}/s" for limit in args.phases)
    table = Table(
        [
            "caller",
            "429s judged",
            "delivered of the hidden limit, per phase",
            "converged (s after the change)",
            "worst stall ms",
        ],
        left=1,
    )
    table.title = (
        f"a hidden limit of {phases}, {args.seconds:g} s each (judged after {args.settle:g} s); "
        f"{args.processes} processes x {args.tasks} tasks; guess and ceiling {args.guess}/s, "
        f"margin {args.margin * 1000:g} ms"
        + ("" if args.max_hold is None else f", max_hold {args.max_hold:g} s")
    )
    rows = []
    with local_redis() as url:
        heading = machine(url)
        for caller in args.only or CALLERS:
            say(f"{caller}: {args.seconds * len(args.phases):g} s")
            spec = LearnTrial(
                url,
                phases=tuple(args.phases),
                seconds=args.seconds,
                settle=args.settle,
                guess=args.guess,
                margin=args.margin,
                max_hold=args.max_hold,
                processes=args.processes,
                tasks=args.tasks,
            )
            rows.append(_row(table, trial(spec, caller)))
    report(args, heading, [table], {"runs": rows})


if __name__ == "__main__":
    main()
