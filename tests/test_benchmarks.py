"""Every benchmark script runs, in a tiny mode, and prints its table and its JSON.

Each starts its own redis-server; the figures are not checked, only that the scripts have not
rotted: they parse their options, reach the code they measure and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

TINY = {
    "throughput.py": ["--duration", "0.2", "--limiters", "50", "--only", "aiolimit"],
    "http_middleware.py": ["--in-process", "--requests", "640"],
    "client_cpu.py": ["--duration", "0.2", "--limiters", "50"],
    "redis_cost.py": ["--limiters", "50", "--requests", "64", "--rounds", "1", "--reference"],
    "memory.py": ["--grants", "200", "--at", "1000"],
    "stress.py": ["--only", "window", "--window-grants", "2000"],
    "tokens.py": [
        *("--windows", "1", "--processes", "1", "--tasks", "2", "--window", "0.5"),
        *("--tpm", "10000", "--rpm", "50", "--only", "transport"),
    ],
    "leases.py": ["--tasks", "4", "--limit", "2", "--seconds", "0.3"],
    "reserve.py": [
        *("--windows", "1", "--processes", "1", "--tasks", "2", "--window", "0.5"),
        *("--tpm", "10000"),
    ],
    "learn.py": [
        *("--phases", "4", "2", "--seconds", "1.5", "--settle", "0.5", "--guess", "6"),
        *("--processes", "1", "--tasks", "2", "--only", "learn"),
    ],
    "defaults.py": [
        *("--duration", "1.5", "--processes", "1", "--tasks", "1"),
        *("--partner", "fixed", "--client", "acquire", "--only-defaults"),
    ],
    "partner.py": [
        "--duration",
        "1.5",
        "--processes",
        "1",
        "--tasks",
        "1",
        "--partner",
        "fixed",
        "--margin",
        "0.05",
    ],
}
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("[!_]*.py"))


def run(script: str, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(BENCHMARKS / script), *options]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=90)


def test_every_script_has_a_tiny_mode():
    assert sorted(TINY) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_explains_its_options(script):
    done = run(script, "--help")
    assert done.returncode == 0, done.stderr
    assert "--json" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_prints_a_table_and_json(script):
    table = run(script, *TINY[script])
    assert table.returncode == 0, table.stderr[-3000:]
    assert "|--:|" in table.stdout or "|---|---|---|" in table.stdout, table.stdout
    figures = run(script, *TINY[script], "--json")
    assert figures.returncode == 0, figures.stderr[-3000:]
    assert json.loads(figures.stdout)["command"].startswith(f"python benchmarks/{script}")


@pytest.mark.slow
def test_checkouts_run_side_by_side():
    done = run("throughput.py", "--checkout", ".", "--checkout", str(ROOT), "--rounds", "1",
               "--duration", "0.2", "--limiters", "50", "--algorithm", "token_bucket")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("| token_bucket (a) |") == 2, done.stdout
