"""Where a slot's hand-over goes (``leases.py --timeline``): from one holder's hold ending to
the next holder's starting, stage by stage, on one clock (``time.time()``, the clock Redis
stamps its ``MONITOR`` lines with).

In each process of a contender (:func:`instrument`, patches in the benchmark's processes only):
when each hold ended and started (and the lease it was), every write to Redis and every read
from it (the bytes, and the reader), when a lease was handed to its waiter and when that
waiter's task resumed (aiolimit). On the server, ``redis-cli monitor`` (:class:`Monitor`):
when each release ran and each grant was made. :func:`stages` pairs each release with the
grant that took the slot it freed (in the server's order) and reads, for each pair:

- ``sending``: the hold ended -> the round trip that carries the release began (aiolimit:
  its coalescer's task sending; the semaphore: none, its caller writes);
- ``written``: -> the release's bytes were written;
- ``run``: -> the release ran on the server (its first command);
- ``granted``: -> the slot was granted (aiolimit: in the same script; the semaphore: the next
  poll that found it free);
- ``read``: -> the bytes that tell the waiter reached its process's event loop (a pub/sub
  message, a release's reply, the semaphore's poll's reply);
- ``handed``: -> the waiter was handed its lease (aiolimit: the message or reply parsed);
- ``resumed``: -> the waiter's task ran (aiolimit: its wait returned; the semaphore: its poll);
- ``held``: -> its hold started.

Also the share of hand-overs within one process, and of those to the task that released the
slot (it took it again: barging, which FIFO rules out).

MONITOR costs the server a little: the timeline's other figures are not the benchmark's.
"""

from __future__ import annotations

import asyncio
import bisect
import re
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

STAGES = ("sending", "written", "run", "granted", "read", "handed", "resumed", "held")


def _now() -> int:
    return time.time_ns() // 1000


@dataclass
class Stamps:
    """One process's stamps (µs on ``time.time()``)."""

    ends: list[tuple[int, str]] = field(default_factory=list)  # (hold ended, lease)
    starts: list[tuple[int, str]] = field(default_factory=list)  # (hold started, lease)
    holders: dict[str, int] = field(default_factory=dict)  # lease: its holder (a task's id)
    handed: list[tuple[int, str]] = field(default_factory=list)  # (handed over, lease)
    resumed: list[tuple[int, str]] = field(default_factory=list)  # (waiter ran, lease)
    sending: list[int] = field(default_factory=list)  # a round trip began (aiolimit)
    writes: list[tuple[int, int, bytes]] = field(default_factory=list)  # (t, reader, bytes)
    reads: list[tuple[int, int, bytes]] = field(default_factory=list)  # (t, reader, bytes)

    def end(self, key: str) -> None:
        self.ends.append((_now(), key))

    def start(self, key: str) -> None:
        self.starts.append((_now(), key))
        self.holders[key] = id(asyncio.current_task())


def instrument(contender: str) -> Stamps:
    """Patches this process's redis-py (and aiolimit's waiters) to stamp into the result."""
    from redis.asyncio.connection import AbstractConnection

    stamps = Stamps()
    send = AbstractConnection.send_packed_command

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        # Stamped before: the server, woken by the write, often runs before this process does.
        at = _now()
        await send(self, command, check_health)
        data = command if isinstance(command, bytes) else b"".join(command)
        stamps.writes.append((at, id(self._reader), data))

    feed = asyncio.StreamReader.feed_data

    def feed_data(self: asyncio.StreamReader, data: bytes) -> None:
        stamps.reads.append((_now(), id(self), bytes(data)))
        feed(self, data)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    asyncio.StreamReader.feed_data = feed_data  # type: ignore[method-assign]
    if contender == "aiolimit":
        _instrument_waiters(stamps)
    return stamps


def _instrument_waiters(stamps: Stamps) -> None:
    from aiolimit.backends._lease import Woken
    from aiolimit.backends.redis._coalescer import Coalescer

    hand, wait, send = Woken.hand, Woken.wait, Coalescer._send

    async def sending(self: Coalescer, calls: Any) -> None:
        stamps.sending.append(_now())
        await send(self, calls)

    def handed(self: Woken, grant: Any) -> None:
        if grant is not None:
            stamps.handed.append((_now(), grant.lease_id))
        hand(self, grant)

    async def waited(self: Woken, timeout: float) -> Any:
        grant = await wait(self, timeout)
        if grant is not None:
            stamps.resumed.append((_now(), grant.lease_id))
        return grant

    Woken.hand = handed  # type: ignore[method-assign]
    Woken.wait = waited  # type: ignore[method-assign]
    Coalescer._send = sending  # type: ignore[method-assign]


class Monitor:
    """``redis-cli monitor`` into a file while the contender runs."""

    def __init__(self, url: str) -> None:
        where = urlparse(url)
        self._file = tempfile.NamedTemporaryFile("w+", suffix=".monitor")  # noqa: SIM115 (closed in lines())
        command = ["redis-cli", "-h", where.hostname or "127.0.0.1", "-p", str(where.port)]
        self._process = subprocess.Popen([*command, "monitor"], stdout=self._file)
        time.sleep(0.2)  # (subscribed before the run starts)

    def lines(self) -> list[str]:
        self._process.terminate()
        self._process.wait()
        self._file.seek(0)
        out = self._file.read().splitlines()
        self._file.close()
        return out


_LINE = re.compile(r"^(\d+)\.(\d+) \[\d+ ([^\]]+)\] (.*)$")


