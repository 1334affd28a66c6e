"""The ASGI middleware and the FastAPI dependency: statuses, header fields, hand-backs, waits,
store failures, websockets and lifespan.

Most tests run on the memory backend under looptime (fake loop time: waits take no real
time); the ones marked ``redis`` run on a real redis-server, and one on uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import http_sf
import httpx
import pytest
from conformance import cancelled, until, writes_paused
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from aiolimit import (
    InvalidArgumentError,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.asgi import (
    RateLimitMiddleware,
    Rule,
    client_ip,
    client_ip_from,
)
from aiolimit.fastapi import RateLimit
from tools import LocalRedis, free_port

looptime = pytest.mark.looptime


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


async def own_fields(request: Request) -> PlainTextResponse:
    # An app that writes header fields of the same names: the response carries ours, once.
    return PlainTextResponse(
        "mine", headers={"RateLimit": '"app";r=99;t=1', "RateLimit-Policy": '"app";q=99;w=1'}
    )


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("welcome")
    await websocket.close()


def starlette_app(lifespan: Any = None) -> Starlette:
    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/api/items", hello, methods=["GET", "POST"]),
            Route("/other", hello),
            Route("/own-fields", own_fields),
            WebSocketRoute("/ws", echo),
        ],
    )


def starlette_test_client(app: Any) -> Any:
    """Starlette's TestClient (it warns that a later Starlette will want httpx2)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    return TestClient(app)


def client(app: Any, ip: str = "203.0.113.7") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app, client=(ip, 50000)), base_url="http://test"
    )


def fields(response: httpx.Response) -> dict[str, Any]:
    """The RateLimit fields, parsed as Structured Field lists: {policy: params}."""
    assert len(response.headers.get_list("ratelimit-policy")) == 1
    assert len(response.headers.get_list("ratelimit")) == 1
    policy = http_sf.parse(response.headers["ratelimit-policy"].encode(), tltype="list")
    limit = http_sf.parse(response.headers["ratelimit"].encode(), tltype="list")
    return {
        "policy": {name: params for name, params in policy},
        "limit": {name: params for name, params in limit},
    }


# -- status codes and fields ----------------------------------------------------------------------


@looptime
async def test_200_then_429_at_the_rate_with_exact_fields() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("api", "3/second")]
    )
    async with client(app) as http:
        answers = [await http.get("/api/items") for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    for left, answer in zip([2, 1, 0], answers, strict=False):
        assert answer.text == "hello"
        assert fields(answer) == {
            "policy": {"api": {"q": 3, "w": 1}},
            "limit": {"api": {"r": left, "t": 1}},
        }
    refused = answers[3]
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["content-type"] == "application/json"
    assert refused.json() == {
        "detail": "Too Many Requests: rate limit 'api' exceeded; retry after 1 s"
    }
    assert fields(refused)["limit"] == {"api": {"r": 0, "t": 1}}
    assert app.stats.allowed == 3
    assert app.stats.refused == 1


@looptime
async def test_retry_after_is_the_wait_in_whole_seconds_rounded_up() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("slow", "2/10 seconds")]
    )
    async with client(app) as http:
        assert (await http.get("/other")).status_code == 200
        await asyncio.sleep(3.5)
        assert (await http.get("/other")).status_code == 200
        await asyncio.sleep(0.2)
        refused = await http.get("/other")
        # the first permit is free again 10 s after the first grant: 6.3 s from now
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "7"
        assert fields(refused)["limit"]["slow"] == {"r": 0, "t": 7}
        await asyncio.sleep(6.3)
        assert (await http.get("/other")).status_code == 200


