"""Rules: which requests a limit applies to, what it counts by, and the permits a request
takes."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._types import Algorithm, Rate, RateLimiterConfig, RateType, accepted, rates_of
from .._values import check_name, shown, whole_seconds_up
from ..errors import InvalidArgumentError
from ._types import KeyFunc, PermitsFunc, Scope

__all__ = ["Rule", "route_path", "scope_key", "whole_seconds", "window"]


class Rule:
    """One limit on the requests it matches.

    >>> Rule("api-global", "1000/second")                          # one budget for everyone
    >>> Rule("api-per-client", "10/second; 100/minute", key=client_ip, paths=["/api/"])
    >>> Rule("uploads", [Rate(20, 60)], key=client_ip, methods=["POST"], permits=5)

    ``rates`` is text for :meth:`Rate.parse` or a sequence of :class:`Rate`. With a ``key``
    the rule is a ``PER_CLIENT`` limiter whose client id is ``key(scope)`` (None: the rule
    does not apply to this request); without one, ``OVERALL``. A key whose first parameter
    is annotated with Starlette's ``Request`` (``def api_key(request: Request) -> str |
    None``) is given the request made of the scope, as the FastAPI dependency gives it
    (:func:`scope_key`). ``paths`` are path prefixes,
    relative to the app's ``root_path`` as Starlette routes them (behind ``uvicorn
    --root-path /v1`` or ``Mount("/v1", app=RateLimitMiddleware(...))``, ``"/api/"``
    matches ``/v1/api/items``). ``methods`` are HTTP methods (a websocket connects with
    ``GET``; ``GET`` covers ``HEAD``, which frameworks answer with the GET route); None
    matches all. ``permits`` are what a request takes, or a callable of the scope (0:
    free). A callable that returns no int from 0 to
    the rule's rate is a bug of the app: :class:`~aiolimit.InvalidArgumentError` is raised
    (the server logs it and answers 500), never a 429 the client could not have avoided.
    ``algorithm`` None is the library's default. The name is the limiter's name, so a rule
    shares its budget with every process (and any ``RateLimiter``) of that name; it also
    names the rule's policy in the header fields, so it is printable ASCII.
    """

    __slots__ = ("algorithm", "key", "methods", "name", "paths", "permits", "rates", "windows")

    def __init__(
        self,
        name: str,
        rates: str | Rate | Sequence[Rate],
        *,
        key: KeyFunc | Callable[[Any], str | None] | None = None,
        paths: Iterable[str] | None = None,
        methods: Iterable[str] | None = None,
        permits: int | PermitsFunc = 1,
        algorithm: Algorithm | str | None = None,
    ) -> None:
        self.name = check_name(name)
        if not all(" " <= char <= "~" for char in name):
            raise InvalidArgumentError(
                f"a rule's name goes into the RateLimit header fields: printable ASCII only, "
                f"not {name!r}"
            )
        self.rates: tuple[Rate, ...] = rates_of(rates, None)
        self.windows = tuple(window(rate) for rate in self.rates)  # for the header fields
        if key is not None and not callable(key):
            raise InvalidArgumentError(f"key must be a callable of the scope, not {shown(key)}")
        self.key = None if key is None else scope_key(key)
        self.paths = None if paths is None else _strings(paths, "paths")
        if self.paths is not None and not all(p.startswith("/") for p in self.paths):
            raise InvalidArgumentError(f"paths are prefixes starting with '/', not {self.paths}")
        self.methods = None if methods is None else _methods(methods)
        if not callable(permits):
            _check_permits(permits, self)
        self.permits: int | PermitsFunc = permits
        """The permits a request takes, or the callable of the scope that says them."""
        try:
            self.algorithm = Algorithm.SLIDING_WINDOW if algorithm is None else Algorithm(algorithm)
        except ValueError:
            raise InvalidArgumentError(
                f"algorithm must be an Algorithm or the str {accepted(Algorithm)} (any "
                f"case), not {shown(algorithm)}"
            ) from None

    def __repr__(self) -> str:
        rates = "; ".join(str(rate) for rate in self.rates)
        return f"Rule({self.name!r}, {rates!r}, {self.rate_type.value})"

    @property
    def rate_type(self) -> RateType:
        return RateType.OVERALL if self.key is None else RateType.PER_CLIENT

    @property
    def config(self) -> RateLimiterConfig:
        """The config of the rule's limiter: its rates, rate type and algorithm; exact (a
        server counts the requests as they arrive: no margin, even for callers that wait)."""
        return RateLimiterConfig.build(
            self.rate_type, self.rates, algorithm=self.algorithm, margin=0
        )

    def matches(self, scope: Scope) -> bool:
        """Whether the request's path and method are this rule's (its key is not asked)."""
        if self.paths is not None:
            path = route_path(scope)
            if not any(path.startswith(prefix) for prefix in self.paths):
                return False
        if self.methods is not None:
            method = scope.get("method", "GET")  # a websocket handshake is a GET
            if method not in self.methods:
                return False
        return True

    def permits_of(self, scope: Scope) -> int:
        """The permits this request takes; InvalidArgumentError when a callable ``permits``
        returns no int from 0 to the rate (the app's error: no request could pass)."""
        if callable(self.permits):
            return _check_permits(self.permits(scope), self, "permits(scope) returned")
        return self.permits

    def policies(self) -> list[tuple[str, Rate]]:
        """The rule's quota policies for the header fields: one per rate, named after the
        rule (with the window in seconds when it has several rates)."""
        if len(self.rates) == 1:
            return [(self.name, self.rates[0])]
        return [(f"{self.name}-{window(rate)}s", rate) for rate in self.rates]


def scope_key(key: Callable[[Any], str | None]) -> KeyFunc:
    """``key`` as a key of the scope: one whose first parameter is annotated with Starlette's
    ``Request`` (or another ``HTTPConnection``: FastAPI's ``Request`` is Starlette's) is given
    a ``Request`` made of the scope; any other is given the scope. (Read from the annotation,
    without importing Starlette: a key annotated so was written where Starlette is.)"""
    try:
        parameters = list(inspect.signature(key, eval_str=True).parameters.values())
    except (TypeError, ValueError, NameError):  # no signature to read: a key of the scope
        return key
    wanted = parameters[0].annotation if parameters else None
    if not isinstance(wanted, type) or not any(
        base.__module__ == "starlette.requests" and base.__name__ == "HTTPConnection"
        for base in wanted.__mro__
    ):
        return key
    request = sys.modules["starlette.requests"].Request

    def key_of_scope(scope: Scope) -> str | None:
        return key(request(scope))

    return key_of_scope


def _strings(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise InvalidArgumentError(f"{what} must be a list of str, not {shown(values)}")
    return tuple(values)


def _methods(methods: Iterable[str]) -> frozenset[str]:
    names = frozenset(method.upper() for method in _strings(methods, "methods"))
    return names | {"HEAD"} if "GET" in names else names


def route_path(scope: Scope) -> str:
    """The path relative to ``root_path``, as Starlette's routing reads it (``scope["path"]``
    includes ``root_path`` in current servers and in a ``Mount``); ``"/"`` at the root."""
    path: str = scope.get("path", "")
    root_path: str = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if len(path) == len(root_path):
        return "/"
    return path[len(root_path) :] if path[len(root_path)] == "/" else path


def _check_permits(permits: object, rule: Rule, what: str = "permits are") -> int:
    """``permits`` when it is an int from 0 to the rule's rate; else InvalidArgumentError,
    which names the rule."""
    if isinstance(permits, bool) or not isinstance(permits, int) or permits < 0:
        raise InvalidArgumentError(
            f"rule {rule.name!r}: {what} {shown(permits)}; permits must be an int >= 0"
        )
    most = min(rate.permits for rate in rule.rates)
    if permits > most:
        raise InvalidArgumentError(
            f"rule {rule.name!r}: {what} {shown(permits)}, which exceeds the rate of the rule "
            f"({most}): no request could ever be granted"
        )
    return permits


def window(rate: Rate) -> int:
    """A rate's window in whole seconds (at least 1), for ``w``."""
    return max(1, whole_seconds_up(rate.interval_us))


def whole_seconds(us: int) -> int:
    """A wait in whole seconds, rounded up, at least 1: a client that comes back then finds
    the permits free."""
    return max(1, whole_seconds_up(us))
