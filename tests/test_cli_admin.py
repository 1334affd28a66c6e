"""``aiolimit inspect``, ``list``, ``set-rate``, ``delete`` and ``block`` against a real
redis-server: what they print, their exit codes, and the least-privilege ACL user.

State is made through the library first (reservations straight from ``Backend.try_acquire``,
which reserves without sleeping), then the command runs in this process through
``cli.main`` (stdout captured), or as a subprocess where stderr and tracebacks matter.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis as sync_redis
from cluster_keys import masters_holding
from commands import (
    aiolimit,
    field,
    full_with_a_reservation,
    limiters_on,
    on_server,
    run_command,
)
from redis.asyncio import RedisCluster

from aiolimit import Algorithm, Rate, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit._tools import cli
from aiolimit.backends.redis._acl import NEWER
from aiolimit.backends.redis._compat import slot
from tools import LocalRedis, free_port
from tools.cluster import Cluster, cluster_client

pytest_plugins = ["cluster_fixtures"]

ACL_PAGE = Path(__file__).resolve().parent.parent / "docs" / "deployments.md"


# -- inspect ------------------------------------------------------------------------------------


def test_inspect_shows_config_permits_reservations_memory_and_slot(capsys, url, name):
    on_server(url, lambda backend: full_with_a_reservation(backend, name))
    code, out, err = aiolimit(capsys, url, "inspect", name)
    assert (code, err) == (0, "")
    assert field(out, "limiter") == name
    assert field(out, "rates") == "10/minute (SLIDING_WINDOW, OVERALL)"
    assert field(out, "keep_alive") == "none"
    expires = float(re.fullmatch(r"in (\d+) s", field(out, "expires"))[1])  # type: ignore[index]
    assert 295 <= expires <= 300
    assert field(out, "available") == "0 of 10 permits now"
    assert field(out, "in window") == "10 of 10 permits taken"
    queued = re.fullmatch(
        r"1 waiting \(3 permits\), the furthest starts in ([\d.]+) s", field(out, "reservations")
    )
    assert queued is not None and 58 <= float(queued[1]) <= 60
    assert field(out, "grants") == "2 since the state began"
    memory = re.fullmatch(r"(\d+) B in 3 keys", field(out, "memory"))
    assert memory is not None and int(memory[1]) > 0
    slot = on_server(url, lambda backend: _slot(backend, name))
    port = url.rsplit(":", 1)[1]
    assert field(out, "slot") == f"{slot} on 127.0.0.1:{port}"


async def _slot(backend: RedisBackend, name: str) -> int:
    return backend.slot(name)


def test_inspect_json_carries_the_same_figures(capsys, url, name):
    on_server(url, lambda backend: full_with_a_reservation(backend, name))
    code, out, _ = aiolimit(capsys, url, "inspect", name, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["config"]["rates"] == ["10/minute"]
    assert shown["config"]["type"] == "OVERALL"
    assert shown["available"] == 0
    assert shown["grants"] == 2
    assert shown["reservations"]["count"] == 1
    assert shown["reservations"]["permits"] == 3
    assert 58 <= shown["reservations"]["furthest_s"] <= 60
    assert shown["memory"]["keys"] == 3 and shown["memory"]["bytes"] > 0
    assert shown["clients"] is None


def test_inspect_counts_the_memory_of_every_rate_s_log(capsys, url, name):
    async def two_rates(backend: RedisBackend) -> list[str]:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, [Rate(5, 1), Rate(20, 60)])
        )
        assert await limiter.try_acquire(2)
        return sorted(key.decode() for key in await backend.redis.keys(f"*{{{name}}}*"))

    keys = on_server(url, two_rates)
    assert len(keys) == 5, keys  # config, and a value key and a log per rate
    code, out, _ = aiolimit(capsys, url, "inspect", name, "--json")
    assert code == 0
    sizes = on_server(url, lambda backend: asyncio.gather(*map(backend.redis.memory_usage, keys)))
    assert json.loads(out)["memory"] == {"bytes": sum(sizes), "keys": 5}


async def _three_clients(backend: RedisBackend, name: str) -> None:
    await RateLimiter(name, backend).set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 3, 60))
    for client, grants in (("bob", 1), ("alice", 3), ("carol", 2)):
        limiter = RateLimiter(name, backend.with_client(client))
        for _ in range(grants):
            assert await limiter.try_acquire()


def test_inspect_per_client_lists_the_busiest_clients_first(capsys, url, name):
    on_server(url, lambda backend: _three_clients(backend, name))
    code, out, _ = aiolimit(capsys, url, "inspect", name)
    assert code == 0
    assert field(out, "clients") == "3 in the registry, 3 read, 3 with state"
    assert field(out, "grants") == "6 since the state began"
    assert "available now" not in out  # each client has its own budget
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("busiest"))
    rows = [line.split()[:4] for line in lines[header + 1 : header + 4]]
    assert rows == [["alice", "0", "0", "3"], ["carol", "1", "0", "2"], ["bob", "2", "0", "1"]]
    assert re.search(r"memory +\d+(\.\d)? (B|KiB) in 8 keys", out)  # config, registry, 3 x 2


# -- list ---------------------------------------------------------------------------------------


def test_list_scans_config_keys_never_keys_and_reads_odd_names(capsys, url):
    prefix = f"list{free_port()}:"

    async def make(backend: RedisBackend) -> None:
        backend = RedisBackend(backend.redis, prefix=prefix)
        for limiter_name, rate in (("api", 5), ("api {v2}", 7), ("100%", 9), ("other", 1)):
            await RateLimiter(limiter_name, backend).set_rate(
                RateLimiterConfig.build(RateType.OVERALL, rate, 1)
            )

    on_server(url, make)
    with sync_redis.Redis.from_url(url) as admin:
        admin.config_resetstat()
    code, out, _ = aiolimit(capsys, url, "list", "--prefix", prefix)
    assert code == 0
    assert [line.split("  ")[0].strip() for line in out.splitlines()] == [
        "100%",
        "api",
        "api {v2}",
        "other",
    ]
    assert "api {v2}  7/second  SLIDING_WINDOW  OVERALL" in out
    code, out, _ = aiolimit(capsys, url, "list", "api*", "--prefix", prefix)
    assert [line.split("  ")[0].strip() for line in out.splitlines()] == ["api", "api {v2}"]
    with sync_redis.Redis.from_url(url) as admin:
        stats = admin.info("commandstats")
    assert "cmdstat_scan" in stats
    assert "cmdstat_keys" not in stats


# -- set-rate, delete ---------------------------------------------------------------------------


def test_set_rate_writes_the_rate_keeps_the_grants_and_reset_state_forgets_them(capsys, url, name):
    code, out, _ = aiolimit(capsys, url, "set-rate", name, "5/second")
    assert (code, out) == (0, f"{name}: 5/second (SLIDING_WINDOW, OVERALL)\n")

    async def take_three(backend: RedisBackend) -> None:
        assert await RateLimiter(name, backend).try_acquire(3)

    async def available(backend: RedisBackend) -> int:
        return await RateLimiter(name, backend).available_permits()

    on_server(url, take_three)
    code, out, _ = aiolimit(capsys, url, "set-rate", name, "20 / minute")
    assert (code, out) == (0, f"{name}: 20/minute (SLIDING_WINDOW, OVERALL)\n")
    assert on_server(url, available) == 17
    code, out, _ = aiolimit(capsys, url, "set-rate", name, "20/minute", "--reset-state")
    assert (code, out) == (0, f"{name}: 20/minute (SLIDING_WINDOW, OVERALL), state reset\n")
    assert on_server(url, available) == 20
    assert aiolimit(capsys, url, "set-rate", name, "20/minute", "--keep-state")[0] == 0


def test_set_rate_writes_several_rates_an_algorithm_and_a_spacing(capsys, url, name):
    code, out, err = aiolimit(
        capsys, url, "set-rate", name, "10/second; 100/minute", "--algorithm", "token_bucket",
        "--min-spacing", "0.05",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert out.startswith(f"{name}: 10/second; 100/minute (TOKEN_BUCKET, OVERALL")

    async def config(backend: RedisBackend) -> RateLimiterConfig | None:
        return await RateLimiter(name, backend).get_config()

    stored = on_server(url, config)
    assert stored is not None
    assert stored.rates == Rate.parse("10/second; 100/minute")
    assert stored.algorithm is Algorithm.TOKEN_BUCKET
    assert stored.min_spacing == timedelta(seconds=0.05)
    code, out, _ = aiolimit(capsys, url, "inspect", name)
    assert code == 0 and "10/second; 100/minute (TOKEN_BUCKET, OVERALL" in out, out


def test_set_rate_keeps_the_limiter_s_rate_type_unless_told(capsys, url, name):
    assert aiolimit(capsys, url, "set-rate", name, "3/hour", "--type", "per_client")[0] == 0
    code, out, _ = aiolimit(capsys, url, "set-rate", name, "4/hour", "--keep-alive", "7200")
    assert (code, out) == (0, f"{name}: 4/hour (SLIDING_WINDOW, PER_CLIENT, keep_alive 7,200 s)\n")
    code, out, _ = aiolimit(capsys, url, "inspect", name)
    assert field(out, "keep_alive") == "7,200 s"


def test_delete_removes_the_limiter_and_a_second_delete_is_an_error(capsys, url, name):
    assert aiolimit(capsys, url, "set-rate", name, "1/second")[0] == 0
    assert aiolimit(capsys, url, "delete", name)[:2] == (0, f"deleted {name}\n")
    code, out, err = aiolimit(capsys, url, "delete", name)
    assert (code, out) == (2, "")
    assert err == f"aiolimit delete: error: no limiter {name!r} on {url} (prefix 'aiolimit:')\n"


def make_limiters(url: str, prefix: str, names: list[str]) -> None:
    async def make(backend: RedisBackend) -> None:
        for each in names:
            await RateLimiter(each, backend).set_rate(
                RateLimiterConfig.build(RateType.OVERALL, 1, 1)
            )

    on_server(url, make, prefix)


class Terminal(io.StringIO):
    """A terminal's stdin, answering what it was given."""

    def isatty(self) -> bool:
        return True


