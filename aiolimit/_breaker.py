"""The circuit breaker of a limiter's calls: after the store failed, calls fail at once.

>>> backend = MemoryBackend(breaker=BreakerPolicy(first_backoff=0.2, max_backoff=5))
>>> aiolimit.breaker_of(backend, "partner-api").is_open     # one limiter's breaker

Without it, every call during an outage pays the whole failure time (a connection timeout,
the Redis client's own reconnect attempts: up to seconds each), and a web app's requests pile
up behind it. With it, the first failure opens the breaker for ``first_backoff`` seconds:
calls in that time raise :class:`~aiolimit.BackendError` at once, without asking the store.
Then one call (the probe) asks; while it is under way the others still fail at once. When the
probe succeeds, the breaker closes; when it fails, the back-off doubles, up to
``max_backoff``. The back-offs are the backend's option (:class:`BreakerPolicy`). It guards
the permit path (``try_acquire``, ``acquire_all``, the middleware, the decorator, the HTTP
clients, ``release``) and the config calls (``try_set_rate``, ``set_rate``, ``update_rate``,
``ensure_rate``, ``get_config``). Each limiter name on a backend has one breaker, shared by its
limiter objects and the backend's ``with_client`` views, and charged only with the failures
of that name's own calls: in an ``acquire_all`` over several stores, a store that fails opens
the breakers of its limiters alone. Only an outage opens it (a ``BackendError`` whose
``outage`` is true: the store unreachable, timed out, or answering that it cannot serve now);
a store that answers, with ``NotConfiguredError`` or an error about the call (a key holding
foreign data, a refused command), is up.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import weakref
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .errors import BackendError, InvalidArgumentError

__all__ = ["DEFAULT_POLICY", "Breaker", "BreakerPolicy", "Breakers", "charge", "enter_all"]

log = logging.getLogger("aiolimit")

_T = TypeVar("_T")


@dataclass(frozen=True)
class BreakerPolicy:
    """The back-offs of a backend's circuit breakers, in seconds: a backend's ``breaker``
    option.

    >>> RedisBackend(redis, breaker=BreakerPolicy(first_backoff=0.2, max_backoff=5))
    >>> MemoryBackend(breaker=BreakerPolicy(first_backoff=0))     # never fail fast
    """

    first_backoff: float = 0.5
    """Seconds calls fail at once after the first failure (0: the breaker is off)."""
    max_backoff: float = 10.0
    """The longest back-off, after failed probes doubled it."""

    def __post_init__(self) -> None:
        for what in ("first_backoff", "max_backoff"):
            value = getattr(self, what)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value < math.inf
            ):
                raise InvalidArgumentError(f"{what} must be seconds >= 0, not {value!r}")
            object.__setattr__(self, what, float(value))


DEFAULT_POLICY = BreakerPolicy()


class Breaker:
    """See the module: fails calls at once for a growing back-off after a failure."""

    __slots__ = (
        "__weakref__",
        "_backoff",
        "_failure",
        "_loop",
        "_open_until",
        "_probing",
        "failed_fast",
        "policy",
    )

    def __init__(self, policy: BreakerPolicy = DEFAULT_POLICY) -> None:
        if not isinstance(policy, BreakerPolicy):
            raise InvalidArgumentError(f"policy must be a BreakerPolicy, not {policy!r}")
        self.policy = policy
        """Its back-offs (its backend's ``breaker`` option)."""
        self.failed_fast = 0
        """Calls failed at once, without asking the store, in the outage under way."""
        self._backoff = 0.0
        self._open_until: float | None = None  # loop time; None: closed
        self._probing = False
        self._failure: BackendError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def first_backoff(self) -> float:
        """Seconds calls fail at once after the first failure (0: the breaker is off)."""
        return self.policy.first_backoff

    @property
    def max_backoff(self) -> float:
        """The longest back-off, after failed probes doubled it."""
        return self.policy.max_backoff

    @property
    def is_open(self) -> bool:
        """Whether calls fail at once now (an outage is under way)."""
        return self._open_until is not None

    def enter(self) -> None:
        """Before a call: raises ``BackendError`` at once while the breaker is open, except
        for one call (the probe) once the back-off has passed."""
        if self._open_until is None:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a breaker opened on another event loop: start afresh
            self._close()
            return
        now = loop.time()
        if now >= self._open_until and not self._probing:
            self._probing = True
            return
        self.failed_fast += 1
        left = max(self._open_until - now, 0.0)
        raise BackendError(
            f"the store failed {self._backoff - left:.2f} s ago ({self._failure}); calls fail "
            f"at once for {left:.2f} s more, then one call asks again"
        ) from (self._failure.__cause__ or self._failure if self._failure else None)

    async def guard(self, call: Awaitable[_T]) -> _T:
        """Awaits ``call`` (a call to the store) through the breaker: every call to the store
        goes through here. (While it is closed, the common case, nothing else is called.)"""
        if self._open_until is not None:
            try:
                self.enter()
            except BackendError:
                if inspect.iscoroutine(call):
                    call.close()  # never sent
                # Failing fast still yields: else a caller retrying at once in a loop would
                # hold the event loop for the whole back-off.
                await asyncio.sleep(0)
                raise
        try:
            result = await call
        except BackendError as exc:
            self.failed(exc)
            raise
        except BaseException:
            self.left()
            raise
        if self._open_until is not None:  # (answered)
            self._close()
        return result

    def answered(self) -> None:
        """After a call the store answered."""
        if self._open_until is not None:
            self._close()

    def failed(self, error: BackendError) -> None:
        """After a call the store failed: open, or stay open for twice as long. A store that
        answered with an error (``error.outage`` false: a refused command) is up: that
        closes it."""
        if not error.outage:
            self.answered()
            return
        policy = self.policy
        if policy.first_backoff <= 0:
            return
        loop = asyncio.get_running_loop()
        if self._open_until is None or loop is not self._loop:
            self._backoff = policy.first_backoff
        elif self._probing:
            self._backoff = min(self._backoff * 2, policy.max_backoff)
        else:
            return  # a call sent before the breaker opened: the back-off stands
        self._loop = loop
        self._open_until = loop.time() + self._backoff
        self._probing = False
        self._failure = error
        self._opened(self._open_until + policy.max_backoff)
        log.debug("circuit breaker: calls fail at once for %.2f s (%s)", self._backoff, error)

    def left(self) -> None:
        """After a call that ended otherwise (cancelled): a probe may go again."""
        self._probing = False

    def _close(self) -> None:
        self._open_until = None
        self._probing = False
        self._failure = None
        self._backoff = 0.0
        self.failed_fast = 0
        self._closed()

    def _opened(self, stale_at: float) -> None:
        """It opened (or stays open longer); from ``stale_at`` on (loop time), nothing but
        the back-off's length is left to remember (the next call probes anyway)."""

    def _closed(self) -> None:
        """It closed."""


def enter_all(breakers: Sequence[Breaker]) -> list[Breaker]:
    """``breakers`` (of the limiters of one call), each entered once; when one is open, the
    others entered are left as they were (nothing was sent: a probe one of them would have
    made goes with the next call) and its error raised."""
    entered: list[Breaker] = []
    for breaker in breakers:
        if breaker in entered:  # (a limiter's views share its breaker)
            continue
        try:
            breaker.enter()
        except BaseException:
            for other in entered:
                other.left()
            raise
        entered.append(breaker)
    return entered


def charge(breakers: Sequence[Breaker], outcomes: Sequence[object]) -> None:
    """The breakers of a call in which some limiter failed (one per limiter, with its
    outcome), each by what its own limiters got: an outage of theirs charges it (the limiters
    of a store that failed are all charged, a limiter on another store is not); an answer (a
    grant, a refusal, an error the store answered with) closes it; anything else (an
    argument refused before sending) only lets the next call probe."""
    answered: dict[Breaker, BackendError | None] = {}  # the outage it is charged with, if any
    for breaker, outcome in zip(breakers, outcomes, strict=True):
        if isinstance(outcome, BackendError) and outcome.outage:
            answered[breaker] = outcome
        elif isinstance(outcome, BackendError) or not isinstance(outcome, BaseException):
            answered.setdefault(breaker, None)
    for breaker in dict.fromkeys(breakers):
        if breaker not in answered:
            breaker.left()
        elif (outage := answered[breaker]) is not None:
            breaker.failed(outage)
        else:
            breaker.answered()


class Breakers:
    """The breakers of one backend (and its ``with_client`` views), by limiter name, each
    with the backend's policy. A breaker is shared while anything holds it (a limiter object,
    a view) and kept here while it is open; an idle one (closed: there is nothing to
    remember) that nobody holds is dropped. So however many names a process uses, what is
    kept is bounded by its live limiters and its names failing now."""

    __slots__ = ("_kept", "_kept_most", "_named", "policy")

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        # (made at first use: a backend's with_client views share their backend's)
        self._named: weakref.WeakValueDictionary[str, Breaker] | None = None
        # The open ones, kept even when nobody holds them, with when they go stale.
        self._kept: dict[str, tuple[Breaker, float]] = {}
        self._kept_most = _KEPT_MOST

    def get(self, name: str) -> Breaker:
        """The breaker of limiter ``name`` (made on first use)."""
        named = self._named
        if named is None:
            named = self._named = weakref.WeakValueDictionary()
        breaker = named.get(name)
        if breaker is None:
            breaker = named[name] = _Kept(self.policy, self, name)
        return breaker

    def keep(self, name: str, breaker: Breaker, stale_at: float) -> None:
        """``breaker`` of ``name`` has opened: kept until it closes, or until ``stale_at``
        (loop time) once many are kept."""
        self._kept[name] = (breaker, stale_at)
        if len(self._kept) >= self._kept_most:
            now = asyncio.get_running_loop().time()
            self._kept = {n: kept for n, kept in self._kept.items() if now < kept[1]}
            self._kept_most = max(_KEPT_MOST, 2 * len(self._kept))

    def forget(self, name: str, breaker: Breaker) -> None:
        """``breaker`` of ``name`` has closed: only its holders keep it now."""
        kept = self._kept.get(name)
        if kept is not None and kept[0] is breaker:
            del self._kept[name]


class _Kept(Breaker):
    """A backend's breaker of one name: its registry keeps it while it is open."""

    __slots__ = ("_keeper", "_name")

    def __init__(self, policy: BreakerPolicy, keeper: Breakers, name: str) -> None:
        super().__init__(policy)
        self._keeper = keeper
        self._name = name

    def _opened(self, stale_at: float) -> None:
        self._keeper.keep(self._name, self, stale_at)

    def _closed(self) -> None:
        self._keeper.forget(self._name, self)


# Open breakers a backend keeps before it drops those long past their back-off (when every
# one is failing now, it keeps them all, and looks again at twice as many).
_KEPT_MOST = 4096
