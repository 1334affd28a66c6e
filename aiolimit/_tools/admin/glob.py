"""``aiolimit list PATTERN`` (:func:`limiter_names`): a Redis glob (``*``, ``?``, ``[abc]``,
``[^a-z]``, ``\\x``) matched against limiter names, not against the keys they are stored
under, which escape ``%``, ``{`` and ``}`` (``we{ir}d`` is ``{we%7Bir%7Dd}``:
``_keys.escape_tag``).

The server is asked (SCAN MATCH) only for the pattern's literal start, escaped as stored;
the whole pattern is then matched here against each name it returns.

>>> names("we{*").match, names("we{*").pattern.fullmatch("we{ir}d") is not None
('we%7B*', True)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import NamedTuple

from ...backends.redis import RedisBackend
from ...backends.redis._keys import escape_tag

__all__ = ["SYNTAX", "NamePattern", "is_glob", "limiter_names", "names", "unescape_tag"]

_UNESCAPE = re.compile(r"%(25|7B|7D|00)")
_UNESCAPED = {"25": "%", "7B": "{", "7D": "}", "00": "\x00"}

_SPECIAL = "*?["
SYNTAX = "* ? [abc] [^a-z], \\ before a character to take it as it is"
"""The glob's syntax, as the commands' help says it."""


def is_glob(text: str) -> bool:
    """Whether ``text`` has a wildcard (``*``, ``?`` or ``[``): a glob rather than a name
    (``aiolimit delete``)."""
    return any(char in text for char in _SPECIAL)


class NamePattern(NamedTuple):
    match: str
    """What SCAN MATCH is given for the part inside the hash tag (the stored form)."""
    pattern: re.Pattern[str]
    """The glob, as a regular expression to match whole names."""


def names(glob: str) -> NamePattern:
    literal = _literal_start(glob)
    return NamePattern(redis_escape(escape_tag(literal)) + "*", _regex(glob))


def redis_escape(text: str) -> str:
    """``text`` matched literally in a Redis glob."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _literal_start(glob: str) -> str:
    """The characters every match starts with: up to the first wildcard, escapes undone."""
    start = []
    index = 0
    while index < len(glob) and glob[index] not in _SPECIAL:
        if glob[index] == "\\" and index + 1 < len(glob):
            index += 1
        start.append(glob[index])
        index += 1
    return "".join(start)


def _regex(glob: str) -> re.Pattern[str]:
    parts = []
    index = 0
    while index < len(glob):
        char = glob[index]
        if char == "\\" and index + 1 < len(glob):
            index += 1
            parts.append(re.escape(glob[index]))
        elif char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        elif char == "[" and "]" in glob[index + 1 :]:
            part, index = _bracket(glob, index + 1)
            parts.append(part)
        else:
            parts.append(re.escape(char))
        index += 1
    return re.compile("".join(parts), re.DOTALL)


def _bracket(glob: str, index: int) -> tuple[str, int]:
    """A ``[...]`` starting after its ``[``, as Redis reads it: ``^`` negates, ``a-z`` is a
    range (either way round), ``\\x`` is x. Returns the regex and the index of its ``]``."""
    negate = glob[index] == "^"
    index += negate
    members = []
    while index < len(glob) and glob[index] != "]":
        if glob[index] == "\\" and index + 1 < len(glob):
            index += 1
            members.append(re.escape(glob[index]))
        elif index + 2 < len(glob) and glob[index + 1] == "-" and glob[index + 2] != "]":
            low, high = sorted((glob[index], glob[index + 2]))
            members.append(f"{re.escape(low)}-{re.escape(high)}")
            index += 2
        else:
            members.append(re.escape(glob[index]))
        index += 1
    if not members:
        return ("." if negate else "(?!)"), index
    return f"[{'^' if negate else ''}{''.join(members)}]", index


def unescape_tag(tag: str) -> str:
    """A name as ``escape_tag`` wrote it inside ``{...}``, back as the name."""
    return _UNESCAPE.sub(lambda match: _UNESCAPED[match[1]], tag)


async def limiter_names(backend: RedisBackend, pattern: str = "*") -> AsyncIterator[str]:
    """The names of the limiters with a config that match the glob ``pattern`` (matched
    against the names, not their stored keys): SCAN over config keys (never
    KEYS, which blocks the server), so a name may come twice if the keyspace is resized
    meanwhile; sorted callers dedupe."""
    redis = backend.redis
    prefix = backend.keys("x").tag[: -len("{x}")]  # the prefix, as Keys writes it
    wanted = names(pattern)
    match = f"{redis_escape(prefix)}{{{wanted.match}:config"
    async for key in redis.scan_iter(match=match, count=1000):
        tag = (key.decode() if isinstance(key, bytes) else str(key))[len(prefix) :]
        if tag.startswith("{") and tag.endswith("}:config"):
            name = unescape_tag(tag[1 : -len("}:config")])
            if wanted.pattern.fullmatch(name):
                yield name
