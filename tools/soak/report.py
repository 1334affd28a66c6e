"""The soak's results: the audit's figures with the run's own (shares, errors, Redis commands,
faults), as a dict for ``--json`` and as the table printed otherwise."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from aiolimit._tools.text import plural

from .audit import audit_grants, jain, percentile
from .faults import Commands, Injector
from .limits import DEFAULT_ALGORITHM, Limits, rate_label
from .worker import WorkerResult

__all__ = ["format_table", "summarise"]


def summarise(
    args: argparse.Namespace,
    worker_results: list[WorkerResult],
    commands: Commands,
    injector: Injector,
    run: tuple[float, float],
) -> dict[str, Any]:
    """Every figure of one soak (see the ``audit`` module for what each means)."""
    grants = [g for r in worker_results for g in r.grants]
    limits = Limits.of(args)
    results = audit_grants(grants, limits, args.rate_type == "per-client", run)
    shares = {r.process: sum(g.permits for g in r.grants) for r in worker_results}
    over = results["windows_over_rate"] + results["windows_over_rate_wall"] > 0
    loss_allowed = args.allow_loss and "restart" in args.fault and args.persistence == "none"
    results.update(
        {
            "scenario": _scenario(args),
            "duration_s": round(run[1] - run[0], 2),
            "rate": limits.rates[0].permits,
            "interval_s": limits.rates[0].interval_us / 1e6,
            "rates": limits.text,
            "algorithm": args.algorithm,
            "min_spacing_s": limits.min_spacing or None,
            "rate_type": args.rate_type,
            "processes": args.processes,
            "tasks": args.tasks,
            "shares": {str(p): shares[p] for p in sorted(shares)},
            "jain": round(jain([shares[p] for p in sorted(shares)]), 4),
            "refused_try_acquire": sum(r.refused for r in worker_results),
            "cancelled_at_end": sum(r.cancelled for r in worker_results),
            **_errors(worker_results),
            **_commands(commands, results["permits"]),
            "faults_injected": dict(sorted(injector.done.items())),
            "faults_failed": dict(sorted(injector.failed.items())),
            "restart_downtime_s": round(injector.downtime, 3),
            "over_admission": over,
            "over_admission_allowed": over and loss_allowed,
            "exit_code": 1 if (over and not loss_allowed) or not grants else 0,
        }
    )
    if args.big:
        results["big"] = _big(worker_results, limits)
    return results


def _errors(worker_results: list[WorkerResult]) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    samples: dict[str, str] = {}
    for r in worker_results:
        errors.update(r.errors)
        for kind, message in r.error_samples.items():
            samples.setdefault(kind, message)
    return {"errors": dict(sorted(errors.items())), "error_samples": samples}


def _commands(commands: Commands, permits: int) -> dict[str, Any]:
    scripts = commands.total["evalsha"] + commands.total["eval"] + commands.total["fcall"]
    return {
        "redis_commands": dict(commands.total.most_common()),
        "scripts_per_permit": _ratio(scripts, permits),
        "commands_per_permit": _ratio(sum(commands.total.values()), permits),
    }


def _big(worker_results: list[WorkerResult], limits: Limits) -> dict[str, Any]:
    """The whole-rate request's waits (``--big``)."""
    waits = [w for r in worker_results for w in r.big_waits]
    return {
        "granted": len(waits),
        "timed_out": sum(r.big_timeouts for r in worker_results),
        "permits": limits.max_permits,
        "timeout_s": 5 * limits.shortest,
        "p50_s": _round(percentile(waits, 0.5)),
        "max_s": _round(max(waits) if waits else None),
        "within_2_intervals": sum(w <= 2 * limits.shortest for w in waits),
    }


def _ratio(count: int, permits: int) -> float | None:
    return round(count / permits, 3) if permits else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _scenario(args: argparse.Namespace) -> str:
    limits = Limits.of(args)
    parts = [
        f"{args.processes}x{args.tasks}",
        ";".join(rate_label(r) for r in limits.rates),
        args.rate_type,
        f"clock={args.clock}",
    ]
    if limits.algorithm is not DEFAULT_ALGORITHM:
        parts.append(args.algorithm)
    if limits.min_spacing:
        parts.append(f"min-spacing={limits.min_spacing:g}s")
    if args.client_retries:
        parts.append(f"client-retries={args.client_retries}")
    if args.fault:
        parts.append("faults=" + ",".join(args.fault))
    if "restart" in args.fault:
        parts.append(f"persistence={args.persistence}")
    if args.big:
        parts.append("big")
    return " ".join(parts)


