"""Two or more checkouts of aiolimit side by side on one server, in alternating rounds.

    git archive main aiolimit | tar -x -C /tmp/aiolimit-main      # an older version
    python benchmarks/compare.py /tmp/aiolimit-main .             # then this checkout
    python benchmarks/compare.py A B --rounds 5 --duration 3 --algorithm token_bucket

For a change whose effect is smaller than the noise of a shared machine: every round runs
each checkout once, in a fresh process importing aiolimit from that directory, scenarios (a)
64 tasks on one limiter and (b) 64 tasks over 10 000 limiters of run.py, each algorithm
asked for, with the costs per grant of benchmarks/costs.py (Redis CPU, script time, client
CPU). Prints the median of the rounds, and each checkout's ratio to the first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = ("calls", "redis_cpu", "script", "client_cpu")


def one_round(url: str, algorithms: list[str], limiters: list[int], duration: float) -> None:
    """In the checkout's own process: each scenario once, as JSON on stdout."""
    sys.path.insert(0, str(HERE))
    from contenders import Aiolimit
    from run import flush, throughput

    import aiolimit

    out: dict[str, dict[str, float]] = {}
    for algorithm in algorithms:
        for count in limiters:
            flush(url)
            contender = Aiolimit(aiolimit.Algorithm(algorithm.upper()))
            result = asyncio.run(throughput(contender, url, count, duration))
            out[f"{algorithm} {count}"] = {
                "calls": result.calls,
                "redis_cpu": result.cost.redis_cpu,
                "script": result.cost.script,
                "client_cpu": result.cost.client_cpu,
            }
    print(json.dumps(out))


def rounds(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    from tools import LocalRedis

    results: dict[str, list[dict[str, Any]]] = {str(d): [] for d in args.checkouts}
    with LocalRedis() as server:
        for number in range(args.rounds):
            for checkout in args.checkouts:
                env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
                command = [
                    sys.executable, __file__, "--round", "--url", server.url,
                    "--duration", str(args.duration),
                    "--algorithm", ",".join(args.algorithm),
                    "--limiters", ",".join(map(str, args.limiters)),
                ]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode:
                    raise SystemExit(f"{checkout} failed:\n{done.stderr[-3000:]}")
                results[str(checkout)].append(json.loads(done.stdout.splitlines()[-1]))
                print(f"  round {number + 1}: {checkout} done", file=sys.stderr)
    return results


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    def median(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2]

    first = next(iter(results))
    scenarios = list(results[first][0])
    lines = [
        "| scenario | checkout | calls/s | Redis CPU µs / grant | script µs / grant "
        "| client CPU µs / grant |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for scenario in scenarios:
        base = {f: median([r[scenario][f] for r in results[first]]) for f in FIGURES}
        for checkout, rows in results.items():
            cells = []
            for f in FIGURES:
                value = median([r[scenario][f] for r in rows])
                digits = 0 if f == "calls" else 1
                ratio = f" ({value / base[f]:.2f}x)" if base[f] and checkout != first else ""
                cells.append(f"{value:,.{digits}f}{ratio}")
            lines.append(f"| {scenario} | {checkout} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", help="directories holding an aiolimit package")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per scenario (2)")
    parser.add_argument(
        "--algorithm",
        type=lambda text: text.split(","),
        default=["sliding_window", "token_bucket", "fixed_window"],
        help="comma-separated (all three)",
    )
    parser.add_argument(
        "--limiters",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 10_000],
        help="comma-separated limiter counts (1,10000)",
    )
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round:
        one_round(args.url, args.algorithm, args.limiters, args.duration)
        return
    print(report(rounds(args)))


if __name__ == "__main__":
    main()
