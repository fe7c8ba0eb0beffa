"""What one worker of `busd serve --workers N` takes from its parent (busd/server/workers.py): the
ports and listening sockets, where its peers answer, the process id its stores go by, and the
pipe that tells it the parent is gone. A module of its own so that busd.server.lifecycle can name it
without importing the supervisor that imports busd.server.lifecycle.

Over the pipe the worker tells its parent its banner once started, and each namespace it
starts serving: the parent needs both key prefixes and the process id to end the worker's
session locks at once should it die (docs/design.md §3.10)."""

from __future__ import annotations

import logging
import socket
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from busd.net.listener import bind

log = logging.getLogger("busd")

# What the pipe carries besides the banner (a str): (KEY_PREFIX, a namespace's key prefix).
KEY_PREFIX = "key-prefix"


@dataclass
class WorkerRole:
    """What a worker takes from its parent (sent to the new process, so every field pickles)."""

    index: int
    ports: dict[str, int]  # listener name ("amqp", "tls", "ws", "http") -> port
    inherited: dict[str, socket.socket]  # listening sockets handed down (no SO_REUSEPORT)
    peer_dir: str  # where the workers' report sockets are (busd/observability/peers.py)
    embedded: bool  # the store is the parent's embedded Valkey
    parent: Connection  # to the parent: the banner, namespaces; closed: the parent is gone
    # What the process id of every store of this worker (each namespace's too) starts with,
    # and so every waiter and lock holder id of it (`<process id>:<n>`): chosen by the
    # parent, which knows whose locks to end when this worker dies.
    id_prefix: str
    parent_pid: int  # the parent's: a worker asks for SIGTERM when it dies

    def socket(self, name: str, host: str) -> socket.socket:
        """The listening socket of listener `name`."""
        sock = self.inherited.get(name)
        if sock is not None:
            sock.setblocking(False)
            return sock
        return bind(host, self.ports[name], reuse_port=True)

    def new_process_id(self) -> str:
        """A process id for one store of this worker: the worker's prefix, then its own part
        (a namespace made again after it was let go must not inherit the ids of the last)."""
        return f"{self.id_prefix}{uuid.uuid4().hex[:8]}"

    def ready(self, banner: str) -> None:
        self.parent.send(banner)

    def serving(self, key_prefix: str) -> None:
        """A namespace's broker, over the store's keys under `key_prefix`, starts here: the
        parent ends its locks too should this worker die. Told before any of its receivers
        can take a lock."""
        try:
            self.parent.send((KEY_PREFIX, key_prefix))
        except OSError:  # the parent is gone: this worker stops (on_parent_gone)
            pass

    def on_parent_gone(self, loop: Any, stop: Any) -> None:
        """Stop when the parent's end of the pipe closes (it never writes to it): a parent
        killed with SIGKILL leaves no workers behind."""

        def readable() -> None:
            loop.remove_reader(self.parent.fileno())
            log.warning("the parent process is gone: stopping")
            stop()

        loop.add_reader(self.parent.fileno(), readable)
