"""lib.lua and _protocol.py state one protocol twice (the Lua for the scripts, the Python for the
memory twin and the Redis client): these tests fail when one changes without the other."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import fakeredis
import pytest
from redis.asyncio import Redis

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    MemoryBackend,
    Rate,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.backends import Grant, Refusal
from aiolimit.backends._protocol import (
    CARRIES,
    FORESEE,
    GRANTED_FORMAT,
    HELD_BUCKETS,
    MAX_BATCH,
    MAX_EXACT,
    RECEIPT_US,
    RECLAIM_STEPS,
    REFUSED_FORMAT,
    STATE_FIELD,
    WALK_STEPS,
    Reply,
    format_grant,
    format_member,
    new_life,
    parse_carries,
    parse_counters,
    parse_grant,
    parse_member,
    parse_value,
    parse_windows,
    split_life,
    with_life,
)
from aiolimit.backends.memory import state_in_config
from aiolimit.backends.redis import _scripts as scripts

LUA = resources.files("aiolimit.backends.redis") / "lua"


def lua(name: str) -> str:
    """A script file; "lib": the library every script starts with (the core and each
    algorithm) and the acquire requests' part."""
    if name == "lib":
        return scripts.lua_source(*scripts.LIBRARY, "batch")
    return (LUA / f"{name}.lua").read_text()


def lua_constant(name: str) -> int:
    found = re.search(rf"^local {name} = (\d+)", lua("lib"), re.MULTILINE)
    assert found, f"lib.lua no longer defines {name}"
    return int(found[1])


def test_lib_lua_has_the_bounds_of_the_protocol() -> None:
    assert lua_constant("WALK_STEPS") == WALK_STEPS
    assert lua_constant("RECLAIM_STEPS") == RECLAIM_STEPS
    assert lua_constant("MAX_EXACT") == MAX_EXACT


def test_batch_lua_asks_a_foresight_by_the_max_wait_the_protocol_says() -> None:
    found = re.search(r"^local FORESEE = '(.)'$", lua("lib"), re.MULTILINE)
    assert found, "batch.lua no longer defines FORESEE"
    assert found[1] == FORESEE


def test_acquire_many_says_the_batch_bound_the_client_keeps() -> None:
    found = re.search(r"at most\s+--\s+(\d+) of them", lua("acquire_many"))
    assert found, "acquire_many.lua's header no longer states its bound"
    assert int(found[1]) == MAX_BATCH


def test_lib_lua_lists_the_reply_codes_of_the_protocol() -> None:
    table = re.search(r"The reply to a request is one string.*?\n((?:--   .*\n)+)", lua("lib"))
    assert table, "lib.lua no longer has its table of replies"
    listed = [int(code) for code in re.findall(r'^--   "(-?\d+)', table[1], re.MULTILINE)]
    assert sorted(listed) == sorted(Reply)


def test_lib_lua_lists_the_acquire_replies_in_the_formats_of_the_protocol() -> None:
    table = re.search(r"The reply to a request is one string.*?\n((?:--   .*\n)+)", lua("lib"))
    assert table, "lib.lua no longer has its table of replies"
    listed = re.findall(r'^--   "([^"]*)"', table[1], re.MULTILINE)
    assert GRANTED_FORMAT in listed
    assert REFUSED_FORMAT in listed


def made_replies(source: str) -> list[str]:
    """The replies lib.lua joins from fmt's texts (``local reply = '0 ' .. fmt(left) ..``, and
    what is added to it), each as text with ``<name>`` for every number."""

    def text(expression: str) -> str:
        # (a text looked up before fmt is called, "(made[x] or fmt(x))", is fmt(x)'s)
        expression = re.sub(r"\(\w+\[(\w+)\] or fmt\(\1\)\)", r"fmt(\1)", expression)
        parts = re.findall(r"'([^']*)'|fmt\((\w+)\)|(\w+)", expression)
        return "".join(literal or f"<{number or name}>" for literal, number, name in parts)

    made = re.search(r"local reply = ((?:.|\n\s+\.\.)*)", source)
    if not made:
        return []
    reply = text(made[1])
    added = re.findall(r"return reply \.\. (.*)", source)
    return [reply, *(reply + text(more) for more in added)]


