"""The names this release deprecates, each with what replaces it, and the one warning they give.

>>> deprecated("RateLimiter.block()", "RateLimiter.pause()")   # in block(), before its work

Each still works for one release. The warning is a :class:`DeprecationWarning` that points at
the caller's line (Python shows it once per line that calls); ``tests/test_deprecations.py``
checks that every name here warns, still works, and is nowhere the documented way.
"""

from __future__ import annotations

import warnings

__all__ = ["DEPRECATED", "deprecated"]

DEPRECATED = {
    "aiolimit.Settled": "aiolimit.Settlement",
    "RateLimiter.release": "Acquired.release",
    "RateLimiter.sync": "RateLimiter.cap_remaining",
    "RateLimiter.block": "RateLimiter.pause",
    "RateLimiter.unblock": "RateLimiter.resume",
    "aiolimit block": "aiolimit pause",
    "aiolimit unblock": "aiolimit resume",
    "the loose rate arguments": "RateLimiterConfig.build",
}
"""Each deprecated name, and what replaces it: a name in ``aiolimit``, a method of
``RateLimiter`` (and of ``ShardedRateLimiter``), a command, or the loose rate arguments of the
set-rate methods and the limiters' constructors (``rate_type, rate, interval, algorithm=...``),
replaced by a config (:meth:`RateLimiterConfig.build`) or its text
(:meth:`RateLimiterConfig.parse`)."""


def deprecated(old: str, new: str, depth: int = 1) -> None:
    """Warns that ``old`` is deprecated for ``new``, at the line that called it: ``depth``
    frames of aiolimit's code lie between this call and that line (1: the deprecated
    function called this itself)."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=depth + 2,
    )