def _events(lines: list[str], contender: str) -> list[tuple[str, int, str]]:
    """The server's releases and grants, in its order: ("release" | "grant", µs, lease)."""
    out = []
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        seconds, micros, who, rest = found.groups()
        at = int(seconds) * 1_000_000 + int(micros)
        args = shlex.split(rest)
        if contender == "aiolimit":
            if who == "lua" and args[0] == "ZREM" and args[1].endswith(":holders"):
                out.append(("release", at, args[2]))
            elif who == "lua" and args[0] == "ZADD" and args[1].endswith(":holders"):
                out.append(("grant", at, args[3]))
        elif args[:2] == ["ZREM", "sem"]:
            out.append(("release", at, args[2]))
        elif who == "lua" and args[:2] == ["ZADD", "sem"]:
            out.append(("grant", at, args[3]))
    return out


def _pairs(events: list[tuple[str, int, str]]) -> list[tuple[str, int, str, int]]:
    """(released lease, when it ran, granted lease, when): each grant takes the slot freed
    longest ago (grants before any release took slots nobody held)."""
    free: list[tuple[str, int]] = []
    out = []
    for kind, at, lease in events:
        if kind == "release":
            free.append((lease, at))
        elif free:
            released, ran = free.pop(0)
            out.append((released, ran, lease, at))
    return out


def _after(
    stamps: list[tuple[int, int, bytes]], since: int, match: Callable[[int, bytes], bool]
) -> tuple[int, int] | None:
    """The first stamp from ``since`` on that ``match``es: (µs, reader)."""
    start = bisect.bisect_left(stamps, (since,))
    for at, reader, data in stamps[start : start + 400]:
        if match(reader, data):
            return at, reader
    return None


def _carrying(lease: str) -> Callable[[int, bytes], bool]:
    """Whether a write or read carries ``lease``'s name."""
    key = lease.encode()
    return lambda _reader, data: key in data


def stages(processes: list[Stamps], lines: list[str], contender: str) -> dict[str, Any]:
    """The median of each stage (µs), over every release paired with its grant, and the
    share of hand-overs within one process; the same for those within one process
    (``"same"``) and those to another (``"other"``)."""
    ends, starts, handed, resumed = {}, {}, {}, {}
    owner: dict[str, int] = {}
    holders: dict[str, tuple[int, int]] = {}  # lease: (process, task)
    for number, stamps in enumerate(processes):
        ends.update((k, t) for t, k in stamps.ends)
        starts.update((k, t) for t, k in stamps.starts)
        owner.update((k, number) for _, k in stamps.starts)
        holders.update((k, (number, task)) for k, task in stamps.holders.items())
        handed.update((k, t) for t, k in stamps.handed)
        resumed.update((k, t) for t, k in stamps.resumed)
        stamps.writes.sort()
        stamps.sending.sort()
        stamps.reads.sort()
    split: dict[bool, dict[str, list[float]]] = {
        within: {stage: [] for stage in (*STAGES, "gap", "itself")} for within in (True, False)
    }
    pairs = _pairs(_events(lines, contender))
    for released, ran, granted, at in pairs:
        if released not in ends or granted not in starts:
            continue
        holder, waiter = processes[owner[released]], processes[owner[granted]]
        columns = split[holder is waiter]
        columns["itself"].append(holders[released] == holders[granted])
        end = ends[released]
        written = _after(holder.writes, end, _carrying(released))
        read = _read(waiter, granted, at, contender)
        began = None
        if written is not None and holder.sending:
            last_began = bisect.bisect_right(holder.sending, written[0]) - 1
            began = holder.sending[last_began] if last_began >= 0 else None
        times = {
            "sending": began,
            "written": written and written[0],
            "run": ran,
            "granted": at,
            "read": read,
            "handed": handed.get(granted),
            "resumed": resumed.get(granted),
            "held": starts[granted],
        }
        last = end
        for stage in STAGES:
            value = times[stage]
            if value is not None:
                columns[stage].append(value - last)
                last = value
        columns["gap"].append(starts[granted] - end)
    every = {stage: split[True][stage] + split[False][stage] for stage in split[True]}
    out = _medians(every)
    out["same"], out["other"] = _medians(split[True]), _medians(split[False])
    out["same_process"] = out["same"]["hand_overs"] / max(1, out["hand_overs"])
    return out


def _medians(columns: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        stage: statistics.median(values) if values else None for stage, values in columns.items()
    }
    out["hand_overs"] = len(columns["gap"])
    out["gap_mean"] = statistics.fmean(columns["gap"]) if columns["gap"] else None
    # (the slot taken again by the task that released it: no waiter was served)
    out["itself"] = statistics.fmean(columns["itself"]) if columns["itself"] else 0.0
    return out


_TOKEN = re.compile(rb"\r\n([0-9a-f]{16})\r\n")
_by_token: dict[int, dict[str, list[tuple[int, int]]]] = {}


def _polls(stamps: Stamps) -> dict[str, list[tuple[int, int]]]:
    """The semaphore's writes by the token they carry: (µs, reader)."""
    found = _by_token.get(id(stamps))
    if found is None:
        found = _by_token[id(stamps)] = {}
        for at, reader, data in stamps.writes:
            for token in _TOKEN.findall(data):
                found.setdefault(token.decode(), []).append((at, reader))
    return found


def _read(stamps: Stamps, granted: str, at: int, contender: str) -> int | None:
    """When the bytes telling the waiter of ``granted`` reached its process."""
    if contender == "aiolimit":
        found = _after(stamps.reads, at, _carrying(granted))
        return None if found is None else found[0]
    # The semaphore's reply names nothing: the poll that wrote the token last before the
    # grant, then the next read on its connection.
    polls = [(t, r) for t, r in _polls(stamps).get(granted, ()) if t <= at]
    if not polls:
        return None
    sent, reader = polls[-1]
    found = _after(stamps.reads, max(sent, at), lambda r, _d: r == reader)
    return None if found is None else found[0]