@pytest.mark.parametrize(("said", "stated"), [("0", GRANTED_FORMAT), ("1", REFUSED_FORMAT)])
def test_batch_lua_formats_each_acquire_reply_with_the_fields_of_the_protocol(
    said: str, stated: str
) -> None:
    """Every reply lib.lua and batch.lua answer a request with, by string.format (bound as
    ``format``) or joined from fmt's texts, has one field per field of the protocol's format
    (the optional one counted where it is sent)."""
    source = lua("lib") + lua("batch")
    formats = re.findall(rf"\bformat\('{said} ([^']*)'", source)
    formats += [reply[len(said) + 1 :] for reply in made_replies(source) if reply.startswith(said)]
    assert formats, f"lib.lua no longer answers '{said} ...'"
    required = len(re.findall(r"(?<!\[)<[^>]*>(?!\])", stated))
    for made in formats:
        assert len(made.split(" ")) in (required, required + stated.count("[")), made
    if said == "0":  # the member: permits, start, tag and life, as _protocol reads it
        assert {made.split(" ")[4] for made in formats} == {"<permits>:<start>:<tag>:<life>"}


def returned_codes(source: str) -> set[int]:
    """Every code a script returns: the first number of a reply string or table."""
    strings = re.findall(r"(?:return|local reply =) (?:format\()?'(-?\d+)[ ']", source, re.M)
    tables = re.findall(r"return \{ (-?\d+)[ ,}]", source)
    return {int(code) for code in strings + tables}


def test_every_code_a_script_returns_is_a_reply_of_the_protocol() -> None:
    for name in ("lib", "acquire", "acquire_many", "available", "wait", "release"):
        assert returned_codes(lua(name)) <= set(Reply), name
    assert returned_codes(lua("lib")) == set(Reply)  # acquire returns each of them


def test_the_grant_member_is_formatted_and_parsed_as_lib_lua_does() -> None:
    made = re.search(r"fmt\(permits\) \.\. '([^']*)' \.\. fmt\(seq\)", lua("lib"))
    assert made, "lib.lua no longer makes a grant's member as fmt(permits) .. ':' .. seq"
    assert format_member(2, 7) == f"2{made[1]}7"
    read = re.search(
        r"member_permits\(member\)[^$]*?return tonumber\(match\(member, '\^"
        r"\(%d\+\)([^']*)'\)\)",
        lua("lib"),
    )
    assert read, "lib.lua no longer reads a member's permits as '^(%d+):'"
    assert read[1] == made[1]
    # (and its one-digit fast path looks for the same separator, by its byte)
    fast = re.search(r"member_permits\(member\)\s+local digit, (\w+) = byte\(member, 1, 2\)\s+"
                     r"if \1 == (\d+)", lua("lib"))  # fmt: skip
    assert fast and chr(int(fast[2])) == made[1]
    assert parse_member(format_member(2, 7)) == (2, 7)


