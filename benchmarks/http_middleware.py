"""Requests/s of a trivial endpoint: bare, behind aiolimit's ASGI middleware, and with slowapi;
or, in-process, the middleware's own CPU per request.

    pip install -e '.[bench]'
    python benchmarks/http_middleware.py                         # 1 round of 2 s: ~30 s
    python benchmarks/http_middleware.py --rounds 5 --duration 8 --warmup 2   # the docs' table
    python benchmarks/http_middleware.py --in-process --checkout /tmp/aiolimit-main --checkout .

Starts its own redis-server on a free 127.0.0.1 port. One Starlette app with one endpoint,
``GET /hello`` answering ``{"hello": "world"}`` (benchmarks/_http_parts.py), is served by
uvicorn (one worker, its own process, a free 127.0.0.1 port) in four configurations: the
bare app; ``RateLimitMiddleware`` with one OVERALL rule; with a global and a per-client rule
(``key=client_ip``, two limiters per request); slowapi (``Limiter(key_func=
get_remote_address, storage_uri="redis://...")``, ``@limiter.limit(...)`` on the endpoint,
as its documentation shows; left out when not installed). Every rate is 1,000,000/second, so
every request does the limiter's whole work and is answered 200. The load is 64 aiohttp
tasks in another process, each on its own keep-alive connection. Each configuration gets a
fresh server, a warm-up, then ``--duration`` seconds measured; the order changes from round
to round; medians over ``--rounds``. Server CPU per request is from /proc/<pid>/stat,
Redis's from INFO cpu.

``--in-process``: 64 tasks call the same app directly (no HTTP), a fresh scope per request,
and the process's CPU time per request is read: bare, 1 rule, 2 rules, and a row with no app,
``acquire_all`` over two limiters (what two rules do) with the garbage collections it sets
off. Each configuration of each checkout (``--checkout``) in a fresh process, alternating.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from _harness import (
    Table,
    Variant,
    alternate,
    checkouts,
    child_main,
    local_redis,
    machine,
    median,
    number,
    parser,
    report,
    say,
)

CONFIGS = {
    "bare": "bare app",
    "aiolimit-1": "aiolimit middleware, 1 rule (OVERALL)",
    "aiolimit-2": "aiolimit middleware, 2 rules (global + per-client)",
    "slowapi": "slowapi, 1 limit (per client)",
}
IN_PROCESS = {**{k: v for k, v in CONFIGS.items() if k != "slowapi"},
              "acquire-all": "acquire_all of 2 (no app)"}  # fmt: skip
PARTS = str(Path(__file__).resolve().parent / "_http_parts.py")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux), 0 where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(url: str) -> float:
    from redis import Redis

    with Redis.from_url(url) as redis:
        info = redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _wait_until_up(url: str, process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):
            time.sleep(0.1)
    raise RuntimeError(f"the server did not answer {url} within {timeout} s")


def _part(*call: str) -> list[str]:
    """A command running one function of _http_parts.py in a process of its own."""
    code = f"import sys; sys.path.insert(0, {str(Path(PARTS).parent)!r}); import _http_parts as p; "
    return [sys.executable, "-c", code + call[0], *call[1:]]


def measure(config: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration once: a fresh uvicorn, the load from another process."""
    from tools import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}/hello"
    server = subprocess.Popen(
        _part(f"p.serve({config!r}, {port}, {redis_url!r}, {args.loop!r}, {args.http!r})")
    )
    try:
        _wait_until_up(url, server)
        loader = subprocess.Popen(
            _part(f"p.run_load({url!r}, {args.clients}, {args.warmup}, {args.duration})"),
            stdout=subprocess.PIPE,
        )
        # Server and Redis CPU over the measured window only (the load generator times it).
        time.sleep(args.warmup)
        server_cpu, redis_cpu = _cpu_seconds(server.pid), _redis_cpu(redis_url)
        time.sleep(args.duration)
        server_cpu = _cpu_seconds(server.pid) - server_cpu
        redis_cpu = _redis_cpu(redis_url) - redis_cpu
        out, _ = loader.communicate(timeout=args.warmup + args.duration + 60)
        if loader.returncode:
            raise RuntimeError(f"the load generator exited with code {loader.returncode}")
        result: dict[str, Any] = json.loads(out)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    requests = max(result["requests"], 1)
    result["server_cpu_us"] = server_cpu * 1e6 / requests
    result["redis_cpu_us"] = redis_cpu * 1e6 / requests
    result["load_cpu_us"] = result.pop("load_cpu") * 1e6 / requests
    result["not_200"] = sum(n for s, n in result.pop("statuses").items() if s != "200")
    return result


