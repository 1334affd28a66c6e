"""What a failed call or a script's reported trouble raises, in plain words, and whether it is
an outage (``BackendError.outage``): the store did not serve (unreachable, timed out, or a
server answering that it cannot serve now) rather than answered with an error about the call
(a key holding foreign data, a refused command). Only an outage counts toward the breaker."""

from __future__ import annotations

import re

from ...errors import (
    BackendError,
    CredentialsError,
    LimiterError,
    NotConfiguredError,
)
from .._protocol import over_rate_error, queue_full_error
from . import _scripts as scripts
from ._compat import AUTH, NOT_SERVING, UNREACHABLE
from ._scripts import Failed, NotConfigured, OverRate, QueueFull, Trouble

__all__ = ["call_error", "credentials_error", "credentials_missing", "trouble_error"]

# What a Lua error carries besides its reason: the script position and SHA (Redis 7, Valkey)
# or the function and position (Redis 6). The reasons our own scripts give start 'aiolimit: '.
_LUA_NOISE = re.compile(
    r"^(?:ERR )?(?:Error running script \(call to f_\w+\): )?(?:@?user_(?:script|function):\d+: )*"
    r"|\s*script: \w+, on @?user_(?:script|function):\d+\.?\s*$"
)

# The codes of an error reply from a server that cannot serve now, whatever the call:
# loading its data, running a slow script, a replica or a cluster in a failover, out of
# memory, unable to persist. (The client library keeps some codes in the message; those it
# takes off, it turns into NOT_SERVING's classes.)
_NOT_SERVING_CODES = frozenset(
    ("LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "MISCONF",
     "NOREPLICAS")
)  # fmt: skip


def not_serving(message: str) -> bool:
    """Whether a server's error message (its code first) says it cannot serve now."""
    return message.split(" ", 1)[0] in _NOT_SERVING_CODES


def trouble_error(
    what: str, name: str, permits: int, trouble: Trouble, server_clock: bool
) -> LimiterError:
    """The error for the trouble a script reported for one request."""
    if isinstance(trouble, NotConfigured):
        return NotConfiguredError(name)
    if isinstance(trouble, OverRate):
        return over_rate_error(permits, trouble.rate)
    if isinstance(trouble, QueueFull):
        return queue_full_error(name, permits)
    if isinstance(trouble, Failed):
        return refused(what, trouble.message, server_clock, name)
    raise AssertionError(trouble)  # pragma: no cover - OtherType is retried


# The codes of an error reply that asks for credentials, or refuses the ones given.
_CREDENTIALS_CODES = frozenset(("NOAUTH", "WRONGPASS"))

HOW_TO_LOG_IN = (
    "give them in the URL (redis://USER:PASSWORD@HOST:6379, or redis://:PASSWORD@HOST:6379 "
    "for a server's requirepass) or as Redis(username=..., password=...)"
)


def credentials_error(exc: BaseException) -> CredentialsError | None:
    """The error for a server that needs credentials or refused the ones given (the client
    library's class, or the reply's code); None for any other failure."""
    message = str(exc)
    if not isinstance(exc, AUTH) and message.split(" ", 1)[0] not in _CREDENTIALS_CODES:
        return None
    if credentials_missing(message):
        return CredentialsError(f"the Redis server needs credentials: {HOW_TO_LOG_IN}")
    return CredentialsError(
        f"the Redis server refused the credentials given ({message}): {HOW_TO_LOG_IN}"
    )


def credentials_missing(message: str) -> bool:
    """Whether a refusal of credentials says none were given (NOAUTH; a HELLO sent without
    AUTH), rather than that those given are wrong."""
    return (
        message.startswith("NOAUTH")
        or "Authentication required" in message
        or ("HELLO must be called with the client already authenticated" in message)
    )


def call_error(what: str, exc: BaseException, server_clock: bool) -> BackendError:
    """The error for a call that failed as a whole. A server that did not answer is named
    without the call: the caller's own (an ``acquire()`` whose first call stores the rate
    given at construction) may not be the one that was sent."""
    credentials = credentials_error(exc)
    if credentials is not None:
        return credentials
    if isinstance(exc, UNREACHABLE):
        return BackendError(f"Redis is unreachable or timed out: {exc}")
    outage = isinstance(exc, NOT_SERVING)
    return refused(what, server_reason(str(exc)), server_clock, outage=outage)


def refused(
    what: str, message: str, server_clock: bool, name: str | None = None, outage: bool = False
) -> BackendError:
    """The error for a call Redis refused, or (with ``name``) for a request the script
    itself reported as failed: an outage only when the server says it cannot serve now (its
    message's code, or ``outage``: the client library's class of the reply said so)."""
    credentials = credentials_error(Exception(message))
    if credentials is not None:
        return credentials
    outage = outage or not_serving(message)
    if server_clock and scripts.TIME_REFUSED in message:
        return BackendError(
            f"the Redis server refused the TIME command in {what} "
            f"({message}); use RedisBackend(..., clock='client') to stamp grants with "
            "this host's clock instead",
            outage=False,
        )
    if name is None:
        return BackendError(f"Redis refused {what}: {message}", outage=outage)
    return BackendError(f"{what} failed for {name!r}: {message}", outage=outage)


def server_reason(message: str) -> str:
    """A server's error message in plain words, without a script's position or SHA."""
    return _LUA_NOISE.sub("", message).strip() or message
