"""The `aiolimit` command line: the demo's verdict on every backend, and clean errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from aiolimit._tools import demo
from aiolimit._tools.window import Window, busiest_window
from tools import LocalRedis, free_port


def aiolimit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiolimit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_passing_verdict(result: subprocess.CompletedProcess[str], rate: int) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("t=1 ") for line in lines), result.stdout
    verdict = {line.split()[0]: line for line in lines if line and not line.startswith("t=")}
    assert verdict["grants"].split()[1].isdigit()
    busiest = int(verdict["busiest"].split()[2])
    assert 0 < busiest <= rate
    assert f"(rate {rate};" in verdict["busiest"]
    utilisation = float(verdict["utilisation"].split()[1].rstrip("%"))
    assert utilisation > 50, result.stdout
    assert verdict["PASS:"] == f"PASS: no 1 s window held more than {rate} permits"


@pytest.mark.slow
def test_demo_on_the_memory_backend_passes_its_own_audit():
    assert_passing_verdict(aiolimit("demo", "--duration", "2"), rate=20)


@pytest.mark.slow
def test_demo_on_a_real_redis_server_passes_its_own_audit(redis_server: LocalRedis):
    result = aiolimit("demo", "--duration", "2", "--rate", "30", "--redis", redis_server.url)
    assert_passing_verdict(result, rate=30)
    assert f"Redis at {redis_server.url}" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--rate", "0"], "argument --rate: must be at least 1"),
        (["demo", "--duration", "soon"], "argument --duration: expected seconds"),
        (["demo", "--interval", "-1"], "argument --interval: must be a positive number"),
        (["demo", "--redis", "http://localhost"], "bad --redis URL"),
        (["demo", "--name", ""], "name must be a non-empty str"),
        (["demo", "--clock", "client"], "--clock needs --redis"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
@pytest.mark.slow
def test_a_bad_argument_gives_a_one_line_error_and_exit_code_2(args, message):
    result = aiolimit(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_an_unreachable_redis_server_gives_a_clean_error():
    url = f"redis://127.0.0.1:{free_port()}"
    result = aiolimit("demo", "--redis", url)
    assert result.returncode == 2
    assert f"aiolimit demo: error: cannot reach Redis at {url}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_clock_without_redis_is_a_one_line_argument_error():
    result = aiolimit("demo", "--clock", "server")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "aiolimit demo: error: --clock needs --redis (the in-memory backend has one clock)"
    ]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://limiter:secret@host", "rediss://limiter:***@host"),
        ("redis://host?password=secret&db=1", "redis://host?password=***&db=1"),
        ("redis://host:6379", "redis://host:6379"),
        ("redis://user@host", "redis://user@host"),
    ],
)
def test_the_demo_never_prints_a_password_from_the_url(url, shown):
    assert demo.masked(url) == shown


@pytest.mark.slow
def test_an_unreachable_server_s_error_masks_the_password():
    port = free_port()
    result = aiolimit("demo", "--redis", f"redis://:secret@127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"cannot reach Redis at redis://:***@127.0.0.1:{port}" in result.stderr
    assert "secret" not in result.stderr


@pytest.mark.slow
def test_the_banner_masks_the_password_of_a_real_server():
    with LocalRedis("--requirepass", "secret") as server:
        result = aiolimit(
            "demo", "--duration", "1", "--redis", f"redis://:secret@127.0.0.1:{server.port}"
        )
    assert result.returncode == 0, result.stdout + result.stderr
    banner = result.stdout.splitlines()[0]
    assert f"(Redis at redis://:***@127.0.0.1:{server.port}, clock=server)" in banner
    assert "secret" not in result.stdout + result.stderr


@pytest.mark.slow
def test_after_a_server_failure_the_last_line_shows_the_real_elapsed_time():
    with LocalRedis() as server:
        demo_process = subprocess.Popen(
            [sys.executable, "-m", "aiolimit", "demo", "--duration", "30", "--redis", server.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert demo_process.stdout is not None
        lines = [demo_process.stdout.readline(), demo_process.stdout.readline()]
        assert lines[-1].startswith("t=1 "), lines
        server.kill()  # about 1 s into the run
        out, err = demo_process.communicate(timeout=30)
    assert demo_process.returncode == 2
    assert "aiolimit demo: error:" in err
    last = (lines + out.splitlines())[-1]
    elapsed = float(last.split()[0].removeprefix("t="))
    assert 1 < elapsed < 10, last  # the server was gone long before 30 s


def test_the_command_line_offers_no_soak_and_needs_nothing_from_the_lab():
    # The soak is the lab's (python -m tools.soak), which the wheel does not hold.
    code = (
        "import argparse, sys\n"
        "sys.modules['tools'] = None  # as in an installed wheel: no lab to import\n"
        "from aiolimit._tools import cli\n"
        "actions = cli.build_parser()._actions\n"
        "commands = next(a for a in actions if isinstance(a, argparse._SubParsersAction))\n"
        "print(' '.join(sorted(commands.choices)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    commands = done.stdout.split()
    assert "demo" in commands
    assert "soak" not in commands
    refused = aiolimit("soak", "--fault", "script-flush")
    assert refused.returncode == 2
    assert "invalid choice: 'soak'" in refused.stderr


def test_the_audit_counts_the_busiest_half_open_window():
    assert busiest_window([], 1.0).most == 0
    assert busiest_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0).most == 3
    assert busiest_window([3.0, 0.0, 1.0, 2.0], 1.0).most == 1
    assert busiest_window([0.0] * 5 + [0.999], 1.0).most == 6
    assert busiest_window([0.0] * 5 + [0.999], 1.0, slack=0.01).most == 5


def test_the_audit_counts_permits_and_only_spans_certainly_in_one_window():
    # (t - interval, t]: a grant exactly one interval after another does not share its window
    assert busiest_window([(0, 0, 2), (500, 500, 1)], 500).most == 2
    stamps = [(0, 0, 2), (400, 400, 1), (900, 900, 4)]
    assert busiest_window(stamps, 500, rate=2) == Window(most=4, over=2, end=900)
    # spans: together only when all of them fit in less than one interval
    assert busiest_window([(0.0, 0.2), (0.5, 0.9)], 1.0).most == 2
    assert busiest_window([(0.0, 0.2), (0.5, 1.0)], 1.0).most == 1


def test_what_the_rate_allows_is_one_full_budget_per_started_interval():
    assert demo.allowed_by_rate(20, 1.0, 5.0) == 100
    assert demo.allowed_by_rate(20, 1.0, 2.5) == 60
    assert demo.allowed_by_rate(20, 1.0, 0.1) == 20
    assert demo.allowed_by_rate(10, 0.1, 0.3) == 30


def test_the_verdict_fails_with_exit_code_1_on_over_admission(capsys):
    run = demo.Run(rate=2, interval=1.0, stamps=[0.0, 0.1, 0.2, 1.5], per_worker=[2, 2])
    assert demo.verdict(run, elapsed=2.0) == 1
    out = capsys.readouterr().out
    assert "busiest window  3 permits" in out
    assert "FAIL: a 1 s window held 3 permits, over the rate of 2" in out


def test_the_verdict_takes_a_stall_of_the_loop_as_the_stamps_uncertainty(capsys):
    # Four grants the limiter spread over 0.3 s all woke at 0.9 after a stall of the whole
    # process; the loop ran 0.35 s late then, and the grants made on time after it fill the
    # rate again: by the wake times alone, one window holds 5 of a rate of 4.
    woke = [0.0, 0.9, 0.9, 0.9, 1.5, 1.6]
    late = [0.0, 0.35, 0.35, 0.35, 0.0, 0.0]
    bunched = demo.Run(rate=4, interval=1.0, stamps=woke, per_worker=[3, 3])
    assert demo.verdict(bunched, elapsed=2.0) == 1
    stalled = demo.Run(rate=4, interval=1.0, stamps=woke, late=late, per_worker=[3, 3])
    assert demo.verdict(stalled, elapsed=2.0) == 0
    # An on-time loop (no lag) leaves every stamp a point: over-admission still fails.
    on_time = demo.Run(rate=2, interval=1.0, stamps=[0.0, 0.1, 0.2], late=[0.0] * 3)
    on_time.per_worker = [3]
    assert demo.verdict(on_time, elapsed=1.0) == 1
    assert "FAIL: a 1 s window held 3 permits, over the rate of 2" in capsys.readouterr().out


async def test_the_loop_lag_is_how_late_a_stalled_loop_woke_its_ticker():
    lag = demo.LoopLag()
    ticker = asyncio.ensure_future(lag.tick())
    try:
        await asyncio.sleep(0.02)
        assert lag.now() < 0.1
        time.sleep(0.3)  # noqa: ASYNC251 - the whole loop stalls, as when not scheduled
        await asyncio.sleep(0)
        assert lag.now() >= 0.29
    finally:
        ticker.cancel()
