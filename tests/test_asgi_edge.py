"""The HTTP edge as an attacker and a real deployment meet it: forwarding headers a client
wrote, apps behind ``root_path`` and a ``Mount``, HEAD on GET routes, IPv6 peers, the policy
a RateLimit field names, and permits an app computes wrongly.

Through ``httpx.ASGITransport`` under looptime (fake loop time), and through a real uvicorn
where the server's own scope is the point (``--root-path``, an IPv6 peer, a 500's log line).
Only the public API is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import http_sf
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from aiolimit import BackendError, InvalidArgumentError, MemoryBackend, RateLimiter, RedisBackend
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip, client_ip_from
from tools import LocalRedis, free_port

looptime = pytest.mark.looptime


class Endpoint:
    """A Starlette app whose endpoints count the requests that reached them."""

    def __init__(self) -> None:
        self.runs = 0

    async def hello(self, request: Request) -> PlainTextResponse:
        self.runs += 1
        return PlainTextResponse("hello")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/api/items", self.hello), Route("/other", self.hello)])


def asgi_client(app: Any, ip: str = "203.0.113.7") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app, client=(ip, 50000)), base_url="http://test"
    )


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any, host: str = "127.0.0.1", **config: Any) -> AsyncIterator[str]:
    """A real uvicorn on a free loopback port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        # log_config=None: uvicorn's records reach the root logger (and caplog)
        uvicorn.Config(app, host=host, port=port, log_config=None, lifespan="off", **config)
    )
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:  # uvicorn has no event for it
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await serving


def scope_of(peer: str | None, *fields: str, header: bytes = b"forwarded") -> dict[str, Any]:
    headers = [(header, value.encode("latin-1")) for value in fields]
    return {"type": "http", "client": None if peer is None else (peer, 1), "headers": headers}


def limit_field(response: httpx.Response) -> dict[str, Any]:
    """The RateLimit field, parsed as a Structured Field list: {policy: params}."""
    parsed = http_sf.parse(response.headers["ratelimit"].encode(), tltype="list")
    return {name: params for name, params in parsed}


# -- Forwarded quote injection -------------------------------------------------------------------

PROXY = "10.0.0.1"
SEEN_BY_PROXY = "203.0.113.7"
# What a client may put in front of what the trusted proxy appends.
INJECTIONS = [
    'for=198.51.100.42;x="',
    'for="198.51.100.42',
    'for=198.51.100.42;x="a\\"',
    'for=198.51.100.42;x="\\',
    'x="", for=198.51.100.42;y="',
    'for="[2001:db8::bad]:1;x="',
    "for=198.51.100.42;for=198.51.100.43",
    'for="198.51.100.42"x',
    "for==198.51.100.42",
    '"',
    '\\"',
    ";",
    "=",
]


@pytest.mark.parametrize("injected", INJECTIONS)
def test_a_malformed_forwarded_field_never_yields_an_address_the_client_wrote(
    injected: str,
) -> None:
    key = client_ip_from([PROXY], header="Forwarded")
    # the proxy appends its element to the client's field, or adds a field line of its own
    appended = scope_of(PROXY, f"{injected}, for={SEEN_BY_PROXY}")
    own_line = scope_of(PROXY, injected, f"for={SEEN_BY_PROXY}")
    assert key(appended) == SEEN_BY_PROXY
    assert key(own_line) == SEEN_BY_PROXY
    # nothing after the client's text: no trusted proxy vouched for it, the peer is the client
    assert key(scope_of(PROXY, injected)) == PROXY


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40))
def test_whatever_a_client_writes_the_key_is_what_the_trusted_proxy_saw(injected: str) -> None:
    forwarded = client_ip_from([PROXY], header="Forwarded")
    x_forwarded_for = client_ip_from([PROXY])
    assert forwarded(scope_of(PROXY, f"{injected}, for={SEEN_BY_PROXY}")) == SEEN_BY_PROXY
    assert forwarded(scope_of(PROXY, f'{injected}, for="{SEEN_BY_PROXY}:4711"')) == SEEN_BY_PROXY
    quoted_v6 = f'{injected}, for="[2001:db8:1:2::17]:4711";proto=https'
    assert forwarded(scope_of(PROXY, quoted_v6)) == "2001:db8:1::/56"
    xff = scope_of(PROXY, f"{injected}, {SEEN_BY_PROXY}", header=b"x-forwarded-for")
    assert x_forwarded_for(xff) == SEEN_BY_PROXY


