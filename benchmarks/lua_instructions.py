"""Instructions redis-server executes per acquire request, counted by valgrind: the same
number on a busy machine as on an idle one, so changes of a few percent show.

    python benchmarks/lua_instructions.py --limiters 1 --batch 32
    python benchmarks/lua_instructions.py --lua /tmp/main-lua --lua . --limiters 2000
    python benchmarks/lua_instructions.py --floor --limiters 2000   # beside the floors
    python benchmarks/lua_instructions.py --algorithm fixed_window --limiters 2000 --interval 3600

Needs valgrind (``callgrind_control``). Starts its own redis-server under callgrind
(instrumentation off while the limiters are configured), then for each Lua directory, as
EVALSHA and as a Redis Functions library (FCALL), sends ``--calls`` acquire_many calls of
``--batch`` requests on limiters picked at random, one call at a time, and reads the
instructions the server executed meanwhile (every thread). Each variant runs twice, the
first pass unmeasured, so every variant finds the limiters' state as the others left it.
Under valgrind the server is ~50 times slower: a few thousand limiters are plenty.

``--floor`` adds reference scripts that are not aiolimit, on the same keys and requests: for
the counters the layout's floor (``lua_cost.FLOOR``: HGETALL the config hash, a bare GCRA
step, HSET its state) and the least any GCRA can do (``GET_SET_FLOOR``: a string per limiter,
GET and SET ... PX, no config); for the sliding window a bare log (``LOG_FLOOR``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lua_cost import FLOOR, GET_SET_FLOOR, LOG_FLOOR, configure, library, script
from redis import Redis

import aiolimit
from aiolimit.backends.redis import _scripts
from aiolimit.backends.redis._keys import Keys
from tools import free_port


def control(pid: int, *args: str) -> str:
    done = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True)
    return done.stdout


def instructions(pid: int) -> int:
    return sum(
        int(n.replace(",", "")) for n in re.findall(r"Th \d+\s+([\d,]+)", control(pid, "-e", "Ir"))
    )


@contextmanager
def callgrind_server(binary: str, profile: str) -> Iterator[tuple[int, Redis, str]]:
    """``binary`` (a redis-server or valkey-server) under callgrind on a free 127.0.0.1 port,
    instrumentation off until asked (``control(pid, "-i", "on")``), the profile written to
    ``profile``; yields its pid, a client, and its URL, and stops it at the end."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={profile}",
         binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    redis = Redis.from_url(url)
    try:
        for _ in range(300):  # (valgrind starts the server ~50 times slower)
            try:
                redis.ping()
                break
            except Exception:
                time.sleep(0.2)
        yield server.pid, redis, url
    finally:
        redis.close()
        server.terminate()
        server.wait(60)


def calls_of(limiters: int, batch: int, calls: int) -> list[tuple[list[bytes], list[bytes]]]:
    pick = random.Random(1).randrange
    overall = aiolimit.RateType.OVERALL
    return [
        _scripts._merge_acquires(
            [
                (
                    Keys("aiolimit:", f"lua-{pick(limiters)}").budget(overall, ""),
                    [b"1 - -1 OVERALL"],
                )
                for _ in range(batch)
            ]
        )
        for _ in range(calls)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(_scripts.__file__).parent / "lua"
    parser.add_argument("--lua", type=Path, action="append", help="a lua/ directory (this one)")
    parser.add_argument("--algorithm", default="TOKEN_BUCKET", type=str.upper)
    parser.add_argument("--limiters", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--floor", action="store_true", help="add the reference floors")
    parser.add_argument(
        "--interval",
        type=float,
        default=1,
        help="the limiters' interval, s (1: under"
        " valgrind nearly every fixed-window request starts a new window; 3600: none does)",
    )
    args = parser.parse_args()
    dirs = [d if d.name == "lua" else d / "aiolimit/backends/redis/lua" for d in args.lua or [here]]
    with callgrind_server("redis-server", "/dev/null") as (pid, redis, url):
        asyncio.run(
            configure(
                url, args.limiters, aiolimit.Algorithm(args.algorithm), interval=args.interval
            )
        )
        variants: dict[str, tuple[str, str]] = {}
        for k, lua in enumerate(dirs):
            variants[f"{lua} EVALSHA"] = ("EVALSHA", redis.script_load(script(lua)))
            redis.function_load(library(lua, f"lua_ir_{k}"), replace=True)
            variants[f"{lua} FCALL"] = ("FCALL", f"lua_ir_{k}_acquire_many")
        if args.floor:
            # (label: the reference's function, as its code registers it, and the code)
            counters = {
                "floor: HGETALL, GCRA, HSET (not aiolimit)": ("floor_acquire_many", FLOOR),
                "floor: GET, GCRA, SET PX, no config (not aiolimit)": (
                    "get_set_acquire_many",
                    GET_SET_FLOOR,
                ),
            }
            log = {"floor: a bare log (not aiolimit)": ("log_acquire_many", LOG_FLOOR)}
            floors = log if args.algorithm == "SLIDING_WINDOW" else counters
            for name, (function, code) in floors.items():
                redis.function_load(f"#!lua name={function}\n{code}", replace=True)
                variants[name] = ("FCALL", function)
        work = calls_of(args.limiters, args.batch, args.calls)
        for measured in (False, True):
            for name, command in variants.items():
                control(pid, "-i", "on")
                control(pid, "-z")
                for keys, argv in work:
                    reply = redis.execute_command(*command, len(keys), *keys, *argv)
                    assert reply.startswith(b"0 "), reply
                count = instructions(pid)
                control(pid, "-i", "off")
                if measured:
                    per = count / (args.calls * args.batch) / 1000
                    print(
                        f"{args.algorithm} limiters={args.limiters} batch={args.batch} {name}: "
                        f"{per:.1f} k instructions / request"
                    )


if __name__ == "__main__":
    main()
