"""The Lua that redis_cost.py sends: aiolimit's acquire_many as it stands in a checkout's
lua/ directory (as an EVALSHA script and as a Redis Functions library), reference scripts that
are not aiolimit, and the limiters and requests they run on.

The references, on the same keys and requests as aiolimit: ``FLOOR``, the least an
acquire_many can do on aiolimit's layout (an OVERALL token bucket's config hash: HGETALL it,
a bare GCRA step, HSET the state, a reply in aiolimit's format, no other rule, check or
bound); ``GET_SET_FLOOR``, the least a string-keyed GCRA can do (no config: TIME once per
call, then GET and SET ... PX per request); ``LOG_FLOOR``, a bare sliding log (per budget once
per call: HGETALL the config, GET the value, ZREMRANGEBYSCORE what left the window, then one
ZADD of the call's grants, SET the value, PEXPIRE the log; no wait, no TTL rule, no summary).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from redis.asyncio import Redis as AsyncRedis

import aiolimit
from aiolimit.backends.redis import _scripts
from aiolimit.backends.redis._keys import Keys

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
    # The loose arguments (deprecated): every checkout compared, older ones too, takes them.
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


# --measure floor: each piece of a script, once per ARGV entry, on an OVERALL token bucket's
# config hash (KEYS[1]) and a value key (KEYS[2]).
FIELDS = "'rate', 'interval', 'type', 'keep_alive', 'expires_at', 'clock', 'gen', 'algorithm', "
FIELDS += "'rates', 'spacing', 'blocked_until', 'state'"
REQUEST = "'^(%d+) (%S+) (%S+) (%S+) ?(.*)$'"
SNIPPETS = {
    "an empty loop": "local x = ARGV[i]",
    "string.match of a request": f"local a, b, c, d, e = string.match(ARGV[i], {REQUEST})",
    "string.format of 5 numbers": (
        "local s = string.format('0 %d %d %d %d:%d', 9, 17e14, 0, 1, 17e14)"
    ),
    "5 x format('%d') joined by ..": (
        "local s = '0 ' .. fmt(9) .. ' ' .. fmt(17e14) .. ' ' .. fmt(0) .. ' ' .. fmt(1) .. ':' "
        ".. fmt(17e14)"
    ),
    "pcall of a function": "local ok, v = pcall(fmt, 1)",
    "a table of 6 fields": "local t = {a = 1, b = 2, c = 3, d = 4, e = 5, f = 6}",
    "a closure": "local f = function() return i end",
    "HMGET of the 12 config fields": f"redis.call('HMGET', KEYS[1], {FIELDS})",
    "HGETALL of the config": "redis.call('HGETALL', KEYS[1])",
    "HSET of the state field": "redis.call('HSET', KEYS[1], 'state', '- 1700000000123456 0')",
    "GET of a value key": "redis.call('GET', KEYS[2])",
}
SNIPPET_SCRIPT = (
    "local function fmt(n) return string.format('%%d', n) end\nfor i = 1, #ARGV do %s end\n"
)


def lua_dir(path: Path) -> Path:
    """A checkout's lua/ directory (or ``path`` itself when it is one)."""
    return path if path.name == "lua" else path / "aiolimit/backends/redis/lua"


def here() -> Path:
    return Path(_scripts.__file__).parent / "lua"
