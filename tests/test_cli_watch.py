"""``aiolimit watch`` against a real redis-server: one line per tick (redrawn on a terminal),
and ``grants/s`` counts
the grants whose slot started between two ticks: a reservation when its slot comes, never a
caller that a block sent back to queue again, nor one that reserves behind a block.

The ticks' readings are made in turn with the test (each waits for the test's go), so what
happens between two readings is what the test made happen, however late a busy machine runs.
"""

from __future__ import annotations

import asyncio
import io
import re
import sys
import threading
from typing import Any

import pytest
from commands import aiolimit, full_with_a_reservation, on_server
from conformance import until

from aiolimit import Algorithm, Rate, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit._tools import cli
from aiolimit._tools.admin import watch
from aiolimit.backends._protocol import parse_value


class Ticks:
    """Makes ``watch``'s readings wait for the test: ``await ticks.read(i)`` lets reading
    ``i`` (from 0) happen and returns once it is done."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self._go = [threading.Event() for _ in range(count)]
        self._done = [threading.Event() for _ in range(count)]
        self._made = 0
        read = watch._read

        async def in_turn(*args: Any, **kwargs: Any) -> Any:
            turn = self._made
            self._made += 1
            assert await asyncio.to_thread(self._go[turn].wait, 30)
            got = await read(*args, **kwargs)
            self._done[turn].set()
            return got

        monkeypatch.setattr(watch, "_read", in_turn)

    async def read(self, turn: int) -> None:
        self._go[turn].set()
        assert await asyncio.to_thread(self._done[turn].wait, 30)


async def grants_made(backend: RedisBackend, name: str) -> int:
    """The sequence number of the limiter's latest grant (reservations included)."""
    raw = await backend.redis.get(backend.keys(name).value)
    return 0 if raw is None else parse_value(raw.decode())[2]


async def made(backend: RedisBackend, name: str, grants: int) -> None:
    """Waits until the limiter has made ``grants`` grants (reservations included)."""
    await until(lambda: grants_made(backend, name), lambda made: made >= grants, "grants", 30)


def watching(url: str, name: str, count: int) -> asyncio.Task[int]:
    argv = ["watch", name, "--count", str(count), "--interval", "0.1", "--redis", url]
    return asyncio.create_task(asyncio.to_thread(cli.main, argv))


def rates_shown(out: str) -> list[str]:
    return [line.split()[1] for line in out.splitlines()]


WATCH_LINE = re.compile(
    r"\d\d:\d\d:\d\d  +(?P<rate>-|\d+\.\d) grants/s  window +(?P<taken>\d+)/(?P<rate_of>\d+) "
    r"\[(?P<bar>[#-]{20})\]  queued (?P<queued>\d+)(?: \(\+(?P<ahead>[\d.]+) s\))?"
)


def test_watch_prints_one_plain_line_per_tick_when_not_a_tty(capsys, url, name):
    on_server(url, lambda backend: full_with_a_reservation(backend, name))
    code, out, err = aiolimit(capsys, url, "watch", name, "--count", "3", "--interval", "0.1")
    assert (code, err) == (0, "")
    assert "\x1b" not in out and "\r" not in out
    lines = out.splitlines()
    assert len(lines) == 3
    seen = [WATCH_LINE.fullmatch(line) for line in lines]
    assert all(seen), lines
    first, *later = seen
    assert first is not None and first["rate"] == "-"  # no earlier reading to compare with
    for match in later:
        assert match is not None and match["rate"] == "0.0"  # no grants meanwhile
    for match in seen:
        assert match is not None
        assert (match["taken"], match["rate_of"], match["bar"]) == ("10", "10", "#" * 20)
        assert match["queued"] == "1" and 58 <= float(match["ahead"]) <= 60


def test_watch_help_states_the_shortest_interval(capsys):
    with pytest.raises(SystemExit):
        cli.main(["watch", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "at least 0.1" in out


@pytest.mark.slow
def test_watch_counts_grants_per_second(capsys, monkeypatch, url, name):
    # The 40 grants are made between watch's two readings (each waits for the other), and the
    # rate shown is theirs over the interval watch itself measured between the readings (on
    # the server's clock), however late a busy machine ran its ticks.
    read, first_read, granted = watch._read, threading.Event(), threading.Event()
    nows: list[float] = []

    async def reading_in_turn(*args: Any) -> Any:
        if nows:
            assert await asyncio.to_thread(granted.wait, 30)
        got = await read(*args)
        nows.append(got[1].now_us / 1e6)
        first_read.set()
        return got

    monkeypatch.setattr(watch, "_read", reading_in_turn)

    async def grant_between_ticks(backend: RedisBackend) -> int:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        watcher = asyncio.create_task(
            asyncio.to_thread(cli.main, ["watch", name, "--count", "2", "--redis", url])
        )
        assert await asyncio.to_thread(first_read.wait, 30)
        assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(40))))
        granted.set()
        return await watcher

    assert on_server(url, grant_between_ticks) == 0
    lines = capsys.readouterr().out.splitlines()
    second = WATCH_LINE.fullmatch(lines[1])
    assert second is not None
    assert len(nows) == 2 and nows[1] > nows[0]
    assert float(second["rate"]) == pytest.approx(40 / (nows[1] - nows[0]), abs=0.051)
    assert second["taken"] == "40"


