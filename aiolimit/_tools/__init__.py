"""Tooling, not the limiter's API: the ``aiolimit`` command line, the demo, the soak tool, and
what they share with the tests and benchmarks (which import it from here, nowhere else):
a local redis-server, the sliding-window audit, a backend that records its grants.
Nothing here is stable.
"""

from .audit import Stamp, Window, busiest_window
from .recording import GrantRecord, RecordingBackend, Request
from .server import (
    LocalRedis,
    Persistence,
    cpu_model,
    free_port,
    redis_server_binary,
    valkey_server_binary,
)

__all__ = [
    "GrantRecord",
    "LocalRedis",
    "Persistence",
    "RecordingBackend",
    "Request",
    "Stamp",
    "Window",
    "busiest_window",
    "cpu_model",
    "free_port",
    "redis_server_binary",
    "valkey_server_binary",
]
