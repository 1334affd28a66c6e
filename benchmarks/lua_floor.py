"""What the pieces of a script cost Redis, per request: the floor under any acquire script.

    python benchmarks/lua_floor.py

Each snippet runs once per ARGV entry, 32 entries per EVALSHA, 200 calls in pipelines; INFO
commandstats' EVALSHA time per entry, the best of 5 rounds. The config hash is an OVERALL
token bucket's (5 fields), as aiolimit writes it.
"""

from __future__ import annotations

from redis import Redis

from tools import LocalRedis

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
SCRIPT = "local function fmt(n) return string.format('%%d', n) end\nfor i = 1, #ARGV do %s end\n"


def main() -> None:
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        redis.hset(
            "config",
            mapping={"rate": 10**9, "interval": 10**6, "type": "OVERALL",
                     "algorithm": "TOKEN_BUCKET", "state": "- 1700000000123456 0"},
        )  # fmt: skip
        redis.set("value", "gen 1 2 -")
        shas = {name: redis.script_load(SCRIPT % body) for name, body in SNIPPETS.items()}
        args = [b"1 - -1 OVERALL"] * 32
        best: dict[str, float] = {}
        for _ in range(5):
            for name, sha in shas.items():
                redis.config_resetstat()
                pipe = redis.pipeline(transaction=False)
                for _ in range(200):
                    pipe.evalsha(sha, 2, "config", "value", *args)
                pipe.execute()
                usec = redis.info("commandstats")["cmdstat_evalsha"]["usec"] / (200 * 32)
                best[name] = min(best.get(name, usec), usec)
        for name, usec in best.items():
            print(f"{name:32} {usec:6.2f} µs")
        redis.close()


if __name__ == "__main__":
    main()
