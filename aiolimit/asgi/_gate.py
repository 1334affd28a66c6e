"""The check of a request against rules, shared by the middleware and the FastAPI dependency."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

from .._limiter import RateLimiter
from .._types import shown, to_micros
from ..backends.base import Backend, Grant, Refusal
from ..errors import InvalidArgumentError, LimiterError, NotConfiguredError
from ._addresses import UNKNOWN_CLIENT
from ._fields import Item, granted_items, header_fields, items_of, refused_item
from ._rules import Rule, whole_seconds, window
from ._types import Scope

__all__ = ["Gate", "RateLimitStats", "Verdict", "record", "refusal_headers"]

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
    outages: int = 0
    """Runs of store failures: each is logged once, when it starts."""


class _Request(NamedTuple):
    rule: Rule
    backend: Backend  # the store, seen by the request's client for a per-client rule
    cost: int


class Verdict(NamedTuple):
    status: int  # 200 allowed, 429 refused, 503 the store failed
    retry_after: int
    items: list[Item]
    detail: str
    grants: list[tuple[_Request, Grant]] = []  # noqa: RUF012 - never changed


_ALLOWED = Verdict(200, 0, [], "")


class Gate:
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
        self._error_retry_after = whole_seconds(retry_us)
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

    async def check(self, scope: Scope) -> Verdict:
        requests = []
        for rule in self.rules:
            if not rule.matches(scope):
                continue
            backend = self._backend
            if rule.key is not None:
                client = rule.key(scope)
                if client is None:
                    continue
                backend = self._client(client or UNKNOWN_CLIENT)
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
            retry_after = max(whole_seconds(a.retry_in) for _, a in refused)
            items = [
                refused_item(r.rule, a.retry_in)
                if isinstance(a, Refusal)
                else Item(r.rule, max(a.left + r.cost, 0), window(r.rule.rates[0]))
                for r, a in pairs
            ]
            self.stats.refused += 1
            names = ", ".join(repr(r.rule.name) for r, _ in refused)
            detail = f"Too Many Requests: rate limit {names} exceeded; retry after {retry_after} s"
            return Verdict(429, retry_after, items, detail)

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
        items = await granted_items([(r.rule, r.backend, g.left) for r, g in grants])
        return Verdict(200, 0, items, "", grants)

    def _client(self, client: str) -> Backend:
        """The backend's view for ``client`` (a PER_CLIENT rule's key)."""
        view = self._clients.get(client)
        if view is None:
            try:
                view = self._backend.with_client(client)
            except InvalidArgumentError:  # text that is no client id (lone surrogates)
                return self._client(UNKNOWN_CLIENT)
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

    def _failed(self, exc: LimiterError) -> Verdict:
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
        return Verdict(503, seconds, [], detail)

    def _answered(self) -> None:
        if self._failures:
            log.warning(
                "rate limits: the store answers again, after %d failed requests", self._failures
            )
            self._failures = 0


def _grants_of(scope: Scope) -> list[tuple[_Request, Grant]]:
    """The grants made for the request so far, by every middleware and dependency."""
    grants: list[tuple[_Request, Grant]] = scope.setdefault(_GRANTS_KEY, [])
    return grants


async def record(scope: Scope, verdict: Verdict) -> None:
    """Notes the verdict's fields and grants in the scope; a refusal hands back the grants
    that a middleware or dependency outside made for this request, so a request refused
    anywhere consumes nothing anywhere."""
    items = items_of(scope)
    grants = _grants_of(scope)
    if verdict.status == 200:
        items.extend(verdict.items)
        grants.extend(verdict.grants)
        return
    if grants:  # refused (429) or unchecked (503): the request is not served
        await Gate._hand_back(grants)
        back = {request.rule.name: request.cost for request, _ in grants}
        items[:] = [
            item._replace(remaining=item.remaining + back.get(item.rule.name, 0)) for item in items
        ]
        grants.clear()
    items.extend(verdict.items)


def refusal_headers(verdict: Verdict, scope: Scope, legacy: bool) -> list[tuple[bytes, bytes]]:
    return [
        (b"retry-after", str(verdict.retry_after).encode()),
        *header_fields(items_of(scope), legacy),
    ]
