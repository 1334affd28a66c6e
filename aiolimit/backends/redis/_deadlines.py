"""The deadlines of callers waiting for Redis's replies: each fails at its own backend's
``timeout`` with ``BackendError``, whichever backends share the client and its round trips.

One timer per timeout in use, not one per call: the callers of one timeout wait in the order
they called, so their deadlines come in that order too, and one timer at the first of them
serves all of them (a timer per call costs far more; replies mostly come in the order calls
went out). Callers of another timeout (a middleware's short one beside an app's default) have
a queue and a timer of their own, so a short deadline never waits behind a long one.

A backend finds its timeout's queue once (``Coalescer.deadlines``) and hands it to each call:
no lookup per call. A client's queues are held by the backends using them (and by the timer
while callers wait): a timeout no backend uses any more leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from datetime import timedelta
from typing import Any

from ..._values import Duration
from ...errors import BackendError, InvalidArgumentError
from ._request import Operation

__all__ = ["Deadlines", "call_timeout"]


class Deadlines:
    """The callers of one ``timeout`` (seconds) still waiting, first come first, and a timer
    at the first one's deadline. A caller that stops waiting is a cancelled caller: its
    future is done, so its reply, when it comes, goes where a cancelled caller's goes (a
    grant is handed back); the round trip itself runs on."""

    __slots__ = ("__weakref__", "_loop", "_timer", "_waiting", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._waiting: deque[tuple[float, asyncio.Future[Any], Operation]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def add(
        self, future: asyncio.Future[Any], operation: Operation, loop: asyncio.AbstractEventLoop
    ) -> None:
        """``future`` fails ``timeout`` seconds from now unless it is done by then."""
        waiting = self._waiting
        if self._loop is not loop:
            # A timer left by a loop that ended (``asyncio.run`` after ``asyncio.run``) would
            # never run on this one; that loop's callers are gone with it.
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            waiting.clear()
            self._loop = loop
        while waiting and waiting[0][1].done():
            waiting.popleft()
        waiting.append((loop.time() + self.timeout, future, operation))
        if self._timer is None:
            self._timer = loop.call_at(waiting[0][0], self._give_up)

    def _give_up(self) -> None:
        """Fails the callers whose deadline has passed, then waits for the next deadline."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = self._waiting
        while waiting:
            deadline, future, operation = waiting[0]
            if not future.done():
                if deadline > now:
                    self._timer = loop.call_at(deadline, self._give_up)
                    return
                future.set_exception(
                    BackendError(f"no reply from Redis within {self.timeout} s ({operation.what})")
                )
            waiting.popleft()


def call_timeout(timeout: Duration | None) -> float | None:
    """A backend's ``timeout`` (seconds or timedelta, > 0) as seconds; None (or infinity):
    no bound of the backend's own."""
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is None or timeout == math.inf:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"timeout must be seconds > 0 or None, not {timeout!r}")
    return float(timeout)
