"""The httpx transport takes a request's permit as late as the request allows: on a new
connection, after the connection is made and just before the request is written (httpcore's
``trace`` extension), so the time a connection takes to set up is not in the grant, and the
partner sees the request when the grant says. On a real local server, whose connections take
``SETUP`` seconds to make; the grant's start and the request's first byte on one clock (the
event loop's, the memory backend's default).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpcore
import httpx
import pytest
from conformance import Tolerance

from aiolimit import MemoryBackend, RateLimiter
from aiolimit._calls import last_grant
from aiolimit.backends import Grant
from aiolimit.httpx import RateLimitedTransport

SETUP = 0.3  # seconds a new connection takes to be made
LATE = Tolerance(0.0, 0.1)  # a loaded machine's scheduling, not a connection's set-up


class Partner:
    """An HTTP/1.1 server on 127.0.0.1 that answers ``ok`` on keep-alive connections and
    notes when each request's first byte came (on the event loop's clock)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        loop = asyncio.get_running_loop()
        try:
            while first := await reader.read(1):
                self.arrivals.append(loop.time())
                await reader.readuntil(b"\r\n\r\n")
                del first
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def partner() -> AsyncIterator[tuple[Partner, str]]:
    served = Partner()
    server = await asyncio.start_server(served.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield served, f"http://127.0.0.1:{port}"


@pytest.fixture
def slow_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every new connection httpcore makes takes SETUP seconds more (a far partner, a TLS
    handshake): the connection is real, made after the wait."""
    connect = httpcore.AnyIOBackend.connect_tcp

    async def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(SETUP)
        return await connect(self, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", slow)
    yield


def grant_start() -> float:
    """When the grant of this task's last call started (s, the limiter's clock)."""
    acquired = last_grant.get()
    assert acquired is not None
    starts = [a.starts_at for a in acquired.attempts if isinstance(a, Grant)]
    return max(starts) / 1e6


@pytest.mark.usefixtures("slow_connections")
async def test_a_new_connection_s_setup_is_not_in_the_grant(partner: tuple[Partner, str]) -> None:
    served, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/second")
    async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as http:
        starts = []
        for _ in range(3):  # a new connection, then the same one twice
            assert (await http.get(url)).text == "ok"
            starts.append(grant_start())
    assert served.connections == 1
    for start, arrival in zip(starts, served.arrivals, strict=True):
        LATE.check(arrival, start, "the request's first byte")
    assert await limiter.available_permits() == 100 - 3  # one permit a request, none left over


@pytest.mark.usefixtures("slow_connections")
async def test_a_request_that_could_not_connect_took_no_permit_after_all(
    partner: tuple[Partner, str],
) -> None:
    _, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/second")
    closed = url.rsplit(":", 1)[0] + ":1"  # (nobody listens on port 1)
    async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(closed)
    assert await limiter.available_permits() == 100


async def test_a_transport_of_the_caller_s_own_takes_the_permit_before_sending(
    partner: tuple[Partner, str], slow_connections: None
) -> None:
    """The fallback: a transport given to it may not report its connections (a custom one,
    HTTP/2's multiplexed streams), so the permit is taken before the request is handed on."""
    served, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/second")
    transport = RateLimitedTransport(limiter, httpx.AsyncHTTPTransport())
    async with httpx.AsyncClient(transport=transport) as http:
        await http.get(url)
    assert served.arrivals[0] - grant_start() >= SETUP
    assert await limiter.available_permits() == 100 - 1


async def test_the_caller_s_own_trace_still_sees_every_event(
    partner: tuple[Partner, str], slow_connections: None
) -> None:
    _, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/second")
    seen: list[str] = []

    async def trace(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as http:
        await http.get(url, extensions={"trace": trace})
        await http.get(url, extensions={"trace": trace})
    assert seen.count("connection.connect_tcp.started") == 1
    assert seen.count("http11.send_request_headers.started") == 2
    assert seen.count("http11.response_closed.complete") == 2


async def test_a_permit_is_held_while_its_connection_is_made_then_asked_anew(
    partner: tuple[Partner, str], slow_connections: None
) -> None:
    """While a new connection is made the call's permit stays held (another caller finds
    none: no slot left unused while waiters already asleep keep their later ones); a set-up
    longer than the margin covers (any, on an exact rate) hands it back once connected, and
    the call asks anew, so the set-up is not in the grant."""
    served, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="1/second")
    transport = RateLimitedTransport(limiter, timeout=5)
    async with httpx.AsyncClient(transport=transport) as http:
        sending = asyncio.ensure_future(http.get(url))
        await asyncio.sleep(SETUP / 2)  # connecting: its permit held
        assert not await limiter.try_acquire()
        assert (await sending).text == "ok"
    assert len(served.arrivals) == 1
    assert await limiter.available_permits() == 0  # one permit: the request's


@pytest.fixture
def stall_before_writing(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Before a request on a kept-alive connection is written, the process stalls for each
    of the returned list's seconds in turn (a machine busy with other work): after its
    permit was taken and checked, before the partner sees a byte."""
    stalls: list[float] = []
    handle = httpcore.AsyncHTTP11Connection.handle_async_request

    async def stalled(self: Any, request: Any) -> Any:
        if stalls:
            await asyncio.sleep(stalls.pop(0))
        return await handle(self, request)

    monkeypatch.setattr(httpcore.AsyncHTTP11Connection, "handle_async_request", stalled)
    return stalls


@pytest.mark.measured_margin
async def test_a_permit_later_than_the_margin_when_the_request_is_written_is_asked_again(
    partner: tuple[Partner, str], stall_before_writing: list[float]
) -> None:
    """Late by more than the fleet's measured margin covers when its bytes are about to
    leave, the request would land among the next slots' requests: it is not written, its
    grant goes back, and it asks again (without holding the connection, which the partner
    may close meanwhile), so it leaves on a grant of its own time."""
    served, url = partner
    limiter = RateLimiter("partner", MemoryBackend(), rate="1/0.1 seconds")  # margin: 10 ms
    async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as http:
        for _ in range(2):  # the connection made; a wait maps the limiter's clock
            await http.get(url)
        stall_before_writing.append(SETUP)
        await http.get(url)
        LATE.check(served.arrivals[-1], grant_start(), "the late request's first byte")
    assert len(served.arrivals) == 3  # (the late one on a new connection: the old let go)


@pytest.mark.measured_margin
async def test_aiohttp_asks_again_for_a_permit_later_than_the_margin_once_connected(
    partner: tuple[Partner, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aiohttp middleware takes its permit before the connection is had (a middleware
    sees no connection signals), and checks it again just before the request is written:
    late by more than the fleet's margin covers (a stall, a wait in the pool), it is not
    written, the permit goes back and the request asks again."""
    import aiohttp

    from aiolimit.aiohttp import RateLimitedClientMiddleware

    served, url = partner
    stalls: list[float] = []
    connect = aiohttp.BaseConnector.connect

    async def stalled(self: Any, *args: Any, **kwargs: Any) -> Any:
        connection = await connect(self, *args, **kwargs)
        if stalls:
            await asyncio.sleep(stalls.pop(0))
        return connection

    monkeypatch.setattr(aiohttp.BaseConnector, "connect", stalled)
    limiter = RateLimiter("partner", MemoryBackend(), rate="1/0.1 seconds")  # margin: 10 ms
    middleware = RateLimitedClientMiddleware(limiter)
    async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
        for _ in range(2):  # a wait maps the limiter's clock
            async with session.get(url) as response:
                await response.read()
        stalls.append(SETUP)
        async with session.get(url) as response:
            await response.read()
        LATE.check(served.arrivals[-1], grant_start(), "the late request's first byte")
    assert len(served.arrivals) == 3
