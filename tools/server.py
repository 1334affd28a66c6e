"""Throwaway redis-server processes on free 127.0.0.1 ports, for the soak tool (which starts
its own server, and crashes it for ``--fault restart``), the benchmarks and the tests.

>>> with LocalRedis() as server:                  # in memory only, its own temporary directory
...     client = Redis.from_url(server.url)
>>> with LocalRedis(persistence="aof") as server:
...     server.crash_and_restart()                # SIGKILL, then the same port and directory
>>> LocalRedis("--replicaof", "127.0.0.1", str(port))   # any other server option
>>> LocalRedis(binary="/path/to/valkey-server")

``persistence="none"`` keeps everything in memory (a restart loses every key);
``persistence="aof"`` writes an append-only file fsynced after every write
(``appendfsync always``), so a crash loses nothing that was acknowledged. The tests' own
servers (TLS, Sentinel, Valkey) extend it in ``tests/servers.py``.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = [
    "LocalRedis",
    "Persistence",
    "cpu_model",
    "free_port",
    "redis_server_binary",
]

Persistence = Literal["none", "aof"]


def cpu_model() -> str:
    """The processor's model name, for the machine line of a benchmark's table."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_server_binary() -> str:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    return binary


class LocalRedis:
    """One server process bound to 127.0.0.1, with its own temporary data directory.

    ``options`` go on the command line after ours (``"--replicaof", "127.0.0.1", "6379"``).
    """

    scheme = "redis"

    def __init__(
        self,
        *options: str,
        binary: str | None = None,
        port: int | None = None,
        persistence: Persistence = "none",
    ) -> None:
        self.options = options
        self.binary = binary or redis_server_binary()
        self.port = port or free_port()
        self.persistence: Persistence = persistence
        self.dir = tempfile.mkdtemp(prefix="aiolimit-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _listen(self) -> list[str]:
        """The options before ours: where the server listens."""
        return ["--port", str(self.port)]

    def _command(self) -> list[str]:
        if self.persistence == "aof":
            durability = ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            durability = ["--appendonly", "no"]
        return [
            self.binary,
            *self._listen(),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--daemonize", "no",
            *durability,
            *self.options,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> LocalRedis:
        """Starts the server (again, after :meth:`kill`) and waits until it answers PING."""
        process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.process = process
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                err = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"{self.binary} exited at start: {err}")
            if self._answers():
                return self
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port}")

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), contextlib.ExitStack() as stack:
            sock = self._connect(stack)
            sock.sendall(b"PING\r\n")
            # While an AOF loads, the server answers -LOADING: not ready yet. With a password
            # (--requirepass) it answers -NOAUTH: ready.
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        return False

    def _connect(self, stack: contextlib.ExitStack) -> socket.socket:
        """A connection to the server, closed with ``stack``."""
        return stack.enter_context(socket.create_connection(("127.0.0.1", self.port), 0.2))

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients. The directory stays, so
        :meth:`start` brings the same server back (its AOF, a cluster node's nodes.conf)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(5)
        self.process = None

    def crash_and_restart(self) -> float:
        """SIGKILL, then start again on the same port and directory; returns the downtime."""
        began = time.monotonic()
        self.kill()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        """Stops the server and removes its directory (safe to call twice)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