@looptime
async def test_a_refused_request_consumes_nothing_in_the_other_rules() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(
        starlette_app(),
        backend=backend,
        rules=[
            Rule("global", "100/second"),
            Rule("per-client", "2/second", key=client_ip),
        ],
    )
    glob = RateLimiter("global", backend)
    async with client(app, "198.51.100.1") as alice, client(app, "198.51.100.2") as bob:
        assert [(await alice.get("/other")).status_code for _ in range(2)] == [200, 200]
        assert await glob.available_permits() == 98
        refused = [await alice.get("/other") for _ in range(5)]
        assert {r.status_code for r in refused} == {429}
        assert await glob.available_permits() == 98  # the refusals took nothing globally
        # the refused response says what the global rule has left, grant handed back
        assert fields(refused[-1])["limit"] == {
            "global": {"r": 98, "t": 1},
            "per-client": {"r": 0, "t": 1},
        }
        # and bob has his own per-client budget
        assert [(await bob.get("/other")).status_code for _ in range(2)] == [200, 200]
    assert await glob.available_permits() == 96


@looptime
async def test_the_global_refusal_hands_back_the_per_client_grant() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(
        starlette_app(),
        backend=backend,
        rules=[Rule("global", "2/second"), Rule("per-client", "5/second", key=client_ip)],
    )
    async with client(app, "198.51.100.1") as alice, client(app, "198.51.100.2") as bob:
        assert (await alice.get("/other")).status_code == 200
        assert (await bob.get("/other")).status_code == 200
        assert [(await alice.get("/other")).status_code for _ in range(3)] == [429] * 3
    alices = RateLimiter("per-client", backend.with_client("198.51.100.1"))
    assert await alices.available_permits() == 4


@looptime
async def test_paths_methods_and_cost_choose_what_a_rule_counts() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(
        starlette_app(),
        backend=backend,
        rules=[
            Rule("api-posts", "10/second", paths=["/api/"], methods=["post"], permits=4),
            Rule(
                "heavy", "10/second", permits=lambda scope: 10 if scope["path"] == "/other" else 0
            ),
        ],
    )
    async with client(app) as http:
        assert "ratelimit" not in (await http.get("/api/items")).headers  # no rule matched
        assert fields(await http.post("/api/items"))["limit"] == {"api-posts": {"r": 6, "t": 1}}
        assert (await http.post("/api/items")).status_code == 200
        assert (await http.post("/api/items")).status_code == 429  # 4 more than the 2 left
        assert (await http.get("/other")).status_code == 200
        assert (await http.get("/other")).status_code == 429
    assert await RateLimiter("api-posts", backend).available_permits() == 2


@looptime
async def test_a_key_that_is_no_client_id_never_makes_a_500() -> None:
    # (a callable cost over the rate is the app's error: tests/test_asgi_edge.py)
    app = RateLimitMiddleware(
        starlette_app(),
        backend=MemoryBackend(),
        rules=[
            Rule("odd", "2/minute", key=lambda scope: "\udc80" if scope["path"] == "/ws" else None),
        ],
    )
    async with client(app) as http:
        # an id that cannot be a client id counts in the shared "unknown" budget
        assert [(await http.get("/ws")).status_code for _ in range(3)] == [404, 404, 429]


@looptime
async def test_wait_serves_a_burst_in_reserved_slots_without_a_429() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("smooth", "2/second")], wait=2
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    served: list[float] = []

    async def get(http: httpx.AsyncClient) -> int:
        answer = await http.get("/other")
        served.append(round(loop.time() - start, 3))
        return answer.status_code

    async with client(app) as http:
        codes = await asyncio.gather(*(get(http) for _ in range(7)))
    assert sorted(codes) == [200] * 6 + [429]  # the seventh's slot would be 3 s away
    assert sorted(served) == [0, 0, 0, 1, 1, 2, 2]  # the 429 is answered at once
    assert app.stats.waited == 4


