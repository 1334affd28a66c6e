"""Observing limiters: one process-wide observer, attached with :func:`observe`.

>>> class Grants(aiolimit.Observer):
...     def __init__(self):
...         self.by_name = collections.Counter()
...     def granted(self, name, permits, waited):
...         self.by_name[name] += permits
>>> aiolimit.observe(Grants())
>>> aiolimit.observe(None)           # detaches it

The OpenTelemetry adapter is one such observer: ``aiolimit.observe(OpenTelemetryObserver())``
(``aiolimit.otel``, extra ``aiolimit-redis[otel]``).

Why one observer for the whole process, not one per backend or limiter: limiters are cheap
objects made wherever convenient (a ``PER_CLIENT`` caller may make one per user), and a
process's round trips are shared by every backend on a Redis client; one attachment point
sees all of it, and the hot path pays one attribute read (``_observe.current``) when nothing
is attached. Limiters report under their own name (a ``ShardedRateLimiter`` under its name,
not its shards'; the ASGI middleware's and the FastAPI dependency's under their rules' names);
client ids are never reported. ``acquire_all`` reports each of its limiters: ``granted`` for
each when all granted, ``refused`` for each when one refused, ``failed`` for each on an error.

An observer's methods run inline, on the event loop, in the call they report: they must be
quick (count into a dict; export later) and must not raise (an exception reaches the
caller). Subclass :class:`Observer` and override what you need: methods added to it later
will have no-op defaults, so a subclass keeps working.
"""

from __future__ import annotations

from .errors import InvalidArgumentError, LimiterError

__all__ = ["Observer", "observe"]


class Observer:
    """What limiters report as they work; every method does nothing here."""

    __slots__ = ()

    def granted(self, name: str, permits: int, waited: float) -> None:
        """``permits`` were granted to a caller of limiter ``name``. ``waited``: the seconds
        a caller given a reservation slept until its slot (0.0: granted at once)."""

    def refused(self, name: str, permits: int) -> None:
        """A request for ``permits`` could not be granted within its timeout."""

    def failed(self, name: str, permits: int, error: LimiterError) -> None:
        """A request raised ``error`` (``BackendError``: the store failed;
        ``NotConfiguredError``; ``InvalidArgumentError``: permits above the rate)."""

    def queued(self, name: str, change: int) -> None:
        """A caller in this process started (+1) or stopped (-1: served or cancelled)
        waiting for a reservation: the sum is the reservations waiting here now."""

    def late(self, name: str, seconds: float) -> None:
        """A caller given a reservation woke ``seconds`` after its grant's start (the
        limiter's clock, mapped to this process's through the tightest offset seen): what the
        event loop adds to the schedule before the caller can act. A partner that counts
        arrivals sees this spread, plus the caller's own send; the fleet's measured margin
        (or a rate's fixed ``margin``) covers it (docs: HTTP clients)."""

    def round_trip(self, requests: int) -> None:
        """One round trip to Redis carried ``requests`` callers' requests (of any limiters:
        concurrent calls share round trips, so these are not per limiter). A round trip
        sent again after a lost connection counts again."""

    def leased(self, name: str, permits: int, waited: float) -> None:
        """A concurrency limiter ``name`` granted a lease of ``permits`` slots, after
        ``waited`` seconds in its queue (0.0: at once). A lease not had within its timeout
        is reported with :meth:`refused`."""

    def lease_queued(self, name: str, change: int) -> None:
        """A caller in this process started (+1) or stopped (-1) waiting in a concurrency
        limiter's queue: the sum is the waiters here now."""

    def lease_lost(self, name: str, permits: int) -> None:
        """A lease of ``permits`` slots was lost while held (:class:`~aiolimit.LeaseLostError`)."""

    def debt_cut(self, name: str, permits: int) -> None:
        """A settle (:meth:`Acquired.settle <aiolimit.Acquired.settle>`) of limiter ``name``
        charged ``permits`` less than the call cost: the limiter was at its ``max_debt``."""

    def partner_refused(self, name: str, status: int, pause: float | None) -> None:
        """The server that limiter ``name`` guards (through :mod:`aiolimit.httpx` or
        :mod:`aiolimit.aiohttp`) answered a call with ``status`` (429 or 503): its quota is
        tighter than the limiter's, or others share it. ``pause``: the seconds every caller
        of the limiter now pauses (its ``Retry-After``, at most ``max_pause``); None when the
        response said no usable ``Retry-After``. Each such response is reported, the ones
        within a pause too; the log has one WARNING per pause."""

    def learned(self, name: str, permits: int, ceiling: int, interval: float) -> None:
        """Limiter ``name``'s learned rate is now ``permits`` per ``interval`` seconds (its
        first rate), of at most ``ceiling`` (:class:`~aiolimit.Learner`; reported when this
        process first sees a change, from any process)."""


current: Observer | None = None
"""The attached observer (read on the hot path; set it with :func:`observe`)."""


def observe(observer: Observer | None) -> Observer | None:
    """Attaches ``observer`` to every limiter and Redis backend of this process, replacing
    the one attached before (returned); ``None`` detaches it. To feed two, attach one that
    calls both."""
    global current
    if observer is not None and not isinstance(observer, Observer):
        raise InvalidArgumentError(
            f"observer must be an aiolimit.Observer or None, not {type(observer).__name__}"
        )
    previous, current = current, observer
    return previous
