"""Where a Redis Cluster keeps a limiter's keys: ``HOSTILE_NAMES`` are limiter names that try
the key layout (braces, spaces, long and odd names), ``masters_holding`` asks the masters which
keys each holds.

>>> where = masters_holding(redis_cluster)     # {key: the port of the master holding it}
"""

from __future__ import annotations

from tools.cluster import Cluster

__all__ = ["HOSTILE_NAMES", "masters_holding"]

HOSTILE_NAMES = [
    "{braces}",
    "a}b{c",
    "{}",
    "with  spaces ",
    "ünïcödé 限流 🚦",
    "x" * 300,
    "%7B%",
    "key:{tag}:x",
    "tab\tnew\nline",
]


def masters_holding(cluster: Cluster) -> dict[str, int]:
    """Each key stored on a master -> that master's port (asked of the servers themselves)."""
    where: dict[str, int] = {}
    for port in cluster.master_ports():
        with cluster.node(port).admin() as client:
            for key in client.keys("*"):
                where[key] = port
    return where
