"""settle.lua and sync.lua, step for step: a grant counted anew, a provider's count taken
as a floor (``Backend.settle``, ``Backend.sync``)."""

from __future__ import annotations

from .._protocol import RECEIPT_US, parse_grant
from ..base import Settlement
from ._algorithm import Group


def settle_group(group: Group, member: str, permits: int, now: int, max_debt: int) -> Settlement:
    """The grant ``member`` of the group's budget counts ``permits``: fewer hands back what
    of the difference still counts; more charges it at ``now``, down to ``max_debt`` below
    zero of the fewest permits left, the rest cut."""
    reserved = parse_grant(member)[0]
    if permits < reserved:
        back, settled = group.shrink(member, reserved - permits, now)
        return Settlement(back, 0, settled)
    extra = permits - reserved
    charged = max(0, min(extra, group.room(now) + max_debt))
    if charged == 0:
        return Settlement(0, 0, member, extra)
    return Settlement(0, charged, group.charge(member, charged, now), extra - charged)


def receipt_until(member: str, longest_us: int, now: int) -> int:
    """Until when a settled member's receipt is kept: while the grant could still count, and
    at least ``RECEIPT_US``, for a client library's resend."""
    return max(parse_grant(member)[1] + longest_us, now + RECEIPT_US)


def told_of(back: int, kept: int) -> int:
    """What of ``back`` permits handed back is told to other processes (settle.lua): the
    rest past ``kept`` when they cover it (a waiter of the settling process lacks ``kept``
    and takes them first), else all of them."""
    return back - kept if 0 < kept <= back else back
