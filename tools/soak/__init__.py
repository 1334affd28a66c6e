"""Soak test: K worker processes x T tasks on one limiter on a real Redis, with faults and an audit.

    python -m tools.soak --duration 30                   # saturation, 4 x 16 at 200 per 1 s
    python -m tools.soak --fault script-flush --fault client-kill
    python -m tools.soak --fault restart --persistence aof   # crash + restart, AOF fsync always
    python -m tools.soak --fault clock-skew --clock client   # one process's clock is 1 h ahead
    python -m tools.soak --big                           # one task asks for the whole rate
    python -m tools.soak --algorithm token_bucket --rates "50/second;1000/minute"
    python -m tools.soak --json ...                      # the same, machine-readable

Run it from a checkout of the repository (it is not in the package). Without ``--redis URL``
it starts its own redis-server on a free 127.0.0.1 port and stops it at the end. The faults
that act on the server itself (``faults.SERVER_FAULTS``) are refused against a ``--redis``
server unless ``--i-own-this-server`` says it is a throwaway one; ``--fault restart`` needs
the soak's own server.

The tool by job: ``arguments.py`` (the command line), ``command.py`` (running it),
``worker.py`` (one worker process; ``stamping.py``, how it notes its grants), ``faults.py``
(what is injected, and the server's command counts), ``audit.py`` (what the grants say about
each bound: the figures and how each is computed), ``report.py`` and ``progress.py`` (the
results table and the progress line), ``limits.py`` (the limiter's settings and bounds).
"""

from .arguments import add_arguments
from .command import main, run, soak

__all__ = ["add_arguments", "main", "run", "soak"]