@looptime
async def test_a_reserved_request_whose_client_leaves_hands_its_slot_back() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(
        starlette_app(), backend=backend, rules=[Rule("smooth", "1/second")], wait=5
    )
    async with client(app) as http:
        assert (await http.get("/other")).status_code == 200
        waiting = asyncio.ensure_future(http.get("/other"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)  # the hand-back runs in the background
        await backend.aclose()
        await asyncio.sleep(0.95)
        assert (await http.get("/other")).status_code == 200  # at 1.05 s: the slot was free


@looptime
async def test_the_fields_are_written_once_whatever_the_app_sets() -> None:
    app = RateLimitMiddleware(
        starlette_app(),
        backend=MemoryBackend(),
        rules=[Rule("api", "5/minute")],
        legacy_headers=True,
    )
    async with client(app) as http:
        answer = await http.get("/own-fields")
    assert fields(answer) == {
        "policy": {"api": {"q": 5, "w": 60}},
        "limit": {"api": {"r": 4, "t": 60}},
    }
    assert answer.headers["x-ratelimit-limit"] == "5"
    assert answer.headers["x-ratelimit-remaining"] == "4"
    assert abs(int(answer.headers["x-ratelimit-reset"]) - (time.time() + 60)) <= 2


@looptime
async def test_many_rules_report_only_the_eight_tightest_in_the_fields() -> None:
    rules = [Rule(f"rule-{i:03}", "1000/second") for i in range(120)]
    rules[70] = Rule("tightest", "3/second")
    rules[90] = Rule("tighter", "50/second")
    app = RateLimitMiddleware(starlette_app(), backend=MemoryBackend(), rules=rules)
    async with client(app) as http:
        response = await http.get("/api/items")
    assert response.status_code == 200
    seen = fields(response)
    limit = list(seen["limit"])
    assert len(limit) == 8 == len(seen["policy"])
    assert limit[:2] == ["tightest", "tighter"]  # the tightest first
    assert seen["limit"]["tightest"]["r"] == 2
    size = sum(len(k) + len(v) for k, v in response.headers.items() if "ratelimit" in k)
    assert size < 800, size


@looptime
async def test_eight_rules_or_fewer_are_all_reported_in_their_order() -> None:
    rules = [Rule(f"rule-{i}", f"{10 - i}/second") for i in range(8)]
    app = RateLimitMiddleware(starlette_app(), backend=MemoryBackend(), rules=rules)
    async with client(app) as http:
        response = await http.get("/api/items")
    assert list(fields(response)["limit"]) == [f"rule-{i}" for i in range(8)]


@looptime
async def test_headers_false_leaves_allowed_responses_alone_but_not_429s() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("api", "1/minute")], headers=False
    )
    async with client(app) as http:
        allowed = await http.get("/other")
        refused = await http.get("/other")
    assert "ratelimit" not in allowed.headers
    assert "x-ratelimit-limit" not in allowed.headers
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "60"
    assert fields(refused)["limit"] == {"api": {"r": 0, "t": 60}}


@looptime
async def test_the_stored_config_is_rewritten_when_the_code_says_other_rates() -> None:
    backend = MemoryBackend()
    old = RateLimiter("api", backend)
    await old.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    assert await old.try_acquire(2)
    app = RateLimitMiddleware(starlette_app(), backend=backend, rules=[Rule("api", "3/minute")])
    async with client(app) as http:
        answers = [await http.get("/other") for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429]  # the 2 earlier grants still count
    config = await old.get_config()
    assert config is not None
    assert (config.rate, config.interval.total_seconds()) == (3, 60)


@looptime
async def test_a_deleted_config_is_written_again() -> None:
    backend = MemoryBackend()
    app = RateLimitMiddleware(starlette_app(), backend=backend, rules=[Rule("api", "2/minute")])
    async with client(app) as http:
        assert (await http.get("/other")).status_code == 200
        await RateLimiter("api", backend).delete()
        assert [(await http.get("/other")).status_code for _ in range(3)] == [200, 200, 429]


# -- client addresses ---------------------------------------------------------------------------


