"""Settling a grant: what a call really cost, once it is known (``Acquired.settle``).

>>> acquired = await tokens.reserve(prompt_tokens + max_tokens, timeout=30)
>>> response = await call_model(...)
>>> await acquired.settle(response.usage.total_tokens)
Settlement(handed_back=412, charged=0, member='...', cut=0)

Fewer permits than reserved hand the difference back (what of it still counts against the
limit); more charge the difference now, into debt down to the config's ``max_debt``: a charge
that would go further is cut, logged once per limiter (logger ``aiolimit``) and reported to the
observer (:meth:`Observer.debt_cut`), never raised. A leaf below the engine: it knows a
limiter as the engine does (a name, a backend, a breaker).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Protocol

from . import _observe
from ._breaker import Breaker
from ._code_config import CodeConfig
from ._types import MAX_RATE, RateLimiterConfig, shown
from .backends.base import Backend, Grant, Settlement
from .errors import InvalidArgumentError, NotConfiguredError

__all__ = ["NOTHING", "Limited", "check_settle_permits", "index_of", "settle_grant"]

log = logging.getLogger("aiolimit")

# Limiters whose cut charges were logged (the most recent few hundred), each once.
_logged: dict[str, None] = {}
_LOGGED_MOST = 256


NOTHING = Settlement(0, 0, "")
"""The settle of an acquisition that holds no grant (refused, or released): nothing done."""


class Limited(Protocol):
    """What the engine (``_acquire``) and settling need of a limiter: where its state lives,
    its circuit breaker, and the rate its code gives (written again when the store lost it)."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def breaker(self) -> Breaker: ...

    @property
    def rate_in_code(self) -> CodeConfig[RateLimiterConfig]: ...


def check_settle_permits(permits: object) -> int:
    """A settle's ``permits``: an int from 0 to ``MAX_RATE``; else InvalidArgumentError."""
    if isinstance(permits, bool) or not isinstance(permits, int) or not 0 <= permits <= MAX_RATE:
        if isinstance(permits, float) and math.isnan(permits):
            permits = "nan"
        raise InvalidArgumentError(
            f"permits must be an int from 0 to {MAX_RATE} (MAX_RATE), not {shown(permits)}"
        )
    return permits


def index_of(limiters: Sequence[Limited], owners: Sequence[Limited], limiter: object | None) -> int:
    """Which of an acquisition's limiters ``limiter`` names: the only one when None; else the
    same object (or the one the caller took through, in ``owners``: a sharded limiter), or
    one with its name, store and client id (another view for the same client).
    InvalidArgumentError when none, or none was named and there are several."""
    if limiter is None:
        if len(limiters) == 1:
            return 0
        names = ", ".join(each.name for each in owners)
        raise InvalidArgumentError(
            f"this acquisition holds several limiters ({names}): say which, with limiter="
        )
    for i, (each, owner) in enumerate(zip(limiters, owners, strict=True)):
        if limiter is each or limiter is owner:
            return i
    backend = getattr(limiter, "backend", None)
    wanted = (
        getattr(limiter, "name", None),
        getattr(backend, "store_id", None),
        getattr(backend, "client_id", None),
    )
    for i, owner in enumerate(owners):
        if (owner.name, owner.backend.store_id, owner.backend.client_id) == wanted:
            return i
    raise InvalidArgumentError(f"limiter {limiter!r} is not one of this acquisition's limiters")


async def settle_grant(
    limiter: Limited,
    grant: Grant,
    permits: int,
    label: str,
    floor: tuple[int, int] | None = None,
    kept: int = 0,
) -> tuple[Settlement, Grant]:
    """Settles ``grant`` of ``limiter`` for ``permits`` through its breaker: what was done,
    and the grant from now on (its member names what it holds now). A limiter whose state is
    gone (deleted, the store flushed) has nothing to settle against: nothing is done.
    ``label``: the name a cut is reported under. ``floor`` (remaining, reset µs): then a
    provider's count taken as a floor, in the same call (``Backend.settle_and_sync``).
    ``kept``: what a paused caller of this process lacks (``Backend.settle``)."""
    backend = limiter.backend
    if floor is None:
        settling = backend.settle(limiter.name, grant.member, permits, kept=kept)
    else:
        settling = backend.settle_and_sync(limiter.name, grant.member, permits, *floor, kept=kept)
    try:
        settlement = await limiter.breaker.guard(settling)
    except NotConfiguredError:
        log.info("limiter %r: no state to settle a grant against (deleted?)", label)
        return Settlement(0, 0, grant.member), grant
    if settlement.cut:
        _report_cut(label, settlement.cut)
    return settlement, grant._replace(member=settlement.member)


def _report_cut(name: str, cut: int) -> None:
    observer = _observe.current
    if observer is not None:
        observer.debt_cut(name, cut)
    if name in _logged:
        return
    if len(_logged) >= _LOGGED_MOST:
        del _logged[next(iter(_logged))]
    _logged[name] = None
    log.warning(
        "limiter %r: a settle charged %d permits less than it cost: the limiter is at its "
        "max_debt (logged once)",
        name,
        cut,
    )
