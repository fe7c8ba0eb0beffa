"""`busd serve --workers N`: N busd processes serving the same ports of one host.

The parent does only what must happen once per host: it starts the embedded Valkey (when no
`--redis-url` is given), binds the ports, starts the workers, restarts a worker that dies,
and on SIGTERM or SIGINT stops them all gracefully (each one as a single busd stops,
docs/design.md §3.11). Every worker is a whole busd over the same store: any worker serves
any client, since sessions, locks and timers are in the store (docs/design.md §3.10).

A worker that dies without letting go (SIGKILL, a crash) leaves its session and message
locks in the store. Its parent gave it the prefix of all its ids, and so the tag its lock
tokens carry (busd.storage.messages.token_tag), so it ends them at once, as if they had
expired, in every namespace the worker said it served, before starting it again: the
sessions and messages are free for other receivers within the time it takes to notice the
death, not after LockDuration.

Ports: on Linux every worker listens on its own socket with SO_REUSEPORT and the kernel
spreads new connections over them; the parent binds each port first without listening, which
settles a port 0 and keeps the port while workers come and go. Elsewhere the parent listens
once and hands that socket to every worker, which all accept from it.

`/metrics` and `/health/detail` answer for the host: busd/observability/peers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from busd.broker.catalog import Catalog
from busd.config.entities_file import load_entities
from busd.config.settings import ConfigError, Settings
from busd.errors import EXIT_CONFIG, EXIT_UNAVAILABLE
from busd.net.listener import bind
from busd.process.children import end_with_parent
from busd.server import stop_request
from busd.server.exposure import default_key_warning
from busd.server.lifecycle import GRACE_S, READY_LINE, entities_file, redacted, unless_stopped
from busd.server.lifecycle import run as run_server
from busd.server.worker_role import KEY_PREFIX, WorkerRole
from busd.storage.messages import tag_lock_tokens, token_tag
from busd.storage.partitioned.router import wrap
from busd.storage.redis.store import RedisStore
from busd.storage.redis.waiting import wait_for_store

log = logging.getLogger("busd")

# Where SO_REUSEPORT spreads connections over the sockets sharing a port (on other systems
# that have it, the last socket bound gets them all).
REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
START_TIMEOUT_S = 60.0  # for a worker to print its banner
STOP_TIMEOUT_S = GRACE_S + 10.0  # for a worker to stop after SIGTERM; then SIGKILL
# A worker that dies sooner than this after its start is restarted after a growing pause
# (up to MAX_RESTART_PAUSE_S), so that one that cannot start does not spin.
STEADY_S = 5.0
MAX_RESTART_PAUSE_S = 10.0
# Longest the parent spends ending a dead worker's locks (a store that cannot be reached:
# they run out by themselves instead).
RELEASE_TIMEOUT_S = 10.0
RELEASE_CALLS = 8  # store calls at once while doing so


# prctl's option that names the calling thread (the process, called from its main thread):
# the name `ps`, `top` and `pgrep` show and /proc/<pid>/comm holds, at most 15 bytes.
PR_SET_NAME = 15


def name_process(name: str) -> bool:
    """Name this process as `ps` shows it (a spawned worker is otherwise one more `python3`);
    False where the system has no prctl. The command line (`ps -f`) stays as it is: changing
    it takes a dependency (setproctitle) busd does without."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _worker_main(settings: Settings, role: WorkerRole) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    stop_request.note_early()  # as busd/__main__.py: serve() acts on it
    end_with_parent(role.parent_pid)  # and the pipe besides: see WorkerRole.on_parent_gone
    name_process(f"busd-worker-{role.index}")
    tag_lock_tokens(token_tag(role.id_prefix))  # so its parent finds its message locks
    try:
        code = run_server(settings, role)
    except ConfigError as exc:  # the entities file against the store (busd/server/seeding.py)
        print(f"busd: error: {exc}", file=sys.stderr, flush=True)
        code = EXIT_CONFIG
    sys.exit(code)


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    pipe: Connection
    started: float
    id_prefix: str  # of every process id of the worker's stores (busd/server/worker_role.py)
    key_prefixes: set[str]  # of the namespaces it serves, the default one's first
    banner: str | None = None
    quick_deaths: int = 0  # deaths in a row sooner than STEADY_S after the start
    pipe_open: bool = True

    def hear(self) -> None:
        """Read what the worker said (its banner, the namespaces it serves), until the pipe
        is empty or closed."""
        while self.pipe_open:
            try:
                if not self.pipe.poll():
                    return
                said = self.pipe.recv()
            except (EOFError, OSError):
                self.pipe_open = False
                return
            if isinstance(said, str):
                self.banner = said
            elif isinstance(said, tuple) and len(said) == 2 and said[0] == KEY_PREFIX:
                self.key_prefixes.add(str(said[1]))


