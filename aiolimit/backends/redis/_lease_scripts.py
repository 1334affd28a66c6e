"""The concurrency limiters' scripts (``lua/lease_*.lua`` on ``lease_lib.lua``) and what
their replies mean."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from .._lease import ConcurrencyConfig, LeaseGrant, LeaseHolder, LeaseRefusal, LeaseSnapshot
from .._lease import parse_lease as parse_lease
from .._protocol import MAX_BATCH
from ._compat import text_of as _text
from ._request import Batch
from ._script import ReadCommand, Script
from ._wakeups import hand_over

__all__ = ["CONFIG", "TAKE", "OverLimit", "Released", "Unset"]


class Unset:
    """The limiter has no limit set."""


class OverLimit(int):
    """More permits than the limit (the limit)."""


def _taken(reply: Any) -> LeaseGrant | LeaseRefusal | Unset | OverLimit:
    code = int(reply[0])
    if code == 0:
        return LeaseGrant(_text(reply[1]), int(reply[2]))
    if code == 1:
        retry, ahead = int(reply[1]), int(reply[3])
        return LeaseRefusal(
            None if retry < 0 else retry, int(reply[2]), None if ahead < 0 else ahead, int(reply[4])
        )
    if code == -1:
        return Unset()
    if code == -2:
        return OverLimit(int(reply[1]))
    raise ValueError(f"reply code {code}")


class Released(NamedTuple):
    held: bool
    """Whether the lease was held until the release."""
    handed: list[tuple[str, LeaseGrant]]
    """The leases the release granted to waiters of the caller's process, by ticket."""


def _released(reply: Any) -> Released:
    if len(reply) < 2:
        return Released(int(reply[0]) == 1, [])
    lease_us = int(reply[1])
    handed = [
        (_text(reply[i]), LeaseGrant(_text(reply[i + 1]), lease_us))
        for i in range(2, len(reply) - 1, 2)
    ]
    return Released(int(reply[0]) == 1, handed)


def _handed_here(reply: Any) -> None:
    """A release's reply, as soon as it is read: the leases it granted to waiters of this
    process handed to them, before its caller resumes (or without it: cancelled meanwhile).
    A reply that does not parse hands nothing (its caller's decode says what is wrong)."""
    try:
        handed = _released(reply).handed
    except (ValueError, LookupError, TypeError):
        return
    hand_over(handed)


def _renewed(reply: Any) -> int | None:
    return int(reply[1]) if int(reply[0]) == 0 else None


def _config(reply: Any) -> ConcurrencyConfig | None:
    if not reply or reply[0] is None:
        return None
    return ConcurrencyConfig(int(reply[0]), timedelta(microseconds=int(reply[1])))


def _snapshot(reply: Any) -> LeaseSnapshot | None:
    if not reply:
        return None
    most, lease, now, waiting, _, pairs = reply
    holders = []
    for i in range(0, len(pairs), 2):
        lease_id = _text(pairs[i])
        expiry = int(float(_text(pairs[i + 1])))
        holders.append(LeaseHolder(lease_id, *parse_lease(lease_id), max(0, expiry - int(now))))
    config = ConcurrencyConfig(int(most), timedelta(microseconds=int(lease)))
    in_flight = sum(h.permits for h in holders if h.expires_in > 0)
    return LeaseSnapshot(config, in_flight, holders, int(waiting))


def _merge(
    requests: Sequence[tuple[tuple[bytes, ...], list[bytes]]],
) -> tuple[list[Any], list[Any]]:
    """lease_many's KEYS and ARGV for several attempts (three arguments each) and releases
    (two): each limiter's keys once, and each request named after where its keys start."""
    keys: list[Any] = []
    args: list[Any] = []
    starts: dict[tuple[bytes, ...], int] = {}
    for request_keys, request_args in requests:
        start = starts.get(request_keys)
        if start is None:
            start = starts[request_keys] = len(keys) + 1
            keys.extend(request_keys)
        args.append(b" ".join((b"%d" % start, *request_args)))
    return keys, args


_USES = ("lease_lib",)
MANY = Script("lease_many", list, uses=_USES)
_BATCH = Batch(MANY, MAX_BATCH, _merge, list)
# Safe to resend: a resent take grants a second lease only if the first reply was lost, and
# that lease ends within one lease time (nobody renews it); a resent renew, release, cancel,
# set or lifetime call finds its work done (the leases a lost release reply handed over are
# collected by their waiters' next attempts, from T:granted). Attempts and releases made
# together go as one lease_many call, which is as safe to resend as each of them.
TAKE = Script("lease_take", _taken, uses=_USES, batch=_BATCH)
RENEW = Script("lease_renew", _renewed, uses=_USES)
RELEASE = Script("lease_release", _released, uses=_USES, batch=_BATCH, heard=_handed_here)
CANCEL = Script("lease_cancel", lambda reply: int(reply) == 1, uses=_USES)
SET = Script("lease_set", lambda reply: int(reply) == 1, uses=_USES)
READ = Script("lease_read", _snapshot, uses=_USES)
LIFETIME = Script("lease_lifetime", lambda reply: int(reply) == 1, uses=_USES)
CONFIG = ReadCommand("HMGET", _config)
"""T:sem's max and lease."""