async def test_the_member_a_grant_is_handed_back_by_is_formatted_as_lib_lua_does(
    redis_server,
) -> None:
    # The member of a grant a real server made parses as the protocol says: its permits, its
    # start, a tag and the life of the config (its generation); format_grant and with_life
    # write it back the same.
    from conformance import ManualClock

    from aiolimit import RateLimiter

    redis = Redis.from_url(redis_server.url)
    limiter = RateLimiter("protocol-member", RedisBackend(redis, clock=ManualClock()))
    try:
        for algorithm in Algorithm:
            await limiter.set_rate(
                RateLimiterConfig.build(RateType.OVERALL, 5, 1, algorithm=algorithm)
            )
            grant = await limiter.backend.try_acquire("protocol-member", 3, 0)
            assert isinstance(grant, Grant), algorithm
            permits, start, tag = parse_grant(grant.member)
            assert (permits, start) == (3, grant.starts_at), algorithm
            gen = await redis.hget(limiter.backend.keys("protocol-member").config, "gen")
            life = gen.decode().partition(".")[0]
            assert with_life(format_grant(permits, start, tag), life) == grant.member
            assert split_life(grant.member) == (format_grant(permits, start, tag), life)
    finally:
        await limiter.delete()
        await redis.aclose()
    assert parse_grant(format_grant(2, 1700, -3)) == (2, 1700, -3)
    assert parse_grant(with_life(format_grant(2, 1700, -3), "-a_Z9")) == (2, 1700, -3)
    assert split_life(format_grant(2, 1700, -3)) == ("2:1700:-3", None)  # (an earlier version's)
    for bad in ("2:1700:-3:", "2:1700:-3:a b", "2:1700:-3:a:b", "2:1700", "2:x:-3:life"):
        with pytest.raises(InvalidArgumentError):
            parse_grant(bad)


def test_every_life_is_new() -> None:
    lives = {new_life() for _ in range(1000)}
    assert len(lives) == 1000
    assert all(split_life(with_life("1:2:3", life)) == ("1:2:3", life) for life in lives)


def test_release_lua_remembers_a_receipt_as_long_as_the_protocol_says() -> None:
    found = re.search(r"^local RECEIPT_US = (\d+)", lua("release"), re.MULTILINE)
    assert found, "release.lua no longer states how long it keeps a receipt"
    assert int(found[1]) == RECEIPT_US


async def test_the_value_key_is_written_as_the_protocol_says(redis_server) -> None:
    # What the scripts write, read back from a real server and parsed as the protocol says:
    # two grants (seq 2, no cursor), then a reservation that walks the log and leaves the
    # cursor at the grant that frees its permit (its score, the permits logged up to and at it).
    from conformance import ManualClock

    from aiolimit import RateLimiter

    redis = Redis.from_url(redis_server.url)
    clock = ManualClock()
    limiter = RateLimiter("protocol-value", RedisBackend(redis, clock=clock))
    try:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
        assert await limiter.try_acquire() and await limiter.try_acquire()
        (value_key,) = [k for k in await redis.keys("*protocol-value*") if b":value" in k]
        config_key = value_key.replace(b":value", b":config")
        gen, used, seq, cursor = parse_value((await redis.get(value_key)).decode())
        assert (used, seq, cursor) == (2, 2, None)
        assert gen.encode() == await redis.hget(config_key, "gen")
        reserved = await limiter.backend.try_acquire("protocol-value", 1, None)
        assert isinstance(reserved, Grant) and reserved.starts_in > 0
        _, used, seq, cursor = parse_value((await redis.get(value_key)).decode())
        assert (used, seq, cursor) == (3, 3, (round(ManualClock.START * 1e6), 2, 2))
    finally:
        await limiter.delete()
        await redis.aclose()
    assert parse_value("ab12 5 2 -") == ("ab12", 5, 2, None)
    assert parse_value("ab12 -3 9 1700 4 2") == ("ab12", -3, 9, (1700, 4, 2))
    assert parse_value("ab12 -3 9 1700 4 2 ~5:-10 ~2:90") == ("ab12", -3, 9, (1700, 4, 2))
    assert parse_value("ab12 5 2 - ~5:10") == ("ab12", 5, 2, None)


def test_held_lua_keeps_as_many_spans_as_the_protocol_says() -> None:
    found = re.search(r"^local HELD_BUCKETS = (\d+)", lua("held"), re.MULTILINE)
    assert found, "held.lua no longer states how many spans it keeps"
    assert int(found[1]) == HELD_BUCKETS


