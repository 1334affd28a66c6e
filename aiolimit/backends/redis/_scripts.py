"""The scripts (``lua/``: the shared core ``lib.lua`` and one file per algorithm, joined in
front of each operation's file) and the plain read commands, each with what its reply means:
decoded here into typed values, so that no code of the protocol (``_protocol.Reply``) stands
anywhere else."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from typing import Any, NamedTuple, Protocol, TypeVar

from ..._types import Algorithm, Rate, RateLimiterConfig, RateType
from ...errors import BackendError
from .._learning import Learned
from .._protocol import MAX_BATCH, Reply, parse_rates
from ..base import Grant, Refusal, Settlement
from ._compat import text_of as _text
from ._request import Batch
from ._script import LIBRARY as LIBRARY
from ._script import ReadCommand as ReadCommand
from ._script import Script as Script
from ._script import lua_source as lua_source

R = TypeVar("R")

TIME_REFUSED = "the server refused TIME in a script"
"""What lib.lua says when the server refuses ``TIME`` in scripts."""


# -- what a budget script may answer instead of its result ----------------------------------------


@dataclass(frozen=True, slots=True)
class NotConfigured:
    """The limiter has no config."""


@dataclass(frozen=True, slots=True)
class OtherType:
    """The keys were built for the other rate type: this is the limiter's."""

    rate_type: RateType


@dataclass(frozen=True, slots=True)
class OverRate:
    """The request asks for more permits than the rate."""

    rate: int


@dataclass(frozen=True, slots=True)
class QueueFull:
    """Granting would log more permits than the scripts can count exactly."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The request failed on its own (a key holds foreign data, say); the script's reason."""

    message: str


Trouble = NotConfigured | OtherType | OverRate | QueueFull | Failed


def _trouble(code: Reply, detail: str) -> Trouble:
    if code is Reply.NOT_CONFIGURED:
        return NotConfigured()
    if code is Reply.OVER_RATE:
        return OverRate(int(detail))
    if code is Reply.OTHER_TYPE:
        return OtherType(RateType(detail))
    if code is Reply.QUEUE_FULL:
        return QueueFull()
    if code is Reply.FAILED:
        return Failed(detail)
    raise ValueError(f"reply code {code!r} carries a result")


TROUBLE = frozenset((NotConfigured, OtherType, OverRate, QueueFull, Failed))
"""The classes of Trouble (a reply's class is looked up, not matched with isinstance)."""


def decoded(script: Script[R] | ReadCommand[R], reply: Any) -> R:
    """``reply`` as ``script`` reads it; a reply it cannot read is a BackendError."""
    try:
        return script.decode(reply)
    except (ValueError, LookupError, TypeError) as exc:
        raise BackendError(
            f"unexpected reply to {script.what}: {reply!r:.200}", outage=False
        ) from exc


# -- acquire, acquire_many ----------------------------------------------------------------------


def acquire_request(
    permits: int, now: str, max_wait_us: int | str | None, rate_type: RateType, client_id: str
) -> bytes:
    """An acquire request (acquire.lua's ARGV[1]); ``now`` is '' for the server's TIME,
    ``max_wait_us`` None for any wait, ``FORESEE`` for a foresight.
    Encoded here (a client id is valid UTF-8), so the round trip need not. With the server's
    clock a request is the same every time its caller asks the same: those are kept (a few)."""
    if not now:
        made = _made.get((permits, max_wait_us, rate_type, client_id))
        if made is not None:
            return made
    max_wait = -1 if max_wait_us is None else max_wait_us
    request = f"{permits} {now or '-'} {max_wait} {rate_type.value}"
    if rate_type is RateType.PER_CLIENT:
        request = f"{request} {client_id}"
    encoded = request.encode()
    if not now and len(_made) < _MADE_MOST:
        _made[permits, max_wait_us, rate_type, client_id] = encoded
    return encoded


_made: dict[tuple[int, int | str | None, RateType, str], bytes] = {}
_MADE_MOST = 256  # requests kept: bounded, whatever the callers ask

_GRANTED = b"%d" % Reply.GRANTED
_REFUSED = b"%d" % Reply.REFUSED
_tuple = tuple.__new__  # builds a Grant or Refusal without NamedTuple's Python-level __new__


def _attempt(reply: Any) -> Grant | Refusal | Trouble:
    # The hot path: plain bytes compared and split, no enum until a code needs reading.
    if reply.__class__ is not bytes:
        if reply.__class__ is Grant:  # one acquire_many wrote out already (_write_out)
            return reply
        reply = _text(reply).encode()
    raw = reply
    fields = raw.split(b" ")
    code = fields[0]
    if code == _GRANTED:  # (_protocol.GRANTED_FORMAT)
        if len(fields) == 6:
            _, left, binding, start, delay, member = fields
            until = None
        else:
            _, left, binding, start, delay, member, blocked = fields
            until = int(blocked)
        return _tuple(
            Grant, (int(delay), int(start), int(left), member.decode(), until, int(binding))
        )
    if code == _REFUSED:  # (_protocol.REFUSED_FORMAT)
        _, wait, left, binding, now = fields
        return _tuple(Refusal, (int(wait), int(now), int(left), int(binding)))
    return _trouble(Reply(int(code)), raw.partition(b" ")[2].decode())


