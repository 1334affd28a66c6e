"""A limiter's config is a value: :class:`RateLimiterConfig`, or its text
(:meth:`RateLimiterConfig.parse`, written back by ``str(config)``), is what every set-rate
method and ``RateLimiter(rate=...)`` take; a ``ConcurrencyLimiter``'s limit the code owns is
ensured as a rate is (``ensure_limit``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from conftest import Store

from aiolimit import (
    Algorithm,
    ConcurrencyConfig,
    ConcurrencyLimiter,
    InvalidArgumentError,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    ShardedRateLimiter,
)

CONFIGS = [
    RateLimiterConfig.build(RateType.OVERALL, "10/second"),
    RateLimiterConfig.build(RateType.PER_CLIENT, "3/second; 100/hour", algorithm="token_bucket"),
    RateLimiterConfig.build(
        RateType.OVERALL, [Rate(5, 0.25)], keep_alive=3600, min_spacing=0.05, max_debt=7
    ),
    RateLimiterConfig.build(RateType.OVERALL, "60/minute", margin=0.05, algorithm="fixed_window"),
    RateLimiterConfig.build(RateType.OVERALL, 7, timedelta(microseconds=1234567), keep_alive=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_a_configs_text_reads_back_as_the_same_config(config: RateLimiterConfig) -> None:
    assert RateLimiterConfig.parse(str(config)) == config


def test_the_text_names_each_setting_build_takes() -> None:
    text = "60/minute; 5/second; rate_type=Per-Client; algorithm=TOKEN_BUCKET; keep_alive=1 hour"
    assert RateLimiterConfig.parse(text + "; max_debt=30") == RateLimiterConfig.build(
        RateType.PER_CLIENT,
        [Rate(60, 60), Rate(5, 1)],
        keep_alive=3600,
        algorithm=Algorithm.TOKEN_BUCKET,
        max_debt=30,
    )
    widened = RateLimiterConfig.parse("10/second; margin=0.05; min_spacing=0.02")
    assert widened == RateLimiterConfig.build(
        RateType.OVERALL, "10/second", margin=0.05, min_spacing=0.02
    )
    assert str(RateLimiterConfig.parse("10/second")) == "10/second"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no rate in ''"),
        ("keep_alive=60", "no rate in 'keep_alive=60'"),
        ("10/second; algoritm=token_bucket", "no setting 'algoritm'"),
        ("10/second; keep_alive=a while", "cannot read keep_alive='a while'"),
        ("10/second; max_debt=-1", "cannot read max_debt='-1'"),
        ("10/second; max_debt=²", "cannot read max_debt='²'"),
        ("10/second; keep_alive=60; keep_alive=70", "keep_alive is given twice"),
        ("10/second; keep_alive=0.5", "must not be shorter than the interval"),
        ("10/second; algorithm=leaky", "algorithm must be one of"),
        ("10/second; rate_type=per_user", "rate_type must be"),
        ("ten/second", "cannot read the rate 'ten/second'"),
    ],
)
def test_text_that_is_no_config_says_which_part_it_could_not_read(text: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        RateLimiterConfig.parse(text)


@pytest.mark.parametrize("method", ["try_set_rate", "set_rate", "ensure_rate", "update_rate"])
async def test_every_set_rate_method_takes_a_config_or_its_text(
    store: Store, name: str, method: str
) -> None:
    limiter = RateLimiter(name, store.backend())
    config = RateLimiterConfig.build(RateType.PER_CLIENT, "4/second; 9/minute", keep_alive=120)
    if method == "update_rate":  # (it writes only over a config)
        await limiter.set_rate("1/second; keep_alive=60")
    await getattr(limiter, method)(config)
    assert await limiter.get_config() == config
    await limiter.delete()
    if method == "update_rate":
        await limiter.set_rate("1/second; keep_alive=60")
    await getattr(limiter, method)(str(config))
    assert await limiter.get_config() == config
    await limiter.delete()


async def test_set_rate_and_update_rate_take_keep_state_beside_the_config(
    store: Store, name: str
) -> None:
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate("5/minute; keep_alive=120")
    assert await limiter.try_acquire(5)
    await limiter.set_rate("6/minute; keep_alive=120")  # what was granted keeps counting
    assert await limiter.available_permits() == 1
    assert await limiter.update_rate("6/minute; keep_alive=120", keep_state=False)
    assert await limiter.available_permits() == 6
    await limiter.delete()


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda lim: lim.set_rate(5), InvalidArgumentError, "a RateLimiterConfig or its text"),
        (lambda lim: lim.set_rate(None), InvalidArgumentError, "a RateLimiterConfig or its text"),
        (
            lambda lim: lim.set_rate(RateLimiterConfig.parse("1/second"), algorithm="fixed"),
            TypeError,
            "takes a RateLimiterConfig",
        ),
        (lambda lim: lim.ensure_rate("1/second", keep_state=False), TypeError, "keep_state"),
        (lambda lim: lim.try_set_rate("overall", 1, 2, 3), TypeError, "takes a RateLimiterConfig"),
    ],
)
async def test_a_set_rate_call_without_a_config_is_refused(
    call: Any, error: type, says: str
) -> None:
    with pytest.raises(error, match=says):
        await call(RateLimiter("refused", MemoryBackend()))


def test_a_constructor_takes_a_config_or_its_text() -> None:
    config = RateLimiterConfig.parse("10/second; rate_type=per_client; keep_alive=60")
    assert RateLimiter("given", MemoryBackend(), rate=config).rate_in_code.config == config
    assert RateLimiter("given", MemoryBackend(), rate=str(config)).rate_in_code.config == config
    sharded = ShardedRateLimiter("given", MemoryBackend(), shards=2, rate=str(config))
    assert sharded.rate_in_code.config == config
    with pytest.raises(InvalidArgumentError, match="holds its settings"):
        RateLimiter("given", MemoryBackend(), rate=config, keep_alive=60)
    with pytest.raises(InvalidArgumentError, match="cannot be kept by a ShardedRateLimiter"):
        ShardedRateLimiter("given", MemoryBackend(), shards=2, rate="10/second; min_spacing=0.1")


# -- ConcurrencyLimiter.ensure_limit -------------------------------------------------------------


async def test_ensure_limit_writes_where_none_or_another_is_and_not_again(
    store: Store, name: str
) -> None:
    sem = ConcurrencyLimiter(name, store.backend())
    assert await sem.ensure_limit(3, lease=10)  # none: written
    assert await sem.get_config() == ConcurrencyConfig(3, timedelta(seconds=10))
    assert not await sem.ensure_limit(3, lease=10)  # the same: nothing written
    assert await sem.ensure_limit(5, lease=10)  # another: written
    assert await sem.get_config() == ConcurrencyConfig(5, timedelta(seconds=10))
    await sem.delete()


async def test_a_limit_ensured_is_the_codes_and_written_again_after_a_loss(
    store: Store, name: str
) -> None:
    sem = ConcurrencyLimiter(name, store.backend())
    assert await sem.ensure_limit(2, lease=10)
    await sem.delete()  # lost
    lease = await sem.try_lease()
    assert lease is not None
    assert await sem.get_config() == ConcurrencyConfig(2, timedelta(seconds=10))
    await lease.release()
    await sem.delete()


async def test_ensure_limit_checks_its_arguments() -> None:
    sem = ConcurrencyLimiter("checked", MemoryBackend())
    with pytest.raises(InvalidArgumentError, match="max_in_flight"):
        await sem.ensure_limit(0)
    with pytest.raises(InvalidArgumentError, match="lease"):
        await sem.ensure_limit(1, lease=0)
