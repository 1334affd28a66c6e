"""How a paced waiter of this process hears of permits handed back elsewhere (``_pacing``):
``settle.lua`` and ``release.lua`` publish ``"<permits> <origin>"`` on the limiter's refund
channel ``T:refunded`` when they hand permits back and are given an origin (the caller's
:func:`origin`; none for a ``PER_CLIENT`` budget or a cluster client); a process with a
paced waiter listens on the one pub/sub connection its lease waiters use (``_wakeups``).
A message nobody hears costs the server one channel lookup; a lost one is seen at the
waiter's next ask."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._types import RateType
from .._context import Background
from .._lease import process_id
from ._compat import is_cluster
from ._keys import Keys
from ._leases import subscriber_of

__all__ = ["channel_of", "origin", "watch"]


def channel_of(keys: Keys) -> str:
    """The limiter's refund channel (under its hash tag, as its keys)."""
    return f"{keys.tag}:refunded"


def origin(redis: Any, client_id: str, rate_type: RateType) -> str:
    """What a settle or release of this client sends as its origin: its process and client
    (whose own waiters heard the refund in its reply), or '' to tell no one."""
    if rate_type is RateType.PER_CLIENT or is_cluster(redis):
        return ""
    return f"{process_id()}:{client_id}"


def watch(
    redis: Any, channel: str, mine: str, heard: Callable[[int], None], tasks: Background
) -> Callable[[], None] | None:
    """``heard(permits)`` for each refund on ``channel`` from an origin other than ``mine``,
    until the function returned is called; None where this client cannot subscribe."""
    if is_cluster(redis):
        return None
    subscriber = subscriber_of(redis)
    if subscriber.refused:
        return None
    own = mine.encode()

    def told(data: Any) -> None:
        text = data.encode() if isinstance(data, str) else data
        permits, _, sender = text.partition(b" ")
        if sender != own and permits.isdigit():
            heard(int(permits))

    return subscriber.watch(channel, told, tasks)
