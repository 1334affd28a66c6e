"""A real Redis Cluster (masters + replicas) on free loopback ports, started and stopped by tests.

>>> with running_cluster() as cluster:
...     client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)

Nodes are plain ``redis-server --cluster-enabled yes`` processes (``tools.LocalRedis``);
``redis-cli --cluster create`` joins them. Admin calls use short-lived synchronous clients so
they work from any event loop (or none). A missing binary is an error, never a skip.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.asyncio import RedisCluster

from .server import LocalRedis, free_port, redis_server_binary

SLOTS = 16384
SOCKET_TIMEOUT = 1.0  # seconds: cluster_client's connect and read timeouts


def redis_cli_binary() -> str:
    binary = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    if not Path(binary).exists():
        raise RuntimeError("redis-cli is not installed: `apt-get install redis-tools`")
    return binary


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Polls ``condition`` every 50 ms until it is truthy; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Node(LocalRedis):
    """One cluster node. Unlike ``stop``, ``kill`` keeps its directory (nodes.conf), so
    ``start`` brings the same node back, and it rejoins the cluster."""

    def admin(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2
        )

    def command(self, *args: str) -> object:
        with self.admin() as client:
            return client.execute_command(*args)

    def info(self, section: str) -> dict[str, str]:
        with self.admin() as client:
            raw = client.execute_command("INFO", section)
        # decode_responses parses INFO into a dict (with int values)
        return {key: str(value) for key, value in raw.items()}

    def cluster_info(self) -> dict[str, str]:
        with self.admin() as client:
            # Split, so that redis-py's parser for "CLUSTER INFO" leaves the text alone.
            text = str(client.execute_command("CLUSTER", "INFO"))
        return dict(line.split(":", 1) for line in text.split() if ":" in line)


@dataclass
class Topology:
    """Who is master of what, as one node sees it (``CLUSTER NODES``)."""

    masters: dict[str, int]  # node id -> port, masters that serve slots
    replicas: dict[int, int]  # replica port -> its master's port


class Cluster:
    """``masters`` masters, each with ``replicas`` replicas, on 127.0.0.1."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.node_timeout_ms = node_timeout_ms
        options = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            # Replicas may always be promoted, however long they were cut off from the master.
            "--cluster-replica-validity-factor", "0",
            "--cluster-allow-replica-migration", "no",
            # A resync starts at once instead of after the default 5 s delay.
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
        )  # fmt: skip
        binary = redis_server_binary()
        # The bus port is chosen too: the default (port + 10000) may be taken or above 65535.
        self.nodes = [
            Node(*options, "--cluster-port", str(free_port()), binary=binary)
            for _ in range(masters * (1 + replicas))
        ]
        self.replicas_per_master = replicas
        self.masters_wanted = masters

    def start(self, timeout: float = 30.0) -> Cluster:
        try:
            for node in self.nodes:
                node.start()
            command = [
                redis_cli_binary(),
                "--cluster", "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas", str(self.replicas_per_master),
                "--cluster-yes",
            ]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            if result.returncode != 0 or "[OK] All 16384 slots covered" not in result.stdout:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{result.stdout}")
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def node(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def topology(self, seen_from: Node | None = None) -> Topology:
        observer = seen_from or next(node for node in self.nodes if node.alive)
        with observer.admin() as client:
            text = str(client.execute_command("CLUSTER", "NODES"))
        return parse_nodes(text)

    def master_ports(self) -> list[int]:
        return sorted(self.topology().masters.values())

    def replica_of(self, master_port: int) -> Node:
        replicas = self.topology().replicas
        return self.node(next(r for r, m in replicas.items() if m == master_port))

    def healthy(self) -> bool:
        """Every node is up, reports cluster_state:ok with all slots served, every node
        agrees on the masters, and every replica is linked to its master."""
        if not all(node.alive for node in self.nodes):
            return False
        views = []
        for node in self.nodes:
            info = node.cluster_info()
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(SLOTS):
                return False
            if info.get("cluster_known_nodes") != str(len(self.nodes)):
                return False
            views.append(self.topology(node))
        first = views[0]
        if len(first.masters) != self.masters_wanted:
            return False
        if any(view.masters != first.masters or view.replicas != first.replicas for view in views):
            return False
        for port in first.replicas:
            if self.node(port).info("replication").get("master_link_status") != "up":
                return False
        return True

    def wait_healthy(self, timeout: float = 20.0) -> None:
        wait_until(self.healthy, timeout, "a healthy cluster (all slots ok, replicas in sync)")


def parse_nodes(text: str) -> Topology:
    """Reads ``CLUSTER NODES`` output (one line per node)."""
    ids: dict[str, int] = {}
    masters: dict[str, int] = {}
    replica_of: dict[int, str] = {}
    for line in text.strip().splitlines():
        fields = line.split()
        node_id, address, flags, master_id = fields[0], fields[1], fields[2], fields[3]
        port = int(address.split("@")[0].rsplit(":", 1)[1])
        ids[node_id] = port
        if "fail" in flags.split(",") or "noaddr" in flags:
            continue
        if "master" in flags.split(",") and len(fields) > 8:
            masters[node_id] = port
        elif "slave" in flags.split(","):
            replica_of[port] = master_id
    replicas = {port: ids[master] for port, master in replica_of.items() if master in ids}
    return Topology(masters, replicas)


@contextlib.contextmanager
def running_cluster(**options: int) -> Iterator[Cluster]:
    cluster = Cluster(**options).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_client(cluster: Cluster, **options: Any) -> RedisCluster:
    """An asyncio client of the cluster with short timeouts (a dead node fails fast)."""
    settings: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": SOCKET_TIMEOUT,
        **options,
    }
    return RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, **settings)