@pytest.mark.slow
def test_delete_a_glob_without_a_terminal_refuses_unless_yes(url):
    prefix = f"glob{free_port()}:"
    make_limiters(url, prefix, ["push-1", "push-2", "pull-1"])
    server = ("--redis", url, "--prefix", prefix)
    result = subprocess.run(
        [sys.executable, "-m", "aiolimit", "delete", "push-*", *server],
        input="y\n",  # a pipe's "y" is no one's answer
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stdout == "2 limiters match 'push-*':\n  push-1\n  push-2\n"
    assert result.stderr == (
        "aiolimit delete: error: stdin is not a terminal to confirm on: pass --yes to delete "
        "what matches\n"
    )
    assert limiters_on(url, prefix) == ["pull-1", "push-1", "push-2"]
    result = run_command("delete", "push-*", "--yes", *server)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[-3:] == [
        "deleted push-1",
        "deleted push-2",
        "2 limiters deleted",
    ]
    assert limiters_on(url, prefix) == ["pull-1"]


@pytest.mark.parametrize(
    ("answer", "code", "left"),
    [("y\n", 0, ["pull-1"]), ("YES\n", 0, ["pull-1"]), ("n\n", 1, ["pull-1", "push-1", "push-2"]),
     ("\n", 1, ["pull-1", "push-1", "push-2"]), ("", 1, ["pull-1", "push-1", "push-2"])],
)  # fmt: skip
def test_delete_a_glob_asks_on_a_terminal(capsys, monkeypatch, url, answer, code, left):
    prefix = f"glob{free_port()}:"
    make_limiters(url, prefix, ["push-1", "push-2", "pull-1"])
    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    got, out, err = aiolimit(capsys, url, "delete", "push-?", "--prefix", prefix)
    assert (got, err) == (code, "delete 2 limiters? [y/N] ")
    listed = "2 limiters match 'push-?':\n  push-1\n  push-2\n"
    if code == 0:
        assert out == listed + "deleted push-1\ndeleted push-2\n2 limiters deleted\n"
    else:
        assert out == listed + "nothing deleted\n"
    assert limiters_on(url, prefix) == left


def test_delete_exact_takes_a_glob_s_characters_as_a_name(capsys, monkeypatch, url):
    prefix = f"glob{free_port()}:"
    make_limiters(url, prefix, ["a*", "ab", "a[b]"])
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: no glob may go ahead
    code, out, _ = aiolimit(capsys, url, "delete", "--exact", "a*", "--prefix", prefix)
    assert (code, out) == (0, "deleted a*\n")
    assert limiters_on(url, prefix) == ["a[b]", "ab"]
    # as in list, a backslash takes the next character as it is: this glob matches "a[b]" only
    code, out, _ = aiolimit(capsys, url, "delete", "a\\[b]", "--yes", "--prefix", prefix)
    assert (code, out) == (
        0,
        "1 limiter matches 'a\\\\[b]':\n  a[b]\ndeleted a[b]\n1 limiter deleted\n",
    )
    assert limiters_on(url, prefix) == ["ab"]
    code, out, err = aiolimit(capsys, url, "delete", "x*", "--yes", "--prefix", prefix)
    assert (code, out) == (2, "")
    assert err.startswith("aiolimit delete: error: no limiter matches 'x*' on redis://")


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "no-such-limiter"], "aiolimit inspect: error: no limiter 'no-such-limiter'"),
        (["watch", "no-such-limiter"], "aiolimit watch: error: no limiter 'no-such-limiter'"),
        (["set-rate", "x", "10/fortnight"], "cannot read the rate '10/fortnight'"),
        (["set-rate", "x", "0/second"], "permits must be an int from 1"),
        (["set-rate", "x", "1/second", "--algorithm", "leaky"], "expected one of sliding_window"),
        (["watch", "x", "--count", "0"], "argument --count: must be at least 1"),
        (["watch", "x", "--interval", "0.002"], "argument --interval: must be at least 0.1"),
        (["watch", "x", "--interval", "0"], "argument --interval: must be at least 0.1"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(url, args, message):
    result = run_command(*args, "--redis", url)
    assert result.returncode == 2
    assert message in result.stderr
    # one line says what is wrong (argparse puts its usage before it)
    (said,) = [line for line in result.stderr.splitlines() if f"aiolimit {args[0]}: error:" in line]
    assert message in said
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("command", [["inspect", "x"], ["list"], ["watch", "x"], ["delete", "x"]])
def test_an_unreachable_server_is_one_line_and_exit_code_2(command):
    url = f"redis://:secret@127.0.0.1:{free_port()}"
    result = run_command(*command, "--redis", url)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"aiolimit {command[0]}: error: cannot reach Redis at redis://:***@")
    assert "secret" not in result.stderr


