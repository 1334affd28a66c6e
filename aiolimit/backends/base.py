from __future__ import annotations

import abc
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from .._types import RateLimiterConfig

__all__ = ["Attempt", "Backend", "SetMode"]

SetMode = Literal["try", "set", "update"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one acquire attempt returned. Times are microseconds of the limiter's clock."""

    granted: bool
    wait: int
    """Refused: time until enough permits for this request are free. Granted: 0."""
    left: int
    """Permits left in the window after the attempt (negative after a rate was lowered)."""
    next_free: int
    """Granted with nothing left: time until another permit frees. Otherwise 0."""
    time: int
    """When the attempt was decided (grant time for a grant)."""
    grant: str | None = None
    """The grant's log entry, to hand back this exact grant."""


class Backend(abc.ABC):
    """Where limiter state lives. The algorithm is the same in every backend.

    Subclasses implement the operations for one client id; ``with_client`` returns a view of
    the same store for another client id (its own ``PER_CLIENT`` budget).
    """

    __slots__ = ("__weakref__", "_queues", "client_id")

    def __init__(self, client_id: str | None) -> None:
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ValueError("client_id must be a non-empty str")
        self.client_id: str = client_id or uuid.uuid4().hex
        # Local FIFO of waiting tasks per limiter name, shared by every RateLimiter object
        # on this backend; an entry lives as long as some limiter uses it.
        self._queues: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

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
    async def try_acquire(self, name: str, permits: int) -> Attempt:
        """One attempt; raises NotConfiguredError, InvalidArgumentError (permits > rate).

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

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Releases resources the backend owns (nothing by default)."""
