"""Rate limits for web apps: an ASGI middleware for the whole app, a FastAPI dependency per route.

>>> from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
>>> app = RateLimitMiddleware(
...     app,                                   # Starlette, FastAPI, Litestar, Quart...
...     backend=RedisBackend(redis),
...     rules=[
...         Rule("api-global", "1000/second"),
...         Rule("api-per-client", "10/second; 100/minute", key=client_ip, paths=["/api/"]),
...     ],
... )
>>> @app.post("/login", dependencies=[Depends(RateLimit("login", "5/minute", backend=backend,
...                                                       key=client_ip))])

Every rule that matches a request is checked at once (one round trip on Redis). When one
refuses, the permits the others granted to that request are handed back, and the answer is
``429`` with ``Retry-After`` and the RateLimit fields of draft-ietf-httpapi-ratelimit-headers
(``RateLimit-Policy: "api-per-client";q=10;w=1`` and ``RateLimit: "api-per-client";r=0;t=1``),
which allowed responses carry too. Neither needs any dependency; the dependency needs FastAPI.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ipaddress
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, NamedTuple

from ._limiter import RateLimiter
from ._types import (
    Algorithm,
    Rate,
    RateLimiterConfig,
    RateType,
    check_name,
    rates_of,
    shown,
    to_micros,
)
from .backends.base import Backend, Grant, Refusal
from .errors import InvalidArgumentError, LimiterError, NotConfiguredError

__all__ = [
    "RateLimit",
    "RateLimitMiddleware",
    "RateLimitStats",
    "Rule",
    "client_ip",
    "client_ip_from",
]

log = logging.getLogger("aiolimit")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KeyFunc = Callable[[Scope], "str | None"]
"""What a rule counts by: ``key(scope)`` is the client id, or None (the rule does not apply)."""
OnBackendError = Literal["deny", "allow"]

# Where the rate limit items of a request gather, so that a middleware and any dependencies
# inside it write one set of header fields together.
_SCOPE_KEY = "aiolimit.rate_limits"
_GRANTS_KEY = "aiolimit.grants"
_FIELDS = (b"ratelimit-policy", b"ratelimit")
_LEGACY_FIELDS = (b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset")
_UNKNOWN_CLIENT = "unknown"
_CLIENT_VIEWS = 4096  # per-client backend views a middleware keeps

# Close codes (RFC 6455): 1008 a policy was violated, 1013 try again later.
_WS_POLICY_VIOLATION = 1008
_WS_TRY_AGAIN_LATER = 1013


# -- keys ---------------------------------------------------------------------------------------


def client_ip(scope: Scope) -> str:
    """The peer address of the connection: the key of a per-client rule.

    >>> Rule("api-per-client", "10/second", key=client_ip)

    ``X-Forwarded-For`` is never read (anyone can send it); behind a proxy use
    :func:`client_ip_from`. Connections without a peer address (a Unix socket) share one
    budget, ``"unknown"``, rather than going unlimited.
    """
    client = scope.get("client")
    if client and client[0]:
        return str(client[0])
    return _UNKNOWN_CLIENT


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_ip_from(trusted_proxies: Iterable[str], *, header: str = "X-Forwarded-For") -> KeyFunc:
    """A key that reads a forwarding header, but only as far as the proxies you trust wrote it.

    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8", "127.0.0.1"]))
    >>> Rule("api-per-client", "10/second", key=client_ip_from(["10.0.0.0/8"], header="Forwarded"))

    ``header`` is ``"X-Forwarded-For"`` (the default) or ``"Forwarded"`` (RFC 7239, its
    ``for=`` parameters: ``Forwarded: for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"``);
    only the one you name is read, as your proxies are set up to write one of them.

    When the peer is a trusted proxy, the header is read from its right end, skipping the
    addresses of trusted proxies; the first other address is the client (the one the outermost
    trusted proxy saw). Entries a client wrote itself lie further left and are never reached.
    From any other peer the header is ignored and the peer address is the client. Where a
    trusted proxy wrote something that is no address (``unknown``, an obfuscated name,
    garbage), the nearest address read so far is the client.
    """
    if isinstance(trusted_proxies, str):
        raise InvalidArgumentError(
            f"trusted_proxies must be a list of addresses or networks, not the str "
            f"{trusted_proxies!r} (write [{trusted_proxies!r}])"
        )
    networks: list[_Network] = []
    for proxy in trusted_proxies:
        try:
            networks.append(ipaddress.ip_network(proxy, strict=False))
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"trusted_proxies: {proxy!r} is not an IP address or network"
            ) from None
    if not isinstance(header, str) or header.lower() not in _FORWARDING_HEADERS:
        raise InvalidArgumentError(
            f"header must be 'X-Forwarded-For' or 'Forwarded', not {shown(header)}"
        )
    field_name = header.lower().encode()
    hops_in = _FORWARDING_HEADERS[header.lower()]

    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in networks)

    def key(scope: Scope) -> str:
        peer = client_ip(scope)
        if not trusted(peer):
            return peer
        hops: list[str] = [
            hop
            for name, value in scope.get("headers", ())
            if name.lower() == field_name
            for hop in hops_in(value.decode("latin-1"))
        ]
        nearest = peer
        for hop in reversed(hops):
            if not _is_ip(hop):
                return nearest  # not an address where a trusted proxy should have written one
            if not trusted(hop):
                return hop
            nearest = hop
        return nearest

    return key


def _x_forwarded_for(value: str) -> list[str]:
    """The hops of one ``X-Forwarded-For`` field, leftmost first."""
    return [hop.strip() for hop in value.split(",")]


def _forwarded(value: str) -> list[str]:
    """The ``for=`` node of each element of one RFC 7239 ``Forwarded`` field, leftmost first:
    an address without its port or brackets, or the text as written when it is none
    (``unknown``, ``_hidden``); ``""`` for an element without ``for=``."""
    hops = []
    for element in _split_outside_quotes(value, ","):
        node = ""
        for pair in _split_outside_quotes(element, ";"):
            name, equals, raw = pair.partition("=")
            if equals and name.strip().lower() == "for":
                node = _node_address(_unquoted(raw.strip()))
        hops.append(node)
    return hops


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts, start, quoted, escaped = [], 0, False, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _unquoted(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _node_address(node: str) -> str:
    """``[2001:db8::17]:4711`` -> ``2001:db8::17``, ``192.0.2.43:47011`` -> ``192.0.2.43``."""
    if node.startswith("["):
        address, bracket, _ = node[1:].partition("]")
        return address if bracket else node
    address, colon, port = node.partition(":")
    return address if colon and port.isdigit() and "." in address else node


_FORWARDING_HEADERS: dict[str, Callable[[str], list[str]]] = {
    "x-forwarded-for": _x_forwarded_for,
    "forwarded": _forwarded,
}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# -- rules --------------------------------------------------------------------------------------


class Rule:
    """One limit on the requests it matches.

    >>> Rule("api-global", "1000/second")                          # one budget for everyone
    >>> Rule("api-per-client", "10/second; 100/minute", key=client_ip, paths=["/api/"])
    >>> Rule("uploads", [Rate(20, 60)], key=client_ip, methods=["POST"], cost=5)

    ``rates`` is text for :meth:`Rate.parse` or a sequence of :class:`Rate`. With a ``key``
    the rule is a ``PER_CLIENT`` limiter whose client id is ``key(scope)`` (None: the rule
    does not apply to this request); without one, ``OVERALL``. ``paths`` are path prefixes,
    ``methods`` HTTP methods (a websocket connects with ``GET``); None matches all.
    ``cost`` is the permits a request takes, or a callable of the scope (0: free).
    ``algorithm`` None is the library's default. The name is the limiter's name, so a rule
    shares its budget with every process (and any ``RateLimiter``) of that name; it also
    names the rule's policy in the header fields, so it is printable ASCII.
    """

    __slots__ = ("algorithm", "cost", "key", "methods", "name", "paths", "rates")

    def __init__(
        self,
        name: str,
        rates: str | Sequence[Rate],
        *,
        key: KeyFunc | None = None,
        paths: Iterable[str] | None = None,
        methods: Iterable[str] | None = None,
        cost: int | Callable[[Scope], int] = 1,
        algorithm: Algorithm | str | None = None,
    ) -> None:
        self.name = check_name(name)
        if not all(" " <= char <= "~" for char in name):
            raise InvalidArgumentError(
                f"a rule's name goes into the RateLimit header fields: printable ASCII only, "
                f"not {name!r}"
            )
        self.rates: tuple[Rate, ...] = rates_of(rates, None)
        if key is not None and not callable(key):
            raise InvalidArgumentError(f"key must be a callable of the scope, not {shown(key)}")
        self.key = key
        self.paths = None if paths is None else _strings(paths, "paths")
        if self.paths is not None and not all(p.startswith("/") for p in self.paths):
            raise InvalidArgumentError(f"paths are prefixes starting with '/', not {self.paths}")
        self.methods = (
            None if methods is None else frozenset(m.upper() for m in _strings(methods, "methods"))
        )
        if not callable(cost):
            _check_cost(cost, self)
        self.cost = cost
        try:
            self.algorithm = Algorithm.SLIDING_WINDOW if algorithm is None else Algorithm(algorithm)
        except ValueError:
            raise InvalidArgumentError(f"unknown algorithm {algorithm!r}") from None

    def __repr__(self) -> str:
        rates = "; ".join(str(rate) for rate in self.rates)
        return f"Rule({self.name!r}, {rates!r}, {self.rate_type.value})"

    @property
    def rate_type(self) -> RateType:
        return RateType.OVERALL if self.key is None else RateType.PER_CLIENT

    def matches(self, scope: Scope) -> bool:
        """Whether the request's path and method are this rule's (its key is not asked)."""
        if self.paths is not None:
            path = scope.get("path", "")
            if not any(path.startswith(prefix) for prefix in self.paths):
                return False
        if self.methods is not None:
            method = scope.get("method", "GET")  # a websocket handshake is a GET
            if method not in self.methods:
                return False
        return True

    def cost_of(self, scope: Scope) -> int:
        """The permits this request takes; one over the rate is refused, never granted."""
        if callable(self.cost):
            return _check_cost(self.cost(scope), self, over_rate_ok=True)
        return self.cost

    def differs_from(self, stored: RateLimiterConfig) -> bool:
        """Whether the stored config is not what this rule says (then it is rewritten)."""
        return (
            stored.rate_type is not self.rate_type
            or stored.rates != self.rates
            or stored.algorithm is not self.algorithm
        )

    def policies(self) -> list[tuple[str, Rate]]:
        """The rule's quota policies for the header fields: one per rate, named after the
        rule (with the window in seconds when it has several rates)."""
        if len(self.rates) == 1:
            return [(self.name, self.rates[0])]
        return [(f"{self.name}-{_window(rate)}s", rate) for rate in self.rates]


def _strings(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise InvalidArgumentError(f"{what} must be a list of str, not {shown(values)}")
    return tuple(values)


def _check_cost(cost: object, rule: Rule, over_rate_ok: bool = False) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise InvalidArgumentError(f"cost must be an int >= 0, not {shown(cost)}")
    most = min(rate.permits for rate in rule.rates)
    if cost > most and not over_rate_ok:
        raise InvalidArgumentError(
            f"cost ({cost}) exceeds the rate of rule {rule.name!r} ({most}): never granted"
        )
    return cost


def _window(rate: Rate) -> int:
    """A rate's window in whole seconds (at least 1), for ``w``."""
    return max(1, math.ceil(rate.interval_us / 1e6))


def _whole_seconds(us: int) -> int:
    """A wait in whole seconds, rounded up, at least 1: a client that comes back then finds
    the permits free."""
    return max(1, -(-us // 1_000_000))


# -- the check ----------------------------------------------------------------------------------


@dataclass
class RateLimitStats:
    """What a middleware or dependency decided, since it was made."""

    allowed: int = 0
    """Requests let through (those let through by ``on_backend_error="allow"`` included)."""
    refused: int = 0
    """Requests answered 429."""
    waited: int = 0
    """Allowed requests that first waited for a reserved slot (``wait`` > 0)."""
    backend_errors: int = 0
    """Requests the store failed (answered 503, or let through)."""
    outages: int = 0
    """Runs of store failures: each is logged once, when it starts."""


class _Item(NamedTuple):
    """What a request's response says about one rule."""

    rule: Rule
    remaining: int
    reset: int  # whole seconds


class _Request(NamedTuple):
    rule: Rule
    backend: Backend  # the store, seen by the request's client for a per-client rule
    cost: int


class _Verdict(NamedTuple):
    status: int  # 200 allowed, 429 refused, 503 the store failed
    retry_after: int
    items: list[_Item]
    detail: str
    grants: list[tuple[_Request, Grant]] = []  # noqa: RUF012 - never changed


_ALLOWED = _Verdict(200, 0, [], "")


class _Gate:
    """Checks a request against rules: what the middleware and the dependency share."""

    __slots__ = (
        "_backend",
        "_clients",
        "_configured",
        "_error_retry_after",
        "_failures",
        "_locks",
        "_max_wait_us",
        "_on_backend_error",
        "rules",
        "stats",
    )

    def __init__(
        self,
        backend: Backend,
        rules: Sequence[Rule],
        wait: float | timedelta,
        on_backend_error: str,
        error_retry_after: float,
    ) -> None:
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {shown(backend)}")
        if isinstance(rules, Rule) or not all(isinstance(rule, Rule) for rule in rules):
            raise InvalidArgumentError(f"rules must be a list of Rule, not {shown(rules)}")
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"two rules share a name (a name is one budget): {names}")
        if on_backend_error not in ("deny", "allow"):
            raise InvalidArgumentError(
                f"on_backend_error must be 'deny' or 'allow', not {shown(on_backend_error)}"
            )
        wait_us = to_micros(wait, "wait")
        if wait_us < 0:
            raise InvalidArgumentError(f"wait must be >= 0 seconds, not {shown(wait)}")
        retry_us = to_micros(error_retry_after, "error_retry_after")
        if retry_us <= 0:
            raise InvalidArgumentError(
                f"error_retry_after must be > 0 seconds, not {shown(error_retry_after)}"
            )
        self._backend = backend
        self.rules = tuple(rules)
        self._max_wait_us = wait_us
        self._on_backend_error = on_backend_error
        self._error_retry_after = _whole_seconds(retry_us)
        self._configured: set[str] = set()
        # Backend views per client id, kept for the busiest (a view is cheap, but not free).
        self._clients: dict[str, Backend] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._failures = 0  # in the outage under way; 0: none is
        self.stats = RateLimitStats()

    # -- configs --------------------------------------------------------------------------------

    async def _configure(self, rule: Rule) -> None:
        """Writes the rule's config where there is none, and rewrites a stored one that says
        other rates (keeping what was granted), once per process."""
        if rule.name in self._configured:
            return
        lock = self._locks.setdefault(rule.name, asyncio.Lock())
        async with lock:
            if rule.name in self._configured:
                return
            limiter = RateLimiter(rule.name, self._backend)
            stored = await limiter.get_config()
            written = stored is None and await limiter.try_set_rate(
                rule.rate_type, rule.rates, algorithm=rule.algorithm
            )
            if not written:
                stored = stored or await limiter.get_config()
                if stored is None or rule.differs_from(stored):
                    log.info("rate limit %r: writing the rates the code gives: %s", rule.name, rule)
                    await limiter.set_rate(
                        rule.rate_type, rule.rates, algorithm=rule.algorithm, keep_state=True
                    )
            self._configured.add(rule.name)

    async def configure_all(self) -> None:
        """Writes every rule's config now (at startup); a failing store is logged, and the
        configs are written at first use instead."""
        try:
            await asyncio.gather(*(self._configure(rule) for rule in self.rules))
        except LimiterError as exc:
            self._failed(exc)
        else:
            self._answered()

    # -- checking -------------------------------------------------------------------------------

    async def check(self, scope: Scope) -> _Verdict:
        requests = []
        for rule in self.rules:
            if not rule.matches(scope):
                continue
            backend = self._backend
            if rule.key is not None:
                client = rule.key(scope)
                if client is None:
                    continue
                backend = self._client(client or _UNKNOWN_CLIENT)
            cost = rule.cost_of(scope)
            if cost:
                requests.append(_Request(rule, backend, cost))
        if not requests:
            return _ALLOWED
        try:
            attempts = await self._attempt_all(requests)
        except LimiterError as exc:
            return self._failed(exc)
        self._answered()

        pairs = list(zip(requests, attempts, strict=True))
        refused = [(r, a) for r, a in pairs if isinstance(a, Refusal)]
        grants = [(r, a) for r, a in pairs if isinstance(a, Grant)]
        if refused:
            await self._hand_back(grants)
            retry_after = max(_whole_seconds(a.retry_in) for _, a in refused)
            items = [
                _Item(r.rule, 0, _whole_seconds(a.retry_in))
                if isinstance(a, Refusal)
                else _Item(r.rule, max(a.left + r.cost, 0), _window(r.rule.rates[0]))
                for r, a in pairs
            ]
            self.stats.refused += 1
            names = ", ".join(repr(r.rule.name) for r, _ in refused)
            detail = f"Too Many Requests: rate limit {names} exceeded; retry after {retry_after} s"
            return _Verdict(429, retry_after, items, detail)

        starts_in = max(grant.starts_in for _, grant in grants)
        if starts_in > 0:
            try:
                await asyncio.sleep(starts_in / 1e6)
            except asyncio.CancelledError:  # the client went away: its reservations go back
                for request, grant in grants:
                    request.backend.hand_back(request.rule.name, grant.member)
                raise
            self.stats.waited += 1
        self.stats.allowed += 1
        items = [_Item(r.rule, max(g.left, 0), _window(r.rule.rates[0])) for r, g in grants]
        return _Verdict(200, 0, items, "", grants)

    def _client(self, client: str) -> Backend:
        """The backend's view for ``client`` (a PER_CLIENT rule's key)."""
        view = self._clients.get(client)
        if view is None:
            try:
                view = self._backend.with_client(client)
            except InvalidArgumentError:  # text that is no client id (lone surrogates)
                return self._client(_UNKNOWN_CLIENT)
            if len(self._clients) >= _CLIENT_VIEWS:
                del self._clients[next(iter(self._clients))]  # the oldest
            self._clients[client] = view
        return view

    async def _attempt(self, request: _Request) -> Grant | Refusal:
        rule = request.rule
        if rule.name not in self._configured:
            await self._configure(rule)
        for _ in range(2):
            try:
                return await request.backend.try_acquire(rule.name, request.cost, self._max_wait_us)
            except NotConfiguredError:  # deleted or expired since: write it again
                self._configured.discard(rule.name)
                await self._configure(rule)
            except InvalidArgumentError:  # a stored config with a lower rate than the cost
                longest = max(rate.interval_us for rate in rule.rates)
                return Refusal(retry_in=longest, at=0, left=0)
        raise NotConfiguredError(rule.name)

    async def _attempt_all(self, requests: list[_Request]) -> list[Grant | Refusal]:
        """One attempt per rule, all at once; if any fails, the others' grants go back."""
        if len(requests) == 1:
            return [await self._attempt(requests[0])]
        outcomes = await self._all_outcomes(requests)
        attempts: list[Grant | Refusal] = []
        failures: list[BaseException] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                failures.append(outcome)
            else:
                attempts.append(outcome)
        if not failures:
            return attempts
        granted = [
            (request, outcome)
            for request, outcome in zip(requests, outcomes, strict=True)
            if isinstance(outcome, Grant)
        ]
        await self._hand_back(granted)
        raise failures[0]

    async def _all_outcomes(self, requests: list[_Request]) -> list[Grant | Refusal | Exception]:
        """What ``gather(*attempts, return_exceptions=True)`` gives, with one task fewer: the
        last attempt runs in this task (every attempt has made its request before any reply
        can come, so they go to Redis together). If this task is cancelled meanwhile, the
        attempts still running are cancelled (their grants go back), and so are grants made."""
        loop = asyncio.get_running_loop()
        others = [loop.create_task(self._attempt(request)) for request in requests[:-1]]
        outcomes: list[Grant | Refusal | Exception] = []
        last: Grant | Refusal | Exception | None = None
        try:
            try:
                last = await self._attempt(requests[-1])
            except Exception as exc:
                last = exc
            for task in others:
                try:
                    outcomes.append(await task)
                except Exception as exc:
                    outcomes.append(exc)
        except BaseException:
            made: list[tuple[_Request, object]] = [(requests[-1], last)]
            for request, task in zip(requests, others, strict=False):
                if not task.done():
                    task.cancel()  # its grant, if one comes, goes back
                elif not task.cancelled() and task.exception() is None:
                    made.append((request, task.result()))
            for request, outcome in made:
                if isinstance(outcome, Grant):
                    request.backend.hand_back(request.rule.name, outcome.member)
            raise
        outcomes.append(last)
        return outcomes

    @staticmethod
    async def _hand_back(grants: list[tuple[_Request, Grant]]) -> None:
        """Releases exactly the grants made for a request that is not served."""
        outcomes = await asyncio.gather(
            *(r.backend.release(r.rule.name, r.cost, g.member) for r, g in grants),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                log.warning("could not hand back the permits of a refused request: %s", outcome)

    # -- store failures -------------------------------------------------------------------------

    def _failed(self, exc: LimiterError) -> _Verdict:
        self.stats.backend_errors += 1
        if not self._failures:
            self.stats.outages += 1
            action = (
                "refusing requests (503)"
                if self._on_backend_error == "deny"
                else ("letting requests through unlimited")
            )
            log.error(
                "rate limits: the store failed (%s: %s); %s until it answers again",
                type(exc).__name__,
                exc,
                action,
            )
        self._failures += 1
        if self._on_backend_error == "allow":
            self.stats.allowed += 1
            return _ALLOWED
        seconds = self._error_retry_after
        detail = f"Service Unavailable: rate limits cannot be checked; retry after {seconds} s"
        return _Verdict(503, seconds, [], detail)

    def _answered(self) -> None:
        if self._failures:
            log.warning(
                "rate limits: the store answers again, after %d failed requests", self._failures
            )
            self._failures = 0


def _sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 8941); rule names are printable ASCII."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.lru_cache(maxsize=1024)
def _policy_of(rule: Rule) -> tuple[str, str]:
    """A rule's ``RateLimit-Policy`` items, and its first policy's name, as sent (the same
    for every response: worked out once per rule)."""
    named = rule.policies()
    policy = ", ".join(
        f"{_sf_string(name)};q={rate.permits};w={_window(rate)}" for name, rate in named
    )
    return policy, _sf_string(named[0][0])


def _header_fields(items: Sequence[_Item], legacy: bool) -> list[tuple[bytes, bytes]]:
    """The RateLimit fields for ``items`` (one per rule; the last one per rule counts)."""
    by_rule = {item.rule.name: item for item in items}
    if not by_rule:
        return []
    policies = []
    limits = []
    for item in by_rule.values():
        policy, first = _policy_of(item.rule)
        policies.append(policy)
        limits.append(f"{first};r={item.remaining};t={item.reset}")
    fields = [
        (b"ratelimit-policy", ", ".join(policies).encode()),
        (b"ratelimit", ", ".join(limits).encode()),
    ]
    if legacy:  # the most constraining rule: the fewest permits left, then the latest reset
        tight = min(by_rule.values(), key=lambda item: (item.remaining, -item.reset))
        fields += [
            (b"x-ratelimit-limit", str(tight.rule.rates[0].permits).encode()),
            (b"x-ratelimit-remaining", str(tight.remaining).encode()),
            (b"x-ratelimit-reset", str(math.ceil(time.time()) + tight.reset).encode()),
        ]
    return fields


def _items_of(scope: Scope) -> list[_Item]:
    items: list[_Item] = scope.setdefault(_SCOPE_KEY, [])
    return items


def _grants_of(scope: Scope) -> list[tuple[_Request, Grant]]:
    """The grants made for the request so far, by every middleware and dependency."""
    grants: list[tuple[_Request, Grant]] = scope.setdefault(_GRANTS_KEY, [])
    return grants


async def _record(scope: Scope, verdict: _Verdict) -> None:
    """Notes the verdict's fields and grants in the scope; a refusal hands back the grants
    that a middleware or dependency outside made for this request, so a request refused
    anywhere consumes nothing anywhere."""
    items = _items_of(scope)
    grants = _grants_of(scope)
    if verdict.status == 200:
        items.extend(verdict.items)
        grants.extend(verdict.grants)
        return
    if grants:  # refused (429) or unchecked (503): the request is not served
        await _Gate._hand_back(grants)
        back = {request.rule.name: request.cost for request, _ in grants}
        items[:] = [
            item._replace(remaining=item.remaining + back.get(item.rule.name, 0)) for item in items
        ]
        grants.clear()
    items.extend(verdict.items)


def _refusal_headers(verdict: _Verdict, scope: Scope, legacy: bool) -> list[tuple[bytes, bytes]]:
    return [
        (b"retry-after", str(verdict.retry_after).encode()),
        *_header_fields(_items_of(scope), legacy),
    ]


# -- the middleware -----------------------------------------------------------------------------


class RateLimitMiddleware:
    """Checks every HTTP request and websocket connection against ``rules``.

    >>> app = RateLimitMiddleware(app, backend=RedisBackend(redis), rules=[
    ...     Rule("api-global", "1000/second"),
    ...     Rule("api-per-client", "10/second", key=client_ip, paths=["/api/"]),
    ... ], wait=0.5, on_backend_error="deny")

    A refused request is answered ``429`` with ``Retry-After`` (whole seconds, rounded up,
    at least 1), the RateLimit fields and a JSON body ``{"detail": ...}``; it consumes no
    permit of any rule. ``wait`` (seconds): a request whose permits are free within it is
    reserved and served then instead of refused. ``on_backend_error``: when the store
    fails, ``"deny"`` answers ``503`` with ``Retry-After: error_retry_after``, ``"allow"``
    lets the request through; either way each outage is logged once (logger ``aiolimit``)
    and counted in :attr:`stats`. ``headers``: the RateLimit fields on allowed responses
    too; ``legacy_headers``: also ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset``
    (Unix time) for the most constraining rule. The fields are written once per response,
    replacing any of the same name the app set. Websocket connections are checked at
    connect and refused with close code 1008 (1013 when the store fails and ``"deny"``);
    ``lifespan`` passes through, and startup writes the rules' configs.
    """

    __slots__ = ("_gate", "_headers", "_legacy", "app")

    def __init__(
        self,
        app: ASGIApp,
        *,
        backend: Backend,
        rules: Sequence[Rule],
        wait: float | timedelta = 0,
        on_backend_error: OnBackendError = "deny",
        error_retry_after: float = 1,
        headers: bool = True,
        legacy_headers: bool = False,
    ) -> None:
        self.app = app
        self._gate = _Gate(backend, rules, wait, on_backend_error, error_retry_after)
        self._headers = headers
        self._legacy = legacy_headers

    @property
    def stats(self) -> RateLimitStats:
        return self._gate.stats

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._gate.rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, self._configure_at_startup(receive), send)
            return
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        verdict = await self._gate.check(scope)
        await _record(scope, verdict)
        if kind == "websocket":
            if verdict.status == 200:
                await self.app(scope, receive, send)
            else:
                await _refuse_websocket(verdict, receive, send)
            return
        if verdict.status != 200:
            await self._refuse(verdict, scope, send)
        elif self._headers:
            await self.app(scope, receive, self._adding_fields(scope, send))
        else:
            await self.app(scope, receive, send)

    def _configure_at_startup(self, receive: Receive) -> Receive:
        async def receive_then_configure() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                await self._gate.configure_all()
            return message

        return receive_then_configure

    def _adding_fields(self, scope: Scope, send: Send) -> Send:
        legacy = self._legacy

        async def send_with_fields(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = _with_fields(message, _header_fields(_items_of(scope), legacy))
            await send(message)

        return send_with_fields

    async def _refuse(self, verdict: _Verdict, scope: Scope, send: Send) -> None:
        body = json.dumps({"detail": verdict.detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *_refusal_headers(verdict, scope, self._legacy),
        ]
        await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _with_fields(message: Message, fields: list[tuple[bytes, bytes]]) -> Message:
    """The response start with our fields, and none of the same names the app set."""
    if not fields:
        return message
    ours = {name for name, _ in fields}
    kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in ours]
    return {**message, "headers": [*kept, *fields]}


async def _refuse_websocket(verdict: _Verdict, receive: Receive, send: Send) -> None:
    """Accepts, then closes with the reason: a close before the handshake completes reaches a
    browser as a bare 403, without the code or the wait."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client is gone already
    code = _WS_POLICY_VIOLATION if verdict.status == 429 else _WS_TRY_AGAIN_LATER
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": verdict.detail[:120]})


# -- the FastAPI dependency ---------------------------------------------------------------------


class RateLimit:
    """A per-route limit, as a FastAPI dependency.

    >>> login_limit = RateLimit("login", "5/minute", backend=backend, key=client_ip)
    >>> @app.post("/login", dependencies=[Depends(login_limit)])
    ... async def login(form: LoginForm) -> Token: ...

    The same checks, status codes, body and header fields as :class:`RateLimitMiddleware`
    (it raises ``HTTPException(429)`` or ``(503)``; FastAPI writes the response). On allowed
    responses the fields go through FastAPI's response, which an endpoint that returns a
    ``Response`` itself replaces: with a ``RateLimitMiddleware`` around the app (rules may
    be empty) every response gets them, together with the middleware's own.
    """

    __slots__ = ("__signature__", "_gate", "_headers", "_legacy")

    def __init__(
        self,
        name: str,
        rates: str | Sequence[Rate],
        *,
        backend: Backend,
        key: KeyFunc | None = None,
        cost: int | Callable[[Scope], int] = 1,
        algorithm: Algorithm | str | None = None,
        wait: float | timedelta = 0,
        on_backend_error: OnBackendError = "deny",
        error_retry_after: float = 1,
        headers: bool = True,
        legacy_headers: bool = False,
    ) -> None:
        # Imported here: the module, and the middleware, need no web framework.
        from starlette.requests import Request
        from starlette.responses import Response

        rule = Rule(name, rates, key=key, cost=cost, algorithm=algorithm)
        self._gate = _Gate(backend, [rule], wait, on_backend_error, error_retry_after)
        self._headers = headers
        self._legacy = legacy_headers
        # FastAPI injects by annotation; a signature with the real classes needs no import of
        # starlette at module level.
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        self.__signature__ = inspect.Signature(
            [
                inspect.Parameter("request", positional, annotation=Request),
                inspect.Parameter("response", positional, annotation=Response),
            ],
            return_annotation=None,
        )

    @property
    def stats(self) -> RateLimitStats:
        return self._gate.stats

    @property
    def rule(self) -> Rule:
        return self._gate.rules[0]

    async def __call__(self, request: Any, response: Any) -> None:
        from starlette.exceptions import HTTPException

        scope = request.scope
        verdict = await self._gate.check(scope)
        await _record(scope, verdict)
        if verdict.status != 200:
            fields = _refusal_headers(verdict, scope, self._legacy)
            raise HTTPException(
                verdict.status,
                detail=verdict.detail,
                headers={name.decode(): value.decode() for name, value in fields},
            )
        if self._headers:
            for name, value in _header_fields(_items_of(scope), self._legacy):
                response.headers[name.decode()] = value.decode()
