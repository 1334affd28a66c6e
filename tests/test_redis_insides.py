"""aiolimit reads no private attribute of redis-py's (or valkey-py's) objects: a new redis-py
may rename or repurpose them at any release, and the public methods carry what its own
versions add (RESP3 push messages, maintenance notifications, health checks)."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import redis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

ROOT = Path(__file__).resolve().parent.parent / "aiolimit"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def library_insides() -> frozenset[str]:
    """The private attribute names of the client libraries' classes and of a client, its
    pool, a connection, its parser and a pipeline."""
    names: set[str] = set()
    libraries = [redis]
    try:
        import valkey
    except ImportError:  # pragma: no cover - valkey-py is optional
        pass
    else:
        libraries.append(valkey)
    for library in libraries:
        for module_info in pkgutil.walk_packages(library.__path__, f"{library.__name__}."):
            try:
                module = importlib.import_module(module_info.name)
            except Exception:  # an optional dependency missing: nothing to read
                continue
            for _, kind in inspect.getmembers(module, inspect.isclass):
                if kind.__module__.startswith(library.__name__):
                    names.update(filter(_private, dir(kind)))
    connection, client = Connection(), Redis()
    for thing in (
        connection,
        connection._parser,
        client,
        client.connection_pool,
        client.pipeline(),
    ):
        names.update(filter(_private, vars(thing)))
    return frozenset(names)


def reads(tree: ast.AST, insides: frozenset[str]) -> Iterator[tuple[int, str]]:
    """Where ``tree`` reads one of ``insides`` off an object other than ``self``/``cls``:
    ``thing._name``, or ``getattr``/``hasattr``/``setattr``/``delattr(thing, "_name")``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in insides:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                yield node.lineno, ast.unparse(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in insides
        ):
            yield node.lineno, ast.unparse(node)


def test_the_check_finds_a_read_of_redis_pys_insides() -> None:
    insides = library_insides()
    assert {"_writer", "_parser", "_available_connections"} <= insides
    code = "connection._writer.write(b'')\nhasattr(connection, '_parser')\nself._writer = 1\n"
    assert sorted(line for line, _ in reads(ast.parse(code), insides)) == [1, 2]


def test_aiolimit_reads_no_private_attribute_of_redis_py() -> None:
    insides = library_insides()
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {text}"
        for path in sorted(ROOT.rglob("*.py"))
        for line, text in reads(ast.parse(path.read_text(encoding="utf-8")), insides)
    ]
    assert not found, "redis-py's private attributes read:\n" + "\n".join(found)
