"""What a failed call or a script's reported trouble raises, in plain words."""

from __future__ import annotations

import re

from ...errors import BackendError, InvalidArgumentError, LimiterError, NotConfiguredError
from . import _scripts as scripts
from ._compat import UNREACHABLE
from ._scripts import Failed, NotConfigured, OverRate, QueueFull, Trouble

__all__ = ["call_error", "trouble_error"]

# What a Lua error carries besides its reason: the script position and SHA (Redis 7, Valkey)
# or the function and position (Redis 6). The reasons our own scripts give start 'aiolimit: '.
_LUA_NOISE = re.compile(
    r"^(?:ERR )?(?:Error running script \(call to f_\w+\): )?(?:@?user_(?:script|function):\d+: )*"
    r"|\s*script: \w+, on @?user_(?:script|function):\d+\.?\s*$"
)


def trouble_error(
    what: str, name: str, permits: int, trouble: Trouble, server_clock: bool
) -> LimiterError:
    """The error for the trouble a script reported for one request."""
    if isinstance(trouble, NotConfigured):
        return NotConfiguredError(name)
    if isinstance(trouble, OverRate):
        return InvalidArgumentError(f"permits ({permits}) exceed the rate ({trouble.rate})")
    if isinstance(trouble, QueueFull):
        return BackendError(
            f"limiter {name!r} cannot queue {permits} more permits: its log would hold "
            "more than 2**53, which the scripts cannot count exactly"
        )
    if isinstance(trouble, Failed):
        return refused(what, trouble.message, server_clock, name)
    raise AssertionError(trouble)  # pragma: no cover - OtherType is retried


def call_error(what: str, exc: BaseException, server_clock: bool) -> BackendError:
    """The error for a call that failed as a whole."""
    if isinstance(exc, UNREACHABLE):
        return BackendError(f"Redis is unreachable or timed out ({what}): {exc}")
    return refused(what, server_reason(str(exc)), server_clock)


def refused(what: str, message: str, server_clock: bool, name: str | None = None) -> BackendError:
    """The error for a call Redis refused, or (with ``name``) for a request the script
    itself reported as failed."""
    if server_clock and scripts.TIME_REFUSED in message:
        return BackendError(
            f"the Redis server refused the TIME command in {what} "
            f"({message}); use RedisBackend(..., clock='client') to stamp grants with "
            "this host's clock instead"
        )
    if name is None:
        return BackendError(f"Redis refused {what}: {message}")
    return BackendError(f"{what} failed for {name!r}: {message}")


def server_reason(message: str) -> str:
    """A server's error message in plain words, without a script's position or SHA."""
    return _LUA_NOISE.sub("", message).strip() or message
