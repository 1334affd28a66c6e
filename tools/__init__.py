"""The lab: what tests and benchmarks use to run the limiter against real servers and check
what it granted. Not part of the package (the wheel holds ``aiolimit`` only); import it from
a checkout, e.g. ``python -m tools.soak``.

- ``server.py``: :class:`LocalRedis`, a throwaway redis-server on a free loopback port;
- ``cluster.py``: a Redis Cluster of such servers;
- ``audit.py``: what recorded grants say about each bound a limiter promises (the sliding
  window itself, :func:`busiest_window`, ships in ``aiolimit/_tools/window.py`` for ``aiolimit
  demo``);
- ``soak/``: the multi-process soak test with fault injection and an audit.
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
