"""Every example runs to completion on the memory backend and on a real redis-server, where
it leaves no key without a TTL (its limiters have a ``keep_alive`` or are deleted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from tools import LocalRedis

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.slow
DATABASE = 8  # of the session's redis-server: the other tests use database 0, the docs 9


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> Iterator[str]:
    """A database of its own for the example, emptied before it; after it, no key of it may
    stay for good."""
    url = f"{redis_server.url}/{DATABASE}"
    with sync_redis.Redis.from_url(url) as client:
        client.flushdb()
        yield url
        kept = sorted(key.decode() for key in client.scan_iter() if client.pttl(key) == -1)
    assert kept == [], "delete the example's limiters, or give them keep_alive"


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    return result.stdout


def check_quickstart(out: str) -> None:
    lines = out.splitlines()
    calls = [line for line in lines if " item " in line]
    assert len(calls) == 12
    assert all(line.endswith("-> 200") for line in calls)
    # 5 per second: the first five at once, the last two only after two full intervals.
    assert float(calls[4].split("s")[0]) < 0.5
    assert float(calls[-1].split("s")[0]) >= 2.0
    assert lines[-1].startswith("12 calls in ")
    assert ", 0 rejected by the partner (its limit: 5 per 1s)" in lines[-1]


def check_per_client(out: str) -> None:
    assert "alice  5 pushed, 3 in the digest" in out
    assert "bob    2 pushed, 0 in the digest" in out
    assert "carol  2 pushed, 0 in the digest" in out
    assert out.splitlines()[-1] == "OK: no user got more than 3 pushes in any 1s"


def test_quickstart_on_the_memory_backend():
    check_quickstart(run_example("quickstart.py", env={"AIOLIMIT_REDIS_URL": ""}))


def test_per_client_on_the_memory_backend():
    check_per_client(run_example("per_client.py", env={"AIOLIMIT_REDIS_URL": ""}))


def test_the_readme_quick_start_runs_as_printed(redis_url: str):
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme[readme.index("## Quick start") :]
    script = section[section.index("```python\n") + len("```python\n") :]
    script = script[: script.index("```")]
    assert "redis://localhost:6379" in script
    result = subprocess.run(
        [sys.executable, "-c", script.replace("redis://localhost:6379", redis_url)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [line for line in result.stdout.splitlines() if line.startswith("calling")]
    assert calls == [f"calling the partner API {i}" for i in range(4)], result.stdout


def check_several_limits(out: str) -> None:
    # 24 calls at 3 per second and 20 per minute: the 21st waits for the minute, none is
    # refused by the partner, which enforces both limits itself.
    assert "24 calls, 0 rejected with 429; the per-minute limit held back call 20 " in out, out
    calls = re.findall(r"call +(\d+) at +([\d.]+) s \(scaled\), waited +([\d.]+) s", out)
    assert [int(i) for i, _, _ in calls] == list(range(24)), out
    at = [float(t) for _, t, _ in calls]
    waited = [float(w) > 0 for _, _, w in calls]
    # The times are the grants' starts on the limiter's clock (on a clock 20 times faster,
    # to 0.01 s): no call starts before both rates allow it, whatever the machine's load.
    # How soon after it a waiting call starts is the fleet's measured margin (at most 0.1 s
    # here) and, as acquire_all paces a grant that may be settled, when its process asks
    # again: real time, so only the minute's wait is checked, and loosely.
    for i in range(3, 24):
        allowed = max(at[i - 3] + 1.0, at[i - 20] + 60.0 if i >= 20 else 0.0)
        assert at[i] >= allowed - 0.01, (i, out)
    assert at[19] >= 6.0, out  # the per-second limit: 3 a second from 0
    assert waited[20] and 60.0 - 0.01 <= at[20] <= 60.0 + 3.0, out  # call 0 leaves the minute


def test_several_limits_on_the_memory_backend():
    check_several_limits(run_example("several_limits.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_fastapi_app(out: str) -> None:
    lines = out.splitlines()
    codes = [line.split("-> ")[1][:3] for line in lines]
    assert codes == ["200"] * 5 + ["429"] + ["200"] * 3 + ["429"]
    assert '"example-per-client";r=0;t=1' in lines[4]
    assert lines[5].endswith("Retry-After: 1")
    assert '"example-login";r=0;t=60' in lines[9]
    assert lines[9].endswith("Retry-After: 60")


def test_fastapi_app_on_the_memory_backend():
    check_fastapi_app(run_example("fastapi_app.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_partner_api(out: str) -> None:
    # The forced 429, logged once by the process that received it (aiolimit's WARNING).
    paused = "WARNING aiolimit: limiter 'example-partner-api': the server answered 429; "
    assert [line for line in out.splitlines() if line.startswith(paused)] == [
        paused + "pausing every caller 1 s"
    ], out
    assert "429s for the partner's quota: 0" in out
    assert "forced 429 (Retry-After: 1), then calls during the pause: 0" in out
    assert "calls answered 200 in this process: 36 of 36" in out
    assert out.splitlines()[-1] == "OK: no 429 for the quota, and every worker paused"


def test_partner_api_in_memory():
    check_partner_api(run_example("partner_api.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_llm_client(out: str) -> None:
    lines = out.splitlines()
    # Settled by their usage, nine requests fit a budget their estimates alone (about 380
    # tokens each) would have let five of through; none reaches the provider's 429.
    assert lines[-1] == "9 answered, 3 held back, 0 refused by the provider"
    assert lines[8].startswith("request  8: 200")


def test_llm_client_in_memory():
    check_llm_client(run_example("llm_client.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_openai_sdk(out: str) -> None:
    pause = "WARNING aiolimit: limiter 'example-openai-requests': the server answered 429"
    assert sum(line.startswith(pause) for line in out.splitlines()) == 1, out
    lines = [line for line in out.splitlines() if not line.startswith("WARNING")]
    assert lines[0].startswith("12 answers, ") and lines[0].endswith("SDK errors: 0")
    # One 429, sent again once by the transport after the pause: 13 arrivals, and each had
    # a permit of its own; an SDK retry on top would make a 14th.
    assert lines[1].startswith("provider: 13 arrivals, 1 refused (429); permits granted: 13 ")


def test_openai_sdk_in_memory():
    check_openai_sdk(run_example("openai_sdk.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_anthropic_sdk(out: str) -> None:
    pause = "WARNING aiolimit: limiter 'example-anthropic-requests': the server answered 429"
    assert sum(line.startswith(pause) for line in out.splitlines()) == 1, out
    lines = [line for line in out.splitlines() if not line.startswith("WARNING")]
    assert lines[0].startswith("12 answers, ") and lines[0].endswith("SDK errors: 0")
    assert " input and " in lines[0] and " output tokens used" in lines[0]
    # One 429, sent again once by the transport after the pause: 13 arrivals, and each had
    # a permit of its own; an SDK retry on top would make a 14th.
    assert lines[1].startswith("provider: 13 arrivals, 1 refused (429); permits granted: 13 ")


def test_anthropic_sdk_in_memory():
    check_anthropic_sdk(run_example("anthropic_sdk.py", env={"AIOLIMIT_REDIS_URL": ""}))


def check_partner_api_through_redis(out: str) -> None:
    assert "two processes, 12 workers: 73 calls reached the partner\n" in out
    check_partner_api(out)


# -- every example, on a server named by --redis or by AIOLIMIT_REDIS_URL --------------------

ON_REDIS: dict[str, Callable[[str], None]] = {
    "quickstart.py": check_quickstart,
    "per_client.py": check_per_client,
    "several_limits.py": check_several_limits,
    "fastapi_app.py": check_fastapi_app,
    "partner_api.py": check_partner_api_through_redis,
    "llm_client.py": check_llm_client,
    "openai_sdk.py": check_openai_sdk,
    "anthropic_sdk.py": check_anthropic_sdk,
}


def test_every_example_is_checked_and_listed_in_the_docs() -> None:
    examples = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert sorted(ON_REDIS) == examples
    index = (EXAMPLES.parent / "docs" / "index.md").read_text()
    for name in examples:
        assert f"python examples/{name} " in index and f"`examples/{name}`" in index, name


def scripts_run(url: str) -> int:
    """The scripts (and functions) the server has run so far."""
    with sync_redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in SCRIPT_COMMANDS)


SCRIPT_COMMANDS = ("fcall", "evalsha", "eval")


@pytest.mark.parametrize("way", ["--redis", "AIOLIMIT_REDIS_URL"])
@pytest.mark.parametrize("name", sorted(ON_REDIS))
def test_every_example_runs_on_the_server_named_by_the_flag_or_the_environment(
    redis_url: str, name: str, way: str
) -> None:
    before = scripts_run(redis_url)
    if way == "--redis":
        out = run_example(name, "--redis", redis_url, env={"AIOLIMIT_REDIS_URL": ""})
    else:
        out = run_example(name, env={"AIOLIMIT_REDIS_URL": redis_url})
    ON_REDIS[name](out)
    assert scripts_run(redis_url) > before, f"{name} did not use the server ({way})"
