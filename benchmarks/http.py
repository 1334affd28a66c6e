"""Requests/s of a trivial endpoint: bare, behind aiolimit's ASGI middleware, and with slowapi.

    pip install -e '.[bench]'
    python benchmarks/http.py                  # about 2.5 minutes
    python benchmarks/http.py --duration 3 --rounds 1          # a quick look, noisier
    python benchmarks/http.py --write docs/benchmarks.md       # also replace the table there

Starts its own redis-server on a free 127.0.0.1 port (stopped at the end). One Starlette app
with one endpoint, ``GET /hello`` answering ``{"hello": "world"}``, is served by uvicorn (one
worker, its own process, on a free 127.0.0.1 port) in four configurations:

1. bare: the app alone;
2. aiolimit, 1 rule: ``RateLimitMiddleware`` with one OVERALL rule;
3. aiolimit, 2 rules: a global rule and a per-client rule (``key=client_ip``), two limiters
   checked per request;
4. slowapi: ``Limiter(key_func=get_remote_address, storage_uri="redis://...")`` on the same
   redis-server, ``@limiter.limit(...)`` on the endpoint, the way its documentation shows.

Every rate is 1,000,000/second, far above the throughput, so every request does the limiter's
whole work (a Redis round trip for each) and is answered 200. The load comes from another
process: 64 aiohttp tasks, each with its own keep-alive connection, sending one request after
another. Each configuration gets a fresh server, a warm-up, then ``--duration`` seconds of
measurement; the order of the configurations changes from round to round, and the table has
the median over ``--rounds`` rounds. The server's CPU time per request comes from
/proc/<pid>/stat, Redis's from INFO cpu.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's ``http`` package, which uvicorn and aiohttp
# import: keep its directory off the import path.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from tools import LocalRedis, cpu_model, free_port

CLIENTS = 64
RATE = "1000000/second"  # never refused: far above any throughput here
CONFIGS = {
    "bare": "bare app",
    "aiolimit-1": "aiolimit middleware, 1 rule (OVERALL)",
    "aiolimit-2": "aiolimit middleware, 2 rules (global + per-client)",
    "slowapi": "slowapi, 1 limit (per client)",
}
TARGET = 0.15  # the middleware may cost at most this share of the bare app's requests/s
START, END = "<!-- http benchmark: start -->", "<!-- http benchmark: end -->"


# -- the server (a subprocess) ------------------------------------------------------------------


def build_app(config: str, redis_url: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if config == "slowapi":
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.util import get_remote_address

        limiter = Limiter(key_func=get_remote_address, storage_uri=redis_url)

        @limiter.limit(RATE)
        async def limited_hello(request: Request) -> JSONResponse:
            return JSONResponse({"hello": "world"})

        app = Starlette(routes=[Route("/hello", limited_hello)])
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
        return app

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    app = Starlette(routes=[Route("/hello", hello)])
    if config == "bare":
        return app

    from redis.asyncio import Redis as AsyncRedis

    from aiolimit import RedisBackend
    from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip

    rules = [Rule("bench-api-global", RATE)]
    if config == "aiolimit-2":
        rules.append(Rule("bench-api-per-client", RATE, key=client_ip))
    backend = RedisBackend(AsyncRedis.from_url(redis_url))
    return RateLimitMiddleware(app, backend=backend, rules=rules)


def serve(config: str, port: int, redis_url: str, loop: str, http: str) -> None:
    import uvicorn

    uvicorn.run(
        build_app(config, redis_url),
        host="127.0.0.1",
        port=port,
        workers=1,
        loop=loop,  # type: ignore[arg-type]
        http=http,  # type: ignore[arg-type]
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


# -- the load (another subprocess) --------------------------------------------------------------


async def load(url: str, clients: int, warmup: float, duration: float) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    measuring = stopping = False
    clock = time.perf_counter

    async def client(session: aiohttp.ClientSession) -> None:
        while not stopping:
            before = clock()
            async with session.get(url) as response:
                await response.read()
            if measuring:
                latencies.append(clock() - before)
                statuses[response.status] = statuses.get(response.status, 0) + 1

    # One connection per task, kept alive; no cookie jar, no per-request timeout object.
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        tasks = [asyncio.ensure_future(client(session)) for _ in range(clients)]
        await asyncio.sleep(warmup)
        measuring = True
        began, cpu = clock(), time.process_time()
        await asyncio.sleep(duration)
        measuring = False
        elapsed, cpu = clock() - began, time.process_time() - cpu
        stopping = True
        await asyncio.gather(*tasks)
    latencies.sort()
    count = len(latencies)
    return {
        "requests": count,
        "elapsed": elapsed,
        "rps": count / elapsed,
        "p50_ms": latencies[count // 2] * 1000 if count else None,
        "p99_ms": latencies[min(count - 1, int(count * 0.99))] * 1000 if count else None,
        "statuses": statuses,
        "load_cpu": cpu,
    }


def run_load(url: str, clients: int, warmup: float, duration: float) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(load(url, clients, warmup, duration))))


# -- one measurement ----------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux), 0 where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(url: str) -> float:
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


def measure(config: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hello"
    me = str(Path(__file__).resolve())
    server = subprocess.Popen(
        [sys.executable, me, "--serve", config, "--port", str(port), "--redis", redis_url,
         "--loop", args.loop, "--http", args.http],
    )  # fmt: skip
    try:
        _wait_until_up(url, server)
        loader = subprocess.Popen(
            [sys.executable, me, "--load", url, "--clients", str(args.clients),
             "--warmup", str(args.warmup), "--duration", str(args.duration)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        # Server and Redis CPU over the measured window only (the load generator times it).
        time.sleep(args.warmup)
        server_cpu, redis_cpu = _cpu_seconds(server.pid), _redis_cpu(redis_url)
        time.sleep(args.duration)
        server_cpu, redis_cpu = (
            _cpu_seconds(server.pid) - server_cpu,
            _redis_cpu(redis_url) - redis_cpu,
        )
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
    result["statuses"] = {int(k): v for k, v in result["statuses"].items()}
    return result


# -- the table ----------------------------------------------------------------------------------


@dataclass
class Figures:
    config: str
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        values = [r[key] for r in self.rounds if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    @property
    def not_200(self) -> int:
        return sum(n for r in self.rounds for status, n in r["statuses"].items() if status != 200)


def table(figures: dict[str, Figures]) -> str:
    bare = figures["bare"].median("rps")
    lines = [
        "| configuration | requests/s | vs bare app | p50 / p99 latency ms "
        "| server CPU µs / request | Redis CPU µs / request | non-200 answers |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, f in figures.items():
        rps = f.median("rps")
        lines.append(
            f"| {CONFIGS[name]} | {rps:,.0f} | {rps / bare:.3f}x "
            f"({(rps / bare - 1) * 100:+.1f}%) | {f.median('p50_ms'):.1f} / "
            f"{f.median('p99_ms'):.1f} | {f.median('server_cpu_us'):.0f} "
            f"| {f.median('redis_cpu_us'):.1f} | {f.not_200} |"
        )
    return "\n".join(lines)


def every_round(figures: dict[str, Figures]) -> str:
    parts = [
        f"{CONFIGS[name]} " + ", ".join(f"{r['rps']:,.0f}" for r in f.rounds)
        for name, f in figures.items()
    ]
    return "Every round, requests/s: " + "; ".join(parts) + "."


def targets(figures: dict[str, Figures]) -> str:
    bare = figures["bare"].median("rps")
    out = []
    for name in ("aiolimit-1", "aiolimit-2"):
        cost = 1 - figures[name].median("rps") / bare
        verdict = "met" if cost <= TARGET else "missed"
        out.append(
            f"- {CONFIGS[name]}: costs {cost * 100:.1f}% of the bare app's requests/s "
            f"(target ≤ {TARGET * 100:.0f}%): **{verdict}**"
        )
    slow = figures["slowapi"].median("rps")
    for name in ("aiolimit-1", "aiolimit-2"):
        out.append(f"- {CONFIGS[name]} against slowapi: {figures[name].median('rps') / slow:.2f}x")
    return "\n".join(out)


def machine(url: str, args: argparse.Namespace) -> str:
    import starlette
    import uvicorn

    with Redis.from_url(url) as redis:
        version = redis.info("server")["redis_version"]
    loop = args.loop if args.loop != "auto" else _installed("uvloop", "asyncio")
    http = args.http if args.http != "auto" else _installed("httptools", "h11")
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), shared by the server, the load generator and "
        f"redis-server; Python {platform.python_version()}, uvicorn {uvicorn.__version__} "
        f"(1 worker, {loop} loop, {http} parser), Starlette {starlette.__version__}, "
        f"redis-server {version} on 127.0.0.1 (loopback)"
    )


def _installed(module: str, otherwise: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return otherwise
    return module


def write(path: Path, command: str, text: str) -> None:
    block = f"{START}\n\nCommand: `{command}`\n\n{text}\n\n{END}"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    if START not in doc:
        doc = doc.rstrip("\n") + f"\n\n## HTTP middleware\n\n{START}\n{END}\n"
    doc = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
    path.write_text(doc)


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every configuration")
    parser.add_argument("--clients", type=int, default=CLIENTS, help="concurrent clients")
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configurations")
    parser.add_argument("--write", type=Path, metavar="FILE", help="replace the table in FILE")
    # The two halves of a measurement, run as subprocesses of this script.
    parser.add_argument("--serve", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve:
        serve(args.serve, args.port, args.redis, args.loop, args.http)
        return
    if args.load:
        run_load(args.load, args.clients, args.warmup, args.duration)
        return

    names = args.only or list(CONFIGS)
    if "bare" not in names:
        names.insert(0, "bare")
    figures = {name: Figures(name) for name in names}
    began = time.monotonic()
    with LocalRedis() as server:
        about = machine(server.url, args)
        for round_ in range(args.rounds):
            # Rotate the order, and reverse it every other round, so no configuration always
            # runs first or right after the same neighbour.
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            if round_ % 2:
                order.reverse()
            for name in order:
                result = measure(name, server.url, args)
                figures[name].rounds.append(result)
                print(
                    f"round {round_ + 1}/{args.rounds} {name:<11} {result['rps']:>9,.0f} req/s "
                    f"p50 {result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms "
                    f"server {result['server_cpu_us']:.0f} µs/req "
                    f"statuses {result['statuses']}",
                    file=sys.stderr,
                    flush=True,
                )
            with Redis.from_url(server.url) as redis:
                redis.flushall()
    took = time.monotonic() - began

    text = (
        f"Machine: {about}. {args.clients} concurrent clients (aiohttp, keep-alive, one "
        f"process), {args.rounds} rounds of {args.duration:g} s per configuration after "
        f"{args.warmup:g} s of warm-up, medians. Run took {took:.0f} s.\n\n"
        f"{table(figures)}\n\n{every_round(figures)}"
    )
    if {"aiolimit-1", "aiolimit-2", "slowapi"} <= set(names):
        text += f"\n\nTarget (issue 11):\n\n{targets(figures)}"
    print(text)
    if args.write:
        write(args.write, " ".join(["python benchmarks/http.py", *sys.argv[1:]]), text)


if __name__ == "__main__":
    main()
