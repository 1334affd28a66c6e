"""A provider's rate-limit headers (OpenAI's and Anthropic's), read defensively: what cannot
be read is ignored, and no value, however absurd, makes a count or a reset unbounded."""

from __future__ import annotations

import pytest

from aiolimit._quota_headers import Quota, duration_seconds, quota, stated_limit
from aiolimit._types import MAX_RATE

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1.5s", 1.5),
        ("20ms", 0.02),
        ("1h2m3s", 3723.0),
        ("7.66s", 7.66),
        ("0s", 0.0),
        ("12", 12.0),
        ("250us", 0.00025),
    ],
)
def test_durations_as_providers_write_them(text, seconds):
    assert duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "-1s", "1x", "s", "1s2", "nan", "inf", "1e9s", "1s 2s", "m6", "9" * 400]
)
def test_durations_that_cannot_be_read(text):
    assert duration_seconds(text) is None


def test_openai_headers():
    headers = {
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert quota(headers, "requests", now=NOW) == Quota(59, 1.0)
    assert quota(headers, "tokens", now=NOW) == Quota(149984, 360.0)


def test_anthropic_headers():
    headers = {
        "anthropic-ratelimit-tokens-remaining": "80000",
        "anthropic-ratelimit-tokens-reset": "2027-01-15T08:00:12Z",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:00.500+00:00",
    }
    assert quota(headers, "tokens", now=NOW) == Quota(80000, pytest.approx(12.0))
    assert quota(headers, "requests", now=NOW) == Quota(49, pytest.approx(0.5))


def test_a_reset_in_the_past_is_now():
    headers = {
        "anthropic-ratelimit-tokens-remaining": "5",
        "anthropic-ratelimit-tokens-reset": "2020-01-01T00:00:00Z",
    }
    assert quota(headers, "tokens", now=NOW) == Quota(5, 0.0)


@pytest.mark.parametrize(
    ("remaining", "reset"),
    [
        ("-5", "1s"),
        ("five", "1s"),
        ("5", "soon"),
        ("5", "-2s"),
        ("5.5", "1s"),
        ("", "1s"),
        ("5", "9999-99-99T00:00:00Z"),
    ],
)
def test_values_that_cannot_be_read_are_ignored(remaining, reset):
    headers = {"x-ratelimit-remaining-tokens": remaining, "x-ratelimit-reset-tokens": reset}
    assert quota(headers, "tokens", now=NOW) is None


def test_absurd_values_are_bounded():
    headers = {"x-ratelimit-remaining-tokens": "9" * 20, "x-ratelimit-reset-tokens": "99999h"}
    assert quota(headers, "tokens", now=NOW) == Quota(MAX_RATE, 3600.0)
    far = {
        "anthropic-ratelimit-tokens-remaining": "1",
        "anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z",
    }
    assert quota(far, "tokens", now=NOW, max_reset=60.0) == Quota(1, 60.0)


def test_no_headers_no_quota():
    assert quota({}, "tokens") is None
    assert quota({"x-ratelimit-remaining-tokens": "5"}, "tokens") is None  # no reset


def test_a_lookup_function_is_taken():
    headers = {"X-RateLimit-Remaining-Requests": "3", "X-RateLimit-Reset-Requests": "20ms"}
    lowered = {name.lower(): value for name, value in headers.items()}
    assert quota(lowered.get, "requests", now=NOW) == Quota(3, 0.02)


# -- the limit a partner states -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "kind", "stated"),
    [
        ({"x-ratelimit-limit-requests": "500"}, "requests", (500, 60.0)),
        ({"x-ratelimit-limit-tokens": "30000"}, "tokens", (30000, 60.0)),
        ({"anthropic-ratelimit-requests-limit": "50"}, "requests", (50, 60.0)),
        ({"anthropic-ratelimit-tokens-limit": "80000"}, "tokens", (80000, 60.0)),
        (
            {
                "anthropic-ratelimit-input-tokens-limit": "40000",
                "anthropic-ratelimit-output-tokens-limit": "8000",
            },
            "tokens",
            (48000, 60.0),
        ),
        ({"ratelimit-policy": '"burst";q=12;w=1, "day";q=1000;w=86400'}, "requests", (12, 1.0)),
        ({"ratelimit-policy": "100;w=10"}, "requests", (100, 10.0)),
        ({"ratelimit-policy": '"bytes";q=9;w=1;qu="content-bytes"'}, "requests", None),
        ({"ratelimit-policy": '"p";q=12;w=1'}, "tokens", None),
    ],
)
def test_a_stated_limit_is_read_from_every_providers_headers(headers, kind, stated):
    assert stated_limit(headers, kind) == stated


@pytest.mark.parametrize(
    "headers",
    [
        {"x-ratelimit-limit-requests": "-5"},
        {"x-ratelimit-limit-requests": "9" * 400},
        {"x-ratelimit-limit-requests": "1e9"},
        {"ratelimit-policy": '"p";q=12;w=0'},
        {"ratelimit-policy": '"p";q=12;w=99999999999'},
        {"ratelimit-policy": '"p";q=abc;w=1'},
        {"ratelimit-policy": "x" * 5000},
        {"ratelimit-policy": ";;;,,,=="},
    ],
)
def test_a_stated_limit_that_cannot_be_read_is_ignored(headers):
    assert stated_limit(headers, "requests") is None


def test_a_stated_limit_is_at_most_max_rate():
    assert stated_limit({"x-ratelimit-limit-requests": "9" * 20}, "requests") == (MAX_RATE, 60.0)
