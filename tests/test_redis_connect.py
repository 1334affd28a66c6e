"""Connecting a RedisBackend as a newcomer does: a URL or a synchronous client is refused at
construction with what to pass instead (``RedisBackend.from_url`` takes the URL, and owns
the client it makes); a server that needs credentials says so, on every path (the backend's
calls, the CLI), rather than reading as an outage."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from commands import aiolimit
from redis.asyncio import Redis

from aiolimit import BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend

try:
    from aiolimit import CredentialsError
except ImportError:  # (before the fix)
    CredentialsError = BackendError
from tools import LocalRedis, free_port

_names = itertools.count()


@pytest.mark.parametrize(
    "wrong",
    [
        "redis://localhost:6379",
        b"redis://localhost:6379",
        redis.Redis(),  # (makes no connection)
        redis.Redis.from_url("redis://localhost:6379"),
    ],
    ids=["url", "url-bytes", "sync-client", "sync-client-from-url"],
)
def test_a_url_or_a_synchronous_client_is_refused_at_construction_with_what_to_pass(
    wrong: object,
) -> None:
    with pytest.raises(TypeError) as refused:
        RedisBackend(wrong)
    message = str(refused.value)
    assert "redis.asyncio" in message and "RedisBackend.from_url" in message, message


async def client_names(server: LocalRedis) -> list[str]:
    admin = Redis.from_url(server.url, decode_responses=True)
    try:
        return [client["name"] for client in await admin.client_list()]
    finally:
        await admin.aclose()


async def test_from_url_makes_the_client_with_its_options_and_aclose_closes_it(
    redis_server: LocalRedis,
) -> None:
    backend = RedisBackend.from_url(
        redis_server.url, prefix="from-url:", timeout=2, client_name="aiolimit-from-url"
    )
    assert backend.timeout == 2
    limiter = RateLimiter(f"from-url-{next(_names)}", backend, rate="2/min")
    assert await limiter.try_acquire(2)
    assert backend.keys(limiter.name).config.startswith("from-url:")
    view = backend.with_client("someone")
    await view.aclose()  # a view does not own the client
    assert await limiter.try_acquire() is False
    assert "aiolimit-from-url" in await client_names(redis_server)
    await backend.aclose()
    assert "aiolimit-from-url" not in await client_names(redis_server)


async def test_a_client_passed_in_stays_open_after_aclose(redis_server: LocalRedis) -> None:
    client = Redis.from_url(redis_server.url)
    backend = RedisBackend(client)
    await backend.aclose()
    assert await client.ping()
    await client.aclose()


# -- credentials ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_server() -> Iterator[LocalRedis]:
    with LocalRedis("--requirepass", "s3cret") as server:
        yield server


def with_password(server: LocalRedis, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}"


@pytest.fixture(params=["no-password", "wrong-password"])
async def wrong_credentials(
    request: pytest.FixtureRequest, locked_server: LocalRedis
) -> AsyncIterator[Redis]:
    if request.param == "no-password":
        url = locked_server.url
    else:
        url = with_password(locked_server, "wrong")
    client = Redis.from_url(url)
    try:
        yield client
    finally:
        await client.aclose()


def says_credentials(error: BaseException) -> None:
    message = str(error)
    assert isinstance(error, CredentialsError), repr(error)
    assert isinstance(error, BackendError) and not error.outage
    assert "credentials" in message and "redis://USER:PASSWORD@HOST" in message, message
    assert "unreachable" not in message and "set_rate" not in message, message


async def test_a_missing_or_wrong_password_says_the_server_needs_credentials(
    wrong_credentials: Redis,
) -> None:
    backend = RedisBackend(wrong_credentials)
    limiter = RateLimiter(f"locked-{next(_names)}", backend)
    with pytest.raises(CredentialsError) as refused:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
    says_credentials(refused.value)
    with_rate = RateLimiter(f"locked-{next(_names)}", backend, rate="5/min")
    for call in (with_rate.acquire, with_rate.try_acquire, lambda: with_rate.reserve()):
        with pytest.raises(CredentialsError) as refused:
            await call()
        says_credentials(refused.value)


async def test_the_right_password_in_the_url_works(locked_server: LocalRedis) -> None:
    backend = RedisBackend.from_url(with_password(locked_server, "s3cret"))
    try:
        assert await RateLimiter(f"locked-{next(_names)}", backend, rate="5/min").try_acquire()
    finally:
        await backend.aclose()


async def test_an_outage_at_the_first_acquire_does_not_name_the_set_rate_script() -> None:
    backend = RedisBackend.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    try:
        limiter = RateLimiter(f"nowhere-{next(_names)}", backend, rate="5/min")
        with pytest.raises(BackendError) as failed:
            await limiter.acquire()
    finally:
        await backend.aclose()
    message = str(failed.value)
    assert "unreachable" in message and "set_rate" not in message, message
    assert failed.value.outage


@pytest.mark.parametrize("password", [None, "wrong"])
def test_the_cli_says_the_server_needs_credentials(
    capsys: pytest.CaptureFixture[str], locked_server: LocalRedis, password: str | None
) -> None:
    url = locked_server.url if password is None else with_password(locked_server, password)
    code, _, err = aiolimit(capsys, url, "list")
    assert code == 2
    [line] = err.strip().splitlines()
    assert "credentials" in line and "redis://USER:PASSWORD@HOST" in line, line
    assert "wrong" not in line  # the URL's password masked
    assert "HELLO" not in line and "Traceback" not in err
