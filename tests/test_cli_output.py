"""What the ``aiolimit`` commands print: hostile names escaped, globs matched against names,
blocks and their time left, fields that exist for the algorithm only, counted nouns in the
singular when one, global options anywhere, and a pipe closed early. Against a real
redis-server (the session's), each test with limiter names of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import redis as sync_redis
from commands import field, on_server, run_command

from aiolimit import Algorithm, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit._tools import cli
from tools import free_port


def aiolimit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def prefix() -> str:
    return f"out{free_port()}:"


def make(url: str, prefix: str, names: list[str], **options: object) -> None:
    async def work(backend: RedisBackend) -> None:
        for each in names:
            await RateLimiter(each, backend).set_rate(
                RateLimiterConfig.build(RateType.OVERALL, 5, 1, **options)
            )  # type: ignore[arg-type]

    on_server(url, work, prefix)


# -- hostile names --------------------------------------------------------------------------------

HOSTILE = {
    "red\x1b[31mtext": r"red\x1b[31mtext",
    "two\nlines": r"two\nlines",
    "tab\tand\rreturn": r"tab\tand\rreturn",
    "bell\x07\x7f": r"bell\x07\x7f",
    "right\u202eleft": r"right\u202eleft",
    "back\\slash": r"back\\slash",
    "café 日本": "café 日本",
}


def test_list_prints_every_name_escaped_on_one_line_each(capsys, url, prefix):
    make(url, prefix, list(HOSTILE))
    code, out, err = aiolimit(capsys, "list", "--redis", url, "--prefix", prefix)
    assert (code, err) == (0, "")
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out and "\u202e" not in out
    lines = out.splitlines()
    assert len(lines) == len(HOSTILE), lines
    assert sorted(line.split("  ")[0].rstrip() for line in lines) == sorted(HOSTILE.values())


@pytest.mark.parametrize("name", list(HOSTILE))
def test_inspect_prints_the_name_escaped(capsys, url, prefix, name):
    make(url, prefix, [name])
    code, out, err = aiolimit(capsys, "inspect", name, "--redis", url, "--prefix", prefix)
    assert (code, err) == (0, "")
    assert field(out, "limiter") == HOSTILE[name]
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out


def test_commands_that_name_a_limiter_print_it_escaped(capsys, url, prefix):
    name = "evil\x1b]0;title\x07\nname"
    shown = r"evil\x1b]0;title\x07\nname"
    options = ["--redis", url, "--prefix", prefix]
    code, out, _ = aiolimit(capsys, "set-rate", name, "5/second", *options)
    assert (code, out) == (0, f"{shown}: 5/second (SLIDING_WINDOW, OVERALL)\n")
    code, out, _ = aiolimit(capsys, "pause", name, "30", *options)
    assert code == 0 and out.startswith(f"paused {shown}: ") and out.count("\n") == 1
    code, out, _ = aiolimit(capsys, "delete", name, *options)
    assert (code, out) == (0, f"deleted {shown}\n")
    for command in (["watch", name, "--count", "1"], ["inspect", name], ["delete", name]):
        code, out, err = aiolimit(capsys, *command, *options)
        assert (code, out) == (2, "")
        assert err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err, err


@pytest.mark.parametrize(
    ("pattern", "found"),
    [
        ("we{*", ["we{ir}d"]),
        ("we{ir}d", ["we{ir}d"]),
        ("*}d", ["we{ir}d"]),
        ("we?ir?d", ["we{ir}d"]),
        ("*%*", ["100%", "a%7Bb"]),
        ("a%7B*", ["a%7Bb"]),
        ("a{*", []),
        ("[a1]*", ["100%", "a%7Bb"]),
        ("[^a1]*", ["plain", "we{ir}d"]),
        (r"we\{*", ["we{ir}d"]),
        ("*", ["100%", "a%7Bb", "plain", "we{ir}d"]),
    ],
)
def test_list_matches_the_glob_against_names_not_their_stored_keys(
    capsys, url, prefix, pattern, found
):
    make(url, prefix, ["we{ir}d", "100%", "a%7Bb", "plain"])
    code, out, _ = aiolimit(capsys, "list", pattern, "--redis", url, "--prefix", prefix)
    assert code == 0
    assert [line.split("  ")[0].rstrip() for line in out.splitlines()] == found


# -- blocks -------------------------------------------------------------------------------------


def test_inspect_and_watch_show_a_block_and_its_time_left(capsys, url, prefix, name):
    options = ["--redis", url, "--prefix", prefix]
    make(url, prefix, [name])
    code, out, _ = aiolimit(capsys, "inspect", name, *options)
    assert field(out, "blocked") == "no"
    assert json.loads(aiolimit(capsys, "inspect", name, "--json", *options)[1])["blocked_s"] is None
    assert aiolimit(capsys, "pause", name, "30", *options)[0] == 0
    code, out, _ = aiolimit(capsys, "inspect", name, *options)
    left = re.fullmatch(r"for ([\d.]+) s more: no grant to anyone", field(out, "blocked"))
    assert left is not None and 29 <= float(left[1]) <= 30, out
    assert field(out, "available") == "0 of 5 permits now"
    assert "in window" not in out  # nothing was taken: the block holds every permit back
    shown = json.loads(aiolimit(capsys, "inspect", name, "--json", *options)[1])
    assert 29 < shown["blocked_s"] <= 30
    code, out, _ = aiolimit(capsys, "watch", name, "--count", "1", *options)
    blocked = re.search(r"grants/s  queued 0  blocked ([\d.]+) s$", out.rstrip("\n"))
    assert code == 0 and blocked is not None and 29 < float(blocked[1]) <= 30, out


def test_resume_ends_a_pause_and_says_when_there_was_none(capsys, url, prefix, name):
    options = ["--redis", url, "--prefix", prefix]
    make(url, prefix, [name])
    assert aiolimit(capsys, "pause", name, "30", *options)[0] == 0
    assert aiolimit(capsys, "resume", name, *options)[:2] == (0, f"resumed {name}\n")

    async def attempt(backend: RedisBackend) -> bool:
        return await RateLimiter(name, backend).try_acquire()

    assert on_server(url, attempt, prefix)
    code, out, _ = aiolimit(capsys, "inspect", name, *options)
    assert field(out, "blocked") == "no"
    assert aiolimit(capsys, "resume", name, *options)[:2] == (0, f"{name} was not paused\n")
    code, out, err = aiolimit(capsys, "resume", name + "-none", *options)
    assert (code, out) == (2, "")
    assert err.startswith(f"aiolimit resume: error: no limiter '{name}-none'")


# -- fields for the algorithm only; counted nouns -------------------------------------------------


@pytest.mark.parametrize("algorithm", [Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW])
def test_inspect_json_has_no_grant_log_fields_for_counters(capsys, url, prefix, name, algorithm):
    make(url, prefix, [name], algorithm=algorithm)
    code, out, _ = aiolimit(capsys, "inspect", name, "--json", "--redis", url, "--prefix", prefix)
    shown = json.loads(out)
    assert code == 0 and shown["config"]["algorithm"] == algorithm.value
    assert "grants" not in shown and "reservations" not in shown
    assert shown["available"] == 5
    code, out, _ = aiolimit(capsys, "inspect", name, "--redis", url, "--prefix", prefix)
    assert "grants " not in out and "reservations " not in out


def test_one_of_a_thing_is_said_in_the_singular(capsys, url, prefix, name):
    async def one_reserved(backend: RedisBackend) -> None:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 60))
        assert await limiter.try_acquire()
        await backend.try_acquire(name, 1, None)  # reserved about 60 s ahead

    on_server(url, one_reserved, prefix)
    code, out, _ = aiolimit(capsys, "inspect", name, "--redis", url, "--prefix", prefix)
    assert code == 0
    assert field(out, "available") == "0 of 1 permit now"
    assert field(out, "in window") == "1 of 1 permit taken"
    assert field(out, "reservations").startswith("1 waiting (1 permit), ")
    make(url, prefix, [name + "-tb"], algorithm=Algorithm.TOKEN_BUCKET)
    code, out, _ = aiolimit(capsys, "inspect", name + "-tb", "--redis", url, "--prefix", prefix)
    assert re.fullmatch(r"\d+ B in 1 key", field(out, "memory")), out
    assert not re.search(r"\b1 (keys|permits|clients|grants|windows|waiters)\b", out)


# -- global options -----------------------------------------------------------------------------


@pytest.mark.slow
def test_global_options_work_before_or_after_the_command(capsys, url, prefix, name):
    make(url, prefix, [name])
    expected = f"{name}  5/second  SLIDING_WINDOW  OVERALL\n"
    for argv in (
        ["--redis", url, "--prefix", prefix, "list", name],
        ["--redis", url, "list", name, "--prefix", prefix],
        ["list", name, "--redis", url, "--prefix", prefix],
    ):
        assert aiolimit(capsys, *argv)[:2] == (0, expected), argv
    result = run_command("--redis", url, "--prefix", prefix, "inspect", name, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["name"] == name


def test_an_option_given_after_the_command_wins_over_one_before(capsys, url, prefix, name):
    make(url, prefix, [name])
    wrong = f"redis://127.0.0.1:{free_port()}"
    code, out, _ = aiolimit(
        capsys, "--redis", wrong, "list", name, "--redis", url, "--prefix", prefix
    )
    assert (code, out) == (0, f"{name}  5/second  SLIDING_WINDOW  OVERALL\n")


def test_the_default_server_is_the_environment_s_else_localhost(monkeypatch):
    monkeypatch.delenv("AIOLIMIT_REDIS_URL", raising=False)
    for command in (["list"], ["inspect", "x"], ["unblock", "x"]):
        assert cli.parse(command).redis == "redis://localhost:6379"
    monkeypatch.setenv("AIOLIMIT_REDIS_URL", "redis://elsewhere:6380")
    assert cli.parse(["list"]).redis == "redis://elsewhere:6380"
    assert cli.parse(["--redis", "redis://given", "list"]).redis == "redis://given"
    assert cli.parse(["demo"]).redis is None  # the demo's default: the in-memory backend
    assert cli.parse(["--redis", "redis://given", "demo"]).redis == "redis://given"


@pytest.mark.slow
def test_help_names_the_global_options_and_the_default_server():
    result = run_command("--help")
    assert result.returncode == 0
    assert "--redis URL" in result.stdout and "--cluster" in result.stdout
    assert "AIOLIMIT_REDIS_URL" in result.stdout
    assert "redis://localhost:6379" in result.stdout


@pytest.mark.slow
def test_an_option_a_command_does_not_take_is_a_one_line_error():
    result = run_command("--cluster", "demo")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "aiolimit demo: error: demo takes no --cluster"
    assert "Traceback" not in result.stderr


# -- a pipe closed early ------------------------------------------------------------------------


def _keys_of(url: str, name: str) -> list[bytes]:
    with sync_redis.Redis.from_url(url) as admin:
        return list(admin.scan_iter(match=f"*{name}*"))


@pytest.mark.slow
def test_the_demo_into_a_pipe_closed_early_exits_quietly_and_leaves_no_key(url, name):
    # At its default rate the workers wait on reservations: stopped, they hand them back.
    demo = subprocess.Popen(
        [sys.executable, "-m", "aiolimit", "demo", "--redis", url, "--name", name,
         "--duration", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert demo.stdout is not None and demo.stderr is not None
    first = [demo.stdout.readline(), demo.stdout.readline()]  # as `| head -2` reads
    assert first[1].startswith(b"t=1 "), first
    assert _keys_of(url, name), "the demo's limiter is there while it runs"
    demo.stdout.close()
    err = demo.stderr.read().decode()
    code = demo.wait(timeout=30)
    assert err == "", err
    assert code == 141  # 128 + SIGPIPE, as a shell reports a writer killed by it
    assert _keys_of(url, name) == []


@pytest.mark.slow
def test_the_demo_run_to_its_end_leaves_no_key(url, name):
    result = run_command("demo", "--redis", url, "--name", name, "--duration", "1.5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _keys_of(url, name) == []


@pytest.mark.slow
def test_list_into_a_pipe_closed_early_exits_quietly(url, prefix):
    make(url, prefix, [f"many-{i}" for i in range(2000)])
    command = [sys.executable, "-m", "aiolimit", "list", "--redis", url, "--prefix", prefix]
    lister = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert lister.stdout is not None and lister.stderr is not None
    assert lister.stdout.readline().startswith(b"many-")
    lister.stdout.close()
    err = lister.stderr.read().decode()
    assert (lister.wait(timeout=30), err) == (141, "")


# -- PER_CLIENT counters; client ids ------------------------------------------------------------


def test_inspect_counts_the_clients_of_a_per_client_token_bucket(capsys, url, prefix, name):
    async def two_clients(backend: RedisBackend) -> None:
        await RateLimiter(name, backend).set_rate(
            RateLimiterConfig.build(RateType.PER_CLIENT, 5, 60, algorithm=Algorithm.TOKEN_BUCKET)
        )
        for client, permits in (("amy", 4), ("red\x1b[31m", 1)):
            assert await RateLimiter(name, backend.with_client(client)).try_acquire(permits)

    on_server(url, two_clients, prefix)
    options = ["--redis", url, "--prefix", prefix]
    code, out, _ = aiolimit(capsys, "inspect", name, *options)
    assert code == 0 and "\x1b" not in out
    assert field(out, "clients") == "2 in the registry, 2 read, 2 with state"
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("busiest"))
    assert lines[header].split() == ["busiest", "client", "available"]
    assert [line.split() for line in lines[header + 1 : header + 3]] == [
        ["amy", "1"],
        [r"red\x1b[31m", "4"],
    ]
    shown = json.loads(aiolimit(capsys, "inspect", name, "--json", *options)[1])
    assert shown["clients"]["with_state"] == 2
    assert shown["clients"]["busiest"] == [
        {"client_id": "amy", "available": 1},
        {"client_id": "red\x1b[31m", "available": 4},
    ]


def test_list_aligns_every_column(capsys, url, prefix):
    async def configure(backend: RedisBackend) -> None:
        await RateLimiter("a", backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, "1/second")
        )
        await RateLimiter("longer-name", backend).set_rate(
            RateLimiterConfig.build(
                RateType.PER_CLIENT, "10/second; 1000/hour", algorithm="token_bucket"
            )
        )

    on_server(url, configure, prefix)
    code, out, _ = aiolimit(capsys, "list", "--redis", url, "--prefix", prefix)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    algorithms = {line.find("SLIDING_WINDOW") + line.find("TOKEN_BUCKET") + 1 for line in lines}
    types = {line.find("OVERALL") + line.find("PER_CLIENT") + 1 for line in lines}
    assert len(algorithms) == 1 and len(types) == 1, lines


def test_inspect_shows_the_fleets_measured_margin(capsys, url, prefix, name):
    options = ["--redis", url, "--prefix", prefix]
    make(url, prefix, [name])
    assert json.loads(aiolimit(capsys, "inspect", name, "--json", *options)[1])["margin_s"] is None

    async def report(backend: RedisBackend) -> None:
        await backend.margin(name, 30_000)  # (a lateness of 30 ms, above the start)

    on_server(url, report, prefix)
    code, out, _ = aiolimit(capsys, "inspect", name, *options)
    assert code == 0 and field(out, "margin") == "0.030 s, measured: each interval longer", out
    assert json.loads(aiolimit(capsys, "inspect", name, "--json", *options)[1])["margin_s"] == 0.03