class HandsBack(Protocol):
    """Where a grant made for a caller that has gone is handed back (``Backend.hand_back``)."""

    def hand_back(self, name: str, member: str) -> None: ...


class AcquireCall:
    """One caller's acquire: the object is the callable of its arguments by rate type (what
    ``RedisBackend._budget_call`` takes), and :meth:`hand_back` hands back its grant (to
    ``store``) when the caller was cancelled while it was in flight. ``now``: the client's
    clock reading as sent (None: the server's ``TIME``). (One object, not two closures and
    their cells: fewer objects for the garbage collector while the round trip is out.)"""

    __slots__ = ("client_id", "max_wait_us", "name", "now", "permits", "store")

    def __init__(
        self,
        name: str,
        permits: int,
        max_wait_us: int | str | None,
        client_id: str,
        now: Callable[[], str] | None,
        store: HandsBack,
    ) -> None:
        self.name = name
        self.permits = permits
        self.max_wait_us = max_wait_us
        self.client_id = client_id
        self.now = now
        self.store = store

    def __call__(self, rate_type: RateType) -> list[Any]:
        now = "" if self.now is None else self.now()  # ('': the server's TIME)
        return [acquire_request(self.permits, now, self.max_wait_us, rate_type, self.client_id)]

    def hand_back(self, reply: Any) -> None:
        attempt = ACQUIRE.decode(reply)
        if isinstance(attempt, Grant):
            self.store.hand_back(self.name, attempt.member)


def _merge_acquires(
    requests: Sequence[tuple[tuple[bytes, ...], list[bytes]]],
) -> tuple[list[Any], list[Any]]:
    """acquire_many's KEYS and ARGV for several acquire requests: each budget's keys once,
    and each request named after where its keys start."""
    keys: list[Any] = []
    args: list[Any] = []
    starts: dict[tuple[bytes, ...], int] = {}
    for request_keys, (request,) in requests:
        start = starts.get(request_keys)
        if start is None:
            start = starts[request_keys] = len(keys) + 1
            keys.extend(request_keys)
        args.append(b"%d %s" % (start, request))
    return keys, args


def _lines(reply: Any) -> list[Any]:
    # acquire_many answers with one string, a line per request: cheap to parse.
    raw = reply if reply.__class__ is bytes else _text(reply).encode()
    lines = raw.split(b"\n")
    if b"\n=" in raw or raw[:1] == b"=":
        _write_out(lines)
    return lines


def _write_out(lines: list[Any]) -> None:
    """Writes out acquire_many's "=" replies (_protocol.SAME_FORMAT) as the Grants they stand
    for: each is the grant before it with its permits fewer left and its member's tag moved
    by the step given (its life the same)."""
    first: Any = None
    delay = start = left = step = tag = binding = 0
    until: int | None = None
    head = life = ""
    for i, line in enumerate(lines):
        if line[:1] != b"=":
            first = None
            continue
        if first is None:  # the first of a run: the grant before it, read once (and kept read)
            if i == 0:
                raise ValueError("a reply the same as none before it")
            first = lines[i - 1] = _attempt(lines[i - 1])
            if first.__class__ is not Grant:
                raise ValueError(f"a reply the same as {first!r}")
            delay, start, left, member, until, binding = first
            grant, _, life = member.rpartition(":")  # "<permits>:<start>:<tag>", "<life>"
            head, _, tag_text = grant.rpartition(":")  # "<permits>:<start>", "<tag>"
            step, tag = int(head.partition(":")[0]), int(tag_text)
        left -= step
        tag += int(line[1:]) if len(line) > 1 else 1
        lines[i] = _tuple(Grant, (delay, start, left, f"{head}:{tag}:{life}", until, binding))


# Safe to resend: a lost reply may have consumed permits (the limiter under-admits), but the
# caller gets one reply, so one grant.
ACQUIRE_MANY = Script("acquire_many", _lines, uses=("batch",))
ACQUIRE = Script(
    "acquire",
    _attempt,
    uses=("batch",),
    batch=Batch(ACQUIRE_MANY, MAX_BATCH, _merge_acquires, _lines),
)

# -- the other budget scripts: {0, number} or trouble ------------------------------------------


def _number(reply: Any) -> int | Trouble:
    code = Reply(int(reply[0]))
    if code is Reply.GRANTED:
        return int(reply[1])
    return _trouble(code, _text(reply[1]) if len(reply) > 1 else "")


# Read-only.
AVAILABLE = Script("available", _number)
# A resent block sets the same end or a later one by the resend's delay, a resent unblock
# removes what is already gone: safe.
BLOCK = Script("block", _number)
WAIT = Script("wait", _number)
# Each call carries a fresh receipt key: a resend finds the receipt and hands back nothing more.
RELEASE = Script("release", _number)