@pytest.mark.slow
def test_the_server_comes_from_aiolimit_redis_url_unless_given(url, name):
    on_server(
        url,
        lambda backend: RateLimiter(name, backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 2, 1)
        ),
    )
    result = run_command("list", name, env={"AIOLIMIT_REDIS_URL": url})
    assert (result.returncode, result.stdout) == (0, f"{name}  2/second  SLIDING_WINDOW  OVERALL\n")
    # Without either: redis://localhost:6379 (test_cli_output.py checks the default)


@pytest.mark.slow
def test_pause_holds_every_grant_back_and_needs_a_limiter(capsys, url, name):
    assert aiolimit(capsys, url, "set-rate", name, "5/second")[0] == 0
    code, out, _ = aiolimit(capsys, url, "pause", name, "30")
    assert code == 0
    assert re.fullmatch(rf"paused {name}: no grant for (29|30) s\n", out), out

    async def attempt(backend: RedisBackend) -> tuple[bool, float]:
        limiter = RateLimiter(name, backend)
        return await limiter.try_acquire(), await limiter.wait_time()

    granted, wait = on_server(url, attempt)
    assert not granted and 29 < wait <= 30
    code, out, err = aiolimit(capsys, url, "pause", name + "-none", "1")
    assert (code, out) == (2, "")
    assert err.startswith(f"aiolimit pause: error: no limiter '{name}-none'")
    result = run_command("pause", name, "soon", "--redis", url)
    assert result.returncode == 2 and "expected seconds, got 'soon'" in result.stderr


