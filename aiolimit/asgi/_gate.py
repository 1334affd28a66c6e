"""The check of a request against rules, shared by the middleware and the FastAPI dependency."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from .._acquire import Acquired, take
from .._checks import max_wait_of
from .._concurrency import ConcurrencyLimiter
from .._lease import Lease
from .._limiter import RateLimiter
from .._request import Request, deadline_in
from .._values import Duration, shown, to_micros
from ..backends.base import Backend, Grant, Refusal
from ..errors import InvalidArgumentError, LimiterError
from ._addresses import UNKNOWN_CLIENT
from ._fields import (
    Item,
    granted_item,
    granted_items,
    items_of,
    read_granted_items,
    refused_item,
)
from ._rules import Rule, whole_seconds
from ._types import Scope

__all__ = ["Gate", "RateLimitStats", "Verdict", "record", "record_allowed"]

log = logging.getLogger("aiolimit")

_GRANTS_KEY = "aiolimit.grants"
_CLIENT_VIEWS = 4096  # per-client backend views a middleware keeps


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
    busy: int = 0
    """Requests answered 503 because no concurrency slot was free within ``wait``."""
    outages: int = 0
    """Runs of store failures (the backend logs each once as it starts and once as it ends;
    the middleware says at INFO what it does meanwhile)."""


class _Request(NamedTuple):
    rule: Rule
    limiter: RateLimiter  # the rule's limiter, as the request's client sees it (PER_CLIENT)
    permits: int


# _Request(...) and Verdict(...) without the Python frame of a named tuple's __new__ (every
# field given): once per rule and request, and once per request.
_new_request = functools.partial(tuple.__new__, _Request)


class Verdict(NamedTuple):
    status: int  # 200 allowed, 429 refused, 503 the store failed
    retry_after: int
    items: list[Item]
    detail: str
    acquired: Acquired | None = None  # the grants, when allowed
    requests: Sequence[_Request] = ()  # what each rule granted (its permits), when allowed


_new_verdict = functools.partial(tuple.__new__, Verdict)
_ALLOWED = Verdict(200, 0, [], "")


class Gate:
    """Checks a request against rules: what every server surface (the ASGI and aiohttp.web
    middlewares, the FastAPI dependency) shares. The permits are taken along the one permit
    path (:func:`aiolimit.acquire_all`'s); each rule is a limiter whose rates are its code's
    (``RateLimiter(rate=...)``): written at first use, and again whenever the store has lost
    them, one write for every waiter. With ``concurrency``, :meth:`slot` holds a request's
    slot while it is served."""

    __slots__ = (
        "_clients",
        "_concurrency",
        "_error_retry_after",
        "_failures",
        "_limiters",
        "_max_wait",
        "_on_backend_error",
        "rules",
        "stats",
    )

    def __init__(
        self,
        backend: Backend,
        rules: Sequence[Rule],
        wait: Duration,
        on_backend_error: str,
        error_retry_after: Duration,
        concurrency: ConcurrencyLimiter | None = None,
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
        retry_us = to_micros(error_retry_after, "error_retry_after")
        if retry_us <= 0:
            raise InvalidArgumentError(
                f"error_retry_after must be > 0 seconds, not {shown(error_retry_after)}"
            )
        if concurrency is not None and not isinstance(concurrency, ConcurrencyLimiter):
            raise InvalidArgumentError(
                f"concurrency must be a ConcurrencyLimiter or None, not {shown(concurrency)}"
            )
        self._concurrency = concurrency
        self.rules = tuple(rules)
        self._limiters = {
            rule.name: RateLimiter(rule.name, backend, rate=rule.config) for rule in rules
        }
        self._max_wait = max_wait_of(wait, "wait")
        self._on_backend_error = on_backend_error
        self._error_retry_after = whole_seconds(retry_us)
        # Per-client views of the rules' limiters, kept for the busiest (cheap, not free).
        self._clients: dict[tuple[str, str], RateLimiter] = {}
        self._failures = 0  # in the outage under way; 0: none is
        self.stats = RateLimitStats()

    # -- configs --------------------------------------------------------------------------------

    async def configure_all(self) -> None:
        """Writes every rule's config now (at startup); a failing store is logged, and the
        configs are written at first use instead."""
        try:
            await asyncio.gather(
                *(limiter.rate_in_code.store() for limiter in self._limiters.values())
            )
        except LimiterError as exc:
            self.failed(exc)
        else:
            self._answered()

    # -- checking -------------------------------------------------------------------------------

    def _requests(self, scope: Scope) -> list[_Request]:
        requests = []
        for rule in self.rules:
            if (rule.paths is not None or rule.methods is not None) and not rule.matches(scope):
                continue
            key = rule.key
            if key is None:
                limiter = self._limiters[rule.name]
            else:
                try:
                    client = key(scope)
                except Exception:  # the app's bug: the server answers 500; say which rule
                    log.exception("rule %r: its key function raised", rule.name)
                    raise
                if client is None:
                    continue
                client = client or UNKNOWN_CLIENT
                view = self._clients.get((rule.name, client))  # (a view known: no call)
                limiter = self._client(rule, client) if view is None else view
            permits = rule.permits
            if callable(permits):
                permits = rule.permits_of(scope)
            if permits:
                requests.append(_new_request((rule, limiter, permits)))
        return requests

    async def check(self, scope: Scope) -> Verdict:
        requests = self._requests(scope)
        if not requests:
            return _ALLOWED
        try:
            acquired = await self._acquire(requests)
        except InvalidArgumentError:  # a stored config with a lower rate than the permits
            return self._over_budget(requests)
        except LimiterError as exc:
            return self.failed(exc)
        self._failures = 0
        attempts = acquired.attempts
        if not acquired.granted:
            return self._refused(list(zip(requests, attempts, strict=True)))
        if acquired.waited > 0:
            self.stats.waited += 1
        self.stats.allowed += 1
        grants: tuple[Grant, ...] = attempts  # type: ignore[assignment]  # (all granted)
        items = granted_items(requests, grants)
        if items is None:
            items = await read_granted_items(requests, grants)
        return _new_verdict((200, 0, items, "", acquired, requests))

    def _acquire(self, requests: list[_Request]) -> Coroutine[Any, Any, Acquired]:
        """The permits of every request at once, through the one permit path (the permits are
        checked already: by the rule, or by ``Rule.permits_of``; the engine writes the rules'
        configs first where this process has not yet, and a lost one again). (A coroutine
        function in all but name.)"""
        limiters = []
        permits = []
        for _, limiter, count in requests:  # (a loop: no generators, no comprehensions)
            limiters.append(limiter)
            permits.append(count)
        return take(Request(tuple(limiters), tuple(permits), deadline_in(self._max_wait)))

    def _refused(self, pairs: list[tuple[_Request, Grant | Refusal]]) -> Verdict:
        refused = [(r, a) for r, a in pairs if isinstance(a, Refusal)]
        items = [
            refused_item(r.rule, a.retry_in, a.binding)
            if isinstance(a, Refusal)
            else granted_item(r.rule, a.left + r.permits, a.binding)  # handed back
            for r, a in pairs
        ]
        retry_in = max(a.retry_in for _, a in refused)
        return self._refusal([r.rule for r, _ in refused], retry_in, items)

    def _over_budget(self, requests: list[_Request]) -> Verdict:
        """Permits above the stored config's rate (a config written elsewhere, with a lower
        rate than the rule's): refused, to come back after the rules' longest interval."""
        longest = max(rate.interval_us for r in requests for rate in r.rule.rates)
        items = [refused_item(r.rule, longest, 0) for r in requests]
        return self._refusal([r.rule for r in requests], longest, items)

    def _refusal(self, refused: list[Rule], retry_in: int, items: list[Item]) -> Verdict:
        retry_after = whole_seconds(retry_in)
        self.stats.refused += 1
        names = ", ".join(repr(rule.name) for rule in refused)
        detail = f"Too Many Requests: rate limit {names} exceeded; retry after {retry_after} s"
        return Verdict(429, retry_after, items, detail)

    def _client(self, rule: Rule, client: str) -> RateLimiter:
        """The rule's limiter as ``client`` sees it (a PER_CLIENT rule's key)."""
        view = self._clients.get((rule.name, client))
        if view is None:
            try:
                view = self._limiters[rule.name].for_client(client)
            except InvalidArgumentError:  # text that is no client id (lone surrogates)
                return self._client(rule, UNKNOWN_CLIENT)
            if len(self._clients) >= _CLIENT_VIEWS:
                del self._clients[next(iter(self._clients))]  # the oldest
            self._clients[(rule.name, client)] = view
        return view

    # -- requests in flight ---------------------------------------------------------------------

    @property
    def holds_slots(self) -> bool:
        """Whether requests are served in a slot of a concurrency limiter (:meth:`slot`)."""
        return self._concurrency is not None

    @contextlib.asynccontextmanager
    async def slot(self, scope: Scope) -> AsyncIterator[Verdict | None]:
        """``async with gate.slot(scope) as refused:`` the request's slot of ``concurrency``,
        taken in FIFO order within ``wait`` and held (renewed; a lost one cancels the block,
        which then raises :class:`~aiolimit.LeaseLostError`) until the block ends, however it
        ends. ``refused`` is the verdict that answers the request instead (503: no slot in
        time, or the store failed and ``"deny"``), recorded as :func:`record` does; else
        None: held, or nothing to hold (no ``concurrency``; the store failed and ``"allow"``:
        served unlimited). Take it before :meth:`check`: permits are spent only on a request
        that can be served."""
        lease = await self._lease()
        if isinstance(lease, Verdict):
            await record(scope, lease)
            yield lease
        elif lease is None:
            yield None
        else:
            async with lease:
                yield None

    async def _lease(self) -> Lease | Verdict | None:
        """A slot's lease; the verdict that refuses the request; or None: nothing to hold."""
        concurrency = self._concurrency
        if concurrency is None:
            return None
        wait = self._max_wait
        try:
            lease = await concurrency.try_lease(
                timeout=None if wait is None else timedelta(microseconds=wait)
            )
        except LimiterError as exc:
            verdict = self.failed(exc)
            return None if verdict.status == 200 else verdict
        return self._busy(concurrency.name) if lease is None else lease

    def _busy(self, name: str) -> Verdict:
        """No slot of concurrency limiter ``name`` within the wait: 503, back in 1 s."""
        self.stats.busy += 1
        detail = f"Service Unavailable: {name!r} has too many requests in flight; retry after 1 s"
        return Verdict(503, 1, [], detail)

    # -- store failures -------------------------------------------------------------------------

    def failed(self, exc: LimiterError) -> Verdict:
        """The verdict when the store failed (``exc``): 503, or let through, as
        ``on_backend_error`` says; an outage is logged once, when it starts."""
        self.stats.backend_errors += 1
        if not self._failures:
            self.stats.outages += 1
            action = (
                "refusing requests (503)"
                if self._on_backend_error == "deny"
                else "letting requests through unlimited"
            )
            log.info("rate limits: the store failed (%s); %s until it answers", exc, action)
        self._failures += 1
        if self._on_backend_error == "allow":
            self.stats.allowed += 1
            return _ALLOWED
        seconds = self._error_retry_after
        detail = f"Service Unavailable: rate limits cannot be checked; retry after {seconds} s"
        return Verdict(503, seconds, [], detail)

    def _answered(self) -> None:
        self._failures = 0