def scope_from(peer: str | None, forwarded: list[str] | None = None) -> dict[str, Any]:
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded or []]
    return {"type": "http", "client": None if peer is None else (peer, 1), "headers": headers}


def test_client_ip_is_the_peer_and_never_the_forwarded_header() -> None:
    assert client_ip(scope_from("192.0.2.1", ["10.9.9.9"])) == "192.0.2.1"
    assert client_ip(scope_from(None)) == "unknown"


def test_client_ip_from_reads_forwarded_for_only_as_far_as_trusted_proxies_wrote_it() -> None:
    key = client_ip_from(["10.0.0.0/8", "2001:db8::1"])
    # from an untrusted peer the header is ignored
    assert key(scope_from("192.0.2.1", ["10.9.9.9"])) == "192.0.2.1"
    # a trusted proxy saw 198.51.100.4; what that client put in front of it is not read
    assert key(scope_from("10.0.0.2", ["6.6.6.6, 198.51.100.4"])) == "198.51.100.4"
    # two trusted hops, header split over two fields
    assert key(scope_from("10.0.0.2", ["6.6.6.6, 198.51.100.4", "10.1.1.1"])) == "198.51.100.4"
    assert key(scope_from("2001:db8::1", ["2001:db8::42"])) == "2001:db8::/56"  # its /56
    # garbage where a trusted proxy writes: the proxy is the client, not the garbage
    assert key(scope_from("10.0.0.2", ["not-an-ip"])) == "10.0.0.2"
    assert key(scope_from("10.0.0.2", [])) == "10.0.0.2"
    with pytest.raises(InvalidArgumentError, match="not an IP"):
        client_ip_from(["proxy.example"])
    with pytest.raises(InvalidArgumentError, match="list"):
        client_ip_from("10.0.0.1")


def test_client_ip_from_reads_the_rfc_7239_forwarded_header_when_named() -> None:
    key = client_ip_from(["10.0.0.0/8", "2001:db8::1"], header="Forwarded")

    def scope(peer: str, *fields: str, name: bytes = b"forwarded") -> dict[str, Any]:
        headers = [(name, value.encode()) for value in fields]
        return {"type": "http", "client": (peer, 1), "headers": headers}

    # from an untrusted peer the header is ignored
    assert key(scope("192.0.2.1", "for=10.9.9.9")) == "192.0.2.1"
    # for= among other parameters, quoted with a port, and IPv6 in brackets
    assert key(scope("10.0.0.2", "for=6.6.6.6, for=198.51.100.4;proto=https")) == "198.51.100.4"
    assert key(scope("10.0.0.2", 'for=6.6.6.6, for="198.51.100.4:4711"')) == "198.51.100.4"
    assert key(scope("10.0.0.2", 'for="[2001:db8:cafe::17]:4711"')) == "2001:db8:cafe::/56"
    assert key(scope("2001:db8::1", 'For="[2001:db8::42]"')) == "2001:db8::/56"
    # two trusted hops, over two fields; a quoted comma left of them changes nothing
    fields = ('for=6.6.6.6;by="a,b", for=198.51.100.4', "for=10.1.1.1;proto=http")
    assert key(scope("10.0.0.2", *fields)) == "198.51.100.4"
    # what a trusted proxy wrote that is no address: the nearest address read is the client
    assert key(scope("10.0.0.2", "for=unknown")) == "10.0.0.2"
    assert key(scope("10.0.0.2", "for=198.51.100.4, for=_hidden")) == "10.0.0.2"
    assert key(scope("10.0.0.2", "for=198.51.100.4, proto=https")) == "10.0.0.2"
    # only the header named is read
    assert key(scope("10.0.0.2", "198.51.100.4", name=b"x-forwarded-for")) == "10.0.0.2"
    assert client_ip_from(["10.0.0.0/8"])(scope("10.0.0.2", "for=198.51.100.4")) == "10.0.0.2"
    with pytest.raises(InvalidArgumentError, match="header must be"):
        client_ip_from(["10.0.0.0/8"], header="X-Real-IP")


