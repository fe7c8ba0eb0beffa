"""The store's nodes each on a host of their own (tests/faults/netns.py), so that a partition
can come between busd and a node or between nodes: a lone primary, a primary with replicas
and Sentinels (one beside each node), or a Valkey Cluster. Every node listens on the same
ports in its own host; what it is told of the others are their hosts' addresses."""

from __future__ import annotations

import contextlib
from pathlib import Path

import redis

from tests.faults.netns import Network
from tests.faults.replicas import (
    DOWN_AFTER_MS,
    NODE_CONFIG,
    SERVICE,
    SLOTS,
    cluster_config,
    replicas_online,
    valkey_server,
    wait_until,
)

PORT = 6379
SENTINEL_PORT = 26379
BUS_PORT = 16379


class Stores:
    """Nodes of one network, by host."""

    def __init__(self, net: Network, directory: Path, config: list[str] | None = None) -> None:
        self.net = net
        self.directory = directory
        self.config = config or []  # every node's, beside NODE_CONFIG

    def node(self, host: str, extra: list[str] | None = None) -> None:
        data = self.directory / host
        data.mkdir(parents=True, exist_ok=True)
        self.net.spawn(
            host,
            [
                valkey_server(),
                "--port",
                str(PORT),
                "--bind",
                "0.0.0.0",
                "--protected-mode",
                "no",
                "--dir",
                str(data),
                *NODE_CONFIG,
                *self.config,
                *(extra or []),
            ],
            self.directory / f"{host}.log",
            cwd=data,
        )
        wait_until(lambda: self.ask(host, lambda c: c.ping(), False), f"{host} did not start")

    def ask(self, host: str, fn, default=None, port: int = PORT):
        """`fn(client)` on the node of `host` (from inside that host: no cut stands between),
        or `default` when it does not answer."""

        def call():
            with contextlib.suppress(redis.RedisError, OSError):
                with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as client:
                    return fn(client)
            return default

        return self.net.inside(host, call)

    def replicas_online(self, host: str) -> int:
        return replicas_online(self.ask(host, lambda c: c.info("replication"), {}))

    def url(self, host: str) -> str:
        return f"redis://{self.net.address(host)}:{PORT}"


class ReplicaSet(Stores):
    """A primary on `hosts[0]`, replicas on the others, and a Sentinel on each (quorum: a
    majority)."""

    def __init__(
        self, net: Network, directory: Path, hosts: list[str], config: list[str] | None = None
    ) -> None:
        super().__init__(net, directory, config)
        self.hosts = hosts
        self.first_primary = hosts[0]
        primary = net.address(hosts[0])
        self.node(hosts[0])
        for host in hosts[1:]:
            self.node(host, ["--replicaof", primary, str(PORT)])
        wait_until(
            lambda: self.replicas_online(hosts[0]) == len(hosts) - 1,
            "the replicas did not catch up with the primary",
        )
        for host in hosts:
            config = directory / f"sentinel-{host}.conf"  # Sentinel rewrites it as it learns
            config.write_text(
                "\n".join(
                    [
                        f"port {SENTINEL_PORT}",
                        "bind 0.0.0.0",
                        "protected-mode no",
                        f"dir {directory}",
                        f"sentinel monitor {SERVICE} {primary} {PORT} {len(hosts) // 2 + 1}",
                        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                        f"sentinel failover-timeout {SERVICE} 5000",
                        f"sentinel parallel-syncs {SERVICE} 2",
                        "",
                    ]
                )
            )
            net.spawn(
                host, [valkey_server(), str(config), "--sentinel"], directory / f"s-{host}.log"
            )
        wait_until(self._sentinels_agree, "the Sentinels did not find each other")

    @property
    def url(self) -> str:  # type: ignore[override]
        hosts = ",".join(f"{self.net.address(h)}:{SENTINEL_PORT}" for h in self.hosts)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def primary_named_by(self, host: str) -> str | None:
        """The host whose node the Sentinel on `host` calls primary."""
        answer = self.ask(
            host, lambda c: c.sentinel_get_master_addr_by_name(SERVICE), None, SENTINEL_PORT
        )
        if not answer:
            return None
        by_address = {self.net.address(h): h for h in self.hosts}
        return by_address.get(answer[0].decode() if isinstance(answer[0], bytes) else answer[0])

    def _sentinels_agree(self) -> bool:
        for host in self.hosts:
            state = self.ask(host, lambda c: c.sentinel_master(SERVICE), None, SENTINEL_PORT)
            if (
                not state
                or state["num-other-sentinels"] < len(self.hosts) - 1
                or state["num-slaves"] < len(self.hosts) - 1
            ):
                return False
        return True


