"""What one worker of `busd serve --workers N` takes from its parent (busd/workers.py): the
ports and listening sockets, where its peers answer, and the pipe that tells it the parent is
gone. A module of its own so that busd.server can name it without importing the supervisor
that imports busd.server."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from busd.listener import bind

log = logging.getLogger("busd")


@dataclass
class WorkerRole:
    """What a worker takes from its parent (sent to the new process, so every field pickles)."""

    index: int
    ports: dict[str, int]  # listener name ("amqp", "tls", "ws", "http") -> port
    inherited: dict[str, socket.socket]  # listening sockets handed down (no SO_REUSEPORT)
    peer_dir: str  # where the workers' report sockets are (busd/observability/peers.py)
    embedded: bool  # the store is the parent's embedded Valkey
    parent: Connection  # to the parent: the banner once started; closed: the parent is gone

    def socket(self, name: str, host: str) -> socket.socket:
        """The listening socket of listener `name`."""
        sock = self.inherited.get(name)
        if sock is not None:
            sock.setblocking(False)
            return sock
        return bind(host, self.ports[name], reuse_port=True)

    def ready(self, banner: str) -> None:
        self.parent.send(banner)

    def on_parent_gone(self, loop: Any, stop: Any) -> None:
        """Stop when the parent's end of the pipe closes (it never writes to it): a parent
        killed with SIGKILL leaves no workers behind."""

        def readable() -> None:
            loop.remove_reader(self.parent.fileno())
            log.warning("the parent process is gone: stopping")
            stop()

        loop.add_reader(self.parent.fileno(), readable)