@looptime
async def test_a_spoofed_forwarded_for_does_not_buy_a_new_budget() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("pc", "2/minute", key=client_ip)]
    )
    async with client(app) as http:
        codes = [
            (await http.get("/other", headers={"X-Forwarded-For": f"10.0.0.{i}"})).status_code
            for i in range(4)
        ]
    assert codes == [200, 200, 429, 429]


# -- websockets and lifespan --------------------------------------------------------------------


@looptime
async def test_a_refused_websocket_is_closed_with_1008_an_allowed_one_reaches_the_app() -> None:
    app = RateLimitMiddleware(
        starlette_app(), backend=MemoryBackend(), rules=[Rule("ws", "1/minute", key=client_ip)]
    )

    async def connect() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        inbox = [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}]

        async def receive() -> dict[str, Any]:
            return inbox.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {
            "type": "websocket",
            "path": "/ws",
            "raw_path": b"/ws",
            "query_string": b"",
            "headers": [],
            "client": ("192.0.2.9", 1),
            "server": ("test", 80),
            "scheme": "ws",
            "subprotocols": [],
            "asgi": {"version": "3.0"},
        }
        await app(scope, receive, send)
        return sent

    first = await connect()
    assert [m["type"] for m in first] == ["websocket.accept", "websocket.send", "websocket.close"]
    assert first[1]["text"] == "welcome"
    second = await connect()
    assert [m["type"] for m in second] == ["websocket.accept", "websocket.close"]
    assert second[1]["code"] == 1008
    assert "retry after 60 s" in second[1]["reason"]


def test_a_refused_websocket_through_starlette_test_client() -> None:
    now = [1000.0]
    app = RateLimitMiddleware(
        starlette_app(),
        backend=MemoryBackend(clock=lambda: now[0]),
        rules=[Rule("ws", "1/minute")],
    )
    with starlette_test_client(app) as http:
        with http.websocket_connect("/ws") as ws:
            assert ws.receive_text() == "welcome"
        with http.websocket_connect("/ws") as ws, pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1008
        now[0] += 60
        with http.websocket_connect("/ws") as ws:
            assert ws.receive_text() == "welcome"


def test_lifespan_passes_through_and_startup_writes_the_configs() -> None:
    now = [1000.0]
    backend = MemoryBackend(clock=lambda: now[0])
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    app = RateLimitMiddleware(
        starlette_app(lifespan),
        backend=backend,
        rules=[Rule("a", "5/second"), Rule("b", "7/minute", key=client_ip)],
    )

    async def configs() -> list[Any]:
        return [await RateLimiter(n, backend).get_config() for n in ("a", "b")]

    with starlette_test_client(app) as http:
        assert events == ["startup"]
        written = http.portal.call(configs)  # type: ignore[union-attr]
        assert [(c.rate, c.rate_type) for c in written] == [
            (5, RateType.OVERALL),
            (7, RateType.PER_CLIENT),
        ]
    assert events == ["startup", "shutdown"]


# -- arguments ----------------------------------------------------------------------------------


def test_bad_arguments_raise_invalid_argument_error() -> None:
    backend = MemoryBackend()
    bad_rules: list[Any] = [
        lambda: Rule("r", "10 per fortnight"),
        lambda: Rule("r", "2/second", permits=3),
        lambda: Rule("r", "2/second", permits=-1),
        lambda: Rule("r", "2/second", paths="/api/"),
        lambda: Rule("r", "2/second", paths=["api/"]),
        lambda: Rule("r", "2/second", algorithm="LEAKY"),
        lambda: Rule("r\N{SNOWMAN}", "2/second"),
        lambda: Rule("r", "2/second", key="ip"),
    ]
    for make in bad_rules:
        with pytest.raises(InvalidArgumentError):
            make()
    rule = Rule("r", "2/second")
    bad_middleware: list[dict[str, Any]] = [
        {"on_backend_error": "ignore"},
        {"wait": -1},
        {"wait": math.nan},
        {"rules": [rule, Rule("r", "3/second")]},
        {"rules": rule},
        {"backend": object()},
        {"error_retry_after": 0},
    ]
    for options in bad_middleware:
        with pytest.raises(InvalidArgumentError):
            RateLimitMiddleware(hello, **{"backend": backend, "rules": [rule], **options})  # type: ignore[arg-type]


