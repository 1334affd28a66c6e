"""A concurrency limiter as an operator sees it: ``aiolimit inspect`` shows its holders and
their expiries, and every lease operation (the wake-ups included) runs as the least-privilege
ACL user with no refusal in the server's ACL log."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis

from aiolimit import ConcurrencyLimiter, RedisBackend
from aiolimit._tools import cli
from aiolimit.backends.redis._acl import acl_rules
from tools import LocalRedis


def run_cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str]:
    code = cli.main([*args, "--redis", url])
    return code, capsys.readouterr().out


async def _two_holders(url: str, name: str) -> list[int]:
    redis = Redis.from_url(url)
    try:
        sem = ConcurrencyLimiter(name, RedisBackend(redis))
        await sem.set_limit(3, lease=60)
        first, second = await sem.try_lease(), await sem.try_lease(2)
        return [first.fence, second.fence]
    finally:
        await redis.aclose()


def test_inspect_shows_a_concurrency_limiters_holders_and_expiries(capsys, redis_server, name):
    fences = asyncio.run(_two_holders(redis_server.url, name))
    code, out = run_cli(capsys, redis_server.url, "inspect", name)
    assert code == 0
    assert "at most 3 in flight, leases of 60 s" in out
    assert "in flight     3 (2 holders shown)" in out
    for fence in fences:
        (line,) = [line for line in out.splitlines() if str(fence) in line]
        assert line.split()[-2:][0].replace(".", "").isdigit()  # "ends in" seconds
    code, out = run_cli(capsys, redis_server.url, "inspect", name, "--json")
    shown = json.loads(out)["concurrency"]
    assert shown["in_flight"] == 3 and shown["waiting"] == 0
    assert [h["fence"] for h in shown["holders"]] == fences
    assert all(55 < h["expires_in_s"] <= 60 for h in shown["holders"])


async def test_every_lease_operation_runs_as_the_acl_user(redis_server: LocalRedis, name):
    admin = Redis.from_url(redis_server.url)
    version = (await admin.info("server"))["redis_version"].split(".")
    server = (int(version[0]), int(version[1]))
    await admin.execute_command(
        "ACL", "SETUSER", "leaser", *acl_rules(password="pw", server=server)
    )
    await admin.execute_command("ACL", "LOG", "RESET")
    user = Redis(port=redis_server.port, username="leaser", password="pw")
    try:
        sem = ConcurrencyLimiter(name, RedisBackend(user))
        await sem.set_limit(1, lease=5)
        assert await sem.get_config() is not None
        held = await sem.try_lease()
        waiter = asyncio.ensure_future(sem.try_lease(timeout=5))
        await asyncio.sleep(0.1)
        await held.renew()
        await held.release()
        lease = await waiter  # (subscribed to its wake channel meanwhile, as this user)
        assert lease is not None
        assert (await sem.leases()).in_flight == 1
        assert await sem.expire(60) and await sem.clear_expire()
        canceled = asyncio.ensure_future(sem.try_lease(timeout=5))
        await asyncio.sleep(0.1)
        canceled.cancel()
        await asyncio.sleep(0.1)
        assert await lease.release()
        assert await sem.delete()
        log = await admin.execute_command("ACL", "LOG")
        assert [entry for entry in log if "leaser" in str(entry)] == []
    finally:
        await user.aclose()
        await admin.aclose()