# -- the least-privilege ACL user ---------------------------------------------------------------


def server_version(admin: sync_redis.Redis) -> tuple[int, int]:
    major, minor = str(admin.info("server")["redis_version"]).split(".")[:2]
    return int(major), int(minor)


def readme_acl_rules(version: tuple[int, int]) -> list[str]:
    """The docs' line, less what a server of ``version`` lacks (as the docs say to do, with
    ``aiolimit acl --server-version``)."""
    lines = ACL_PAGE.read_text().splitlines()
    (line,) = [acl for acl in lines if acl.startswith("ACL SETUSER limiter")]
    rules = line.removeprefix("ACL SETUSER limiter ").replace(">PASSWORD", ">s3cret").split()
    lacking = {f"+{command}" for command, since in NEWER.items() if since > version}
    return [rule for rule in rules if rule not in lacking]


@pytest.fixture(scope="module")
def acl_url() -> Iterator[str]:
    with LocalRedis() as server:
        with sync_redis.Redis(port=server.port) as admin:
            admin.execute_command(
                "ACL", "SETUSER", "limiter", *readme_acl_rules(server_version(admin))
            )
        yield f"redis://limiter:s3cret@127.0.0.1:{server.port}"


def test_the_readme_s_acl_user_can_run_every_command(capsys, acl_url, name):
    assert aiolimit(capsys, acl_url, "set-rate", name, "3/minute", "--type", "per_client")[0] == 0
    on_server(acl_url, lambda backend: _three_clients(backend, f"{name}-clients"))
    on_server(acl_url, lambda backend: full_with_a_reservation(backend, name + "-full"))
    for args in (
        ["inspect", name + "-full"],
        ["inspect", f"{name}-clients"],
        ["inspect", name, "--json"],
        ["list"],
        ["watch", name + "-full", "--count", "2", "--interval", "0.1"],
        ["delete", name],
    ):
        code, out, err = aiolimit(capsys, acl_url, *args)
        assert (code, err) == (0, ""), args
        assert "n/a" not in out, out  # MEMORY USAGE was allowed
    code, out, _ = aiolimit(capsys, acl_url, "inspect", f"{name}-clients")
    assert field(out, "clients") == "3 in the registry, 3 read, 3 with state"