# -- FastAPI ------------------------------------------------------------------------------------


def fastapi_app(backend: Any, *, middleware: bool, on_backend_error: str = "deny") -> Any:
    from fastapi import Depends, FastAPI
    from fastapi.responses import PlainTextResponse as FastText

    login_limit = RateLimit(
        "login", "2/minute", backend=backend, key=client_ip, on_backend_error=on_backend_error
    )
    app = FastAPI()

    @app.post("/login", dependencies=[Depends(login_limit)])
    async def login() -> dict[str, str]:
        return {"token": "t"}

    @app.get("/raw", dependencies=[Depends(login_limit)])
    async def raw() -> FastText:
        return FastText("raw")

    if middleware:
        return RateLimitMiddleware(app, backend=backend, rules=[Rule("site", "100/minute")])
    return app


@pytest.mark.slow
@looptime
async def test_the_fastapi_dependency_answers_like_the_middleware() -> None:
    app = fastapi_app(MemoryBackend(), middleware=False)
    async with client(app) as http:
        answers = [await http.post("/login") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].json() == {"token": "t"}
    assert fields(answers[1]) == {
        "policy": {"login": {"q": 2, "w": 60}},
        "limit": {"login": {"r": 0, "t": 60}},
    }
    refused = answers[2]
    assert refused.headers["retry-after"] == "60"
    assert refused.json() == {
        "detail": "Too Many Requests: rate limit 'login' exceeded; retry after 60 s"
    }
    assert fields(refused)["limit"] == {"login": {"r": 0, "t": 60}}


@looptime
async def test_the_dependency_inside_the_middleware_merges_fields_and_hands_back() -> None:
    backend = MemoryBackend()
    app = fastapi_app(backend, middleware=True)
    async with client(app) as http:
        allowed = await http.get("/raw")  # returns a Response itself: the middleware writes
        assert allowed.text == "raw"
        assert fields(allowed) == {
            "policy": {"site": {"q": 100, "w": 60}, "login": {"q": 2, "w": 60}},
            "limit": {"site": {"r": 99, "t": 60}, "login": {"r": 1, "t": 60}},
        }
        assert (await http.post("/login")).status_code == 200
        refused = await http.post("/login")
    assert refused.status_code == 429
    assert refused.headers.get_list("retry-after") == ["60"]
    # the refusal in the route handed back the permit the middleware's rule gave it
    assert fields(refused)["limit"] == {"site": {"r": 98, "t": 60}, "login": {"r": 0, "t": 60}}
    assert await RateLimiter("site", backend).available_permits() == 98


# -- a real redis-server ------------------------------------------------------------------------


@pytest.fixture
async def redis_backend(redis_server: LocalRedis) -> AsyncIterator[RedisBackend]:
    redis = Redis.from_url(redis_server.url)
    await redis.flushall()
    yield RedisBackend(redis)
    await redis.aclose()


def global_and_per_client(backend: RedisBackend) -> RateLimitMiddleware:
    rules = [Rule("global", "50/minute"), Rule("per-client", "2/minute", key=client_ip)]
    return RateLimitMiddleware(starlette_app(), backend=backend, rules=rules)


