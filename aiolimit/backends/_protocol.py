"""The one spec both stores follow: the Lua scripts (``redis/lua/``) and their Python twin
(``memory.py``) run the same algorithm on the same formats and bounds, stated here once.

``lib.lua`` states the same numbers and formats for the scripts; ``tests/test_protocol.py``
fails when the two disagree.

The clock rule. A call acts at one time, in integer microseconds: the server's ``TIME``
(``clock="server"``) or the time the client sent. A client time older than the latest one
the limiter has acted on acts at that latest time, so requests that reach the store out of
order never act in the past (acting at an older time after newer grants were reclaimed would
over-admit). The latest time is recorded in the config (``clock``) only for client times,
and only once the request has passed the permits-over-rate check: a request refused for
asking more than the rate acts at no time at all.
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from enum import IntEnum

from .._types import Rate, RateLimiterConfig
from ..errors import BackendError, InvalidArgumentError

__all__ = [
    "CARRIES",
    "COUNTERS_FORMAT",
    "FORESEE",
    "GRANTED_FORMAT",
    "HELD_BUCKETS",
    "MAX_BATCH",
    "MAX_EXACT",
    "MAX_SYNC_US",
    "RECEIPT_US",
    "RECLAIM_STEPS",
    "REFUSED_FORMAT",
    "SAME_FORMAT",
    "SETTLE_FORMAT",
    "STATE_FIELD",
    "VALUE_FORMAT",
    "WALK_STEPS",
    "Reply",
    "check_settle",
    "check_sync",
    "format_grant",
    "format_member",
    "format_rates",
    "new_life",
    "over_rate_error",
    "parse_carries",
    "parse_counters",
    "parse_grant",
    "parse_handbacks",
    "parse_member",
    "parse_rates",
    "parse_value",
    "parse_windows",
    "queue_full_error",
    "split_life",
    "with_life",
]

MAX_EXACT = 2**53 - 1
"""The largest count kept exactly: Lua numbers are doubles. No log holds more permits."""
WALK_STEPS = 1000
"""Log entries one wait computation (or one release) may read."""
RECLAIM_STEPS = 1000
"""Expired log entries one call may remove from a budget."""
MAX_BATCH = 64
"""Acquire requests one ``acquire_many`` call carries. A script blocks the whole server while
it runs; 64 requests keep one call well under a millisecond, while sharing a call still saves
nearly all the per-call cost."""


class Reply(IntEnum):
    """The code that opens the reply to a request (the table in batch.lua's header)."""

    GRANTED = 0
    """Granted, now or as a reservation; also the code of every other successful reply."""
    REFUSED = 1
    """Not granted within the wait the caller allows; nothing was taken."""
    NOT_CONFIGURED = -1
    """The limiter has no config."""
    OVER_RATE = -2
    """The request asks for more permits than the rate; followed by the rate."""
    OTHER_TYPE = -3
    """The keys were built for the other rate type; followed by the limiter's rate type."""
    QUEUE_FULL = -4
    """Granting would log more than ``MAX_EXACT`` permits."""
    FAILED = -5
    """The request failed (a key holds foreign data, say); followed by the reason."""


GRANTED_FORMAT = "0 <left> <binding> <start> <delay> <member> [<blocked until>]"
"""The reply to an acquire request that was granted (batch.lua's table of replies): the
fewest permits left under any rate, the rate that has them (``binding``: its place in the
config's rates, from 0, the first of several such), the grant's start (us, on the limiter's
clock), the us from now until it (0: now, > 0: a reservation), the grant's member (see
:func:`with_life`), and the end of the limiter's latest block when it has one."""
REFUSED_FORMAT = "1 <wait> <left> <binding> <now>"
"""The reply to an acquire request that was refused: the us until the permits are free, the
fewest permits left and the rate that has them (as in :data:`GRANTED_FORMAT`), and the time
the request acted at."""
FORESEE = "?"
"""An acquire request's max wait that asks for a foresight (batch.lua's ``FORESEE``): the
reply the request would get once every request before it in its call is decided, in
:data:`REFUSED_FORMAT`, its wait 0 when the permits are free now; nothing is taken."""
SAME_FORMAT = "=[<tag step>]"
"""In acquire_many's reply, a grant's reply that is the one before it in the call with the
request's permits fewer left and ``tag step`` added to the member's tag (1 when absent; see
:data:`GRANTED_FORMAT`; the life stays): what equal requests of one call granted at once
mostly get, written out by the client."""


def format_member(permits: int, seq: int) -> str:
    """A grant's entry in a sliding window's log, ``"<permits>:<seq>"``: unique within the
    log, and it says how many permits it holds without another lookup."""
    return f"{permits}:{seq}"


def parse_member(member: str) -> tuple[int, int]:
    """``(permits, seq)`` of a grant's log entry."""
    permits, _, seq = member.partition(":")
    return int(permits), int(seq)


def format_grant(permits: int, start: int, tag: int) -> str:
    """The part of a grant's member its algorithm reads, ``"<permits>:<start>:<tag>"``: its
    permits, its start (us, on the limiter's clock) and a number that tells it from the other
    grants of its budget that start then (a sliding window's: its log entry's sequence
    number). Unique for the life of the limiter's state: a log's sequence starts over only
    once it is empty (every grant left the window, or its state is gone) and the latest start
    of a grant handed back has passed, after which grants start later (sliding_log.lua); a
    token bucket's or fixed windows' tag carries the hand-backs counted (counters.lua). The
    member itself names the life too (:func:`with_life`)."""
    return f"{permits}:{start}:{tag}"


def with_life(grant: str, life: str) -> str:
    """A grant's member (``Grant.member``), ``"<permits>:<start>:<tag>:<life>"``: the part
    :func:`format_grant` writes, then the life of the state it was taken from (the config's
    generation, its part before any ``"."``: ``gen`` in the config hash, ``Config.life`` in
    the memory twin). A reset (``delete()`` and a new config, ``set_rate`` without
    ``keep_state``, another algorithm or rate type, the store flushed) starts another life:
    a settle or release of a member of an earlier one hands back and charges nothing."""
    return f"{grant}:{life}"


_LIFE = re.compile(r"[\w-]+", re.ASCII)


def split_life(member: str) -> tuple[str, str | None]:
    """``(grant, life)`` of a member (see :func:`with_life`); life None for a member without
    one (as an earlier version wrote them: it names a grant of no life)."""
    grant, _, life = member.rpartition(":")
    if grant.count(":") == 2 and _LIFE.fullmatch(life):
        return grant, life
    return member, None


def new_life() -> str:
    """A life for a config whose state starts afresh (on Redis its generation): random, so
    that no two lives of one limiter share one, across deletes and flushes too."""
    return secrets.token_urlsafe(6)  # 48 bits, 8 characters: each grant's member carries it


def parse_grant(member: str) -> tuple[int, int, int]:
    """``(permits, start, tag)`` of a grant's member (see :func:`with_life`), with or without
    its life; anything else raises InvalidArgumentError."""
    parts = member.split(":") if isinstance(member, str) else ()
    if len(parts) == 4 and _LIFE.fullmatch(parts[3]):
        parts = parts[:3]
    if len(parts) != 3 or not all(p.lstrip("-").isdigit() and p.isascii() for p in parts):
        raise InvalidArgumentError(f"member must be a Grant's member, not {member!r:.80}")
    return int(parts[0]), int(parts[1]), int(parts[2])


RECEIPT_US = 60_000_000
"""How long a release that names no grant is remembered (its receipt, in the limiter's
receipts ZSET), so that a client library that sends it again hands back nothing more."""


def format_rates(config: RateLimiterConfig) -> str:
    """Every rate of a config, as the config hash's ``rates`` field holds them:
    ``"<permits>:<interval us>,..."`` (written only when there are several)."""
    return ",".join(f"{rate.permits}:{rate.interval_us}" for rate in config.rates)


def parse_rates(text: str) -> tuple[Rate, ...]:
    """The rates of a ``rates`` field (see :func:`format_rates`)."""
    rates = []
    for part in text.split(","):
        permits, _, interval = part.partition(":")
        rates.append(Rate(int(permits), timedelta(microseconds=int(interval))))
    return tuple(rates)


VALUE_FORMAT = "<gen> <used> <seq> <cursor>[ ~f<lag>:<until>]...[ ~h<handed>][ ~<permits>:<at>]..."
"""A budget's value key: the config generation the state belongs to, the permits its log holds
(reservations included), the number of its last grant, where the last wait computation
stopped (``"<score> <permits up to it> <permits at it>"``, or ``"-"``), up to two lags a
provider's count set (``Backend.sync``: how much longer the window is, in us, and until
when: sliding_floors.lua), the latest start of a grant handed back while a later grant may
still take it (its numbers go on meanwhile: sliding_log.lua), then up to ``HELD_BUCKETS``
entries of the grants reclaimed from the log (held.lua)."""

HELD_BUCKETS = 2
"""Spans of reclaimed grants a sliding window's budget keeps (held.lua)."""


def parse_value(value: str) -> tuple[str, int, int, tuple[int, int, int] | None]:
    """``(gen, used, seq, cursor)`` of a budget's value key (see :data:`VALUE_FORMAT`)."""
    gen, used, seq, where = value.split(" ~", 1)[0].split(" ", 3)
    if where == "-":
        return gen, int(used), int(seq), None
    score, up_to, at = map(int, where.split(" "))
    return gen, int(used), int(seq), (score, up_to, at)


STATE_FIELD = "state"
"""The config hash's field that holds an OVERALL budget's state where its algorithm says
``in_hash`` (lib.lua; ``Group.in_hash`` in the memory twin): a token bucket's or fixed
windows', in :data:`COUNTERS_FORMAT`. It has no TTL of its own and no generation of its own:
it goes with the config (whose ``gen`` names its life all the same: :func:`with_life`), and
is absent while the state is fresh."""

COUNTERS_FORMAT = (
    "<last> <n 1> <n 2> ... [ ~h<hand-backs>][ ~<rate>:<count>:<ago> ...]"
    "[ ~c<rate>:<count>:<until>:<since> ...]"
)
"""The state of a token bucket or fixed windows: the latest grant's start (``"-"`` unless
several rates or a spacing need it), then per rate two numbers: a bucket's full time (us) and
its remainder (in 1/permits of a us), or the end of a window (us) and the permits in it.
Once a grant of the budget has been handed back, the count of such hand-backs (a grant's tag
carries it, so that a slot taken again never gives a member twice: counters.lua).
Fixed windows add up to ``HELD_BUCKETS`` earlier windows per rate that held grants: the
rate's place (from 1), the permits, and how long before the rate's latest window end theirs
ended (us); then up to ``CARRIES`` floors per rate that a provider's count set
(``Backend.sync``: carries.lua), each the rate's place, the permits it carries into the window
``until`` falls in, ``until`` (us) and the time of the sync it counts from (us). A PER_CLIENT
client's value key holds ``"<gen> "`` and this."""

CARRIES = 2
"""The floors (carries) fixed windows keep per rate: into the current window, and the next."""


def parse_counters(text: str) -> tuple[int | None, list[int]]:
    """``(last, numbers)`` of a token bucket's or fixed windows' state (see
    :data:`COUNTERS_FORMAT`)."""
    last, *numbers = text.split(" ~", 1)[0].split(" ")
    return None if last == "-" else int(last), [int(n) for n in numbers]


def parse_handbacks(text: str) -> int:
    """The hand-backs a token bucket's or fixed windows' state has counted (see
    :data:`COUNTERS_FORMAT`)."""
    entry = text.split(" ~", 2)[1] if " ~h" in text else "h0"
    return int(entry[1:])


def parse_windows(text: str) -> list[list[int]]:
    """The earlier windows of fixed windows' state (see :data:`COUNTERS_FORMAT`), as
    ``[rate, count, end]``, oldest first."""
    numbers = parse_counters(text)[1]
    entries = [entry for entry in text.split(" ~")[1:] if entry[:1].isdigit()]
    windows = [[int(n) for n in entry.split(":")] for entry in entries]
    return [[i, count, numbers[2 * i - 2] - ago] for i, count, ago in windows]


def parse_carries(text: str) -> list[list[int]]:
    """The floors fixed windows' state carries (see :data:`COUNTERS_FORMAT`), as ``[rate,
    count, until, since]``."""
    entries = [entry[1:] for entry in text.split(" ~")[1:] if entry.startswith("c")]
    return [[int(n) for n in entry.split(":")] for entry in entries]


SETTLE_FORMAT = "{0, <handed back>, <charged>, <member>, <cut>}"
"""settle.lua's reply (``Backend.settle``). A settle for fewer permits hands the difference
back by the algorithm's release rule (a token bucket with reservations queued behind the
grant gives back nothing); for more, the difference is charged at the call's time, down to
``max_debt`` below zero of the fewest permits left (``left``, reservations included). The
member after it, with the same life: a sliding window's ``"<permits>:<start>:<seq>"`` (its
log entry rewritten, same score; a charge is an entry of its own at the settle's time, so a
member that was charged names no entry a later hand-back could find); a token bucket's or
fixed windows' ``"<permits>:<start>:<tag>"`` with a tag no grant has (the hand-back count
moved by two). The old member's receipt (as a release's) is remembered, so a resend changes
nothing. A member of another life than the config's (see :func:`with_life`) changes
nothing: ``{0, 0, 0, <member>, 0}``."""


def check_settle(member: str, permits: object) -> int:
    """A settle's ``permits`` (the grant's ``member`` is checked too); InvalidArgumentError
    for anything but an int from 0 to ``MAX_EXACT``."""
    parse_grant(member)
    if isinstance(permits, bool) or not isinstance(permits, int) or not 0 <= permits <= MAX_EXACT:
        raise InvalidArgumentError(
            f"permits must be an int from 0 to {MAX_EXACT}, not {permits!r:.40}"
        )
    return permits


def check_sync(remaining: object, reset_us: object) -> tuple[int, int]:
    """A sync's ``remaining`` (an int from 0 to ``MAX_EXACT``) and ``reset_us`` (an int of
    microseconds from 0 to ten years); InvalidArgumentError otherwise."""
    for value, what, most in (
        (remaining, "remaining", MAX_EXACT),
        (reset_us, "reset_us", MAX_SYNC_US),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise InvalidArgumentError(f"{what} must be an int from 0 to {most}, not {value!r:.40}")
    return remaining, reset_us  # type: ignore[return-value]


MAX_SYNC_US = 315_360_000_000_000
"""The longest ``reset_us`` a sync takes (ten years, ``MAX_DURATION``). A sliding window
and fixed windows count a sync for at most one interval of each rate."""


# The texts both backends give for the same trouble (the scripts report a code; the memory
# backend finds it itself): written once, so the two never drift.


def over_rate_error(permits: int, rate: int) -> InvalidArgumentError:
    """A request for more permits than the (smallest) rate allows at once."""
    return InvalidArgumentError(f"permits ({permits}) exceed the rate ({rate})")


def queue_full_error(name: str, permits: int) -> BackendError:
    """A request whose grant would make a budget hold more than the scripts count exactly."""
    return BackendError(
        f"limiter {name!r} cannot queue {permits} more permits: its log would hold "
        "more than 2**53, which the scripts cannot count exactly",
        outage=False,
    )
