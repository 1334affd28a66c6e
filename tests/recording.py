"""A RedisBackend that records every grant it is given, for audits that trust only the callers.

>>> backend = RecordingBackend(redis, client_id="worker-1")
>>> limiter = RateLimiter("api", backend)
>>> with backend.request() as request:
...     await limiter.acquire(2)
>>> request.grant          # this call's grant: limiter time, permits, member, wall clocks
>>> backend.grants         # every grant, in order; a handed-back one is marked handed_back

Several backends may share one ``grants`` list (one per connection, as separate processes
would be). A grant handed back (a cancelled caller's, or any ``release`` of that exact
member) is marked, so that it is left out of an audit. The soak tool's workers note their
grants with the same ``StampingBackend``.
"""

from __future__ import annotations

from typing import Any

from tools.soak.stamping import GrantRecord, Request, StampingBackend

__all__ = ["GrantRecord", "RecordingBackend", "Request"]


class RecordingBackend(StampingBackend):
    """Records each grant's limiter time, permits, member and wall clocks, and hand-backs."""

    def __init__(self, redis: Any, grants: list[GrantRecord] | None = None, **options: Any) -> None:
        super().__init__(redis, **options)
        self.grants: list[GrantRecord] = [] if grants is None else grants

    def granted(self, record: GrantRecord) -> None:
        self.grants.append(record)
        super().granted(record)

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        released = await super().release(name, permits, member)
        if released and member is not None:
            for record in reversed(self.grants):
                if record.member == member and record.name == name and not record.handed_back:
                    record.handed_back = True
                    break
        return released
