"""Every exception aiolimit raises, under one base class."""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CredentialsError",
    "InvalidArgumentError",
    "LeaseLostError",
    "LimiterError",
    "NotConfiguredError",
    "RateLimited",
]


class LimiterError(Exception):
    """Base class of every aiolimit error."""


class InvalidArgumentError(LimiterError, ValueError):
    """An argument is out of range or of the wrong type (also a :class:`ValueError`)."""


class NotConfiguredError(LimiterError):
    """The limiter has no rate yet: call ``try_set_rate`` or ``set_rate`` first."""

    def __init__(self, name: str) -> None:
        super().__init__(f"rate limiter {name!r} has no rate: call try_set_rate() or set_rate()")
        self.name = name


class BackendError(LimiterError):
    """The backend failed: Redis unreachable, timed out, or refused a command.

    The original exception is chained as ``__cause__``. ``outage`` says which of the two:
    true when the store did not serve (unreachable, timed out, or answering that it cannot
    serve now: loading, busy, read-only in a failover), false when it answered with an error
    about this call (a key holding foreign data, a refused command). Only an outage counts
    toward a limiter's circuit breaker. A backend sets it where it maps its errors:

    >>> raise BackendError(f"Redis refused {what}: {reason}", outage=False) from exc
    """

    def __init__(self, *args: object, outage: bool = True) -> None:
        super().__init__(*args)
        self.outage = outage
        """Whether the store did not serve (true) or answered with an error (false)."""


class CredentialsError(BackendError):
    """The server needs credentials and was given none, or refused the ones given (redis-py's
    ``AuthenticationError``: ``NOAUTH``, ``WRONGPASS``). Not an outage: the server answered.
    Give them in the URL (``redis://USER:PASSWORD@HOST:6379``; ``redis://:PASSWORD@HOST:6379``
    for a server's ``requirepass``) or as ``Redis(username=..., password=...)``."""

    def __init__(self, *args: object, outage: bool = False) -> None:
        super().__init__(*args, outage=outage)


class RateLimited(LimiterError):
    """No permit could be had within the caller's timeout.

    >>> try:
    ...     await client.get("https://partner.example/orders")
    ... except RateLimited as exc:
    ...     print(f"{exc.name}: try again in {exc.retry_after:.1f} s")
    """

    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(
            f"rate limiter {name!r} has no permit within the timeout: "
            f"retry after {retry_after:.3f} s"
        )
        self.name = name
        self.retry_after = retry_after
        """Seconds until the permits asked for could be granted."""


class LeaseLostError(LimiterError):
    """A concurrency limiter's lease ended while its holder still held it: it expired (the
    event loop stalled past it, renewals failed), or the store lost it (flushed, restarted
    without it). The body of ``async with`` is cancelled with it; ``renew()`` raises it. A
    lost lease is never taken back silently: take a new one (with a higher ``fence``).
    """

    def __init__(self, name: str, lease_id: str) -> None:
        super().__init__(f"concurrency limiter {name!r} lost lease {lease_id}")
        self.name = name
        self.lease_id = lease_id
