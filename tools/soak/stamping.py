"""A RedisBackend that notes the grant made for each request, for an audit that trusts only
the callers (the soak's workers; the tests' ``RecordingBackend`` keeps every grant too).

>>> backend = StampingBackend(redis, client_id="worker-1")
>>> limiter = RateLimiter("api", backend)
>>> with backend.request() as request:
...     await limiter.acquire(2)
>>> request.grant          # this call's grant: limiter time, permits, member, wall clocks
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass

from aiolimit.backends import Attempt, Grant, RedisBackend

__all__ = ["GrantRecord", "Request", "StampingBackend"]


@dataclass
class GrantRecord:
    """One granted attempt. Wall clocks are ``time.time()`` seconds."""

    name: str
    permits: int
    time: int
    """When the grant starts, in microseconds of the limiter's clock (``Grant.starts_at``)."""
    member: str
    sent: float
    """Wall clock just before the call that granted."""
    replied: float
    """Wall clock when its reply arrived."""
    handed_back: bool = False
    """Whether it was handed back (the tests' ``RecordingBackend`` marks it)."""

    @property
    def stamp(self) -> tuple[int, int, int]:
        """For :func:`~tools.audit.busiest_window`: its limiter time and permits."""
        return self.time, self.time, self.permits


@dataclass
class Request:
    """What :meth:`StampingBackend.request` collects: the grant made for the calls inside
    the block (the last one, if several were)."""

    grant: GrantRecord | None = None


_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "aiolimit_recorded_request", default=None
)


class StampingBackend(RedisBackend):
    """Notes the grant made for each request (:meth:`request`): its limiter time, permits,
    member and this process's wall clock around the call that granted it."""

    @contextlib.contextmanager
    def request(self) -> Iterator[Request]:
        """Notes the grant made for the limiter calls inside the block, in this task."""
        request = Request()
        token = _REQUEST.set(request)
        try:
            yield request
        finally:
            _REQUEST.reset(token)

    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Attempt:
        sent = time.time()
        attempt = await super().try_acquire(name, permits, max_wait_us)
        if isinstance(attempt, Grant):
            self.granted(
                GrantRecord(name, permits, attempt.starts_at, attempt.member, sent, time.time())
            )
        return attempt

    def granted(self, record: GrantRecord) -> None:
        """A grant was made: noted for the request under way in this task, if any."""
        request = _REQUEST.get()
        if request is not None:
            request.grant = record
