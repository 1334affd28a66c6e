"""The circuit breaker of a limiter's calls: after the store failed, calls fail at once.

>>> aiolimit.breaker_of(backend).max_backoff = 5.0      # seconds; the default is 10
>>> aiolimit.breaker_of(backend).first_backoff = 0      # 0: never fail fast
>>> limiter = RateLimiter("partner-api", backend)       # (set them before making limiters)

Without it, every call during an outage pays the whole failure time (a connection timeout,
the Redis client's own reconnect attempts: up to seconds each), and a web app's requests pile
up behind it. With it, the first failure opens the breaker for ``first_backoff`` seconds:
calls in that time raise :class:`~aiolimit.BackendError` at once, without asking the store.
Then one call (the probe) asks; while it is under way the others still fail at once. When the
probe succeeds, the breaker closes; when it fails, the back-off doubles, up to
``max_backoff``. It guards the permit path (``try_acquire``, ``acquire_all``, the middleware,
the decorator, the HTTP clients) and the config calls (``try_set_rate``, ``set_rate``,
``update_rate``, ``ensure_rate``, ``get_config``). Each limiter name on a backend has one
breaker, shared by its limiter objects and their ``for_client`` views. Only an outage opens
it (a ``BackendError`` where the store did not answer: unreachable, timed out); a store that
answers, with ``NotConfiguredError`` or a refused command, is up.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Awaitable
from typing import TypeVar

from .backends.base import Backend
from .errors import BackendError, InvalidArgumentError

__all__ = ["Breaker", "breaker_of"]

log = logging.getLogger("aiolimit")

_T = TypeVar("_T")

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0


class Breaker:
    """See the module: fails calls at once for a growing back-off after a failure."""

    __slots__ = (
        "_backoff",
        "_failure",
        "_loop",
        "_open_until",
        "_probing",
        "failed_fast",
        "first_backoff",
        "max_backoff",
    )

    def __init__(self, first_backoff: float = FIRST_BACKOFF, max_backoff: float = MAX_BACKOFF):
        for what, value in (("first_backoff", first_backoff), ("max_backoff", max_backoff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidArgumentError(f"{what} must be seconds >= 0, not {value!r}")
        self.first_backoff = float(first_backoff)
        """Seconds calls fail at once after the first failure (0: the breaker is off)."""
        self.max_backoff = float(max_backoff)
        """The longest back-off, after failed probes doubled it."""
        self.failed_fast = 0
        """Calls failed at once, without asking the store, in the outage under way."""
        self._backoff = 0.0
        self._open_until: float | None = None  # loop time; None: closed
        self._probing = False
        self._failure: BackendError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

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
        """Awaits ``call`` (a call to the store) through the breaker."""
        try:
            self.enter()
        except BackendError:
            if inspect.iscoroutine(call):
                call.close()  # never sent
            raise
        try:
            result = await call
        except BackendError as exc:
            self.failed(exc)
            raise
        except BaseException:
            self.left()
            raise
        self.answered()
        return result

    def answered(self) -> None:
        """After a call the store answered."""
        if self._open_until is not None:
            self._close()

    def failed(self, error: BackendError) -> None:
        """After a call the store failed: open, or stay open for twice as long. A store that
        answered with an error (a refused command) is up: that closes it."""
        if not is_outage(error):
            self.answered()
            return
        if self.first_backoff <= 0:
            return
        loop = asyncio.get_running_loop()
        if self._open_until is None or loop is not self._loop:
            self._backoff = self.first_backoff
        elif self._probing:
            self._backoff = min(self._backoff * 2, self.max_backoff)
        else:
            return  # a call sent before the breaker opened: the back-off stands
        self._loop = loop
        self._open_until = loop.time() + self._backoff
        self._probing = False
        self._failure = error
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


def is_outage(error: BackendError) -> bool:
    """Whether ``error`` says the store did not answer (unreachable, timed out), rather than
    answered with an error (a Redis ``ResponseError``: a refused command, a wrong key type):
    only the first opens the breaker. A backend's own ``BackendError`` without a cause from
    the client library counts as an outage."""
    cause = error.__cause__
    while cause is not None:
        if any(kind.__name__ == "ResponseError" for kind in type(cause).__mro__):
            return False
        cause = cause.__cause__
    return True


_breakers: weakref.WeakKeyDictionary[Backend, dict[str | None, Breaker]] = (
    weakref.WeakKeyDictionary()
)
_NAMES_MOST = 4096  # breakers kept per backend: the most recently made


def breaker_of(backend: Backend, name: str | None = None) -> Breaker:
    """The circuit breaker of limiter ``name`` on ``backend`` (made on first use), shared by
    every limiter object of that name on the backend and their ``for_client`` views.

    Each name has its own, so a failing node of a cluster (or shard) does not fail the
    others' calls; a new one starts with the back-offs of the backend's (``name`` None):
    set those to change the back-off of the limiters made afterwards."""
    if not isinstance(backend, Backend):
        raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
    breakers = _breakers.get(backend)
    if breakers is None:
        breakers = _breakers[backend] = {None: Breaker()}
    breaker = breakers.get(name)
    if breaker is None:
        first = breakers[None]
        if len(breakers) > _NAMES_MOST:
            del breakers[next(key for key in breakers if key is not None)]  # the oldest
        breaker = breakers[name] = Breaker(first.first_backoff, first.max_backoff)
    return breaker