def through_uvicorn(args: argparse.Namespace) -> None:
    names = [n for n in args.only or list(CONFIGS) if n != "bare"]
    if "slowapi" in names and importlib.util.find_spec("slowapi") is None:
        say("slowapi is not installed: left out (pip install -e '.[bench]')")
        names.remove("slowapi")
    names.insert(0, "bare")
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with local_redis() as url:
        about = machine(url)
        for number_ in range(args.rounds):
            # Rotated, and reversed every other round: no configuration always runs first.
            order = names[number_ % len(names) :] + names[: number_ % len(names)]
            for name in reversed(order) if number_ % 2 else order:
                rounds[name].append(measure(name, url, args))
                say(f"round {number_ + 1}/{args.rounds} {name}: {rounds[name][-1]['rps']:,.0f}/s")
    bare = median(r["rps"] for r in rounds["bare"]) or 1.0
    out = Table(["configuration", "requests/s", "vs bare app", "p50 / p99 latency ms",
                 "server CPU µs / request", "Redis CPU µs / request", "non-200"])  # fmt: skip
    for name, results in rounds.items():

        def mid(key: str, results: list[dict[str, Any]] = results) -> float | None:
            return median(r[key] for r in results)

        rps = mid("rps") or 0.0
        out.add(CONFIGS[name], number(rps), f"{rps / bare:.3f}x ({(rps / bare - 1) * 100:+.1f}%)",
                f"{number(mid('p50_ms'), 1)} / {number(mid('p99_ms'), 1)}",
                number(mid("server_cpu_us")), number(mid("redis_cpu_us"), 1),
                sum(r["not_200"] for r in results))  # fmt: skip
    heading = (
        f"Machine: {about}, shared by uvicorn (1 worker), the load generator and redis-server. "
        f"{args.clients} clients (aiohttp, keep-alive), {args.rounds} rounds of "
        f"{args.duration:g} s per configuration after {args.warmup:g} s of warm-up, medians."
    )
    report(args, heading, [out], {"rounds": rounds})


def in_process(args: argparse.Namespace) -> None:
    variants = [
        Variant(f"{checkout.label}: {config}", checkout.path, ("--config", config))
        for checkout in checkouts(args)
        for config in IN_PROCESS
    ]
    with local_redis() as url:
        about = machine(url)
        rounds = alternate(__file__, variants, args.rounds, ["--url", url, "--requests",
                                                                  str(args.requests)])  # fmt: skip
    out = Table(["checkout", *IN_PROCESS.values(), "added by 1 rule", "by 2 rules",
                 "acquire_all: collections per 10 000 (young / full)"])  # fmt: skip
    figures: dict[str, dict[str, Any]] = {}
    for checkout in checkouts(args):
        cost = {
            c: median(r["cpu_us"] for r in rounds[f"{checkout.label}: {c}"]) or 0.0
            for c in IN_PROCESS
        }
        young = median(r["young"] for r in rounds[f"{checkout.label}: acquire-all"]) or 0
        full = median(r["full"] for r in rounds[f"{checkout.label}: acquire-all"]) or 0
        per = 10_000 / args.requests
        figures[checkout.label] = {**cost, "young_per_10k": young * per, "full_per_10k": full * per}
        out.add(checkout.label, *(number(cost[c], 1) for c in IN_PROCESS),
                f"+{cost['aiolimit-1'] - cost['bare']:.1f}",
                f"+{cost['aiolimit-2'] - cost['bare']:.1f}",
                f"{young * per:.0f} / {full * per:.1f}")  # fmt: skip
    heading = (
        f"Machine: {about}. CPU µs per request (acquire_all: per call), 64 tasks in-process, "
        f"medians of {args.rounds} rounds."
    )
    report(args, heading, [out], {"medians": figures, "rounds": rounds})


def main() -> None:
    cli = parser(__doc__, checkouts=True)
    cli.add_argument("--duration", type=float, default=2.0, help="seconds measured per run (2)")
    cli.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring (1)")
    cli.add_argument("--clients", type=int, default=64, help="concurrent clients (64)")
    cli.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    cli.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    cli.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configurations")
    cli.add_argument("--in-process", action="store_true", help="the middleware's own CPU")
    cli.add_argument("--requests", type=int, default=10_000, help="--in-process: per run")
    cli.add_argument("--config", choices=list(IN_PROCESS), help=argparse.SUPPRESS)
    cli.add_argument("--url", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.child:
        from _http_parts import in_process as measure_in_process

        child_main(lambda: measure_in_process(args.config, args.url, args.requests))
    elif args.in_process:
        in_process(args)
    else:
        through_uvicorn(args)


if __name__ == "__main__":
    main()