@dataclass
class _Supervisor:
    settings: Settings
    count: int
    ports: dict[str, int]
    inherited: dict[str, socket.socket]
    peer_dir: str
    embedded: bool
    workers: list[_Worker] = field(default_factory=list)
    stopping: bool = False

    def __post_init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")  # no state of ours to inherit

    def _auto_note(self) -> str:
        """What `--workers auto` counted, for the banner."""
        if not self.settings.workers_auto:
            return ""
        from busd.server.cpu_quota import usable_cores
        from busd.storage.redis.embedded import shard_count

        shards = shard_count(self.settings.store_shards) if self.embedded else 1
        if shards > 1:
            return f" (auto: {usable_cores()} cores less {shards} for the store's shards)"
        return f" (auto: {usable_cores()} cores)"

    def start(self, index: int, quick_deaths: int = 0) -> _Worker:
        ours, theirs = self._context.Pipe()
        # A fresh prefix per start: the locks of the worker that died are not the new one's.
        id_prefix = f"w{index}.{uuid.uuid4().hex[:8]}-"
        role = WorkerRole(
            index,
            self.ports,
            self.inherited,
            self.peer_dir,
            self.embedded,
            theirs,
            id_prefix,
            os.getpid(),
        )
        process = self._context.Process(
            target=_worker_main, args=(self.settings, role), name=f"busd-worker-{index}"
        )
        process.start()
        theirs.close()
        return _Worker(
            index,
            process,
            ours,
            time.monotonic(),
            id_prefix,
            {self.settings.key_prefix},
            quick_deaths=quick_deaths,
        )

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)
        if stop_request.asked():  # while the store was started, before these handlers
            return 0
        self.workers = [self.start(i) for i in range(self.count)]
        code = self._await_banners()
        if code:
            self._stop_all()
            return code
        first = self.workers[0].banner or ""
        pids = ", ".join(str(w.process.pid) for w in self.workers)
        print(
            f"{first}\n  workers:  {self.count} processes{self._auto_note()} (pids {pids}), "
            f"parent {os.getpid()}"
            f"\n{READY_LINE}",  # every worker listens and has reached the store
            flush=True,
        )
        restarts: dict[int, tuple[float, int]] = {}  # index -> (when, quick deaths so far)
        while not self.stopping:
            self._watch(restarts)
        self._stop_all()
        return 0

    def _await_banners(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        for worker in self.workers:
            while worker.banner is None:
                if self.stopping:
                    return 0
                if worker.pipe_open and worker.pipe.poll(0.1):
                    worker.hear()
                    continue
                if not worker.pipe_open:  # it is going: wait for its end
                    worker.process.join(0.1)
                if not worker.process.is_alive():
                    log.error(
                        "worker %d exited with %s while starting",
                        worker.index,
                        worker.process.exitcode,
                    )
                    code = worker.process.exitcode
                    return EXIT_CONFIG if code == EXIT_CONFIG else EXIT_UNAVAILABLE
                elif time.monotonic() > deadline:
                    log.error(
                        "worker %d did not start within %.0f s", worker.index, START_TIMEOUT_S
                    )
                    return EXIT_UNAVAILABLE
        return 0

    def _watch(self, restarts: dict[int, tuple[float, int]]) -> None:
        """Wait a little for a worker to die or speak; restart the dead when their turn came."""
        live = [w for w in self.workers if w.index not in restarts]
        wait(
            [w.process.sentinel for w in live] + [w.pipe for w in live if w.pipe_open],
            timeout=0.5,
        )
        now = time.monotonic()
        for worker in live:
            starting = worker.banner is None
            worker.hear()
            if starting and worker.banner is not None:
                log.info("worker %d started again, pid %s", worker.index, worker.process.pid)
            if worker.process.is_alive() or self.stopping:
                continue
            worker.process.join()
            worker.hear()  # a namespace it started just before it died
            worker.pipe.close()
            with contextlib.suppress(FileNotFoundError):
                (Path(self.peer_dir) / f"{worker.process.pid}.sock").unlink()
            if worker.process.exitcode != 0:  # (one that stopped cleanly let go of its own)
                self._release_locks(worker)
            quick = worker.quick_deaths + 1 if now - worker.started < STEADY_S else 0
            pause = min(MAX_RESTART_PAUSE_S, 0.5 * (2**quick - 1))
            log.warning(
                "worker %d (pid %s) exited with %s: restarting it%s",
                worker.index,
                worker.process.pid,
                worker.process.exitcode,
                f" in {pause:.1f} s" if pause else "",
            )
            restarts[worker.index] = (now + pause, quick)
        for index, (when, quick) in list(restarts.items()):
            if when <= now and not self.stopping:
                del restarts[index]
                self.workers[index] = self.start(index, quick)

    def _release_locks(self, worker: _Worker) -> None:
        """End the session locks a dead worker held, in every namespace it served, as if
        they had expired (lua/releaseProcessLocks.lua)."""
        url = self.settings.redis_url
        if not url:
            return
        started = time.monotonic()
        try:
            sessions, messages = asyncio.run(
                asyncio.wait_for(
                    release_process_locks(url, sorted(worker.key_prefixes), worker.id_prefix),
                    RELEASE_TIMEOUT_S,
                )
            )
        except Exception as exc:
            log.warning(
                "could not end the session and message locks of worker %d (pid %s): %s; they "
                "run out by themselves",
                worker.index,
                worker.process.pid,
                exc or type(exc).__name__,
            )
            return
        log.warning(
            "ended the %d session locks and %d message locks of worker %d (pid %s) in %.3f s",
            sessions,
            messages,
            worker.index,
            worker.process.pid,
            time.monotonic() - started,
        )

    def _stop(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        """SIGTERM to every worker, each then stops as one busd does; SIGKILL to those still
        there after STOP_TIMEOUT_S."""
        self.stopping = True
        for worker in self.workers:
            if worker.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid or 0, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self.workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                log.warning("worker %d did not stop in time: killing it", worker.index)
                worker.process.kill()
                worker.process.join()
                worker.hear()
                self._release_locks(worker)
            worker.pipe.close()


async def release_process_locks(
    url: str, key_prefixes: list[str], id_prefix: str
) -> tuple[int, int]:
    """End every session lock whose holder id starts with `id_prefix`, and every message lock
    whose token carries the worker's tag (busd.storage.messages.token_tag), on every queue and
    subscription under each key prefix (a namespace each), as if it had expired; the numbers
    of session and message locks ended."""
    tag = token_tag(id_prefix)
    sessions = messages = 0
    for key_prefix in key_prefixes:
        store = wrap(RedisStore(url, prefix=key_prefix, max_calls=RELEASE_CALLS))
        try:
            await store.connect()
            catalog = Catalog(store)
            await catalog.reload()
            specs = catalog.specs()
            for start in range(0, len(specs), RELEASE_CALLS):
                batch = specs[start : start + RELEASE_CALLS]
                counts = await asyncio.gather(
                    *(store.release_process_locks(spec, id_prefix) for spec in batch),
                    *(store.release_process_message_locks(spec, tag) for spec in batch),
                )
                sessions += sum(counts[: len(batch)])
                messages += sum(counts[len(batch) :])
        finally:
            await store.close()
    return sessions, messages


async def _wait_for_store(settings: Settings) -> bool:
    """Wait for --redis-url as a single busd does (busd.server.serve), SIGTERM and SIGINT
    ending the wait; whether the store answered."""
    assert settings.redis_url
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if stop_request.asked():
            return False
        shown = redacted(settings.redis_url)
        waiting = wait_for_store(settings.redis_url, settings.store_wait_s, shown, log.warning)
        return await unless_stopped(waiting, stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)  # which leaves SIGTERM's default: noted again
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop_request.note_early()


def _reserve(host: str, port: int) -> socket.socket:
    """Bind host:port for the workers' SO_REUSEPORT sockets without listening: it settles a
    port 0, and no other program takes the port while workers restart."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _ports(settings: Settings) -> dict[str, int]:
    wanted = {
        "amqp": settings.port,
        "tls": settings.tls_port,
        "ws": settings.ws_port,
        "http": settings.http_port,
    }
    return {name: port for name, port in wanted.items() if port is not None}


def run(settings: Settings) -> int:
    """Run `settings.workers` workers until SIGTERM or SIGINT; the exit code."""
    from busd.observability.logs import configure
    from busd.storage.redis.embedded import embedded_store, shard_count

    if sys.platform == "win32":
        raise ConfigError("--workers above 1 needs a Unix system")
    configure(settings.log_level, settings.log_format)
    # Fail here, once, on a bad entities file rather than in every worker.
    path = entities_file(settings)
    file_keys = load_entities(path, settings.max_message_size).keys if path else {}
    exposed = default_key_warning(settings.host, {**settings.sas_keys, **file_keys})
    if exposed:
        log.warning("%s", exposed)
    if settings.redis_url:  # once, here, before any worker starts
        if not asyncio.run(_wait_for_store(settings)):
            return 0  # stopped while waiting
    sockets: list[socket.socket] = []
    embedded = None
    try:
        if not settings.redis_url:
            embedded = embedded_store(settings.data_dir, shard_count(settings.store_shards))
            embedded.start()
            settings.redis_url = embedded.url
        ports: dict[str, int] = {}
        inherited: dict[str, socket.socket] = {}
        for name, port in _ports(settings).items():
            sock = _reserve(settings.host, port) if REUSE_PORT else bind(settings.host, port)
            sockets.append(sock)
            ports[name] = sock.getsockname()[1]
            if not REUSE_PORT:
                inherited[name] = sock
        with tempfile.TemporaryDirectory(prefix="busd-workers-") as peer_dir:
            return _Supervisor(
                settings, settings.workers, ports, inherited, peer_dir, embedded is not None
            ).run()
    finally:
        for sock in sockets:
            sock.close()
        if embedded is not None:
            embedded.stop()