def test_a_malformed_element_a_trusted_proxy_wrote_falls_back_to_the_nearest_address() -> None:
    key = client_ip_from([PROXY, "10.0.0.2"], header="Forwarded")
    # the nearest trustworthy address: the last trusted hop read, else the peer
    assert key(scope_of(PROXY, 'for="198.51.100.42')) == PROXY
    assert key(scope_of(PROXY, 'for="198.51.100.42, for=10.0.0.2')) == "10.0.0.2"
    assert key(scope_of(PROXY, "for=198.51.100.42;for=198.51.100.43")) == PROXY
    assert key(scope_of(PROXY, "for=198.51.100.42 198.51.100.43")) == PROXY
    # a quoted value holding a comma is no element to read: the nearest address again
    assert key(scope_of(PROXY, 'for=198.51.100.42;by="a,b"')) == PROXY
    # well-formed: read as before
    assert key(scope_of(PROXY, 'for=192.0.2.9;proto=https;by="_p"')) == "192.0.2.9"
    assert key(scope_of(PROXY, 'FOR="192.0.2.9:80" ; proto=http')) == "192.0.2.9"


@looptime
async def test_injected_forwarded_addresses_through_the_middleware_share_one_budget() -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[Rule("pc", "3/minute", key=client_ip_from([PROXY], header="Forwarded"))],
    )
    async with asgi_client(app, ip=PROXY) as http:
        codes = [
            (
                await http.get(
                    "/other", headers={"Forwarded": f'for=198.51.100.{i};x=", for={SEEN_BY_PROXY}'}
                )
            ).status_code
            for i in range(20)
        ]
    assert codes == [200] * 3 + [429] * 17
    assert endpoint.runs == 3


# -- paths relative to root_path -----------------------------------------------------------------


@looptime
async def test_rules_match_behind_a_starlette_mount() -> None:
    endpoint = Endpoint()
    limited = RateLimitMiddleware(
        endpoint.app(), backend=MemoryBackend(), rules=[Rule("api", "3/minute", paths=["/api/"])]
    )
    outer = Starlette(routes=[Mount("/v1", app=limited)])
    async with asgi_client(outer) as http:
        codes = [(await http.get("/v1/api/items")).status_code for _ in range(5)]
        assert (await http.get("/v1/other")).status_code == 200  # not under /api/
    assert codes == [200, 200, 200, 429, 429]
    assert endpoint.runs == 4


