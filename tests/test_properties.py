"""Random operation sequences on the memory backend and on a real redis-server, driven by one
fake clock: every result must agree, both must hold the same keys with the same TTLs and the
same state, and no grant may break its algorithm's bound in any of the limiter's rates, nor
the minimum spacing (see ``Audit``). Every example draws an algorithm, sometimes several rates
and sometimes a spacing.

Both backends read the same controllable clock (``clock=`` a callable), so the Lua scripts
and their Python twin see identical times. The clock moves forward, and also back (a client
whose clock is behind the latest time the limiter acted on: both must act at that latest
time), then forward again. Configs may have a ``keep_alive``; ``expire`` and
``clear_expire`` run among the other operations.

Redis key TTLs run on the server's real clock, the fake clock is virtual: left alone, a TTL
of 10 fake seconds would outlive a whole example, and one of 1 ms (a grant about to leave
the window) would vanish while the fake clock stands still. So the test keeps Redis's TTLs
on the fake clock itself (see ``Twins.redis_before`` and ``Twins.compare_keys``):

* after each operation it reads every key's TTL, checks it against the memory backend's
  (which counts on the fake clock), and replaces it with a marker TTL of ~115 days, so
  that nothing expires in real time between operations;
* before each operation it deletes the keys whose TTL has run out on the fake clock, and
  gives back their exact remaining TTL to the keys a script reads the TTL of (the clients
  registry; and, for ``expire``, the state keys);
* the time a key expires is the memory backend's (both then drop it at the same fake time).
  While the clock is behind, a TTL counts from the limiter's time in the memory backend
  but from the server's clock in Redis; the two differ by the skew, so then only whether
  a key has a TTL is compared, not how long it is.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    MemoryBackend,
    NotConfiguredError,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.backends import Backend, Grant, Refusal, Settlement
from aiolimit.backends._protocol import (
    format_grant,
    parse_carries,
    parse_counters,
    parse_handbacks,
    parse_windows,
    split_life,
    with_life,
)
from aiolimit.backends.memory import state_in_config
from tools import LocalRedis

CLIENTS = ("a", "b")
INTERVALS_US = (10_000_000, 25_000_000, 40_000_000)
KEEP_ALIVES = (None, None, 1.0, 1.5, 3.0)  # times the interval
START_US = 1_000_000_000
FOREVER = math.inf
MARK_MS = 10**10  # the TTL that parks a Redis key between operations (~115 days)
_names = itertools.count()
_steps = itertools.count()


def same_lives(life: str) -> ExitStack:
    """While it is entered, a config made anew on either backend starts the life ``life``:
    the grants the two make then have the same members."""
    stack = ExitStack()
    for backend in ("redis", "memory"):
        stack.enter_context(mock.patch(f"aiolimit.backends.{backend}.new_life", lambda: life))
    return stack


# (type, rate, interval_us, keep_alive x[, algorithm, more rates, min_spacing_us]): the first
# rate, then any further ones as (permits, interval_us); keep_alive is in times the longest
# interval. Four fields: one rate, a sliding window, no spacing.
Config = tuple[Any, ...]
SPACINGS_US = (None, None, None, 1, 2_500_000, 7_000_000)  # all below the shortest interval

client = st.sampled_from(CLIENTS)
permits = st.one_of(st.integers(1, 2), st.integers(1, 5))  # more often within the rate


@st.composite
def configs(draw: st.DrawFn) -> Config:
    intervals = draw(st.permutations(INTERVALS_US))  # several rates: different intervals
    more = draw(st.sampled_from([0, 0, 0, 1, 2]))
    return (
        draw(st.sampled_from(RateType)),
        draw(st.integers(1, 4)),
        intervals[0],
        draw(st.sampled_from(KEEP_ALIVES)),
        draw(st.sampled_from(Algorithm)),
        tuple((draw(st.integers(1, 6)), interval) for interval in intervals[1 : 1 + more]),
        draw(st.sampled_from(SPACINGS_US)),
    )


config = configs()
# Steps of the fake clock; the named ones sit on the window's edges.
edges = st.sampled_from(["zero", "1us", "interval", "interval-1us", "interval+1us", "half"])
advance = st.one_of(edges, edges, edges, st.floats(0, 2.5))  # named or a fraction of interval
back = st.one_of(st.sampled_from(["1us", "half", "interval-1us", "interval"]), st.floats(0, 1))
ttl = st.one_of(st.sampled_from(["1us", "half", "interval", "interval+1us"]), st.floats(0, 3))
acquire = st.tuples(st.just("acquire"), client, permits)
SYNC_RESETS = ["zero", "1us", "half", "interval", "interval+1us"]
step = st.tuples(st.just("advance"), advance)
operation = st.one_of(
    acquire,
    acquire,
    st.tuples(st.just("wait_then_acquire"), client, permits),
    st.tuples(
        st.just("reserve"), client, permits, st.sampled_from(["forever", "half", "interval"])
    ),
    st.tuples(st.just("public_try_acquire"), client, permits),
    st.tuples(st.just("release"), client, permits),
    st.tuples(st.just("release_member"), client, st.integers(0, 50)),
    st.tuples(st.just("wait_time"), client, permits),
    st.tuples(st.just("available"), client),
    step,
    step,
    step,
    st.tuples(st.just("back"), back),  # the clock goes back by up to an interval
    st.tuples(st.just("back"), back),
    st.tuples(st.just("catch_up")),  # ... and forward again to the latest reading
    st.tuples(
        st.just("configure"), st.sampled_from(["set", "update", "try"]), config, st.booleans()
    ),
    st.tuples(st.just("get_config")),
    st.tuples(st.just("delete")),
    st.tuples(st.just("expire"), ttl),
    st.tuples(st.just("clear_expire")),
)
settle_operation = st.one_of(
    acquire,
    st.tuples(st.just("reserve"), client, permits, st.sampled_from(["forever", "interval"])),
    st.tuples(st.just("settle"), client, st.integers(0, 50), st.integers(0, 8)),
    st.tuples(st.just("settle"), client, st.integers(0, 50), st.integers(0, 8)),
    st.tuples(st.just("sync"), client, st.integers(0, 6), st.sampled_from(SYNC_RESETS)),
    st.tuples(st.just("release"), client, permits),
    st.tuples(st.just("release_member"), client, st.integers(0, 50)),
    st.tuples(st.just("wait_time"), client, permits),
    st.tuples(st.just("available"), client),
    step,
    step,
    st.tuples(st.just("configure"), st.sampled_from(["set", "update"]), config, st.booleans()),
)
"""Settle and sync among the operations they meet most (``Backend.settle``, ``sync``)."""
CLIENT_OPERATIONS = {
    "acquire",
    "reserve",
    "public_try_acquire",
    "release",
    "release_member",
    "settle",
    "sync",
    "wait_time",
    "available",
}


def parts(new: Config) -> tuple[RateType, list[tuple[int, int]], Algorithm, int, float | None]:
    """(type, every rate as (permits, interval_us), algorithm, spacing_us, keep_alive x)."""
    rate_type, rate, interval_us, keep_alive = new[:4]
    algorithm, more, spacing = (*new[4:], *(Algorithm.SLIDING_WINDOW, (), None)[len(new) - 4 :])
    return rate_type, [(rate, interval_us), *more], algorithm, spacing or 0, keep_alive


def built(new: Config) -> RateLimiterConfig:
    rate_type, rates, algorithm, spacing, keep_alive = parts(new)
    longest = max(interval for _, interval in rates)
    return RateLimiterConfig.build(
        rate_type,
        [Rate(p, timedelta(microseconds=interval)) for p, interval in rates],
        keep_alive=None
        if keep_alive is None
        else timedelta(microseconds=round(longest * keep_alive)),
        algorithm=algorithm,
        min_spacing=timedelta(microseconds=spacing) if spacing else None,
    )


def duration(step: str | float, interval: int) -> int:
    if isinstance(step, float):
        return round(step * interval)
    return {"zero": 0, "1us": 1, "interval": interval, "interval-1us": interval - 1,
            "interval+1us": interval + 1, "half": interval // 2}[step]  # fmt: skip


@dataclass
class Logged:
    """One grant as the test saw it (its member follows partial releases, as the log's)."""

    time: int
    permits: int
    member: str
    live: set[int] = field(default_factory=set)  # the rates (by index) it still counts in

    @property
    def dead(self) -> bool:
        return not self.live

    @property
    def order(self) -> tuple[int, str]:
        """Where a ZSET puts its log entry ("<permits>:<seq>"): by time, then by entry."""
        return self.time, f"{self.permits}:{split_life(self.member)[0].rpartition(':')[2]}"


@dataclass
class AuditConfig:
    rate_type: RateType
    rates: list[tuple[int, int]]  # (permits, interval_us)
    algorithm: Algorithm
    spacing: int  # us, 0 for none

    @classmethod
    def of(cls, new: Config) -> AuditConfig:
        rate_type, rates, algorithm, spacing, _ = parts(new)
        return cls(rate_type, rates, algorithm, spacing)


@dataclass
class Audit:
    """Grants as the test saw them, to check each algorithm's bound independently, for each
    rate, and the spacing:

    * sliding window: at most ``permits`` in any window ``(x - interval, x]``;
    * fixed windows: at most ``permits`` in any window ``[k * interval, (k + 1) * interval)``;
    * token bucket: at most ``permits + permits * w / interval`` in any span ``[a, a + w]``;
    * spacing: the starts of any two grants at least ``spacing`` apart.

    Sliding window: a grant stops counting in a rate once the limiter's time has passed its
    time plus the rate's interval in force, even if a later, longer interval would cover it
    again: the backends may already have dropped it from that rate's log, which only makes
    them stricter. Every grant the audit holds alive in a rate is still in that rate's log
    (unless released). The counters of a token bucket or of fixed windows cannot tell which
    grants a release gave back, nor carry their counts over to other rates: there the audit
    starts afresh after a release or a change of rates.
    """

    config: AuditConfig | None = None
    budgets: dict[str | None, list[Logged]] = field(default_factory=dict)

    @property
    def sliding(self) -> bool:
        assert self.config is not None
        return self.config.algorithm is Algorithm.SLIDING_WINDOW

    def budget(self, client_id: str) -> list[Logged]:
        assert self.config is not None
        key = client_id if self.config.rate_type is RateType.PER_CLIENT else None
        return self.budgets.setdefault(key, [])

    def vanish(self) -> None:
        """The limiter has no config any more (deleted, or expired): its state counts no
        more, and the next config starts afresh."""
        self.config = None
        self.budgets.clear()

    def expire(self, now: int) -> None:
        if self.config is None or not self.sliding:
            return
        for budget in self.budgets.values():
            for grant in budget:
                for i in list(grant.live):
                    if now - grant.time >= self.config.rates[i][1]:
                        grant.live.discard(i)

    def in_window(self, client_id: str, now: int, i: int) -> int:
        """Permits rate ``i`` counts at ``now`` (sliding: its window; fixed: the current
        window; token bucket: none known)."""
        assert self.config is not None
        interval = self.config.rates[i][1]
        budget = self.budget(client_id)
        if self.sliding:
            return sum(g.permits for g in budget if i in g.live and now - interval < g.time <= now)
        if self.config.algorithm is Algorithm.FIXED_WINDOW:
            return sum(g.permits for g in budget if g.time // interval == now // interval)
        return 0

    def grant(self, client_id: str, permits: int, start: int, member: str) -> None:
        """Notes a grant (a reservation starts in the future) and checks every bound that
        it takes part in."""
        config = self.config
        assert config is not None
        budget = self.budget(client_id)
        if config.spacing:
            for other in budget:
                gap = start - other.time
                assert gap >= config.spacing, f"grants at {other.time} and {start}: {gap} us"
        budget.append(Logged(start, permits, member, set(range(len(config.rates)))))
        budget.sort(key=lambda grant: grant.order)  # as a ZSET orders them
        for i, (rate, interval) in enumerate(config.rates):
            if config.algorithm is Algorithm.SLIDING_WINDOW:
                # every window (x - interval, x] for each grant time x in [start, start + interval)
                for end in {g.time for g in budget if start <= g.time < start + interval}:
                    held = self.in_window(client_id, end, i)
                    assert held <= rate, f"rate {i}: {held} permits in the window ending {end}"
            elif config.algorithm is Algorithm.FIXED_WINDOW:
                held = self.in_window(client_id, start, i)
                assert held <= rate, f"rate {i}: {held} permits in the window of {start}"
            else:
                for first in budget:
                    for last in budget:
                        if first.time <= start <= last.time:
                            span = [g.permits for g in budget if first.time <= g.time <= last.time]
                            allowed = rate + rate * (last.time - first.time) / interval
                            assert sum(span) <= allowed, (
                                f"rate {i}: {sum(span)} permits from {first.time} to "
                                f"{last.time}, more than {allowed}"
                            )

    def release(self, client_id: str, asked: int, released: int, now: int) -> None:
        """Takes ``released`` permits from the newest grants that have started (reservations
        are not released), splitting the last one as the backends do."""
        budget = self.budget(client_id)
        if not self.sliding:
            assert 0 <= released <= asked
            if released:
                budget.clear()
            return
        started = [grant for grant in budget if grant.time <= now]
        # Each rate's log gives back from its own newest grants: as many as the fullest has.
        live = max(sum(g.permits for g in started if i in g.live) for i in range(len(self.rates)))
        logged = sum(g.permits for g in started)
        assert min(asked, live) <= released <= min(asked, logged), (asked, live, logged)
        while released:
            newest = started.pop()
            take = min(newest.permits, released)
            newest.permits -= take
            released -= take
            if newest.permits:
                newest.member = f"{newest.permits}:{newest.member.partition(':')[2]}"
            else:
                budget.remove(newest)
        budget.sort(key=lambda grant: grant.order)

    @property
    def rates(self) -> list[tuple[int, int]]:
        assert self.config is not None
        return self.config.rates

    def release_member(self, client_id: str, member: str, released: int) -> None:
        """Removes exactly the grant ``member`` (a reservation too), if it is still logged."""
        budget = self.budget(client_id)
        if not self.sliding:
            assert 0 <= released <= int(member.partition(":")[0])
            if released:
                budget.clear()
            return
        matches = [g for g in budget if g.member == member]
        live = [g for g in matches if not g.dead]
        if live:
            assert released == live[-1].permits, f"released {released} of {live[-1]}"
            budget.remove(live[-1])
        elif released:  # dead to the audit, but still logged
            gone = [g for g in matches if g.permits == released]
            assert gone, f"released {released} permits of {member!r}, which is not logged"
            budget.remove(gone[-1])

    def available(self, client_id: str, now: int, available: int) -> None:
        assert self.config is not None
        most = min(
            rate - self.in_window(client_id, now, i) for i, (rate, _) in enumerate(self.rates)
        )
        assert 0 <= available <= max(most, 0), f"{available} available, at most {most}"

    def configure(self, new: AuditConfig, keep_state: bool) -> None:
        old = self.config
        if (
            not keep_state
            or old is None
            or old.rate_type is not new.rate_type
            or old.algorithm is not new.algorithm
            or (new.algorithm is not Algorithm.SLIDING_WINDOW and old.rates != new.rates)
        ):
            self.budgets.clear()
        elif new.algorithm is Algorithm.SLIDING_WINDOW:
            # A rate the new config lacks no longer counts its log; one it adds starts empty.
            for budget in self.budgets.values():
                for grant in budget:
                    grant.live &= set(range(len(new.rates)))
        self.config = new


async def run(backend: Backend, op: tuple[Any, ...], name: str, interval: int, ttl_us: int) -> Any:
    """Runs one operation; what it returned (or the type of the error it raised)."""
    kind = op[0]
    try:
        if kind == "acquire":
            return ("attempt", await backend.try_acquire(name, op[2]))
        if kind == "reserve":
            max_wait = {"forever": None, "half": interval // 2, "interval": interval}[op[3]]
            return ("attempt", await backend.try_acquire(name, op[2], max_wait))
        if kind == "public_try_acquire":
            return ("granted", await RateLimiter(name, backend).try_acquire(op[2]))
        if kind == "release":
            return ("released", await backend.release(name, op[2]))
        if kind == "release_member":
            return ("released", await backend.release(name, int(op[3].partition(":")[0]), op[3]))
        if kind == "settle":
            return ("settle", await backend.settle(name, op[4], op[3]))
        if kind == "sync":
            return ("sync", await backend.sync(name, op[2], duration(op[3], interval)))
        if kind == "wait_time":
            return ("wait", await backend.wait_time(name, op[2]))
        if kind == "available":
            return ("available", await backend.available_permits(name))
        if kind == "configure":
            return ("written", await backend.set_rate(name, built(op[2]), op[1], op[3]))
        if kind == "get_config":
            return ("config", await backend.get_config(name))
        if kind == "delete":
            return ("deleted", await backend.delete(name))
        if kind == "expire":
            return ("expire", await backend.expire(name, ttl_us))
        if kind == "clear_expire":
            return ("clear_expire", await backend.clear_expire(name))
    except (InvalidArgumentError, NotConfiguredError) as exc:
        return ("error", type(exc).__name__)
    raise AssertionError(f"unknown operation {op!r}")


# What OnFakeTime runs in place of a script: the script itself, between a prologue that
# restores the TTLs (a DEL for a key whose TTL ran out) listed in PLAN_KEY and an epilogue that
# parks them, in one script call: no key expires while a script runs. The script's `redis`
# is wrapped to note the TTL each PEXPIRE or SET PX asks for (the real clock may tick while
# the script runs, so reading it back could be a few ms off). On Redis 7.0 a TTL of 1 ms
# set in a script may also run out at once (about 1 in 5000: PEXPIRE counts from a clock
# reading older than the script's), so 1 ms is set as 2 ms here, and reported as 1 ms.
PLAN_KEY = "aiolimit-test:plan"  # [pattern of the limiter's keys, key, ms or "del", ...]
_AROUND = """
local plan = redis.call('LRANGE', '%(plan)s', 0, -1)
local time = redis.call('TIME')
local began = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local restored, asked = {}, {}
for i = 2, #plan, 2 do
  if plan[i + 1] == 'del' then
    redis.call('DEL', plan[i])
  else
    redis.call('PEXPIRE', plan[i], math.max(tonumber(plan[i + 1]), 2))
    restored[plan[i]] = {redis.call('PEXPIRETIME', plan[i]), tonumber(plan[i + 1])}
  end
end
local function ttl_at(command, args) -- where a command that sets a TTL in ms has it
  command = string.upper(command)
  if command == 'PEXPIRE' then
    return 2
  end
  if command == 'SET' and #args == 4 and string.upper(args[3]) == 'PX' then
    return 4
  end
end
local real = redis
local function call(how, command, ...)
  local args = {...}
  local at = ttl_at(command, args)
  if at then
    asked[args[1]] = tonumber(args[at])
    args[at] = math.max(asked[args[1]], 2)
  end
  return real[how](command, unpack(args))
end
local function operation()
  local redis = setmetatable({
    call = function(...) return call('call', ...) end,
    pcall = function(...) return call('pcall', ...) end,
  }, {__index = real})
%(script)s
end
local ok, reply = pcall(operation)
local ttls = {}
for _, key in ipairs(redis.call('KEYS', plan[1])) do
  local at = redis.call('PEXPIRETIME', key)
  if at >= 0 and string.sub(key, -9) ~= ':released' then
    local was = restored[key]
    local kept = not asked[key] and was and was[1] == at
    table.insert(ttls, key)
    table.insert(ttls, asked[key] or (kept and was[2]) or at - began)
    redis.call('PEXPIRE', key, %(mark)d)
  end
end
if not ok then
  return redis.error_reply(type(reply) == 'table' and reply.err or tostring(reply))
end
return {reply, ttls}
"""


class OnFakeTime:
    """The Redis client the RedisBackend is given: it keeps the limiter's key TTLs on the
    fake clock, which stands still during an operation.

    Each script runs wrapped in ``_AROUND``: its keys get their TTL (``ttls``, ms left on the
    fake clock) just before it, and are parked with a TTL of ~115 days just after it, so that
    nothing ever expires in real time. The scripts' source comes from the backend itself:
    the first EVALSHA of each is answered NOSCRIPT, and the backend sends it again as EVAL.
    """

    def __init__(self, redis: Redis, pattern: str) -> None:
        self.redis = redis
        self.pattern = pattern
        self.expired: list[str] = []  # keys to drop before the next command
        self.ttls: dict[str, int] = {}
        self.scripts: dict[bytes, str] = {}  # SHA1 -> the script wrapped in _AROUND

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)

    def pipeline(self, *args: Any, **options: Any) -> Any:
        raise AssertionError("the test sends one command at a time")

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        command = _text(args[0]).upper()
        if command not in ("EVAL", "EVALSHA"):  # a plain read
            if self.expired:
                await self.redis.delete(*self.expired)
                self.expired = []
            return await self.redis.execute_command(*args, **options)
        if command == "EVAL":
            source = _text(args[1])
            sha = hashlib.sha1(args[1] if isinstance(args[1], bytes) else source.encode())
            self.scripts[sha.hexdigest().encode()] = _AROUND % {
                "plan": PLAN_KEY, "script": source, "mark": MARK_MS
            }  # fmt: skip
            args = ("EVALSHA", sha.hexdigest(), *args[2:])
        sha = args[1] if isinstance(args[1], bytes) else str(args[1]).encode()
        if sha not in self.scripts:
            raise redis_errors.NoScriptError("NOSCRIPT No matching script (the test's)")
        plan: list[Any] = [self.pattern]
        for key in self.expired:
            plan += [key, "del"]
        for key, ms in self.ttls.items():
            plan += [key, ms]
        self.expired = []
        await self.redis.delete(PLAN_KEY)
        await self.redis.rpush(PLAN_KEY, *plan)
        reply, ttls = await self.redis.eval(self.scripts[sha], *args[2:])
        self.ttls = {_text(ttls[i]): ttls[i + 1] for i in range(0, len(ttls), 2)}
        return reply


def counters_of(text: str) -> tuple[Any, ...]:
    """A token bucket's or fixed windows' state as Redis holds it, in memory's terms."""
    return (*parse_counters(text), parse_windows(text), parse_handbacks(text), parse_carries(text))


def memory_counters_of(budget: Any) -> tuple[Any, ...]:
    return (budget.last, budget.n, budget.held, budget.handbacks, budget.carried)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Twins:
    """One memory and one Redis backend per client id, on one fake clock, plus the audit."""

    def __init__(self, redis: Redis) -> None:
        self.now = self.latest = START_US
        self.name = f"property-{next(_names)}"
        self.tag = f"aiolimit:{{{self.name}}}"  # RedisBackend's default prefix and hash tag
        self.redis = redis
        self.on_fake_time = OnFakeTime(redis, f"{self.tag}*")
        self.memory = MemoryBackend(client_id="a", clock=self.clock)
        remote = RedisBackend(self.on_fake_time, client_id="a", clock=self.clock)
        self.backends = {
            "a": (self.memory, remote),
            "b": (self.memory.with_client("b"), remote.with_client("b")),
        }
        self.audit = Audit()
        self.members: list[str] = []  # of every grant, for release_member
        self.loose = False  # a settle or sync ran: the audit bounds, but checks no hand-back
        self.deadline: int | None = None  # the end expire() gave the limiter, if any

    def clock(self) -> float:
        return self.now / 1e6

    @property
    def interval(self) -> int:
        return self.audit.config.rates[0][1] if self.audit.config else INTERVALS_US[0]

    def set_clock(self, now: int) -> None:
        self.now = now
        self.latest = max(self.latest, now)

    # -- the memory backend's state, seen from the test (it counts TTLs on the fake clock) --

    def memory_config(self) -> Any:
        """The memory backend's stored config if it is alive now, else None."""
        limiter = self.memory._shared.limiters.get(self.name)
        if limiter is None or limiter.config is None or limiter.config.expires_at <= self.now:
            return None
        return limiter.config

    def memory_keys(self) -> dict[str, float]:
        """When each of the limiter's keys expires in the memory backend, named as Redis
        names them (``FOREVER``: no TTL)."""
        limiter = self.memory._shared.limiters.get(self.name)
        if limiter is None:
            return {}
        keys: dict[str, float] = {}
        if limiter.config is not None:
            keys[f"{self.tag}:config"] = limiter.config.expires_at
        for client_id, budget in limiter.budgets.items():
            suffix = "" if client_id is None else f":{client_id}"
            keys[f"{self.tag}:value{suffix}"] = budget.expires_at
            # (The counters of a token bucket or fixed windows: no log. A log emptied while
            # its summary of reclaimed grants lives: the value key alone.)
            if not budget.n and budget.live():
                keys[f"{self.tag}:permits{suffix}"] = budget.expires_at
        for (client_id, i), budget in limiter.extra.items():  # a sliding window's rate i
            suffix = "" if client_id is None else f":{client_id}"
            keys[f"{self.tag}:value{i}{suffix}"] = budget.expires_at
            if budget.live():
                keys[f"{self.tag}:permits{i}{suffix}"] = budget.expires_at
        # Redis's registry outlives every client's state: its TTL is clamped to expire()'s
        # end rounded up to the ms, as the state's is. The memory backend's is clamped to the
        # end itself, and may go first (by less than 1 ms, or by the skew while the clock is
        # behind), which counts for nothing in memory; but here Redis's registry, which
        # delete() counts, must then live on with the state.
        clients = [b.expires_at for client_id, b in limiter.budgets.items() if client_id]
        clients += [b.expires_at for (client_id, _), b in limiter.extra.items() if client_id]
        if limiter.registry or clients:
            registry = limiter.registry_expires_at if limiter.registry else -FOREVER
            keys[f"{self.tag}:clients"] = max([registry, *clients])
        return keys

    def last_member(self, who: str, permits: int, now: int) -> str:
        """The member of the grant just made (which RateLimiter.try_acquire does not say): a
        sequence number in a log, its start for the counters."""
        limiter = self.memory._shared.limiters[self.name]
        config = self.audit.config
        assert config is not None and limiter.config is not None
        key = who if config.rate_type is RateType.PER_CLIENT else None
        life = limiter.config.life
        if self.audit.sliding:
            return with_life(format_grant(permits, now, limiter.budgets[key].seq), life)
        state = limiter.config.state if state_in_config(limiter.config.config) else None
        state = state or limiter.budgets[key]
        a, b = state.n[0], state.n[1]  # the first rate's, after the grant
        tag = b - permits if config.algorithm is Algorithm.FIXED_WINDOW else a - now
        return with_life(format_grant(permits, now, tag), life)

    def ms_left(self, expires_at: float, now: int | None = None) -> int:
        """Time left until ``expires_at``, rounded up to whole ms as Redis keeps TTLs."""
        return -int(((self.now if now is None else now) - expires_at) // 1000)

    # -- Redis's TTLs, kept on the fake clock ------------------------------------------------

    def redis_before(self, keys: dict[str, float]) -> None:
        """Redis's keys expire when the memory backend's do, on the fake clock."""
        fake = self.on_fake_time
        fake.expired = [key for key, expires_at in keys.items() if expires_at <= self.now]
        fake.ttls = {k: self.ms_left(at) for k, at in keys.items() if self.now < at < FOREVER}

    async def compare_keys(self, now: int) -> None:
        """Both backends hold the same keys, with a TTL in the same cases, of the same length
        (to the ms). While the clock is behind (``now``, the limiter's time, is ahead of it)
        the memory backend counts some TTLs from ``now``, Redis from the clock."""
        fake = self.on_fake_time
        if fake.expired:  # (the operation sent no command)
            await self.redis.delete(*fake.expired)
            fake.expired = []
        keys = await self.redis.keys(f"{self.tag}*")
        ttls = {key.decode(): await self.redis.pttl(key) for key in keys}
        # (The receipts of releases: Redis keeps them against a client library's resends.)
        redis = {key: ttl for key, ttl in ttls.items() if not key.endswith(":released")}
        memory = self.memory_keys()
        registry = f"{self.tag}:clients"
        if registry in memory and registry not in redis:
            limiter = self.memory._shared.limiters[self.name]
            if not limiter.registry:  # (gone in both: its clients left it a while ago)
                del memory[registry]
        assert sorted(redis) == sorted(memory), f"redis {redis}, memory {memory}"
        for key, expires_at in memory.items():
            assert expires_at > self.now, f"{key} expired at {expires_at}, kept at {self.now}"
            if expires_at == FOREVER or redis[key] == -1:
                assert expires_at == FOREVER and redis[key] == -1, (
                    f"{key}: {redis[key]}, {expires_at}"
                )
            elif now == self.now:
                ms = fake.ttls[key]  # as the operation set it, or left it
                assert ms == self.ms_left(expires_at), (
                    f"{key}: TTL {ms} ms in Redis, expires at {expires_at} in memory"
                )

    async def compare_state(self) -> None:
        """Both backends hold the same state: the config's end (``expires_at``) and latest
        time (``clock``); each budget's permits, sequence number and log in each rate (a
        sliding window), or its latest start and counters (a token bucket, fixed windows).
        (The walk cursor is a cache of where the last walk stopped: Redis writes it back only
        with other changes, so it is not compared.) And the receipts of the grants handed
        back that a second hand-back could still take something from."""
        # (Redis also keeps the receipts of releases that named no grant: ids without ':'.)
        receipts = await self.redis.zrange(f"{self.tag}:released", 0, -1, withscores=True)
        in_redis = {(_text(r), int(t)) for r, t in receipts if ":" in _text(r) and t > self.now}
        receipts = self.memory._shared.receipts.items()
        in_memory = {(r, t) for (name, r), t in receipts if name == self.name and t > self.now}
        assert in_redis == in_memory, f"receipts: redis {in_redis}, memory {in_memory}"
        limiter = self.memory._shared.limiters.get(self.name)
        if limiter is None:
            return
        stored, gen = limiter.config, None
        if stored is not None and stored.expires_at > self.now:
            config = await self.redis.hgetall(f"{self.tag}:config")
            fields = {_text(k): _text(v) for k, v in config.items()}
            memory = {"expires_at": stored.deadline, "clock": stored.clock}
            redis = {k: int(fields[k]) if k in fields else None for k in memory}
            assert redis == memory, f"config: redis {redis}, memory {memory}"
            # An OVERALL token bucket's or fixed windows' "<last> <n1> ...", in the config (its
            # state has no generation of its own: the config's names its life).
            text = fields.get("state")
            in_hash = None if text is None else counters_of(text)
            state = stored.state
            memory_state = None if state is None else memory_counters_of(state)
            assert in_hash == memory_state, f"state: redis {in_hash}, memory {state}"
            gen = fields.get("gen")
            assert gen is not None and gen.split(".")[0] == stored.life, (gen, stored.life)
        logs = [(client_id, "", budget) for client_id, budget in limiter.budgets.items()]
        logs += [(client_id, i, budget) for (client_id, i), budget in limiter.extra.items()]
        for client_id, i, budget in logs:
            if budget.expires_at <= self.now:
                continue
            suffix = "" if client_id is None else f":{client_id}"
            value = _text(await self.redis.get(f"{self.tag}:value{i}{suffix}"))
            if budget.n:  # a token bucket's or fixed windows' "<gen> <last> <n1> ..."
                redis_gen, text = value.split(" ", 1)
                redis_counters = counters_of(text)
                memory_counters = memory_counters_of(budget)
                assert redis_counters == memory_counters, (
                    f"{suffix}: redis {redis_counters}, memory {memory_counters}"
                )
            else:
                logged = await self.redis.zrange(
                    f"{self.tag}:permits{i}{suffix}", 0, -1, withscores=True
                )
                memory_state = (
                    budget.used,
                    budget.seq,
                    [(m, t) for t, m, _ in budget.live()],
                    budget.held,
                    budget.handed,
                )
                redis_gen, used, seq, _cursor = value.split(" ", 3)
                held = [[int(p), int(at)] for p, at in re.findall(r" ~(\d+):(-?\d+)", value)]
                handed = re.search(r" ~h(-?\d+)", value)
                logs = [(_text(m), int(t)) for m, t in logged]
                redis_state = (int(used), int(seq), logs, held, handed and int(handed[1]))
                assert redis_state == memory_state, (
                    f"{i}{suffix}: redis {redis_state}, {memory_state}"
                )
            # (A token bucket's client state says which rates epoch of the config wrote it.)
            want = None if gen is None else gen.split(".")[0]
            want = want if want is None or not budget.epoch else f"{want}.{budget.epoch}"
            assert want is None or redis_gen == want, (
                f"{suffix}: generation {redis_gen}, not {want}"
            )

    # -- one step ---------------------------------------------------------------------------

    async def step(self, op: tuple[Any, ...]) -> Any:
        """Runs one operation on both backends, checks they agree, and updates the audit."""
        kind = op[0]
        if kind == "advance":
            self.set_clock(self.now + duration(op[1], self.interval))
            return None
        if kind == "back":
            self.set_clock(self.now - duration(op[1], self.interval))
            return None
        if kind == "catch_up":
            self.set_clock(self.latest)
            return None
        if kind == "wait_then_acquire":
            return await self.wait_then_acquire(op[1], op[2])
        if kind in ("release_member", "settle"):
            member = self.members[op[2] % len(self.members)] if self.members else "1:0:1"
            op = (*op, member)
        who = op[1] if kind in CLIENT_OPERATIONS else "a"
        in_memory, in_redis = self.backends[who]
        audit, interval = self.audit, self.interval

        # The limiter's time: a clock reading older than the latest it acted on is moved up.
        stored = self.memory_config()
        if stored is None:
            audit.vanish()  # deleted, or expired: the next config starts afresh
            self.deadline = None
        latest = None if stored is None else stored.clock
        now = self.now if latest is None else max(self.now, latest)
        audit.expire(now)

        ttl_us = max(duration(op[1], interval), 1) if kind == "expire" else 0

        before = self.memory_keys()
        self.redis_before(before)
        with same_lives(f"s{next(_steps)}"):  # a config made anew: one life in both
            expected = await run(in_memory, op, self.name, interval, ttl_us)
            actual = await run(in_redis, op, self.name, interval, ttl_us)
        assert actual == expected, f"{op!r}: redis {actual!r}, memory {expected!r}"
        await self.compare_keys(now)
        await self.compare_state()
        if kind in ("release_member", "settle") and stored is not None:
            # A grant of an earlier life (the limiter deleted, reset or gone since) moves
            # nothing of this one's.
            member = op[-1]
            if split_life(member)[1] != stored.life:
                assert expected[1] in (0, Settlement(0, 0, member)), f"{op!r}: {expected!r}"

        result = expected[1]
        if kind in ("acquire", "reserve") and isinstance(result, Grant):
            assert result.starts_at == now + result.starts_in
            audit.grant(who, op[2], result.starts_at, result.member)
            self.members.append(result.member)
        elif kind in ("acquire", "reserve") and isinstance(result, Refusal):
            assert result.at == now and result.retry_in >= 1
        elif kind == "public_try_acquire" and result is True:
            audit.grant(who, op[2], now, self.last_member(who, op[2], now))
        elif kind in ("release", "release_member") and expected[0] == "released" and self.loose:
            audit.budget(who).clear()  # (after a settle or sync: see below)
        elif kind == "release" and expected[0] == "released":
            audit.release(who, op[2], result, now)
        elif kind == "release_member" and expected[0] == "released":
            audit.release_member(who, op[3], result)
        elif kind in ("settle", "sync") and expected[0] == kind and audit.config is not None:
            # A charge or a floor only counts more; the audit forgets the budget's grants
            # (it then bounds less, never wrongly).
            audit.budget(who).clear()
            self.loose = True  # and no longer knows what a hand-back may give
            if kind == "settle" and result.member != op[4]:
                self.members.append(result.member)
        elif kind == "configure" and result:
            audit.configure(AuditConfig.of(op[2]), op[3])
            self.deadline = None
        elif kind == "delete":
            audit.vanish()
            self.deadline = None
        elif kind == "expire" and result:
            self.deadline = self.now + -(-ttl_us // 1000) * 1000
        elif kind == "clear_expire":
            self.deadline = None
        elif kind == "available" and expected[0] == "available":
            audit.available(who, now, result)
        return expected

    async def wait_then_acquire(self, who: str, permits: int) -> None:
        """A refused attempt's wait is exact: refused 1 us before it, granted at it."""
        first = await self.step(("acquire", who, permits))
        if first[0] != "attempt" or first[1].granted:
            return
        ready = first[1].at + first[1].retry_in  # on the limiter's time, which may be ahead
        if first[1].retry_in > 1:
            self.set_clock(ready - 1)
            early = await self.step(("acquire", who, permits))
            assert early[0] != "attempt" or not early[1].granted, "granted 1 us early"
        self.set_clock(ready)
        late = await self.step(("acquire", who, permits))
        assert late[0] != "attempt" or late[1].granted, f"refused at {ready}: {late}"


@pytest.mark.slow
@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,  # the same examples on every run, in CI too
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(  # a grant one microsecond before the oldest grant leaves the window
    first=(RateType.OVERALL, 2, INTERVALS_US[0], None),
    operations=[("acquire", "a", 2), ("advance", "interval-1us"), ("acquire", "b", 1)],
)
@example(  # PER_CLIENT: each client its own budget; a type change clears the state
    first=(RateType.PER_CLIENT, 2, INTERVALS_US[1], None),
    operations=[
        ("acquire", "a", 2),
        ("wait_then_acquire", "a", 1),
        ("acquire", "b", 2),
        ("release", "b", 1),
        ("configure", "update", (RateType.OVERALL, 3, INTERVALS_US[0], None), True),
        ("wait_then_acquire", "b", 3),
    ],
)
@example(  # a clock behind the latest time acted on acts at that time, then catches up
    first=(RateType.OVERALL, 2, INTERVALS_US[0], None),
    operations=[
        ("acquire", "a", 2),
        ("advance", "half"),
        ("acquire", "b", 1),
        ("back", "interval"),
        ("wait_then_acquire", "a", 1),
        ("back", "half"),
        ("release", "a", 1),
        ("available", "b"),
        ("catch_up",),
        ("advance", "half"),
        ("acquire", "a", 2),
    ],
)
@example(  # keep_alive: an idle limiter disappears one keep_alive after its last grant
    first=(RateType.PER_CLIENT, 1, INTERVALS_US[0], 1.5),
    operations=[
        ("acquire", "a", 1),
        ("advance", "interval"),
        ("acquire", "b", 1),
        ("advance", 1.5),
        ("get_config",),
        ("configure", "try", (RateType.PER_CLIENT, 1, INTERVALS_US[0], 1.5), True),
        ("acquire", "b", 1),
    ],
)
@example(  # expire, then clear_expire: the state keeps counting; then expire for good
    first=(RateType.OVERALL, 3, INTERVALS_US[0], 1.0),
    operations=[
        ("acquire", "a", 2),
        ("expire", "half"),
        ("acquire", "b", 1),
        ("clear_expire",),
        ("advance", "half"),
        ("release_member", "a", 0),
        ("acquire", "a", 2),
        ("expire", "1us"),
        ("advance", "1us"),
        ("delete",),
    ],
)
@example(  # a token bucket with two rates and a spacing: debt, a reservation, tokens back
    first=(
        RateType.OVERALL, 2, INTERVALS_US[0], None,
        Algorithm.TOKEN_BUCKET, ((3, INTERVALS_US[1]),), 2_500_000,
    ),
    operations=[
        ("acquire", "a", 2),
        ("wait_then_acquire", "b", 1),
        ("reserve", "a", 2, "forever"),
        ("available", "b"),
        ("wait_time", "a", 2),
        ("release", "a", 1),
        ("release_member", "b", 2),
        ("advance", "half"),
        ("wait_then_acquire", "a", 2),
        ("configure", "update", (RateType.OVERALL, 2, INTERVALS_US[0], 3.0), True),
        ("acquire", "a", 2),
    ],
)  # fmt: skip
@example(  # OVERALL counters keep their state in the config: kept, cleared, run out, retyped
    first=(
        RateType.OVERALL, 3, INTERVALS_US[0], None, Algorithm.FIXED_WINDOW, (), None,
    ),
    operations=[
        ("acquire", "a", 2),
        ("configure", "update", (
            RateType.OVERALL, 4, INTERVALS_US[0], None,
            Algorithm.FIXED_WINDOW, ((2, INTERVALS_US[1]),), None,
        ), True),
        ("acquire", "b", 2),
        ("expire", "interval"),
        ("clear_expire",),
        ("advance", "interval"),
        ("available", "a"),
        ("configure", "set", (
            RateType.OVERALL, 3, INTERVALS_US[0], None, Algorithm.FIXED_WINDOW, (), None,
        ), True),
        ("acquire", "a", 1),
        ("configure", "set", (
            RateType.OVERALL, 3, INTERVALS_US[0], None, Algorithm.TOKEN_BUCKET, (), None,
        ), True),
        ("acquire", "a", 3),
        ("configure", "update", (
            RateType.OVERALL, 3, INTERVALS_US[1], None, Algorithm.TOKEN_BUCKET, (), None,
        ), True),
        ("wait_then_acquire", "b", 1),
        ("advance", "interval+1us"),
        ("release", "a", 1),
        ("configure", "set", (
            RateType.PER_CLIENT, 3, INTERVALS_US[0], None, Algorithm.TOKEN_BUCKET, (), None,
        ), True),
        ("acquire", "a", 2),
        ("configure", "set", (
            RateType.OVERALL, 3, INTERVALS_US[0], 1.0, Algorithm.TOKEN_BUCKET, (), None,
        ), True),
        ("acquire", "b", 1),
        ("advance", "interval+1us"),
        ("get_config",),
        ("delete",),
    ],
)  # fmt: skip
@example(  # fixed windows, PER_CLIENT, three rates: the next window with room in every rate
    first=(
        RateType.PER_CLIENT, 2, INTERVALS_US[0], 1.0,
        Algorithm.FIXED_WINDOW, ((3, INTERVALS_US[1]), (4, INTERVALS_US[2])), None,
    ),
    operations=[
        ("acquire", "a", 2),
        ("wait_then_acquire", "a", 1),
        ("reserve", "a", 2, "forever"),
        ("release", "a", 1),
        ("release_member", "a", 2),
        ("acquire", "b", 2),
        ("advance", "interval-1us"),
        ("wait_then_acquire", "b", 2),
        ("available", "a"),
        ("expire", "interval"),
        ("advance", "interval"),
        ("acquire", "a", 1),
    ],
)  # fmt: skip
@example(  # a sliding window with three rates and a spacing; keep_state with fewer, then more
    first=(
        RateType.PER_CLIENT, 3, INTERVALS_US[0], None,
        Algorithm.SLIDING_WINDOW, ((4, INTERVALS_US[1]), (5, INTERVALS_US[2])), 7_000_000,
    ),
    operations=[
        ("acquire", "a", 2),
        ("wait_then_acquire", "a", 1),
        ("reserve", "b", 3, "forever"),
        ("advance", "interval"),
        ("wait_then_acquire", "a", 3),
        ("release", "a", 2),
        ("release_member", "b", 2),
        ("configure", "update", (RateType.PER_CLIENT, 3, INTERVALS_US[0], None), True),
        ("wait_then_acquire", "a", 2),
        ("configure", "set", (
            RateType.PER_CLIENT, 3, INTERVALS_US[0], None,
            Algorithm.SLIDING_WINDOW, ((2, INTERVALS_US[2]),), 1,
        ), True),
        ("wait_then_acquire", "b", 2),
        ("configure", "set", (
            RateType.PER_CLIENT, 3, INTERVALS_US[0], None,
            Algorithm.FIXED_WINDOW, ((2, INTERVALS_US[2]),), 1,
        ), True),
        ("acquire", "b", 2),
        ("delete",),
    ],
)  # fmt: skip
@example(  # an OVERALL token bucket keeps its missing tokens through keep_state
    first=(
        RateType.OVERALL, 3, INTERVALS_US[0], None,
        Algorithm.TOKEN_BUCKET, ((4, INTERVALS_US[1]),), 0,
    ),
    operations=[
        ("acquire", "a", 3),
        ("advance", "1us"),
        ("configure", "set", (
            RateType.OVERALL, 3, INTERVALS_US[1], None,
            Algorithm.TOKEN_BUCKET, ((4, INTERVALS_US[2]),), 0,
        ), True),
        ("acquire", "a", 1),
        ("advance", "half"),
        ("available", "a"),
        ("reserve", "a", 2, "forever"),
    ],
)  # fmt: skip
@example(  # a PER_CLIENT bucket converts at its next call through two changes
    first=(
        RateType.PER_CLIENT, 3, INTERVALS_US[0], None,
        Algorithm.TOKEN_BUCKET, ((4, INTERVALS_US[1]),), 0,
    ),
    operations=[
        ("acquire", "a", 3),
        ("acquire", "b", 2),
        ("advance", "1us"),
        ("configure", "set", (
            RateType.PER_CLIENT, 3, INTERVALS_US[1], None,
            Algorithm.TOKEN_BUCKET, ((4, INTERVALS_US[2]),), 0,
        ), True),
        ("acquire", "a", 1),
        ("advance", "half"),
        ("configure", "set", (RateType.PER_CLIENT, 2, INTERVALS_US[2], None,
            Algorithm.TOKEN_BUCKET, (), 0), True),
        ("available", "b"),
        ("reserve", "b", 2, "forever"),
        ("acquire", "a", 1),
    ],
)  # fmt: skip
@example(  # fixed windows keep earlier windows; keep_state to a longer interval counts them
    first=(RateType.PER_CLIENT, 3, INTERVALS_US[0], None, Algorithm.FIXED_WINDOW, (), 0),
    operations=[
        ("acquire", "a", 2),
        ("advance", "interval"),
        ("acquire", "a", 1),
        ("advance", "interval"),
        ("acquire", "a", 3),
        ("configure", "set", (RateType.PER_CLIENT, 3, INTERVALS_US[2], None,
            Algorithm.FIXED_WINDOW, (), 0), True),
        ("acquire", "a", 1),
        ("available", "a"),
    ],
)  # fmt: skip
@example(  # a sliding window keeps what it reclaimed; keep_state to a longer interval logs it
    first=(RateType.PER_CLIENT, 3, INTERVALS_US[0], None),
    operations=[
        ("acquire", "a", 2),
        ("advance", "half"),
        ("acquire", "a", 1),
        ("advance", "interval"),
        ("acquire", "a", 1),
        ("configure", "set", (RateType.PER_CLIENT, 3, INTERVALS_US[2], None), True),
        ("acquire", "a", 1),
        ("available", "a"),
        ("reserve", "a", 1, "forever"),
    ],
)  # fmt: skip
@given(first=config, operations=st.lists(operation, min_size=5, max_size=50))
async def test_memory_and_redis_agree_and_never_exceed_the_rate(
    redis_server: LocalRedis, first: Config, operations: list[tuple[Any, ...]]
) -> None:
    redis = Redis.from_url(redis_server.url)
    twins = Twins(redis)
    try:
        for op in [("configure", "set", first, False), *operations]:
            await twins.step(op)
    finally:
        keys = await redis.keys(f"{twins.tag}*")
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def test_available_permits_is_never_negative_on_either_backend(
    redis_server: LocalRedis,
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        twins = Twins(redis)
        await twins.step(("configure", "set", (RateType.OVERALL, 2, INTERVALS_US[0], None), False))
        await twins.step(("acquire", "a", 2))
        await twins.step(("reserve", "a", 1, "forever"))  # left is -1 until the reservation
        for memory_or_redis in twins.backends["a"]:
            assert await memory_or_redis.available_permits(twins.name) == 0
    finally:
        await redis.aclose()


# -- what the random test once found -------------------------------------------------------------


async def replay(redis_server: LocalRedis, first: Config, operations: list) -> None:
    """Runs ``operations`` as the random test does."""
    redis = Redis.from_url(redis_server.url)
    twins = Twins(redis)
    try:
        for op in [("configure", "set", first, False), *operations]:
            await twins.step(op)
    finally:
        await redis.aclose()


async def test_a_longer_expire_keeps_the_state_as_long_as_the_config(
    redis_server: LocalRedis,
) -> None:
    # expire(1 ms) gives config and state a TTL of 1 ms; expire(10 s) then gives the config
    # 10 s, and the state must get back the TTL its grant needs: were it to keep 1 ms, the
    # grant would be forgotten while the limiter lives on, and a second permit granted inside
    # the window of a rate of 1 (the audit fails on that).
    await replay(
        redis_server,
        (RateType.OVERALL, 1, INTERVALS_US[0], None),
        [
            ("acquire", "a", 1),
            ("expire", "1us"),  # 1 ms
            ("expire", "interval"),  # 10 s
            ("advance", "half"),
            ("acquire", "b", 1),  # refused by both
        ],
    )


async def test_expire_while_the_clock_is_behind_acts_at_the_limiter_time(
    redis_server: LocalRedis,
) -> None:
    # expire(1 ms) while the clock is behind: the state's TTL counts from the limiter's time
    # in both (the memory backend once ended it half an interval early, and then granted).
    await replay(
        redis_server,
        (RateType.OVERALL, 1, INTERVALS_US[0], None),
        [
            ("acquire", "a", 1),
            ("acquire", "b", 1),
            ("back", "half"),
            ("expire", "1us"),
            ("acquire", "a", 1),
        ],
    )


async def test_a_refusal_leaves_the_budget_ttl_as_redis_does(redis_server: LocalRedis) -> None:
    # After a shorter interval (kept state), a refusal that reclaims nothing writes nothing:
    # the budget keeps its TTL of 25 s in both backends (the memory backend once stored it
    # again with 10 s, and then granted what Redis refused once the interval grew back).
    await replay(
        redis_server,
        (RateType.PER_CLIENT, 1, INTERVALS_US[1], None),
        [
            ("acquire", "a", 1),
            ("configure", "set", (RateType.PER_CLIENT, 1, INTERVALS_US[0], None), True),
            ("acquire", "a", 1),  # refused; TTL 25 s in both
        ],
    )


async def test_a_new_registry_gets_the_ttl_of_its_clients(redis_server: LocalRedis) -> None:
    # set_rate(keep_state=False) clears the clients registry, and its expiry with it: the
    # next client's grant gives the new registry 20 s (its budget's 10 s plus an interval) in
    # both backends, not the 80 s the old one had (else, with the config gone by then, delete()
    # would answer True in memory and False in Redis for 60 s).
    await replay(
        redis_server,
        (RateType.PER_CLIENT, 1, INTERVALS_US[2], None),
        [
            ("acquire", "a", 1),
            ("configure", "set", (RateType.PER_CLIENT, 1, INTERVALS_US[0], 1.0), False),
            ("acquire", "a", 1),  # registry: 20 s in both
        ],
    )


async def test_a_per_client_reset_keeps_a_clients_reservation_on_both_backends(
    redis_server: LocalRedis,
) -> None:
    # A PER_CLIENT reset with a reservation queued: the client's new budget counts it, and
    # both backends hold the same keys for it (retire.lua and its twin).
    config = (RateType.PER_CLIENT, 1, INTERVALS_US[0], None, Algorithm.SLIDING_WINDOW, (), None)
    await replay(
        redis_server,
        config,
        [
            ("acquire", "a", 1),
            ("acquire", "a", 1),
            ("reserve", "a", 1, "forever"),
            ("configure", "set", config, False),
            ("acquire", "a", 1),
            ("advance", "interval"),
            ("acquire", "a", 1),
        ],
    )


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(  # a charge into debt, a resend, a settle for fewer, and a floor
    first=(RateType.OVERALL, 3, INTERVALS_US[0], None, Algorithm.FIXED_WINDOW, (), 0),
    operations=[
        ("acquire", "a", 3),
        ("settle", "a", 0, 5),
        ("settle", "a", 0, 5),
        ("reserve", "a", 2, "forever"),
        ("settle", "a", 1, 0),
        ("sync", "a", 1, "half"),
        ("available", "a"),
    ],
)  # fmt: skip
@example(  # a floor past a fixed window's end: grants either side, hand-backs, a charge
    first=(RateType.PER_CLIENT, 4, INTERVALS_US[0], None, Algorithm.FIXED_WINDOW, (), 0),
    operations=[
        ("acquire", "a", 1),
        ("advance", "half"),
        ("sync", "a", 2, "interval"),
        ("acquire", "a", 1),
        ("sync", "a", 1, "interval"),
        ("release_member", "a", 1),
        ("advance", "half"),
        ("acquire", "a", 1),
        ("settle", "a", 2, 3),
        ("wait_time", "a", 2),
        ("reserve", "a", 2, "forever"),
        ("advance", "interval"),
        ("available", "a"),
    ],
)  # fmt: skip
@given(first=config, operations=st.lists(settle_operation, min_size=5, max_size=40))
async def test_memory_and_redis_agree_on_settle_and_sync(
    redis_server: LocalRedis, first: Config, operations: list[tuple[Any, ...]]
) -> None:
    await test_memory_and_redis_agree_and_never_exceed_the_rate.hypothesis.inner_test(  # type: ignore[attr-defined]
        redis_server, first, operations
    )
