"""A RedisBackend that records every grant it is given, for audits that trust only the callers.

>>> backend = RecordingBackend(redis, client_id="worker-1")
>>> limiter = RateLimiter("api", backend)
>>> with backend.request() as request:
...     await limiter.acquire(2)
>>> request.grant          # this call's grant: limiter time, permits, member, wall clocks
>>> backend.grants         # every grant, in order; a handed-back one is marked handed_back

Several backends may share one ``grants`` list (one per connection, as separate processes
would be). A grant handed back (a cancelled caller's, or any ``release`` of that exact
member) is marked, so that it is left out of an audit.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..backends import Attempt, Grant, RedisBackend

__all__ = ["GrantRecord", "RecordingBackend", "Request"]


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

    @property
    def stamp(self) -> tuple[int, int, int]:
        """For :func:`~aiolimit._tools.audit.busiest_window`: its limiter time and permits."""
        return self.time, self.time, self.permits


@dataclass
class Request:
    """What :meth:`RecordingBackend.request` collects: the grant made for the calls inside
    the block (the last one, if several were)."""

    grant: GrantRecord | None = None


_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "aiolimit_recorded_request", default=None
)


class RecordingBackend(RedisBackend):
    """Records each grant's limiter time, permits, member and wall clocks, and hand-backs."""

    def __init__(self, redis: Any, grants: list[GrantRecord] | None = None, **options: Any) -> None:
        super().__init__(redis, **options)
        self.grants: list[GrantRecord] = [] if grants is None else grants

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
            record = GrantRecord(
                name, permits, attempt.starts_at, attempt.member, sent, time.time()
            )
            self.grants.append(record)
            request = _REQUEST.get()
            if request is not None:
                request.grant = record
        return attempt

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        released = await super().release(name, permits, member)
        if released and member is not None:
            for record in reversed(self.grants):
                if record.member == member and record.name == name and not record.handed_back:
                    record.handed_back = True
                    break
        return released