async def test_on_redis_a_refusal_hands_back_the_other_rules_grants(
    redis_backend: RedisBackend,
) -> None:
    app = global_and_per_client(redis_backend)
    async with client(app, "198.51.100.1") as alice, client(app, "198.51.100.2") as bob:
        codes = [(await alice.get("/other")).status_code for _ in range(4)]
        assert codes == [200, 200, 429, 429]
        refused = await alice.get("/other")
        assert refused.headers["retry-after"] == "60"
        assert fields(refused)["limit"] == {
            "global": {"r": 48, "t": 60},
            "per-client": {"r": 0, "t": 60},
        }
        assert (await bob.get("/other")).status_code == 200
    assert await RateLimiter("global", redis_backend).available_permits() == 47


async def test_a_request_cancelled_while_its_rules_are_checked_hands_every_grant_back(
    redis_backend: RedisBackend,
) -> None:
    app = global_and_per_client(redis_backend)
    async with client(app, "198.51.100.1") as alice:
        assert (await alice.get("/other")).status_code == 200  # the configs are written

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/other",
        "headers": [],
        "client": ("198.51.100.1", 4000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    admin = redis_backend.redis.client()  # its own connection from the same pool settings
    async with writes_paused(admin):  # the scripts wait
        checked = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.sleep(0.2)
        await cancelled(checked)
    await admin.aclose()
    assert sent == []  # nothing was answered

    global_limiter = RateLimiter("global", redis_backend)
    alice_limiter = RateLimiter("per-client", redis_backend.with_client("198.51.100.1"))
    # The grants made while the caller was gone go back as their replies come (bounded wait).

    async def both() -> tuple[int, int]:
        return await global_limiter.available_permits(), await alice_limiter.available_permits()

    await until(both, lambda left: left == (49, 1), "the hand-backs")


class _HeldBackend(MemoryBackend):
    """A memory backend whose attempts on one limiter wait until released."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Any:
        if name == self.held:
            self.waiting.set()
            await self.go.wait()
        return await super().try_acquire(name, permits, max_wait_us)


async def test_a_request_cancelled_after_one_rule_granted_hands_that_grant_back() -> None:
    # One rule has answered (granted), the other has not when the client goes away.
    backend = _HeldBackend(held="slow")
    app = RateLimitMiddleware(
        starlette_app(),
        backend=backend,
        rules=[Rule("quick", "5/minute"), Rule("slow", "5/minute")],
    )
    quick = RateLimiter("quick", backend)
    async with client(app) as http:
        backend.go.set()
        assert (await http.get("/other")).status_code == 200  # (writes both configs)
        backend.go.clear()
        request = asyncio.ensure_future(http.get("/other"))
        for _ in range(100):  # until the quick rule has granted (a few loop turns)
            if backend.waiting.is_set() and await quick.available_permits() == 3:
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("the quick rule never granted")
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0)  # a hand-back may run in the background
        assert await quick.available_permits() == 4


async def test_a_per_client_view_takes_one_round_trip(redis_backend: RedisBackend) -> None:
    limiter = RateLimiter("pc", redis_backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 100, 60))
    assert await limiter.try_acquire()  # the backend has learnt the rate type
    redis = redis_backend.redis

    async def scripts_run() -> int:
        stats = await redis.info("commandstats")
        scripts = ("cmdstat_evalsha", "cmdstat_fcall")  # FCALL where the server has functions
        return sum(v["calls"] for k, v in stats.items() if k.startswith(scripts))

    before = await scripts_run()
    for i in range(5):
        view = redis_backend.with_client(f"client-{i}")
        assert (await view.try_acquire("pc", 1)).granted
    assert await scripts_run() - before == 5


@pytest.mark.slow
async def test_redis_outage_deny_answers_503_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        backend = RedisBackend(redis, timeout=2)
        app = RateLimitMiddleware(
            starlette_app(), backend=backend, rules=[Rule("api", "100/second")]
        )
        async with client(app) as http:
            assert (await http.get("/other")).status_code == 200
            server.kill()
            caplog.set_level(logging.INFO, logger="aiolimit")
            answers = [await http.get("/other") for _ in range(3)]
            assert [a.status_code for a in answers] == [503] * 3
            assert answers[0].headers["retry-after"] == "1"
            assert answers[0].json()["detail"].startswith("Service Unavailable")
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            (down,) = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert "unreachable" in down.getMessage()
            assert any("refusing requests (503)" in r.getMessage() for r in caplog.records)
            assert "Traceback" not in answers[0].text
            server.start()
            caplog.clear()
            deadline = asyncio.get_running_loop().time() + 15  # past the breaker's back-off
            while (await http.get("/other")).status_code != 200:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            (up,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert "answers again" in up.getMessage()
        assert app.stats.backend_errors >= 3
        assert app.stats.outages == 1
        await redis.aclose()


@pytest.mark.slow
async def test_redis_outage_allow_lets_requests_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    backend = RedisBackend(redis, timeout=2)
    caplog.set_level(logging.INFO, logger="aiolimit")
    app = RateLimitMiddleware(
        starlette_app(),
        backend=backend,
        rules=[Rule("api", "1/minute"), Rule("pc", "1/minute", key=client_ip)],
        on_backend_error="allow",
    )
    async with client(app) as http:
        answers = [await http.get("/api/items") for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert "ratelimit" not in answers[0].headers
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert any("letting requests through" in r.getMessage() for r in caplog.records)
    assert (app.stats.backend_errors, app.stats.outages, app.stats.allowed) == (4, 1, 4)
    await redis.aclose()


@pytest.mark.slow
async def test_the_dependency_answers_503_when_redis_is_down() -> None:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}")
    app = fastapi_app(RedisBackend(redis, timeout=2), middleware=False)
    async with client(app) as http:
        answer = await http.post("/login")
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    await redis.aclose()


async def test_uvicorn_and_a_real_client_on_redis(redis_backend: RedisBackend) -> None:
    import uvicorn

    app = RateLimitMiddleware(
        starlette_app(),
        backend=redis_backend,
        rules=[Rule("served", "3/minute", key=client_ip)],
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
            await asyncio.sleep(0.01)
        config = await RateLimiter("served", redis_backend).get_config()
        assert config is not None  # written at startup
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answers = [await http.get("/api/items") for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert fields(answers[2])["limit"] == {"served": {"r": 0, "t": 60}}
        assert answers[3].headers["retry-after"] == "60"
        assert json.loads(answers[3].text)["detail"].startswith("Too Many Requests")
    finally:
        server.should_exit = True
        await serving


# -- several rates (enforced once several rates per limiter are on the backends) ----------------


@looptime
async def test_several_rates_on_one_rule_are_each_enforced_and_announced() -> None:
    app = RateLimitMiddleware(
        starlette_app(),
        backend=MemoryBackend(),
        rules=[Rule("burst", [Rate(3, 1), Rate(4, 60)])],
    )
    async with client(app) as http:
        first = [await http.get("/other") for _ in range(4)]
        assert [a.status_code for a in first] == [200, 200, 200, 429]
        assert fields(first[0])["policy"] == {
            "burst-1s": {"q": 3, "w": 1},
            "burst-60s": {"q": 4, "w": 60},
        }
        await asyncio.sleep(1.5)
        assert (await http.get("/other")).status_code == 200
        refused = await http.get("/other")  # 4 in the last minute
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) == 59


def test_a_rule_and_the_dependency_take_permits_under_that_name_only() -> None:
    rule = Rule("uploads", "5/second", permits=2)
    assert rule.permits == 2
    assert not hasattr(rule, "cost")
    with pytest.raises(TypeError, match="cost"):
        Rule("uploads", "5/second", cost=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="cost"):
        RateLimit("uploads", "5/second", backend=MemoryBackend(), cost=2)  # type: ignore[call-arg]
