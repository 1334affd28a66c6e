"""A short multi-process soak against a real redis-server, with faults, audited from grant times.

Each run starts its own redis-server on a free loopback port (``aiolimit._server``) and stops it.
"""

from __future__ import annotations

from typing import Any

import pytest

from aiolimit._server import LocalRedis
from aiolimit._soak import add_arguments, soak

pytestmark = pytest.mark.slow


def _soak(*argv: str, persistence: str = "none") -> dict[str, Any]:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--processes", "2", "--tasks", "4", "--quiet", "--persistence", persistence, *argv]
    )
    with LocalRedis(args.persistence) as server:
        return soak(args, server.url, server)


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
    from aiolimit._soak import audit
    from aiolimit._soak_worker import Grant

    def grant(at: float, permits: int = 1) -> Grant:
        return Grant(0, permits, "acquire", at, at, at + 0.001, at + 0.001, round(at * 1e6))

    fine = [grant(0.0, 2), grant(0.5), grant(1.0), grant(1.9)]  # at most 3 in any window
    assert audit(fine, 3, 1.0, False, (0.0, 2.0))["windows_over_rate"] == 0
    result = audit([*fine, grant(0.9)], 3, 1.0, False, (0.0, 2.0))  # (0, 0.9] holds 2+1+1
    assert result["windows_over_rate"] == 1
    assert result["most_in_window"] == 4
    assert result["windows_over_rate_wall"] >= 1
