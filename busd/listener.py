"""A listening socket whose connections are sniffed before anything reads them.

Every busd port serves more than one protocol: the AMQP, TLS and HTTP ports (busd.ports: AMQP
and HTTP, plain and over TLS) and the WebSocket port (busd.amqp.websocket: ws and wss). Each
tells TLS from the rest by a connection's first byte, left in the socket for whoever reads it
next (0x16 starts a TLS ClientHello). This class owns what they share: the socket, the accept
loop, the connection tasks and closing them; a subclass says what to do with a connection
given its first byte.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import socket

TLS_RECORD = 0x16  # the first byte of a TLS ClientHello
FIRST_BYTE_TIMEOUT_S = 30.0  # a client that connects and says nothing for this long is dropped


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A non-blocking listening socket on host:port (0: any free port); `reuse_port`: one of
    several sockets of the workers of one host on that port, the kernel spreading the
    connections over them (busd/workers.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128, reuse_port=reuse_port)
    sock.setblocking(False)
    return sock


class SniffingListener(abc.ABC):
    """One listening socket; `close()` stops accepting and ends every open connection."""

    def __init__(self, sock: socket.socket, log: logging.Logger, name: str) -> None:
        self.sock = sock
        self._log = log
        self._name = name  # in log lines and the accept task's name
        self._connections: set[asyncio.Task] = set()
        self._accepting = asyncio.create_task(self._accept(), name=f"busd-{name}-accept")

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    async def close(self) -> None:
        self._accepting.cancel()
        await asyncio.gather(self._accepting, return_exceptions=True)
        self.sock.close()
        self._closing()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def _closing(self) -> None:  # noqa: B027 - a hook; most listeners need nothing here
        """Called once the socket is closed, before the connection tasks are cancelled."""

    @abc.abstractmethod
    async def serve(self, conn: socket.socket, first: int) -> None:
        """Serve one accepted connection whose first byte (still unread) is `first`."""

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:  # e.g. too many open files: keep the listener alive
                self._log.warning("%s accept failed: %s", self._name, exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = asyncio.create_task(self._connection(conn))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _connection(self, conn: socket.socket) -> None:
        try:
            first = await _peek(asyncio.get_running_loop(), conn)
        except (TimeoutError, OSError):
            conn.close()
            return
        if not first:
            conn.close()
            return
        await self.serve(conn, first[0])


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket for whoever reads it next."""
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), readable)
    try:
        await asyncio.wait_for(ready, FIRST_BYTE_TIMEOUT_S)
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)