# -- the table ------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(results: dict[str, Any]) -> str:
    """The results as the rows the soak prints: a label and its figures each."""
    per_rate = results["per_rate"]
    plain = len(per_rate) == 1 and per_rate[0]["check"] == "any window" and not results["spacing"]
    rows = [
        ("scenario", results["scenario"]),
        ("duration", f"{results['duration_s']} s"),
        ("grants (permits)", f"{results['grants']} ({results['permits']})"),
    ]
    rows += _window_rows(results) if plain else _bound_rows(results)
    rows += _figure_rows(results, plain)
    rows += _fault_rows(results)
    rows.append(("verdict", _verdict(results, plain)))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _window_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """One sliding-window rate: as the tool has always shown it."""
    rate = results["rate"]
    over = plural(results["windows_over_rate"], "window")
    over_wall = plural(results["windows_over_rate_wall"], "window")
    return [
        (
            "most permits in any window",
            f"{results['most_in_window']} / rate {rate} ({over} over)",
        ),
        (
            "  same, wall-clock stamps",
            f"{results['most_in_window_wall']} / rate {rate} ({over_wall} over)",
        ),
    ]


def _bound_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """Each rate's own bound, and the spacing's."""
    rows = [(f"rate {r['rate']}", _rate_row(r)) for r in results["per_rate"]]
    spacing = results["spacing"]
    if spacing:
        closest = spacing["closest_s"]
        rows.append(
            (
                "spacing between grants",
                f"closest {'-' if closest is None else f'{closest * 1000:.3f}'} ms"
                f" / at least {spacing['min_spacing_s'] * 1000:g} ms"
                f" ({spacing['too_close']} too close; wall clock"
                f" {spacing['too_close_wall']})",
            )
        )
    return rows


def _figure_rows(results: dict[str, Any], plain: bool) -> list[tuple[str, str]]:
    shares = results["shares"]
    total = max(1, sum(shares.values()))
    utilisation = f"{results['utilisation'] * 100:.2f} %"
    if not plain:
        utilisation += f" (of what {results['utilisation_against']} allows)"
    errors = ", ".join(f"{k}: {v}" for k, v in results["errors"].items())
    return [
        ("utilisation", utilisation),
        ("per-process share", " ".join(f"{p}:{v / total * 100:.1f}%" for p, v in shares.items())),
        ("Jain fairness index", f"{results['jain']:.4f}"),
        (
            "waiter lateness p50 / p99",
            f"{_fmt(results['lateness_p50_ms'])} / {_fmt(results['lateness_p99_ms'])} ms"
            f" ({plural(results['waiters'], 'waiter')})",
        ),
        (
            "Redis calls per permit",
            f"{_fmt(results['scripts_per_permit'])} scripts (round trips); "
            f"{_fmt(results['commands_per_permit'])} commands incl. those inside scripts",
        ),
        ("refused try_acquire", str(results["refused_try_acquire"])),
        ("errors surfaced to callers", errors or "none"),
    ]


def _fault_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    if results["faults_injected"] or results["faults_failed"]:
        injected = ", ".join(f"{k} x{v}" for k, v in results["faults_injected"].items())
        if results["restart_downtime_s"]:
            injected += f" (downtime {results['restart_downtime_s']} s)"
        rows.append(("faults injected", injected or "none"))
        if results["faults_failed"]:
            failed = ", ".join(f"{k} x{v}" for k, v in results["faults_failed"].items())
            rows.append(("faults failed", failed))
    if "big" in results:
        big = results["big"]
        rows.append(
            (
                "whole-rate request",
                f"{big['granted']} granted, {big['timed_out']} timed out "
                f"(after {big['timeout_s']:g} s); p50 {_fmt(big['p50_s'])} s, "
                f"max {_fmt(big['max_s'])} s; {big['within_2_intervals']} within 2 intervals",
            )
        )
    return rows


def _verdict(results: dict[str, Any], plain: bool) -> str:
    if not results["grants"]:
        return "FAILED: nothing was granted"
    if results["over_admission"]:
        allowed = results["over_admission_allowed"]
        return "OVER-ADMISSION" + (" (allowed: restart without persistence)" if allowed else "")
    return "OK: no window over the rate" if plain else "OK: no bound exceeded"


def _rate_row(r: dict[str, Any]) -> str:
    """One rate's checks: its own bound on limiter time, its interval, the wall clock."""
    interval = f"{r['interval_s']:g} s"
    spans = plural(r["over"], "span")
    if r["check"] == "bucket":
        own = f"bucket peak {r['worst']:.3f} / {r['bound']} ({spans} over)"
    elif r["check"] == "aligned window":
        own = f"{r['worst']:g} / {r['bound']} in an aligned {interval} ({r['over']} over)"
    else:
        own = f"{r['worst']:g} / {r['bound']} in any {interval} ({r['over']} over)"
    if r["check"] != "any window":
        own += f"; any {interval}: {r['most_in_interval']} / {r['interval_bound']}"
    return f"{own}; wall clock {r['most_wall']} / {r['interval_bound']} ({r['over_wall']} over)"
