"""Tooling, not the limiter's API: the ``aiolimit`` command line (``cli.py``), the demo, the
soak tool (``soak/``, by job), the admin commands (``admin/``), and what they share with the
benchmarks and the tests: a local redis-server (``server.py``) and the sliding-window audit
(``audit.py``). What only the tests use lives in tests/. Nothing here is stable.
"""

from .audit import Stamp, Window, busiest_window
from .server import LocalRedis, Persistence, cpu_model, free_port, redis_server_binary

__all__ = [
    "LocalRedis",
    "Persistence",
    "Stamp",
    "Window",
    "busiest_window",
    "cpu_model",
    "free_port",
    "redis_server_binary",
]