def test_without_the_readme_s_additions_list_and_memory_are_refused(capsys, name):
    with LocalRedis() as server:
        with sync_redis.Redis(port=server.port) as admin:
            rules = readme_acl_rules(server_version(admin))
            rules = [r for r in rules if r not in ("+scan", "+memory|usage")]
            admin.execute_command("ACL", "SETUSER", "limiter", *rules)
        url = f"redis://limiter:s3cret@127.0.0.1:{server.port}"
        assert aiolimit(capsys, url, "set-rate", name, "1/second")[0] == 0
        code, out, _ = aiolimit(capsys, url, "inspect", name)
        assert code == 0
        assert field(out, "memory") == "n/a (MEMORY USAGE refused)"
        code, _, err = aiolimit(capsys, url, "list")
        assert code == 2
        assert "refused a command" in err and "scan" in err
        # delete NAME looks for a sharded limiter's shards with SCAN: refused, it deletes
        # the limiter all the same
        assert aiolimit(capsys, url, "delete", name)[:2] == (0, f"deleted {name}\n")
        code, _, err = aiolimit(capsys, url, "delete", name)
        assert code == 2 and "scan" in err  # (nothing there: why no shard was looked for)


# -- a Redis Cluster ------------------------------------------------------------------------------


def _configure_on(cluster: Cluster, names: list[str]) -> dict[str, int]:
    """Configures a limiter of each name (3 of 10 permits taken) on an emptied cluster; the
    port of the master holding each, as the servers themselves say."""

    async def configure() -> None:
        redis = cluster_client(cluster)
        try:
            await redis.initialize()
            await redis.flushall(target_nodes=RedisCluster.PRIMARIES)
            backend = RedisBackend(redis)
            for each in names:
                limiter = RateLimiter(each, backend)
                await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
                assert await limiter.try_acquire(3)
        finally:
            await redis.aclose()

    cluster.wait_healthy()
    asyncio.run(configure())
    where = masters_holding(cluster)
    return {each: where[f"aiolimit:{{{each}}}:config"] for each in names}


