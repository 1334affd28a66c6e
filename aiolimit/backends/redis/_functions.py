"""The scripts as one Redis Functions library (Redis >= 7, Valkey), loaded once per server.

Sent with EVALSHA, a script's whole Lua (the core, every algorithm, the operation) runs from
the top on every call: each of its functions is defined again before the operation starts.
Loaded once with ``FUNCTION LOAD``, the library is defined once, and ``FCALL`` runs only the
operation. Each operation's file becomes the body of a function taking ``KEYS`` and ``ARGV``,
so the same files serve both ways. The library's name carries a digest of every Lua file, so
two versions of aiolimit sharing a server each load and call their own.

A server without functions (Redis 6), or a user the ACL does not let load them, gets the
scripts with EVALSHA, as before (``_wire``).
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

__all__ = ["LIBRARY_NAME", "function_name", "library", "register"]


def _lua(name: str) -> str:
    return (resources.files("aiolimit.backends.redis") / "lua" / f"{name}.lua").read_text()


def _digest() -> str:
    lua = resources.files("aiolimit.backends.redis") / "lua"
    files = sorted(item.name for item in lua.iterdir() if item.name.endswith(".lua"))
    digest = hashlib.sha1()
    for name in files:
        digest.update(name.encode() + b"\0" + (lua / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


LIBRARY_NAME = f"aiolimit_{_digest()}"

# The operations, as (name, files before it), in the order they were defined.
_operations: list[tuple[str, tuple[str, ...]]] = []


def function_name(operation: str) -> str:
    return f"{LIBRARY_NAME}_{operation}"


def register(operation: str, prelude: tuple[str, ...]) -> str:
    """Adds an operation (``lua/<operation>.lua``, run after the files ``prelude``) to the
    library; its function's name."""
    _operations.append((operation, prelude))
    library.cache_clear()
    return function_name(operation)


@cache
def library() -> str:
    """The library's code for ``FUNCTION LOAD``: every prelude file once, in order, then one
    function per operation, which starts with lib.lua's ``begin_call()``."""
    files: list[str] = []
    for _, prelude in _operations:
        files += [name for name in prelude if name not in files]
    parts = [f"#!lua name={LIBRARY_NAME}", *(_lua(name) for name in files)]
    for operation, _ in _operations:
        parts.append(
            f"redis.register_function('{function_name(operation)}', function(KEYS, ARGV)\n"
            f"begin_call()\n{_lua(operation)}\nend)"
        )
    return "\n".join(parts) + "\n"
