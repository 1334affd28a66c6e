"""A short multi-process soak against a real redis-server, with faults, audited from grant times.

Each run starts its own redis-server on a free loopback port (``aiolimit._tools.LocalRedis``)
and stops it.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from aiolimit._tools import LocalRedis, soak
from aiolimit._tools.soak_worker import Grant


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    return parser.parse_args(["--processes", "2", "--tasks", "4", *argv])


def _soak(*argv: str, persistence: str = "none") -> dict[str, Any]:
    args = _args("--quiet", "--persistence", persistence, *argv)
    with LocalRedis(persistence=args.persistence) as server:
        return soak.soak(args, server.url, server)


@pytest.mark.slow
def test_script_flush_and_client_kill_never_over_admit_nor_reach_callers() -> None:
    results = _soak(
        "--duration", "4", "--fault", "script-flush", "--fault", "client-kill",
        "--fault-every", "1", "--client-retries", "3",
    )  # fmt: skip
    assert results["faults_injected"] == {"client-kill": 2, "script-flush": 2}
    assert results["grants"] > 0
    assert results["windows_over_rate"] == 0
    assert results["windows_over_rate_wall"] == 0
    assert results["errors"] == {}
    assert results["exit_code"] == 0


@pytest.mark.slow
def test_crash_and_restart_with_aof_never_over_admits() -> None:
    results = _soak(
        "--duration", "4", "--fault", "restart", "--fault-every", "1.5",
        "--client-retries", "3", persistence="aof",
    )  # fmt: skip
    assert results["faults_injected"].get("restart", 0) >= 2
    assert results["grants"] > 0
    assert results["windows_over_rate"] == 0
    assert results["windows_over_rate_wall"] == 0
    assert results["exit_code"] == 0


def test_audit_counts_a_window_over_the_rate() -> None:
    def grant(at: float, permits: int = 1) -> Grant:
        return Grant(0, permits, "acquire", at, at, at + 0.001, at + 0.001, round(at * 1e6))

    fine = [grant(0.0, 2), grant(0.5), grant(1.0), grant(1.9)]  # at most 3 in any window
    assert soak.audit_grants(fine, 3, 1.0, False, (0.0, 2.0))["windows_over_rate"] == 0
    result = soak.audit_grants([*fine, grant(0.9)], 3, 1.0, False, (0.0, 2.0))  # (0, 0.9]: 4
    assert result["windows_over_rate"] == 1
    assert result["most_in_window"] == 4
    assert result["windows_over_rate_wall"] >= 1


def test_the_progress_line_counts_the_last_interval_so_the_first_burst_is_no_over_admission(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 200 per 1 s, saturated: the limiter starts full, so it grants 200 at once, and 200 more
    # each time those leave the window.
    begin = 1000.0
    counts = [0, 0]
    progress = soak.Progress(_args("--rate", "200", "--duration", "3"), begin, begin + 3, counts)
    for tenth in range(2, 31):  # the tool looks every 0.1 s and prints about once a second
        counts[0] = 200 * ((tenth - 1) // 10 + 1)  # bursts at 0.1, 1.1 and 2.1 s
        progress.show(begin + tenth / 10, soak.Counter())
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[-1] for line in lines] == ["last 1 s: 200/200"] * 3, lines
    # Not a running average, which reads as over-admission: 400 in 1.2 s, "333/s, rate 200/s".
    assert all("/s" not in line for line in lines)


def test_the_progress_line_allows_one_budget_per_process_for_per_client_limiters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args("--type", "per-client", "--rate", "50", "--duration", "2")
    soak.Progress(args, 0.0, 2.0, [50, 50]).show(0.5, soak.Counter())
    assert capsys.readouterr().err.rstrip().endswith("last 1 s: 100/100")