async def test_rules_match_behind_uvicorn_root_path() -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(), backend=MemoryBackend(), rules=[Rule("api", "3/minute", paths=["/api/"])]
    )
    async with (
        uvicorn_serving(app, root_path="/v1") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        # the proxy strips /v1; uvicorn puts it back in path and root_path, as Starlette wants
        codes = [(await http.get("/api/items")).status_code for _ in range(5)]
        assert (await http.get("/other")).status_code == 200  # not under /api/
    assert codes == [200, 200, 200, 429, 429]
    assert endpoint.runs == 4


def test_a_rule_sees_the_path_starlette_routes() -> None:
    def scope(path: str, root_path: str = "") -> dict[str, Any]:
        return {"type": "http", "method": "GET", "path": path, "root_path": root_path}

    api = Rule("api", "1/second", paths=["/api/"])
    assert api.matches(scope("/v1/api/items", "/v1"))
    assert api.matches(scope("/api/items", ""))
    assert not api.matches(scope("/v1/other", "/v1"))
    # the root of a mount is "/" to the rules ("" to Starlette's routes)
    assert Rule("all", "1/second", paths=["/"]).matches(scope("/v1", "/v1"))
    # a path that only starts with the root path's text is not under it: routed whole
    assert not api.matches(scope("/v1api/items", "/v1"))
    assert Rule("odd", "1/second", paths=["/v1api/"]).matches(scope("/v1api/items", "/v1"))
    # a root path the path does not start with: the path is routed whole
    assert api.matches(scope("/api/items", "/v1"))


# -- HEAD on a GET rule --------------------------------------------------------------------------


@looptime
async def test_a_get_rule_covers_head() -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[Rule("reads", "5/minute", methods=["GET"])],
    )
    async with asgi_client(app) as http:
        heads = [(await http.head("/other")).status_code for _ in range(10)]
        assert (await http.get("/other")).status_code == 429  # one budget for GET and HEAD
        assert (await http.post("/other")).status_code == 405  # POST is not the rule's
    assert heads == [200] * 5 + [429] * 5
    assert endpoint.runs == 5
    assert Rule("r", "1/second", methods=["get"]).methods == frozenset({"GET", "HEAD"})
    assert Rule("w", "1/second", methods=["POST"]).methods == frozenset({"POST"})