def test_carries_lua_keeps_as_many_floors_per_rate_as_the_protocol_says() -> None:
    found = re.search(r"^local CARRIES = (\d+)", lua("carries"), re.MULTILINE)
    assert found, "carries.lua no longer states how many floors a rate keeps"
    assert int(found[1]) == CARRIES
    # Its entries follow the earlier windows, and each reader finds its own.
    state = "- 120 4 ~h2 ~1:3:60 ~c1:6:150:45 ~c1:2:90:30"
    assert parse_counters(state) == (None, [120, 4])
    assert parse_windows(state) == [[1, 3, 60]]
    assert parse_carries(state) == [[1, 6, 150, 45], [1, 2, 90, 30]]


def test_lib_lua_says_the_time_refusal_the_client_recognises() -> None:
    assert scripts.TIME_REFUSED in lua("lib")


# -- every reply the Lua can give is decoded ------------------------------------------------------

ACQUIRE_REPLIES: dict[Reply, tuple[str, Any]] = {
    Reply.GRANTED: (
        "0 3 1 1700 200 2:7",
        Grant(starts_in=200, starts_at=1700, left=3, member="2:7", binding=1),
    ),
    Reply.REFUSED: ("1 500 -1 2 1700", Refusal(retry_in=500, at=1700, left=-1, binding=2)),
    Reply.NOT_CONFIGURED: ("-1", scripts.NotConfigured()),
    Reply.OVER_RATE: ("-2 5", scripts.OverRate(5)),
    Reply.OTHER_TYPE: ("-3 PER_CLIENT", scripts.OtherType(RateType.PER_CLIENT)),
    Reply.QUEUE_FULL: ("-4", scripts.QueueFull()),
    Reply.FAILED: (
        "-5 the state in k is not aiolimit state",
        scripts.Failed("the state in k is not aiolimit state"),
    ),
}


@pytest.mark.parametrize("code", list(Reply), ids=[code.name for code in Reply])
def test_every_acquire_reply_is_decoded(code: Reply) -> None:
    reply, decoded = ACQUIRE_REPLIES[code]
    assert scripts.ACQUIRE.decode(reply.encode()) == decoded
    assert scripts.ACQUIRE.decode(reply) == decoded  # decode_responses=True


def test_acquire_many_replies_are_decoded_one_per_request() -> None:
    many = "\n".join(reply for reply, _ in ACQUIRE_REPLIES.values())
    split = scripts.ACQUIRE_MANY.decode(many.encode())
    assert [scripts.ACQUIRE.decode(one) for one in split] == [
        decoded for _, decoded in ACQUIRE_REPLIES.values()
    ]


def test_a_short_reply_of_acquire_many_is_the_grant_before_it_written_out() -> None:
    # "=" and the tag's step (_protocol.SAME_FORMAT): the grant before it with its permits
    # fewer left and its member's tag moved by the step (1 when none is given). A run ends at
    # any other reply; a short line with no grant before it cannot be read.
    many = b"0 9 0 1700 0 2:1700:5:Ab 1800\n=\n=1000\n1 5 0 0 1700\n0 4 1 1700 0 1:1700:-3:-c\n=-2"
    assert [scripts.ACQUIRE.decode(one) for one in scripts.ACQUIRE_MANY.decode(many)] == [
        Grant(0, 1700, 9, "2:1700:5:Ab", 1800, 0),
        Grant(0, 1700, 7, "2:1700:6:Ab", 1800, 0),
        Grant(0, 1700, 5, "2:1700:1006:Ab", 1800, 0),
        Refusal(retry_in=5, at=1700, left=0, binding=0),
        Grant(0, 1700, 4, "1:1700:-3:-c", None, 1),
        Grant(0, 1700, 3, "1:1700:-5:-c", None, 1),
    ]
    unreadable_replies = (b"=", b"1 5 0 0 1700\n=", b"-5 failed\n=", b"0 9 0 1700 0 2:1700:x:A\n=")
    for unreadable in unreadable_replies:
        with pytest.raises(ValueError):
            scripts.ACQUIRE_MANY.decode(unreadable)