def test_watch_on_a_tty_redraws_one_line(monkeypatch, url, name):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    on_server(
        url,
        lambda backend: RateLimiter(name, backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 5, 1)
        ),
    )
    assert cli.main(["watch", name, "--count", "2", "--interval", "0.1", "--redis", url]) == 0
    shown = terminal.getvalue()
    assert shown.count("\r\x1b[K") == 2
    assert shown.endswith("\n") and shown.count("\n") == 1


@pytest.mark.slow
def test_watch_shows_no_grants_while_a_block_holds_them_back(capsys, monkeypatch, url, name):
    # Three callers sleep on reservations when the block comes: at their slot they hand them
    # back and queue again, behind the block (three more grants made); then one more caller
    # reserves behind it. The limiter's grant count rises by four; no grant starts.
    ticks = Ticks(monkeypatch, 3)

    async def scenario(backend: RedisBackend) -> int:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 0.5))
        assert await limiter.try_acquire(5)
        callers = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
        await made(backend, name, 4)  # three reservations, 0.5 s ahead
        watcher = watching(url, name, 3)
        try:
            await ticks.read(0)
            await limiter.pause(30)
            await made(backend, name, 7)  # the three queued again, behind the block
            await ticks.read(1)
            callers.append(asyncio.create_task(limiter.acquire()))
            await made(backend, name, 8)
            await ticks.read(2)
            return await watcher
        finally:
            for caller in callers:
                caller.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
            await limiter.delete()

    assert on_server(url, scenario) == 0
    out = capsys.readouterr().out
    assert rates_shown(out) == ["-", "0.0", "0.0"], out
    assert ["blocked" in line for line in out.splitlines()] == [False, True, True], out


@pytest.mark.slow
def test_watch_counts_a_reservation_when_its_slot_starts(capsys, monkeypatch, url, name):
    ticks = Ticks(monkeypatch, 3)

    async def scenario(backend: RedisBackend) -> int:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 0.5))
        assert await limiter.try_acquire(5)
        watcher = watching(url, name, 3)
        await ticks.read(0)
        callers = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
        await made(backend, name, 4)  # reserved: no grant has started yet
        await ticks.read(1)
        await asyncio.gather(*callers)  # their slots came
        await ticks.read(2)
        code = await watcher
        await limiter.delete()
        return code

    assert on_server(url, scenario) == 0
    shown = rates_shown(capsys.readouterr().out)
    assert shown[:2] == ["-", "0.0"]
    assert float(shown[2]) > 0


@pytest.mark.parametrize(
    ("rate_type", "rates"),
    [(RateType.OVERALL, "10/second; 100/minute"), (RateType.PER_CLIENT, "5/minute")],
)
def test_watch_counts_the_grants_of_every_rate_and_client(
    capsys, monkeypatch, url, name, rate_type, rates
):
    ticks = Ticks(monkeypatch, 2)

    async def scenario(backend: RedisBackend) -> int:
        await RateLimiter(name, backend).set_rate(
            RateLimiterConfig.build(rate_type, Rate.parse(rates))
        )
        watcher = watching(url, name, 2)
        await ticks.read(0)
        for client in ("a", "b", "c"):
            assert await RateLimiter(name, backend.with_client(client)).try_acquire(2)
        await ticks.read(1)
        code = await watcher
        await RateLimiter(name, backend).delete()
        return code

    assert on_server(url, scenario) == 0
    shown = rates_shown(capsys.readouterr().out)
    assert shown[0] == "-" and float(shown[1]) > 0


def test_watch_shows_no_rate_for_the_counters_which_keep_no_log(capsys, url, name):
    async def scenario(backend: RedisBackend) -> int:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 5, 1, algorithm=Algorithm.TOKEN_BUCKET)
        )
        assert await limiter.try_acquire(2)
        code = await watching(url, name, 2)
        await limiter.delete()
        return code

    assert on_server(url, scenario) == 0
    assert rates_shown(capsys.readouterr().out) == ["-", "-"]