def _grants_of(scope: Scope) -> list[tuple[Acquired, Sequence[_Request]]]:
    """The grants made for the request so far, by every middleware and dependency, with the
    rules' requests (the permits they took per rule)."""
    grants: list[tuple[Acquired, Sequence[_Request]]] = scope.setdefault(_GRANTS_KEY, [])
    return grants


def record_allowed(scope: Scope, verdict: Verdict) -> bool:
    """Notes an allowing verdict's fields and grants in the scope (:func:`record` without a
    coroutine); False for any other verdict, which :func:`record` notes."""
    if verdict.status != 200:
        return False
    items_of(scope).extend(verdict.items)
    if verdict.acquired is not None:
        _grants_of(scope).append((verdict.acquired, verdict.requests))
    return True


async def record(scope: Scope, verdict: Verdict) -> None:
    """Notes the verdict's fields and grants in the scope; a refusal hands back the grants
    that a middleware or dependency outside made for this request, so a request refused
    anywhere consumes nothing anywhere."""
    if record_allowed(scope, verdict):
        return
    items = items_of(scope)
    grants = _grants_of(scope)
    if grants:  # refused (429) or unchecked (503): the request is not served
        await asyncio.gather(*(acquired.release() for acquired, _ in grants))
        back = {r.rule.name: r.permits for _, requests in grants for r in requests}
        items[:] = [
            item._replace(remaining=item.remaining + back.get(item.rule.name, 0)) for item in items
        ]
        grants.clear()
    items.extend(verdict.items)
