from __future__ import annotations

import abc
import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Literal

from .._types import RateLimiterConfig, check_text

__all__ = ["Attempt", "Backend", "SetMode"]

log = logging.getLogger("aiolimit")

# Hand-backs in progress, referenced so they are not garbage collected.
_hand_backs: set[asyncio.Future[int]] = set()


def _hand_back_done(task: asyncio.Future[int]) -> None:
    _hand_backs.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning(
            "could not hand back the grant of a cancelled caller", exc_info=task.exception()
        )


SetMode = Literal["try", "set", "update"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one acquire attempt returned. Times are microseconds of the limiter's clock."""

    granted: bool
    wait: int
    """Granted: time until the grant starts (0: now; more: a reservation to sleep out).
    Refused: time until enough permits for this request would be free."""
    left: int
    """Permits left after the attempt (negative while reservations are queued)."""
    time: int
    """Granted: when the grant starts (its log entry's score). Refused: when it was decided."""
    grant: str | None = None
    """The grant's log entry, to hand back exactly this grant."""


class Backend(abc.ABC):
    """Where limiter state lives. The algorithm is the same in every backend.

    Subclasses implement the operations for one client id; ``with_client`` returns a view of
    the same store for another client id (its own ``PER_CLIENT`` budget).
    """

    __slots__ = ("__weakref__", "client_id")

    def __init__(self, client_id: str | None) -> None:
        self.client_id: str = (
            uuid.uuid4().hex if client_id is None else check_text(client_id, "client_id")
        )

    @abc.abstractmethod
    def with_client(self, client_id: str) -> Backend:
        """The same store seen by another client id (for ``PER_CLIENT`` limiters)."""

    @abc.abstractmethod
    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        """Writes the config; returns False when ``mode`` says not to (see ``set_rate.lua``)."""

    @abc.abstractmethod
    async def get_config(self, name: str) -> RateLimiterConfig | None: ...

    @abc.abstractmethod
    async def try_acquire(self, name: str, permits: int, max_wait: int = 0) -> Attempt:
        """One attempt; raises NotConfiguredError, InvalidArgumentError (permits > rate).

        When the permits are not free now but will be within ``max_wait`` microseconds
        (``-1``: any wait), they are reserved: granted with ``wait`` > 0, starting then.

        If the caller is cancelled while the attempt is in flight and it grants, the backend
        hands that exact grant back, so a cancelled caller never holds permits.
        """

    @abc.abstractmethod
    async def available_permits(self, name: str) -> int: ...

    @abc.abstractmethod
    async def release(self, name: str, permits: int, grant: str | None = None) -> int:
        """Hands back ``permits`` from the newest grants, or exactly ``grant``; returns how many."""

    @abc.abstractmethod
    async def delete(self, name: str) -> bool: ...

    @abc.abstractmethod
    async def expire(self, name: str, ttl_us: int) -> bool: ...

    @abc.abstractmethod
    async def clear_expire(self, name: str) -> bool: ...

    def hand_back(self, name: str, grant: str) -> None:
        """Releases exactly ``grant`` in the background: the grant of a caller that was
        cancelled before it could use it. A failure is logged, never raised."""
        permits = int(grant.partition(":")[0])
        task = asyncio.ensure_future(self.release(name, permits, grant))
        _hand_backs.add(task)
        task.add_done_callback(_hand_back_done)

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Releases resources the backend owns (nothing by default)."""