TABLE_REPLIES: dict[int, tuple[list[Any], Any]] = {
    Reply.GRANTED: ([0, 4], 4),
    Reply.NOT_CONFIGURED: ([-1], scripts.NotConfigured()),
    Reply.OVER_RATE: ([-2, 5], scripts.OverRate(5)),
    Reply.OTHER_TYPE: ([-3, b"OVERALL"], scripts.OtherType(RateType.OVERALL)),
}


@pytest.mark.parametrize(
    "script", [scripts.AVAILABLE, scripts.WAIT, scripts.RELEASE], ids=lambda script: script.name
)
def test_every_reply_of_the_other_budget_scripts_is_decoded(script: Any) -> None:
    codes = returned_codes(lua(script.name))
    assert codes <= set(TABLE_REPLIES), f"{script.name}.lua returns a code not decoded here"
    for code in codes:
        reply, decoded = TABLE_REPLIES[code]
        assert script.decode(reply) == decoded


# -- the formats on a live store ------------------------------------------------------------------


async def test_the_state_the_scripts_write_reads_as_the_protocol_says() -> None:
    redis = fakeredis.FakeAsyncRedis()
    backend = RedisBackend(redis, clock=lambda: 1000.0)
    await backend.set_rate("p", RateLimiterConfig.build("OVERALL", 10, 60), "set", False)
    first = await backend.try_acquire("p", 2)
    second = await backend.try_acquire("p", 3)
    assert isinstance(first, Grant) and isinstance(second, Grant)
    start = 1000 * 10**6
    assert [parse_grant(first.member), parse_grant(second.member)] == [(2, start, 1), (3, start, 2)]
    keys = backend.keys("p")
    members = await redis.zrange(keys.permits, 0, -1)
    assert sorted(m.decode() for m in members) == [format_member(2, 1), format_member(3, 2)]
    gen, used, seq, _ = parse_value((await redis.get(keys.value)).decode())
    assert (used, seq) == (5, 2)
    assert gen == (await redis.hget(keys.config, "gen")).decode()


@pytest.mark.parametrize("algorithm", [Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW])
async def test_overall_counters_keep_their_state_in_the_config_as_the_protocol_says(
    algorithm: Algorithm,
) -> None:
    assert f"'{STATE_FIELD}'" in lua("lib")
    redis = fakeredis.FakeAsyncRedis()
    backend = RedisBackend(redis, clock=lambda: 1000.0)
    memory = MemoryBackend(clock=lambda: 1000.0)
    rates = (Rate(10, 60), Rate(20, 3600))
    for rate_type in RateType:
        config = RateLimiterConfig.build(rate_type, rates, algorithm=algorithm)
        for store in (backend, memory):
            await store.set_rate("p", config, "set", False)
            assert isinstance(await store.try_acquire("p", 2), Grant)
        fields = await redis.hgetall(backend.keys("p").config)
        assert b"gen" in fields  # (the life of the state, however it is kept)
        if not state_in_config(config):
            assert STATE_FIELD.encode() not in fields
            continue
        last, numbers = parse_counters(fields[STATE_FIELD.encode()].decode())
        stored = memory._shared.limiters["p"].config
        assert stored is not None and stored.state is not None
        assert (last, numbers) == (stored.state.last, stored.state.n) == (1000 * 10**6, numbers)
        assert len(numbers) == 4
        assert await redis.keys("*") == [backend.keys("p").config.encode()]
    assert not state_in_config(RateLimiterConfig.build("OVERALL", 10, 60))


async def test_the_memory_twin_numbers_its_grants_as_the_scripts_do() -> None:
    backend = MemoryBackend()
    await backend.set_rate("p", RateLimiterConfig.build("OVERALL", 10, 60), "set", False)
    grants = [await backend.try_acquire("p", permits) for permits in (2, 3)]
    assert [parse_grant(g.member)[::2] for g in grants if isinstance(g, Grant)] == [(2, 1), (3, 2)]
