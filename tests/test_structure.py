"""The rules of the house the type checker cannot see, checked on the package's source: no
module reads another object's private attributes, the engine's result is never patched or
copied after the engine built it, and the engine counts time in one unit, converted in one
place."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import aiolimit
from aiolimit import Acquired, InFlight

ROOT = Path(aiolimit.__file__).resolve().parent

# A namedtuple's own methods start with "_" so as not to clash with its fields: public API.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}

# Reads of another object's private attributes still allowed, by file, each with its reason.
ALLOWED: dict[str, set[str]] = {}

# The engine and the callers that hand it requests: time in integer µs on the loop's clock.
ENGINE = [
    "_acquire.py",
    "_acquired.py",
    "_attempts.py",
    "_breaker.py",
    "_calls.py",
    "_inflight.py",
    "_limiter.py",
    "_meter.py",
    "_settling.py",
    "_sharded.py",
    "_wakeup.py",
]
CONVERSION = "_values.py"  # the one place the package turns µs into seconds and back

# Constants of a million elsewhere that are not conversions of a duration, each with its reason.
NOT_CONVERSIONS = {
    "_quota_headers.py": "the units a header's duration may be written in (ms, us, ns)",
    "backends/_learning.py": "MILLION, the fixed-point scale of a learned share",
}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def _own(node: ast.expr, made: Collection[str] = ()) -> bool:
    """Whether ``node`` is the object itself: ``self``, ``cls``, ``super()``, or one of the
    ``made`` (an object its class is making from parts: ``view = RateLimiter.__new__(...)``)."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls") or node.id in made
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _made(function: ast.AST) -> set[str]:
    """The names a function binds to objects it makes with ``__new__``."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "__new__"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _attributes(tree: ast.Module) -> Iterator[tuple[ast.Attribute, set[str]]]:
    """Every attribute access, with the names of objects its function is making."""
    made: dict[ast.AST, set[str]] = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _made(function)
            for node in ast.walk(function):
                made.setdefault(node, set()).update(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node, made.get(node, set())


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reads() -> dict[str, set[str]]:
    """file -> the private attributes it reaches for on objects other than its own."""
    found: dict[str, set[str]] = {}
    for where, tree in _sources():
        for node, made in _attributes(tree):
            if (
                _private(node.attr)
                and node.attr not in NAMEDTUPLE_API
                and not _own(node.value, made)
            ):
                found.setdefault(where, set()).add(node.attr)
    return found


def test_no_module_reads_another_object_s_private_attributes() -> None:
    found = _private_reads()
    wrong = {
        where: sorted(names - ALLOWED.get(where, set()))
        for where, names in found.items()
        if names - ALLOWED.get(where, set())
    }
    assert wrong == {}, "expose what is needed, or pass the value"


def test_every_allowed_private_read_is_still_made() -> None:
    found = _private_reads()
    stale = {
        where: sorted(names - found.get(where, set()))
        for where, names in ALLOWED.items()
        if names - found.get(where, set())
    }
    assert stale == {}, "drop these from ALLOWED"


# No acquisition reaches the stores or the command line: their permits are counts of their own.
NO_ACQUISITIONS = ("backends/", "_tools/")
# A counter of its own that shares a name with an acquisition's: the ASGI gate's requests
# that waited.
NOT_AN_ACQUISITION = {"self.stats.waited"}


def test_no_module_patches_an_acquisition_the_engine_built() -> None:
    attributes = {slot for cls in (Acquired, InFlight) for slot in cls.__slots__}
    patched = []
    for where, tree in _sources():
        if where.startswith(NO_ACQUISITIONS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = (
                    node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                )
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr in attributes
                        and not _own(target.value)
                        and ast.unparse(target) not in NOT_AN_ACQUISITION
                    ):
                        patched.append(f"{where}:{node.lineno}: {ast.unparse(target)}")
    assert patched == []


def test_no_module_copies_an_object_by_reflection_over_its_slots() -> None:
    copying = []
    for where, tree in _sources():
        for node in ast.walk(tree):
            reads_slots = (isinstance(node, ast.Attribute) and node.attr == "__slots__") or (
                isinstance(node, ast.Constant) and node.value == "__slots__"
            )
            if reads_slots:
                copying.append(f"{where}:{node.lineno}")
    assert copying == []


def _numbers(tree: ast.Module) -> Iterator[tuple[int, object]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            yield node.lineno, node.value


def test_the_engine_converts_microseconds_to_seconds_in_one_place() -> None:
    sources = dict(_sources())
    assert set(ENGINE) <= set(sources)
    converting = {
        name: [line for line, value in _numbers(sources[name]) if value in (1e6, 1e-6)]
        for name in ENGINE
    }
    assert {name: lines for name, lines in converting.items() if lines} == {}
    assert any(value == 1e6 for _, value in _numbers(sources[CONVERSION]))


def test_the_package_converts_durations_in_one_place() -> None:
    # A million (or a millionth) anywhere but the units' module is a duration converted by
    # hand: use _values.seconds, micros_up, whole_seconds_up, US.
    converting = {
        name: [line for line, value in _numbers(tree) if value in (1e6, 1e-6)]
        for name, tree in _sources()
        if name not in (CONVERSION, *NOT_CONVERSIONS)
    }
    assert {name: lines for name, lines in converting.items() if lines} == {}
    sources = dict(_sources())
    for name in NOT_CONVERSIONS:  # (each still has the constant it is allowed)
        assert any(value in (1e6, 1e-6) for _, value in _numbers(sources[name])), name


# The HTTP clients' adapters: each drives the one flow of a call (_client_flow), and none takes,
# hands back, pauses or settles a permit itself, nor reaches the engine or the stores.
CLIENT_ADAPTERS = ["_transport.py", "httpx.py", "httpx2.py", "aiohttp.py", "_aiohttp_stream.py"]
DRIVERS = ["_transport.py", "aiohttp.py"]
FLOW = "_client_flow"
ENGINE_MODULES = {"_calls", "_acquire", "_acquired", "_attempts", "_inflight", "_lease", "_request"}
# What the token meter offers beside its body readers: the flow's to use, not an adapter's.
METER_STEPS = {"TokenMeter", "KindsMeter", "meter_of", "sync_from", "UsageTail"}
PERMIT_CALLS = {
    "before_call",
    "after_headers",
    "pause_for",
    "unsent",
    "unused",
    "settle",
    "settle_used",
    "take",
    "try_acquire",
    "acquire",
    "reserve",
    "try_lease",
    "pause",
    "cap",
    "cap_remaining",
    "hand_back",
    "spawn",
    "__aenter__",
    "__aexit__",
}


def _relative_imports(tree: ast.Module) -> Iterator[tuple[str, set[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            yield node.module or "", {alias.name for alias in node.names}


def test_the_http_clients_take_no_permit_themselves_and_reach_no_engine_module() -> None:
    sources = dict(_sources())
    wrong: dict[str, list[str]] = {}
    for name in CLIENT_ADAPTERS:
        tree = sources[name]
        for module, names in _relative_imports(tree):
            top = module.split(".")[0]
            if top in ENGINE_MODULES or top == "backends":
                wrong.setdefault(name, []).append(f"imports {module}")
            elif top == "_meter" and names & METER_STEPS:
                wrong.setdefault(name, []).append(f"imports {sorted(names & METER_STEPS)}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in PERMIT_CALLS
            ):
                wrong.setdefault(name, []).append(f"{node.lineno}: calls .{node.func.attr}()")
    assert wrong == {}, "the flow (_client_flow) takes and settles permits; adapters drive it"


def test_both_http_clients_drive_the_one_flow() -> None:
    sources = dict(_sources())
    for name in DRIVERS:
        from_flow = {
            imported
            for module, names in _relative_imports(sources[name])
            if module == FLOW
            for imported in names
        }
        assert "drive" in from_flow, f"{name} does not drive {FLOW}"
        called = {
            node.func.id
            for node in ast.walk(sources[name])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "drive" in called, f"{name} does not drive {FLOW}"