class Cluster(Stores):
    """A Valkey Cluster on `hosts`: the first `primaries` own an even share of the slots each,
    the others replicate them in turn."""

    def __init__(
        self,
        net: Network,
        directory: Path,
        hosts: list[str],
        primaries: int,
        config: list[str] | None = None,
    ) -> None:
        super().__init__(net, directory, config)
        self.hosts = hosts
        for host in hosts:
            self.node(host, [*cluster_config(), "--cluster-port", str(BUS_PORT)])
        for host in hosts[1:]:
            self.ask(
                hosts[0],
                lambda c, h=host: c.execute_command(
                    "CLUSTER", "MEET", self.net.address(h), PORT, BUS_PORT
                ),
            )
        self.primaries = hosts[:primaries]
        self.slot_ranges = {}
        for i, host in enumerate(self.primaries):
            low, high = SLOTS * i // primaries, SLOTS * (i + 1) // primaries - 1
            self.slot_ranges[host] = (low, high)
            self.ask(
                host,
                lambda c, lo=low, hi=high: c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi),
            )
        wait_until(
            lambda: all(len(self.nodes(h)) == len(hosts) for h in hosts), "the nodes did not meet"
        )
        self.replicas_of: dict[str, list[str]] = {h: [] for h in self.primaries}
        for i, host in enumerate(hosts[primaries:]):
            primary = self.primaries[i % primaries]
            node_id = self.ask(primary, lambda c: c.execute_command("CLUSTER", "MYID").decode())
            self.ask(host, lambda c, n=node_id: c.execute_command("CLUSTER", "REPLICATE", n))
            self.replicas_of[primary].append(host)
        wait_until(
            lambda: all(
                self.replicas_online(p) == len(self.replicas_of[p]) for p in self.primaries
            ),
            "the replicas did not catch up with their primaries",
        )
        wait_until(lambda: all(self.ok(h) for h in hosts), "the cluster did not come up")

    @property
    def url(self) -> str:  # type: ignore[override]
        return f"redis+cluster://{self.net.address(self.primaries[0])}:{PORT}"

    def nodes(self, host: str) -> list[dict]:
        text = self.ask(host, lambda c: c.execute_command("CLUSTER", "NODES"), b"")
        text = text.decode() if isinstance(text, bytes) else text
        found = []
        for line in text.strip().splitlines():
            fields = line.split()
            found.append(
                {
                    "address": fields[1].split("@")[0].rsplit(":", 1)[0],
                    "flags": fields[2].split(","),
                    "slots": fields[8:],
                }
            )
        return found

    def serving_primaries(self, host: str) -> list[str]:
        """The hosts serving slots now, as the node on `host` sees them."""
        by_address = {self.net.address(h): h for h in self.hosts}
        return sorted(
            by_address[n["address"]]
            for n in self.nodes(host)
            if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]
        )

    def first_owner(self, key: str) -> str:
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        return next(h for h, (low, high) in self.slot_ranges.items() if low <= slot <= high)

    def ok(self, host: str) -> bool:
        info = self.ask(host, lambda c: c.execute_command("CLUSTER", "INFO"), b"")
        info = info.decode() if isinstance(info, bytes) else info
        return "cluster_state:ok" in info
