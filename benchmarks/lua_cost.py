"""Redis script time per acquire request, for versions of the Lua side by side on one server.

    python benchmarks/lua_cost.py                       # this checkout, EVALSHA and FCALL
    python benchmarks/lua_cost.py --limiters 1 --batch 1,8,32
    git archive main aiolimit/backends/redis/lua | tar -x -C /tmp/main-lua
    python benchmarks/lua_cost.py --lua /tmp/main-lua/aiolimit/backends/redis/lua --lua .
    python benchmarks/lua_cost.py --floor               # and the floor of the layout
    python benchmarks/lua_cost.py --clients 10000       # one PER_CLIENT limiter, 10 000 clients

No client code in the way: acquire_many calls of ``--batch`` requests, each on a limiter
picked at random among ``--limiters`` (rate never refused), sent in pipelines of 16 calls
by a plain synchronous client, and INFO commandstats' script time (EVALSHA, FCALL) over them,
per request. Each directory of Lua runs twice: with EVALSHA (the whole script every call) and
as a Redis Functions library (FCALL: the library defined once). Rounds alternate between
the versions; min and median of the rounds, which a busy machine disturbs less than a mean.

``--clients N`` measures one PER_CLIENT limiter instead, each request from a client picked at
random among N (a web app's per-client rule).

``--floor`` adds a reference that is not aiolimit: the least an acquire_many can do on the same
keys and layout (an OVERALL token bucket's config hash: HGETALL it, a bare GCRA step, HSET the
state, a reply in aiolimit's format), with no other rule, check or bound. What aiolimit's
script costs above it is what its semantics and structure cost.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

import aiolimit
from aiolimit.backends.redis import _scripts
from aiolimit.backends.redis._keys import Keys
from tools import LocalRedis

PIPELINE = 16  # calls per pipeline

FLOOR = """
redis.register_function('floor_acquire_many', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local replies = {}
  for i, arg in ipairs(ARGV) do
    local k, permits = string.match(arg, '^(%d+) (%d+) ')
    local key = KEYS[tonumber(k)]
    local c = redis.call('HGETALL', key)
    local config = { rate = false, interval = false, state = false }
    for j = 1, #c, 2 do
      config[c[j]] = c[j + 1]
    end
    local rate, interval, tat = tonumber(config.rate), tonumber(config.interval), now
    if config.state then
      tat = math.max(now, tonumber(string.match(config.state, '^%S+ (%-?%d+) ')))
    end
    tat = tat + tonumber(permits) * math.floor(interval / rate)
    redis.call('HSET', key, 'state', string.format('- %d 0', tat))
    replies[i] = string.format('0 %d 0 %d 0 %d:%d:%d', rate - 1, now, permits, now, tat - now)
  end
  return table.concat(replies, '\\n')
end)
"""


# Two more references, counted by lua_instructions.py --floor. The least a string-keyed GCRA
# can do (no config: TIME once per call, then GET and SET ... PX per request), the floor the
# issue's targets were drawn from; and a bare sliding log (per budget once per call: HGETALL
# the config, GET the value, ZREMRANGEBYSCORE what left the window, then one ZADD of the
# call's grants, SET the value, PEXPIRE the log; no wait, no TTL rule, no summary).
GET_SET_FLOOR = """
redis.register_function('get_set_acquire_many', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local replies = {}
  for i, arg in ipairs(ARGV) do
    local k, permits = string.match(arg, '^(%d+) (%d+) ')
    local key = KEYS[tonumber(k) + 1]
    local tat = math.max(now, tonumber(redis.call('GET', key) or now)) + tonumber(permits)
    redis.call('SET', key, string.format('%d', tat), 'PX', '1000')
    replies[i] = string.format('0 %d 0 %d 0 %d:%d:%d', 999, now, permits, now, tat - now)
  end
  return table.concat(replies, '\\n')
end)
"""

LOG_FLOOR = """
redis.register_function('log_acquire_many', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local score = string.format('%d', now)
  local replies, logs, order = {}, {}, {}
  for i, arg in ipairs(ARGV) do
    local k, permits = string.match(arg, '^(%d+) (%d+) ')
    k = tonumber(k)
    local log = logs[k]
    if not log then
      local c = redis.call('HGETALL', KEYS[k])
      local raw = redis.call('GET', KEYS[k + 1])
      log = { used = 0, seq = 0, args = {} }
      if raw then
        local used, seq = string.match(raw, '^%S+ (%d+) (%d+)')
        log.used, log.seq = used + 0, seq + 0
      end
      redis.call('ZREMRANGEBYSCORE', KEYS[k + 2], '-inf', string.format('%d', now - 1000000))
      logs[k], order[#order + 1] = log, k
    end
    log.seq, log.used = log.seq + 1, log.used + permits
    log.args[#log.args + 1] = score
    log.args[#log.args + 1] = permits .. ':' .. log.seq
    replies[i] = '0 ' .. (999999 - log.used) .. ' 0 ' .. score .. ' 0 '
      .. permits .. ':' .. score .. ':' .. log.seq
  end
  for _, k in ipairs(order) do
    local log = logs[k]
    redis.call('ZADD', KEYS[k + 2], unpack(log.args))
    redis.call('SET', KEYS[k + 1], '1 ' .. log.used .. ' ' .. log.seq .. ' -', 'PX', '2000')
    redis.call('PEXPIRE', KEYS[k + 2], '2000')
  end
  return table.concat(replies, '\\n')
end)
"""


def source(lua: Path, names: list[str]) -> str:
    # (a file an older version did not have yet is left out)
    files = [lua / f"{name}.lua" for name in names]
    return "\n".join(file.read_text() for file in files if file.exists())


def begin_call(lua: Path) -> str:
    """What a call runs first, in the version ``lua``."""
    if "local function begin_call()" in (lua / "lib.lua").read_text():
        return "begin_call()"
    return "server_now = nil"


def script(lua: Path) -> str:
    """acquire_many as an EVALSHA script, in the version ``lua``."""
    prelude = source(lua, [*_scripts.LIBRARY, "batch"])
    return f"{prelude}\n{begin_call(lua)}\n{source(lua, ['acquire_many'])}"


def library(lua: Path, name: str) -> str:
    # (versions before functions read the global unpack at load, which FUNCTION LOAD refuses)
    prelude = source(lua, [*_scripts.LIBRARY, "batch"]).replace(
        "local unpack = unpack or table.unpack", ""
    )
    body = source(lua, ["acquire_many"])
    return (
        f"#!lua name={name}\n{prelude}\nredis.register_function('{name}_acquire_many', "
        f"function(KEYS, ARGV)\n{begin_call(lua)}\n{body}\nend)\n"
    )


async def configure(
    url: str,
    limiters: int,
    algorithm: aiolimit.Algorithm,
    rate_type: aiolimit.RateType = aiolimit.RateType.OVERALL,
    interval: float = 1,
) -> None:
    redis = AsyncRedis.from_url(url)
    backend = aiolimit.RedisBackend(redis)
    names = [aiolimit.RateLimiter(f"lua-{i}", backend) for i in range(limiters)]
    for start in range(0, limiters, 200):
        await asyncio.gather(
            *(
                limiter.set_rate(rate_type, 10**9, interval, algorithm=algorithm)
                for limiter in names[start : start + 200]
            )
        )
    await redis.aclose()


def request_of(limiters: int, clients: int, pick: Any) -> tuple[tuple[bytes, ...], list[bytes]]:
    """One acquire request: on a limiter picked among ``limiters``, or (``clients`` > 0) on
    the one PER_CLIENT limiter from a client picked among ``clients``."""
    if clients:
        client = f"c{pick(clients)}"
        keys = Keys("aiolimit:", "lua-0").budget(aiolimit.RateType.PER_CLIENT, client, True)
        return keys, [f"1 - -1 PER_CLIENT {client}".encode()]
    keys = Keys("aiolimit:", f"lua-{pick(limiters)}").budget(aiolimit.RateType.OVERALL, "")
    return keys, [b"1 - -1 OVERALL"]


def script_usec(redis: Redis) -> int:
    stats = redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "fcall"))


def one_round(
    redis: Redis, command: tuple[str, str], limiters: int, batch: int, n: int, clients: int = 0
) -> float:
    """Script µs per request over about ``n`` requests."""
    pick = random.Random(1).randrange
    calls = max(40, n // batch)
    before = script_usec(redis)
    pipe = redis.pipeline(transaction=False)
    for i in range(calls):
        requests = [request_of(limiters, clients, pick) for _ in range(batch)]
        keys, args = _scripts._merge_acquires(requests)
        pipe.execute_command(*command, len(keys), *keys, *args)
        if i % PIPELINE == PIPELINE - 1 or i == calls - 1:
            replies = pipe.execute()
            assert all(r.startswith(b"0 ") for r in replies), replies[:1]
            pipe = redis.pipeline(transaction=False)
    return (script_usec(redis) - before) / (calls * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(_scripts.__file__).parent / "lua"
    parser.add_argument("--lua", type=Path, action="append", help="a lua/ directory (this one)")
    parser.add_argument("--algorithm", default="TOKEN_BUCKET", type=str.upper)
    parser.add_argument("--limiters", type=int, default=10_000)
    parser.add_argument("--batch", default="32", help="requests per call, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=4000, help="per round (4000)")
    parser.add_argument("--floor", action="store_true", help="add the layout's floor")
    parser.add_argument("--clients", type=int, default=0, help="one PER_CLIENT limiter")
    args = parser.parse_args()
    dirs = [d if d.name == "lua" else d / "aiolimit/backends/redis/lua" for d in args.lua or [here]]
    with LocalRedis() as server:
        algorithm = aiolimit.Algorithm(args.algorithm)
        if args.clients:
            asyncio.run(configure(server.url, 1, algorithm, aiolimit.RateType.PER_CLIENT))
        else:
            asyncio.run(configure(server.url, args.limiters, algorithm))
        redis = Redis.from_url(server.url)
        variants: dict[str, tuple[str, str]] = {}
        for k, lua in enumerate(dirs):
            variants[f"{lua} EVALSHA"] = (
                "EVALSHA",
                redis.script_load(script(lua)),
            )
            redis.function_load(library(lua, f"lua_cost_{k}"), replace=True)
            variants[f"{lua} FCALL"] = ("FCALL", f"lua_cost_{k}_acquire_many")
        if args.floor and args.algorithm == "TOKEN_BUCKET" and not args.clients:
            redis.function_load("#!lua name=floor\n" + FLOOR, replace=True)
            variants["floor (not aiolimit: HGETALL, GCRA, HSET) FCALL"] = (
                "FCALL",
                "floor_acquire_many",
            )
        for batch in map(int, args.batch.split(",")):
            results: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for name, command in variants.items():
                    results[name].append(
                        one_round(redis, command, args.limiters, batch, args.requests, args.clients)
                    )
            for name, values in results.items():
                values.sort()
                scope = f"clients={args.clients}" if args.clients else f"limiters={args.limiters}"
                print(
                    f"{args.algorithm} {scope} batch={batch} {name}: "
                    f"min {values[0]:.2f}, median {values[len(values) // 2]:.2f} µs/request"
                )
        redis.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
