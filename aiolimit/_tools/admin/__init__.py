"""Operating live limiters on a Redis server: ``aiolimit inspect``, ``list``, ``set-rate``,
``delete``, ``pause``, ``resume`` and ``watch``. Each command's ``run`` returns the exit
code: 0, 1 (``set-rate``: the server stored another config than the one asked for;
``delete``: what a glob matched was not confirmed) or 2 (bad input, no such limiter, the
server unreachable or refusing), with a one-line message on stderr and never a traceback.
Limiter names are printed escaped (``text.shown``).

The server is ``--redis URL``, by default ``$AIOLIMIT_REDIS_URL``, else
``redis://localhost:6379``. What the commands read is read by ``reading.py``; ``inspect``,
``list`` and ``watch`` only read, so they work as the least-privilege ACL user of
docs/deployments.md.

- ``connect.py``: the server options, the connection, one-line errors;
- ``reading.py`` (and ``glob.py``, patterns on names): what a limiter's keys hold;
  ``sharded.py``: a ``ShardedRateLimiter``'s shards read and summed;
- ``show.py``: ``inspect`` and ``list``; ``watch.py``; ``change.py``: the commands that write.
"""

from .change import BLOCK, DELETE, PAUSE, RESUME, SET_RATE, UNBLOCK
from .connect import Command
from .show import INSPECT, LIST
from .watch import WATCH

__all__ = [
    "BLOCK",
    "DELETE",
    "INSPECT",
    "LIST",
    "PAUSE",
    "RESUME",
    "SET_RATE",
    "UNBLOCK",
    "WATCH",
    "Command",
]