@pytest.mark.slow
def test_every_command_works_on_a_cluster_with_cluster(capsys, redis_cluster: Cluster, name):
    names = [f"{name}-{i}" for i in range(6)]
    holders = _configure_on(redis_cluster, names)
    assert len(set(holders.values())) > 1, holders  # the names live on several masters
    url = redis_cluster.url

    code, out, err = aiolimit(capsys, url, "list", "--cluster")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == sorted(names)
    assert cli.main(["--cluster", "--redis", url, "list"]) == 0  # the options first
    assert capsys.readouterr().out == out
    for each in names:
        code, out, err = aiolimit(capsys, url, "inspect", each, "--cluster", "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert shown["available"] == 7
        assert shown["slot"] == slot(f"aiolimit:{{{each}}}")
        assert shown["node"] == f"127.0.0.1:{holders[each]}"
    code, _, err = aiolimit(capsys, url, "set-rate", names[0], "20/minute", "--cluster")
    assert code == 0, err
    code, _, err = aiolimit(capsys, url, "delete", names[1], "--cluster")
    assert code == 0, err
    code, _, err = aiolimit(capsys, url, "inspect", names[1], "--cluster")
    assert code == 2 and "no limiter" in err


def test_a_cluster_node_without_cluster_says_to_pass_it(capsys, redis_cluster: Cluster, name):
    names = [f"{name}-{i}" for i in range(6)]
    holders = _configure_on(redis_cluster, names)
    url = redis_cluster.url  # its first node
    elsewhere = [each for each in names if holders[each] != redis_cluster.nodes[0].port]
    assert elsewhere, holders
    code, _, err = aiolimit(capsys, url, "inspect", elsewhere[0])
    assert code == 2
    assert err.strip().endswith("is a node of a Redis Cluster: pass --cluster"), err
    assert "Traceback" not in err


def test_inspect_and_watch_show_a_learned_rate_against_its_ceiling(capsys, url, name):
    async def learn(backend: RedisBackend) -> None:
        from aiolimit import Learner

        limiter = RateLimiter(name, backend, rate="20/second")
        assert await limiter.try_acquire()
        await Learner(limiter).refused()  # half the ceiling, cut by half again

    on_server(url, learn)
    code, out, err = aiolimit(capsys, url, "inspect", name)
    assert (code, err) == (0, "")
    assert field(out, "rates") == "5/second (SLIDING_WINDOW, OVERALL)"
    assert field(out, "learned") == "5/second in force, 25% of the ceiling 20/second"
    code, out, _ = aiolimit(capsys, url, "inspect", name, "--json")
    assert json.loads(out)["learned"] == {"ceiling": ["20/second"]}
    code, out, _ = aiolimit(capsys, url, "watch", name, "--count", "1")
    assert out.rstrip().endswith("learned 5/second in force, 25% of the ceiling 20/second")
