"""A throwaway redis-server on a free 127.0.0.1 port, for the soak tool.

>>> with LocalRedis(persistence="aof") as server:
...     client = Redis.from_url(server.url)
...     server.crash_and_restart()   # SIGKILL, then start again on the same port and data dir

``persistence="none"`` keeps everything in memory (a restart loses every key);
``persistence="aof"`` writes an append-only file fsynced after every write
(``appendfsync always``), so a crash loses nothing that was acknowledged.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = ["LocalRedis", "Persistence", "free_port", "redis_server_binary"]

Persistence = Literal["none", "aof"]


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
    """One redis-server process bound to 127.0.0.1, with its own temporary data directory."""

    def __init__(self, persistence: Persistence = "none", binary: str | None = None) -> None:
        self.persistence: Persistence = persistence
        self.binary = binary or redis_server_binary()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="aiolimit-soak-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        if self.persistence == "aof":
            durability = ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            durability = ["--appendonly", "no"]
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--daemonize", "no",
            *durability,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> LocalRedis:
        process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._process = process
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
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
        ):
            sock.sendall(b"PING\r\n")
            # While an AOF loads, the server answers -LOADING: not ready yet.
            return sock.recv(64).startswith(b"+PONG")
        return False

    def crash(self) -> None:
        """Kills the server with SIGKILL: no shutdown save, no goodbye to clients."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait()
        self._process = None

    def crash_and_restart(self) -> float:
        """SIGKILL, then start again on the same port and directory; returns the downtime."""
        began = time.monotonic()
        self.crash()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        """Stops the server and removes its data directory."""
        process, self._process = self._process, None
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