async def test_a_real_deployment_root_path_mount_head_and_a_hostile_forwarded_header() -> None:
    """uvicorn --root-path /v1 behind a proxy at 127.0.0.1 that appends to Forwarded; the
    middleware inside a Mount; a client that sends HEAD with an injected quote."""
    endpoint = Endpoint()
    limited = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[
            Rule(
                "reads",
                "3/minute",
                paths=["/api/"],
                methods=["GET"],
                key=client_ip_from(["127.0.0.1"], header="Forwarded"),
            )
        ],
    )
    app = Starlette(routes=[Mount("/shop", app=limited)])
    async with (
        uvicorn_serving(app, root_path="/v1") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        codes = [
            (
                await http.head(
                    "/shop/api/items",
                    headers={"Forwarded": f'for=198.51.100.{i};x=", for="[2001:db8:0:7::{i}]"'},
                )
            ).status_code
            for i in range(1, 7)
        ]
    assert codes == [200, 200, 200, 429, 429, 429]
    assert endpoint.runs == 3


# -- IPv6 and the spellings of one address -------------------------------------------------------


def test_every_spelling_of_an_address_is_one_key() -> None:
    key_of = [client_ip, client_ip_from([PROXY]), client_ip_from([PROXY], header="Forwarded")]
    for key in key_of:
        assert key(scope_of("2001:DB8::1")) == key(scope_of("2001:db8:0:0::1"))
        assert key(scope_of("::ffff:203.0.113.7")) == "203.0.113.7"
        assert key(scope_of("::FFFF:cb00:7107")) == "203.0.113.7"
        assert key(scope_of("203.0.113.7")) == "203.0.113.7"
    xff = client_ip_from([PROXY])
    assert xff(scope_of(PROXY, "::ffff:203.0.113.7", header=b"x-forwarded-for")) == "203.0.113.7"
    assert xff(scope_of(PROXY, " 2001:DB8::1 ", header=b"x-forwarded-for")) == "2001:db8::/56"
    forwarded = client_ip_from([PROXY], header="Forwarded")
    assert forwarded(scope_of(PROXY, 'for="[::ffff:203.0.113.7]:80"')) == "203.0.113.7"
    # a trusted proxy reached over a v4-mapped socket is still trusted
    assert xff(scope_of("::ffff:10.0.0.1", "192.0.2.9", header=b"x-forwarded-for")) == "192.0.2.9"
    # and proxies listed as v4-mapped networks are the IPv4 ones
    mapped = client_ip_from(["::ffff:10.0.0.0/104"])
    assert mapped(scope_of("10.9.9.9", "192.0.2.9", header=b"x-forwarded-for")) == "192.0.2.9"


def test_ipv6_clients_are_grouped_by_a_56_prefix_by_default_and_it_is_configurable() -> None:
    assert client_ip(scope_of("2001:db8:0:1::1")) == "2001:db8::/56"
    assert client_ip(scope_of("2001:db8:0:ff:ffff::2")) == "2001:db8::/56"
    assert client_ip(scope_of("2001:db8:0:100::1")) == "2001:db8:0:100::/56"
    assert client_ip(scope_of("fe80::1%eth0")) == "fe80::/56"
    by_64 = client_ip_from([], ipv6_prefix=64)
    assert by_64(scope_of("2001:db8:0:1::1")) == by_64(scope_of("2001:db8:0:1:ffff::9"))
    assert by_64(scope_of("2001:db8:0:1::1")) == "2001:db8:0:1::/64"
    assert by_64(scope_of("2001:db8:0:2::1")) != by_64(scope_of("2001:db8:0:1::1"))
    each = client_ip_from([], ipv6_prefix=128)
    assert each(scope_of("2001:DB8::1")) == "2001:db8::1"
    behind = client_ip_from([PROXY], header="Forwarded", ipv6_prefix=48)
    assert behind(scope_of(PROXY, 'for="[2001:db8:aa:bb::1]"')) == "2001:db8:aa::/48"
    # IPv4 is not grouped; what is no address is kept as it is
    assert by_64(scope_of("203.0.113.7")) == "203.0.113.7"
    assert client_ip(scope_of("testclient")) == "testclient"
    assert client_ip(scope_of(None)) == "unknown"
    for bad in (0, 129, -1, 56.0, "56", True, None):
        with pytest.raises(InvalidArgumentError, match="ipv6_prefix"):
            client_ip_from([], ipv6_prefix=bad)  # type: ignore[arg-type]


@looptime
async def test_one_ipv6_network_gets_one_budget_through_the_middleware() -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(), backend=MemoryBackend(), rules=[Rule("pc", "3/minute", key=client_ip)]
    )
    codes = []
    for i in range(10):  # ten addresses of one /64, spelt every way
        async with asgi_client(app, ip=f"2001:DB8:0:1::{i:x}") as http:
            codes.append((await http.get("/other")).status_code)
    async with asgi_client(app, ip="2001:db8:0:100::1") as http:  # another /56
        codes.append((await http.get("/other")).status_code)
    assert codes == [200] * 3 + [429] * 7 + [200]


