"""``aiolimit list PATTERN`` (:func:`limiter_names`): a Redis glob (``*``, ``?``, ``[abc]``,
``[^a-z]``, ``\\x``) matched against limiter names, not against the keys they are stored
under, which escape ``%``, ``{`` and ``}`` (``we{ir}d`` is ``{we%7Bir%7Dd}``:
``_keys.escape_tag``).

The server is asked (SCAN MATCH) only for the pattern's literal start, escaped as stored;
the whole pattern is then matched here against each name it returns. A
``ShardedRateLimiter``'s shards are found by its name (``search`` for
``search\\x00shard0.17``) and come back as one limiter (:func:`limiters`). Only keys a
limiter's config can have count: ``<prefix>{<name as escape_tag writes it>}:config``, a hash
with a config's fields (a client's key whose id ends in ``}:config`` is no limiter).

>>> names("we{*").match, names("we{*").pattern.fullmatch("we{ir}d") is not None
('we%7B*', True)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from ..._sharded import shard_of
from ...backends.redis import RedisBackend
from ...backends.redis._keys import escape_tag
from ..text import plural, shown

__all__ = [
    "SYNTAX",
    "Found",
    "NamePattern",
    "is_glob",
    "limiter_names",
    "limiters",
    "names",
    "redis_escape",
    "unescape_tag",
]

_UNESCAPE = re.compile(r"%(25|7B|7D|00)")
_UNESCAPED = {"25": "%", "7B": "{", "7D": "}", "00": "\x00"}
# A config key after its prefix, as Keys names it: the hash tag holds the name as escape_tag
# writes it (no brace, a % only in an escape), and closes right before ":config".
_CONFIG_KEY = re.compile(r"\{((?:[^%{}]|%(?:25|7B|7D|00))+)\}:config")
_CONFIG_FIELDS = ("rate", "interval", "type")  # what every config hash holds
_CHECKED_AT_ONCE = 500  # config keys checked in one go

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


class Found(NamedTuple):
    """A limiter found on the server: a plain one, or a ``ShardedRateLimiter`` and the
    names its shards' state is kept under."""

    name: str
    stored: tuple[str, ...]
    """Where its state lives: its own name, or its shards' names in shard order."""
    sharded: bool

    @property
    def label(self) -> str:
        """How the commands print it: ``search (sharded: 3 shards)``."""
        if not self.sharded:
            return shown(self.name)
        return f"{shown(self.name)} (sharded: {plural(len(self.stored), 'shard')})"


async def limiters(backend: RedisBackend, pattern: str = "*") -> list[Found]:
    """The limiters whose name matches the glob ``pattern``, sorted by name (a plain
    limiter before a sharded one of the same name), each once."""
    plain: set[str] = set()
    shards: dict[str, dict[int, str]] = {}
    async for stored in limiter_names(backend, pattern):
        shard = shard_of(stored)
        if shard is None:
            plain.add(stored)
        else:
            shards.setdefault(shard[0], {})[shard[1]] = stored
    found = [Found(name, (name,), False) for name in plain]
    found += [
        Found(name, tuple(numbered[i] for i in sorted(numbered)), True)
        for name, numbered in shards.items()
    ]
    return sorted(found, key=lambda each: (each.name, each.sharded))


async def limiter_names(backend: RedisBackend, pattern: str = "*") -> AsyncIterator[str]:
    """The names the configs that match the glob ``pattern`` are stored under (a
    shard's: matched by its sharded limiter's name), read with SCAN over config keys (never
    KEYS, which blocks the server), so a name may come twice if the keyspace is resized
    meanwhile; sorted callers dedupe."""
    redis = backend.redis
    prefix = backend.keys("x").tag[: -len("{x}")]  # the prefix, as Keys writes it
    wanted = names(pattern)
    match = f"{redis_escape(prefix)}{{{wanted.match}:config"
    candidates: list[tuple[Any, str]] = []
    async for key in redis.scan_iter(match=match, count=1000):
        name = _stored_name(key, len(prefix))
        if name is not None and wanted.pattern.fullmatch(_owner(name)):
            candidates.append((key, name))
        if len(candidates) >= _CHECKED_AT_ONCE:
            for name in await _configs_among(redis, candidates):
                yield name
            candidates = []
    for name in await _configs_among(redis, candidates):
        yield name


def _stored_name(key: Any, after: int) -> str | None:
    """The name whose config a key found by SCAN is, from its layout (its first ``after``
    characters are the prefix); None for a key no config has."""
    try:
        text = key.decode() if isinstance(key, bytes) else str(key)
    except UnicodeDecodeError:
        return None  # (a name is UTF-8 text, and so is every key of it)
    layout = _CONFIG_KEY.fullmatch(text, after)
    if layout is None:
        return None
    name = unescape_tag(layout[1])
    if "\x00" in name and shard_of(name) is None:
        return None  # only a shard's name holds a NUL
    return name


def _owner(stored: str) -> str:
    """The name of the limiter whose state ``stored`` is: a shard's sharded limiter."""
    shard = shard_of(stored)
    return stored if shard is None else shard[0]


async def _configs_among(redis: Any, candidates: list[tuple[Any, str]]) -> list[str]:
    """The names of ``candidates`` (key, name) whose key is a hash with a config's fields."""

    if not candidates:
        return []
    # One pipeline, not a command each at once: that would take a connection each, past
    # what a client's pool allows ("Too many connections").
    pipe = redis.pipeline(transaction=False)
    for key, _ in candidates:
        pipe.hmget(key, *_CONFIG_FIELDS)
    replies = await pipe.execute(raise_on_error=False)
    return [
        name
        for (_, name), fields in zip(candidates, replies, strict=True)
        if not isinstance(fields, ResponseError) and None not in fields  # (WRONGTYPE: no hash)
    ]
