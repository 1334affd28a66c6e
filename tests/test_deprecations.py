"""Every name this release deprecates (``aiolimit._deprecated.DEPRECATED``) warns with a
DeprecationWarning at the caller's line, once per line that calls it, and still does its work;
none of them is the documented way (``__all__``, docs/api.md, the pages' code)."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from commands import on_server

import aiolimit
from aiolimit import (
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    Settlement,
    ShardedRateLimiter,
)
from aiolimit._deprecated import DEPRECATED
from aiolimit._tools import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
METHODS = [old.split(".")[1] for old in DEPRECATED if old.startswith("RateLimiter.")]


def from_here(record: pytest.WarningsRecorder) -> None:
    """One DeprecationWarning, pointing at this file (the caller's line), not at aiolimit."""
    assert [(w.category, w.filename) for w in record] == [(DeprecationWarning, __file__)]


# -- the loose rate arguments -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["try_set_rate", "set_rate", "ensure_rate", "update_rate"])
async def test_the_loose_arguments_of_a_set_rate_method_warn_and_still_set_the_rate(
    method: str,
) -> None:
    limiter = RateLimiter("loose", MemoryBackend())
    if method == "update_rate":  # (it writes only over a config)
        await limiter.set_rate("1/second")
    with pytest.warns(DeprecationWarning, match=rf"{method}\(rate_type, rate, \.\.\.\)") as record:
        await getattr(limiter, method)(RateType.OVERALL, 10, 60, algorithm="token_bucket")
    from_here(record)
    assert await limiter.get_config() == RateLimiterConfig.parse(
        "10/minute; algorithm=token_bucket"
    )


async def test_the_loose_arguments_keep_their_keep_state_and_keyword_rate() -> None:
    limiter = RateLimiter("loose", MemoryBackend(), rate="5/minute")
    assert await limiter.try_acquire(5)
    with pytest.warns(DeprecationWarning):
        await limiter.set_rate(RateType.OVERALL, rate=6, interval=60, keep_state=False)
    assert await limiter.available_permits() == 6  # restarted full


@pytest.mark.parametrize(
    "loose",
    [
        {"rate": 10, "interval": 60, "keep_alive": 120},
        {"rate": "10/minute", "keep_alive": 120},
        {"rate": [aiolimit.Rate(10, 60)], "keep_alive": 120, "algorithm": None},
    ],
)
def test_a_constructors_loose_rate_arguments_warn_and_still_give_the_rate(
    loose: dict[str, Any],
) -> None:
    with pytest.warns(DeprecationWarning, match="loose rate arguments") as record:
        limiter = RateLimiter("loose", MemoryBackend(), **loose)
    from_here(record)
    assert limiter.rate_in_code.config == RateLimiterConfig.parse("10/minute; keep_alive=120")
    with pytest.warns(DeprecationWarning, match="loose rate arguments") as record:
        sharded = ShardedRateLimiter(
            "loose", MemoryBackend(), shards=2, rate="10/minute", rate_type="per_client"
        )
    from_here(record)
    assert sharded.rate_in_code.config == RateLimiterConfig.parse("10/minute; rate_type=per_client")


def test_a_keyword_no_release_took_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'intervall'"):
        RateLimiter("loose", MemoryBackend(), rate="1/second", intervall=1)


# -- renamed methods and names ------------------------------------------------------------------


async def test_block_and_unblock_warn_and_still_pause_and_resume() -> None:
    limiter = RateLimiter("renamed", MemoryBackend(), rate="5/minute")
    with pytest.warns(DeprecationWarning, match=r"block\(\).*pause\(\)") as record:
        await limiter.block(30)
    from_here(record)
    assert not await limiter.try_acquire()
    with pytest.warns(DeprecationWarning, match=r"unblock\(\).*resume\(\)") as record:
        assert await limiter.unblock()
    from_here(record)
    assert await limiter.try_acquire()


@pytest.mark.parametrize("kind", [RateLimiter, ShardedRateLimiter])
async def test_sync_warns_and_still_caps_what_is_left(kind: type) -> None:
    shards = {"shards": 2} if kind is ShardedRateLimiter else {}
    limiter = kind("renamed", MemoryBackend(), rate="10/minute", **shards)
    with pytest.warns(DeprecationWarning, match=r"sync\(\).*cap_remaining\(\)") as record:
        await limiter.sync(remaining=2, reset=30)
    from_here(record)
    assert await limiter.available_permits() == 2


@pytest.mark.parametrize("kind", [RateLimiter, ShardedRateLimiter])
async def test_release_of_n_warns_and_still_hands_back_the_newest_grants(kind: type) -> None:
    shards = {"shards": 2} if kind is ShardedRateLimiter else {}
    limiter = kind("renamed", MemoryBackend(), rate="10/minute", **shards)
    assert await limiter.try_acquire(3)
    with pytest.warns(DeprecationWarning, match=r"release\(n\).*Acquired\.release\(\)") as record:
        await limiter.release(2)
    from_here(record)
    assert await limiter.available_permits() == 9


def test_settled_is_settlement_under_its_deprecated_name() -> None:
    with pytest.warns(DeprecationWarning, match=r"aiolimit\.Settled.*aiolimit\.Settlement") as rec:
        from aiolimit import Settled
    # (import asks twice, hasattr then getattr: at one line, shown once outside pytest)
    assert {(w.category, w.filename) for w in rec} == {(DeprecationWarning, __file__)}
    assert Settled is Settlement
    with pytest.warns(DeprecationWarning) as rec:
        assert aiolimit.Settled is Settlement
    from_here(rec)


async def test_a_settle_returns_the_one_settle_type_naming_the_grant_from_then_on() -> None:
    limiter = RateLimiter("settled", MemoryBackend(), rate="10/minute")
    acquired = await limiter.reserve(4)
    settled = await acquired.settle(1)
    assert isinstance(settled, Settlement)
    assert (settled.handed_back, settled.charged, settled.cut) == (3, 0, 0)
    assert settled.member == acquired.attempts[0].member  # what a release names now
    refused = await limiter.reserve(10)
    assert await refused.settle(0) == Settlement(0, 0, "")  # no grant: nothing done


async def test_a_deprecated_call_warns_once_per_line_that_calls_it() -> None:
    limiter = RateLimiter("renamed", MemoryBackend(), rate="5/minute")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")  # Python's own: once per place
        for _ in range(3):
            await limiter.block(0)
        await limiter.block(0)
    lines = [w.lineno for w in record]
    assert len(lines) == 2 and lines[0] != lines[1], lines
    assert all(w.filename == __file__ for w in record)


@pytest.mark.parametrize(
    ("old", "new", "says"), [("block", "pause", "paused"), ("unblock", "resume", "resumed")]
)
def test_the_old_command_names_say_so_and_still_run(
    capsys: pytest.CaptureFixture[str], url: str, name: str, old: str, new: str, says: str
) -> None:
    assert cli.main(["set-rate", name, "5/second", "--redis", url]) == 0
    assert cli.main(["pause", name, "30", "--redis", url]) == 0
    capsys.readouterr()
    code = cli.main([old, name, *(["30"] if old == "block" else []), "--redis", url])
    out, err = capsys.readouterr()
    assert (code, err) == (0, f"aiolimit {old} is deprecated: use aiolimit {new}\n")
    assert out.startswith(f"{says} {name}")

    async def delete(backend: RedisBackend) -> bool:
        return await RateLimiter(name, backend).delete()

    assert on_server(url, delete)


# -- none is the documented way -----------------------------------------------------------------


def test_no_deprecated_name_is_in_all_or_the_api_reference() -> None:
    reference = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for old, new in DEPRECATED.items():
        if old.startswith("aiolimit."):
            assert old.removeprefix("aiolimit.") not in aiolimit.__all__
            assert f"::: {old}\n" not in reference
            assert new.removeprefix("aiolimit.") in aiolimit.__all__
            assert f"::: {new}\n" in reference
    for limiter in ("RateLimiter", "ShardedRateLimiter"):
        entry = reference.split(f"::: aiolimit.{limiter}\n")[1].split(":::")[0]
        hidden = re.search(r"filters: (\[.*\])", entry)
        assert hidden is not None, f"{limiter}'s entry hides no deprecated method"
        assert {f"!^{method}$" for method in METHODS} <= set(ast.literal_eval(hidden[1]))
    for old, new in DEPRECATED.items():
        owner, _, method = new.partition(".")
        if old.startswith("RateLimiter."):
            assert hasattr(getattr(aiolimit, owner), method), new


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_shows_a_deprecated_call(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    deprecated = [
        r"\.(block|unblock|sync)\(",  # a call of a renamed method
        r"\blimiter\.release\(\d",  # a hand-back of anyone's newest grants
        r"aiolimit (block|unblock) ",  # a renamed command
        r"(set_rate|ensure_rate|update_rate)\(RateType\.",  # the loose arguments
        r"\brate=[^,)]+,\s*(interval|rate_type|algorithm|min_spacing|keep_alive|margin|max_debt)=",
        r"\bSettled\(",
    ]
    shown = [m[0] for pattern in deprecated for m in re.finditer(pattern, text)]
    assert shown == []