async def test_an_ipv6_peer_through_uvicorn_counts_in_its_network() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(
        Endpoint().app(), backend=backend, rules=[Rule("pc", "3/minute", key=client_ip)]
    )
    async with uvicorn_serving(app, host="::1") as url, httpx.AsyncClient(base_url=url) as http:
        codes = [(await http.get("/other")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert await RateLimiter("pc", backend.with_client("::/56")).available_permits() == 0


# -- the field names the policy that binds -------------------------------------------------------


@looptime
async def test_the_ratelimit_field_names_the_policy_that_binds_with_its_own_reset() -> None:
    app = RateLimitMiddleware(
        Endpoint().app(), backend=MemoryBackend(), rules=[Rule("burst", "5/second; 8/minute")]
    )
    async with asgi_client(app) as http:
        second = [await http.get("/other") for _ in range(6)]
        assert limit_field(second[4]) == {"burst-1s": {"r": 0, "t": 1}}
        assert limit_field(second[5]) == {"burst-1s": {"r": 0, "t": 1}}
        assert second[5].status_code == 429
        await asyncio.sleep(1.5)
        minute = [await http.get("/other") for _ in range(4)]
    assert [a.status_code for a in minute] == [200, 200, 200, 429]
    # the minute is spent: its policy binds, and frees a permit 60 s after the first grant
    assert limit_field(minute[2]) == {"burst-60s": {"r": 0, "t": 59}}
    assert limit_field(minute[3]) == {"burst-60s": {"r": 0, "t": 59}}
    assert minute[3].headers["retry-after"] == "59"


@looptime
@pytest.mark.parametrize("algorithm", ["SLIDING_WINDOW", "TOKEN_BUCKET", "FIXED_WINDOW"])
async def test_a_grant_that_leaves_permits_names_the_policy_with_the_fewest_left(
    algorithm: str,
) -> None:
    app = RateLimitMiddleware(
        Endpoint().app(),
        backend=MemoryBackend(),
        rules=[Rule("burst", "5/second; 8/minute", algorithm=algorithm)],
    )
    async with asgi_client(app) as http:
        await asyncio.sleep(0.1)  # inside a fixed window's second
        first = [limit_field(await http.get("/other")) for _ in range(4)]
        await asyncio.sleep(1.3)  # the second allows 5 again, the minute 4 at most
        then = limit_field(await http.get("/other"))
    assert first == [{"burst-1s": {"r": r, "t": 1}} for r in (4, 3, 2, 1)]
    # 4 left under the second, 3 under the minute: the minute binds, with its own window
    assert then == {"burst-60s": {"r": 3, "t": 60}}


@looptime
async def test_a_spent_minute_about_to_free_a_permit_still_names_the_minute() -> None:
    app = RateLimitMiddleware(
        Endpoint().app(), backend=MemoryBackend(), rules=[Rule("burst", "5/second; 6/minute")]
    )
    async with asgi_client(app) as http:
        for _ in range(3):
            await http.get("/other")
        await asyncio.sleep(59.5)  # the first 3 leave the minute in 0.5 s
        answers = [await http.get("/other") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    # 2 left under the second, none under the minute: the minute binds, though its wait
    # (0.5 s) would fit the second's window
    assert limit_field(answers[2]) == {"burst-60s": {"r": 0, "t": 1}}
    assert limit_field(answers[3]) == {"burst-60s": {"r": 0, "t": 1}}


@pytest.mark.slow
async def test_a_grant_that_leaves_permits_names_the_binding_policy_on_redis(
    redis_server: LocalRedis,
) -> None:
    redis = Redis.from_url(redis_server.url)
    await redis.flushall()
    app = RateLimitMiddleware(
        Endpoint().app(),
        backend=RedisBackend(redis),
        rules=[Rule("burst", "5/second; 8/minute", key=client_ip)],
    )
    try:
        async with asgi_client(app) as http:
            first = [await http.get("/other") for _ in range(4)]
            await asyncio.sleep(1.1)
            then = [await http.get("/other") for _ in range(3)]
    finally:
        await redis.aclose()
    assert limit_field(first[3]) == {"burst-1s": {"r": 1, "t": 1}}
    # 4, 3, 2 left under the second; 3, 2, 1 under the minute
    assert [limit_field(answer) for answer in then] == [
        {"burst-60s": {"r": r, "t": 60}} for r in (3, 2, 1)
    ]


@looptime
async def test_the_legacy_fields_follow_the_policy_that_binds() -> None:
    app = RateLimitMiddleware(
        Endpoint().app(),
        backend=MemoryBackend(),
        rules=[Rule("burst", "5/second; 8/minute")],
        legacy_headers=True,
    )
    async with asgi_client(app) as http:
        for _ in range(5):
            await http.get("/other")
        await asyncio.sleep(1.5)
        answers = [await http.get("/other") for _ in range(4)]
    assert answers[3].status_code == 429
    assert answers[3].headers["x-ratelimit-limit"] == "8"


@pytest.mark.slow
async def test_the_binding_policy_of_a_per_client_rule_on_redis(redis_server: LocalRedis) -> None:
    redis = Redis.from_url(redis_server.url)
    await redis.flushall()
    app = RateLimitMiddleware(
        Endpoint().app(),
        backend=RedisBackend(redis),
        rules=[Rule("burst", "5/second; 8/minute", key=client_ip)],
    )
    try:
        async with asgi_client(app) as http:
            first = [await http.get("/other") for _ in range(5)]
            assert limit_field(first[4]) == {"burst-1s": {"r": 0, "t": 1}}
            await asyncio.sleep(1.1)
            then = [await http.get("/other") for _ in range(4)]
    finally:
        await redis.aclose()
    assert [a.status_code for a in then] == [200, 200, 200, 429]
    for answer in then[2:]:
        [(name, params)] = limit_field(answer).items()
        assert name == "burst-60s" and params["r"] == 0 and 57 <= params["t"] <= 59


class NoWaitTime(MemoryBackend):
    """A store whose wait reads fail (grants work)."""

    async def wait_time(self, name: str, permits: int) -> int:
        raise BackendError("wait_time failed")


@looptime
async def test_a_failed_read_of_the_binding_policy_still_serves_the_request() -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(), backend=NoWaitTime(), rules=[Rule("burst", "2/second; 3/minute")]
    )
    async with asgi_client(app) as http:
        answers = [await http.get("/other") for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert limit_field(answers[1]) == {"burst-1s": {"r": 0, "t": 1}}  # the first policy
    assert endpoint.runs == 2


# -- callable permits the app got wrong ----------------------------------------------------------


@pytest.mark.parametrize(("cost", "says"), [(-1, "-1"), (4, "exceeds the rate")])
@looptime
async def test_a_cost_callable_out_of_range_is_an_error_of_the_app_never_a_429(
    cost: int, says: str
) -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[Rule("upload", "3/second", permits=lambda scope: cost)],
    )
    async with asgi_client(app) as http:
        with pytest.raises(InvalidArgumentError) as raised:
            await http.get("/other")
    message = str(raised.value)
    assert "'upload'" in message and "permits" in message and says in message
    assert endpoint.runs == 0


@looptime
async def test_a_key_function_that_raises_is_a_500_logged_once_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken_key(scope: Any) -> str:
        raise KeyError("tenant")

    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[Rule("per-tenant", "3/second", key=broken_key)],
    )
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="aiolimit"):
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers = [await http.get("/other") for _ in range(2)]
    assert [a.status_code for a in answers] == [500, 500]
    assert endpoint.runs == 0
    ours = [r for r in caplog.records if r.name == "aiolimit"]
    assert len(ours) == 2  # one per request
    for record in ours:
        assert "'per-tenant'" in record.getMessage() and "key" in record.getMessage()
        assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)


async def test_a_cost_callable_out_of_range_through_uvicorn_is_a_500_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = Endpoint()
    app = RateLimitMiddleware(
        endpoint.app(),
        backend=MemoryBackend(),
        rules=[Rule("upload", "3/second", permits=lambda scope: 99)],
    )
    with caplog.at_level(logging.ERROR):
        async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
            answers = [await http.get("/other") for _ in range(3)]
    assert [a.status_code for a in answers] == [500, 500, 500]
    assert all("retry-after" not in a.headers for a in answers)
    assert endpoint.runs == 0
    logged = "\n".join(
        f"{r.getMessage()} {r.exc_info[1] if r.exc_info else ''}" for r in caplog.records
    )
    assert "rule 'upload'" in logged and "99" in logged


@looptime
async def test_an_app_that_raises_after_the_check_has_spent_its_permits() -> None:
    async def failing(request: Request) -> PlainTextResponse:
        raise RuntimeError("the app failed")

    backend = MemoryBackend()
    app = RateLimitMiddleware(
        Starlette(routes=[Route("/", failing)]),
        backend=backend,
        rules=[Rule("spent", "3/second")],
    )
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        assert (await http.get("/")).status_code == 500
    assert await RateLimiter("spent", backend).available_permits() == 2
