"""A short multi-process soak against a real redis-server, with faults, audited from grant times.

Each run starts its own redis-server on a free loopback port (``tools.LocalRedis``) and stops
it; against a server it did not start, the soak refuses the faults that act on the server.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from typing import Any

import pytest
import redis as sync_redis

from aiolimit import Algorithm, Rate
from tools import LocalRedis, soak
from tools.audit import fullest_bucket
from tools.soak.arguments import check
from tools.soak.audit import audit_grants, lateness
from tools.soak.limits import TOLERANCE_US, Limits
from tools.soak.progress import Progress
from tools.soak.worker import Grant


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


def grant(at: float, permits: int = 1, process: int = 0, requested: float | None = None) -> Grant:
    """A grant at ``at`` seconds (limiter time = wall clock), decided at once."""
    asked = at if requested is None else requested
    return Grant(process, permits, "acquire", asked, at, at + 0.001, at + 0.001, round(at * 1e6))


def limits(rates: str, algorithm: str = "sliding_window", spacing: float = 0.0) -> Limits:
    return Limits(Rate.parse(rates), Algorithm(algorithm.upper()), spacing)


def audit(grants: list[Grant], how: Limits, per_client: bool = False) -> dict[str, Any]:
    times = [g.limiter_time / 1e6 for g in grants]
    return audit_grants(grants, how, per_client, (min(times), max(times) + 0.01))


def test_audit_counts_a_window_over_the_rate() -> None:
    fine = [grant(0.0, 2), grant(0.5), grant(1.0), grant(1.9)]  # at most 3 in any window
    assert audit(fine, limits("3/second"))["windows_over_rate"] == 0
    result = audit([*fine, grant(0.9)], limits("3/second"))  # (0, 0.9]: 4
    assert result["windows_over_rate"] == 1
    assert result["most_in_window"] == 4
    assert result["windows_over_rate_wall"] >= 1


def test_audit_checks_each_of_several_sliding_rates_against_its_own_bound() -> None:
    how = limits("3/second; 5/10 seconds")
    fine = [grant(0.0, 3), grant(1.0), grant(2.5), grant(10.0, 3)]  # 5 in (0, 10]
    result = audit(fine, how)
    assert [(r["rate"], r["worst"], r["over"]) for r in result["per_rate"]] == [
        ("3/1s", 3, 0),
        ("5/10s", 5, 0),
    ]
    assert result["windows_over_rate"] == 0
    # Each grant fits 3 per second, but (0.5, 9.9] holds 6 of the 5 per 10 s.
    over = audit([*fine[:3], grant(9.9)], how)["per_rate"]
    assert (over[0]["over"], over[1]["worst"], over[1]["over"]) == (0, 6, 1)


EPOCH_MINUTE = 28_333_334 * 60.0  # a multiple of 60 s since the Unix epoch (~2023-11-14)


def test_fixed_window_audit_counts_per_window_aligned_to_the_epoch() -> None:
    how = limits("2/minute", "fixed_window")
    # 4 within 1 s across the boundary: the boundary burst a fixed window allows.
    fine = [grant(EPOCH_MINUTE - 0.5, 2), grant(EPOCH_MINUTE), grant(EPOCH_MINUTE + 0.5)]
    result = audit(fine, how)["per_rate"][0]
    assert (result["check"], result["worst"], result["over"]) == ("aligned window", 2, 0)
    assert (result["most_in_interval"], result["interval_bound"]) == (4, 4)
    assert result["over_wall"] == 0
    # A third grant in [EPOCH_MINUTE, EPOCH_MINUTE + 60): over, though 59 s after the others.
    over = audit([*fine, grant(EPOCH_MINUTE + 59.999999)], how)
    assert (over["per_rate"][0]["worst"], over["per_rate"][0]["over"]) == (3, 1)
    assert over["windows_over_rate"] == 1


def test_token_bucket_audit_allows_permits_plus_the_refill_in_every_span() -> None:
    how = limits("2/second", "token_bucket")
    # Full bucket at 0 (2 permits), then one token every 0.5 s: 4 permits in [0, 1].
    fine = [grant(0.0, 2), grant(0.5), grant(1.0)]
    result = audit(fine, how)["per_rate"][0]
    assert (result["check"], result["worst"], result["bound"], result["over"]) == (
        "bucket",
        2.0,
        2,
        0,
    )
    assert (result["most_in_interval"], result["interval_bound"]) == (3, 3)  # (0, 1]
    # The third token 2 µs early: 4 permits in a span of 0.999998 s allows 3.999996.
    early = audit([grant(0.0, 2), grant(0.5), grant(0.999998)], how)["per_rate"][0]
    assert early["over"] == 1
    assert early["worst"] == pytest.approx(2.0, abs=1e-5)  # rounded: 2.000004
    # 1 µs early is the tolerance for whole-microsecond rounding.
    assert audit([grant(0.0, 2), grant(0.5), grant(0.999999)], how)["per_rate"][0]["over"] == 0
    # A second burst long after: its span with the first one refilled far more than it took.
    late = audit([*fine, grant(5.0, 2), grant(5.2)], how)["per_rate"][0]
    assert (late["worst"], late["over"]) == (2.6, 1)  # 3 permits in [5, 5.2]: 2 + 0.4


def test_fullest_bucket_matches_every_pair_checked_one_by_one() -> None:
    rng = random.Random(10)
    for _ in range(300):
        rate, interval = rng.randint(1, 4), rng.choice([1000, 3000])
        times = sorted(rng.randint(0, 5000) for _ in range(rng.randint(1, 12)))
        stamps = [(t, rng.randint(1, 3)) for t in times]
        excess = [
            sum(p for t, p in stamps if t_i <= t <= t_j) - rate * (t_j - t_i) / interval
            for t_i, _ in stamps
            for t_j, _ in stamps
            if t_i <= t_j
        ]
        found = fullest_bucket(stamps, rate, interval)
        assert found.peak == pytest.approx(max(excess)), stamps
        assert (found.over > 0) == (max(excess) > rate + 1e-9), stamps


def test_spacing_audit_checks_consecutive_grant_starts_per_budget() -> None:
    how = limits("10/second", spacing=0.2)
    fine = [grant(0.0, 3), grant(0.2), grant(0.5, 2)]  # one grant may carry several permits
    result = audit(fine, how)
    assert result["spacing"] == {
        "min_spacing_s": 0.2,
        "closest_s": 0.2,
        "too_close": 0,
        "too_close_wall": 0,
    }
    assert result["windows_over_rate"] == 0
    close = audit([*fine, grant(0.69)], how)
    assert (close["spacing"]["closest_s"], close["spacing"]["too_close"]) == (0.19, 1)
    assert close["spacing"]["too_close_wall"] == 1  # stamps [0.69, 0.691] and [0.5, 0.501]
    assert close["windows_over_rate"] == 1
    # PER_CLIENT: each process keeps its own spacing.
    apart = [grant(0.0, process=0), grant(0.05, process=1), grant(0.2, process=0)]
    assert audit(apart, how, per_client=True)["spacing"]["too_close"] == 0
    assert audit(apart, how, per_client=False)["spacing"]["too_close"] == 2


def test_lateness_follows_each_algorithm() -> None:
    # A waiter asking at 0.1 for a third permit of 2 per second: the bucket has its token at
    # 0.5; a fixed window (aligned at 0) has room at 1.0. Granted 30 ms later than that.
    bucket = [grant(0.0, 2), grant(0.53, requested=0.1)]
    assert lateness(bucket, limits("2/second", "token_bucket")) == [pytest.approx(0.03)]
    windows = [grant(0.0, 2), grant(1.03, requested=0.1)]
    assert lateness(windows, limits("2/second", "fixed_window")) == [pytest.approx(0.03)]
    # The spacing: the second grant could start at 0.2.
    spaced = [grant(0.0), grant(0.23, requested=0.1)]
    assert lateness(spaced, limits("9/second", spacing=0.2)) == [pytest.approx(0.03)]


def test_the_command_line_reads_algorithm_rates_and_spacing() -> None:
    args = _args("--algorithm", "TOKEN_BUCKET", "--rates", "3/second;20/minute")
    assert args.algorithm == "token_bucket"
    how = Limits.of(_args("--algorithm", "Fixed_Window", "--min-spacing", "0.2"))
    assert how == Limits((Rate(200, 1),), Algorithm.FIXED_WINDOW, 0.2)
    assert Limits.of(args).rates == (Rate(3, 1), Rate(20, 60))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "3/second", "--rate", "5"], "--rates replaces --rate and --interval"),
        (["--rates", "3/fortnight"], "cannot read the rate '3/fortnight'"),
        (["--min-spacing", "-1"], "--min-spacing must be a non-negative"),
    ],
)
def test_the_command_line_refuses_bad_limits_before_starting_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert soak.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["script-flush", "client-kill"])
def test_faults_on_the_server_are_refused_against_a_server_the_soak_did_not_start(
    fault: str, redis_server: LocalRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    with sync_redis.Redis(port=redis_server.port, client_name="bystander") as bystander:
        script = bystander.script_load("return 1")
        connection = bystander.client_id()
        argv = ["--redis", redis_server.url, "--fault", fault, "--fault-every", "0.2"]
        code = soak.main([*argv, "-k", "1", "-t", "1", "--duration", "1", "--quiet"])
        assert code == 2
        assert f"--fault {fault}" in capsys.readouterr().err
        assert bystander.script_exists(script) == [True]
        assert bystander.client_id() == connection  # never dropped (a reconnect is a new id)


def test_the_owner_of_a_given_server_may_disturb_it_but_not_restart_it() -> None:
    given = ("--redis", "redis://127.0.0.1:6379")
    owned = (*given, "--i-own-this-server")
    assert check(_args(*owned, "--fault", "script-flush", "--fault", "client-kill")) is None
    assert check(_args(*given, "--fault", "clock-skew")) is None  # the workers' clocks only
    assert "restart" in str(check(_args(*owned, "--fault", "restart")))
    assert check(_args("--fault", "script-flush", "--fault", "restart")) is None  # its own


def _soak_algorithm(algorithm: str) -> dict[str, Any]:
    # Over 3 s the second rate binds (50 per 10 s), the first one (20 per second) shapes the
    # start, and the spacing spreads the first burst; faults run meanwhile.
    return _soak(
        "--duration", "3", "--algorithm", algorithm, "--rates", "20/second; 50/10 seconds",
        "--min-spacing", "0.01", "--fault", "script-flush", "--fault", "client-kill",
        "--fault-every", "1", "--client-retries", "3",
    )  # fmt: skip


def _assert_every_bound_kept(results: dict[str, Any]) -> None:
    assert results["faults_injected"].keys() == {"client-kill", "script-flush"}
    assert results["errors"] == {}
    assert [r["rate"] for r in results["per_rate"]] == ["20/1s", "50/10s"]
    for rate in results["per_rate"]:
        assert rate["over"] == 0, rate
        assert rate["over_wall"] == 0, rate
        assert rate["worst"] <= rate["bound"], rate
        assert rate["most_in_interval"] <= rate["interval_bound"], rate
    spacing = results["spacing"]
    assert spacing["too_close"] == spacing["too_close_wall"] == 0
    assert spacing["closest_s"] >= 0.01 - TOLERANCE_US / 1e6
    assert results["windows_over_rate"] == results["windows_over_rate_wall"] == 0
    assert results["exit_code"] == 0


@pytest.mark.slow
def test_a_sliding_window_soak_keeps_several_rates_and_the_spacing() -> None:
    results = _soak_algorithm("sliding_window")
    _assert_every_bound_kept(results)
    # The load reached the 10 s rate (up to a multi-permit request queued at its head, FIFO,
    # for the next window), so its check was not vacuous: the whole run is in one window.
    assert 45 < results["per_rate"][1]["worst"] == results["permits"] <= 50


@pytest.mark.slow
def test_a_fixed_window_soak_keeps_several_rates_and_the_spacing() -> None:
    results = _soak_algorithm("fixed_window")
    _assert_every_bound_kept(results)
    # The load filled the aligned 1 s windows (up to a multi-permit request that did not fit,
    # queued FIFO for the next window), so the check was not vacuous.
    assert 15 < results["per_rate"][0]["worst"] <= 20


@pytest.mark.slow
def test_a_token_bucket_soak_keeps_several_rates_and_the_spacing() -> None:
    results = _soak_algorithm("token_bucket")
    _assert_every_bound_kept(results)
    # The 10 s bucket was drained: 50 at the start plus its refill of 5 per second.
    assert results["per_rate"][1]["worst"] > 45


def test_the_progress_line_counts_the_last_interval_so_the_first_burst_is_no_over_admission(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 200 per 1 s, saturated: the limiter starts full, so it grants 200 at once, and 200 more
    # each time those leave the window.
    begin = 1000.0
    counts = [0, 0]
    progress = Progress(_args("--rate", "200", "--duration", "3"), begin, begin + 3, counts)
    for tenth in range(2, 31):  # the tool looks every 0.1 s and prints about once a second
        counts[0] = 200 * ((tenth - 1) // 10 + 1)  # bursts at 0.1, 1.1 and 2.1 s
        progress.show(begin + tenth / 10, Counter())
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[-1] for line in lines] == ["last 1 s: 200/200"] * 3, lines
    # Not a running average, which reads as over-admission: 400 in 1.2 s, "333/s, rate 200/s".
    assert all("/s" not in line for line in lines)


def test_the_progress_line_allows_one_budget_per_process_for_per_client_limiters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args("--type", "per-client", "--rate", "50", "--duration", "2")
    Progress(args, 0.0, 2.0, [50, 50]).show(0.5, Counter())
    assert capsys.readouterr().err.rstrip().endswith("last 1 s: 100/100")