def _settlement(reply: Any) -> Settlement | Trouble:
    code = Reply(int(reply[0]))
    if code is Reply.GRANTED:  # (_protocol.SETTLE_FORMAT)
        return Settlement(int(reply[1]), int(reply[2]), _text(reply[3]), int(reply[4]))
    return _trouble(code, _text(reply[1]) if len(reply) > 1 else "")


# A settle that changed the grant remembers the old member's receipt: a resend changes nothing.
SETTLE = Script("settle", _settlement, uses=("registered",))
# A floor: sent twice, it tightens to the same floor (or, later, the same one moved on).
SYNC = Script("sync", _number, uses=("registered",))

# -- configs and lifetimes ----------------------------------------------------------------------


class Follow(IntEnum):
    """What set_rate leaves the caller to do, a chunk of clients per call."""

    NOTHING = 0
    REFRESH = 1
    """Give every client in the registry the TTLs the config now gives it (refresh.lua)."""
    RETIRE = 2
    """Remove the state of every client of the retired registry (retire.lua)."""


class Written(NamedTuple):
    written: bool
    follow: Follow


class Deleted(NamedTuple):
    existed: bool
    retire: bool
    """Whether the clients registry was retired, for the caller to remove its clients."""


def _written(reply: Any) -> Written:
    return Written(bool(reply[0]), Follow(int(reply[1])))


def _deleted(reply: Any) -> Deleted:
    return Deleted(int(reply[0]) > 0, bool(reply[1]))


def _config(reply: Any) -> RateLimiterConfig | None:
    if not reply:
        return None
    fields = (
        {_text(k): _text(v) for k, v in reply.items()}
        if isinstance(reply, dict)
        else {_text(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}
    )
    keep_alive = int(fields.get("keep_alive", "0"))
    spacing = int(fields.get("spacing", "0"))
    rate, interval = int(fields["rate"]), timedelta(microseconds=int(fields["interval"]))
    return RateLimiterConfig(
        RateType(fields["type"]),
        rate,
        interval,
        timedelta(microseconds=keep_alive) if keep_alive else None,
        parse_rates(fields["rates"]) if "rates" in fields else (Rate(rate, interval),),
        Algorithm(fields.get("algorithm", Algorithm.SLIDING_WINDOW.value)),
        timedelta(microseconds=spacing) if spacing else None,
        int(fields["max_debt"]) if "max_debt" in fields else None,
    )


def _clients(reply: Any) -> list[str]:
    return [_text(client) for client in reply]


# Safe to resend, since running twice admits no more than once: a resent set_rate writes the
# same config with the same generation (a resent "try" reports it was not written); a resent
# delete, expire or clear_expire finds its work done; retire and refresh repeat what they did.
SET_RATE = Script("set_rate", _written)
DELETE = Script("delete", _deleted)
EXPIRE = Script("expire", bool)
CLEAR_EXPIRE = Script("clear_expire", bool)
RETIRE = Script("retire", int)
REFRESH = Script("refresh", int)


def _time(reply: Any) -> int | None:
    return None if reply is None else int(reply)


BLOCKED_UNTIL = ReadCommand("HGET", _time)
"""A config hash's ``blocked_until`` field (None: no block, or no config)."""
CONFIG = ReadCommand("HGETALL", _config)
"""The config hash, as a config (None: there is none)."""
CLIENTS = ReadCommand("ZRANGE", _clients)
"""A range of the clients registry."""

# -- learning a rate (learn.lua) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OtherShape:
    """The ceiling's intervals are not the stored config's (learn.lua's -5)."""

    detail: str


def _learned(reply: Any) -> Learned | NotConfigured | OtherShape:
    code = int(reply[0])
    if code == -1:
        return NotConfigured()
    if code == -5:
        return OtherShape(_text(reply[1]))
    permits, ceiling, interval, changed, cut_at, good, bad, hold, stated, grown_at = map(
        int, reply[1:11]
    )
    return Learned(
        permits, ceiling, interval, bool(changed), cut_at, good, bad, hold, stated, grown_at
    )


# A resent learn decides nothing more: a refusal of the episode already cut, a success
# within an interval of the last change, the same stated limit.
LEARN = Script("learn", _learned)


def _ceiling(reply: Any) -> tuple[Rate, ...] | None:
    return None if reply is None else parse_rates(_text(reply))


LEARNED = ReadCommand("HGET", _ceiling)
"""A learned state's ``ceiling`` field (None: no learned state)."""


# -- the fleet's measured margin (margin.lua) ------------------------------------------------


def _margin(reply: Any) -> int | NotConfigured:
    if int(reply[0]) == -1:
        return NotConfigured()
    return int(reply[1])


# A resent report moves the margin no further: the same lateness grows it to the same value,
# and a shrink's time starts again at the change it made.
MARGIN = Script("margin", _margin)
